//! The reducer: fixture scenarios, determinism, staleness, contradictions, commands.

use std::sync::LazyLock;

use den_protocol::evidence::ProbeOutcome;
use den_protocol::feed::FeedMessage;
use den_protocol::session::{CommandSeq, CommandStatus, SessionEvent, SourceKind, Stamped};
use den_protocol::time::Millis;

use super::*;
use crate::fixtures::{self, ALPHA, BRAVO, RUN_C_NODE, SCENARIO_NOW};
use crate::testing::model_of;

static SCENARIO: LazyLock<Vec<Stamped>> =
    LazyLock::new(|| fixtures::scenario().expect("fixture scenario"));

fn node<'a>(model: &'a Model, id: &str) -> &'a NodeRow {
    model
        .views()
        .nodes
        .iter()
        .find(|n| n.node.as_str() == id)
        .expect("node row")
}

fn ev(at: u64, event: SessionEvent) -> Stamped {
    Stamped::new(Millis(at), event)
}

/// One Skulk source on loopback, as the console registers it.
fn skulk_added() -> Stamped {
    ev(
        0,
        SessionEvent::SourceAdded {
            source: "skulk".into(),
            kind: SourceKind::Skulk,
            url: "http://127.0.0.1:52415".into(),
        },
    )
}

/// One poll cycle of that source: `/node_id` answering `node`, then `/state`.
fn skulk_poll(at: u64, node: &str, state: &den_protocol::skulk::State) -> [Stamped; 2] {
    [
        ev(
            at,
            SessionEvent::SkulkNodeId {
                source: "skulk".into(),
                node: node.into(),
            },
        ),
        ev(
            at + 5,
            SessionEvent::SkulkState {
                source: "skulk".into(),
                state: Box::new(state.clone()),
                latency_ms: 2,
                received_unix_ms: None,
            },
        ),
    ]
}

#[test]
fn scenario_membership_is_two_sided_and_identities_are_bound() {
    let model = model_of(&SCENARIO);
    let alpha = node(&model, ALPHA);
    // router, mgmt and bravo are fresh; lab fails, so it no longer counts
    assert_eq!(alpha.membership, MembershipView::Member { observers: 3 });
    assert!(matches!(alpha.identity, Identity::Bound { .. }));
    assert_eq!(alpha.name.as_deref(), Some("alpha"));
    assert_eq!(alpha.workers, ["gpu-a".into()]);
    let bravo = node(&model, BRAVO);
    assert_eq!(
        bravo.identity,
        Identity::Bound {
            source: "bravo".into()
        }
    );
    // bravo's nodeHealth says error (disk) in the capture
    assert_eq!(bravo.level, Level::Bad);
    // charlie is only known from the feed: unknown membership, values missing not zero
    let charlie = node(&model, "charlie");
    assert_eq!(charlie.membership, MembershipView::Unknown);
    assert_eq!(charlie.identity, Identity::NotBound);
    assert_eq!(charlie.ram_total, None);
    assert!(charlie.draining);
    assert_eq!(charlie.level, Level::Warn);
}

#[test]
fn scenario_feed_rows() {
    let model = model_of(&SCENARIO);
    let pages = &model.views().pages;
    assert_eq!(pages.len(), 4);
    let page = |w: &str| {
        pages
            .iter()
            .find(|p| p.worker.as_str() == w)
            .expect("page row")
    };
    assert_eq!(page("gpu-d").gone.as_deref(), Some("heartbeat expired"));
    assert!(page("gpu-c").draining);
    // the snapshot plus 25 heartbeats, bounded by the configured history
    assert_eq!(
        page("gpu-a").history.len(),
        model.config().history_len.min(26)
    );
    assert!(page("gpu-a").inconsistent.is_none());
    // gpu-c stopped heartbeating at 4.1 s: stale at the end, gpu-a is not
    assert!(model.is_stale(page("gpu-c").observed_at, SCENARIO_NOW));
    assert!(!model.is_stale(page("gpu-a").observed_at, SCENARIO_NOW));

    let route = |r: &str| model.route(&"router".into(), &r.into()).expect("route");
    assert_eq!(route("request-1").phase, RoutePhase::Completed);
    assert!(route("request-1").setbacks.is_empty());
    let second = route("request-2");
    assert_eq!(second.worker.as_ref().map(|w| w.as_str()), Some("gpu-b"));
    assert!(
        second
            .setbacks
            .iter()
            .all(|s| s.contains("declined (insufficient-pages)"))
    );
    assert_eq!(second.setbacks.len(), 3);
    assert_eq!(route("request-3").phase, RoutePhase::Failed);
    assert!(
        route("request-3")
            .error
            .as_deref()
            .unwrap_or("")
            .contains("no feasible worker")
    );
    assert_eq!(route("request-4").phase, RoutePhase::Cancelled);
    assert_eq!(route("request-5").phase, RoutePhase::Running);
    assert!(route("request-5").measured_ttft_ms.is_some());
}

