//! The device thread under the worker machine, as the actor drives it (without the
//! actor's sockets): a prefill goes on into its decode in the step right after its last
//! prompt rows, and a cancel that lands in between keeps the pages until that decode
//! has quiesced.

use std::collections::BTreeMap;
use std::time::Duration;

use den_protocol::candidate::{Candidate, Tier, TransferCapabilities, estimate};
use den_protocol::ids::{Epoch, ModelFingerprint, RouteId, WorkerId};
use den_protocol::pool::{Geometry, PagePool};
use den_protocol::request::GenerationRequest;
use den_protocol::time::Millis;
use den_protocol::wire::{Cancel, Offer, WorkerMessage};
use den_protocol::worker::{LocalWorkerEffect, Worker, WorkerEffect, WorkerInput};

use super::*;
use crate::memory::{ArenaGeometry, HostMemory};
use crate::worker::store::Tiers;

const MODEL: &str = "chain-model";
const PAGE: u32 = 16;
const ROW_BYTES: u64 = 64;

/// What the harness saw, in order.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Prefilled(String),
    Token(String, u32),
    Decoded(String),
    Failed(String, OperationKind),
    Released(String),
}

struct Harness {
    machine: Worker<SharedPool>,
    pool: SharedPool,
    device: DeviceHandle,
    events: mpsc::UnboundedReceiver<DeviceEvent>,
    flags: BTreeMap<AssignmentId, Arc<AtomicBool>>,
    next_job: u64,
    seen: Vec<Seen>,
    rt: tokio::runtime::Runtime,
}

impl Harness {
    /// One synthetic-engine device whose every step spends `step_ms`.
    fn new(step_ms: f64) -> Harness {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let arena = ArenaGeometry::new(PAGE, 64, ROW_BYTES).unwrap();
        let pool =
            SharedPool::new(PagePool::new(Geometry::new(PAGE, 64, arena.page_bytes())).unwrap());
        let (tx, events) = mpsc::unbounded_channel();
        let ctx = DeviceContext {
            pool: pool.clone(),
            tiers: Tiers::default(),
            runtime: rt.handle().clone(),
            events: tx,
            config: DeviceConfig {
                costs: EngineCosts::new(0.0, step_ms, step_ms).unwrap(),
                chunk_size: PAGE,
                row_bytes: ROW_BYTES,
                verify_restores: false,
                batch_tokens: 256,
                idle_spin: crate::worker::DEFAULT_IDLE_SPIN,
            },
            metrics: Arc::new(Metrics::new()),
            calibration: Arc::new(Calibration::default()),
            queue: Arc::new(QueueMeter::default()),
            faults: Arc::new(Faults::default()),
            totals: Arc::new(Mutex::new(TransferTotals::default())),
            engine_plan: Arc::new(Mutex::new(None)),
        };
        let memory = Box::new(HostMemory::open(arena).unwrap());
        let device = spawn(memory, ctx, None, None).unwrap();
        Harness {
            machine: Worker::new("w", Epoch(0), [ModelFingerprint::from(MODEL)], pool.clone()),
            pool,
            device,
            events,
            flags: BTreeMap::new(),
            next_job: 0,
            seen: Vec::new(),
            rt,
        }
    }

    fn offer(&mut self, id: &str, first: u32, prompt: u32, max_new: u32) {
        let tokens = (first..first + prompt).collect();
        let request = GenerationRequest::new(id, MODEL, tokens, max_new).unwrap();
        let candidate = Candidate {
            worker_id: WorkerId::from("w"),
            worker_epoch: Epoch(0),
            tier: Tier::None,
            cached_token_count: 0,
            cached_bytes: 0,
            queue_ms: 0.0,
            prefix_load_ms: 0.0,
            gpu_restore_ms: 0.0,
            prefill_ms_per_token: 0.0,
            first_token_ms: 0.0,
            page_size: PAGE,
            free_pages: 64,
            evictable_pages: 0,
            max_context: 4096,
            online: true,
            model_loaded: true,
            exact: true,
            source_continuation_id: None::<RouteId>,
            resident_token_count: 0,
            transfer: TransferCapabilities::default(),
            imposed_ms: 0.0,
        };
        let estimate = estimate(&request, &candidate);
        let offer = Offer {
            assignment: AssignmentId::new(id, 1),
            worker_epoch: Epoch(0),
            request: Arc::new(request),
            candidate,
            estimate,
        };
        let effects = self
            .machine
            .handle(Millis(0), WorkerInput::Offer(Box::new(offer)));
        self.apply(effects);
    }

    fn cancel(&mut self, id: &str) {
        let assignment = AssignmentId::new(id, 1);
        let effects = self
            .machine
            .handle(Millis(0), WorkerInput::Cancel(Cancel { assignment }));
        self.apply(effects);
    }

