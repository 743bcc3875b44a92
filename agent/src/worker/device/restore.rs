//! Restores on the device thread: a route's exact chunk chain, fetched off this thread
//! (`worker::fetch`), written into the route's pages between steps.
//!
//! The synthetic engine's chunks, when `verify_restores` asks for it, are written one at
//! a time as they arrive, each read back and compared with recomputation. Every other
//! restore's chunks (a real model's are checked by the hash their tier stored, during the
//! fetch) are gathered instead: before each step every chunk that arrived since the last
//! write goes into the pages as one append, its payloads handed over where they lie
//! ([`crate::memory::PageMemory::start_write`]: on a GPU the copies stay in flight on the
//! memory's stream while the step computes on the model's), and after the step the write
//! is settled and the append committed. A restore of many chunks thus moves in a few large
//! copies that overlap compute, instead of one small synchronous copy per chunk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use den_protocol::candidate::Tier;
use den_protocol::chunk::ChunkDescriptor;
use den_protocol::worker::{Operation, OperationKind, OperationOutcome, Work};

use super::{Device, DeviceEvent, Mismatch, PendingAppend, Stop, failed, slot_runs, spend};
use super::{stopped, token_range};
use crate::memory::Gathered;
use crate::worker::fetch::Fetched;
use crate::worker::store::BadReplica;

/// A restore between its start and its last chunk.
pub(super) struct Restoring {
    op: Operation,
    cancel: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    /// Tokens the route holds so far (committed).
    restored: u32,
    /// Gathered chunks not written yet, continuing the chain after `writing`.
    ready: Vec<Fetched>,
    /// The append whose rows are on their way into the pages.
    writing: Option<Writing>,
    /// No chunk will follow: the fetch ended, or the chain broke.
    ended: bool,
}

/// Chunks in flight to the pages, as one append.
struct Writing {
    append: PendingAppend,
    chunks: Vec<(ChunkDescriptor, Tier)>,
}

impl Writing {
    fn tokens(&self) -> u32 {
        self.chunks.iter().map(|(d, _)| d.token_count).sum()
    }
}

impl Restoring {
    /// Where the next chunk must start to continue the chain.
    fn next_start(&self) -> u32 {
        let writing = self.writing.as_ref().map_or(0, Writing::tokens);
        let ready: u32 = self.ready.iter().map(|f| f.descriptor.token_count).sum();
        self.restored + writing + ready
    }
}

impl Device<'_, '_> {
    /// Whether each restored chunk is read back and compared with recomputation: the
    /// synthetic engine's with `verify_restores`. Real KV is checked by the hash its tier
    /// stored (the fetch did): recomputation would not reproduce it bit for bit.
    pub(super) fn verifies_restores(&self) -> bool {
        self.ctx.config.verify_restores && self.model.is_none()
    }

