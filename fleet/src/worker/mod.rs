//! One simulated worker: a vLLM-V1-style engine with continuous batching, chunked
//! prefill, a paged KV pool with prefix caching, and the host/SSD/object tiers.
//!
//! Life of a request on a worker:
//! 1. **Dispatch** (the router's decision, instantaneous): the reuse plan is fixed — the
//!    first `k` prompt blocks, each from the fastest tier holding it. GPU blocks are
//!    pinned; SSD and object blocks start loading into host RAM at once (prefetch while
//!    queued, as SGLang HiCache and den's worker do) on the worker's NVMe or NIC link.
//! 2. **Admission** (FCFS, at a step boundary): when the pool can hold the whole request
//!    (prompt + output blocks, evicting unpinned cached blocks LRU-first), blocks staged
//!    in RAM are restored to the GPU over PCIe once their fetch is done.
//! 3. **Prefill**: once restored, the request takes its share of each step's 8,192-token
//!    budget in FCFS order. The step that finishes its prompt yields the first token.
//! 4. **Decode**: one token per step until `output_length` tokens; then its blocks are
//!    unpinned (most recently used) and its output blocks freed.
//!
//! A step's duration comes from [`CostModel::step_us`]. Time is integer microseconds.
//! What a router observes of a worker is built in `observe`.
//!
//! With [`CostModel::synthetic`] set the worker is den's synthetic engine on den's own
//! batching scheduler ([`super::synthetic`]): it prefills the processed prompt (every
//! token but the last), the last token is the row of the decode step that yields the
//! first token (charged [`den_protocol::engine_plan::StepCosts::step_us_with_first`]), prompt rows get at least
//! [`MIN_PROMPT_ROWS`] of a step however many decode ([`prompt_room`]), and a completed request's computed
//! blocks are checkpointed into the RAM tier (else SSD).

mod caching;
mod observe;

pub(crate) use caching::{durable_source_of, source_of};

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use super::cache::{BlockCache, Level};
use super::cost::{CostModel, Micros, positions};
use super::link::Link;
use super::trace::Workload;
use den_protocol::calibration::Ewma;
#[cfg(doc)]
use den_protocol::engine_plan::MIN_PROMPT_ROWS;
use den_protocol::engine_plan::prompt_room;

/// Where a reused block came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Source {
    Gpu,
    Ram,
    Ssd,
    Object,
}

impl Source {
    pub(crate) fn index(self) -> usize {
        match self {
            Source::Gpu => 0,
            Source::Ram => 1,
            Source::Ssd => 2,
            Source::Object => 3,
        }
    }
}

/// How much of its cached prefix a dispatched request reuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Every leading block the worker can find in any tier (what LMCache, HiCache and
    /// Dynamo KVBM do: load whatever hits).
    Longest,
    /// Exactly the first `n` blocks (a router that priced the alternatives chose them).
    Blocks(u32),
    /// Exactly the first `blocks` blocks, the first `resident` as they are on the GPU and
    /// the rest restored from a lower tier even when also resident: what den's worker
    /// does with a lower-tier alternative (it forks the resident head it names and
    /// restores the rest). The block cache still holds one copy of each.
    Restore { resident: u32, blocks: u32 },
}

/// Per-request simulation state.
#[derive(Debug, Clone, Default)]
pub(crate) struct ReqState {
    pub worker: u32,
    pub reused_blocks: u32,
    pub reused_tokens: u32,
    /// Reused tokens by [`Source::index`].
    pub source_tokens: [u32; 4],
    pub gpu_hits: u32,
    /// Blocks to restore at admission, and whether each holds a RAM pin.
    pub restore: Vec<(u32, bool)>,
    pub fetch_ready: Micros,
    pub gpu_wait: Micros,
    pub ready: Micros,
    pub prefilled: u32,
    pub prefill_us: f64,
    /// When its first prefill chunk was scheduled.
    pub started: Option<Micros>,
    pub first_token: Micros,
    pub done: Micros,
    pub total_blocks: u32,
}

/// Everything the workers share: the workload, costs, request states, the object store.
pub(crate) struct Shared<'a> {
    pub workload: &'a Workload,
    pub cost: &'a CostModel,
    pub reqs: Vec<ReqState>,
    /// When each block's upload finished (`Micros::MAX`: never uploaded).
    pub published_at: Vec<Micros>,
    pub overcommits: u64,
}

