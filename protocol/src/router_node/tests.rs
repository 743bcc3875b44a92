//! The router node driven directly: pinning, fencing, offered work between heartbeats,
//! speculative prefixes, fast fallback on send failures and detaches — decisions that
//! were reachable only end to end while they lived in the agent's actor.

use super::*;

use crate::candidate::Tier;
use crate::capacity::DeclineReason;
use crate::decision::DecisionEventKind;
use crate::ids::Epoch;
use crate::observation::Observation;
use crate::wire::{Heartbeat, OfferResult, ResultMessage, TokenDelta, WorkerResult};

const MODEL: &str = "test/model";

fn node() -> RouterNode {
    RouterNode::new(NodeConfig {
        router: RouterConfig::default(),
        heartbeat_timeout_ms: 1_000,
        chunk_size: 4,
    })
}

fn obs(worker: &str, sequence: u64) -> Observation {
    let mut o = Observation::new(worker, format!("node-{worker}"));
    o.epoch = Epoch(1);
    o.sequence = sequence;
    o.models.insert(MODEL.into());
    o.free_pages = 1_000;
    o.page_size = 4;
    o.prefill_ms_per_token = 1.0;
    o.first_token_ms = 1.0;
    o
}

fn connect(n: &mut RouterNode, conn: u64, worker: &str) {
    let effects = n.handle(
        Millis(0),
        NodeInput::Connected {
            conn: ConnectionId(conn),
            worker: worker.into(),
            node: format!("node-{worker}").into(),
        },
    );
    assert!(effects.is_empty());
}

fn heartbeat(n: &mut RouterNode, now: u64, conn: u64, o: Observation) -> Vec<NodeEffect> {
    n.handle(
        Millis(now),
        NodeInput::Frame {
            conn: ConnectionId(conn),
            frame: ToRouter::Heartbeat(Box::new(Heartbeat { observation: o })),
        },
    )
}

fn request(id: &str, prompt: u32) -> Arc<GenerationRequest> {
    Arc::new(GenerationRequest::new(id, MODEL, (1..=prompt).collect(), 4).unwrap())
}

fn submit(n: &mut RouterNode, now: u64, r: &Arc<GenerationRequest>, pin: Pin) -> Vec<NodeEffect> {
    n.handle(
        Millis(now),
        NodeInput::Submit {
            request: Arc::clone(r),
            deadline: None,
            pin,
        },
    )
}

/// The offers among effects, as (connection, worker, attempt, tier).
fn offers(effects: &[NodeEffect]) -> Vec<(u64, String, u64, Tier)> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Send { conn, frame } => match &frame.message {
                RouterMessage::Offer(o) => Some((
                    conn.0,
                    frame.to.to_string(),
                    o.assignment.attempt,
                    o.candidate.tier,
                )),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

fn counts(effects: &[NodeEffect]) -> Vec<&Count> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Count(c) => Some(c),
            _ => None,
        })
        .collect()
}

fn deliveries(effects: &[NodeEffect]) -> Vec<&Delivery> {
    effects
        .iter()
        .filter_map(|e| match e {
            NodeEffect::Deliver(d) => Some(d),
            _ => None,
        })
        .collect()
}

fn accept(n: &mut RouterNode, now: u64, conn: u64, request: &str, attempt: u64) -> Vec<NodeEffect> {
    n.handle(
        Millis(now),
        NodeInput::Frame {
            conn: ConnectionId(conn),
            frame: ToRouter::OfferResult(OfferResult {
                assignment: AssignmentId::new(request, attempt),
                worker_epoch: Epoch(1),
                accepted: true,
                reason: None,
            }),
        },
    )
}

fn complete(
    n: &mut RouterNode,
    now: u64,
    conn: u64,
    request: &str,
    attempt: u64,
) -> Vec<NodeEffect> {
    n.handle(
        Millis(now),
        NodeInput::Frame {
            conn: ConnectionId(conn),
            frame: ToRouter::Result(ResultMessage {
                assignment: AssignmentId::new(request, attempt),
                result: Box::new(WorkerResult::completed(vec![7], 0)),
            }),
        },
    )
}

/// Two idle workers, "a" on connection 1 and "b" on 2.
fn two_workers() -> RouterNode {
    let mut n = node();
    connect(&mut n, 1, "a");
    connect(&mut n, 2, "b");
    let _ = heartbeat(&mut n, 0, 1, obs("a", 1));
    let _ = heartbeat(&mut n, 0, 2, obs("b", 1));
    n
}

