//! The execution queue of one device: one OS thread that owns the page memory and runs
//! an iteration-level batching scheduler (`scheduler`): each step one decode token for
//! every running decode plus prompt rows within a token budget; a restore's chunks are
//! scattered between steps as their fetches deliver them (fetched off this thread,
//! `worker::fetch`), and checkpoint captures run whole between steps (spec §3.7, §3.10).
//!
//! The engine is a real model when the worker was given one (den-model's forward pass
//! over the route's pages, sampled), else the synthetic one (model-free, see
//! `crate::engine`, and `scheduler`'s `synthetic`): the same scheduler, steps really
//! spend their declared costs on this thread, rows written into pages are the
//! deterministic synthetic KV of (model, position, token), and output tokens are the
//! engine's deterministic stream. Restores take the exact chunk chain as the fetch
//! delivers it, in order (each chunk from the fastest tier holding it intact), scatter
//! each chunk into pages claimed from the assignment's reservation and, with `verify`,
//! read the rows back and compare them byte-exact with recomputation. A missing, corrupt
//! or mismatching chunk ends the restore there: the rest is recomputed by prefill or
//! decode (which repair a short prefix idempotently).
//!
//! Cancellation is cooperative: a cancelled job that has not started is skipped, a
//! running restore stops at its next chunk (its fetch stops within 10 ms even while a
//! store is slow to answer, and says so), and a prefill or decode leaves the scheduler at
//! the next step boundary, leaving no pending append behind. Either way its result is reported (as a failure of the same operation
//! kind), because the worker machine releases the assignment's pages only when that
//! result arrives.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc as std_mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};

use den_protocol::chunk::ChunkDescriptor;
use den_protocol::ids::{AssignmentId, ModelFingerprint, RouteId};
use den_protocol::pool::{Page, PoolError};
use den_protocol::request::Token;
use den_protocol::worker::{Operation, OperationKind, OperationOutcome};

use den_model::{Model, Runner};
use den_protocol::engine_plan::EnginePlan;

use crate::engine::{EngineCosts, SyntheticKv};
use crate::memory::{MemoryError, PageMemory, RowRun, TransferTotals};
use crate::metrics::Metrics;
use crate::model_file::{ModelFile, runner_options};
use crate::tiers::ChunkMeta;
use crate::worker::faults::Faults;
use crate::worker::fetch::Fetched;
use crate::worker::meters::{Calibration, QueueMeter};
use crate::worker::pool::SharedPool;
use crate::worker::store::{BadReplica, Tiers};

use append::PendingAppend;
use append::append_with;
pub use append::slot_runs;

mod append;
#[cfg(test)]
mod chain_tests;
mod queue;
mod restore;
mod scheduler;

use restore::Restoring;
use scheduler::ModelEngine;

/// What the device thread does with the work it is given.
#[derive(Debug, Clone, Copy)]
pub struct DeviceConfig {
    pub costs: EngineCosts,
    pub chunk_size: u32,
    pub row_bytes: u64,
    /// Read every restored chunk back and compare it with recomputation.
    pub verify_restores: bool,
    /// A real model's rows per step: every running decode's token, then prompt rows.
    pub batch_tokens: u32,
    /// How long the thread polls its queue, once idle, before it parks.
    pub idle_spin: std::time::Duration,
}

/// A unit of work for the device thread.
pub enum Job {
    /// A prefill or decode of an assignment.
    Op {
        job: u64,
        op: Operation,
        cancel: Arc<AtomicBool>,
    },
    /// A restore of an assignment begins; its chunks follow as [`Job::Fetched`], fetched
    /// off this thread (`worker::fetch`). The device sets `stop` when the restore ends
    /// early, so the fetch stops too.
    Restore {
        job: u64,
        op: Operation,
        cancel: Arc<AtomicBool>,
        stop: Arc<AtomicBool>,
    },
    /// The next chunk of restore `job`, in chain order; `None` when its fetch ended.
    Fetched { job: u64, fetched: Option<Fetched> },
    /// Copy rows of leased pages out for a checkpoint.
    Capture {
        job: u64,
        pages: Vec<Page>,
        chunks: Vec<ChunkMeta>,
        reply: oneshot::Sender<Result<Vec<(ChunkMeta, Bytes)>, String>>,
    },
}

