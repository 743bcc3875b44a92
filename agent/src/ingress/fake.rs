//! An in-process stand-in for the router runtime, for the ingress tests and benchmark.
//!
//! It is **not** the router: there is no routing, no worker and no page pool. It answers
//! every submission with the synthetic engine's deterministic output
//! ([`crate::engine::output_token`]), behaves as configured per model (delays, an error
//! after some deltas, a refusal before the first), records what it was asked
//! (submissions, cancellations) so tests can check them, and reports as cached the
//! longest token prefix the request shares with one of its recent prompts, the way a
//! worker reports its actual reuse.
//!
//! With no delays and an output that fits the delivery queue, `submit` fills the stream
//! synchronously and spawns nothing ("zero cost"), so the benchmark measures the ingress.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use den_protocol::ids::{ModelFingerprint, RequestId, WorkerId};
use den_protocol::request::{GenerationRequest, Token};
use den_protocol::router::{Delivery, DeliveryKind, NoFeasible, RouterError};
use den_protocol::wire::{Failure, FailureKind, WorkerResult};

use crate::engine;
use crate::serving::{DELIVERY_QUEUE, DeliveryStream, ServedModel, SubmitError, Submitter};

/// Prompts remembered for the cached-prefix count.
const HISTORY: usize = 32;

/// How the fake answers requests for one model.
#[derive(Debug, Clone, Default)]
pub struct Behaviour {
    /// Before the first delta.
    pub first_token_delay: Duration,
    /// Before every later delta.
    pub token_delay: Duration,
    /// After this many deltas, end with `WorkerFailedAfterStream`.
    pub fail_after: Option<u32>,
    /// End with this error before any delta.
    pub refuse: Option<RouterError>,
}

/// A model the fake serves.
#[derive(Debug, Clone)]
pub struct FakeModel {
    pub served: ServedModel,
    pub behaviour: Behaviour,
}

impl FakeModel {
    /// A model with public id `id`, fingerprint `fp-{id}`, one worker, the given context.
    pub fn new(id: &str, max_context: u32) -> Self {
        FakeModel {
            served: ServedModel {
                id: id.to_owned(),
                fingerprint: ModelFingerprint::new(format!("fp-{id}")),
                workers: 1,
                max_context,
            },
            behaviour: Behaviour::default(),
        }
    }

    pub fn with(mut self, behaviour: Behaviour) -> Self {
        self.behaviour = behaviour;
        self
    }
}

/// The stand-in submitter.
#[derive(Debug)]
pub struct FakeSubmitter {
    models: Vec<FakeModel>,
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    submitted: Vec<GenerationRequest>,
    cancels: BTreeMap<RequestId, u32>,
    live: BTreeMap<RequestId, CancellationToken>,
    history: VecDeque<Vec<Token>>,
    record: bool,
}

impl FakeSubmitter {
    /// A fake that records every submission (for tests).
    pub fn new(models: Vec<FakeModel>) -> Arc<Self> {
        Arc::new(FakeSubmitter {
            models,
            state: Arc::new(Mutex::new(State {
                record: true,
                ..State::default()
            })),
        })
    }

    /// A fake that keeps no per-request records (for the benchmark).
    pub fn unrecorded(models: Vec<FakeModel>) -> Arc<Self> {
        Arc::new(FakeSubmitter {
            models,
            state: Arc::default(),
        })
    }

    /// Every request submitted so far, in order.
    pub fn submitted(&self) -> Vec<GenerationRequest> {
        self.lock().submitted.clone()
    }

    /// How many times `cancel` was called for each request.
    pub fn cancels(&self) -> BTreeMap<RequestId, u32> {
        self.lock().cancels.clone()
    }

