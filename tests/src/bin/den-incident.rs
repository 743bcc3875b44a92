//! `den-incident OUT`: record a real incident for `recordings/` (run by
//! `recordings/regenerate`).
//!
//! A den router with a model catalog and three workers (`gpu-a`, `gpu-b`, `gpu-c`, each
//! its own `den-agent` process) on loopback, recorded by `den record`. A long streaming
//! request runs; the operator places `den/incident-chat` on the node of the worker
//! serving it (a large artifact: the download is still in progress); that worker stops
//! taking the router's frames (so a request sent to it times out and falls back to
//! another worker), and is then killed with SIGKILL mid-stream: the stream fails with
//! partial output, the worker leaves, and the placement fails.
// Test support: a helper that cannot do its job fails the test that called it, so it may
// unwrap, expect and panic. Nothing here ships in den's binaries.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::exit)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use den_tests::agents::{Worker, body, prompt, start_router, start_worker};
use den_tests::manage::{ArtifactFile, card, write_files};
use den_tests::recording::den_binary;

const SLOW: &[&str] = &[
    "--prefill-ms-per-token",
    "2",
    "--first-token-ms",
    "5",
    "--decode-ms-per-token",
    "10",
];

const SLOW_PREFILL: &[&str] = &[
    "--prefill-ms-per-token",
    "60",
    "--first-token-ms",
    "5",
    "--decode-ms-per-token",
    "40",
];

fn main() {
    let Some(out) = std::env::args().nth(1).map(PathBuf::from) else {
        eprintln!("usage: den-incident OUT.jsonl[.zst]");
        std::process::exit(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("den-incident: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = runtime.block_on(run(&out)) {
        eprintln!("den-incident: {e}");
        std::process::exit(1);
    }
}

async fn run(out: &Path) -> Result<(), String> {
    let work = tempfile::tempdir().map_err(|e| e.to_string())?;
    let catalog = write_catalog(work.path())?;
    let cat = catalog.to_string_lossy().into_owned();
    let router = start_router(
        None,
        &[
            "--catalog",
            &cat,
            "--offer-timeout",
            "400ms",
            "--heartbeat-timeout",
            "2s",
        ],
    );
    // gpu-b and gpu-c are slow to prefill: a request whose prefix gpu-a holds goes there.
    let mut workers: Vec<Worker> = vec![
        start_worker(&router, "gpu-a", true, SLOW),
        start_worker(&router, "gpu-b", false, SLOW_PREFILL),
        start_worker(&router, "gpu-c", false, SLOW_PREFILL),
    ];
    router.wait_workers(&["gpu-a", "gpu-b", "gpu-c"]).await;
    let _ = std::fs::remove_file(out);
    let mut recorder = den(&[
        "record",
        "--router",
        &router.url,
        "--duration",
        "20s",
        &out.to_string_lossy(),
    ])?;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // A long stream; find the worker serving it.
    let mut stream = router
        .stream(body("chat-stream-1", &prompt(11, 64), 600))
        .await;
    stream.next_line().await;
    let record = router.record("chat-stream-1").await;
    let victim_name = record["attempts"][0]["worker"]
        .as_str()
        .ok_or("the stream has no attempt")?
        .to_owned();
    let victim = workers
        .iter()
        .position(|w| w.name == victim_name)
        .ok_or("the serving worker is not one of ours")?;
    eprintln!("den-incident: the stream runs on {victim_name}");
    tokio::time::sleep(Duration::from_millis(800)).await;

    // The operator places the model on that worker's node (den place, as at a terminal).
    let mut place = den(&[
        "place",
        "--yes",
        "--router",
        &router.url,
        "--node",
        &victim_name,
        "den/incident-chat",
    ])?;
    tokio::time::sleep(Duration::from_millis(1200)).await;

    // The worker stops taking frames: a request that prefers it (it holds the prefix,
    // and the other workers are slow to prefill) times out there and falls back; the
    // worker dies, mid-stream, while that request runs elsewhere.
    workers
        .get(victim)
        .ok_or("victim")?
        .fault("/fault/drop-inbound?on=true")
        .await;
    let mut tokens = prompt(11, 64);
    tokens.extend(prompt(12, 136));
    let followup = router.generate(body("chat-followup-2", &tokens, 8));
    let kill = async {
        tokio::time::sleep(Duration::from_millis(900)).await;
        if let Some(w) = workers.get_mut(victim) {
            w.proc.signal("KILL");
            w.proc.wait_exit(Duration::from_secs(10));
        }
        while stream.next_line().await.is_some() {}
    };
    let (fallback, ()) = tokio::join!(followup, kill);
    eprintln!(
        "den-incident: the follow-up ended {} on {}",
        fallback.kind(),
        fallback.worker()
    );
    let g = stream.finish();
    eprintln!("den-incident: the stream ended {}", g.kind());

    // den place is still waiting for the instance when the recording ends.
    let recorded = wait_child(&mut recorder, Instant::now() + Duration::from_secs(30));
    let placed = wait_child(&mut place, Instant::now());
    eprintln!("den-incident: den place exited {placed:?}");
    drop(router);
    match recorded {
        Some(0) => Ok(()),
        other => Err(format!("den record exited {other:?}")),
    }
}

/// Start `den ARGS` in the background, its output to this process's stderr.
fn den(args: &[&str]) -> Result<Child, String> {
    Command::new(den_binary())
        .args(args)
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start den: {e}"))
}

fn wait_child(child: &mut Child, deadline: Instant) -> Option<i32> {
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            return child.wait().ok().and_then(|s| s.code());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A one-card catalog whose artifact is large enough that a placement is still
/// downloading when its worker dies.
fn write_catalog(dir: &Path) -> Result<PathBuf, String> {
    let artifacts = dir.join("artifacts");
    let cards = dir.join("catalog");
    std::fs::create_dir_all(&cards).map_err(|e| e.to_string())?;
    let files = [
        ArtifactFile {
            path: "config.json".into(),
            bytes: b"{\"architecture\": \"den-synthetic\", \"layers\": 2}\n".to_vec(),
        },
        ArtifactFile {
            path: "weights.bin".into(),
            bytes: vec![0u8; 256 << 20],
        },
    ];
    write_files(&artifacts, &files);
    let source = format!("file://{}", artifacts.display());
    let card = card(
        "den/incident-chat",
        Some("den-registry:incident-chat:v1"),
        &source,
        None,
        &files,
    );
    std::fs::write(cards.join("incident-chat.toml"), card).map_err(|e| e.to_string())?;
    Ok(cards)
}
