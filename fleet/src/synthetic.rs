//! The deployment profile of den's own synthetic engine: what `den-agent worker` really
//! does, so the fleet simulator can be checked against real agents
//! (`den-fleet validate`).
//!
//! A den worker runs its synthetic engine on the same iteration-level batching scheduler
//! as a real model (`agent/src/worker/device/scheduler.rs`): each step runs one decode
//! row for every running decode, then prompt rows FCFS within `--batch-tokens` (at least
//! 16 of them however many decode), and costs what `StepCosts::Synthetic` of the declared
//! costs says — prompt rows at `prefill_ms_per_token` each; a step with decode rows at
//! least one pass, `decode_ms_per_token` whatever the batch, or `first_token_ms` when it
//! yields a first token. A request prefills its processed prompt (every token but the
//! last); the last token is the row of the step that yields its first token. Restores
//! and checkpoint captures run between steps on the device thread; after completion the
//! route's new chunks are checkpointed into the RAM tier.
//!
//! A real model runs on the same scheduler; only its step costs differ: its worker fits
//! them to its own steps and publishes them (`StepCosts::Fitted`). With
//! [`SyntheticProfile::measured`] set (`den-fleet validate --model-file` sets it from the
//! real workers' heartbeats, with their pool and restore rate) the simulated worker's
//! steps cost that fit instead of the declared costs, so the simulator models those
//! workers.
//!
//! The fleet simulator runs its batched worker with these rules when
//! [`CostModel::synthetic`] is set. It does not model the restores and captures between
//! steps as device time (they overlap compute there, on the PCIe link); with the small
//! rows of the validation profile they are microseconds.
//!
//! # Where each number comes from
//! Every field of [`SyntheticProfile`] is a `den-agent worker` flag (or the router's and
//! workers' shared `--chunk-size`), except the restore rates, which the workers do not
//! declare but spend on real memory and checksums:
//!
//! | profile | worker flag | in the simulator |
//! |---|---|---|
//! | `prefill_ms_per_token` | `--prefill-ms-per-token` | prefill operation per token |
//! | `first_token_ms` | `--first-token-ms` | the floor of a step yielding a first token |
//! | `decode_ms_per_token` | `--decode-ms-per-token` | the floor of a step with decode rows |
//! | `batch_tokens` | `--batch-tokens` | the step's token budget |
//! | `pages × page_size` | `--pages`, `--page-size` | GPU pool in blocks of `chunk_tokens` |
//! | `kv_bytes_per_token` | `--kv-bytes-per-token` | bytes per block (restore, capture, tiers) |
//! | `ram_bytes` | `--ram-bytes` | RAM tier capacity in blocks |
//! | `ssd_bytes` | `--ssd-bytes` | SSD tier capacity in blocks |
//! | `chunk_tokens` | `--chunk-size` | the block size (one chunk = one block) |
//! | `restore_bytes_per_s`, `restore_chunk_ms` | — (undeclared) | restore operation |
//! | `capture_bytes_per_s` | — (undeclared) | capture operation |
//!
//! On the synthetic engine the restore and capture rates are **fixed defaults** (300
//! MB/s plus 0.02 ms per chunk, 2 GB/s), set from measurements on the project's machine,
//! not measured at run time. With `--model-file`, `den-fleet validate` replaces the RAM path's
//! and the SSD read's rates by what the real workers measured — only where their metrics
//! show they read that way (`rates` records which; run it with a RAM tier smaller than
//! the slice's KV and `--ssd-bytes` to measure both). What the rates stand for: a restore
//! from the RAM tier decodes the stored chunk (a SHA-256 pass), copies it into pages and,
//! with `--verify-restores` (the default), regenerates and compares every row. With small
//! rows (`--kv-bytes-per-token 256`) this is a few µs per KiB plus a fixed cost per
//! chunk — well under a percent of a prefill — so it matters only as a sanity check.
//! There is no object store in this profile; SSD reads (when `ssd_bytes > 0`) use the
//! same rates plus the file read, approximated by `ssd_read_bytes_per_s`.
//!
//! What the profile does **not** model: the time between the router's decision and the
//! worker's acceptance (a loopback round trip), the host's scheduling noise (sleeps overshoot by tens of µs), and
//! the real pool's eviction policy (the simulator evicts blocks LRU-first). The
//! validation measures how much these leave between predicted and measured TTFT.

use serde::{Deserialize, Serialize};

use den_protocol::engine_plan::StepCosts;

use super::cost::CostModel;

/// The declared costs of den's synthetic engine, in the units of the `den-agent worker`
/// flags.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SyntheticEngine {
    pub prefill_ms_per_token: f64,
    pub first_token_ms: f64,
    pub decode_ms_per_token: f64,
    /// Fixed cost of restoring one chunk from a lower tier (fetch, check, scatter,
    /// verify), on top of its bytes at [`CostModel::pcie_bytes_per_s`].
    pub restore_chunk_ms: f64,
    /// Bytes per second of a checkpoint capture (rows copied out of the pages).
    pub capture_bytes_per_s: f64,
    /// A real model's steps as its worker measured and published them (on the same
    /// scheduler): the steps cost this instead of the declared costs above, which are
    /// then derived from it ([`SyntheticEngine::measured`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<StepCosts>,
}

