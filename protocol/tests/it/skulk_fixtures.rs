//! Every file of `tests/fixtures/skulk-1.3.0` parses with den's Skulk types, round-trips
//! to the same JSON where den may serve it back, and shows the facts a console relies on.
//! The walk fails when a fixture file is added that no rule covers.

use crate::skulk_support;

use std::collections::{BTreeMap, BTreeSet};

use den_protocol::ids::NodeId;
use den_protocol::skulk::api::{
    CreateInstanceRequest, CreateInstanceResponse, DeleteInstanceResponse, DownloadCommandResponse,
    ModelList, NodeIdentityResponse, PreviewsResponse, StartDownloadRequest,
};
use den_protocol::skulk::chat::ChatCompletionResponse;
use den_protocol::skulk::error::{ApiError, ErrorCode};
use den_protocol::skulk::sse::{StreamItem, parse_sse, stream_items};
use den_protocol::skulk::topology::Edge;
use den_protocol::skulk::{
    DownloadPhase, DownloadProgress, Event, Instance, InstanceId, RunnerId, RunnerPhase,
    RunnerStatus, ShardMetadata, State, Task, TaskStatus,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use skulk_support::*;

#[derive(Debug)]
enum Parsed {
    NodeId(NodeId),
    NodeIdentity(NodeIdentityResponse),
    State(Box<State>),
    Events(Vec<Event>),
    Previews(PreviewsResponse),
    Instance(Box<Instance>),
    Deleted(DeleteInstanceResponse),
    Created(Box<CreateInstanceResponse>),
    CreateRequest(Box<CreateInstanceRequest>),
    DownloadCommand(DownloadCommandResponse),
    StartDownload(Box<StartDownloadRequest>),
    Models(ModelList),
    OpenApi(Value),
    Chat(ChatCompletionResponse),
    Stream(Vec<StreamItem>),
    Error(ApiError),
    Readme(String),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Endpoint {
    Readme,
    Sse,
    NodeId,
    NodeIdentity,
    State,
    Events,
    Previews,
    Instance,
    InstanceDelete,
    CreateRequest,
    CreateInstance,
    StartDownloadRequest,
    DownloadCommand,
    Models,
    OpenApi,
    StoreDownloads,
    Chat,
}

/// The endpoint a fixture answers, inferred from its file name.
fn endpoint_of(rel: &str) -> Endpoint {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    if name == "README.md" {
        return Endpoint::Readme;
    }
    if name.ends_with(".sse") {
        return Endpoint::Sse;
    }
    let stem = name.trim_end_matches(".json");
    match stem {
        "node_id" => Endpoint::NodeId,
        "node_identity" => Endpoint::NodeIdentity,
        "openapi" => Endpoint::OpenApi,
        "store_downloads" => Endpoint::StoreDownloads,
        "create_instance_request" => Endpoint::CreateRequest,
        "download_start_request" => Endpoint::StartDownloadRequest,
        "models_downloaded" => Endpoint::Models,
        s if s.starts_with("state") => Endpoint::State,
        s if s.starts_with("events") => Endpoint::Events,
        s if s.starts_with("instance_previews") || s.starts_with("previews_") => Endpoint::Previews,
        s if s.starts_with("instance_placement") || s.starts_with("instance_get") => {
            Endpoint::Instance
        }
        s if s.starts_with("instance_delete") => Endpoint::InstanceDelete,
        s if s.starts_with("create_instance") || s.starts_with("place_instance") => {
            Endpoint::CreateInstance
        }
        s if s.starts_with("download_") => Endpoint::DownloadCommand,
        s if s.starts_with("v1_models") => Endpoint::Models,
        s if s.starts_with("chat_") => Endpoint::Chat,
        other => {
            panic!("fixture {rel} ({other}) has no endpoint rule: teach skulk_fixtures.rs about it")
        }
    }
}

/// Parses `text` as `T` and checks that serialising gives the same JSON back.
fn round_trip<T: Serialize + DeserializeOwned>(rel: &str, text: &str) -> T {
    let original: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{rel}: not JSON: {e}"));
    let parsed: T =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{rel}: does not parse: {e}"));
    let back = serde_json::to_value(&parsed).expect("serialises");
    assert_eq!(
        back, original,
        "{rel}: serialising the parsed body changed it"
    );
    parsed
}

fn parse_only<T: DeserializeOwned>(rel: &str, text: &str) -> T {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{rel}: does not parse: {e}"))
}

/// Parses one fixture; returns the parsed value and the `.headers` file it used, if any.
fn parse(rel: &str, files: &BTreeSet<String>) -> (Parsed, Option<String>) {
    let endpoint = endpoint_of(rel);
    let text = read(rel);
    let headers_rel = rel
        .rsplit_once('.')
        .map(|(stem, _)| format!("{stem}.headers"));
    let headers_rel = headers_rel.filter(|h| files.contains(h));
    let status = headers_rel
        .as_deref()
        .map(|h| status_of(&read(h)))
        .unwrap_or(200);
    if !(200..300).contains(&status) {
        return (
            Parsed::Error(ApiError::from_response(status, &text)),
            headers_rel,
        );
    }
    let parsed = match endpoint {
        Endpoint::Readme => Parsed::Readme(text),
        Endpoint::Sse => Parsed::Stream(parse_sse(&text).iter().flat_map(stream_items).collect()),
        Endpoint::NodeId => Parsed::NodeId(round_trip(rel, &text)),
        Endpoint::NodeIdentity => Parsed::NodeIdentity(round_trip(rel, &text)),
        Endpoint::State => Parsed::State(Box::new(round_trip(rel, &text))),
        // /events is snake_case inside the tags; den writes nested state objects in
        // camelCase, so it is parsed, not round-tripped.
        Endpoint::Events => Parsed::Events(parse_only(rel, &text)),
        Endpoint::Previews => Parsed::Previews(round_trip(rel, &text)),
        Endpoint::Instance => Parsed::Instance(Box::new(round_trip(rel, &text))),
        Endpoint::InstanceDelete => Parsed::Deleted(round_trip(rel, &text)),
        Endpoint::CreateInstance => Parsed::Created(Box::new(round_trip(rel, &text))),
        Endpoint::CreateRequest => Parsed::CreateRequest(Box::new(round_trip(rel, &text))),
        // The request was written by hand with fields omitted; den fills defaults.
        Endpoint::StartDownloadRequest => Parsed::StartDownload(Box::new(parse_only(rel, &text))),
        Endpoint::DownloadCommand => Parsed::DownloadCommand(round_trip(rel, &text)),
        Endpoint::Models => Parsed::Models(round_trip(rel, &text)),
        Endpoint::OpenApi => Parsed::OpenApi(parse_only(rel, &text)),
        Endpoint::Chat => Parsed::Chat(parse_only(rel, &text)),
        Endpoint::StoreDownloads => panic!("{rel}: expected an error status"),
    };
    (parsed, headers_rel)
}

#[test]
fn every_fixture_file_is_parsed_and_its_key_facts_hold() {
    let files: BTreeSet<String> = all_fixture_files().into_iter().collect();
    assert!(
        files.len() > 100,
        "fixture directory looks incomplete: {} files",
        files.len()
    );
    let mut covered = BTreeSet::new();
    for rel in &files {
        if rel.ends_with(".headers") {
            continue; // covered through the body they describe
        }
        let (parsed, headers) = parse(rel, &files);
        assert!(
            check_facts(rel, &parsed),
            "{rel}: no key facts checked; add a rule to check_facts"
        );
        covered.insert(rel.clone());
        if let Some(h) = headers {
            covered.insert(h);
        }
    }
    let uncovered: Vec<_> = files.difference(&covered).collect();
    assert!(
        uncovered.is_empty(),
        "fixture files not covered by any test rule: {uncovered:?}"
    );
}

// ----- fact helpers -------------------------------------------------------------------

fn err<'a>(rel: &str, parsed: &'a Parsed) -> &'a ApiError {
    match parsed {
        Parsed::Error(e) => e,
        other => panic!("{rel}: expected an error response, got {other:?}"),
    }
}