/// What the device thread reports to the worker actor.
#[derive(Debug)]
pub enum DeviceEvent {
    Token {
        assignment: AssignmentId,
        token: Token,
        index: u32,
    },
    Done {
        assignment: AssignmentId,
        outcome: OperationOutcome,
    },
    BadReplica(BadReplica),
}

/// Everything the device thread shares with the rest of the worker.
#[derive(Clone)]
pub struct DeviceContext {
    pub pool: SharedPool,
    pub tiers: Tiers,
    pub runtime: tokio::runtime::Handle,
    pub events: mpsc::UnboundedSender<DeviceEvent>,
    pub config: DeviceConfig,
    pub metrics: Arc<Metrics>,
    pub calibration: Arc<Calibration>,
    pub queue: Arc<QueueMeter>,
    pub faults: Arc<Faults>,
    /// The memory's transfer totals, copied out after every job (calibration input).
    pub totals: Arc<Mutex<TransferTotals>>,
    /// A real model's scheduler state and measured step costs, published after every
    /// step for the heartbeat (`None`: the synthetic engine, or nothing measured yet).
    pub engine_plan: Arc<Mutex<Option<EnginePlan>>>,
}

/// The handle the actor keeps: a queue into the thread.
pub struct DeviceHandle {
    tx: Option<queue::JobSender>,
    thread: Option<JoinHandle<()>>,
}