#[test]
fn the_same_events_give_the_same_model() {
    let a = model_of(&SCENARIO);
    let b = model_of(&SCENARIO);
    let json = |m: &Model| {
        let v = m.views();
        serde_json::to_string(&(
            &v.sources,
            &v.nodes,
            &v.downloads,
            &v.instances,
            &v.pages,
            m.events(),
        ))
        .expect("json")
    };
    assert_eq!(json(&a), json(&b));
    let routes = |m: &Model| {
        let mut r: Vec<String> = m
            .routes()
            .iter()
            .map(|r| serde_json::to_string(r).expect("json"))
            .collect();
        r.sort();
        r
    };
    assert_eq!(routes(&a), routes(&b));
}

#[test]
fn a_lost_feed_marks_its_source_down_until_it_reconnects() {
    let mut model = model_of(&SCENARIO);
    let router = SourceId::from("router");
    assert!(!model.source_down(&router));
    model.apply(&ev(
        25_100,
        SessionEvent::Disconnected {
            source: router.clone(),
            reason: "connection reset".into(),
        },
    ));
    model.settle();
    assert!(model.source_down(&router));
    let row = model
        .views()
        .sources
        .iter()
        .find(|s| s.source == router)
        .expect("source");
    assert!(matches!(
        row.health(),
        Health::Disconnected {
            since: Millis(25_100),
            ..
        }
    ));
    assert!(
        model
            .events()
            .last()
            .is_some_and(|e| e.text.contains("connection reset"))
    );
    model.apply(&ev(
        26_000,
        SessionEvent::Connected {
            source: router.clone(),
        },
    ));
    model.settle();
    assert!(!model.source_down(&router));
}

#[test]
fn sources_that_disagree_about_a_download_flag_a_contradiction() {
    let state = fixtures::skulk_state("runC/state_t2.json").expect("state");
    let mut other = state.clone();
    // the same record (legacy: no attempt id), seen completed by the second source
    for records in other.downloads.values_mut() {
        for r in records.iter_mut() {
            let json = serde_json::to_value(&*r).expect("json");
            let body = json.get("DownloadOngoing").cloned().expect("ongoing");
            *r = serde_json::from_value(serde_json::json!({ "DownloadCompleted": body }))
                .expect("completed");
        }
    }
    let events = vec![
        ev(
            0,
            SessionEvent::SourceAdded {
                source: "a".into(),
                kind: SourceKind::Skulk,
                url: "http://a".into(),
            },
        ),
        ev(
            0,
            SessionEvent::SourceAdded {
                source: "b".into(),
                kind: SourceKind::Skulk,
                url: "http://b".into(),
            },
        ),
        ev(
            10,
            SessionEvent::SkulkState {
                source: "a".into(),
                state: Box::new(state),
                latency_ms: 1,
                received_unix_ms: None,
            },
        ),
        ev(
            20,
            SessionEvent::SkulkState {
                source: "b".into(),
                state: Box::new(other),
                latency_ms: 1,
                received_unix_ms: None,
            },
        ),
    ];
    let model = model_of(&events);
    let rows = &model.views().downloads;
    assert_eq!(rows.len(), 1);
    let row = rows.first().expect("row");
    assert_eq!(row.level, Level::Unknown);
    assert!(
        row.contradiction
            .as_deref()
            .unwrap_or("")
            .contains("Ongoing"),
        "{row:?}"
    );
    assert_eq!(row.seen_by, ["a".into(), "b".into()]);
}