fn envelope(rel: &str, parsed: &Parsed, status: u16, kind: &str, message_part: &str) {
    let e = err(rel, parsed);
    match e {
        ApiError::Envelope { status: s, error } => {
            assert_eq!(*s, status, "{rel}");
            assert_eq!(error.kind, kind, "{rel}");
            assert_eq!(
                error.code,
                Some(ErrorCode::Number(i64::from(status))),
                "{rel}"
            );
            assert!(
                error.message.contains(message_part),
                "{rel}: {}",
                error.message
            );
            assert!(error.param.is_none(), "{rel}");
        }
        other => panic!("{rel}: expected an envelope, got {other:?}"),
    }
    let line = e.to_string();
    assert!(
        !line.contains('\n') && line.contains(&status.to_string()),
        "{rel}: {line}"
    );
}

fn st<'a>(rel: &str, parsed: &'a Parsed) -> &'a State {
    match parsed {
        Parsed::State(s) => s,
        other => panic!("{rel}: expected a state, got {other:?}"),
    }
}

/// (instances, runners, download records, tasks).
fn counts(s: &State) -> (usize, usize, usize, usize) {
    (
        s.instances.len(),
        s.runners.len(),
        s.downloads.values().map(Vec::len).sum(),
        s.tasks.len(),
    )
}

