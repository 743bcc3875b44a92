//! den's synthetic engine as a simulated worker: one execution queue, one operation at a
//! time, in FIFO order ([`crate::synthetic`] describes the real one).
//!
//! Life of a request:
//! 1. **Dispatch** (the router's decision, instantaneous): the reuse plan is fixed as in
//!    the batched worker (the first `k` blocks, each from the fastest tier holding it);
//!    the request's pages are reserved at once (the real worker reserves them when it
//!    accepts the offer), evicting unpinned cached blocks LRU-first. Its first operation
//!    joins the back of the queue: a restore when part of the prefix is in RAM or on SSD,
//!    else a prefill, else (nothing to compute) the decode.
//! 2. Each operation, when it ends, queues the request's next one at the back: restore →
//!    prefill (the processed prompt — every token but the last — minus the reused ones)
//!    → decode. Whatever other requests queued meanwhile runs in between, as on the real
//!    worker, whose actor starts the next operation only when the previous one reports.
//! 3. **Decode** yields the first token `first_token_ms` after it starts and ends after
//!    `decode_ms_per_token` per further token. At its end the request completes: its
//!    prompt blocks join the GPU cache (unpinned, most recent) and a capture of the
//!    blocks it computed is queued; when the capture ends they are written through to
//!    RAM (the real worker checkpoints every completed route into its tiers).

use std::collections::VecDeque;

use super::{ReqState, Reuse, Shared, Source, Worker, source_of};
use crate::cache::Level;
use crate::cost::{Micros, ms_to_us};
use crate::load::WorkerLoad;
use crate::plan::{EnginePlan, PendingPrefill};
use crate::synthetic::SerialEngine;

/// The kinds of operation on a serial engine's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OpKind {
    Restore,
    Prefill,
    Decode,
    Capture,
}

/// One queued operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Op {
    request: u32,
    kind: OpKind,
    us: Micros,
}

/// The execution queue of a serial worker.
#[derive(Debug, Clone, Default)]
pub(super) struct SerialQueue {
    queued: VecDeque<Op>,
    /// The operation running and when it ends.
    running: Option<(Op, Micros)>,
    /// Requests routed here and not completed.
    live: u32,
    /// Live requests whose first operation has not started.
    waiting: u32,
    /// Live requests decoding now or with their decode queued.
    decoding: u32,
}

impl Worker {
    /// Accepts request `r` (see the module docs); returns the next event if the queue
    /// was idle.
    pub(super) fn serial_dispatch(
        &mut self,
        now: Micros,
        r: u32,
        reuse: Reuse,
        sh: &mut Shared,
        engine: &SerialEngine,
    ) -> Option<Micros> {
        let (workload, cost) = (sh.workload, sh.cost);
        let req = workload.requests.get(r as usize)?;
        let chain = workload.blocks(req);
        // The pending (last) prompt token is never cached, so neither is the last block.
        let cap = chain.len().saturating_sub(1) as u32;
        let want = match reuse {
            Reuse::Longest => cap,
            Reuse::Blocks(n) => n.min(cap),
        };
        let mut st = ReqState {
            worker: self.index,
            ..ReqState::default()
        };
        let mut restore_us: Micros = 0;
        for &b in chain.iter().take(want as usize) {
            let Some(source) = source_of(&self.cache, &sh.published_at, now, b) else {
                break;
            };
            let bytes = sh.block_bytes(b);
            match source {
                Source::Gpu => {
                    self.cache.pin(Level::Gpu, b);
                    st.gpu_hits += 1;
                }
                Source::Ram | Source::Ssd | Source::Object => {
                    let fetch = match source {
                        Source::Ssd => {
                            self.cache.traffic.ssd_read_bytes += bytes;
                            cost.nvme_us(bytes)
                        }
                        Source::Object => {
                            self.cache.traffic.object_read_bytes += bytes;
                            cost.object_us(bytes).unwrap_or(0)
                        }
                        _ => 0,
                    };
                    let pinned = source == Source::Ram;
                    if pinned {
                        self.cache.pin(Level::Ram, b);
                    }
                    self.cache.traffic.ram_to_gpu_bytes += bytes;
                    restore_us += fetch + cost.pcie_us(bytes) + ms_to_us(engine.restore_chunk_ms);
                    st.restore.push((b, pinned));
                }
            }
            let tokens = workload.block_tokens(b);
            st.reused_blocks += 1;
            st.reused_tokens += tokens;
            if let Some(t) = st.source_tokens.get_mut(source.index()) {
                *t += tokens;
            }
        }
        let block = cost.block_tokens.max(1);
        st.total_blocks = (req.input_tokens + req.output_tokens)
            .div_ceil(block)
            .max(chain.len() as u32);
        // Pages for everything not resident, reserved now.
        let need = st.total_blocks.saturating_sub(st.gpu_hits);
        let used = self.cache.gpu_len() + self.private_blocks;
        let free = self.cache.gpu_capacity().saturating_sub(used);
        if need > free {
            let bytes_of = |x: u32| sh.block_bytes(x);
            let evicted = self.cache.evict_gpu(need - free, &bytes_of);
            if evicted < need - free {
                // Pinned by running requests: the real worker would decline; the
                // policies saw the pool full and routed here anyway. Counted.
                sh.overcommits += 1;
            }
        }
        self.private_blocks += need;
        self.active_blocks += st.total_blocks;
        self.routed += 1;
        let prefill = prefill_tokens(req.input_tokens, st.reused_tokens);
        self.pending_prefill_tokens += prefill as u64;
        st.prefilled = st.reused_tokens;
        let first = if !st.restore.is_empty() {
            Op {
                request: r,
                kind: OpKind::Restore,
                us: restore_us,
            }
        } else if prefill > 0 {
            prefill_op(r, prefill, engine)
        } else {
            decode_op(r, req.output_tokens, engine)
        };
        if first.kind == OpKind::Decode {
            self.serial.decoding += 1;
        }
        if let Some(slot) = sh.reqs.get_mut(r as usize) {
            *slot = st;
        }
        self.serial.live += 1;
        self.serial.waiting += 1;
        self.serial.queued.push_back(first);
        if self.serial.running.is_some() {
            None
        } else {
            self.serial_start(now, sh, engine)
        }
    }