impl Shared<'_> {
    pub fn block_bytes(&self, b: u32) -> u64 {
        self.cost.kv_bytes(self.workload.block_tokens(b) as u64)
    }
}

#[derive(Debug, Clone)]
struct Step {
    end: Micros,
    duration: Micros,
    /// What the cost model says this step takes (µs, before rounding up to 1).
    modelled: f64,
    chunks: Vec<(u32, u32)>,
    decoding: u32,
    prefill_tokens: u32,
    /// Synthetic engine: the requests whose first token this step yields.
    firsts: Vec<u32>,
}

/// One simulated worker.
#[derive(Debug, Clone)]
pub(crate) struct Worker {
    index: u32,
    pub cache: BlockCache,
    private_blocks: u32,
    waiting: VecDeque<u32>,
    prefilling: VecDeque<u32>,
    decoding: BinaryHeap<Reverse<(u64, u32)>>,
    decode_context: u64,
    step: Option<Step>,
    steps: u64,
    gpu_ready: HashMap<u32, Micros>,
    pcie: Link,
    nvme: Link,
    nic_down: Link,
    nic_up: Link,
    pending_prefill_tokens: u64,
    active_blocks: u32,
    pub routed: u32,
    pub busy_us: u64,
    /// Counts changes a router learns of at once (a completion, a stored checkpoint):
    /// each triggers an eager heartbeat when observations are heartbeat-lagged.
    pub changes: u64,
    /// Requests completed since the replay last took them (a heartbeat-lagged router
    /// stops counting their work: `Unreflected::ended`).
    pub finished: Vec<u32>,
    prefill_ms_per_token: Ewma,
    prefill_calibration: Ewma,
    /// Measured / modelled duration per engine step. The simulated steps take exactly
    /// what the cost model says, so this stays 1 here; a real worker measures it.
    step_calibration: Ewma,
    decode_step_ms: Ewma,
    output_tokens: Ewma,
    seed_prefill_ms_per_token: f64,
    seed_decode_step_ms: f64,
    /// Synthetic engine: filled requests whose first-token row the next step runs.
    firsts: Vec<u32>,
}

impl Worker {
    pub fn new(index: u32, workload: &Workload, cost: &CostModel) -> Worker {
        // Calibration seeds, before the first measurement: an idle prefill of a 4k
        // prompt and an idle decode step (what a benchmark run at start-up would give).
        let seed_prefill = cost.solo_prefill_ms(0, 4096) / 4096.0;
        let seed_decode = cost.step_us(0, 0.0, 1, 4096) as f64 / 1000.0;
        Worker {
            index,
            cache: BlockCache::new(
                workload.block_count(),
                cost.gpu_kv_blocks,
                cost.ram_blocks,
                cost.ssd_blocks,
            ),
            private_blocks: 0,
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            decoding: BinaryHeap::new(),
            decode_context: 0,
            step: None,
            steps: 0,
            gpu_ready: HashMap::new(),
            pcie: Link::default(),
            nvme: Link::default(),
            nic_down: Link::default(),
            nic_up: Link::default(),
            pending_prefill_tokens: 0,
            active_blocks: 0,
            routed: 0,
            busy_us: 0,
            changes: 0,
            finished: Vec::new(),
            prefill_ms_per_token: Ewma::default(),
            prefill_calibration: Ewma::default(),
            step_calibration: Ewma::default(),
            output_tokens: Ewma::new(0.05),
            decode_step_ms: Ewma::default(),
            seed_prefill_ms_per_token: seed_prefill,
            seed_decode_step_ms: seed_decode,
            firsts: Vec::new(),
        }
    }