impl DeviceHandle {
    /// Queue a job; false when the thread is gone.
    pub fn submit(&self, job: Job) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(job))
    }

    /// Close the queue, let the thread finish what it has and wait for it; the memory
    /// (device arena, pinned buffers) is released when the thread returns.
    pub fn shutdown(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for DeviceHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Start the device thread; with `model`, load it there first (its forward pass runs on
/// this thread and its own pool of helpers). Errors are one line.
pub fn spawn(
    memory: Box<dyn PageMemory>,
    ctx: DeviceContext,
    model: Option<ModelFile>,
    threads: Option<usize>,
) -> Result<DeviceHandle, String> {
    let (tx, rx) = queue::job_queue(ctx.config.idle_spin);
    let (ready_tx, ready_rx) = std_mpsc::channel::<Result<(), String>>();
    let thread = std::thread::Builder::new()
        .name("den-device".into())
        .spawn(move || {
            let file = model.as_ref().map(|m| Arc::clone(&m.file));
            let loaded = match &file {
                Some(f) => match Model::load(f) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                },
                None => None,
            };
            let mut fit = scheduler::StepFit::default();
            let engine = match (&loaded, &model) {
                // A device page arena: the model runs on that GPU, its KV in the pool.
                #[cfg(feature = "cuda")]
                (Some(m), Some(mf)) if memory.device_arena().is_some() => {
                    match gpu_engine(m, memory.as_ref(), ctx.config.batch_tokens) {
                        // The GPU's step costs are fitted from its first steps (the CPU
                        // calibration would time the wrong device).
                        Ok(r) => Some(ModelEngine::gpu(r, Arc::clone(&mf.text))),
                        Err(e) => {
                            let _ = ready_tx.send(Err(e));
                            return;
                        }
                    }
                }
                (Some(m), Some(mf)) => match Runner::new(m, runner_options(threads)) {
                    Ok(mut r) => {
                        if let Some(seeded) =
                            scheduler::StepFit::calibrated(&mut r, ctx.config.batch_tokens)
                        {
                            fit = seeded;
                        }
                        Some(ModelEngine::new(r, Arc::clone(&mf.text)))
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                },
                _ => None,
            };
            let mut device = Device {
                memory,
                ctx,
                kv: BTreeMap::new(),
                model: engine,
                fit,
                restoring: BTreeMap::new(),
            };
            if let Ok(mut plan) = device.ctx.engine_plan.lock() {
                *plan = None;
            }
            // A calibrated model reports its idle plan before its first request.
            device.publish_idle_plan();
            let _ = ready_tx.send(Ok(()));
            device.run_batched(&rx);
        })
        .map_err(|e| format!("cannot start the device thread: {e}"))?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(DeviceHandle {
            tx: Some(tx),
            thread: Some(thread),
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => {
            let _ = thread.join();
            Err("the device thread stopped while starting".into())
        }
    }
}

/// The model on the GPU that holds `memory`'s arena; says at start which CUDA libraries
/// it loaded and where its kernels came from.
#[cfg(feature = "cuda")]
fn gpu_engine<'m, 'a>(
    model: &'m Model<'a>,
    memory: &dyn PageMemory,
    batch_tokens: u32,
) -> Result<den_model::gpu::GpuRunner<'m, 'a>, String> {
    let arena = memory
        .device_arena()
        .ok_or_else(|| "the GPU forward pass needs the cuda backend's arena".to_owned())?;
    let rows = usize::try_from(batch_tokens.max(1)).unwrap_or(1);
    let runner = den_model::gpu::GpuRunner::new(model, &arena.ctx, rows)
        .map_err(|e| format!("--backend cuda with a model: {e}"))?;
    tracing::info!(
        device = runner.device_name(),
        kernels = runner.kernels_origin(),
        weight_bytes = runner.weight_bytes(),
        libraries = %den_model::gpu::libraries::describe(runner.libraries()),
        "the model runs on the GPU, its KV in the CUDA page pool"
    );
    Ok(runner)
}

struct Device<'m, 'a> {
    memory: Box<dyn PageMemory>,
    ctx: DeviceContext,
    kv: BTreeMap<ModelFingerprint, SyntheticKv>,
    /// The real model, when the worker serves one (then every operation runs it).
    model: Option<ModelEngine<'m, 'a>>,
    /// What the real model's steps cost, fitted from the steps run.
    fit: scheduler::StepFit,
    /// Restores waiting for their chunks, by job.
    restoring: BTreeMap<u64, Restoring>,
}

/// Why an operation stopped early.
#[derive(Debug, Clone)]
enum Stop {
    Cancelled,
    Failed(String),
}

impl From<PoolError> for Stop {
    fn from(e: PoolError) -> Self {
        Stop::Failed(format!("page pool: {e}"))
    }
}

impl From<MemoryError> for Stop {
    fn from(e: MemoryError) -> Self {
        Stop::Failed(e.to_string())
    }
}

/// A restored chunk whose rows differ from recomputation.
struct Mismatch(String);

impl Device<'_, '_> {
    fn run(&mut self, job: Job) {
        match job {
            Job::Op { job, op, cancel } => {
                // Prefills and decodes go through the batching scheduler, restores
                // through `Job::Restore`: never here.
                self.ctx.queue.start(job);
                let outcome = if cancel.load(Ordering::Relaxed) {
                    failed(op.kind, "cancelled before it started")
                } else {
                    failed(op.kind, "an operation outside the scheduler")
                };
                self.finish(job, &op, outcome);
            }
            Job::Restore {
                job,
                op,
                cancel,
                stop,
            } => self.begin_restore(job, op, cancel, stop),
            Job::Fetched { job, fetched } => self.on_fetched(job, fetched),
            Job::Capture {
                job,
                pages,
                chunks,
                reply,
            } => {
                self.ctx.queue.start(job);
                let result = self.capture(&pages, chunks);
                self.publish_totals();
                self.ctx.queue.finish(job);
                let _ = reply.send(result);
            }
        }
    }

    // ---------------------------------------------------------------------------------
    // Operations
    // ---------------------------------------------------------------------------------

    /// Copy the rows of `chunks` out of `pages` (a leased route snapshot).
    fn capture(
        &mut self,
        pages: &[Page],
        chunks: Vec<ChunkMeta>,
    ) -> Result<Vec<(ChunkMeta, Bytes)>, String> {
        let geometry = self.memory.geometry();
        let pages: Vec<u32> = pages.iter().map(|p| p.0).collect();
        let mut out = Vec::with_capacity(chunks.len());
        for meta in chunks {
            let runs = geometry
                .runs_for(&pages, meta.start, meta.token_count)
                .map_err(|e| e.to_string())?;
            let mut buf = vec![0u8; meta.payload_bytes() as usize];
            self.memory
                .read_runs(&runs, &mut buf)
                .map_err(|e| e.to_string())?;
            out.push((meta, Bytes::from(buf)));
        }
        Ok(out)
    }

    // ---------------------------------------------------------------------------------
    // Pages
    // ---------------------------------------------------------------------------------

    fn ensure_route(&mut self, route: &RouteId) -> Result<(), Stop> {
        let mut pool = self.ctx.pool.lock();
        if pool.route(route).is_none() {
            pool.allocate(route, 0)?;
        }
        Ok(())
    }

    fn route_len(&self, route: &RouteId) -> u32 {
        self.ctx
            .pool
            .lock()
            .route(route)
            .map_or(0, |r| r.token_count())
    }

    /// Scatter a restored chunk into `route`, verifying it against recomputation when
    /// configured. `Ok(Err(_))` is a mismatch: nothing was committed.
    fn scatter(
        &mut self,
        route: &RouteId,
        model: &ModelFingerprint,
        d: &ChunkDescriptor,
        tokens: &[Token],
        payload: &[u8],
    ) -> Result<Result<(), Mismatch>, Stop> {
        let verify = self.verifies_restores();
        let kv = self.kv(model);
        let metrics = Arc::clone(&self.ctx.metrics);
        self.write_append(route, d.start, d.token_count, payload, |memory, runs| {
            if !verify {
                return Ok(());
            }
            let mut back = vec![0u8; payload.len()];
            memory
                .read_runs(runs, &mut back)
                .map_err(|e| Mismatch(format!("reading restored rows back failed: {e}")))?;
            match kv.verify_rows(d.start, tokens, &back) {
                Ok(()) => {
                    metrics.counter_add(
                        "den_restore_verified_total",
                        "Restored chunks read back from pages and found byte-exact.",
                        &[],
                        1.0,
                    );
                    Ok(())
                }
                Err(e) => {
                    metrics.counter_add(
                        "den_restore_mismatch_total",
                        "Restored chunks whose rows differed from recomputation (recomputed instead).",
                        &[],
                        1.0,
                    );
                    Err(Mismatch(e.to_string()))
                }
            }
        })
    }

    /// Writes `rows` as an append of `count` rows at `start` ([`append_with`]), running
    /// `check` on the written runs before committing.
    fn write_append(
        &mut self,
        route: &RouteId,
        start: u32,
        count: u32,
        rows: &[u8],
        check: impl FnOnce(&mut dyn PageMemory, &[RowRun]) -> Result<(), Mismatch>,
    ) -> Result<Result<(), Mismatch>, Stop> {
        append_with(
            &self.ctx.pool,
            self.memory.as_mut(),
            route,
            start,
            count,
            |memory, reservation| {
                let runs = slot_runs(&reservation.slots);
                memory.write_runs(&runs, rows)?;
                Ok(check(memory, &runs))
            },
        )
    }

    fn kv(&mut self, model: &ModelFingerprint) -> SyntheticKv {
        *self
            .kv
            .entry(model.clone())
            .or_insert_with(|| SyntheticKv::new(model))
    }

    fn publish_totals(&self) {
        let totals = *self.memory.totals();
        *self.ctx.totals.lock().unwrap_or_else(|p| p.into_inner()) = totals;
    }
}

/// Spend `d` on this thread (the declared cost of the synthetic engine), in slices so a
/// cancellation is noticed within ~10 ms. False when cancelled.
fn spend(d: Duration, cancel: &AtomicBool) -> bool {
    const SLICE: Duration = Duration::from_millis(10);
    let end = Instant::now() + d;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(SLICE));
    }
}

/// `tokens[start..end]`, or a failure naming the range.
fn token_range(tokens: &[Token], start: u32, end: u32) -> Result<&[Token], Stop> {
    tokens
        .get(start as usize..end as usize)
        .ok_or_else(|| Stop::Failed(format!("token range {start}..{end} is outside the request")))
}

fn stopped(kind: OperationKind, stop: Stop) -> OperationOutcome {
    match stop {
        Stop::Cancelled => failed(kind, "cancelled"),
        Stop::Failed(detail) => failed(kind, &detail),
    }
}

fn failed(kind: OperationKind, detail: &str) -> OperationOutcome {
    OperationOutcome::Failed {
        operation: kind,
        detail: detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spend_stops_when_cancelled() {
        let cancel = AtomicBool::new(true);
        let t0 = Instant::now();
        assert!(!spend(Duration::from_secs(5), &cancel));
        assert!(t0.elapsed() < Duration::from_secs(1));
        assert!(spend(Duration::ZERO, &AtomicBool::new(false)));
    }
}
