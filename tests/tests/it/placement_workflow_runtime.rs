//! The console's placement runtime end to end: the real `skulk-fixture-server` process
//! serving Skulk 1.3.0 captures (and bodies derived from them) on 127.0.0.1, and
//! `den_console::commands::place` driving the workflow over real HTTP with fences on disk.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use den_console::commands::place::{
    FenceStore, PlaceArgs, PlaceDriver, PlaceError, PlaceOptions, Progress, ProgressNote,
    ProgressSink, ResumeResult, exit_code, place, place_with, resume_all,
};
use den_console::http::ManagementClient;
use den_protocol::ids::NodeId;
use den_protocol::placement::{
    FailureReason, Note, Outcome, PlacementRequest, StepKind, UncertainReason, WorkflowConfig,
};
use den_protocol::skulk::{InstanceId, ModelId};
use den_tests::{FixtureServer, RecordedRequest, script_path, temp_dir, wait_until_async};

const NODE: &str = "12D3KooWS5hbRfsg4cwEX7pKogLSmR1udPzi5g68xyrDuoCesy1L";
const MODEL: &str = "mlx-community/Llama-3.2-1B-Instruct-4bit";
const INSTANCE: &str = "cff479d0-3939-4513-8d59-e5b967b6c9ad";
const RUNNER_FAILURE: &str = "module 'mlx.core' has no attribute 'new_thread_local_stream'";
const TOKEN: &str = "s3cret-management-token";

fn server(script: &str, vars: &[(&str, &str)]) -> FixtureServer {
    FixtureServer::start_with(
        Path::new(env!("CARGO_BIN_EXE_skulk-fixture-server")),
        &script_path(script),
        vars,
    )
    .unwrap_or_else(|e| panic!("fixture server for {script}: {e}"))
}

fn client(server: &FixtureServer, token: Option<&str>) -> ManagementClient {
    ManagementClient::new(
        &server.url(),
        token.map(str::to_owned),
        Duration::from_secs(5),
    )
    .expect("client")
}

/// A deadline that only bounds the run: these scenarios end on evidence long before.
fn config() -> WorkflowConfig {
    WorkflowConfig {
        reconcile_deadline_ms: 20_000,
        poll_interval_ms: 50,
        ..WorkflowConfig::default()
    }
}

/// A deadline meant to pass.
fn short_config() -> WorkflowConfig {
    WorkflowConfig {
        reconcile_deadline_ms: 300,
        poll_interval_ms: 50,
        ..WorkflowConfig::default()
    }
}

fn request() -> PlacementRequest {
    PlacementRequest {
        model_id: ModelId::from(MODEL),
        nodes: BTreeSet::from([NodeId::from(NODE)]),
        context_tokens: Some(4096),
        management_node: Some(NodeId::from(NODE)),
        approved_card_digest: None,
        hard_expiry: None,
        compute: false,
    }
}

/// The real `den` binary with `args` after `--no-record --skulk URL`, state under `home`,
/// no inherited den settings, stdin not a terminal.
async fn den_cli(url: &str, home: &Path, args: &[&str]) -> std::process::Output {
    let den = den_tests::process::binary("den").expect("the den binary");
    let mut all = vec![
        "--no-record".to_owned(),
        "--skulk".to_owned(),
        url.to_owned(),
    ];
    all.extend(args.iter().map(|s| (*s).to_owned()));
    let home = home.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(den)
            .args(&all)
            .env("XDG_STATE_HOME", &home)
            .env_remove("DEN_CONFIG")
            .env_remove("DEN_TOKEN")
            .env_remove("DEN_ROUTER")
            .output()
            .expect("run den")
    })
    .await
    .expect("joined")
}

/// A progress sink that keeps every note.
fn recorder() -> (ProgressSink, Arc<Mutex<Vec<ProgressNote>>>) {
    let notes = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&notes);
    let sink = ProgressSink::from_fn(move |note| kept.lock().expect("lock").push(note));
    (sink, notes)
}

fn requests(server: &FixtureServer) -> Vec<RecordedRequest> {
    server.requests().expect("recorded requests")
}

fn count(recorded: &[RecordedRequest], method: &str, path: &str) -> usize {
    recorded.iter().filter(|r| r.is(method, path)).count()
}