/// The tier rates real workers measured, bytes/s (`None`: no worker read that way, so the
/// profile keeps its default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct MeasuredRates {
    /// A RAM-tier read then the upload into pages ([`SyntheticProfile::restore_bytes_per_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_bytes_per_s: Option<f64>,
    /// An SSD-tier read ([`SyntheticProfile::ssd_read_bytes_per_s`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssd_read_bytes_per_s: Option<f64>,
}

impl MeasuredRates {
    pub fn is_empty(&self) -> bool {
        self.restore_bytes_per_s.is_none() && self.ssd_read_bytes_per_s.is_none()
    }
}

impl SyntheticEngine {
    /// A worker on den's scheduler whose steps cost what a real worker measured. The
    /// per-token fields become that model's reading of them (a prompt row, a one-row
    /// step), for the study's older estimates that read them.
    pub fn measured(costs: StepCosts, restore_chunk_ms: f64, capture_bytes_per_s: f64) -> Self {
        let one_row_ms = costs.step_us(0, 0.0, 1, 0) as f64 / 1e3;
        let prefill_ms_per_token = match costs {
            StepCosts::Fitted { row_us, .. } | StepCosts::Batched { row_us, .. } => row_us / 1e3,
            StepCosts::Synthetic {
                prefill_us_per_token,
                ..
            } => prefill_us_per_token / 1e3,
        };
        SyntheticEngine {
            prefill_ms_per_token,
            first_token_ms: costs.first_token_step_ms(),
            decode_ms_per_token: one_row_ms,
            restore_chunk_ms,
            capture_bytes_per_s,
            measured: Some(costs),
        }
    }

    /// The steps this engine runs, as its worker publishes them.
    pub fn step_costs(&self) -> StepCosts {
        if let Some(costs) = self.measured {
            return costs;
        }
        StepCosts::Synthetic {
            prefill_us_per_token: self.prefill_ms_per_token * 1e3,
            decode_us_per_step: self.decode_ms_per_token * 1e3,
            first_token_us: self.first_token_ms * 1e3,
        }
    }

    /// A capture of `bytes`, µs.
    pub fn capture_us(&self, bytes: u64) -> u64 {
        if self.capture_bytes_per_s > 0.0 {
            (bytes as f64 * 1e6 / self.capture_bytes_per_s).round() as u64
        } else {
            0
        }
    }

    /// The decode operation: the first token, then every further one.
    pub fn decode_ms(&self, output_tokens: u32) -> f64 {
        self.first_token_ms + self.decode_ms_per_token * output_tokens.saturating_sub(1) as f64
    }
}

/// A den synthetic-engine deployment: the worker flags (module docs) and the measured
/// restore rates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyntheticProfile {
    pub prefill_ms_per_token: f64,
    pub first_token_ms: f64,
    pub decode_ms_per_token: f64,
    pub pages: u32,
    pub page_size: u32,
    pub kv_bytes_per_token: u64,
    pub ram_bytes: u64,
    pub ssd_bytes: u64,
    /// The chunk size of the router and every worker: one simulator block.
    pub chunk_tokens: u32,
    /// Rows per step (`--batch-tokens`).
    #[serde(default = "default_batch_tokens")]
    pub batch_tokens: u32,
    /// Bytes per second of a restore from the RAM tier into pages (measured).
    pub restore_bytes_per_s: f64,
    /// Fixed cost per restored chunk, ms (measured).
    pub restore_chunk_ms: f64,
    /// Bytes per second of a checkpoint capture (a copy out of the pages).
    pub capture_bytes_per_s: f64,
    /// Bytes per second of an SSD tier read (only used when `ssd_bytes > 0`).
    pub ssd_read_bytes_per_s: f64,
    /// A real model's step costs as its workers measured them (`den-fleet validate
    /// --model-file`): the steps cost this instead of the three declared costs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<StepCosts>,
    /// Which of the restore rates above the workers measured (`den-fleet validate
    /// --model-file`); the others are this profile's defaults.
    #[serde(default, skip_serializing_if = "MeasuredRates::is_empty")]
    pub rates: MeasuredRates,
}

impl Default for SyntheticProfile {
    /// `den-agent worker`'s defaults (0.05 ms/token prefill, 2 ms first token, 5 ms per
    /// decode step, 1024 pages of 16 tokens, 4 KiB rows, 1 GiB RAM tier, no SSD, 256-token
    /// chunks) with restore rates measured on the project's 2-core VM.
    fn default() -> Self {
        SyntheticProfile {
            prefill_ms_per_token: 0.05,
            first_token_ms: 2.0,
            decode_ms_per_token: 5.0,
            pages: 1024,
            page_size: 16,
            kv_bytes_per_token: 4096,
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            chunk_tokens: 256,
            batch_tokens: default_batch_tokens(),
            restore_bytes_per_s: 300e6,
            restore_chunk_ms: 0.02,
            capture_bytes_per_s: 2e9,
            ssd_read_bytes_per_s: 1e9,
            measured: None,
            rates: MeasuredRates::default(),
        }
    }
}