    /// Accepts request `r` at `now` with reuse plan `reuse`. Returns the worker's next
    /// event time if it was idle (a step started or a wake-up was set).
    pub fn dispatch(
        &mut self,
        now: Micros,
        r: u32,
        reuse: Reuse,
        sh: &mut Shared,
    ) -> Option<Micros> {
        let req = sh.workload.requests.get(r as usize)?;
        let chain = sh.workload.blocks(req);
        // The last block is always recomputed: the engine needs the logits of the last
        // prompt token (vLLM caps a full hit at `prompt - 1` tokens, block-aligned).
        let cap = chain.len().saturating_sub(1) as u32;
        let want = match reuse {
            Reuse::Longest => cap,
            Reuse::Blocks(n) | Reuse::Restore { blocks: n, .. } => n.min(cap),
        };
        let head = match reuse {
            Reuse::Restore { resident, .. } => Some(resident),
            _ => None,
        };
        let mut st = ReqState {
            worker: self.index,
            ..ReqState::default()
        };
        let (mut ssd_bytes, mut object_bytes) = (0u64, 0u64);
        let mut gpu_wait = now;
        for (i, &b) in chain.iter().take(want as usize).enumerate() {
            let source = match head {
                Some(h) if i as u32 >= h => {
                    durable_source_of(&self.cache, &sh.published_at, now, b)
                }
                Some(_) => {
                    source_of(&self.cache, &sh.published_at, now, b).filter(|s| *s == Source::Gpu)
                }
                None => source_of(&self.cache, &sh.published_at, now, b),
            };
            let Some(source) = source else {
                break;
            };
            let bytes = sh.block_bytes(b);
            match source {
                Source::Gpu => {
                    self.cache.pin(Level::Gpu, b);
                    st.gpu_hits += 1;
                    if let Some(&t) = self.gpu_ready.get(&b) {
                        gpu_wait = gpu_wait.max(t);
                    }
                }
                Source::Ram => {
                    self.cache.pin(Level::Ram, b);
                    st.restore.push((b, true));
                }
                Source::Ssd | Source::Object => {
                    if source == Source::Ssd {
                        ssd_bytes += bytes;
                        self.cache.traffic.ssd_read_bytes += bytes;
                    } else {
                        object_bytes += bytes;
                        self.cache.traffic.object_read_bytes += bytes;
                    }
                    let bytes_of = |x: u32| sh.block_bytes(x);
                    let staged = self.cache.insert_ram(b, &bytes_of);
                    if staged {
                        self.cache.pin(Level::Ram, b);
                    }
                    st.restore.push((b, staged));
                }
            }
            let tokens = sh.workload.block_tokens(b);
            st.reused_blocks += 1;
            st.reused_tokens += tokens;
            if let Some(t) = st.source_tokens.get_mut(source.index()) {
                *t += tokens;
            }
        }
        let mut fetch_ready = now;
        if ssd_bytes > 0 {
            fetch_ready = fetch_ready.max(self.nvme.reserve(now, sh.cost.nvme_us(ssd_bytes)));
        }
        if object_bytes > 0 {
            let duration = sh.cost.object_us(object_bytes).unwrap_or(0);
            fetch_ready = fetch_ready.max(self.nic_down.reserve(now, duration));
        }
        st.fetch_ready = fetch_ready;
        st.gpu_wait = gpu_wait;
        st.prefilled = st.reused_tokens;
        let block = sh.cost.block_tokens.max(1);
        st.total_blocks = (req.input_tokens + req.output_tokens)
            .div_ceil(block)
            .max(chain.len() as u32);
        self.pending_prefill_tokens += sh
            .cost
            .prompt_rows(req.input_tokens)
            .saturating_sub(st.reused_tokens) as u64;
        self.active_blocks += st.total_blocks;
        self.routed += 1;
        if let Some(slot) = sh.reqs.get_mut(r as usize) {
            *slot = st;
        }
        self.waiting.push_back(r);
        if self.step.is_some() {
            None
        } else {
            self.start_step(now, sh)
        }
    }

    /// Handles this worker's event at `now` (a step end or a wake-up) and returns the
    /// next one.
    pub fn on_event(&mut self, now: Micros, sh: &mut Shared) -> Option<Micros> {
        if let Some(step) = self.step.take() {
            self.finish_step(now, step, sh);
        }
        self.start_step(now, sh)
    }