#[test]
fn a_pinned_request_is_offered_only_to_its_worker_and_nowhere_fails_at_once() {
    let mut n = two_workers();
    // Unpinned, "a" wins the tie by name; pinned to "b", only "b" is offered.
    let e = submit(&mut n, 1, &request("r1", 9), Pin::Worker("b".into()));
    assert_eq!(offers(&e), [(2, "b".to_owned(), 1, Tier::None)]);
    let e = submit(&mut n, 1, &request("r2", 9), Pin::Nowhere);
    assert!(offers(&e).is_empty());
    let d = deliveries(&e);
    assert_eq!(d.len(), 1);
    assert!(
        matches!(d[0].kind, DeliveryKind::Error { .. }),
        "{:?}",
        d[0].kind
    );
}

#[test]
fn offered_work_counts_until_the_worker_reports_it() {
    let mut n = two_workers();
    let e = submit(&mut n, 1, &request("r1", 41), Pin::Any);
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    // Before "a" heartbeats again, its 40-token prefill is counted: "b" takes the next.
    assert!(n.unreflected_ms(&"a".into()) > 40.0);
    let e = submit(&mut n, 2, &request("r2", 41), Pin::Any);
    assert_eq!(offers(&e), [(2, "b".to_owned(), 1, Tier::None)]);
    // "a" accepts and its next heartbeat shows the work (queue 41 ms): the guess ends.
    let _ = accept(&mut n, 3, 1, "r1", 1);
    let mut busy = obs("a", 2);
    busy.queue_ms = 41.0;
    let _ = heartbeat(&mut n, 4, 1, busy);
    assert_eq!(n.unreflected_ms(&"a".into()), 0.0);
}

#[test]
fn a_worker_speaks_only_for_itself_and_its_current_assignments() {
    let mut n = two_workers();
    // A heartbeat for "b" on "a"'s connection: refused, the registry unchanged.
    let e = heartbeat(&mut n, 1, 1, obs("b", 9));
    assert!(
        matches!(&e[..], [NodeEffect::Count(Count::FrameReceived("heartbeat")), NodeEffect::Refuse { conn, .. }] if conn.0 == 1),
        "{e:?}"
    );
    assert_eq!(
        n.discovery()
            .registry()
            .get(&"b".into())
            .map(|o| o.sequence),
        Some(1)
    );
    // r1 is on "a": a token from "b" for it is fenced and reaches no client.
    let _ = submit(&mut n, 2, &request("r1", 9), Pin::Any);
    let _ = accept(&mut n, 3, 1, "r1", 1);
    let e = n.handle(
        Millis(4),
        NodeInput::Frame {
            conn: ConnectionId(2),
            frame: ToRouter::Token(TokenDelta {
                assignment: AssignmentId::new("r1", 1),
                token: 5,
                index: 0,
            }),
        },
    );
    assert!(deliveries(&e).is_empty());
    assert!(counts(&e).contains(&&Count::Fenced("token")), "{e:?}");
    // The same token from "a" is delivered; a duplicate of it is fenced.
    let token = || NodeInput::Frame {
        conn: ConnectionId(1),
        frame: ToRouter::Token(TokenDelta {
            assignment: AssignmentId::new("r1", 1),
            token: 5,
            index: 0,
        }),
    };
    assert_eq!(deliveries(&n.handle(Millis(5), token())).len(), 1);
    let e = n.handle(Millis(6), token());
    assert!(deliveries(&e).is_empty());
    assert!(counts(&e).contains(&&Count::Fenced("token")), "{e:?}");
}