#[test]
fn an_unprobed_instance_is_never_ready_and_a_probe_makes_it_ready() {
    let state = fixtures::skulk_state("derived/state_two_nodes_running.json").expect("state");
    let instance = "5838fcd2-a1f3-4dea-9074-158c5ed8c17c";
    let mut events = vec![
        ev(
            0,
            SessionEvent::SourceAdded {
                source: "mgmt".into(),
                kind: SourceKind::Skulk,
                url: "http://m".into(),
            },
        ),
        ev(
            90,
            SessionEvent::SkulkNodeId {
                source: "mgmt".into(),
                node: ALPHA.into(),
            },
        ),
        ev(
            100,
            SessionEvent::SkulkState {
                source: "mgmt".into(),
                state: Box::new(state),
                latency_ms: 3,
                received_unix_ms: None,
            },
        ),
    ];
    let verdict = |m: &Model| {
        m.views()
            .instances
            .iter()
            .find_map(|r| match r {
                InstanceRow::Instance {
                    instance: i,
                    verdict,
                    ..
                } if i == instance => Some(verdict.clone()),
                _ => None,
            })
            .expect("instance row")
    };
    let model = model_of(&events);
    let v = verdict(&model);
    assert_eq!(v.kind, "unprobed");
    assert_ne!(v.level, Level::Good);
    events.push(ev(
        200,
        SessionEvent::Probe {
            source: "mgmt".into(),
            instance: instance.into(),
            outcome: ProbeOutcome::Succeeded { served_by: None },
        },
    ));
    let model = model_of(&events);
    let v = verdict(&model);
    assert_eq!((v.kind.as_str(), v.level), ("ready", Level::Good));
    assert!(
        model
            .events()
            .iter()
            .any(|e| e.text.contains("probe of instance 5838fcd2: succeeded"))
    );
}

#[test]
fn inference_a_den_router_attributes_to_the_current_runner_counts_as_a_probe() {
    use den_protocol::skulk::InstanceInference;
    let instance = "5838fcd2-a1f3-4dea-9074-158c5ed8c17c";
    let with = |record: Option<InstanceInference>| {
        let mut state =
            fixtures::skulk_state("derived/state_two_nodes_running.json").expect("state");
        state.inference = Some(record.into_iter().map(|r| (instance.into(), r)).collect());
        let events = vec![
            ev(
                0,
                SessionEvent::SourceAdded {
                    source: "mgmt".into(),
                    kind: SourceKind::DenRouter,
                    url: "http://m".into(),
                },
            ),
            ev(
                90,
                SessionEvent::SkulkNodeId {
                    source: "mgmt".into(),
                    node: ALPHA.into(),
                },
            ),
            ev(
                100,
                SessionEvent::SkulkState {
                    source: "mgmt".into(),
                    state: Box::new(state),
                    latency_ms: 3,
                    received_unix_ms: None,
                },
            ),
        ];
        let model = model_of(&events);
        let kind = model
            .views()
            .instances
            .iter()
            .find_map(|r| match r {
                InstanceRow::Instance {
                    instance: i,
                    verdict,
                    ..
                } if i == instance => Some(verdict.kind.clone()),
                _ => None,
            })
            .expect("instance row");
        (kind, model)
    };
    let served = InstanceInference {
        completed: 1,
        last_completed_at: Some("2026-01-01T00:00:00.000Z".into()),
        ..InstanceInference::default()
    };
    let (kind, model) = with(Some(served.clone()));
    assert_eq!(kind, "ready");
    assert!(
        model
            .events()
            .iter()
            .any(|e| e.text.contains("served inference (1 completed"))
    );
    assert_eq!(with(None).0, "unprobed");
    let none = InstanceInference {
        completed: 0,
        ..served.clone()
    };
    assert_eq!(with(Some(none)).0, "unprobed");
    let other_runner = InstanceInference {
        runner_id: Some("a-runner-this-instance-does-not-have".into()),
        ..served
    };
    assert_eq!(with(Some(other_runner)).0, "unprobed");
}