/// `den-agent worker`'s `--batch-tokens` default.
fn default_batch_tokens() -> u32 {
    64
}

impl SyntheticProfile {
    /// The deployment `den-fleet validate` runs by default: 0.1 ms/token prefill, 5 ms
    /// first token, 2 ms per decode step, 8192 pages of 16 tokens, 256-byte rows, a 1 GiB
    /// RAM tier, no SSD, `chunk_tokens`-token chunks (64: the Mooncake trace at 1/8
    /// length), restore rates as in [`SyntheticProfile::default`].
    pub fn validation(chunk_tokens: u32) -> SyntheticProfile {
        SyntheticProfile {
            prefill_ms_per_token: 0.1,
            first_token_ms: 5.0,
            decode_ms_per_token: 2.0,
            pages: 8192,
            page_size: 16,
            kv_bytes_per_token: 256,
            ram_bytes: 1 << 30,
            ssd_bytes: 0,
            chunk_tokens,
            ..SyntheticProfile::default()
        }
    }

    /// The engine's declared costs.
    pub fn engine(&self) -> SyntheticEngine {
        if let Some(costs) = self.measured {
            return SyntheticEngine::measured(
                costs,
                self.restore_chunk_ms,
                self.capture_bytes_per_s,
            );
        }
        SyntheticEngine {
            prefill_ms_per_token: self.prefill_ms_per_token,
            first_token_ms: self.first_token_ms,
            decode_ms_per_token: self.decode_ms_per_token,
            restore_chunk_ms: self.restore_chunk_ms,
            capture_bytes_per_s: self.capture_bytes_per_s,
            measured: None,
        }
    }

    /// Tokens the page pool holds.
    pub fn pool_tokens(&self) -> u64 {
        self.pages as u64 * self.page_size as u64
    }

    /// The simulator's cost model of this deployment.
    pub fn cost_model(&self) -> CostModel {
        let block = self.chunk_tokens.max(1);
        let block_bytes = (self.kv_bytes_per_token * block as u64).max(1);
        let blocks = |bytes: u64| u32::try_from(bytes / block_bytes).unwrap_or(u32::MAX);
        let pool = self.pool_tokens();
        CostModel {
            model: if self.measured.is_some() {
                "a real model on den's scheduler, at its workers' measured step costs".into()
            } else {
                "den synthetic engine".into()
            },
            gpu: format!(
                "{} pages × {} tokens, batches of {} rows",
                self.pages, self.page_size, self.batch_tokens
            ),
            // No roofline: the synthetic engine's steps are its declared costs.
            params: 0.0,
            layers: 0,
            q_heads: 0,
            kv_heads: 0,
            head_dim: 0,
            max_context: u32::try_from(pool).unwrap_or(u32::MAX),
            kv_bytes_per_token: self.kv_bytes_per_token,
            block_tokens: block,
            peak_flops: 0.0,
            mfu: 0.0,
            hbm_bytes_per_s: 0.0,
            hbm_efficiency: 0.0,
            gpu_kv_blocks: u32::try_from(pool / block as u64).unwrap_or(u32::MAX),
            max_batched_tokens: self.batch_tokens.max(1),
            max_running: u32::MAX,
            ram_blocks: blocks(self.ram_bytes),
            ssd_blocks: blocks(self.ssd_bytes),
            pcie_bytes_per_s: self.restore_bytes_per_s.max(1.0),
            nvme_bytes_per_s: self.ssd_read_bytes_per_s.max(1.0),
            nvme_fixed_us: 0,
            object_store: None,
            synthetic: Some(self.engine()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_model_mirrors_the_worker_flags() {
        let p = SyntheticProfile {
            pages: 4096,
            page_size: 16,
            kv_bytes_per_token: 256,
            ram_bytes: 64 << 20,
            chunk_tokens: 64,
            ..SyntheticProfile::default()
        };
        let c = p.cost_model();
        assert_eq!(c.block_tokens, 64);
        assert_eq!(c.gpu_kv_blocks, 4096 * 16 / 64);
        assert_eq!(c.ram_blocks, (64 << 20) / (256 * 64));
        assert_eq!(c.ssd_blocks, 0);
        assert!(c.object_store.is_none());
        assert_eq!(c.max_batched_tokens, 64);
        // Linear prefill, declared first token; a decode step is one pass for the batch.
        assert_eq!(c.solo_prefill_ms(100, 300), 200.0 * 0.05);
        assert_eq!(c.first_token_ms(), 2.0);
        assert_eq!(c.step_us(10, 0.0, 2, 0), 5_000);
        assert_eq!(c.step_us(200, 0.0, 0, 0), 10_000);
        assert_eq!(c.prompt_rows(100), 99);
        // The H100 profile stays on the roofline.
        assert!(CostModel::default().synthetic.is_none());
        assert_eq!(CostModel::default().first_token_ms(), 0.0);
    }
}
