//! The async driver: interprets the placement workflow's effects with the management
//! client, the fence store and tokio timers, and feeds the answers back until the
//! workflow finishes.
//!
//! Every effect is answered in order; the workflow has at most one thing outstanding at
//! a time, so the driver needs no concurrency of its own. Ordering guarantees:
//! - `PersistFence` is answered `FencePersisted` only after the fence file and its
//!   directory entry are fsynced, so `POST /instance` never precedes a durable fence;
//! - a transport failure after sending is reported as such (`sent: true`), and the
//!   workflow reconciles instead of re-posting;
//! - the probe goes through the same [`ManagementClient`], so credentials stay with the
//!   management origin.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use den_protocol::placement::{
    Effect, Fence, Input, Outcome, PlacementRequest, PlacementWorkflow, ProbeResult, StepKind,
    Target, TransportFailure, WorkflowConfig,
};
use den_protocol::skulk::{HttpIntent, InstanceId, Method};
use den_protocol::time::Millis;

use super::clock::Clock;
use super::fence_store::{FenceError, FenceStore, StoredFence};
use super::progress::{Progress, ProgressNote, ProgressSink};
use crate::http::ManagementClient;

/// Default deadline of the one inference probe.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// Asked once, after the preview is selected and before the fence is written: return
/// `false` to stop with nothing written or sent. Runs on the driver's task; a CLI prompt
/// may block it briefly (nothing else is outstanding at that moment).
pub type ConfirmFn = dyn Fn(&SubmissionPlan<'_>) -> bool + Send + Sync;

/// What is about to be submitted, for a confirmation prompt.
#[derive(Debug, Clone, Copy)]
pub struct SubmissionPlan<'a> {
    /// The management origin the `POST /instance` goes to.
    pub origin: &'a str,
    /// The fence about to be written (logical times).
    pub fence: &'a Fence,
}

/// Why a run ended without an [`Outcome`].
#[derive(Debug, thiserror::Error)]
pub enum PlaceError {
    #[error("placement of instance {instance_id} declined: nothing was written or sent")]
    Declined { instance_id: InstanceId },
    #[error(
        "the placement workflow stopped at step {step:?} without an outcome; {}",
        match instance_id {
            Some(id) => format!("reconcile instance {id} from its fence"),
            None => "nothing was submitted".to_owned(),
        }
    )]
    Stalled {
        step: StepKind,
        instance_id: Option<InstanceId>,
    },
    #[error(transparent)]
    Fence(#[from] FenceError),
    #[error(transparent)]
    Url(#[from] crate::http::UrlError),
    #[error("{0}")]
    Setup(String),
}

/// One placement (or one resumed fence) from start to outcome.
#[derive(Clone)]
pub struct PlaceDriver {
    client: ManagementClient,
    /// The compute node's own API, polled beside the management API (`--compute`).
    compute: Option<ManagementClient>,
    store: FenceStore,
    config: WorkflowConfig,
    clock: Clock,
    progress: ProgressSink,
    confirm: Option<Arc<ConfirmFn>>,
    probe_timeout: Duration,
}

impl std::fmt::Debug for PlaceDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlaceDriver")
            .field("client", &self.client)
            .field("store", &self.store)
            .field("confirm", &self.confirm.is_some())
            .finish_non_exhaustive()
    }
}

impl PlaceDriver {
    /// A driver whose logical time starts now.
    pub fn new(client: ManagementClient, store: FenceStore, config: WorkflowConfig) -> Self {
        PlaceDriver {
            client,
            compute: None,
            store,
            config,
            clock: Clock::start(),
            progress: ProgressSink::none(),
            confirm: None,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
        }
    }

    pub fn with_progress(mut self, progress: ProgressSink) -> Self {
        self.progress = progress;
        self
    }

    /// Ask before writing the fence (see [`ConfirmFn`]). Without it nothing is asked.
    pub fn with_confirmation(mut self, confirm: Arc<ConfirmFn>) -> Self {
        self.confirm = Some(confirm);
        self
    }

    /// Poll the compute node's own API too ([`Target::Compute`]).
    pub fn with_compute(mut self, compute: Option<ManagementClient>) -> Self {
        self.compute = compute;
        self
    }

