//! TLS end to end, with the real binaries on loopback: a router serving https and wss from
//! `--tls-cert`/`--tls-key` (a self-signed certificate made for the test), a worker that
//! verifies it with `--ca-cert` over `wss://`, a request over https, and `den status`
//! reading the router through https and its feed through wss. And what must fail: a
//! worker or console that does not trust the certificate (told what to pass), and plain
//! HTTP to the TLS port.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use den_tests::agents::{Proc, body, client, prompt, start_tls_router, start_worker};
use den_tests::binary;

fn den_status(router: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let den = binary("den").expect("the den binary (cargo build --workspace builds it)");
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(den)
        .args(["--no-record", "--router", router, "--token", "tls-token"])
        .args(extra)
        .args(["status", "--json", "--timeout", "10"])
        .env_remove("DEN_CA_CERT")
        .env_remove("DEN_CONFIG")
        .env("XDG_CONFIG_HOME", home.path())
        .output()
        .expect("run den status");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("den status printed no JSON ({e}):\n{stdout}\n{stderr}"));
    (out.status.code(), json, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_tls_router_serves_https_and_wss_to_workers_and_consoles_that_verify_it() {
    let router = start_tls_router(Some("tls-token"), &[]);
    let ca = router.ca.clone().unwrap();
    let _worker = start_worker(&router, "w-tls", false, &[]);
    router.wait_workers(&["w-tls"]).await;

    // A request over https reaches the worker that came in over wss.
    let g = router.generate(body("tls-1", &prompt(3, 24), 4)).await;
    assert_eq!(g.kind(), "completed", "{:?}", g.terminal);
    assert_eq!(g.worker(), "w-tls");
    assert_eq!(g.tokens().len(), 4);

    // The console reads it all through TLS when it trusts the CA.
    let ca_s = ca.display().to_string();
    let (code, json, stderr) = den_status(&router.url, &["--ca-cert", &ca_s]);
    assert_eq!(code, Some(0), "{stderr}\n{json:#}");
    assert!(json.to_string().contains("w-tls"), "{json:#}");

    // Without the CA it refuses the certificate, and says so.
    let (code, json, _) = den_status(&router.url, &[]);
    assert_eq!(code, Some(1), "{json:#}");
    let problem = json["problems"]["router"].as_str().unwrap_or_default();
    assert!(
        problem.contains("certificate") || problem.contains("UnknownIssuer"),
        "{json:#}"
    );

    // A client that does not trust the CA is refused by its own TLS stack, and plain
    // HTTP to the TLS port gets no HTTP answer.
    let health = format!("{}/healthz", router.url);
    assert!(client().get(&health).send().await.is_err());
    let plain = health.replacen("https://", "http://", 1);
    match client().get(&plain).send().await {
        Err(_) => {}
        Ok(r) => panic!("plain HTTP to the TLS port was answered: {}", r.status()),
    }
    // The port still serves TLS afterwards.
    let ok = router.http().get(&health).send().await.unwrap();
    assert_eq!(ok.status(), 200);

    // A worker without --ca-cert never registers, and its log says what to pass.
    let mut untrusting = Proc::spawn(
        "w-untrusting",
        router.dir.path(),
        &[
            "worker".to_owned(),
            "--router".to_owned(),
            router.url.clone(),
            "--name".to_owned(),
            "w-untrusting".to_owned(),
            "--token".to_owned(),
            "tls-token".to_owned(),
            "--data-dir".to_owned(),
            router
                .dir
                .path()
                .join("data-untrusting")
                .display()
                .to_string(),
        ],
        &[],
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = untrusting.log();
        if log.contains("--ca-cert") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the untrusting worker never said what to pass:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(router.observation("w-untrusting").await.is_none());
    untrusting.signal("TERM");
    let _ = untrusting.wait_exit(Duration::from_secs(10));
}

/// A key that does not match the certificate, or a file that is not PEM, stops the
/// router at start with one line naming the file.
#[test]
fn agents_tls_bad_certificate_files_stop_the_router_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, _key) = den_tests::agents::self_signed_cert(dir.path(), "a");
    let (_cert_b, key_b) = den_tests::agents::self_signed_cert(dir.path(), "b");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "hello\n").unwrap();
    let agent = den_tests::agents::agent_binary();
    let run = |cert: &std::path::Path, key: &std::path::Path| {
        let out = Command::new(&agent)
            .args(["router", "--listen", "127.0.0.1:0", "--tls-cert"])
            .arg(cert)
            .arg("--tls-key")
            .arg(key)
            .env_remove("DEN_CONFIG")
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&cert, &key_b);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("does not fit the certificate"), "{err}");
    let (code, err) = run(&junk, &key_b);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("junk.pem") && err.contains("no certificate"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