fn fence_files(dir: &Path) -> usize {
    FenceStore::open(dir)
        .expect("store")
        .list()
        .expect("list")
        .len()
}

#[tokio::test]
async fn placement_runtime_accepted_and_ready() {
    let server = server("placement_accepted_ready.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let (sink, notes) = recorder();
    let mut options = PlaceOptions::new(server.url(), dir.path());
    options.workflow = config();
    options.token = Some(TOKEN.to_owned());
    let mut args = PlaceArgs::new(MODEL);
    args.nodes = vec![NodeId::from(NODE)];
    args.context_tokens = Some(4096);
    let outcome = place(&options, args, sink, None).await.expect("outcome");

    match &outcome {
        Outcome::Placed {
            instance_id,
            command_id,
        } => {
            assert_eq!(instance_id.as_str(), INSTANCE);
            assert_eq!(
                command_id.as_ref().map(|c| c.as_str()),
                Some("6ed67eec-54a4-423f-9d8f-616df570497e")
            );
        }
        other => panic!("{other}"),
    }
    assert_eq!(exit_code(&outcome), 0);
    let recorded = requests(&server);
    assert_eq!(count(&recorded, "POST", "/instance"), 1);
    assert_eq!(
        count(&recorded, "POST", "/v1/chat/completions"),
        1,
        "exactly one probe, through the management API"
    );
    let probe = recorded
        .iter()
        .find(|r| r.is("POST", "/v1/chat/completions"))
        .expect("probe");
    let body: serde_json::Value = serde_json::from_str(&probe.body).expect("json body");
    assert_eq!(body["model"], MODEL);
    // the POST carried exactly the selected preview's instance
    let post = recorded
        .iter()
        .find(|r| r.is("POST", "/instance"))
        .expect("post");
    let posted: serde_json::Value = serde_json::from_str(&post.body).expect("json body");
    assert_eq!(
        posted["instance"]["MlxRingInstance"]["instanceId"],
        INSTANCE
    );
    // the runner was seen loading before it was ready: at least three /state reads
    assert!(count(&recorded, "GET", "/state") >= 3, "{recorded:?}");
    assert_eq!(
        fence_files(dir.path()),
        0,
        "a placed instance clears its fence"
    );

    // progress: the fence was on disk before the POST went out
    let notes = notes.lock().expect("lock").clone();
    let position = |pred: &dyn Fn(&Progress) -> bool| notes.iter().position(|n| pred(&n.event));
    let written = position(&|p| matches!(p, Progress::FenceWritten { .. })).expect("fence note");
    let posted_at =
        position(&|p| matches!(p, Progress::Request { what, .. } if what == "POST /instance"))
            .expect("post note");
    assert!(written < posted_at, "fence before POST");
    assert!(
        position(&|p| matches!(p, Progress::Step(StepKind::Probing))).is_some(),
        "the probe step is reported"
    );
    assert!(position(&|p| matches!(p, Progress::Evidence(_))).is_some());
    assert!(matches!(
        notes.last().map(|n| &n.event),
        Some(Progress::Finished(Outcome::Placed { .. }))
    ));
    assert!(
        notes
            .iter()
            .filter(|n| matches!(n.event, Progress::Request { .. }))
            .all(|n| n.instance.is_none()
                || n.instance.as_ref().map(InstanceId::as_str) == Some(INSTANCE))
    );
}

#[tokio::test]
async fn placement_runtime_accepted_then_runner_failed() {
    let server = server("placement_runner_failed.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let driver = PlaceDriver::new(
        client(&server, None),
        FenceStore::open(dir.path()).expect("store"),
        config(),
    );
    let outcome = driver.place(request()).await.expect("outcome");
    match &outcome {
        Outcome::Failed {
            instance_id,
            reason:
                FailureReason::RunnerFailed {
                    node,
                    runner,
                    message,
                },
        } => {
            assert_eq!(instance_id.as_ref().map(InstanceId::as_str), Some(INSTANCE));
            assert_eq!(node.as_str(), NODE);
            assert_eq!(runner.as_str(), "6954210c-447d-403a-892a-ab35c39bc2de");
            assert_eq!(message, RUNNER_FAILURE);
        }
        other => panic!("{other}"),
    }
    assert!(outcome.to_string().contains(RUNNER_FAILURE));
    assert_eq!(exit_code(&outcome), 1);
    let recorded = requests(&server);
    assert_eq!(count(&recorded, "POST", "/instance"), 1);
    assert_eq!(
        count(&recorded, "POST", "/v1/chat/completions"),
        0,
        "no probe"
    );
    assert_eq!(
        fence_files(dir.path()),
        0,
        "a failed placement clears its fence"
    );
}

#[tokio::test]
async fn placement_runtime_response_lost_is_reconciled_without_a_second_post() {
    let server = server("placement_response_lost.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let (sink, notes) = recorder();
    let driver = PlaceDriver::new(
        client(&server, None),
        FenceStore::open(dir.path()).expect("store"),
        config(),
    )
    .with_progress(sink);
    let outcome = driver.place(request()).await.expect("outcome");

    let recorded = requests(&server);
    let posts: Vec<_> = recorded
        .iter()
        .filter(|r| r.is("POST", "/instance"))
        .collect();
    assert_eq!(
        posts.len(),
        1,
        "a lost response is reconciled, never re-posted"
    );
    assert_eq!(posts[0].served, "drop-after-read");
    assert!(
        notes.lock().expect("lock").iter().any(|n| matches!(
            n.event,
            Progress::Note(Note::SubmissionOutcomeUnknown { .. })
        )),
        "the lost response is reported"
    );
    // /state after the POST: twice without the instance, then ready
    let polls_after_post = recorded
        .iter()
        .skip_while(|r| !r.is("POST", "/instance"))
        .filter(|r| r.is("GET", "/state"))
        .count();
    assert!(polls_after_post >= 2, "{recorded:?}");
    match &outcome {
        Outcome::Placed { instance_id, .. } => {
            assert_eq!(instance_id.as_str(), INSTANCE);
            assert_eq!(count(&recorded, "POST", "/v1/chat/completions"), 1);
            assert_eq!(fence_files(dir.path()), 0);
        }
        Outcome::Uncertain { .. } => assert_eq!(fence_files(dir.path()), 1),
        other => panic!("the evidence shows the instance ready: {other}"),
    }
}

#[tokio::test]
async fn placement_runtime_nothing_observed_before_the_deadline_is_uncertain() {
    let server = server("placement_not_observed.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let driver = PlaceDriver::new(
        client(&server, None),
        FenceStore::open(dir.path()).expect("store"),
        short_config(),
    );
    let outcome = driver.place(request()).await.expect("outcome");
    match &outcome {
        Outcome::Uncertain {
            instance_id,
            reason: UncertainReason::NotObservedBeforeDeadline { .. },
        } => assert_eq!(instance_id.as_ref().map(InstanceId::as_str), Some(INSTANCE)),
        other => panic!("{other}"),
    }
    assert_eq!(exit_code(&outcome), 2);
    let recorded = requests(&server);
    assert_eq!(count(&recorded, "POST", "/instance"), 1);
    assert_eq!(count(&recorded, "POST", "/v1/chat/completions"), 0);
    // the fence is kept, on disk, in wall-clock time
    let store = FenceStore::open(dir.path()).expect("store");
    let kept = store
        .load(&InstanceId::from(INSTANCE))
        .expect("readable")
        .expect("kept for an uncertain outcome");
    assert_eq!(kept.origin, server.url());
    assert!(
        kept.fence.created_at.0 > 1_600_000_000_000,
        "UNIX ms, not logical time: {}",
        kept.fence.created_at
    );
    assert!(kept.fence.reconcile_deadline > kept.fence.created_at);
}

/// A placement into `fences` killed once its fence is on disk and its `POST /instance`
/// reached the server, with the response outstanding (a process that died mid-submit).
async fn interrupted_placement(server: &FixtureServer, fences: &Path) {
    let first = PlaceDriver::new(
        client(server, None),
        FenceStore::open(fences).expect("store"),
        config(),
    );
    let running = tokio::spawn(first.place(request()));
    assert!(
        wait_until_async(Duration::from_secs(20), || server
            .count("POST", "/instance")
            == 1)
        .await,
        "the POST was never sent"
    );
    running.abort();
    assert!(running.await.is_err(), "the first driver was stopped");
    assert_eq!(fence_files(fences), 1, "the fence is on disk");
}

#[tokio::test]
async fn placement_runtime_fence_survives_a_restart() {
    let server = server("placement_restart.json", &[]);
    let dir = temp_dir().expect("tempdir");
    interrupted_placement(&server, dir.path()).await;

    // a new driver resumes every fence straight into reconciliation
    let (sink, notes) = recorder();
    let resumed = resume_all(
        dir.path(),
        &client(&server, None),
        &config(),
        Duration::from_secs(10),
        sink,
    )
    .await
    .expect("resumes");
    assert_eq!(resumed.len(), 1);
    assert_eq!(
        resumed[0].instance_id.as_ref().map(InstanceId::as_str),
        Some(INSTANCE)
    );
    match &resumed[0].result {
        ResumeResult::Finished(Outcome::Placed { instance_id, .. }) => {
            assert_eq!(instance_id.as_str(), INSTANCE)
        }
        other => panic!("{other:?}"),
    }
    let recorded = requests(&server);
    assert_eq!(count(&recorded, "POST", "/instance"), 1, "no second POST");
    assert_eq!(count(&recorded, "POST", "/v1/chat/completions"), 1);
    // the resumed run rechecked the identity after the POST, before reconciling
    let after_post: Vec<_> = recorded
        .iter()
        .skip_while(|r| !r.is("POST", "/instance"))
        .skip(1)
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert_eq!(after_post.first().map(String::as_str), Some("GET /node_id"));
    assert!(notes.lock().expect("lock").iter().any(|n| matches!(
        n.event,
        Progress::Note(Note::Resumed { .. })
    )
        && n.instance.as_ref().map(InstanceId::as_str) == Some(INSTANCE)));
    assert_eq!(fence_files(dir.path()), 0, "placed: the fence is cleared");
}

#[tokio::test]
async fn placement_runtime_credentials_stay_with_the_management_origin() {
    let other = server("record_only.json", &[]);
    let other_url = other.url();
    let server = server("placement_redirect.json", &[("OTHER", &other_url)]);
    let dir = temp_dir().expect("tempdir");
    let driver = PlaceDriver::new(
        client(&server, Some(TOKEN)),
        FenceStore::open(dir.path()).expect("store"),
        short_config(),
    );
    let outcome = driver.place(request()).await.expect("outcome");

    let recorded = requests(&server);
    let post = recorded
        .iter()
        .find(|r| r.is("POST", "/instance"))
        .expect("post");
    assert_eq!(post.served, "respond 307");
    assert!(
        recorded
            .iter()
            .all(|r| r.authorization.as_deref() == Some(&format!("Bearer {TOKEN}"))),
        "the token goes to the configured origin: {recorded:?}"
    );
    assert!(
        requests(&other).is_empty(),
        "the redirect was not followed: {:?}",
        requests(&other)
    );
    assert_eq!(count(&recorded, "POST", "/instance"), 1);
    // an unfollowed redirect says nothing about the submission: reconcile, not retry
    assert!(matches!(outcome, Outcome::Uncertain { .. }), "{outcome}");
}

#[tokio::test]
async fn placement_runtime_sends_nothing_without_a_durable_fence() {
    let server = server("placement_accepted_ready.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let fences = dir.path().join("fences");
    let store = FenceStore::open(&fences).expect("store");
    // the directory turns into a file: every fence write fails
    std::fs::remove_dir(&fences).expect("rmdir");
    std::fs::write(&fences, "not a directory").expect("write");
    let driver = PlaceDriver::new(client(&server, None), store, config());
    let outcome = driver.place(request()).await.expect("outcome");
    match &outcome {
        Outcome::Failed {
            reason: FailureReason::FenceNotPersisted { detail },
            ..
        } => assert!(detail.contains("fence-"), "names the file: {detail}"),
        other => panic!("{other}"),
    }
    assert_eq!(server.count("POST", "/instance"), 0, "nothing sent");
}

#[tokio::test]
async fn placement_runtime_declined_confirmation_writes_and_sends_nothing() {
    let server = server("placement_accepted_ready.json", &[]);
    let dir = temp_dir().expect("tempdir");
    let mut options = PlaceOptions::new(server.url(), dir.path());
    options.workflow = config();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&asked);
    let confirm = Arc::new(
        move |plan: &den_console::commands::place::SubmissionPlan<'_>| {
            seen.lock()
                .expect("lock")
                .push((plan.origin.to_owned(), plan.fence.instance_id.clone()));
            false
        },
    );
    // no --node: the management API's own node is the target
    let result = place(
        &options,
        PlaceArgs::new(MODEL),
        ProgressSink::none(),
        Some(confirm),
    )
    .await;
    match result {
        Err(PlaceError::Declined { instance_id }) => assert_eq!(instance_id.as_str(), INSTANCE),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        asked.lock().expect("lock").as_slice(),
        &[(server.url(), InstanceId::from(INSTANCE))]
    );
    assert_eq!(server.count("POST", "/instance"), 0);
    assert_eq!(fence_files(dir.path()), 0);
}

/// `den place` run again for the same intent after an interrupted (or uncertain) one
/// finds that run's fence and reconciles it: no second `POST /instance`, the first
/// submission ends placed.
#[tokio::test]
async fn placement_runtime_place_again_resumes_the_fence_of_the_same_intent() {
    let server = server("placement_restart.json", &[]);
    let dir = temp_dir().expect("tempdir");
    interrupted_placement(&server, dir.path()).await;

    let mut args = PlaceArgs::new(MODEL);
    args.nodes = vec![NodeId::from(NODE)];
    let (sink, notes) = recorder();
    let outcome = place_with(
        client(&server, None),
        dir.path(),
        &config(),
        Duration::from_secs(10),
        args,
        sink,
        None,
    )
    .await
    .expect("outcome");
    match &outcome {
        Outcome::Placed { instance_id, .. } => assert_eq!(instance_id.as_str(), INSTANCE),
        other => panic!("{other}"),
    }
    let recorded = requests(&server);
    assert_eq!(count(&recorded, "POST", "/instance"), 1, "no second POST");
    assert!(
        notes
            .lock()
            .expect("lock")
            .iter()
            .any(|n| matches!(n.event, Progress::Note(Note::Resumed { .. })))
    );
    assert_eq!(fence_files(dir.path()), 0, "placed: the fence is cleared");
}

/// `den reconcile` resumes the fence an interrupted placement left, against the
/// management API it was submitted to: placed, one POST in all, the fence cleared; run
/// again, it finds nothing to do.
#[tokio::test]
async fn placement_runtime_den_reconcile_resolves_stored_fences() {
    let server = server("placement_restart.json", &[]);
    let state = temp_dir().expect("tempdir");
    let fences = state.path().join("den").join("placement-fences");
    interrupted_placement(&server, &fences).await;

    let url = server.url();
    let out = den_cli(&url, state.path(), &["reconcile"]).await;
    let stdout = succeeded(&out);
    assert!(stdout.contains(&format!("{INSTANCE}: placed")), "{stdout}");
    assert_eq!(
        count(&requests(&server), "POST", "/instance"),
        1,
        "no second POST"
    );
    assert_eq!(fence_files(&fences), 0);
    let again = den_cli(&url, state.path(), &["reconcile"]).await;
    assert!(again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("no stored placement fences"),
        "{again:?}"
    );
}

/// `den place` with the whole intent on the command line, the real binary against the
/// fixture server: an expected management node the API does not answer as, or a context
/// no preview holds, or a node the topology lacks, stops the placement before a fence is
/// written or anything is posted (exit 3 "refused", a JSON outcome naming why); a
/// management API that does not answer is exit 4 "not attempted"; a usage error is 64,
/// never 2 ("uncertain"); the intent the previews admit is placed.
#[tokio::test]
async fn placement_runtime_den_place_takes_the_whole_intent_from_the_command_line() {
    let run = |url: String, home: std::path::PathBuf, extra: Vec<&'static str>| async move {
        let mut args = vec!["place", MODEL, "--node", NODE, "--yes", "--json"];
        args.extend(extra);
        den_cli(&url, &home, &args).await
    };
    for (extra, says) in [
        (
            vec!["--expect-management-node", "12D3KooWnotTheManagementNode"],
            "12D3KooWnotTheManagementNode",
        ),
        (vec!["--context-tokens", "2000000000"], "context"),
        // a second --node the topology does not list: named, before any preview
        (
            vec!["--node", "12D3KooWTypoNotInTheTopology"],
            "missing from the cluster topology",
        ),
    ] {
        let server = server("placement_accepted_ready.json", &[]);
        let state = temp_dir().expect("tempdir");
        let out = run(server.url(), state.path().to_path_buf(), extra.clone()).await;
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(3), "refused: {extra:?}: {stdout}");
        let json: serde_json::Value =
            serde_json::from_str(stdout.trim()).expect("one JSON document");
        assert_eq!(json["status"], "failed", "{json}");
        assert_eq!(json["class"], "refused", "{json}");
        assert!(
            json["detail"].as_str().is_some_and(|d| d.contains(says)),
            "{extra:?}: {json}"
        );
        assert_eq!(
            count(&requests(&server), "POST", "/instance"),
            0,
            "{extra:?}"
        );
        let fences = state.path().join("den").join("placement-fences");
        assert_eq!(fence_files(&fences), 0, "{extra:?}");
    }
    let server = server("placement_accepted_ready.json", &[]);
    let state = temp_dir().expect("tempdir");
    let out = run(
        server.url(),
        state.path().to_path_buf(),
        vec![
            "--context-tokens",
            "4096",
            "--expect-management-node",
            NODE,
            "--expires",
            "2h",
            "--wait",
            "20s",
        ],
    )
    .await;
    let stdout = succeeded(&out);
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    assert_eq!(json["outcome"], "placed", "{json}");
    assert_eq!(count(&requests(&server), "POST", "/instance"), 1);

    // nothing listens: not attempted (4), one JSON document
    let state = temp_dir().expect("tempdir");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", closed.local_addr().expect("addr"));
    drop(closed);
    let out = run(url, state.path().to_path_buf(), vec![]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{stdout}");
    let json: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON document");
    assert_eq!(json["class"], "not-attempted", "{json}");

    // a usage error is never read as "uncertain"
    let out = run(
        String::from("http://127.0.0.1:9"),
        state.path().to_path_buf(),
        vec!["--no-such-flag"],
    )
    .await;
    assert_eq!(out.status.code(), Some(64));
}

