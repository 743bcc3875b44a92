//! A real model placed through den's management API: a catalog card that names a GGUF
//! file (`format = "gguf"`) served over HTTP by Python's `http.server` (a real server
//! nobody here wrote) on loopback.
//!
//! - The router fetches the file at start (for its tokenizer) into its catalog cache.
//! - Placing the card on a worker started without a model: a download attempt that
//!   completes, a load that opens the model and probes it with a real generation, and a
//!   device switch to it; then the instance serves the model's own greedy tokens (equal to
//!   den-model's, run in this process) and chat text through the OpenAI ingress, while the
//!   synthetic model the worker started with is no longer served. Deleting the instance
//!   switches the worker back to it.
//! - An installed model changed on disk is refused by the load (a failed runner with the
//!   reason in `/state`, the installation removed; placing again downloads it anew); a
//!   catalog file that is not a model stops the router at start with one line naming the
//!   card.
//!
//! Needs `cargo build -p den-agent`, `tests/fetch-models` (DEN_TEST_MODELS) and python3.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use den_protocol::skulk::State;
use den_tests::agents::{agent_binary, client, start_router, start_worker, wait_for};
use den_tests::environment::{missing, model_file};
use den_tests::manage::{Mgmt, instance_ids};

use crate::agents_real_model::InProcess;

const SMOLLM2: &str = "smollm2-135m-instruct-q4_1.gguf";
const MODEL: &str = "smol";

/// `python3 -m http.server` over `dir` on a free loopback port; killed on drop.
struct FileServer {
    child: Child,
    url: String,
}

