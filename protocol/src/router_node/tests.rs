//! The router node driven directly: pinning, fencing, offered work between heartbeats,
//! speculative prefixes, fast fallback on send failures and detaches — decisions that
//! were reachable only end to end while they lived in the agent's actor.

use super::*;

use crate::candidate::Tier;
use crate::capacity::DeclineReason;
use crate::decision::DecisionEventKind;
use crate::ids::Epoch;
use crate::observation::Observation;
use crate::router::{Phase, RouterError};
use crate::wire::{Heartbeat, OfferResult, ResultMessage, TokenDelta, WorkerResult};

const MODEL: &str = "test/model";

fn node() -> RouterNode {
    RouterNode::new(NodeConfig {
        router: RouterConfig::default(),
        heartbeat_timeout_ms: 1_000,
        chunk_size: 4,
        max_waiting: DEFAULT_MAX_WAITING,
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

// ---------------------------------------------------------------------------------------
// Requests waiting for KV pages (module `waiting`)
// ---------------------------------------------------------------------------------------

/// Worker `worker`'s heartbeat: a pool of `total` 4-token pages, `free` of them free.
fn pool(worker: &str, sequence: u64, total: u32, free: u32) -> Observation {
    let mut o = obs(worker, sequence);
    o.pool.total_pages = total;
    o.free_pages = free;
    o
}

/// A request needing `pages` 4-token pages (its prompt and 4 new tokens).
fn needing(id: &str, pages: u32) -> Arc<GenerationRequest> {
    request(id, pages * 4 - 4)
}

/// Workers "a" (100 pages, 5 free: 16 short of r1) and "b" (a 10-page pool that could
/// never hold r1), and r1 (21 pages) waiting.
fn big_and_small_with_r1_waiting() -> RouterNode {
    let mut n = node();
    connect(&mut n, 1, "a");
    connect(&mut n, 2, "b");
    let _ = heartbeat(&mut n, 0, 1, pool("a", 1, 100, 5));
    let _ = heartbeat(&mut n, 0, 2, pool("b", 1, 10, 10));
    assert!(parked(&submit(&mut n, 1, &needing("r1", 21), Pin::Any)));
    n
}

/// A node letting `max_waiting` requests wait, and worker "a" with 100 pages, `free`
/// of them free.
fn one_worker_queueing(max_waiting: usize, free: u32) -> RouterNode {
    let mut n = RouterNode::new(NodeConfig {
        router: RouterConfig::default(),
        heartbeat_timeout_ms: 60_000,
        chunk_size: 4,
        max_waiting,
    });
    connect(&mut n, 1, "a");
    let _ = heartbeat(&mut n, 0, 1, pool("a", 1, 100, free));
    n
}

/// The request ended with `no-feasible-worker`.
fn failed_at_once(effects: &[NodeEffect]) -> bool {
    matches!(
        &deliveries(effects)[..],
        [Delivery {
            kind: DeliveryKind::Error {
                error: RouterError::NoFeasibleWorker { .. }
            },
            ..
        }]
    )
}

fn decisions(effects: &[NodeEffect]) -> impl Iterator<Item = &DecisionEventKind> {
    effects.iter().filter_map(|e| match e {
        NodeEffect::Decision(d) => Some(&d.kind),
        _ => None,
    })
}

/// The request started waiting for pages.
fn parked(effects: &[NodeEffect]) -> bool {
    decisions(effects).any(|k| matches!(k, DecisionEventKind::Waiting))
}

/// Waiting requests taken up again with a feasible candidate.
fn admitted(effects: &[NodeEffect]) -> usize {
    decisions(effects)
        .filter(|k| matches!(k, DecisionEventKind::Released { feasible, .. } if *feasible > 0))
        .count()
}

#[test]
fn a_request_short_of_pages_waits_and_is_offered_when_a_heartbeat_shows_room() {
    let mut n = node();
    connect(&mut n, 1, "a");
    let _ = heartbeat(&mut n, 0, 1, pool("a", 1, 100, 10));
    let e = submit(&mut n, 5, &needing("r1", 21), Pin::Any);
    assert!(parked(&e), "{e:?}");
    assert!(offers(&e).is_empty() && deliveries(&e).is_empty(), "{e:?}");
    assert!(e.iter().any(|x| matches!(
        x,
        NodeEffect::SetTimer { timer: Timer::Deadline(r), at } if r.as_str() == "r1" && at.0 == 60_005
    )));
    assert_eq!(n.waiting().len(), 1);
    // It has a record from its arrival, waiting, with the candidate that lacked pages.
    let id: RequestId = "r1".into();
    assert_eq!(n.router().phase(&id), Some(Phase::Waiting));
    assert_eq!(n.router().counts().waiting, 1);
    // A drain waits for it: it is accepted work, though nothing is in flight.
    assert_eq!(
        (
            n.router().counts().in_flight(),
            n.router().counts().unfinished()
        ),
        (0, 1)
    );
    let record = n
        .router()
        .record(&id)
        .expect("a waiting request has a record");
    assert!(record.is_waiting());
    assert_eq!(record.submitted_at, Millis(5));
    assert_eq!(record.candidates.feasible_count(), 0);
    assert_eq!(record.candidates.len(), 1);
    // Not yet room: it stays.
    let e = heartbeat(&mut n, 10, 1, pool("a", 2, 100, 20));
    assert!(offers(&e).is_empty());
    let e = heartbeat(&mut n, 30, 1, pool("a", 3, 100, 21));
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    assert!(e.iter().any(|x| matches!(
        x,
        NodeEffect::Decision(DecisionEvent {
            kind: DecisionEventKind::Released {
                waited_ms: 25,
                feasible: 1,
                infeasible: 0
            },
            ..
        })
    )));
    assert!(n.waiting().is_empty());
    let record = n.router().record(&id).expect("record");
    assert!(!record.is_waiting());
    assert_eq!((record.submitted_at, record.waited_ms), (Millis(5), 25));
    assert_eq!(record.candidates.feasible_count(), 1);
    assert_eq!(n.router().phase(&id), Some(Phase::Offered));
    assert_eq!(n.router().counts().waiting, 0);
    assert_eq!(n.router().counts().unfinished(), 1);
}

#[test]
fn a_request_no_pool_could_hold_fails_at_once_as_the_spec_says() {
    for (total, why) in [
        (20, "its pool is too small"),
        (0, "its pool size is unknown"),
    ] {
        let mut n = node();
        connect(&mut n, 1, "a");
        let _ = heartbeat(&mut n, 0, 1, pool("a", 1, total, 10));
        let e = submit(&mut n, 5, &needing("r1", 21), Pin::Any);
        assert!(failed_at_once(&e), "{why}: {e:?}");
        assert!(n.waiting().is_empty(), "{why}");
    }
    // With waiting turned off, a request short of pages fails at once too.
    let mut n = one_worker_queueing(0, 10);
    let e = submit(&mut n, 5, &needing("r1", 21), Pin::Any);
    assert_eq!(deliveries(&e).len(), 1);
    assert!(!parked(&e));
}

#[test]
fn the_oldest_waiting_request_is_not_overtaken_on_the_worker_it_reserved() {
    let mut n = big_and_small_with_r1_waiting();
    // A small newcomer that "a" could take goes to "b" instead: "a" is r1's.
    let e = submit(&mut n, 2, &needing("r2", 3), Pin::Any);
    assert_eq!(offers(&e), [(2, "b".to_owned(), 1, Tier::None)]);
    // One only "a" could take waits behind r1, even once "a" has room for it alone.
    assert!(parked(&submit(
        &mut n,
        3,
        &needing("r3", 8),
        Pin::Worker("a".into())
    )));
    let e = heartbeat(&mut n, 4, 1, pool("a", 2, 100, 12));
    assert!(offers(&e).is_empty(), "{e:?}");
    // Room for r1: it goes first; r3 does not fit beside it and keeps waiting.
    let e = heartbeat(&mut n, 5, 1, pool("a", 3, 100, 25));
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    assert_eq!(admitted(&e), 1);
    let left: Vec<_> = n
        .waiting()
        .iter()
        .map(|p| p.request.id.to_string())
        .collect();
    assert_eq!(left, ["r3"]);
    // r1 is on "a" now; r3 is the oldest and reserves "a" for itself.
    let _ = accept(&mut n, 6, 1, "r1", 1);
    let e = heartbeat(&mut n, 7, 1, pool("a", 4, 100, 8));
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    assert!(n.waiting().is_empty());
}

#[test]
fn offers_between_heartbeats_take_their_pages() {
    let mut n = node();
    connect(&mut n, 1, "a");
    let _ = heartbeat(&mut n, 0, 1, pool("a", 1, 100, 30));
    let e = submit(&mut n, 1, &needing("r1", 21), Pin::Any);
    assert_eq!(offers(&e).len(), 1);
    // "a" has not reported r1's pages yet: 9 are left, not 30, so r2 waits rather than
    // being offered and declined.
    assert!(parked(&submit(&mut n, 2, &needing("r2", 21), Pin::Any)));
    let _ = accept(&mut n, 3, 1, "r1", 1);
    let e = heartbeat(&mut n, 4, 1, pool("a", 2, 100, 9));
    assert!(offers(&e).is_empty());
    let _ = complete(&mut n, 5, 1, "r1", 1);
    let e = heartbeat(&mut n, 6, 1, pool("a", 3, 100, 30));
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
}

#[test]
fn a_waiting_request_ends_at_its_deadline_or_its_cancel_and_a_full_queue_refuses() {
    let mut n = one_worker_queueing(2, 0);
    let r1 = needing("r1", 5);
    let e = n.handle(
        Millis(1),
        NodeInput::Submit {
            request: Arc::clone(&r1),
            deadline: Some(Millis(500)),
            pin: Pin::Any,
        },
    );
    assert!(parked(&e));
    assert!(parked(&submit(&mut n, 2, &needing("r2", 5), Pin::Any)));
    // The queue holds two: a third fails at once.
    let e = submit(&mut n, 3, &needing("r3", 5), Pin::Any);
    assert!(!parked(&e) && deliveries(&e).len() == 1, "{e:?}");
    // A duplicate of a waiting request is ignored.
    assert!(submit(&mut n, 4, &r1, Pin::Any).is_empty());
    // An early deadline timer changes nothing; the due one fails r1.
    let e = n.handle(
        Millis(100),
        NodeInput::TimerFired(Timer::Deadline("r1".into())),
    );
    assert!(deliveries(&e).is_empty());
    let e = n.handle(
        Millis(500),
        NodeInput::TimerFired(Timer::Deadline("r1".into())),
    );
    assert!(matches!(
        &deliveries(&e)[..],
        [Delivery { kind: DeliveryKind::Error { error: RouterError::DeadlineExceeded { deadline } }, .. }]
            if deadline.0 == 500
    ));
    // Its record stays, failed, with nothing attempted (operators find it afterwards).
    let record = n.router().record(&"r1".into()).expect("record kept");
    assert!(record.attempts.is_empty() && !record.is_waiting());
    assert_eq!(record.finished_at, Some(Millis(500)));
    assert_eq!(record.waited_ms, 499);
    assert_eq!(n.router().phase(&"r1".into()), Some(Phase::Failed));
    let e = n.handle(
        Millis(600),
        NodeInput::Cancel {
            request: "r2".into(),
        },
    );
    assert!(matches!(
        &deliveries(&e)[..],
        [Delivery {
            kind: DeliveryKind::Cancelled,
            ..
        }]
    ));
    assert_eq!(n.router().phase(&"r2".into()), Some(Phase::Cancelled));
    assert!(n.waiting().is_empty());
    assert_eq!(n.router().counts().waiting, 0);
    // Room later offers nothing: both ended.
    let e = heartbeat(&mut n, 700, 1, pool("a", 2, 100, 100));
    assert!(offers(&e).is_empty());
}

#[test]
fn a_waiting_request_fails_once_no_worker_could_hold_it() {
    let mut n = big_and_small_with_r1_waiting();
    // "a" goes away: nothing left could ever hold r1.
    let e = n.handle(
        Millis(2),
        NodeInput::Disconnected {
            conn: ConnectionId(1),
        },
    );
    assert!(failed_at_once(&e), "{e:?}");
    assert!(n.waiting().is_empty());
}

#[test]
fn only_the_oldest_waiting_request_reserves_a_worker() {
    let mut n = node();
    for (conn, w) in [(1, "a"), (2, "b"), (3, "c")] {
        connect(&mut n, conn, w);
        let _ = heartbeat(&mut n, 0, conn, pool(w, 1, 100, 5));
    }
    // r1 takes "a" (ties go by name); r2 waits behind it, without a worker of its own.
    for (at, r) in [(1, "r1"), (2, "r2")] {
        assert!(parked(&submit(&mut n, at, &needing(r, 21), Pin::Any)));
    }
    assert_eq!(n.waiting().reserved(), Some(&"a".into()));
    // A small newcomer goes to a worker nobody reserved.
    let e = submit(&mut n, 3, &needing("r3", 2), Pin::Any);
    assert_eq!(offers(&e), [(2, "b".to_owned(), 1, Tier::None)]);
    // "c" frees 25 pages: the oldest, r1, takes them although it reserved "a"; r2 is the
    // oldest now, and reserves the worker fewest pages short of it, "a" (5 free; "b"
    // has 3 left beside r3, "c" 4 beside r1).
    let e = heartbeat(&mut n, 4, 3, pool("c", 2, 100, 25));
    assert_eq!(offers(&e), [(3, "c".to_owned(), 1, Tier::None)]);
    let left: Vec<_> = n
        .waiting()
        .iter()
        .map(|p| p.request.id.to_string())
        .collect();
    assert_eq!(left, ["r2"]);
    assert_eq!(n.waiting().reserved(), Some(&"a".into()));
}

#[test]
fn a_burst_on_one_small_worker_is_served_whole_through_the_queue() {
    // One worker with 48 pages; six requests at once needing 3, 23, 6, 26, 40 and 2
    // pages (the validation's burst). The worker takes what it is offered, reports after
    // every change and finishes its oldest request each round: every request is offered
    // in the end, none fails.
    let mut n = node();
    connect(&mut n, 1, "a");
    let mut seq = 1;
    let _ = heartbeat(&mut n, 0, 1, pool("a", seq, 48, 48));
    let (mut free, mut evictable) = (48u32, 0u32);
    let report = |seq: u64, free: u32, evictable: u32| {
        let mut o = pool("a", seq, 48, free);
        o.evictable_pages = evictable;
        o
    };
    let mut running: Vec<(String, u64, u32)> = Vec::new();
    let mut pending: Vec<NodeEffect> = Vec::new();
    for (i, pages) in [3, 23, 6, 26, 40, 2].into_iter().enumerate() {
        pending.extend(submit(
            &mut n,
            1,
            &needing(&format!("r{i}"), pages),
            Pin::Any,
        ));
    }
    let mut done = 0;
    for round in 0..50u64 {
        let now = 10 + round * 10;
        for e in std::mem::take(&mut pending) {
            if let NodeEffect::Send { frame, .. } = &e
                && let RouterMessage::Offer(o) = &frame.message
            {
                let pages = o.estimate.required_pages;
                assert!(
                    pages <= free + evictable,
                    "offered {pages} pages, {free} free"
                );
                let from_free = pages.min(free);
                free -= from_free;
                evictable -= pages - from_free;
                let r = o.assignment.request.to_string();
                pending.extend(accept(&mut n, now, 1, &r, o.assignment.attempt));
                running.push((r, o.assignment.attempt, pages));
            } else if let NodeEffect::Deliver(d) = e {
                assert!(matches!(d.kind, DeliveryKind::Completed { .. }), "{d:?}");
                done += 1;
            }
        }
        seq += 1;
        pending.extend(heartbeat(&mut n, now + 1, 1, report(seq, free, evictable)));
        if !running.is_empty() {
            let (r, attempt, pages) = running.remove(0);
            // Its pages stay resident, evictable: a cached prefix.
            evictable += pages;
            pending.extend(complete(&mut n, now + 2, 1, &r, attempt));
            seq += 1;
            pending.extend(heartbeat(&mut n, now + 3, 1, report(seq, free, evictable)));
        }
        if done == 6 {
            break;
        }
    }
    assert_eq!(
        done,
        6,
        "waiting: {:?}",
        n.waiting()
            .iter()
            .map(|p| &p.request.id)
            .collect::<Vec<_>>()
    );
}

/// One 48-page worker "a": r0 offered 26 pages, r1 (40) waiting, examined against the
/// 22 left.
fn r0_offered_and_r1_waiting() -> RouterNode {
    let mut n = node();
    connect(&mut n, 1, "a");
    let _ = heartbeat(&mut n, 0, 1, pool("a", 1, 48, 48));
    assert_eq!(
        offers(&submit(&mut n, 1, &needing("r0", 26), Pin::Any)).len(),
        1
    );
    assert!(parked(&submit(&mut n, 2, &needing("r1", 40), Pin::Any)));
    n
}

#[test]
fn room_freed_between_two_heartbeats_still_lets_the_waiting_in() {
    // r0 is offered and finishes between two heartbeats that both show 48 free pages;
    // r1 waited meanwhile, examined with r0's 26 pages taken. The second heartbeat shows
    // no change from the first, but more room than r1 was examined against.
    let mut n = r0_offered_and_r1_waiting();
    let _ = accept(&mut n, 3, 1, "r0", 1);
    let _ = complete(&mut n, 4, 1, "r0", 1);
    let e = heartbeat(&mut n, 5, 1, pool("a", 2, 48, 48));
    assert_eq!(offers(&e), [(1, "a".to_owned(), 1, Tier::None)]);
    // A heartbeat with no more room than the queue was examined against examines nothing.
    assert!(parked(&submit(&mut n, 6, &needing("r2", 40), Pin::Any)));
    let e = heartbeat(&mut n, 7, 1, pool("a", 3, 48, 8));
    assert!(offers(&e).is_empty() && admitted(&e) == 0, "{e:?}");
}

#[test]
fn room_freed_without_a_heartbeat_still_lets_the_waiting_in() {
    // r0 is offered 26 of "a"'s 48 pages; r1 (40) waits, examined against the 22 left.
    // r0 is declined, so the node's view of "a" is 48 again without any heartbeat, and
    // r2, pinned to "a" (r1's), waits behind r1 — examined against 48. The next
    // heartbeat shows 48: not more than r2 saw, but more than r1 did.
    let mut n = r0_offered_and_r1_waiting();
    let _ = n.handle(
        Millis(3),
        NodeInput::Frame {
            conn: ConnectionId(1),
            frame: ToRouter::OfferResult(OfferResult {
                assignment: AssignmentId::new("r0", 1),
                worker_epoch: Epoch(1),
                accepted: false,
                reason: Some(DeclineReason::InsufficientPages),
            }),
        },
    );
    assert!(parked(&submit(
        &mut n,
        4,
        &needing("r2", 2),
        Pin::Worker("a".into())
    )));
    let e = heartbeat(&mut n, 5, 1, pool("a", 2, 48, 48));
    // r1, then r2 beside it (8 pages left).
    assert_eq!(offers(&e).len(), 2, "{e:?}");
    assert!(n.waiting().is_empty());
}

/// A waiting record keeps what a finished one keeps (the router's `retained_candidates`
/// best, 16), not every worker's candidate — up to `max_waiting` of them wait — and is
/// ranked whole again when it leaves the queue.
#[test]
fn a_waiting_record_keeps_a_bounded_snapshot_until_it_leaves() {
    let mut n = node();
    for w in 0..20u64 {
        let name = format!("w{w:02}");
        connect(&mut n, w + 1, &name);
        let _ = heartbeat(&mut n, 0, w + 1, pool(&name, 1, 100, 5));
    }
    assert!(parked(&submit(&mut n, 1, &needing("r1", 21), Pin::Any)));
    let id: RequestId = "r1".into();
    let record = n.router().record(&id).expect("record");
    assert_eq!(record.candidates.len(), 16);
    assert_eq!(record.candidates_omitted, 4);
    let e = heartbeat(&mut n, 10, 8, pool("w07", 2, 100, 21));
    assert_eq!(offers(&e), [(8, "w07".to_owned(), 1, Tier::None)]);
    let record = n.router().record(&id).expect("record");
    assert_eq!(
        (record.candidates.len(), record.candidates_omitted),
        (20, 0)
    );
}