    /// Requests whose generation task is still running.
    pub fn live(&self) -> usize {
        self.lock().live.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn cached_prefix(&self, request: &GenerationRequest) -> u32 {
        let mut state = self.lock();
        let processed = request.processed_tokens();
        let best = state
            .history
            .iter()
            .map(|p| p.iter().zip(processed).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        if state.history.len() >= HISTORY {
            state.history.pop_front();
        }
        state.history.push_back(request.tokens.clone());
        u32::try_from(best).unwrap_or(u32::MAX)
    }
}

impl Submitter for FakeSubmitter {
    fn submit(&self, request: GenerationRequest) -> Result<DeliveryStream, SubmitError> {
        let (tx, rx) = mpsc::channel(DELIVERY_QUEUE);
        let behaviour = self
            .models
            .iter()
            .find(|m| m.served.fingerprint == request.model)
            .map(|m| m.behaviour.clone());
        let cached = self.cached_prefix(&request);
        let id = request.id.clone();
        {
            let mut state = self.lock();
            if state.record {
                state.submitted.push(request.clone());
            }
        }
        let Some(behaviour) = behaviour else {
            let error = RouterError::NoFeasibleWorker {
                summary: NoFeasible {
                    candidates: 0,
                    infeasible: Vec::new(),
                    attempts: 0,
                    last: None,
                },
            };
            let _ = tx.try_send(delivery(&id, DeliveryKind::Error { error }));
            return Ok(rx);
        };
        let run = Run {
            id: id.clone(),
            model: request.model.clone(),
            context: engine::context_hash(&request.tokens),
            n: request.max_new_tokens,
            cached,
            behaviour,
        };
        if run.is_instant() {
            run.fill(&tx);
            return Ok(rx);
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return Err(SubmitError::ShuttingDown);
        };
        let token = CancellationToken::new();
        self.lock().live.insert(id, token.clone());
        let state = self.state.clone();
        handle.spawn(async move {
            let id = run.id.clone();
            run.stream(tx, token).await;
            lock(&state).live.remove(&id);
        });
        Ok(rx)
    }

    fn cancel(&self, request: &RequestId) {
        let mut state = self.lock();
        *state.cancels.entry(request.clone()).or_default() += 1;
        if let Some(token) = state.live.get(request) {
            token.cancel();
        }
    }

    fn models(&self) -> Vec<ServedModel> {
        self.models.iter().map(|m| m.served.clone()).collect()
    }
}

struct Run {
    id: RequestId,
    model: ModelFingerprint,
    context: den_protocol::chunk::PrefixHash,
    n: u32,
    cached: u32,
    behaviour: Behaviour,
}

impl Run {
    fn is_instant(&self) -> bool {
        let b = &self.behaviour;
        b.first_token_delay.is_zero()
            && b.token_delay.is_zero()
            && b.fail_after.is_none()
            && (self.n as usize) < DELIVERY_QUEUE
    }

    /// Every delivery at once (fits the queue by `is_instant`).
    fn fill(self, tx: &mpsc::Sender<Delivery>) {
        if let Some(error) = self.behaviour.refuse.clone() {
            let _ = tx.try_send(delivery(&self.id, DeliveryKind::Error { error }));
            return;
        }
        let mut tokens = Vec::with_capacity(self.n as usize);
        for index in 0..self.n {
            let token = engine::output_token(&self.model, self.context, index);
            tokens.push(token);
            let _ = tx.try_send(delivery(&self.id, DeliveryKind::Delta { token, index }));
        }
        let result = Box::new(WorkerResult::completed(tokens, self.cached));
        let _ = tx.try_send(delivery(&self.id, DeliveryKind::Completed { result }));
    }

    async fn stream(self, tx: mpsc::Sender<Delivery>, cancel: CancellationToken) {
        let cancelled = |tx: &mpsc::Sender<Delivery>| {
            let _ = tx.try_send(delivery(&self.id, DeliveryKind::Cancelled));
        };
        if let Some(error) = self.behaviour.refuse.clone() {
            let _ = tx
                .send(delivery(&self.id, DeliveryKind::Error { error }))
                .await;
            return;
        }
        let mut tokens = Vec::new();
        for index in 0..self.n {
            let delay = if index == 0 {
                self.behaviour.first_token_delay
            } else {
                self.behaviour.token_delay
            };
            if !delay.is_zero() {
                tokio::select! {
                    _ = cancel.cancelled() => return cancelled(&tx),
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            if self.behaviour.fail_after == Some(index) {
                let error = RouterError::WorkerFailedAfterStream {
                    worker: WorkerId::new("fake-worker"),
                    reason: Failure::new(FailureKind::DecodeFailed, "injected by the fake"),
                    delivered: index,
                };
                let _ = tx
                    .send(delivery(&self.id, DeliveryKind::Error { error }))
                    .await;
                return;
            }
            let token = engine::output_token(&self.model, self.context, index);
            tokens.push(token);
            let d = delivery(&self.id, DeliveryKind::Delta { token, index });
            tokio::select! {
                _ = cancel.cancelled() => return cancelled(&tx),
                sent = tx.send(d) => if sent.is_err() { return },
            }
        }
        let result = Box::new(WorkerResult::completed(tokens, self.cached));
        let _ = tx
            .send(delivery(&self.id, DeliveryKind::Completed { result }))
            .await;
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // The state is plain bookkeeping; a panicked holder cannot leave it unusable.
    state.lock().unwrap_or_else(|e| e.into_inner())
}

fn delivery(id: &RequestId, kind: DeliveryKind) -> Delivery {
    Delivery {
        request: id.clone(),
        kind,
    }
}