    fn start_step(&mut self, now: Micros, sh: &mut Shared) -> Option<Micros> {
        self.admit(now, sh);
        self.fill_reused(now, sh);
        let firsts = std::mem::take(&mut self.firsts);
        let decoding = (self.decoding.len() + firsts.len()) as u32;
        let max = sh.cost.max_batched_tokens;
        let mut budget = if sh.cost.synthetic.is_some() {
            prompt_room(max, decoding)
        } else {
            max.saturating_sub(decoding)
        };
        let mut chunks = Vec::new();
        let mut attention = 0.0;
        let mut prefill_tokens = 0u32;
        let mut wake: Option<Micros> = None;
        for &r in &self.prefilling {
            let Some(st) = sh.reqs.get(r as usize) else {
                continue;
            };
            if st.ready > now {
                wake = Some(wake.map_or(st.ready, |w| w.min(st.ready)));
                continue;
            }
            if budget == 0 {
                break;
            }
            let input = sh
                .workload
                .requests
                .get(r as usize)
                .map_or(0, |q| q.input_tokens);
            let take = budget.min(sh.cost.prompt_rows(input).saturating_sub(st.prefilled));
            if take == 0 {
                continue;
            }
            attention += positions(st.prefilled, st.prefilled + take);
            chunks.push((r, take));
            prefill_tokens += take;
            budget -= take;
        }
        if chunks.is_empty() && decoding == 0 {
            return wake;
        }
        let first_token = !firsts.is_empty();
        for &(r, _) in &chunks {
            if let Some(st) = sh.reqs.get_mut(r as usize) {
                st.started.get_or_insert(now);
            }
        }
        let duration = sh.cost.step_costs().step_us_with_first(
            prefill_tokens as u64,
            attention,
            decoding as u64,
            self.decode_context,
            first_token,
        );
        let modelled = duration as f64;
        let duration = duration.max(1);
        self.busy_us += duration;
        let end = now + duration;
        self.step = Some(Step {
            end,
            duration,
            modelled,
            chunks,
            decoding,
            prefill_tokens,
            firsts,
        });
        Some(end)
    }

    /// Admits waiting requests FCFS while the pool and the running limit allow.
    fn admit(&mut self, now: Micros, sh: &mut Shared) {
        while let Some(&r) = self.waiting.front() {
            let running = self.prefilling.len() + self.decoding.len();
            if running as u32 >= sh.cost.max_running {
                return;
            }
            let Some(st) = sh.reqs.get(r as usize) else {
                self.waiting.pop_front();
                continue;
            };
            let need = st.total_blocks.saturating_sub(st.gpu_hits);
            let capacity = self.cache.gpu_capacity();
            let free = capacity.saturating_sub(self.cache.gpu_len() + self.private_blocks);
            let evictable = self.cache.gpu_evictable();
            if need > free + evictable {
                let idle = running == 0 && self.step.is_none();
                if !idle {
                    return;
                }
                // Nothing runs that could free blocks: admit over capacity rather than
                // deadlock (pins held by queued plans); counted, should be rare.
                sh.overcommits += 1;
            }
            if need > free {
                let bytes_of = |x: u32| sh.block_bytes(x);
                self.cache.evict_gpu(need - free, &bytes_of);
            }
            self.waiting.pop_front();
            let restore = sh
                .reqs
                .get_mut(r as usize)
                .map(|s| std::mem::take(&mut s.restore))
                .unwrap_or_default();
            let mut bytes = 0u64;
            for &(b, ram_pinned) in &restore {
                let size = sh.block_bytes(b);
                self.cache.insert_gpu_pinned(b);
                if ram_pinned {
                    self.cache.unpin(Level::Ram, b);
                }
                bytes += size;
            }
            self.cache.traffic.ram_to_gpu_bytes += bytes;
            let Some(st) = sh.reqs.get_mut(r as usize) else {
                continue;
            };
            let mut ready = now.max(st.gpu_wait);
            if bytes > 0 {
                // den's synthetic engine also checks and scatters each chunk.
                let fixed = sh.cost.synthetic.map_or(0, |e| {
                    crate::cost::ms_to_us(e.restore_chunk_ms) * restore.len() as u64
                });
                let done = self
                    .pcie
                    .reserve(now.max(st.fetch_ready), sh.cost.pcie_us(bytes) + fixed);
                ready = ready.max(done);
                for &(b, _) in &restore {
                    self.gpu_ready.insert(b, done);
                }
            }
            st.ready = ready;
            self.private_blocks += need.saturating_sub(restore.len() as u32);
            self.prefilling.push_back(r);
            if self.gpu_ready.len() > 4096 {
                self.gpu_ready.retain(|_, t| *t > now);
            }
        }
    }

