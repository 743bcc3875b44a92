//! The cost model of one deployment: an 8B-class model on H100-class GPUs with a host
//! RAM tier, a local NVMe tier and a shared object store.
//!
//! Every number below carries its source. Conventions as in `anchors.md`: **\[src\]** is a
//! published figure; **derived** is arithmetic on published figures; **assumption** is a
//! deployment choice or an efficiency we could not find measured, stated so it can be
//! changed. Defaults are [`CostModel::h100_llama8b`].
//!
//! # Model: Llama-3.1-8B (bf16)
//! - 32 layers, 32 query heads, 8 KV heads, head dim 128, hidden 4096, 131,072-token
//!   context, 8.03 B parameters [src: meta-llama/Llama-3.1-8B `config.json` and model
//!   card on Hugging Face].
//! - KV bytes per token = 2 (K,V) × 32 layers × 8 KV heads × 128 × 2 B = **131,072 B
//!   (128 KiB)** — **derived**, formula from `anchors.md` §10. One 512-token trace block is
//!   64 MiB.
//! - Weights: 8.03 B × 2 B = 16.06 GB — **derived**.
//!
//! # GPU: H100 SXM5 80 GB
//! - 989 TFLOP/s dense BF16 (1,979 with sparsity), 3.35 TB/s HBM3, 80 GB
//!   [src: NVIDIA H100 Tensor Core GPU datasheet; `anchors.md` §10 for HBM].
//! - Prefill is compute-bound: per new token `2 × params` FLOPs for the dense layers
//!   [src: Kaplan et al. 2020, "Scaling Laws", forward pass ≈ 2N FLOPs/token] plus
//!   causal attention `4 × layers × heads × head_dim × position` FLOPs (QKᵀ and AV)
//!   — **derived**. Achieved fraction of peak (MFU) **0.5** — **assumption**
//!   (FlashAttention-3 reaches ~75% of H100 BF16 peak in its kernel [src: Shah et al.
//!   2024, arXiv 2407.08608]; end-to-end serving loses more to non-GEMM work).
//!   Cross-check: this gives 8,192 fresh tokens in ≈ 0.30 s; the default polynomial
//!   of NVIDIA Dynamo's mocker, `4.21e-7·t² + 0.0152·t + 16.5` ms, gives 0.17 s for the
//!   same batch [src: ai-dynamo/dynamo `lib/mocker/src/common/perf_model.rs`]. Ours is the
//!   more conservative (slower prefill makes caching worth more to *every* policy).
//! - Decode is memory-bound: each step reads the weights once plus every decoding
//!   sequence's KV. Achieved fraction of HBM bandwidth **0.8** — **assumption**. Idle
//!   step ≈ 6.0 ms, a full pool ≈ 25 ms; Dynamo's mocker uses 5.7 ms idle to 34 ms at
//!   full KV utilisation [src: same file] — same range.
//! - A mixed (chunked-prefill) step costs `max(weights read, dense FLOPs) + attention +
//!   decode KV reads` — **derived** roofline.
//! - KV pool: vLLM reserves `gpu_memory_utilization` = 0.9 of device memory [src: vLLM
//!   engine arguments, default 0.9]; minus weights and ≈ 4 GB of activations and CUDA
//!   graphs (**assumption**) leaves 51.9 GB = **773 blocks of 512 tokens** (≈ 396 k
//!   tokens) — **derived**.
//! - Scheduler: chunked prefill with a budget of **8,192 tokens per step**, FCFS, at most
//!   **256 running sequences** [src: vLLM V1 enables chunked prefill by default, vLLM
//!   `docs/configuration/optimization.md`; 8,192 is the budget vLLM uses for its
//!   OpenAI server on large GPUs and 256 its `max_num_seqs` default — **assumption**
//!   where versions differ].
//!
//! # Tiers per worker
//! - Host RAM: **128 GiB** of pinned memory for KV (= 2,048 blocks). A DGX H100 has 2 TB
//!   of system memory for 8 GPUs [src: NVIDIA DGX H100 user guide], 256 GB per GPU; half
//!   of it for KV is an **assumption** (SGLang HiCache's default host pool is 2× the
//!   device pool [src: `anchors.md` §5, `--hicache-ratio 2`], about this size).
//! - Host → GPU: **55 GB/s** pinned `cudaMemcpyAsync` over PCIe Gen5 x16 [src:
//!   `anchors.md` §10, nvbandwidth 55.6 GB/s]. A 64 MiB block: 1.2 ms.
//! - Local NVMe: **2 TiB** for KV per worker (= 32,768 blocks); a DGX H100 has 8 ×
//!   3.84 TB NVMe data drives [src: DGX H100 user guide], 3.84 TB per GPU; the 2 TiB share
//!   is an **assumption**. Read **6.8 GB/s** (Samsung PM9A3, Gen4 x4) [src: `anchors.md`
//!   §10] plus **0.1 ms** per load (**assumption**, NVMe read latency order). A block:
//!   9.9 ms.
//! - Object store (shared by all workers, unbounded): **25 Gbit/s** (3.125 GB/s) per
//!   worker each way and **30 ms** first-byte latency per load — **assumption**: between
//!   S3 Express One Zone's single-digit milliseconds and S3 Standard's tens to hundreds
//!   [src: AWS S3 performance guidelines], and a quarter of a DGX H100's per-GPU share of
//!   its 2 × 400 Gb/s storage NICs [src: DGX H100 user guide]. A block: 21.5 ms. Every
//!   block a worker prefills is uploaded (den publishes a chunk after its storage
//!   receipt, `ARCHITECTURE.md` "Tiers and chunk identity"); it is fetchable by any
//!   worker once the upload finishes.
//! - Eviction is offload-on-evict (Mooncake PR #1899, `anchors.md` §12): a block leaves
//!   the GPU for RAM, RAM for SSD, SSD for nowhere (the object store keeps its copy).
//!   Writes are counted in bytes but assumed off the critical path (asynchronous copy
//!   engines; **assumption**); reads on a request's critical path are timed on FIFO
//!   links (one per PCIe direction, NVMe, NIC direction).
//!
//! Reload vs recompute for one 512-token block at position ~6 k (**derived**): RAM 1.2 ms
//! (PCIe), SSD 10 + 1.2 ms, object 21.5 + 1.2 ms plus 30 ms once per load, recompute
//! ≈ 16.6 ms dense + 3.4 ms attention. So RAM always pays, SSD pays, and the object store
//! pays only for long prefixes, deep in a long context, or when it overlaps queueing —
//! exactly the trade-off a TTFT estimate has to make per request.
//!
//! # Other profiles
//! [`CostModel::synthetic`] models den's own synthetic engine instead (den's batching
//! scheduler at declared costs; [`super::synthetic`]): the profile the simulator is
//! validated on against real agents. The H100 profile leaves it `None` (the roofline).