#[test]
fn commands_progress_and_outcomes_are_kept_and_logged() {
    let id = CommandSeq(7);
    let model = model_of(&[
        ev(
            1,
            SessionEvent::Command {
                id,
                text: "delete abc".into(),
            },
        ),
        ev(
            2,
            SessionEvent::CommandProgress {
                id,
                note: "DELETE /instance/abc sent".into(),
            },
        ),
        ev(
            3,
            SessionEvent::CommandOutcome {
                id,
                status: CommandStatus::Uncertain,
                detail: "no answer within 5 s".into(),
            },
        ),
    ]);
    let track = model.commands().get(&id).expect("command");
    assert_eq!(track.notes, ["DELETE /instance/abc sent"]);
    assert_eq!(
        track.outcome,
        Some((CommandStatus::Uncertain, "no answer within 5 s".into()))
    );
    let last = model.events().last().expect("line");
    assert_eq!(last.level, Level::Unknown);
    assert_eq!(
        last.text,
        "« delete abc (#7): uncertain: no answer within 5 s"
    );
}

#[test]
fn repeated_snapshots_do_not_add_history_and_route_gone_removes() {
    let mut model = model_of(&SCENARIO);
    let history = |m: &Model| {
        m.views()
            .pages
            .iter()
            .find(|p| p.worker.as_str() == "gpu-a")
            .map(|p| p.history.len())
    };
    let before = history(&model);
    let records = fixtures::sim_records().expect("records");
    let workers = vec![fixtures::observation("gpu-a", ALPHA, 4096, 40, 24)];
    model.apply(&ev(
        25_010,
        SessionEvent::Feed {
            source: "router".into(),
            message: FeedMessage::Snapshot {
                at: Millis(1),
                workers,
                routes: records,
            },
        },
    ));
    model.settle();
    assert_eq!(history(&model), before);
    // the snapshot dropped the workers it no longer lists
    assert_eq!(model.views().pages.len(), 1);
    for r in ["request-1", "request-3", "request-5"] {
        model.apply(&ev(
            25_020,
            SessionEvent::Feed {
                source: "router".into(),
                message: FeedMessage::RouteGone {
                    at: Millis(2),
                    request: r.into(),
                },
            },
        ));
    }
    let mut left: Vec<&str> = model.routes().iter().map(|r| r.request.as_str()).collect();
    left.sort_unstable();
    assert_eq!(left, ["request-2", "request-4"]);
    assert!(model.route(&"router".into(), &"request-4".into()).is_some());
}

#[test]
fn time_never_moves_backwards() {
    let mut model = Model::default();
    model.apply(&ev(500, SessionEvent::Note { text: "a".into() }));
    model.apply(&ev(100, SessionEvent::Note { text: "b".into() }));
    assert_eq!(model.now(), Millis(500));
    assert_eq!(model.events().last().map(|e| e.at), Some(Millis(500)));
}

#[test]
fn the_event_log_is_bounded() {
    let mut model = Model::new(ModelConfig {
        event_log_len: 10,
        ..ModelConfig::default()
    });
    for i in 0..100 {
        model.apply(&ev(
            i,
            SessionEvent::Note {
                text: format!("n{i}"),
            },
        ));
    }
    assert!(model.events().len() <= 13);
    assert_eq!(model.events().last().map(|e| e.seq), Some(100));
}

/// Skulk 1.3.0 makes a new node id at every start. The captures runA and runC are two
/// starts of the same node: polled through one source, the console follows the restart
/// (the old id leaves, the new one joins, one event says so) instead of staying bound to
/// an id nothing answers for.
#[test]
fn a_skulk_restart_is_followed_not_a_sticky_conflict() {
    const RUN_A_NODE: &str = "12D3KooWDWXLYXk5Q7ZmwcgDa8PJxjGMeKYXUNnkv3PfsMiTCo53";
    let before = fixtures::skulk_state("runA/state_idle.json").expect("state");
    let after = fixtures::skulk_state("runC/state_idle.json").expect("state");
    let poll = skulk_poll;
    let mut events = vec![skulk_added()];
    events.extend(poll(100, RUN_A_NODE, &before));
    events.extend(poll(2_100, RUN_A_NODE, &before));
    let model = model_of(&events);
    assert!(
        model
            .views()
            .nodes
            .iter()
            .any(|n| n.node.as_str() == RUN_A_NODE)
    );

    events.extend(poll(4_100, RUN_C_NODE, &after));
    let model = model_of(&events);
    let ids: Vec<&str> = model
        .views()
        .nodes
        .iter()
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(ids, [RUN_C_NODE], "the old id left, the new one joined");
    let node = node(&model, RUN_C_NODE);
    assert_eq!(
        node.identity,
        Identity::Bound {
            source: "skulk".into()
        }
    );
    assert!(matches!(node.membership, MembershipView::Member { .. }));
    let restarts: Vec<&str> = model
        .events()
        .iter()
        .map(|e| e.text.as_str())
        .filter(|t| t.contains("restarted"))
        .collect();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert!(restarts[0].contains(RUN_A_NODE) && restarts[0].contains(RUN_C_NODE));
}