#[test]
fn a_completed_route_is_guessed_resident_until_the_next_heartbeat() {
    let mut n = node();
    connect(&mut n, 1, "a");
    let mut tiered = obs("a", 1);
    tiered
        .tier_throughput_bytes_per_ms
        .insert(Tier::Ram, 1_000.0);
    let _ = heartbeat(&mut n, 0, 1, tiered.clone());
    let r1 = request("r1", 17);
    let _ = submit(&mut n, 1, &r1, Pin::Any);
    let _ = accept(&mut n, 2, 1, "r1", 1);
    let e = complete(&mut n, 3, 1, "r1", 1);
    assert!(matches!(deliveries(&e)[..], [d] if matches!(d.kind, DeliveryKind::Completed { .. })));
    // The same prompt again: offered as a GPU hit on "a".
    let again = Arc::new(GenerationRequest::new("r2", MODEL, (1..=17).collect(), 4).unwrap());
    let e = submit(&mut n, 4, &again, Pin::Any);
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::Gpu)]);
    // "a" declines (the route was released after all): the next guess is the chain's
    // next shorter prefix, each boundary of it being a candidate.
    let e = n.handle(
        Millis(5),
        NodeInput::Frame {
            conn: ConnectionId(1),
            frame: ToRouter::OfferResult(OfferResult {
                assignment: AssignmentId::new("r2", 1),
                worker_epoch: Epoch(1),
                accepted: false,
                reason: Some(DeclineReason::ResidentPrefixUnavailable),
            }),
        },
    );
    assert_eq!(offers(&e), [(1, "a".to_owned(), 2, Tier::Gpu)], "{e:?}");
    // A heartbeat that does not list the prefix ends the guess.
    let mut newer = tiered;
    newer.sequence = 2;
    let _ = heartbeat(&mut n, 6, 1, newer);
    let e = submit(&mut n, 7, &request("r3", 17), Pin::Any);
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
}

#[test]
fn a_worker_that_does_not_read_is_detached_and_its_offer_goes_elsewhere() {
    let mut n = two_workers();
    let e = submit(&mut n, 1, &request("r1", 9), Pin::Any);
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    let e = n.handle(
        Millis(2),
        NodeInput::SendFailed {
            conn: ConnectionId(1),
            worker: "a".into(),
        },
    );
    assert!(
        e.iter().any(|e| matches!(e, NodeEffect::WorkerDetached { worker, reason: DetachReason::SendFailed, .. } if worker.as_str() == "a")),
        "{e:?}"
    );
    assert_eq!(offers(&e), [(2, "b".to_owned(), 2, Tier::None)]);
    assert_eq!(n.unreflected_ms(&"a".into()), 0.0);
}

#[test]
fn a_lost_connection_fails_its_attempts_over_and_drops_its_node_replicas() {
    let mut n = two_workers();
    let _ = submit(&mut n, 1, &request("r1", 9), Pin::Any);
    let _ = accept(&mut n, 2, 1, "r1", 1);
    let e = n.handle(
        Millis(3),
        NodeInput::Disconnected {
            conn: ConnectionId(1),
        },
    );
    assert_eq!(offers(&e), [(2, "b".to_owned(), 2, Tier::None)]);
    assert!(n.discovery().registry().get(&"a".into()).is_none());
    assert!(n.peer(ConnectionId(1)).is_none());
    assert_eq!(n.conn_of(&"b".into()), Some(ConnectionId(2)));
    // The record shows the first attempt ended with the worker unavailable.
    let record = n.router().record(&"r1".into()).unwrap();
    assert_eq!(record.attempts.len(), 2);
    assert!(e.iter().any(|e| matches!(e, NodeEffect::Decision(d) if matches!(d.kind, DecisionEventKind::AttemptEnded { attempt: 1, .. }))));
}

#[test]
fn timers_come_back_as_inputs_and_an_expired_worker_is_detached() {
    let mut n = node();
    connect(&mut n, 1, "a");
    let e = heartbeat(&mut n, 0, 1, obs("a", 1));
    let Some((timer, at)) = e.iter().find_map(|e| match e {
        NodeEffect::SetTimer {
            timer: t @ Timer::Expiry { .. },
            at,
        } => Some((t.clone(), *at)),
        _ => None,
    }) else {
        panic!("no expiry timer in {e:?}");
    };
    assert_eq!(at, Millis(1_000));
    let e = n.handle(at, NodeInput::TimerFired(timer));
    assert!(
        e.iter().any(|e| matches!(
            e,
            NodeEffect::WorkerDetached {
                reason: DetachReason::HeartbeatExpired,
                ..
            }
        )),
        "{e:?}"
    );
    // An offer timer: counted, and the attempt times out.
    let mut n = two_workers();
    let e = submit(&mut n, 1, &request("r1", 9), Pin::Any);
    let Some(offer_timer) = e.iter().find_map(|e| match e {
        NodeEffect::SetTimer {
            timer: t @ Timer::Offer(_),
            ..
        } => Some(t.clone()),
        _ => None,
    }) else {
        panic!("no offer timer in {e:?}");
    };
    let e = n.handle(Millis(10_000), NodeInput::TimerFired(offer_timer));
    assert!(counts(&e).contains(&&Count::OfferTimeout));
    assert_eq!(offers(&e), [(2, "b".to_owned(), 2, Tier::None)]);
}