    pub fn with_probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// The driver's time base (logical ms since [`PlaceDriver::new`]); use it to express
    /// a `hard_expiry` given in UNIX ms.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    pub fn store(&self) -> &FenceStore {
        &self.store
    }

    /// Runs a new placement to its outcome.
    pub async fn place(self, request: PlacementRequest) -> Result<Outcome, PlaceError> {
        self.run(Input::Start(request), None).await
    }

    /// Resumes a stored fence straight into reconciliation (after rechecking the
    /// management identity). Never re-posts. The reconcile deadline is recomputed from
    /// now; the hard expiry stays absolute (see `clock`).
    pub async fn resume(self, stored: StoredFence) -> Result<Outcome, PlaceError> {
        let fence = self
            .clock
            .fence_from_disk(&stored.fence, self.config.reconcile_deadline_ms);
        let id = fence.instance_id.clone();
        self.run(Input::Resume(Box::new(fence)), Some(id)).await
    }

    async fn run(self, first: Input, instance: Option<InstanceId>) -> Result<Outcome, PlaceError> {
        let mut run = Run {
            wf: PlacementWorkflow::new(self.config.clone()),
            driver: &self,
            step: StepKind::Idle,
            notes_seen: 0,
            instance,
            outcome: None,
        };
        let mut queue: VecDeque<Effect> = run.handle(first).into();
        while let Some(effect) = queue.pop_front() {
            if let Some((input, after)) = run.interpret(effect).await? {
                queue.extend(run.handle(input));
                if after == After::StatePoll {
                    run.report_evidence();
                }
            }
        }
        run.outcome.ok_or_else(|| PlaceError::Stalled {
            step: run.wf.step(),
            instance_id: run.wf.fence().map(|f| f.instance_id.clone()),
        })
    }
}

/// Whether an answer was a `/state` poll (its evidence is then reported).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Other,
    StatePoll,
}

/// The state of one run.
struct Run<'a> {
    wf: PlacementWorkflow,
    driver: &'a PlaceDriver,
    step: StepKind,
    notes_seen: usize,
    instance: Option<InstanceId>,
    outcome: Option<Outcome>,
}