/// runC: the instance is created, then deleted (Skulk only acknowledges; /state stops
/// listing it). The row says removed, keeps its model, counts no deadline, refuses `d`,
/// and ages out after [`REMOVED_KEPT_MS`].
#[test]
fn a_removed_instance_keeps_model_and_cause_then_ages_out() {
    let created = fixtures::skulk_state("runC/state_after_create_instance.json").expect("state");
    let deleted = fixtures::skulk_state("runC/state_after_instance_delete.json").expect("state");
    let id = "cff479d0-3939-4513-8d59-e5b967b6c9ad";
    let poll = |at: u64, state: &den_protocol::skulk::State| skulk_poll(at, RUN_C_NODE, state);
    let mut events = vec![skulk_added()];
    events.extend(poll(100, &created));
    events.extend(poll(2_100, &deleted));
    let row = |m: &Model| {
        m.views().instances.iter().find_map(|r| match r {
            InstanceRow::Instance {
                instance,
                model,
                verdict,
                removed,
                ..
            } if instance == id => Some((model.clone(), verdict.clone(), removed.clone())),
            _ => None,
        })
    };
    // while it exists: its tasks from /state (runC: one CreateRunner, Complete), and the
    // download it wants carries no hint
    let created_model = model_of(&events[..3]);
    let tasks = created_model
        .views()
        .instances
        .iter()
        .find_map(|r| match r {
            InstanceRow::Instance {
                instance, tasks, ..
            } if instance == id => Some(tasks.clone()),
            _ => None,
        })
        .expect("instance row");
    assert_eq!(tasks.len(), 1, "{tasks:?}");
    assert!(
        tasks[0].starts_with("CreateRunner ") && tasks[0].contains("Complete"),
        "{tasks:?}"
    );
    let download = |m: &Model| m.views().downloads.first().cloned().expect("download row");
    assert_eq!(download(&created_model).hint, None);
    assert!(
        download(&created_model).eta_ms.is_some(),
        "Skulk's etaMs of the ongoing record"
    );

    let model = model_of(&events);
    // Skulk keeps the download going after the delete: said so
    let orphan = download(&model).hint.unwrap_or_default();
    assert!(
        orphan.contains("no instance on this node needs it"),
        "{orphan}"
    );
    let (name, verdict, removed) = row(&model).expect("still listed");
    assert_eq!(
        name.as_deref(),
        Some("mlx-community/Llama-3.2-1B-Instruct-4bit")
    );
    assert_eq!(verdict.kind, "removed");
    assert_eq!(
        verdict.deadline, None,
        "no deadline counts for a removed instance"
    );
    let removed = removed.expect("removed");
    assert_eq!(removed.last_seen, Millis(105));
    assert!(
        removed.cause.contains("no longer in any fresh /state"),
        "{removed:?}"
    );

    // `d` on it is refused in one line, nothing to confirm
    let mut app = crate::app::App::focused(crate::app::Panel::Instances);
    app.prepare(&model);
    let effects = app.update(crate::app::Action::RowCommand, &model);
    assert!(effects.is_empty());
    let flash = app.flash.as_ref().map(|f| f.text.clone());
    assert!(
        flash.as_deref().is_some_and(|t| t.contains("already gone")),
        "{flash:?}"
    );

    // still listed just before the limit, gone after it
    events.extend(poll(REMOVED_KEPT_MS, &deleted));
    assert!(row(&model_of(&events)).is_some());
    events.extend(poll(REMOVED_KEPT_MS + 200, &deleted));
    assert!(row(&model_of(&events)).is_none(), "aged out");
}