    /// A restore of the candidate's exact chunk chain begins (spec §3.9, §4.7): its route
    /// is made ready and its chunks are written as their fetches deliver them
    /// ([`super::Job::Fetched`]), between steps.
    pub(super) fn begin_restore(
        &mut self,
        job: u64,
        op: Operation,
        cancel: Arc<AtomicBool>,
        stop: Arc<AtomicBool>,
    ) {
        self.ctx.queue.start(job);
        if cancel.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
            return self.finish(job, &op, failed(op.kind, "cancelled before it started"));
        }
        if let Err(e) = self.ensure_route(&op.work.route) {
            stop.store(true, Ordering::Relaxed);
            return self.finish(job, &op, stopped(op.kind, e));
        }
        let restored = self.route_len(&op.work.route);
        self.restoring.insert(
            job,
            Restoring {
                op,
                cancel,
                stop,
                restored,
                ready: Vec::new(),
                writing: None,
                ended: false,
            },
        );
    }

    /// The next chunk of restore `job` arrived (`None`: its fetch ended).
    pub(super) fn on_fetched(&mut self, job: u64, fetched: Option<Fetched>) {
        // Chunks checked one by one are written one by one; the rest are gathered.
        if !self.verifies_restores() {
            return self.gather(job, fetched);
        }
        let Some(mut r) = self.restoring.remove(&job) else {
            return; // a restore that already ended
        };
        let restored = |tokens| OperationOutcome::Restored {
            cached_token_count: Some(tokens),
        };
        let outcome = match fetched {
            _ if r.cancel.load(Ordering::Relaxed) => failed(OperationKind::Restore, "cancelled"),
            None => restored(r.restored),
            Some(f) => match self.place(&r.op.work, &f, r.restored, &r.cancel) {
                Ok(true) => {
                    r.restored = f.descriptor.end();
                    self.restoring.insert(job, r);
                    return;
                }
                // The chain broke here: what is restored stands, the rest is recomputed.
                Ok(false) => restored(r.restored),
                Err(stop) => stopped(OperationKind::Restore, stop),
            },
        };
        r.stop.store(true, Ordering::Relaxed);
        self.finish(job, &r.op, outcome);
    }

    /// Keeps a real model's fetched chunk for the next write ([`Device::start_restores`]).
    fn gather(&mut self, job: u64, fetched: Option<Fetched>) {
        let delay = self.ctx.faults.restore_delay_ms();
        let Some(r) = self.restoring.get_mut(&job) else {
            return; // a restore that already ended
        };
        let Some(f) = fetched else {
            r.ended = true;
            return;
        };
        if r.ended || r.cancel.load(Ordering::Relaxed) {
            return;
        }
        if delay > 0 && !spend(Duration::from_millis(delay), &r.cancel) {
            return; // cancelled: settled as such after the step
        }
        if f.descriptor.start == r.next_start() {
            r.ready.push(f);
        } else {
            // The chain broke here: what is restored stands, the rest is recomputed.
            r.ended = true;
            r.stop.store(true, Ordering::Relaxed);
        }
    }

    /// Starts writing every restore's gathered chunks into its pages, one append each
    /// (before a step: the copies overlap it where the memory allows).
    pub(super) fn start_restores(&mut self) {
        let jobs: Vec<u64> = self
            .restoring
            .iter()
            .filter(|(_, r)| {
                r.writing.is_none() && !r.ready.is_empty() && !r.cancel.load(Ordering::Relaxed)
            })
            .map(|(job, _)| *job)
            .collect();
        for job in jobs {
            let Some(mut r) = self.restoring.remove(&job) else {
                continue;
            };
            match self.start_write(&mut r) {
                Ok(()) => {
                    self.restoring.insert(job, r);
                }
                Err(stop) => {
                    r.stop.store(true, Ordering::Relaxed);
                    self.finish(job, &r.op, stopped(OperationKind::Restore, stop));
                }
            }
        }
    }

    fn start_write(&mut self, r: &mut Restoring) -> Result<(), Stop> {
        let chunks = std::mem::take(&mut r.ready);
        let count: u32 = chunks.iter().map(|f| f.descriptor.token_count).sum();
        let pool = &self.ctx.pool;
        let append = PendingAppend::begin(
            pool,
            self.memory.as_mut(),
            &r.op.work.route,
            r.restored,
            count,
        )?;
        // The payloads as they lie: the memory gathers them (into the GPU's staging, or
        // straight into host pages), no joined copy.
        let payloads: Vec<&[u8]> = chunks.iter().map(|f| &f.chunk.payload[..]).collect();
        let runs = slot_runs(&append.reservation.slots);
        if let Err(e) = self.memory.start_write(&runs, Gathered(&payloads)) {
            append.abort(pool);
            return Err(e.into());
        }
        r.writing = Some(Writing {
            append,
            chunks: chunks.into_iter().map(|f| (f.descriptor, f.tier)).collect(),
        });
        Ok(())
    }

    /// Waits for the writes [`Device::start_restores`] left in flight, commits their
    /// appends, and ends the restores with nothing more to come.
    pub(super) fn settle_restores(&mut self) {
        // Only restores with a write in flight or nothing more to come: one waiting for
        // its next chunk is left alone (this runs after every step).
        let jobs: Vec<u64> = self
            .restoring
            .iter()
            .filter(|(_, r)| r.writing.is_some() || r.ended || r.cancel.load(Ordering::Relaxed))
            .map(|(job, _)| *job)
            .collect();
        if jobs.is_empty() {
            return;
        }
        let settled = self.memory.settle().map_err(|e| e.to_string());
        for job in jobs {
            let Some(mut r) = self.restoring.remove(&job) else {
                continue;
            };
            let cancelled = r.cancel.load(Ordering::Relaxed);
            let mut outcome = None;
            if let Some(w) = r.writing.take() {
                let tokens = w.tokens();
                match &settled {
                    Err(e) => {
                        w.append.abort(&self.ctx.pool);
                        outcome = Some(stopped(OperationKind::Restore, Stop::Failed(e.clone())));
                    }
                    Ok(_) if cancelled => w.append.abort(&self.ctx.pool),
                    Ok(_) => match w.append.commit(&self.ctx.pool) {
                        Ok(()) => {
                            r.restored += tokens;
                            for (d, tier) in &w.chunks {
                                self.count_restored(d, *tier);
                            }
                        }
                        Err(stop) => outcome = Some(stopped(OperationKind::Restore, stop)),
                    },
                }
            }
            let outcome = outcome.or_else(|| {
                if cancelled {
                    Some(failed(OperationKind::Restore, "cancelled"))
                } else if r.ended && r.ready.is_empty() {
                    Some(OperationOutcome::Restored {
                        cached_token_count: Some(r.restored),
                    })
                } else {
                    None
                }
            });
            match outcome {
                Some(outcome) => {
                    r.stop.store(true, Ordering::Relaxed);
                    self.finish(job, &r.op, outcome);
                }
                None => {
                    self.restoring.insert(job, r);
                }
            }
        }
    }

    fn count_restored(&self, d: &ChunkDescriptor, tier: Tier) {
        let t = tier.as_str();
        self.ctx.metrics.counter_add(
            "den_restored_tokens_total",
            "Prefix tokens restored from a storage tier into pages.",
            &[("tier", t)],
            d.token_count as f64,
        );
        self.ctx.metrics.counter_add(
            "den_restored_chunks_total",
            "Chunks restored from a storage tier into pages.",
            &[("tier", t)],
            1.0,
        );
    }

    /// Scatters one fetched chunk after the `restored` tokens of the route; false when it
    /// does not continue the chain there or its rows mismatch (then reported).
    fn place(
        &mut self,
        work: &Work,
        f: &Fetched,
        restored: u32,
        cancel: &AtomicBool,
    ) -> Result<bool, Stop> {
        let request = &work.request;
        let d = &f.descriptor;
        if d.start != restored {
            return Ok(false);
        }
        let delay = self.ctx.faults.restore_delay_ms();
        if delay > 0 && !spend(Duration::from_millis(delay), cancel) {
            return Err(Stop::Cancelled);
        }
        let tokens = token_range(&request.tokens, d.start, d.end())?;
        match self.scatter(&work.route, &request.model, d, tokens, &f.chunk.payload)? {
            Ok(()) => {
                self.count_restored(d, f.tier);
                Ok(true)
            }
            Err(Mismatch(detail)) => {
                tracing::error!(chunk = %d.hash, tier = f.tier.as_str(), "{detail}");
                let bad = BadReplica::corrupt(&request.model, d.hash, f.tier);
                let _ = self.ctx.events.send(DeviceEvent::BadReplica(bad));
                Ok(false)
            }
        }
    }
}
