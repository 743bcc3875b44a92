//! The console's placement flow end to end against den's own router and two workers: the
//! real `den place MODEL --node W --yes --json` (requirements → previews → exact selection
//! → fence → POST /instance → reconcile /state → one inference probe) ends `placed`;
//! `den status --json` then shows the instance ready (download, runner and the inference
//! the router attributes to it agree); `den delete` removes it.
//!
//! Needs `den-agent` and `den` built (`cargo build -p den-agent -p den-console`; the test
//! builds `den` itself when it is missing).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use den_tests::agents::{Router, start_router, start_worker};
use den_tests::manage::{Mgmt, artifact, local_catalog};
use den_tests::{binary, cargo_build};

const TOKEN: &str = "console-secret";
const MODEL: &str = "den/tiny-chat";

fn den() -> PathBuf {
    binary("den")
        .or_else(|_| cargo_build("den-console").and_then(|()| binary("den")))
        .expect("the den binary")
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `den --router URL --token T ARGS…` with its state and config under `home`.
async fn run_den(router: &Router, home: &std::path::Path, args: &[&str]) -> Run {
    let mut cmd = tokio::process::Command::new(den());
    cmd.arg("--router")
        .arg(&router.url)
        .arg("--token")
        .arg(TOKEN)
        .args(args)
        .env("XDG_STATE_HOME", home.join("state"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env_remove("DEN_ROUTER")
        .env_remove("DEN_SKULK")
        .env_remove("DEN_TOKEN")
        .env_remove("DEN_CONFIG")
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(300), cmd.output())
        .await
        .expect("den finished within 5 minutes")
        .expect("den ran");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json_of(run: &Run) -> Value {
    serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr:\n{}",
            run.stdout, run.stderr
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manage_den_place_then_status_ready_then_delete() {
    let assets = tempfile::tempdir().unwrap();
    let files = artifact(5, 1_000_000);
    let local = local_catalog(
        assets.path(),
        MODEL,
        Some("den-registry:tiny-chat:v1"),
        &files,
    );
    let catalog_arg = local.dir.display().to_string();
    let router = start_router(Some(TOKEN), &["--catalog", &catalog_arg]);
    let _w1 = start_worker(&router, "w1", false, &[]);
    let _w2 = start_worker(&router, "w2", false, &[]);
    router.wait_workers(&["w1", "w2"]).await;
    let home = assets.path().join("home");

    // A model the catalog does not have: refused (exit 3), nothing submitted.
    let missing = run_den(
        &router,
        &home,
        &["place", "den/none", "--node", "w1", "--yes", "--json"],
    )
    .await;
    assert_eq!(missing.code, Some(3), "{}", missing.stderr);
    let out = json_of(&missing);
    assert_eq!(out["outcome"], "failed", "{out}");
    assert!(
        out["reason"]
            .as_str()
            .unwrap_or("")
            .contains("not in the catalog"),
        "{out}"
    );

    let placed = run_den(
        &router,
        &home,
        &["place", MODEL, "--node", "w1", "--yes", "--json"],
    )
    .await;
    assert_eq!(
        placed.code,
        Some(0),
        "stdout {}\nstderr {}",
        placed.stdout,
        placed.stderr
    );
    let out = json_of(&placed);
    assert_eq!(out["outcome"], "placed", "{out}");
    assert_eq!(out["status"], "ok", "{out}");
    let instance = out["instance_id"].as_str().expect("instance id").to_owned();
    assert!(out["command_id"].as_str().is_some(), "{out}");
    assert!(placed.stderr.contains("probe"), "{}", placed.stderr);

    // The router's state agrees, and the probe is attributed to the instance.
    let m = Mgmt { router: &router };
    let state = m.state().await;
    let placed_instance = &state.instances[&instance.as_str().into()];
    assert_eq!(
        placed_instance.nodes(),
        [den_protocol::ids::NodeId::from("w1")].into()
    );
    let served = &state.inference.as_ref().unwrap()[&instance.as_str().into()];
    assert!(served.completed >= 1, "{served:?}");

    // A second instance of the same model on the other worker: its probe is pinned to
    // it, so the answer is attributable and it is placed too.
    let second = run_den(
        &router,
        &home,
        &["place", MODEL, "--node", "w2", "--yes", "--json"],
    )
    .await;
    assert_eq!(
        second.code,
        Some(0),
        "stdout {}\nstderr {}",
        second.stdout,
        second.stderr
    );
    let out = json_of(&second);
    assert_eq!(out["outcome"], "placed", "{out}");
    let other = out["instance_id"].as_str().expect("instance id").to_owned();
    assert_ne!(other, instance);

    let status = run_den(&router, &home, &["status", "--json"]).await;
    assert_eq!(status.code, Some(0), "{}", status.stderr);
    let snapshot = json_of(&status);
    for id in [&instance, &other] {
        let row = snapshot["instances"]
            .as_array()
            .and_then(|rows| {
                rows.iter()
                    .find(|r| r["row"] == "instance" && r["instance"] == id.as_str())
            })
            .unwrap_or_else(|| panic!("instance row of {id} in {snapshot}"));
        assert_eq!(row["verdict"]["kind"], "ready", "{row}");
        for evidence in ["download", "runner", "probe"] {
            assert_eq!(row[evidence], "ok", "{evidence}: {row}");
        }
    }

    for id in [&instance, &other] {
        // Without --yes and no terminal, nothing is sent.
        let refused = run_den(&router, &home, &["delete", id]).await;
        assert_eq!(refused.code, Some(1), "{}", refused.stderr);
        assert!(refused.stderr.contains("--yes"), "{}", refused.stderr);
        let deleted = run_den(&router, &home, &["delete", id, "--yes"]).await;
        assert_eq!(deleted.code, Some(0), "{}", deleted.stderr);
        // Done means gone from /state, not only acknowledged.
        assert!(
            deleted.stdout.contains("gone from /state"),
            "{}",
            deleted.stdout
        );
    }
    m.wait_state("the instance and its runner gone", |s| {
        (s.instances.is_empty() && s.runners.is_empty()).then_some(())
    })
    .await;
    // No fence is left behind for a placement that finished.
    let fences = home.join("state").join("den").join("placement-fences");
    let left = std::fs::read_dir(&fences).map(|d| d.count()).unwrap_or(0);
    assert_eq!(left, 0, "fences left in {}", fences.display());
}
