//! The `den-agent` command line: help that explains every option, clear one-line errors
//! for bad configuration, the `cuda` backend without a driver, and SIGTERM draining
//! in-flight work before the process exits.

use std::process::Command;
use std::time::Duration;

use den_tests::agents::{agent_binary, body, metric, prompt, start_router, start_worker, wait_for};

fn run(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(agent_binary());
    cmd.args(args)
        .env_remove("DEN_CONFIG")
        .env_remove("DEN_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run den-agent");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn agents_help_explains_every_option() {
    for (sub, must) in [
        (
            "router",
            &[
                "--listen",
                "--token",
                "--heartbeat-timeout",
                "--offer-timeout",
                "--chunk-size",
                "--log-format",
            ][..],
        ),
        (
            "worker",
            &[
                "--router",
                "--token",
                "--name",
                "--backend",
                "--pages",
                "--data-dir",
                "--object-store",
                "--verify-restores",
                "--fault-admin",
                "--drain-timeout",
                "DEN_TOKEN",
            ][..],
        ),
        ("local", &["--workers", "--duration", "--requests"][..]),
    ] {
        let (code, out, _) = run(&[sub, "--help"], &[]);
        assert_eq!(code, Some(0));
        for m in must {
            assert!(
                out.contains(m),
                "`den-agent {sub} --help` does not mention {m}"
            );
        }
        // Every option line is followed by an explanation.
        let lines: Vec<&str> = out.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim_start().starts_with("--") {
                let next = lines.get(i + 1).map(|n| n.trim()).unwrap_or("");
                let inline = l.trim().split("  ").filter(|p| !p.is_empty()).count() > 1;
                assert!(
                    inline || !next.is_empty(),
                    "`{sub} --help`: {l:?} has no explanation"
                );
            }
        }
    }
}