/// `den delete` is done only when `/state` stops listing the instance: against runC's
/// real acknowledgement, an instance that leaves `/state` exits 0 ("gone"), one that
/// stays exits 2 ("deletion requested, not yet confirmed"); without `--yes` on a
/// non-terminal nothing is sent.
#[tokio::test]
async fn placement_runtime_den_delete_confirms_the_instance_is_gone() {
    let state = temp_dir().expect("tempdir");
    let run = |url: String, extra: Vec<&'static str>| {
        let home = state.path().to_path_buf();
        async move {
            let mut args = vec!["delete", INSTANCE];
            args.extend(extra);
            den_cli(&url, &home, &args).await
        }
    };
    let gone = server("delete_acknowledged_then_gone.json", &[]);
    let refused = run(gone.url(), vec![]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert_eq!(
        count(&requests(&gone), "DELETE", &format!("/instance/{INSTANCE}")),
        0
    );

    let out = run(gone.url(), vec!["--yes"]).await;
    let stdout = succeeded(&out);
    assert!(stdout.contains("gone from /state"), "{stdout}");
    assert_eq!(
        count(&requests(&gone), "DELETE", &format!("/instance/{INSTANCE}")),
        1
    );

    let intents = state.path().join("den").join("cleanup-intents");
    assert!(
        std::fs::read_dir(&intents).map_or(true, |d| d.count() == 0),
        "a confirmed deletion leaves no cleanup intent"
    );

    let listed = server("delete_acknowledged_gone_later.json", &[]);
    let out = run(listed.url(), vec!["--yes"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("deletion requested, not yet confirmed"),
        "{stderr}"
    );
    assert!(stderr.contains(INSTANCE), "{stderr}");
    assert!(stderr.contains("cleanup intent is kept"), "{stderr}");
    let kept: Vec<_> = std::fs::read_dir(&intents)
        .expect("cleanup intents")
        .filter_map(Result::ok)
        .collect();
    assert_eq!(kept.len(), 1, "the unconfirmed deletion is remembered");

    // den reconcile retries it until absence is confirmed, then forgets it
    let out = den_cli(&listed.url(), state.path(), &["reconcile"]).await;
    let stdout = succeeded(&out);
    assert!(stdout.contains(&format!("{INSTANCE}: deleted")), "{stdout}");
    assert_eq!(
        count(
            &requests(&listed),
            "DELETE",
            &format!("/instance/{INSTANCE}")
        ),
        2,
        "one DELETE per attempt"
    );
    assert_eq!(std::fs::read_dir(&intents).expect("dir").count(), 0);
}

/// `den place --compute URL`, the real binary against two fixture servers: the compute
/// node's own API is bound by its `/node_id` (one of the wanted nodes, else refused with
/// exit 3 before anything is posted) and its `/state` is polled beside the management
/// API's, from the baseline through readiness. The management token never goes to the
/// compute origin.
#[tokio::test]
async fn placement_runtime_den_place_polls_the_compute_node_too() {
    let place = |url: String, compute: String, home: std::path::PathBuf| async move {
        let args = [
            "--token",
            TOKEN,
            "place",
            MODEL,
            "--node",
            NODE,
            "--yes",
            "--json",
            "--wait",
            "20s",
            "--compute",
            &compute,
        ];
        den_cli(&url, &home, &args).await
    };

    // a compute endpoint that is another node: refused, nothing posted
    let management = server("placement_accepted_ready.json", &[]);
    let other = server(
        "compute_node_ready.json",
        &[("NODE", "12D3KooWNotTheWantedNode")],
    );
    let state = temp_dir().expect("tempdir");
    let out = place(management.url(), other.url(), state.path().to_path_buf()).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}");
    assert!(stdout.contains("12D3KooWNotTheWantedNode"), "{stdout}");
    assert_eq!(count(&requests(&management), "POST", "/instance"), 0);
    assert_eq!(count(&requests(&other), "GET", "/state"), 0);

    // the wanted node: both sides polled, placed
    let management = server("placement_accepted_ready.json", &[]);
    let compute = server("compute_node_ready.json", &[("NODE", NODE)]);
    let state = temp_dir().expect("tempdir");
    let out = place(management.url(), compute.url(), state.path().to_path_buf()).await;
    succeeded(&out);
    let seen = requests(&compute);
    assert_eq!(count(&seen, "GET", "/node_id"), 1);
    assert!(
        count(&seen, "GET", "/state") >= 2,
        "baseline and reconciliation: {seen:?}"
    );
    assert!(
        seen.iter().all(|r| r.authorization.is_none()),
        "the management token stays with the management origin"
    );
    assert_eq!(count(&requests(&management), "POST", "/instance"), 1);
    // --json progress: one JSON object per stderr line, the waiting summary among them,
    // and no line per successful /state poll
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notes: Vec<String> = stderr
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(v["event"], "progress", "{l}");
            v["note"].as_str().unwrap_or_default().to_owned()
        })
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("waiting: ") && n.contains("download")),
        "{notes:?}"
    );
    assert!(
        !notes.iter().any(|n| n.starts_with("← GET /state 200")),
        "{notes:?}"
    );
}

/// `den cancel` without a den router goes to Skulk's own endpoint,
/// `POST /v1/cancel/{command_id}`: exit 0 for a generation it knows, 1 with Skulk's
/// refusal in one line for one it does not.
#[tokio::test]
async fn den_cancel_goes_to_skulk_when_no_router_is_configured() {
    const COMMAND: &str = "3d1f6a52-9c1e-4b7e-8d7f-0e6f2b1c9a10";
    let skulk = server("skulk_cancel.json", &[("COMMAND", COMMAND)]);
    let state = temp_dir().expect("tempdir");
    let out = den_cli(&skulk.url(), state.path(), &["cancel", COMMAND]).await;
    succeeded(&out);
    assert_eq!(
        count(&requests(&skulk), "POST", &format!("/v1/cancel/{COMMAND}")),
        1
    );

    let out = den_cli(&skulk.url(), state.path(), &["cancel", "not-a-command"]).await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("404") && stderr.lines().count() <= 3,
        "{stderr}"
    );
}

/// A command's stdout after checking it exited 0 (else both streams in the failure).
fn succeeded(out: &std::process::Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}
