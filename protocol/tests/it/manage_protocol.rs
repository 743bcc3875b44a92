//! den's management additions to the pure core: the `place-runner` / `remove-runner`
//! frames (validated by the codec), download and runner reports in heartbeats, the den
//! additions to `/state` (`inference`, `nodePools`) and `served_by` on a probe answer.

use den_protocol::ids::WorkerId;
use den_protocol::observation::{DownloadReport, DownloadStage, Observation};
use den_protocol::placement::ProbeResult;
use den_protocol::skulk::{InstanceId, InstanceInference, NodePool, State};
use den_protocol::wire::{
    ArtifactFile, CodecError, Control, ControlToWorker, DEFAULT_MAX_FRAME, Heartbeat,
    ModelArtifact, PlaceRunner, RemoveRunner, ToRouter, WorkerInbound, decode_for_router,
    decode_for_worker, encode,
};
use serde_json::{Value, json};

fn me() -> WorkerId {
    WorkerId::from("w1")
}

fn artifact() -> ModelArtifact {
    ModelArtifact {
        model_id: "den/tiny".into(),
        fingerprint: "den/tiny".into(),
        card_digest: "c".repeat(64),
        registry_card_id: Some("den-registry:tiny:v1".into()),
        layers: 4,
        kv_bytes_per_token: 512,
        context_length: 2048,
        files: vec![
            ArtifactFile {
                path: "config.json".into(),
                bytes: 16,
                sha256: "1".repeat(64),
            },
            ArtifactFile {
                path: "weights/part-0.bin".into(),
                bytes: 4096,
                sha256: "2".repeat(64),
            },
        ],
        format: Default::default(),
    }
}

fn place(to: &str) -> ControlToWorker {
    ControlToWorker {
        to: to.into(),
        control: Control::PlaceRunner(Box::new(PlaceRunner {
            instance_id: "i1".into(),
            runner_id: "r1".into(),
            artifact: artifact(),
            source: "s3://bucket/tiny".into(),
        })),
    }
}

fn at_worker(bytes: &[u8]) -> Result<WorkerInbound, CodecError> {
    decode_for_worker(bytes, DEFAULT_MAX_FRAME, &me())
}

fn mutated(frame: &ControlToWorker, edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&encode(frame).unwrap()).unwrap();
    edit(&mut v);
    serde_json::to_vec(&v).unwrap()
}

#[test]
fn place_and_remove_runner_round_trip_to_the_addressed_worker_only() {
    let frame = place("w1");
    let bytes = encode(&frame).unwrap();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["type"], "place-runner");
    assert_eq!(v["artifact"]["files"][1]["path"], "weights/part-0.bin");
    assert_eq!(
        at_worker(&bytes).unwrap(),
        WorkerInbound::Control(frame.control.clone())
    );
    assert!(matches!(
        at_worker(&encode(&place("w2")).unwrap()).unwrap(),
        WorkerInbound::Ignored {
            ty: "place-runner",
            ..
        }
    ));
    let remove = ControlToWorker {
        to: "w1".into(),
        control: Control::RemoveRunner(RemoveRunner {
            instance_id: "i1".into(),
            runner_id: "r1".into(),
        }),
    };
    assert_eq!(
        at_worker(&encode(&remove).unwrap()).unwrap(),
        WorkerInbound::Control(remove.control.clone())
    );
    // Router-bound they are a protocol violation, named as such.
    for f in [&frame, &remove] {
        let err = decode_for_router(&encode(f).unwrap(), DEFAULT_MAX_FRAME).unwrap_err();
        assert!(matches!(err, CodecError::UnexpectedType { .. }), "{err}");
    }
}