#[test]
fn agents_config_errors_are_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "[worker]\nrouter = \"ws://127.0.0.1:1\"\npagez = 3\n",
    )
    .unwrap();
    let (code, _, err) = run(&["worker", "--config", file.to_str().unwrap()], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("pagez"), "{err}");
    let (code, _, err) = run(&["worker"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--router"), "{err}");
    let (code, _, err) = run(
        &[
            "worker",
            "--router",
            "ws://127.0.0.1:1",
            "--ram-bytes",
            "lots",
        ],
        &[],
    );
    assert_ne!(code, Some(0));
    assert!(err.contains("lots"), "{err}");
    let data = dir.path().join("d");
    let (code, _, err) = run(
        &[
            "worker",
            "--router",
            "ws://127.0.0.1:1",
            "--fault-admin",
            "0.0.0.0:0",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("loopback"), "{err}");
}

#[test]
fn agents_cuda_backend_without_a_driver_fails_with_one_line() {
    cuda_worker_without_a_driver(&[]);
}

#[test]
fn agents_a_model_on_the_cuda_backend_without_a_driver_fails_with_one_line() {
    // A model file with --backend cuda is the GPU forward pass (den_model::gpu): accepted
    // by the options, and refused by the driver probe on a host without one.
    let Some(model) = den_tests::environment::model_file("smollm2-135m-instruct-q4_1.gguf") else {
        return;
    };
    cuda_worker_without_a_driver(&["--model-file", model.to_str().unwrap()]);
}

fn cuda_worker_without_a_driver(extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let mut child = Command::new(agent_binary())
        .args([
            "worker",
            "--router",
            "ws://127.0.0.1:1",
            "--backend",
            "cuda",
            "--pages",
            "16",
        ])
        .args(extra)
        .args(["--data-dir", data.to_str().unwrap()])
        .env("DEN_LOG", "off")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // On a GPU host the worker starts (and would run until stopped): that is the right
    // behaviour there, and the refusal below is what a host without a driver must do.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            println!("a CUDA driver is present: the worker started, as it should");
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains("no CUDA driver") && lines[0].contains("--backend host"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_sigterm_drains_in_flight_work_then_exits() {
    let router = start_router(None, &[]);
    let mut w = start_worker(
        &router,
        "w-a",
        false,
        &["--decode-ms-per-token", "100", "--drain-timeout", "20s"],
    );
    router.wait_workers(&["w-a"]).await;
    let mut s = router.stream(body("t1", &prompt(12, 20), 10)).await;
    assert_eq!(s.next_line().await.unwrap()["type"], "delta");

    w.proc.signal("TERM");
    // The worker declines new work while draining.
    wait_for(
        "the drain to be advertised",
        Duration::from_secs(5),
        || async {
            let obs = router.observation("w-a").await?;
            (obs["draining"] == true).then_some(())
        },
    )
    .await;
    let mut b = body("t2", &prompt(13, 20), 2);
    b["model"] = "den-synthetic".into();
    let refused = router.generate(b).await;
    assert_eq!(refused.kind(), "error", "{:?}", refused.terminal);
    assert_eq!(refused.terminal["error"]["kind"], "no-feasible-worker");

    // The in-flight request still completes, then the process exits cleanly.
    while s.next_line().await.is_some() {}
    let g = s.finish();
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.deltas.len(), 10);
    assert_eq!(w.proc.wait_exit(Duration::from_secs(15)), Some(0));
    let log = w.proc.log();
    assert!(
        log.contains("draining") && log.contains("worker stopped"),
        "{log}"
    );
    let rm = router.metrics().await;
    assert_eq!(
        metric(&rm, "den_requests_total", &[("outcome", "completed")]),
        1.0
    );
}

#[test]
fn agents_local_runs_a_cluster_and_a_shared_prefix_workload() {
    let (code, out, err) = run(
        &[
            "local",
            "--workers",
            "3",
            "--requests",
            "24",
            "--duration",
            "60s",
        ],
        &[("DEN_LOG", "warn")],
    );
    assert_eq!(code, Some(0), "stdout:\n{out}\nstderr:\n{err}");
    assert!(out.contains("requests: 24 completed, 0 failed"), "{out}");
    assert!(out.contains("TTFT ms: mean"), "{out}");
    let cached: f64 = out
        .lines()
        .find_map(|l| l.strip_prefix("cache: "))
        .and_then(|l| l.split('(').nth(1))
        .and_then(|l| l.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no cache line in {out}"));
    assert!(cached > 0.0, "shared prefixes were reused: {out}");
    assert!(out.contains("served by: w-"), "{out}");
}

/// systemd readiness (`Type=notify`): with `$NOTIFY_SOCKET` set, the router sends
/// `READY=1` once it listens (its address answers `/healthz` by then) and `STOPPING=1`
/// when SIGTERM starts its drain; a worker sends `READY=1` once started. The socket is a
/// real Unix datagram socket standing in for systemd's (no systemd runs here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_tell_systemd_when_they_are_ready_and_stopping() {
    use std::os::unix::net::UnixDatagram;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let recv = |sock: &UnixDatagram| {
        let mut buf = [0u8; 512];
        let n = sock.recv(&mut buf).expect("a notification within 20 s");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let env = [("NOTIFY_SOCKET", path.display().to_string())];
    let args: Vec<String> = ["router", "--listen", "127.0.0.1:0", "--chunk-size", "16"]
        .map(str::to_owned)
        .to_vec();
    let mut router = den_tests::agents::Proc::spawn("router", dir.path(), &args, &env);
    let url = router.wait_line("den-agent router listening on ", Duration::from_secs(20));
    let ready = recv(&sock);
    assert!(ready.starts_with("READY=1\n"), "{ready:?}");
    assert!(ready.contains("STATUS=router listening on "), "{ready:?}");
    let health = den_tests::agents::client()
        .get(format!("{url}/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);

    let worker_args: Vec<String> = [
        "worker",
        "--router",
        url.as_str(),
        "--name",
        "w-n",
        "--chunk-size",
        "16",
        "--data-dir",
    ]
    .map(str::to_owned)
    .into_iter()
    .chain([dir.path().join("w-n").display().to_string()])
    .collect();
    let mut worker = den_tests::agents::Proc::spawn("w-n", dir.path(), &worker_args, &env);
    let ready = recv(&sock);
    assert_eq!(ready, "READY=1\nSTATUS=worker started");

    router.signal("TERM");
    assert_eq!(recv(&sock), "STOPPING=1");
    router.wait_exit(Duration::from_secs(20));
    worker.signal("TERM");
    assert_eq!(recv(&sock), "STOPPING=1");
    worker.wait_exit(Duration::from_secs(20));
}