    /// The actor's part: start operations on the device, raise cancellation flags.
    fn apply(&mut self, effects: Vec<WorkerEffect>) {
        for effect in effects {
            match effect {
                WorkerEffect::Local(LocalWorkerEffect::Start(op)) => {
                    let cancel = Arc::clone(self.flags.entry(op.assignment().clone()).or_default());
                    self.next_job += 1;
                    let job = self.next_job;
                    assert!(self.device.submit(Job::Op { job, op, cancel }));
                }
                WorkerEffect::Local(LocalWorkerEffect::CancelOperation { assignment, .. }) => {
                    if let Some(flag) = self.flags.get(&assignment) {
                        flag.store(true, Ordering::Relaxed);
                    }
                }
                WorkerEffect::Local(LocalWorkerEffect::Released { assignment, .. }) => {
                    self.seen
                        .push(Seen::Released(assignment.request.to_string()));
                }
                WorkerEffect::Send(WorkerMessage::OfferResult(r)) => {
                    assert!(r.accepted, "{r:?}");
                }
                WorkerEffect::Send(_) => {}
            }
        }
    }

    /// The next device event, fed to the machine.
    fn next(&mut self) -> Seen {
        let event = self.recv();
        self.feed(event)
    }

    fn recv(&mut self) -> DeviceEvent {
        let events = &mut self.events;
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), events.recv()).await })
            .expect("the device answers within 20 s")
            .expect("the device is running")
    }

    fn feed(&mut self, event: DeviceEvent) -> Seen {
        let (seen, input) = match event {
            DeviceEvent::Token {
                assignment,
                token,
                index,
            } => {
                let seen = Seen::Token(assignment.request.to_string(), index);
                let input = WorkerInput::Token {
                    assignment,
                    token,
                    index,
                };
                (seen, input)
            }
            DeviceEvent::Done {
                assignment,
                outcome,
            } => {
                let id = assignment.request.to_string();
                let seen = match &outcome {
                    OperationOutcome::Prefilled => Seen::Prefilled(id),
                    OperationOutcome::Decoded { .. } => Seen::Decoded(id),
                    OperationOutcome::Failed { operation, .. } => Seen::Failed(id, *operation),
                    OperationOutcome::Restored { .. } => panic!("no restores here"),
                };
                let input = WorkerInput::OperationDone {
                    assignment,
                    outcome,
                };
                (seen, input)
            }
            DeviceEvent::BadReplica(_) => panic!("no replicas here"),
        };
        self.seen.push(seen.clone());
        let effects = self.machine.handle(Millis(0), input);
        self.apply(effects);
        seen
    }

    fn until(&mut self, want: &Seen) {
        while &self.next() != want {}
    }
}

/// A request that arrives while another decodes: its first token comes out of the pass
/// right after the one that wrote its last prompt rows, beside the other's token of that
/// pass. Were the decode started by the actor after `Prefilled`, the device would run a
/// whole pass without it (the other request's token in between).
#[test]
fn a_prefill_goes_on_into_its_decode_in_the_next_pass() {
    let mut h = Harness::new(5.0);
    h.offer("long", 1000, 20, 40);
    h.until(&Seen::Token("long".into(), 2));
    h.offer("late", 3000, 40, 2);
    h.until(&Seen::Decoded("late".into()));
    let at = |s: Seen| h.seen.iter().position(|x| *x == s).unwrap();
    let (prefilled, first) = (
        at(Seen::Prefilled("late".into())),
        at(Seen::Token("late".into(), 0)),
    );
    assert!(prefilled < first, "{:?}", h.seen);
    let between: Vec<&Seen> = h.seen[prefilled + 1..first]
        .iter()
        .filter(|s| matches!(s, Seen::Token(id, _) if id == "long"))
        .collect();
    assert!(
        between.len() <= 1,
        "passes ran between the prompt and its first token: {:?}",
        h.seen
    );
    h.until(&Seen::Decoded("long".into()));
    assert!(h.seen.contains(&Seen::Released("late".into())));
    assert!(h.seen.contains(&Seen::Released("long".into())));
    assert_eq!(h.pool.lock().reserved_count(), 0);
}

/// A cancel that reaches the machine after the device has the prompt in but before the
/// machine has heard so: the decode is already running on the device, so `Prefilled`
/// must not release the reservation (the pages may still be written); the decode stops
/// at a step boundary and reports a decode failure, and only that releases them.
#[test]
fn a_cancel_racing_the_prompt_waits_for_the_chained_decode() {
    let mut h = Harness::new(5.0);
    h.offer("c", 500, 40, 500);
    let prefilled = loop {
        let event = h.recv();
        if matches!(
            &event,
            DeviceEvent::Done {
                outcome: OperationOutcome::Prefilled,
                ..
            }
        ) {
            break event;
        }
        h.feed(event);
    };
    h.cancel("c");
    h.feed(prefilled);
    assert!(
        !h.seen.contains(&Seen::Released("c".into())),
        "released while its decode may still write: {:?}",
        h.seen
    );
    assert!(h.pool.lock().reserved_count() > 0);
    h.until(&Seen::Failed("c".into(), OperationKind::Decode));
    assert_eq!(
        h.seen.last(),
        Some(&Seen::Released("c".into())),
        "{:?}",
        h.seen
    );
    assert_eq!(h.pool.lock().reserved_count(), 0);
}