/// Two den processes that start at different times show the same readiness deadline
/// for an instance den placed: the fence's, given to each as a `PlacementDeadline`
/// relative to its own clock, not "first seen + 15 minutes".
#[test]
fn a_placement_deadline_from_the_fence_wins_over_first_sight() {
    // runner still loading (the captured one failed, which would end the wait at once)
    let state =
        fixtures::skulk_state("../scenarios/state_created_instance_loading.json").expect("state");
    let id = "cff479d0-3939-4513-8d59-e5b967b6c9ad";
    let events = |with_fence: bool| {
        let mut out = vec![skulk_added()];
        if with_fence {
            out.push(ev(
                0,
                SessionEvent::PlacementDeadline {
                    instance: id.into(),
                    deadline_in_ms: 540_000,
                    hard_expiry_in_ms: None,
                },
            ));
        }
        out.extend(skulk_poll(100, RUN_C_NODE, &state));
        out
    };
    let deadline = |m: &Model| {
        m.views().instances.iter().find_map(|r| match r {
            InstanceRow::Instance {
                instance, verdict, ..
            } if instance == id => verdict.deadline,
            _ => None,
        })
    };
    assert_eq!(deadline(&model_of(&events(true))), Some(Millis(540_000)));
    assert_eq!(
        deadline(&model_of(&events(false))),
        Some(Millis(105 + 15 * 60_000)),
        "without a fence: the default from first sight"
    );
}

/// A request the router holds for KV pages has a record before any offer: the console
/// shows it as a live "waiting" route (so it can be cancelled), then as offered once it
/// leaves the wait. The records come from den's router machine itself.
#[test]
fn a_request_waiting_for_pages_is_a_live_route_until_it_leaves_the_wait() {
    use den_protocol::router::{Router, RouterInput};
    use std::sync::Arc;

    let request = Arc::new(
        den_protocol::request::GenerationRequest::new("held-1", "m", vec![1, 2, 3], 8)
            .expect("request"),
    );
    let mut router = Router::default();
    let _ = router.handle(
        Millis(100),
        RouterInput::Hold {
            request: Arc::clone(&request),
            candidates: Vec::new(),
            deadline: None,
        },
    );
    let feed = |model: &mut Model, at: u64, router: &Router| {
        let record = router.record(&"held-1".into()).expect("record").clone();
        model.apply(&ev(
            at,
            SessionEvent::Feed {
                source: "router".into(),
                message: FeedMessage::Route {
                    at: Millis(at),
                    record: Box::new(record),
                },
            },
        ));
    };
    let mut model = model_of(&SCENARIO);
    feed(&mut model, 25_010, &router);
    let row = model
        .route(&"router".into(), &"held-1".into())
        .expect("a waiting request has a route row");
    assert_eq!(row.phase, RoutePhase::Waiting);
    assert!(row.phase.is_live(), "a waiting request can be cancelled");
    assert_eq!((row.worker.as_ref(), row.attempt), (None, 0));

    // It leaves the wait with no candidate: no-feasible-worker, no longer live.
    let _ = router.handle(
        Millis(200),
        RouterInput::Release {
            request: "held-1".into(),
            candidates: Vec::new(),
        },
    );
    feed(&mut model, 25_020, &router);
    let row = model
        .route(&"router".into(), &"held-1".into())
        .expect("row");
    assert_eq!(row.phase, RoutePhase::Failed);
    assert!(!row.phase.is_live());
    assert_eq!(row.record.waited_ms, 100);
    // The Events panel tells the story: it waited, how long, and how it ended.
    let lines: Vec<&str> = model
        .events()
        .iter()
        .map(|e| e.text.as_str())
        .filter(|t| t.contains("held-1"))
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines[0].contains("waits for KV pages"), "{lines:?}");
    assert!(lines[1].contains("waited 100ms for KV pages"), "{lines:?}");
    assert!(lines[2].contains("failed: no feasible worker"), "{lines:?}");
}