    /// The running operation ended at `now`: apply it, queue the request's next one,
    /// start the next queued operation.
    pub(super) fn serial_event(
        &mut self,
        now: Micros,
        sh: &mut Shared,
        engine: &SerialEngine,
    ) -> Option<Micros> {
        if let Some((op, _)) = self.serial.running.take() {
            self.serial_finish(now, op, sh, engine);
        }
        self.serial_start(now, sh, engine)
    }

    /// What a router observes: the queue's predicted remaining work, what is live, the
    /// pool.
    pub(super) fn serial_load(
        &self,
        now: Micros,
        sh: &Shared,
        engine: &SerialEngine,
    ) -> WorkerLoad {
        let q = &self.serial;
        let remaining = q.running.map_or(0, |(_, end)| end.saturating_sub(now));
        let queued: Micros = q.queued.iter().map(|o| o.us).sum();
        // What the live requests will still queue, as den's worker counts it.
        let future: Micros = q
            .running
            .iter()
            .map(|(o, _)| o)
            .chain(&q.queued)
            .map(|o| still_to_queue(o, sh, engine))
            .sum();
        let capacity = self.cache.gpu_capacity();
        let used = self.cache.gpu_len() + self.private_blocks;
        let mut pending = Vec::new();
        for op in q.running.iter().map(|(o, _)| o).chain(&q.queued) {
            if matches!(op.kind, OpKind::Restore | OpKind::Prefill)
                && let (Some(st), Some(req)) = (
                    sh.reqs.get(op.request as usize),
                    sh.workload.requests.get(op.request as usize),
                )
            {
                pending.push(PendingPrefill {
                    ready_in_ms: 0.0,
                    done_tokens: st.prefilled,
                    input_tokens: req.input_tokens,
                });
            }
        }
        let pending_ms = self.pending_prefill_tokens as f64 * engine.prefill_ms_per_token;
        WorkerLoad {
            waiting: q.waiting,
            running: q.live.saturating_sub(q.waiting),
            pending_prefill_tokens: self.pending_prefill_tokens,
            pending_prefill_model_ms: pending_ms,
            prefill_calibration: 1.0,
            active_blocks: self.active_blocks,
            capacity_blocks: capacity,
            free_blocks: capacity.saturating_sub(used),
            evictable_blocks: self.cache.gpu_evictable(),
            prefill_ms_per_token: engine.prefill_ms_per_token,
            // The candidate's first-token cost: the decode operation's first token.
            decode_step_ms: engine.first_token_ms,
            step_remaining_ms: remaining as f64 / 1e3,
            plan: EnginePlan {
                max_batched_tokens: sh.cost.max_batched_tokens,
                costs: sh.cost.step_costs(),
                pending,
                decoding: q.decoding,
                decode_context_tokens: 0,
                step_remaining_ms: remaining as f64 / 1e3,
                step_calibration: 1.0,
            },
            queue_ms: (remaining + queued + future) as f64 / 1e3,
            ..WorkerLoad::default()
        }
    }

    fn serial_start(
        &mut self,
        now: Micros,
        sh: &mut Shared,
        engine: &SerialEngine,
    ) -> Option<Micros> {
        let op = self.serial.queued.pop_front()?;
        let end = now + op.us;
        self.busy_us += op.us;
        if let Some(st) = sh.reqs.get_mut(op.request as usize) {
            if st.started.is_none() {
                st.started = Some(now);
                self.serial.waiting = self.serial.waiting.saturating_sub(1);
            }
            if op.kind == OpKind::Decode {
                st.first_token = now + ms_to_us(engine.first_token_ms);
            }
        }
        self.serial.running = Some((op, end));
        Some(end)
    }