#[test]
fn malformed_placements_are_refused_with_the_field_named() {
    let frame = place("w1");
    type Edit = Box<dyn FnOnce(&mut Value)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "artifact.files.path",
            Box::new(|v| v["artifact"]["files"][0]["path"] = json!("../../etc/passwd")),
        ),
        (
            "artifact.files.sha256",
            Box::new(|v| v["artifact"]["files"][1]["sha256"] = json!("not-hex")),
        ),
        (
            "artifact.card_digest",
            Box::new(|v| v["artifact"]["card_digest"] = json!("short")),
        ),
        (
            "artifact.kv_bytes_per_token",
            Box::new(|v| v["artifact"]["kv_bytes_per_token"] = json!(0)),
        ),
        (
            "artifact.files",
            Box::new(|v| v["artifact"]["files"] = json!([])),
        ),
        ("runner_id", Box::new(|v| v["runner_id"] = json!(""))),
        (
            "instance_id",
            Box::new(|v| {
                v.as_object_mut().unwrap().remove("instance_id");
            }),
        ),
        ("source", Box::new(|v| v["source"] = json!("  "))),
        (
            "artifact",
            Box::new(|v| v["artifact"]["layers"] = json!("four")),
        ),
    ];
    for (field, edit) in cases {
        let err = at_worker(&mutated(&frame, edit)).unwrap_err();
        match &err {
            CodecError::InvalidField { field: got, .. } => {
                assert!(got.starts_with(field), "{field}: {err}")
            }
            other => panic!("{field}: {other}"),
        }
        assert!(!err.to_string().contains('\n'));
    }
}

#[test]
fn heartbeats_carry_download_and_runner_reports_and_reject_inconsistent_ones() {
    let mut obs = Observation::new("w1", "w1");
    obs.kv_budget_bytes = 1 << 20;
    obs.downloads.push(DownloadReport {
        attempt_id: "a1".into(),
        model_id: "den/tiny".into(),
        card_digest: "c".repeat(64),
        instance_id: Some("i1".into()),
        stage: DownloadStage::Ongoing,
        bytes_done: 10,
        bytes_total: 100,
        files_done: 0,
        files_total: 2,
        bytes_per_s: 5.0,
        directory: "/data/models/c".into(),
    });
    let hb = ToRouter::Heartbeat(Box::new(Heartbeat { observation: obs }));
    let bytes = encode(&hb).unwrap();
    assert_eq!(decode_for_router(&bytes, DEFAULT_MAX_FRAME).unwrap(), hb);
    let mut v: Value = serde_json::from_slice(&bytes).unwrap();
    v["observation"]["downloads"][0]["bytes_per_s"] = json!(-1.0);
    let err = decode_for_router(&serde_json::to_vec(&v).unwrap(), DEFAULT_MAX_FRAME).unwrap_err();
    assert!(err.to_string().contains("observation"), "{err}");
}

#[test]
fn den_state_additions_round_trip_and_are_reported_by_the_dialect() {
    let mut state = State::default();
    assert!(state.dialect().is_legacy());
    state.inference = Some(
        [(
            InstanceId::from("i1"),
            InstanceInference {
                completed: 2,
                runner_id: Some("r1".into()),
                ..InstanceInference::default()
            },
        )]
        .into_iter()
        .collect(),
    );
    state.node_pools = Some(
        [(
            "w1".into(),
            NodePool {
                total_pages: 8,
                ..NodePool::default()
            },
        )]
        .into_iter()
        .collect(),
    );
    let v = serde_json::to_value(&state).unwrap();
    assert_eq!(v["inference"]["i1"]["runnerId"], "r1");
    assert_eq!(v["nodePools"]["w1"]["totalPages"], 8);
    let back: State = serde_json::from_value(v).unwrap();
    assert_eq!(back, state);
    let d = back.dialect();
    assert!(d.inference && d.node_pools && !d.is_legacy());
    assert!(d.unknown_keys.is_empty(), "{:?}", d.unknown_keys);
}

#[test]
fn a_probe_answer_names_the_instance_that_served_it_when_the_server_says() {
    let body = |extra: Value| {
        let mut v = json!({
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ready"}, "finish_reason": "stop"}],
        });
        if let (Some(m), Value::Object(e)) = (v.as_object_mut(), extra) {
            m.extend(e);
        }
        v.to_string()
    };
    assert_eq!(
        ProbeResult::from_response(200, &body(json!({"served_by": "i7"}))),
        ProbeResult::Completed {
            served_by: Some("i7".into())
        }
    );
    assert_eq!(
        ProbeResult::from_response(200, &body(json!({}))),
        ProbeResult::Completed { served_by: None }
    );
}