fn download_phases(s: &State, node: &str) -> Vec<DownloadPhase> {
    s.downloads_of(&NodeId::from(node))
        .iter()
        .map(DownloadProgress::phase)
        .collect()
}

fn runner(s: &State, id: &str) -> RunnerStatus {
    s.runners
        .get(&RunnerId::from(id))
        .cloned()
        .unwrap_or_else(|| panic!("no runner {id}"))
}

fn task_kinds(s: &State) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for t in s.tasks.values() {
        *out.entry(t.tag().to_owned()).or_insert(0) += 1;
    }
    out
}

fn instance<'a>(rel: &str, parsed: &'a Parsed) -> &'a Instance {
    match parsed {
        Parsed::Instance(i) => i,
        other => panic!("{rel}: expected an instance, got {other:?}"),
    }
}

fn previews<'a>(rel: &str, parsed: &'a Parsed) -> &'a PreviewsResponse {
    match parsed {
        Parsed::Previews(p) => p,
        other => panic!("{rel}: expected previews, got {other:?}"),
    }
}

fn events<'a>(rel: &str, parsed: &'a Parsed) -> &'a [Event] {
    match parsed {
        Parsed::Events(e) => e,
        other => panic!("{rel}: expected events, got {other:?}"),
    }
}

fn event_kinds(events: &[Event]) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for e in events {
        *out.entry(e.tag().to_owned()).or_insert(0) += 1;
    }
    out
}

fn stream<'a>(rel: &str, parsed: &'a Parsed) -> &'a [StreamItem] {
    match parsed {
        Parsed::Stream(s) => s,
        other => panic!("{rel}: expected an SSE stream, got {other:?}"),
    }
}

fn chunk_text(items: &[StreamItem]) -> String {
    items
        .iter()
        .filter_map(|i| match i {
            StreamItem::Chunk(c) => c
                .choices
                .first()
                .and_then(|ch| ch.delta.text())
                .map(str::to_owned),
            _ => None,
        })
        .collect()
}

fn n(s: &str) -> NodeId {
    NodeId::from(s)
}

const RUN_A_NODE: &str = "12D3KooWDWXLYXk5Q7ZmwcgDa8PJxjGMeKYXUNnkv3PfsMiTCo53";