    fn serial_finish(&mut self, now: Micros, op: Op, sh: &mut Shared, engine: &SerialEngine) {
        let (workload, cost) = (sh.workload, sh.cost);
        let r = op.request;
        let Some(req) = workload.requests.get(r as usize) else {
            return;
        };
        let (input, output) = (req.input_tokens, req.output_tokens);
        let chain = workload.blocks(req);
        let Some(st) = sh.reqs.get_mut(r as usize) else {
            return;
        };
        let next = match op.kind {
            OpKind::Restore => {
                for &(b, pinned) in &st.restore {
                    if pinned {
                        self.cache.unpin(Level::Ram, b);
                    }
                }
                st.ready = now;
                let prefill = prefill_tokens(input, st.reused_tokens);
                Some(if prefill > 0 {
                    prefill_op(r, prefill, engine)
                } else {
                    decode_op(r, output, engine)
                })
            }
            OpKind::Prefill => {
                let computed = prefill_tokens(input, st.reused_tokens);
                self.pending_prefill_tokens =
                    self.pending_prefill_tokens.saturating_sub(computed as u64);
                st.prefilled = st.reused_tokens + computed;
                st.prefill_us += op.us as f64;
                Some(decode_op(r, output, engine))
            }
            OpKind::Decode => {
                st.done = now;
                self.changes += 1;
                let need = st.total_blocks.saturating_sub(st.gpu_hits);
                let total = st.total_blocks;
                let first_new = st.reused_blocks as usize;
                self.private_blocks = self.private_blocks.saturating_sub(need);
                self.active_blocks = self.active_blocks.saturating_sub(total);
                self.serial.live = self.serial.live.saturating_sub(1);
                self.serial.decoding = self.serial.decoding.saturating_sub(1);
                // The route's prompt blocks join the cache: resident hits were pinned at
                // dispatch; the rest (restored or computed) move from the reservation.
                for (i, &b) in chain.iter().enumerate() {
                    let hit = i < first_new && !st.restore.iter().any(|&(x, _)| x == b);
                    if !hit {
                        self.cache.insert_gpu_pinned(b);
                    }
                }
                // Leaf first, so the root ends up hottest (as in the batched worker).
                for &b in chain.iter().rev() {
                    self.cache.unpin(Level::Gpu, b);
                }
                let bytes: u64 = chain
                    .iter()
                    .skip(first_new)
                    .map(|&b| cost.kv_bytes(workload.block_tokens(b) as u64))
                    .sum();
                let tiers = cost.ram_blocks > 0 || cost.ssd_blocks > 0;
                (bytes > 0 && tiers).then(|| Op {
                    request: r,
                    kind: OpKind::Capture,
                    us: engine.capture_us(bytes),
                })
            }
            OpKind::Capture => {
                self.changes += 1;
                let first_new = st.reused_blocks as usize;
                let bytes_of = |x: u32| cost.kv_bytes(workload.block_tokens(x) as u64);
                for &b in chain.iter().skip(first_new) {
                    if self.cache.ram_capacity() > 0 {
                        if !self.cache.has(Level::Ram, b) {
                            self.cache.traffic.gpu_to_ram_bytes += bytes_of(b);
                        }
                        self.cache.insert_ram(b, &bytes_of);
                    } else {
                        self.cache.insert_ssd(b);
                    }
                }
                None
            }
        };
        if let Some(next) = next {
            if next.kind == OpKind::Decode {
                self.serial.decoding += 1;
            }
            self.serial.queued.push_back(next);
        }
    }
}

/// Prompt tokens a request computes: the processed prompt (all but the pending last
/// token) minus the reused ones.
/// The declared cost of the operations `op`'s request queues after it: a restore is
/// followed by its prefill (if any tokens are missing) and its decode, a prefill by its
/// decode.
fn still_to_queue(op: &Op, sh: &Shared, engine: &SerialEngine) -> Micros {
    let (Some(st), Some(req)) = (
        sh.reqs.get(op.request as usize),
        sh.workload.requests.get(op.request as usize),
    ) else {
        return 0;
    };
    let decode = decode_op(op.request, req.output_tokens, engine).us;
    match op.kind {
        OpKind::Restore => {
            let tokens = prefill_tokens(req.input_tokens, st.reused_tokens);
            let prefill = if tokens > 0 {
                prefill_op(op.request, tokens, engine).us
            } else {
                0
            };
            prefill + decode
        }
        OpKind::Prefill => decode,
        OpKind::Decode | OpKind::Capture => 0,
    }
}

fn prefill_tokens(input: u32, reused: u32) -> u32 {
    input.saturating_sub(1).saturating_sub(reused)
}

fn prefill_op(request: u32, tokens: u32, engine: &SerialEngine) -> Op {
    Op {
        request,
        kind: OpKind::Prefill,
        us: ms_to_us(tokens as f64 * engine.prefill_ms_per_token),
    }
}

fn decode_op(request: u32, output: u32, engine: &SerialEngine) -> Op {
    Op {
        request,
        kind: OpKind::Decode,
        us: ms_to_us(engine.decode_ms(output)),
    }
}
