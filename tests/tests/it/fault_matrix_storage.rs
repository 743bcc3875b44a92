//! The fault matrix's storage rows (see fault_matrix.rs): a corrupt SSD chunk, a full
//! disk under the SSD tier, and an object store that went away. In each, what cannot be
//! read back is recomputed, the output is what it would have been, and a failed write
//! costs a replica, never a request.

use std::process::Command;

use den_tests::agents::{body, metric, prompt, start_router, start_worker, start_worker_under};
use den_tests::faults::{COSTS, assert_clean, evict_and_wait, walk};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_corrupt_chunk_is_recomputed_never_wrong_kv() {
    let router = start_router(None, &[]);
    let args: Vec<&str> = [COSTS, &["--ram-bytes", "0", "--ssd-bytes", "64MiB"]].concat();
    let a = start_worker(&router, "w-a", true, &args);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(8, 100);
    let first = router.generate(body("x1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed");
    a.wait_idle().await;

    // Flip one byte in the payload of every stored chunk file.
    let mut damaged = 0;
    for entry in walk(&a.data_dir.join("ssd").join("chunks")) {
        let mut bytes = std::fs::read(&entry).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(&entry, bytes).unwrap();
        damaged += 1;
    }
    assert!(damaged >= 7, "{damaged} chunk files");
    evict_and_wait(&router, &a).await;

    let second = router.generate(body("x2", &tokens, 4)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.tier(), "ssd", "the router believed the replica");
    assert_eq!(second.cached_tokens(), 0, "nothing usable was restored");
    assert_eq!(
        second.tokens(),
        first.tokens(),
        "recomputed, identical output"
    );
    let m = a.metrics_text().await;
    assert!(
        metric(
            &m,
            "den_restore_fetch_failures_total",
            &[("tier", "ssd"), ("kind", "corrupt")]
        ) >= 1.0
    );
    assert_eq!(metric(&m, "den_restore_mismatch_total", &[]), 0.0);
    assert_eq!(metric(&m, "den_recomputed_tokens_total", &[]), 198.0);
    assert_clean(&router, &["x1", "x2"], &[&a]).await;
}

/// Whether this machine lets a process mount a tmpfs in its own user and mount
/// namespaces (`unshare -rm`), which the disk-full row needs.
fn can_mount_private_tmpfs() -> bool {
    Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c"])
        .arg("d=$(mktemp -d) && mount -t tmpfs -o size=64k tmpfs \"$d\"")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The SSD tier on a 1 MiB tmpfs (the worker's own mount namespace) while it believes it
/// has 64 MiB: writes fail with ENOSPC. Every request still completes, the failures are
/// counted, and what was stored before the disk filled still restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_disk_full_costs_replicas_never_requests() {
    if !can_mount_private_tmpfs() {
        den_tests::environment::missing(
            "the disk-full row needs `unshare --user --map-root-user --mount` and tmpfs",
        );
        return;
    }
    let router = start_router(None, &[]);
    let data_dir = router.dir.path().join("data-w-a");
    let ssd = data_dir.join("ssd");
    std::fs::create_dir_all(&ssd).unwrap();
    let wrapper: Vec<String> = [
        "unshare",
        "--user",
        "--map-root-user",
        "--mount",
        "sh",
        "-c",
        "mount -t tmpfs -o size=1m tmpfs \"$0\" && exec \"$@\"",
        ssd.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let args: Vec<&str> = [COSTS, &["--ram-bytes", "0", "--ssd-bytes", "64MiB"]].concat();
    let a = start_worker_under(&router, "w-a", true, &args, &[], &wrapper);
    router.wait_workers(&["w-a"]).await;

    let small = prompt(20, 100);
    let first = router.generate(body("s0", &small, 4)).await;
    assert_eq!(first.kind(), "completed", "{:?}", first.terminal);
    a.wait_idle().await;
    // Each 400-token prompt is ~400 KiB of chunks: the disk fills on the third.
    let mut big = Vec::new();
    for i in 0..5u32 {
        let id = format!("s{}", i + 1);
        let g = router.generate(body(&id, &prompt(30 + i, 400), 4)).await;
        assert_eq!(g.kind(), "completed", "{id}: {:?}", g.terminal);
        a.wait_idle().await;
        big.push((id, g));
    }
    let m = a.metrics_text().await;
    assert!(
        metric(&m, "den_checkpoint_errors_total", &[]) >= 1.0,
        "the full disk never showed: {}",
        a.proc.log()
    );
    assert!(
        a.proc.log().contains("No space left on device"),
        "{}",
        a.proc.log()
    );

    // What was stored before the disk filled restores; what was not is recomputed (and
    // stays resident meanwhile: a route whose checkpoint failed is not evictable).
    den_tests::faults::evict_evictable_and_wait(&router, &a).await;
    let again = router.generate(body("s9", &small, 4)).await;
    assert_eq!(again.kind(), "completed", "{:?}", again.terminal);
    assert_eq!(again.tier(), "ssd");
    assert!(again.cached_tokens() >= 96, "{:?}", again.terminal);
    assert_eq!(again.tokens(), first.tokens());
    let last = &big[4];
    let redo = router.generate(body("s10", &prompt(34, 400), 4)).await;
    assert_eq!(
        redo.tokens(),
        last.1.tokens(),
        "served again, identical output"
    );
    assert_eq!(
        metric(&a.metrics_text().await, "den_restore_mismatch_total", &[]),
        0.0
    );
    let ids = ["s0", "s1", "s2", "s3", "s4", "s5", "s9", "s10"];
    assert_clean(&router, &ids, &[&a]).await;
}

/// The object store's directory is replaced by a file after the chunks were uploaded:
/// every read and write fails. The restore fails, the prefix is recomputed, the output
/// is identical, and the failed uploads are counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_matrix_object_store_down_is_recomputed_never_wrong_kv() {
    let router = start_router(None, &[]);
    let objects = router.dir.path().join("objects");
    let url = format!("file://{}", objects.display());
    let args: Vec<&str> = [COSTS, &["--ram-bytes", "0", "--object-store", url.as_str()]].concat();
    let a = start_worker(&router, "w-a", true, &args);
    router.wait_workers(&["w-a"]).await;
    let tokens = prompt(40, 100);
    let first = router.generate(body("o1", &tokens, 4)).await;
    assert_eq!(first.kind(), "completed");
    a.wait_idle().await;
    assert!(walk(&objects).len() >= 6, "nothing was uploaded");

    std::fs::rename(&objects, router.dir.path().join("objects.gone")).unwrap();
    std::fs::write(&objects, "not a directory\n").unwrap();
    evict_and_wait(&router, &a).await;

    let second = router.generate(body("o2", &tokens, 4)).await;
    assert_eq!(second.kind(), "completed", "{:?}", second.terminal);
    assert_eq!(second.tier(), "object", "the router believed the replica");
    assert_eq!(second.cached_tokens(), 0, "nothing usable was restored");
    assert_eq!(
        second.tokens(),
        first.tokens(),
        "recomputed, identical output"
    );
    a.wait_idle().await;
    let m = a.metrics_text().await;
    assert!(
        den_tests::agents::metric_sum(&m, "den_restore_fetch_failures_total") >= 1.0,
        "{m}"
    );
    assert_eq!(metric(&m, "den_restore_mismatch_total", &[]), 0.0);
    // A new prompt is served as usual while the store is down; its uploads fail.
    let third = router.generate(body("o3", &prompt(41, 50), 4)).await;
    assert_eq!(third.kind(), "completed", "{:?}", third.terminal);
    a.wait_idle().await;
    let m = a.metrics_text().await;
    assert!(metric(&m, "den_checkpoint_errors_total", &[]) >= 1.0, "{m}");
    assert_clean(&router, &["o1", "o2", "o3"], &[&a]).await;
}