    fn finish_step(&mut self, now: Micros, step: Step, sh: &mut Shared) {
        let index = self.steps;
        self.steps += 1;
        if step.prefill_tokens == 0 {
            self.decode_step_ms.observe(step.duration as f64 / 1000.0);
        }
        if step.modelled > 0.0 {
            self.step_calibration
                .observe(step.duration as f64 / step.modelled);
        }
        // Decode: every decoding sequence produced a token; some are done.
        self.decode_context += step.decoding as u64;
        for &r in &step.firsts {
            self.first_token(now, index, r, sh);
        }
        while let Some(Reverse((last, r))) = self.decoding.peek().copied() {
            if last > index {
                break;
            }
            self.decoding.pop();
            self.complete(now, r, sh);
        }
        // Prefill progress.
        for &(r, take) in &step.chunks {
            let share = step.duration as f64 * take as f64 / step.prefill_tokens.max(1) as f64;
            let Some(req) = sh.workload.requests.get(r as usize) else {
                continue;
            };
            let input = req.input_tokens;
            let Some(st) = sh.reqs.get_mut(r as usize) else {
                continue;
            };
            st.prefilled += take;
            st.prefill_us += share;
            self.pending_prefill_tokens = self.pending_prefill_tokens.saturating_sub(take as u64);
            if st.prefilled < sh.cost.prompt_rows(input) {
                continue;
            }
            let computed = sh.cost.prompt_rows(input) - st.reused_tokens;
            let per_token = st.prefill_us / 1000.0 / computed.max(1) as f64;
            self.prefill_ms_per_token.observe(per_token);
            let modelled = sh.cost.solo_prefill_ms(st.reused_tokens, input);
            if modelled > 0.0 {
                self.prefill_calibration
                    .observe(st.prefill_us / 1000.0 / modelled);
            }
            let first_new = st.reused_blocks as usize;
            self.prefilling.retain(|&x| x != r);
            self.cache_computed(now, r, first_new, sh);
            if sh.cost.synthetic.is_some() {
                self.firsts.push(r);
            } else {
                self.first_token(now, index, r, sh);
            }
        }
    }

    /// Request `r`'s first token came with step `index`: it decodes its other tokens, one
    /// per step, or is done.
    fn first_token(&mut self, now: Micros, index: u64, r: u32, sh: &mut Shared) {
        let Some(req) = sh.workload.requests.get(r as usize) else {
            return;
        };
        let (input, output) = (req.input_tokens, req.output_tokens);
        if let Some(st) = sh.reqs.get_mut(r as usize) {
            st.first_token = now;
        }
        if output <= 1 {
            self.complete(now, r, sh);
        } else {
            self.decode_context += input as u64 + 1;
            self.decoding.push(Reverse((index + output as u64 - 1, r)));
        }
    }

    /// A request produced its last token: release its pins and output blocks.
    fn complete(&mut self, now: Micros, r: u32, sh: &mut Shared) {
        let Some(req) = sh.workload.requests.get(r as usize) else {
            return;
        };
        let chain = sh.workload.blocks(req);
        // Unpin leaf first so the root ends up hottest: eviction takes leaves first and
        // cached prefixes stay root-contiguous.
        for &b in chain.iter().rev() {
            self.cache.unpin(Level::Gpu, b);
        }
        if sh.cost.synthetic.is_some() {
            self.checkpoint(r, sh);
        }
        self.output_tokens.observe(req.output_tokens as f64);
        self.changes += 1;
        self.finished.push(r);
        let Some(st) = sh.reqs.get_mut(r as usize) else {
            return;
        };
        st.done = now;
        let output_blocks = st.total_blocks.saturating_sub(chain.len() as u32);
        self.private_blocks = self.private_blocks.saturating_sub(output_blocks);
        self.active_blocks = self.active_blocks.saturating_sub(st.total_blocks);
        if req.output_tokens > 1 {
            self.decode_context = self
                .decode_context
                .saturating_sub(req.input_tokens as u64 + req.output_tokens as u64);
        }
    }
}