impl Run<'_> {
    fn now(&self) -> Millis {
        self.driver.clock.now()
    }

    fn emit(&self, event: Progress) {
        self.driver.progress.emit(ProgressNote {
            at_ms: self.now().0,
            instance: self.instance.clone(),
            event,
        });
    }

    /// Feeds one input, then reports step changes and new notes.
    #[must_use = "the effects are what the state machine decided: carry them out"]
    fn handle(&mut self, input: Input) -> Vec<Effect> {
        let effects = self.wf.handle(self.now(), input);
        if self.instance.is_none() {
            self.instance = self.wf.fence().map(|f| f.instance_id.clone());
        }
        let step = self.wf.step();
        if step != self.step {
            self.step = step;
            self.emit(Progress::Step(step));
        }
        let notes = self.wf.notes().get(self.notes_seen..).unwrap_or_default();
        let fresh: Vec<_> = notes.to_vec();
        self.notes_seen = self.wf.notes().len();
        for note in fresh {
            self.emit(Progress::Note(note));
        }
        effects
    }

    fn report_evidence(&self) {
        let Some(fence) = self.wf.fence() else {
            return;
        };
        if let Some(report) = self.wf.evidence().instance(&fence.instance_id, self.now()) {
            self.emit(Progress::Evidence(Box::new(report)));
        }
    }

    /// Performs one effect; returns the input that answers it, if any.
    async fn interpret(&mut self, effect: Effect) -> Result<Option<(Input, After)>, PlaceError> {
        let d = self.driver;
        match effect {
            Effect::Http {
                request,
                intent,
                target,
            } => {
                let (client, what) = match target {
                    Target::Management => (Some(&d.client), intent.to_string()),
                    Target::Compute => (d.compute.as_ref(), format!("compute {intent}")),
                };
                let Some(client) = client else {
                    let failure = TransportFailure {
                        sent: false,
                        detail: "no compute endpoint is configured (--compute URL)".to_owned(),
                    };
                    return Ok(Some((Input::HttpFailed { request, failure }, After::Other)));
                };
                let after = if intent.method == Method::Get && intent.path == "/state" {
                    After::StatePoll
                } else {
                    After::Other
                };
                let poll = after == After::StatePoll;
                self.emit(Progress::Request {
                    what: what.clone(),
                    poll,
                });
                let input = match client.execute(&intent).await {
                    Ok(answer) => {
                        self.emit(Progress::Answer {
                            what,
                            poll,
                            status: Some(answer.status),
                            failure: None,
                            latency_ms: Some(millis(answer.latency)),
                        });
                        Input::HttpResponse {
                            request,
                            status: answer.status,
                            body: answer.body,
                        }
                    }
                    Err(failure) => {
                        self.emit(Progress::Answer {
                            what,
                            poll,
                            status: None,
                            failure: Some(failure.detail.clone()),
                            latency_ms: None,
                        });
                        Input::HttpFailed { request, failure }
                    }
                };
                Ok(Some((input, after)))
            }
            Effect::PersistFence(fence) => {
                let fence = *fence;
                if let Some(confirm) = &d.confirm {
                    let origin = d.client.origin();
                    let plan = SubmissionPlan {
                        origin: &origin,
                        fence: &fence,
                    };
                    if !confirm(&plan) {
                        return Err(PlaceError::Declined {
                            instance_id: fence.instance_id,
                        });
                    }
                }
                let instance_id = fence.instance_id.clone();
                let input = match self.persist(&fence).await {
                    Ok(path) => {
                        self.emit(Progress::FenceWritten { path });
                        Input::FencePersisted { instance_id }
                    }
                    Err(detail) => {
                        self.emit(Progress::FenceWriteFailed {
                            detail: detail.clone(),
                        });
                        Input::FencePersistFailed {
                            instance_id,
                            detail,
                        }
                    }
                };
                Ok(Some((input, After::Other)))
            }
            Effect::ClearFence { instance_id } => {
                let store = d.store.clone();
                let path = store.path_of(&instance_id);
                let removed = tokio::task::spawn_blocking(move || store.remove(&instance_id)).await;
                match removed {
                    Ok(Ok(())) => self.emit(Progress::FenceCleared { path }),
                    Ok(Err(e)) => self.emit(Progress::FenceClearFailed {
                        detail: e.to_string(),
                    }),
                    Err(e) => self.emit(Progress::FenceClearFailed {
                        detail: format!("{}: {e}", path.display()),
                    }),
                }
                Ok(None)
            }
            Effect::Probe {
                request, intent, ..
            } => {
                let result = self.probe(&intent).await;
                Ok(Some((
                    Input::ProbeAnswered { request, result },
                    After::Other,
                )))
            }
            Effect::WakeAt(at) => {
                self.emit(Progress::Waiting { until_ms: at.0 });
                match d.clock.instant(at) {
                    Some(instant) => tokio::time::sleep_until(instant.into()).await,
                    // A wake time past the end of the clock never comes.
                    None => std::future::pending::<()>().await,
                }
                Ok(Some((Input::Wake, After::Other)))
            }
            Effect::Finished(outcome) => {
                self.emit(Progress::Finished(outcome.clone()));
                self.outcome = Some(outcome);
                Ok(None)
            }
        }
    }

    /// Writes the fence durably (on a blocking thread: it fsyncs).
    async fn persist(&self, fence: &Fence) -> Result<PathBuf, String> {
        let d = self.driver;
        let mut stored = StoredFence::new(d.client.origin(), d.clock.fence_to_disk(fence));
        stored.compute = d.compute.as_ref().map(ManagementClient::origin);
        let store = d.store.clone();
        match tokio::task::spawn_blocking(move || store.write(&stored)).await {
            Ok(Ok(path)) => Ok(path),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("fence writer stopped: {e}")),
        }
    }

    async fn probe(&self, intent: &HttpIntent) -> ProbeResult {
        let d = self.driver;
        let what = intent.to_string();
        self.emit(Progress::Probe { what: what.clone() });
        match d.client.execute_within(intent, d.probe_timeout).await {
            Ok(answer) => {
                self.emit(Progress::Answer {
                    what,
                    poll: false,
                    status: Some(answer.status),
                    failure: None,
                    latency_ms: Some(millis(answer.latency)),
                });
                ProbeResult::from_response(answer.status, &answer.body)
            }
            Err(failure) => {
                self.emit(Progress::Answer {
                    what,
                    poll: false,
                    status: None,
                    failure: Some(failure.detail.clone()),
                    latency_ms: None,
                });
                ProbeResult::Transport {
                    detail: failure.detail,
                }
            }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