use serde::{Deserialize, Serialize};

use den_protocol::engine_plan::{EnginePlan, StepCosts};

pub use super::synthetic::SyntheticEngine;

/// Microseconds of simulated time.
pub type Micros = u64;

/// The deployment's costs and capacities (see the module docs for every source).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    pub model: String,
    pub gpu: String,
    pub params: f64,
    pub layers: u32,
    pub q_heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    pub max_context: u32,
    pub kv_bytes_per_token: u64,
    pub block_tokens: u32,
    pub peak_flops: f64,
    pub mfu: f64,
    pub hbm_bytes_per_s: f64,
    pub hbm_efficiency: f64,
    pub gpu_kv_blocks: u32,
    pub max_batched_tokens: u32,
    pub max_running: u32,
    pub ram_blocks: u32,
    pub ssd_blocks: u32,
    pub pcie_bytes_per_s: f64,
    pub nvme_bytes_per_s: f64,
    pub nvme_fixed_us: u64,
    /// `None` disables the shared object store.
    pub object_store: Option<ObjectStoreCost>,
    /// `Some`: den's synthetic engine on den's batching scheduler, its steps at these
    /// declared costs ([`super::synthetic`]) instead of the roofline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<SyntheticEngine>,
}

/// Object store costs, per worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectStoreCost {
    pub bytes_per_s: f64,
    pub latency_us: u64,
}