/// Checks the facts of one fixture. Returns false when no rule covers the file.
fn check_facts(rel: &str, p: &Parsed) -> bool {
    match rel {
        "README.md" => match p {
            Parsed::Readme(text) => assert!(text.contains("Skulk 1.3.0") && text.contains("runC/")),
            other => panic!("{other:?}"),
        },

        // ----- runA: an idle Linux node without an inference backend -----------------
        "runA/chat_no_instance.json" => {
            envelope(rel, p, 404, "Not Found", "No instance found for model")
        }
        "runA/download_start.json" | "runA/download_delete.json" => match p {
            Parsed::DownloadCommand(c) => {
                let expected = if rel.ends_with("start.json") {
                    "96b34bbb-e2e8-4cf7-bffb-79384c0020c1"
                } else {
                    "c0223088-b44a-424a-8aa3-e88d85b4ff67"
                };
                assert_eq!(c.command_id.as_str(), expected);
            }
            other => panic!("{other:?}"),
        },
        "runA/download_start_request.json" => match p {
            Parsed::StartDownload(r) => {
                assert_eq!(r.target_node_id, n(RUN_A_NODE));
                assert!(matches!(r.shard_metadata, ShardMetadata::Pipeline(_)));
                let card = r.shard_metadata.card().expect("card");
                assert_eq!(card.model_id.as_str(), RUN_C_MODEL);
                assert_eq!(card.storage_size.in_bytes, 729_808_896);
                assert_eq!(card.n_layers, 16);
            }
            other => panic!("{other:?}"),
        },
        "runA/events_idle.json" => {
            let e = events(rel, p);
            assert_eq!(e.len(), 7);
            assert_eq!(
                event_kinds(e),
                BTreeMap::from([("NodeGatheredInfo".to_owned(), 7)])
            );
            assert_eq!(
                e[0].event_id().map(|i| i.as_str()),
                Some("61c81c72-49c2-47f2-b118-2279b55a75bb")
            );
        }
        "runA/events_after_downloads.json" => {
            let e = events(rel, p);
            assert_eq!(e.len(), 23);
            let progress: Vec<_> = e
                .iter()
                .filter_map(|ev| match ev {
                    Event::NodeDownloadProgress(d) => Some(&d.download_progress),
                    _ => None,
                })
                .collect();
            let phases: Vec<_> = progress.iter().map(|d| d.phase()).collect();
            assert_eq!(
                phases,
                vec![
                    DownloadPhase::Pending,
                    DownloadPhase::Ongoing,
                    DownloadPhase::Pending
                ]
            );
            // snake_case inside the tags, including {"in_bytes": …}
            let card = progress[0].model_card().expect("card");
            assert_eq!(card.storage_size.in_bytes, 729_808_896);
            assert_eq!(card.compatible_backends(), ["mlx".to_owned()]);
            assert_eq!(progress[1].node_id(), Some(&n(RUN_A_NODE)));
        }
        "runA/instance_delete_404.json" | "runA/instance_get_404.json" => {
            envelope(rel, p, 404, "Not Found", "Instance not found");
            assert!(err(rel, p).is_not_found());
        }
        "runA/instance_placement_llama1b.json" | "runA/place_instance_linux_no_backend.json" => {
            envelope(rel, p, 400, "Bad Request", "ineligible for this model");
            assert!(err(rel, p).is_refusal());
        }
        "runA/instance_placement_tensor.json" => {
            envelope(rel, p, 400, "Bad Request", "min_nodes=2 is impossible")
        }
        "runA/instance_previews_llama1b.json"
        | "runA/instance_previews_llama1b_node_ids.json"
        | "runA/instance_previews_too_big.json"
        | "runA/instance_previews_llama1b_excluded_self.json" => {
            let pr = previews(rel, p);
            assert_eq!(pr.previews.len(), 4);
            assert!(
                pr.previews
                    .iter()
                    .all(|x| !x.is_admitted() && x.instance.is_none())
            );
            let combos: BTreeSet<_> = pr
                .previews
                .iter()
                .map(|x| {
                    (
                        x.sharding.as_str().to_owned(),
                        x.instance_meta.as_str().to_owned(),
                    )
                })
                .collect();
            assert_eq!(combos.len(), 4);
            let needle = if rel.contains("excluded_self") {
                "touch an excluded node"
            } else {
                "ineligible"
            };
            assert!(
                pr.previews
                    .iter()
                    .all(|x| x.error.as_deref().is_some_and(|e| e.contains(needle)))
            );
            assert!(
                pr.previews
                    .iter()
                    .all(|x| x.error_code.is_none() && x.card_digest.is_none())
            );
        }
        "runA/instance_previews_missing_model_id.json" => match err(rel, p) {
            ApiError::Validation { status, issues } => {
                assert_eq!(*status, 422);
                assert_eq!(issues.len(), 1);
                assert_eq!(issues[0].kind, "missing");
                assert_eq!(issues[0].location(), "query.model_id");
                assert_eq!(issues[0].msg, "Field required");
            }
            other => panic!("{other:?}"),
        },
        "runA/place_instance_bad_body.json" => {
            let e = err(rel, p);
            match e {
                ApiError::Validation { status, issues } => {
                    assert_eq!(*status, 422);
                    let locs: Vec<_> = issues
                        .iter()
                        .map(|i| (i.kind.as_str(), i.location()))
                        .collect();
                    assert_eq!(
                        locs,
                        vec![
                            ("missing", "body.model_id".to_owned()),
                            ("enum", "body.sharding".to_owned())
                        ]
                    );
                }
                other => panic!("{other:?}"),
            }
            let line = e.to_string();
            assert!(
                line.contains("body.sharding: Input should be 'Tensor' or 'Pipeline'"),
                "{line}"
            );
        }
        "runA/place_instance_unknown_model.json" => {
            let e = err(rel, p);
            assert_eq!(
                e,
                &ApiError::Plain {
                    status: 500,
                    body: "Internal Server Error".to_owned()
                }
            );
            assert_eq!(e.to_string(), "HTTP 500: Internal Server Error");
            assert!(!e.is_refusal());
        }
        "runA/previews_unknown_model.json" => {
            envelope(rel, p, 400, "Bad Request", "Failed to load model card")
        }
        "runA/store_downloads.json" => {
            envelope(rel, p, 503, "Service Unavailable", "Store not configured")
        }
        "runA/models_downloaded.json" => match p {
            Parsed::Models(m) => assert!(m.object == "list" && m.data.is_empty()),
            other => panic!("{other:?}"),
        },
        "runA/v1_models.json" => match p {
            Parsed::Models(m) => {
                assert_eq!(m.data.len(), 100);
                assert!(m.data.iter().any(|e| e.id.as_str() == RUN_C_MODEL));
                assert!(
                    m.data
                        .iter()
                        .all(|e| e.owned_by == "skulk" && e.registry_card_id.is_none())
                );
            }
            other => panic!("{other:?}"),
        },
        "runA/node_id.json" | "runC/node_id.json" => match p {
            Parsed::NodeId(id) => {
                assert_eq!(
                    id.as_str(),
                    if rel.starts_with("runA") {
                        RUN_A_NODE
                    } else {
                        RUN_C_NODE
                    }
                )
            }
            other => panic!("{other:?}"),
        },
        "runA/node_identity.json" => match p {
            Parsed::NodeIdentity(i) => {
                assert_eq!(i.node_id, n(RUN_A_NODE));
                assert_eq!((i.hostname.as_str(), i.ip_address.as_str()), ("vm", "vm"));
            }
            other => panic!("{other:?}"),
        },
        "runA/openapi.json" => match p {
            Parsed::OpenApi(doc) => {
                let paths = doc["paths"].as_object().expect("paths");
                assert_eq!(paths.len(), 76);
                assert!(paths.contains_key("/node_id") && paths.contains_key("/instance/previews"));
                assert!(
                    !paths.contains_key("/models/requirements"),
                    "1.3.0 has no requirements endpoint"
                );
            }
            other => panic!("{other:?}"),
        },
        "runA/state_idle.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (0, 0, 0, 0));
            assert_eq!(s.topology.nodes, vec![n(RUN_A_NODE)]);
            assert!(s.topology.connections.is_empty());
            assert_eq!(s.last_event_applied_idx, 6);
            assert_eq!(s.node_health[&n(RUN_A_NODE)].level.as_str(), "ok");
            assert!(s.dialect().is_legacy());
        }
        "runA/state_after_download_start.json" | "runA/state_after_download_start_80s.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (0, 0, 1, 0));
            let record = &s.downloads_of(&n(RUN_A_NODE))[0];
            match record {
                DownloadProgress::Ongoing(d) => {
                    // no internet: it sits at zero bytes forever
                    assert_eq!(d.download_progress.total_files, 0);
                    assert_eq!(d.download_progress.downloaded.in_bytes, 0);
                    assert!(d.attempt_id.is_none());
                }
                other => panic!("{other:?}"),
            }
        }
        "runA/state_after_download_delete.json" => {
            let s = st(rel, p);
            assert_eq!(download_phases(s, RUN_A_NODE), vec![DownloadPhase::Pending]);
            assert_eq!(
                s.downloads_of(&n(RUN_A_NODE))[0]
                    .bytes()
                    .map(|(d, t)| (d.in_bytes, t.in_bytes)),
                Some((0, 0))
            );
        }

        // ----- runC: a node with the mlx backend, no internet, a real RunnerFailed ------
        "runC/chat_empty_messages.json" => {
            envelope(rel, p, 400, "Bad Request", "no content to generate from")
        }
        "runC/chat_max_tokens_too_big.json" => envelope(
            rel,
            p,
            400,
            "Bad Request",
            "context_length_exceeded: max_tokens (999999)",
        ),
        "runC/chat_stream_runner_failed.sse" => {
            let items = stream(rel, p);
            assert_eq!(
                items,
                &[
                    StreamItem::KeepAlive,
                    StreamItem::CommandId("36c5b0ae-d108-4772-85d6-f30e7e26ef2e".into()),
                    StreamItem::KeepAlive
                ]
            );
        }
        "runC/create_instance.json" | "runC/place_instance.json" => match p {
            Parsed::Created(c) => {
                let expected = if rel.contains("create") {
                    "6ed67eec-54a4-423f-9d8f-616df570497e"
                } else {
                    "920840a9-2b30-4dee-b604-781fd44db2f5"
                };
                assert_eq!(c.command_id.as_str(), expected);
                assert_eq!(c.message, "Command received.");
                assert!(c.instance_id.is_none(), "1.3.0 does not name the instance");
                assert_eq!(
                    c.model_card.as_ref().map(|m| m.model_id.as_str()),
                    Some(RUN_C_MODEL)
                );
            }
            other => panic!("{other:?}"),
        },
        "runC/create_instance_request.json" => match p {
            Parsed::CreateRequest(r) => {
                assert_eq!(
                    r.instance.instance_id().map(InstanceId::as_str),
                    Some(CREATED_INSTANCE)
                );
                assert_eq!(r.instance.nodes(), BTreeSet::from([n(RUN_C_NODE)]));
            }
            other => panic!("{other:?}"),
        },
        "runC/events_after_place.json" | "runC/events_final.json" => {
            let e = events(rel, p);
            let kinds = event_kinds(e);
            let final_log = rel.ends_with("final.json");
            assert_eq!(e.len(), if final_log { 41 } else { 24 });
            assert_eq!(
                kinds.get("InstanceCreated"),
                Some(&if final_log { 2 } else { 1 })
            );
            assert_eq!(kinds.contains_key("InstanceDeleted"), final_log);
            assert!(e.iter().all(|ev| !ev.is_unknown()));
            let failed = e.iter().find_map(|ev| match ev {
                Event::RunnerStatusUpdated(r) if r.runner_id.as_str() == RUN_C_RUNNER => {
                    Some(&r.runner_status)
                }
                _ => None,
            });
            assert_eq!(
                failed.and_then(RunnerStatus::failure_message),
                Some(RUN_C_FAILURE)
            );
            let created = e.iter().find_map(|ev| match ev {
                Event::InstanceCreated(c) => c.instance.instance_id().cloned(),
                _ => None,
            });
            assert_eq!(
                created.as_ref().map(InstanceId::as_str),
                Some(RUN_C_INSTANCE)
            );
        }
        "runC/instance_delete.json" => match p {
            Parsed::Deleted(d) => {
                assert_eq!(d.instance_id.as_str(), RUN_C_INSTANCE);
                assert_eq!(
                    d.command_id.as_str(),
                    "440c270b-ff1a-439c-8e69-c18fd127f8fe"
                );
            }
            other => panic!("{other:?}"),
        },
        "runC/instance_get.json"
        | "runC/instance_placement_llama1b.json"
        | "runC/instance_placement_for_create.json" => {
            let i = instance(rel, p);
            let expected = match rel {
                "runC/instance_get.json" => RUN_C_INSTANCE,
                "runC/instance_placement_llama1b.json" => "33a02d3a-df77-4329-81ec-e1b2ef8aac8a",
                _ => CREATED_INSTANCE,
            };
            assert!(matches!(i, Instance::MlxRing(_)));
            assert_eq!(i.instance_id().map(InstanceId::as_str), Some(expected));
            assert_eq!(i.context_token_limit(), Some(270_688));
            assert_eq!(i.nodes(), BTreeSet::from([n(RUN_C_NODE)]));
            let sa = i.shard_assignments().expect("assignments");
            let (_, shard) = sa.shard_of_node(&n(RUN_C_NODE)).expect("bound");
            assert_eq!(
                shard.fields().and_then(|f| f.resolved_backend.as_deref()),
                Some("mlx")
            );
        }
        "runC/instance_previews_llama1b.json" => {
            let pr = previews(rel, p);
            assert_eq!(pr.previews.len(), 4);
            assert!(pr.previews.iter().all(|x| x.is_admitted()));
            assert!(
                pr.previews
                    .iter()
                    .all(|x| x.nodes() == BTreeSet::from([n(RUN_C_NODE)]))
            );
            // single-node placements are pipeline rings whatever was requested
            assert!(
                pr.previews
                    .iter()
                    .all(|x| matches!(x.instance, Some(Instance::MlxRing(_))))
            );
            assert!(
                pr.previews
                    .iter()
                    .all(|x| x.effective_context_limit() == Some(270_688))
            );
            assert_eq!(
                pr.previews[0]
                    .memory_delta_by_node
                    .as_ref()
                    .map(|m| m[&n(RUN_C_NODE)]),
                Some(729_808_896)
            );
        }
        "runC/instance_previews_too_big.json" => {
            let pr = previews(rel, p);
            assert_eq!(pr.previews.len(), 4);
            assert!(pr.previews.iter().all(|x| {
                x.error
                    .as_deref()
                    .is_some_and(|e| e.starts_with("No candidate cycle fits"))
            }));
        }
        "runC/state_idle.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (0, 0, 0, 0));
            assert_eq!(s.topology.nodes, vec![n(RUN_C_NODE)]);
            assert!(s.node_disk.is_empty());
        }
        "runC/state_t1.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (1, 0, 1, 3));
            assert_eq!(download_phases(s, RUN_C_NODE), vec![DownloadPhase::Pending]);
            assert!(s.instances.contains_key(&InstanceId::from(RUN_C_INSTANCE)));
        }
        s if s.starts_with("runC/state_t") || s == "runC/state_instance_runner_failed.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (1, 1, 1, 4));
            assert_eq!(download_phases(s, RUN_C_NODE), vec![DownloadPhase::Ongoing]);
            assert_eq!(
                runner(s, RUN_C_RUNNER).failure_message(),
                Some(RUN_C_FAILURE)
            );
            assert_eq!(
                task_kinds(s),
                BTreeMap::from([
                    ("CreateRunner".to_owned(), 1),
                    ("DownloadModel".to_owned(), 3)
                ])
            );
            assert!(
                s.tasks
                    .values()
                    .filter(|t| t.tag() == "DownloadModel")
                    .all(|t| t.status() == Some(TaskStatus::Running))
            );
            assert!(s.dialect().is_legacy());
        }
        "runC/state_after_chat.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (1, 1, 1, 6));
            let generation = s.tasks.values().find_map(|t| match t {
                Task::TextGeneration(g) => Some(g),
                _ => None,
            });
            let g = generation.expect("a text generation task");
            assert_eq!(g.task_status, TaskStatus::Cancelled);
            assert_eq!(
                g.command_id.as_str(),
                "36c5b0ae-d108-4772-85d6-f30e7e26ef2e"
            );
            assert_eq!(g.task_params["max_output_tokens"], 8);
            assert_eq!(runner(s, RUN_C_RUNNER).phase(), RunnerPhase::Failed);
        }
        "runC/state_after_create_instance.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (1, 1, 1, 8));
            assert!(
                s.instances
                    .contains_key(&InstanceId::from(CREATED_INSTANCE))
            );
            assert_eq!(
                runner(s, CREATED_RUNNER).failure_message(),
                Some(RUN_C_FAILURE)
            );
            assert_eq!(task_kinds(s).get("Shutdown"), Some(&1));
        }
        "runC/state_after_instance_delete.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (0, 0, 1, 7));
            // tasks outlive their instance
            let shutdown = s
                .tasks
                .values()
                .find(|t| t.tag() == "Shutdown")
                .expect("shutdown task");
            assert_eq!(shutdown.status(), Some(TaskStatus::Pending));
            assert_eq!(
                shutdown.instance_id().as_ref().map(InstanceId::as_str),
                Some(RUN_C_INSTANCE)
            );
        }

        // ----- derived: Skulk's serializers, made-up two-node cluster -------------------
        "derived/chat_completions_nonstream_ok.json" => match p {
            Parsed::Chat(c) => {
                assert_eq!(c.choices[0].message.text(), Some("Hello there!"));
                assert_eq!(c.choices[0].finish_reason.as_deref(), Some("stop"));
                assert_eq!(
                    c.usage.as_ref().map(|u| u["total_tokens"].clone()),
                    Some(Value::from(14))
                );
            }
            other => panic!("{other:?}"),
        },
        "derived/chat_completions_stream_ok.sse" => {
            let items = stream(rel, p);
            assert_eq!(items.first(), Some(&StreamItem::KeepAlive));
            assert!(items.contains(&StreamItem::CommandId(
                "5b0a3f2e-1c9d-4e7a-9c55-0f6c2d1b7a11".into()
            )));
            assert_eq!(chunk_text(items), "Hello there!");
            let finish = items.iter().rev().find_map(|i| match i {
                StreamItem::Chunk(c) => c.choices.first().and_then(|ch| ch.finish_reason.clone()),
                _ => None,
            });
            assert_eq!(finish.as_deref(), Some("stop"));
            let stats = items.iter().find_map(|i| match i {
                StreamItem::GenerationStats(v) => Some(v),
                _ => None,
            });
            assert_eq!(
                stats.map(|v| v["peak_memory_usage"]["in_bytes"].clone()),
                Some(Value::from(5_476_083_302u64))
            );
            assert!(
                items
                    .iter()
                    .any(|i| matches!(i, StreamItem::PrefillProgress(_)))
            );
            assert_eq!(items.last(), Some(&StreamItem::Done));
        }
        "derived/chat_completions_stream_error.sse" => {
            let items = stream(rel, p);
            let error = items.iter().find_map(|i| match i {
                StreamItem::Error(e) => Some(&e.error),
                _ => None,
            });
            let error = error.expect("an error frame");
            assert_eq!(error.kind, "invalid_request_error");
            assert_eq!(error.code, Some(ErrorCode::Number(400)));
            assert_eq!(items.last(), Some(&StreamItem::Done));
        }
        "derived/instance_get_mlx_jaccl_tensor_2node.json"
        | "derived/instance_placement_tensor_jaccl_2node.json" => {
            let i = instance(rel, p);
            match i {
                Instance::MlxJaccl(j) => {
                    assert_eq!(
                        j.jaccl_devices,
                        vec![
                            vec![None, Some("rdma_en3".into())],
                            vec![Some("rdma_en3".into()), None]
                        ]
                    );
                    assert!(
                        j.shard_assignments
                            .runner_to_shard
                            .values()
                            .all(|s| matches!(s, ShardMetadata::Tensor(_)))
                    );
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(i.nodes(), BTreeSet::from([n(ALPHA), n(BRAVO)]));
        }
        "derived/instance_get_mlx_ring_2node.json" => {
            let i = instance(rel, p);
            assert_eq!(
                i.instance_id().map(InstanceId::as_str),
                Some("5838fcd2-a1f3-4dea-9074-158c5ed8c17c")
            );
            let sa = i.shard_assignments().expect("assignments");
            let layers: BTreeSet<_> = sa
                .runner_to_shard
                .values()
                .filter_map(|s| {
                    s.fields()
                        .map(|f| (f.device_rank, f.start_layer, f.end_layer))
                })
                .collect();
            assert_eq!(layers, BTreeSet::from([(0, 0, 11), (1, 11, 32)]));
        }
        "derived/instance_previews_two_nodes_llama1b.json" => {
            let pr = previews(rel, p);
            assert_eq!(pr.previews.len(), 8);
            assert!(pr.previews.iter().all(|x| x.is_admitted()));
            let two_node = pr
                .previews
                .iter()
                .filter(|x| x.nodes() == BTreeSet::from([n(ALPHA), n(BRAVO)]))
                .count();
            assert_eq!(two_node, 4);
            assert_eq!(
                pr.previews
                    .iter()
                    .filter(|x| x.nodes() == BTreeSet::from([n(ALPHA)]))
                    .count(),
                4
            );
        }
        "derived/instance_previews_two_nodes_llama1b_excluding_bravo.json" => {
            let pr = previews(rel, p);
            assert_eq!(pr.previews.iter().filter(|x| x.is_admitted()).count(), 4);
            assert!(
                pr.previews
                    .iter()
                    .filter(|x| x.is_admitted())
                    .all(|x| x.nodes() == BTreeSet::from([n(ALPHA)]))
            );
            assert_eq!(pr.previews.iter().filter(|x| x.error.is_some()).count(), 4);
        }
        "derived/state_two_nodes_running.json" => {
            let s = st(rel, p);
            assert_eq!(counts(s), (2, 4, 5, 2));
            let phases: BTreeMap<_, _> = s
                .runners
                .iter()
                .map(|(id, r)| (id.as_str().to_owned(), r.tag().to_owned()))
                .collect();
            assert_eq!(
                phases["02138213-af77-4386-bda3-d409f54f1dd1"],
                "RunnerReady"
            );
            assert_eq!(
                phases["e8e416e8-4db8-4691-a313-fea1d1d52cbc"],
                "RunnerRunning"
            );
            assert_eq!(
                phases["d0df7360-4a83-4e20-9ed3-5336d155e0d7"],
                "RunnerWarmingUp"
            );
            match runner(s, "8b548d4a-7b1d-43b1-8ab4-d34c1ea6d41d") {
                RunnerStatus::Loading(l) => assert_eq!((l.layers_loaded, l.total_layers), (14, 28)),
                other => panic!("{other:?}"),
            }
            assert_eq!(
                download_phases(s, ALPHA),
                vec![DownloadPhase::Completed, DownloadPhase::Ongoing]
            );
            assert_eq!(
                download_phases(s, BRAVO),
                vec![
                    DownloadPhase::Completed,
                    DownloadPhase::Pending,
                    DownloadPhase::Failed
                ]
            );
            assert_eq!(
                s.downloads_of(&n(BRAVO))[2].error_message(),
                Some("[Errno 28] No space left on device")
            );
            let edges = s.topology.edges(&n(ALPHA), &n(BRAVO));
            assert!(
                matches!(edges, [Edge::Socket(_), Edge::Rdma(_)]),
                "{edges:?}"
            );
            match &edges[0] {
                Edge::Socket(sock) => assert_eq!(sock.sink_multiaddr.port, Some(52416)),
                other => panic!("{other:?}"),
            }
            let health = &s.node_health[&n(BRAVO)];
            assert_eq!(
                (health.level.as_str(), health.reasons[0].code.as_str()),
                ("error", "download_failed")
            );
            assert_eq!(
                s.node_system[&n(ALPHA)]
                    .accelerator
                    .as_ref()
                    .and_then(|a| a.name.as_deref()),
                Some("Apple M2 Max")
            );
            assert!(s.dialect().is_legacy());
        }
        "derived/v1_models_status_downloaded.json" => match p {
            Parsed::Models(m) => {
                assert_eq!(m.data.len(), 1);
                assert_eq!(
                    m.data[0].id.as_str(),
                    "mlx-community/Meta-Llama-3.1-8B-Instruct-4bit"
                );
                assert_eq!(m.data[0].context_length, 131_072);
            }
            other => panic!("{other:?}"),
        },
        _ => return false,
    }
    true
}
