//! Unit tests of the fence store, the time base and the exit-code mapping. The driver
//! itself is tested end to end over HTTP in `tests/tests/placement_workflow_runtime.rs`.

use std::collections::BTreeSet;

use den_protocol::ids::NodeId;
use den_protocol::placement::{FailureReason, Fence, Outcome, UncertainReason};
use den_protocol::skulk::{CreateInstanceRequest, Instance, InstanceId, ModelId};
use den_protocol::time::Millis;
use serde_json::json;

use super::*;

/// runC's created instance (a real Skulk 1.3.0 body) under another id.
fn instance(id: &str) -> Instance {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/skulk-1.3.0/runC/instance_placement_for_create.json"
    );
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("json");
    value["MlxRingInstance"]["instanceId"] = json!(id);
    serde_json::from_value(value).expect("instance parses")
}

fn fence(id: &str) -> Fence {
    Fence {
        version: Fence::VERSION,
        instance_id: InstanceId::from(id),
        model_id: ModelId::from("org/model"),
        nodes: BTreeSet::from([NodeId::from("n1")]),
        management_node: Some(NodeId::from("n1")),
        compute_node: None,
        context_tokens: Some(4096),
        request: CreateInstanceRequest {
            instance: instance(id),
        },
        created_at: Millis(1_000),
        reconcile_deadline: Millis(61_000),
        hard_expiry: None,
    }
}

fn stored(id: &str) -> StoredFence {
    StoredFence::new("http://127.0.0.1:52415", fence(id))
}

#[test]
fn fence_store_round_trips_one_file_per_instance() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FenceStore::open(dir.path().join("nested/fences")).expect("opens");
    let a = stored("cff479d0-3939-4513-8d59-e5b967b6c9ad");
    let b = stored("85bbd162-8da4-450c-b05b-3e04ac3b9a99");
    let path_a = store.write(&a).expect("writes");
    store.write(&b).expect("writes");
    assert!(path_a.exists());
    assert_eq!(store.load(a.instance_id()).expect("loads"), Some(a.clone()));
    // rewriting the same instance keeps one file
    store.write(&a).expect("rewrites");
    let listed = store.list().expect("lists");
    assert_eq!(listed.len(), 2);
    let ids: Vec<_> = listed
        .iter()
        .map(|e| e.fence.as_ref().expect("valid").instance_id().clone())
        .collect();
    assert!(ids.contains(a.instance_id()) && ids.contains(b.instance_id()));
    // no temporary files are left behind
    let names: Vec<String> = std::fs::read_dir(store.dir())
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".tmp")), "{names:?}");

    store.remove(a.instance_id()).expect("removes");
    assert_eq!(store.load(a.instance_id()).expect("loads"), None);
    store
        .remove(a.instance_id())
        .expect("removing an absent fence is fine");
    assert_eq!(store.list().expect("lists").len(), 1);
}

#[test]
fn fence_file_names_cannot_escape_the_directory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FenceStore::open(dir.path()).expect("opens");
    let odd = stored("../../etc/passwd");
    let path = store.write(&odd).expect("writes");
    assert_eq!(path.parent(), Some(store.dir()));
    assert_eq!(store.load(odd.instance_id()).expect("loads"), Some(odd));
}

#[test]
fn corrupted_fence_files_name_the_file_and_do_not_stop_the_others() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FenceStore::open(dir.path()).expect("opens");
    let good = stored("good-instance");
    store.write(&good).expect("writes");
    let broken = store.dir().join("fence-broken.json");
    std::fs::write(&broken, "{\"kind\": \"den-placement-fence\", \"vers").expect("write");
    let wrong_kind = store.dir().join("fence-wrong-kind.json");
    let mut other = serde_json::to_value(stored("wrong-kind")).expect("json");
    other["kind"] = json!("something-else");
    std::fs::write(&wrong_kind, other.to_string()).expect("write");
    let misplaced = store.dir().join("fence-misplaced.json");
    std::fs::write(
        &misplaced,
        serde_json::to_string(&stored("someone-else")).expect("json"),
    )
    .expect("write");
    // ignored: temporary and unrelated files
    std::fs::write(store.dir().join(".fence-x.json.1-0.tmp"), "partial").expect("write");
    std::fs::write(store.dir().join("README"), "not a fence").expect("write");

    let listed = store.list().expect("lists");
    assert_eq!(listed.len(), 4, "{listed:?}");
    for entry in &listed {
        match &entry.fence {
            Ok(f) => assert_eq!(f, &good),
            Err(e) => {
                let message = e.to_string();
                assert!(matches!(e, FenceError::Corrupt { .. }), "{e:?}");
                assert!(
                    message.contains(&entry.path.display().to_string()),
                    "{message}"
                );
            }
        }
    }
    let err = store
        .load(&InstanceId::from("broken"))
        .expect_err("corrupt");
    assert!(err.to_string().contains("fence-broken.json"), "{err}");
    let err = store
        .load(&InstanceId::from("wrong-kind"))
        .expect_err("corrupt");
    assert!(err.to_string().contains("something-else"), "{err}");
}

#[test]
fn a_fence_that_cannot_be_written_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FenceStore::open(dir.path().join("fences")).expect("opens");
    std::fs::remove_dir(store.dir()).expect("rmdir");
    std::fs::write(store.dir(), "a file where the directory was").expect("write");
    let err = store.write(&stored("x")).expect_err("cannot write");
    assert!(matches!(err, FenceError::Write { .. }), "{err:?}");
    assert!(err.to_string().contains("fence-x.json"), "{err}");
}