impl Default for CostModel {
    fn default() -> Self {
        CostModel::h100_llama8b()
    }
}

impl CostModel {
    /// Llama-3.1-8B bf16 on one H100 SXM5 80 GB per worker (module docs).
    pub fn h100_llama8b() -> CostModel {
        let kv_bytes_per_token: u64 = 2 * 32 * 8 * 128 * 2;
        let block_tokens: u32 = 512;
        let params = 8.03e9;
        let pool_bytes = 0.9 * 80e9 - params * 2.0 - 4e9;
        let block_bytes = (kv_bytes_per_token * block_tokens as u64) as f64;
        CostModel {
            model: "Llama-3.1-8B bf16".into(),
            gpu: "H100 SXM5 80GB".into(),
            params,
            layers: 32,
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            max_context: 131_072,
            kv_bytes_per_token,
            block_tokens,
            peak_flops: 989e12,
            mfu: 0.5,
            hbm_bytes_per_s: 3.35e12,
            hbm_efficiency: 0.8,
            gpu_kv_blocks: (pool_bytes / block_bytes) as u32,
            max_batched_tokens: 8192,
            max_running: 256,
            ram_blocks: ((128u64 << 30) / (kv_bytes_per_token * block_tokens as u64)) as u32,
            ssd_blocks: ((2u64 << 40) / (kv_bytes_per_token * block_tokens as u64)) as u32,
            pcie_bytes_per_s: 55e9,
            nvme_bytes_per_s: 6.8e9,
            nvme_fixed_us: 100,
            object_store: Some(ObjectStoreCost {
                bytes_per_s: 3.125e9,
                latency_us: 30_000,
            }),
            synthetic: None,
        }
    }

    /// KV bytes of `tokens` tokens.
    pub fn kv_bytes(&self, tokens: u64) -> u64 {
        tokens * self.kv_bytes_per_token
    }

    /// Duration of one engine step in µs: `prefill_tokens` new prompt tokens whose
    /// causal attention covers `attention_positions` (Σ of their positions),
    /// `decoding` sequences reading `decode_context` KV tokens in total.
    pub fn step_us(
        &self,
        prefill_tokens: u64,
        attention_positions: f64,
        decoding: u64,
        decode_context: u64,
    ) -> Micros {
        self.step_costs().step_us(
            prefill_tokens,
            attention_positions,
            decoding,
            decode_context,
        )
    }

    /// The step costs a worker of this model reports in its engine plan: dense compute
    /// per row at the MFU, floored by one weight pass at the HBM efficiency, causal
    /// attention per position, KV reads per decode context token; or, for den's synthetic
    /// engine, its declared costs. The simulator's steps take exactly this long.
    pub fn step_costs(&self) -> StepCosts {
        if let Some(e) = &self.synthetic {
            return e.step_costs();
        }
        let flops = self.peak_flops * self.mfu;
        let hbm = self.hbm_bytes_per_s * self.hbm_efficiency;
        StepCosts::Batched {
            row_us: 2.0 * self.params / flops * 1e6,
            weights_pass_us: 2.0 * self.params / hbm * 1e6,
            attention_us_per_position: self.attention_flops_per_position() / flops * 1e6,
            context_us_per_token: self.kv_bytes_per_token as f64 / hbm * 1e6,
        }
    }

    /// An idle engine plan of this model.
    pub fn idle_plan(&self) -> EnginePlan {
        EnginePlan::idle(self.max_batched_tokens, self.step_costs())
    }