impl Drop for FileServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn serve_dir(dir: &Path) -> Option<FileServer> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .ok()?
        .port();
    let child = Command::new("python3")
        .args([
            "-m",
            "http.server",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        missing("python3 is not installed (tests/run installs it)");
        return None;
    };
    let server = FileServer {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    wait_for("the file server", Duration::from_secs(20), || async {
        client().get(&server.url).send().await.ok().map(|_| ())
    })
    .await;
    Some(server)
}

fn sha256_of(path: &Path) -> (u64, String) {
    let bytes = std::fs::read(path).unwrap();
    (bytes.len() as u64, hex::encode(Sha256::digest(&bytes)))
}

/// A catalog directory with one gguf card for `file` at `source`.
fn gguf_catalog(dir: &Path, source: &str, file: &str, bytes: u64, sha256: &str) -> String {
    let catalog = dir.join("catalog");
    std::fs::create_dir_all(&catalog).unwrap();
    std::fs::write(
        catalog.join("smol.toml"),
        format!(
            "model_id = \"{MODEL}\"\nformat = \"gguf\"\nsource = \"{source}\"\n\n[[files]]\npath = \"{file}\"\nbytes = {bytes}\nsha256 = \"{sha256}\"\n"
        ),
    )
    .unwrap();
    catalog.display().to_string()
}

async fn place(m: &Mgmt<'_>, node: &str) -> (String, den_protocol::skulk::RunnerId) {
    let instance = m.preview_on(MODEL, node).await;
    let (id, runner) = instance_ids(&instance);
    let a = m.create(&instance).await;
    assert_eq!(a.status, 200, "POST /instance: {:?}", a.body);
    (id.as_str().to_owned(), runner)
}

/// Waits until `runner` is ready; the state it was ready in.
async fn wait_ready(m: &Mgmt<'_>, runner: &den_protocol::skulk::RunnerId) -> State {
    m.wait_state("the runner to be ready", |s| {
        s.runners.get(runner)?.is_ready().then(|| s.clone())
    })
    .await
}

/// Deletes `instance` and waits until its runner is gone.
async fn delete(m: &Mgmt<'_>, instance: &str, runner: &den_protocol::skulk::RunnerId) {
    assert_eq!(m.delete(&format!("/instance/{instance}")).await.status, 200);
    m.wait_state("the runner gone", |s| {
        (!s.runners.contains_key(runner)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_a_gguf_card_over_http_is_downloaded_probed_served_and_removed() {
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let models_dir = path.parent().unwrap();
    let Some(files) = serve_dir(models_dir).await else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (bytes, sha) = sha256_of(&path);
    let catalog = gguf_catalog(tmp.path(), &files.url, SMOLLM2, bytes, &sha);
    let cache = tmp.path().join("cache");
    let cache_arg = cache.display().to_string();
    let router = start_router(
        None,
        &["--catalog", &catalog, "--catalog-cache", &cache_arg],
    );
    // The router fetched its own copy for the tokenizer, checked by sha256.
    assert_eq!(sha256_of(&cache.join(format!("{sha}.gguf"))).1, sha);
    let w = start_worker(&router, "w1", false, &["--kv-budget", "64MiB"]);
    router.wait_workers(&["w1"]).await;
    let m = Mgmt { router: &router };

    let (instance, runner) = place(&m, "w1").await;
    let state = wait_ready(&m, &runner).await;
    let downloads = den_tests::manage::downloads_of(&state, "w1", MODEL);
    assert_eq!(downloads.len(), 1, "{downloads:?}");
    assert_eq!(downloads[0].tag(), "DownloadCompleted", "{downloads:?}");
    // Ready came after the readiness generation, and the device switched to the model.
    let log = w.proc.log();
    let probed = log
        .find("runner loaded and probed")
        .expect("the probe's log line");
    let switched = log
        .find("the device serves the placed model")
        .expect("the switch");
    assert!(probed < switched, "{log}");

    // The placed instance serves the model's own greedy tokens.
    let reference = InProcess::open(&path);
    let prompt: Vec<u64> = vec![1, 504, 3458, 282, 4649, 314];
    let done = router
        .generate(json!({"id": "placed-1", "model": MODEL, "tokens": prompt,
                         "max_new_tokens": 8, "temperature": 0, "ignore_eos": true}))
        .await
        .terminal;
    assert_eq!(done["type"], "completed", "{done}");
    let served: Vec<u64> = done["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(
        served,
        reference.greedy(&prompt, 8),
        "placed runner vs den-model"
    );
    let chat: Value = client()
        .post(format!("{}/v1/chat/completions", router.url))
        .json(&json!({"model": MODEL, "temperature": 0, "max_tokens": 6,
                      "messages": [{"role": "user", "content": "What is the capital of France?"}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let text = chat["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or("");
    assert!(!text.trim().is_empty(), "{chat}");
    assert_eq!(chat["served_by"], instance.as_str(), "{chat}");
    // The worker serves one model at a time: its synthetic one is gone meanwhile.
    let synthetic = json!({"id": "synthetic-1", "model": "den-synthetic", "tokens": [1, 2, 3],
                           "max_new_tokens": 2});
    let refused = router.generate(synthetic.clone()).await.terminal;
    assert_ne!(refused["type"], "completed", "{refused}");

    // Deleting the instance switches the worker back to the engine it started with.
    delete(&m, &instance, &runner).await;
    let mut attempt = 1;
    wait_for(
        "the synthetic model to be served again",
        Duration::from_secs(20),
        || {
            attempt += 1;
            let mut body = synthetic.clone();
            let router = &router;
            async move {
                body["id"] = json!(format!("synthetic-{attempt}"));
                let done = router.generate(body).await.terminal;
                (done["type"] == "completed").then_some(())
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_a_gguf_runner_that_cannot_load_fails_with_its_reason_and_bad_files_stop_the_router()
{
    let Some(path) = model_file(SMOLLM2) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let (bytes, sha) = sha256_of(&path);
    let dir = path.parent().unwrap().display().to_string();
    let catalog = gguf_catalog(tmp.path(), &dir, SMOLLM2, bytes, &sha);
    let router = start_router(None, &["--catalog", &catalog]);
    let w = start_worker(&router, "w1", false, &["--kv-budget", "64MiB"]);
    router.wait_workers(&["w1"]).await;
    let m = Mgmt { router: &router };
    let (first, runner) = place(&m, "w1").await;
    wait_ready(&m, &runner).await;
    delete(&m, &first, &runner).await;
    // The installed copy changes on disk (one byte): the next runner reuses the
    // installation, and loading it must refuse it.
    let installed = std::fs::read_dir(w.data_dir.join("models"))
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path().join(SMOLLM2))
        .find(|p| p.is_file())
        .expect("the installed model");
    let mut data = std::fs::read(&installed).unwrap();
    data[1_000_000] ^= 0x5a;
    std::fs::write(&installed, &data).unwrap();
    let (second, runner) = place(&m, "w1").await;
    let failure = m
        .wait_state("the runner to fail", |s| {
            s.runners.get(&runner)?.failure_message().map(str::to_owned)
        })
        .await;
    assert!(failure.contains("changed on disk"), "{failure}");
    assert!(!failure.contains('\n'), "{failure}");
    let record = m
        .wait_state("the instance failure record", |s| {
            s.instance_failures
                .as_ref()?
                .iter()
                .find(|(id, _)| id.as_str() == second)
                .map(|(_, f)| f.clone())
        })
        .await;
    assert_eq!(record.error_code.as_deref(), Some("load_failed"));
    // The refused installation was removed: placing again downloads anew and serves.
    delete(&m, &second, &runner).await;
    let (_, runner) = place(&m, "w1").await;
    let state = wait_ready(&m, &runner).await;
    let downloads = den_tests::manage::downloads_of(&state, "w1", MODEL);
    assert_eq!(downloads.len(), 2, "{downloads:?}");
    drop(router);

    // A file whose checksum the card states but which is no model: the router refuses to
    // start, in one line naming the card.
    let bad_dir = tmp.path().join("bad");
    std::fs::create_dir_all(&bad_dir).unwrap();
    let bad = bad_dir.join("broken.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00 truncated").unwrap();
    let (bytes, sha) = sha256_of(&bad);
    let bad_catalog = gguf_catalog(
        &tmp.path().join("second"),
        &bad_dir.display().to_string(),
        "broken.gguf",
        bytes,
        &sha,
    );
    let out = Command::new(agent_binary())
        .args([
            "router",
            "--listen",
            "127.0.0.1:0",
            "--catalog",
            &bad_catalog,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    assert!(
        last.contains("smol.toml") && last.contains("broken.gguf"),
        "{stderr}"
    );
}