#[test]
fn fences_are_stored_in_unix_time_and_the_deadline_is_recomputed_on_resume() {
    let clock = Clock::start();
    let mut f = fence("i");
    f.created_at = Millis(500);
    f.reconcile_deadline = Millis(10_500);
    f.hard_expiry = Some(Millis(1_000_000));
    let disk = clock.fence_to_disk(&f);
    let unix_zero = clock.to_unix_ms(Millis(0));
    assert_eq!(disk.created_at, Millis(unix_zero + 500));
    assert_eq!(disk.reconcile_deadline, Millis(unix_zero + 10_500));
    assert_eq!(disk.hard_expiry, Some(Millis(unix_zero + 1_000_000)));

    // a later process: its own time zero; the window starts again, bounded by expiry
    let later = Clock::start();
    let resumed = later.fence_from_disk(&disk, 60_000);
    assert!(resumed.reconcile_deadline >= Millis(60_000));
    assert!(resumed.reconcile_deadline <= later.now().saturating_add(60_000));
    let hard = resumed.hard_expiry.expect("kept");
    assert!(hard.0 <= 1_000_000 && hard.0 > 900_000, "{hard}");
    let short = later.fence_from_disk(&disk, 5_000_000);
    assert_eq!(short.reconcile_deadline, hard, "the hard expiry bounds it");

    // an expiry already passed: deadline now, one look and the workflow concludes
    let mut expired = disk.clone();
    expired.hard_expiry = Some(Millis(unix_zero.saturating_sub(1)));
    let resumed = later.fence_from_disk(&expired, 60_000);
    assert_eq!(resumed.hard_expiry, Some(Millis(0)));
    assert_eq!(resumed.reconcile_deadline, Millis(0));
}

#[test]
fn exit_codes_follow_the_outcome() {
    let id = Some(InstanceId::from("i"));
    let placed = Outcome::Placed {
        instance_id: InstanceId::from("i"),
        command_id: None,
    };
    let failed = Outcome::Failed {
        instance_id: id.clone(),
        reason: FailureReason::ProbeFailed {
            detail: "boom".into(),
        },
    };
    let uncertain = Outcome::Uncertain {
        instance_id: id.clone(),
        reason: UncertainReason::NotObservedBeforeDeadline {
            deadline: Millis(5),
        },
    };
    assert_eq!(exit_code(&placed), 0);
    assert_eq!(exit_code(&failed), 1);
    assert_eq!(exit_code(&uncertain), 2);
    assert_eq!(exit_code_of(&Ok(uncertain.clone())), 2);
    let declined = PlaceError::Declined {
        instance_id: InstanceId::from("i"),
    };
    assert_eq!(exit_code_of(&Err(declined)), 5);
    let refused = Outcome::Failed {
        instance_id: None,
        reason: FailureReason::TargetNotInTopology {
            nodes: vec!["12D3KooWTypo".into()],
            known: Vec::new(),
        },
    };
    assert_eq!(exit_code(&refused), 3);
    let unreachable = Outcome::Failed {
        instance_id: None,
        reason: FailureReason::StateUnavailable {
            detail: "connection refused".into(),
        },
    };
    assert_eq!(exit_code(&unreachable), 4);
    assert_eq!(outcome_json(&refused)["class"], "refused");
    assert_eq!(outcome_json(&unreachable)["class"], "not-attempted");
    let stalled = PlaceError::Stalled {
        step: den_protocol::placement::StepKind::Reconciling,
        instance_id: id,
    };
    assert_eq!(exit_code_of(&Err(stalled)), 2);

    let j = outcome_json(&failed);
    assert_eq!(j["outcome"], "failed");
    assert_eq!(j["instance_id"], "i");
    assert_eq!(j["exit_code"], 1);
    assert!(j["reason"].as_str().expect("text").contains("boom"));
    assert_eq!(outcome_json(&placed)["outcome"], "placed");
    assert_eq!(outcome_json(&uncertain)["exit_code"], 2);
}

/// Every stored fence gives its readiness deadline relative to now, so a console that
/// starts later shows the deadline the placement was given; a missing directory is not
/// created.
#[test]
fn fence_deadlines_are_relative_to_now() {
    let dir = tempfile::tempdir().expect("tempdir");
    let absent = dir.path().join("not-there");
    assert!(fence_deadlines(&absent, 0).is_empty());
    assert!(!absent.exists());
    let store = FenceStore::open(dir.path().join("fences")).expect("opens");
    // times on disk are wall-clock UNIX ms: deadline 61 000, hard expiry 90 000
    let mut a = stored("cff479d0-3939-4513-8d59-e5b967b6c9ad");
    a.fence.hard_expiry = Some(Millis(90_000));
    store.write(&a).expect("writes");
    let events = fence_deadlines(store.dir(), 21_000);
    assert_eq!(
        events,
        [den_protocol::session::SessionEvent::PlacementDeadline {
            instance: InstanceId::from("cff479d0-3939-4513-8d59-e5b967b6c9ad"),
            deadline_in_ms: 40_000,
            hard_expiry_in_ms: Some(69_000),
        }]
    );
}