    /// Attention FLOPs per (new token × earlier position): QKᵀ and AV, 2 FLOPs each.
    pub fn attention_flops_per_position(&self) -> f64 {
        4.0 * (self.layers * self.q_heads * self.head_dim) as f64
    }

    /// Time to prefill tokens `[start, end)` in one step on an idle GPU, in ms (the
    /// calibration seed and the study's estimates; the simulator charges budget-sized
    /// steps, [`CostModel::alone_ttft_ms`]).
    pub fn solo_prefill_ms(&self, start: u32, end: u32) -> f64 {
        let n = end.saturating_sub(start) as u64;
        if let Some(e) = &self.synthetic
            && e.measured.is_none()
        {
            return n as f64 * e.prefill_ms_per_token;
        }
        self.step_us(n, positions(start, end), 0, 0) as f64 / 1000.0
    }

    /// A request's time to first token alone on an idle worker of this engine, ms: its
    /// prompt rows past the `reused` tokens in steps of the engine's budget, each step
    /// paying the engine's floor (one weight pass on a measured CPU worker), then the step
    /// that yields the first token. No policy can undercut it for that reuse, since every
    /// policy's workers run the same engine; [`CostModel::solo_prefill_ms`] is one step of
    /// the whole prompt, which on an engine with a per-step floor is not reachable.
    pub fn alone_ttft_ms(&self, reused: u32, input: u32) -> f64 {
        let rows = self.prompt_rows(input);
        self.idle_plan().solo_ms(reused.min(rows), rows) + self.first_token_ms()
    }

    /// What the first token costs after the prompt is prefilled, ms: 0 for a batched
    /// engine (it samples the first token in the step that ends the prefill), the
    /// declared first-token cost of den's synthetic engine (the floor of the step that
    /// yields it).
    pub fn first_token_ms(&self) -> f64 {
        self.synthetic.as_ref().map_or(0.0, |e| e.first_token_ms)
    }

    /// Prompt rows a request of `input` tokens computes before its first token: all of
    /// them (the step that finishes the prompt yields it), or, on den's synthetic
    /// engine, every token but the last (whose row is the first decode step's).
    pub fn prompt_rows(&self, input: u32) -> u32 {
        if self.synthetic.is_some() {
            input.saturating_sub(1)
        } else {
            input
        }
    }

    /// Host RAM → GPU time for `bytes`, in µs.
    pub fn pcie_us(&self, bytes: u64) -> Micros {
        seconds_to_us(bytes as f64 / self.pcie_bytes_per_s)
    }

    /// NVMe → host RAM time for one load of `bytes`, in µs.
    pub fn nvme_us(&self, bytes: u64) -> Micros {
        self.nvme_fixed_us + seconds_to_us(bytes as f64 / self.nvme_bytes_per_s)
    }

    /// Object store → host RAM (or host → object store) time for one transfer of
    /// `bytes`, in µs; `None` without an object store.
    pub fn object_us(&self, bytes: u64) -> Option<Micros> {
        self.object_store
            .as_ref()
            .map(|o| o.latency_us + seconds_to_us(bytes as f64 / o.bytes_per_s))
    }
}

/// Σ of positions `start..end` (the causal attention span of a prefill chunk).
pub fn positions(start: u32, end: u32) -> f64 {
    den_protocol::engine_plan::positions(start, end)
}

/// Milliseconds as whole microseconds, to the nearest (0 for invalid values): declared
/// costs are exact decimals, so rounding up would add a microsecond of float noise.
pub fn ms_to_us(ms: f64) -> Micros {
    let us = ms * 1e3;
    if us.is_finite() && us > 0.0 {
        us.round() as Micros
    } else {
        0
    }
}

fn seconds_to_us(s: f64) -> Micros {
    if s.is_finite() && s > 0.0 {
        (s * 1e6).ceil() as Micros
    } else {
        0
    }
}
