//! What a router observes of one simulated worker: its load ([`WorkerLoad`]) and its
//! engine plan ([`EnginePlan`]), built from the worker's state at an instant.

use std::cmp::Reverse;

use super::{Shared, Worker};
use crate::cost::Micros;
use crate::load::WorkerLoad;
use crate::plan::{EnginePlan, PendingPrefill};

impl Worker {
    /// The router's view of this worker at `now`.
    pub fn load(&self, now: Micros, sh: &Shared) -> WorkerLoad {
        let capacity = self.cache.gpu_capacity();
        let used = self.cache.gpu_len() + self.private_blocks;
        let mut pending_model_ms = 0.0;
        for &r in self.waiting.iter().chain(&self.prefilling) {
            let (Some(st), Some(req)) = (
                sh.reqs.get(r as usize),
                sh.workload.requests.get(r as usize),
            ) else {
                continue;
            };
            pending_model_ms += sh.cost.solo_prefill_ms(st.prefilled, req.input_tokens);
        }
        let calibration = self.prefill_calibration.or(1.0);
        let decode_ms = self.decode_step_ms.or(self.seed_decode_step_ms);
        let mean_output = self.output_tokens.or(256.0);
        let mut waiting_blocks = 0;
        let mut queued_restore_bytes = 0u64;
        for &r in &self.waiting {
            if let Some(st) = sh.reqs.get(r as usize) {
                waiting_blocks += st.total_blocks.saturating_sub(st.gpu_hits);
                queued_restore_bytes += st
                    .restore
                    .iter()
                    .map(|&(b, _)| sh.block_bytes(b))
                    .sum::<u64>();
            }
        }
        let mut releases = Vec::with_capacity(self.prefilling.len() + self.decoding.len());
        for &r in &self.prefilling {
            let (Some(st), Some(req)) = (
                sh.reqs.get(r as usize),
                sh.workload.requests.get(r as usize),
            ) else {
                continue;
            };
            let prefill = calibration * sh.cost.solo_prefill_ms(st.prefilled, req.input_tokens);
            releases.push((prefill + mean_output * decode_ms, st.total_blocks));
        }
        for Reverse((last, r)) in &self.decoding {
            let (Some(st), Some(req)) = (
                sh.reqs.get(*r as usize),
                sh.workload.requests.get(*r as usize),
            ) else {
                continue;
            };
            // Tokens generated so far (the worker knows this; it does not know the end).
            let first = (last + 1).saturating_sub(req.output_tokens as u64);
            let generated = self.steps.saturating_sub(first) as f64 + 1.0;
            let left = (mean_output - generated).max(1.0);
            releases.push((left * decode_ms, st.total_blocks));
        }
        releases.sort_by(|a, b| a.0.total_cmp(&b.0));
        WorkerLoad {
            waiting: self.waiting.len() as u32,
            running: self.prefilling.len() as u32 + self.decoding.len() as u32,
            pending_prefill_tokens: self.pending_prefill_tokens,
            pending_prefill_model_ms: pending_model_ms,
            prefill_calibration: calibration,
            nvme_backlog_ms: self.nvme.backlog_ms(now),
            object_backlog_ms: self.nic_down.backlog_ms(now),
            pcie_backlog_ms: self.pcie.backlog_ms(now),
            pcie_queued_ms: sh.cost.pcie_us(queued_restore_bytes) as f64 / 1e3,
            active_blocks: self.active_blocks,
            capacity_blocks: capacity,
            free_blocks: capacity.saturating_sub(used),
            evictable_blocks: self.cache.gpu_evictable(),
            prefill_ms_per_token: self.prefill_ms_per_token.or(self.seed_prefill_ms_per_token),
            decode_step_ms: decode_ms,
            step_remaining_ms: self
                .step
                .as_ref()
                .map_or(0.0, |s| s.end.saturating_sub(now) as f64 / 1e3),
            waiting_blocks,
            releases,
            plan: self.plan(now, sh),
            queue_ms: 0.0,
            unreflected_ms: 0.0,
        }
    }

    /// The engine state a router replays ([`EnginePlan`]): pending prefills in FCFS
    /// order with their progress (counting the step in flight) and ready times.
    fn plan(&self, now: Micros, sh: &Shared) -> EnginePlan {
        let step_remaining_us = self.step.as_ref().map_or(0, |s| s.end.saturating_sub(now));
        let pcie_backlog_us = (self.pcie.backlog_ms(now) * 1e3) as Micros;
        let in_flight = |r: u32| {
            self.step
                .as_ref()
                .and_then(|s| s.chunks.iter().find(|c| c.0 == r))
                .map_or(0, |c| c.1)
        };
        let mut pending = Vec::with_capacity(self.prefilling.len() + self.waiting.len());
        for (admitted, &r) in self
            .prefilling
            .iter()
            .map(|r| (true, r))
            .chain(self.waiting.iter().map(|r| (false, r)))
        {
            let (Some(st), Some(req)) = (
                sh.reqs.get(r as usize),
                sh.workload.requests.get(r as usize),
            ) else {
                continue;
            };
            let done = st.prefilled + in_flight(r);
            if done >= sh.cost.prompt_rows(req.input_tokens) {
                continue;
            }
            let ready_us = if admitted {
                st.ready.saturating_sub(now)
            } else {
                // Admitted at a step boundary, then restored once its fetch is done and
                // the copies booked before it have run.
                let bytes: u64 = st.restore.iter().map(|&(b, _)| sh.block_bytes(b)).sum();
                let start = st
                    .fetch_ready
                    .saturating_sub(now)
                    .max(step_remaining_us)
                    .max(pcie_backlog_us);
                if bytes > 0 {
                    start + sh.cost.pcie_us(bytes)
                } else {
                    start
                }
            };
            pending.push(PendingPrefill {
                ready_in_ms: ready_us as f64 / 1e3,
                done_tokens: done,
                input_tokens: req.input_tokens,
            });
        }
        EnginePlan {
            max_batched_tokens: sh.cost.max_batched_tokens,
            costs: sh.cost.step_costs(),
            pending,
            // Filled requests whose first-token row is next, or in the step in flight,
            // decode already (den's worker counts them so after the step that filled
            // them).
            decoding: (self.decoding.len()
                + self.firsts.len()
                + self.step.as_ref().map_or(0, |s| s.firsts.len())) as u32,
            decode_context_tokens: self.decode_context,
            step_remaining_ms: step_remaining_us as f64 / 1e3,
            step_calibration: self.step_calibration.or(1.0),
            first_token_step: sh.cost.synthetic.is_some(),
            mean_output_tokens: self.output_tokens.or(0.0),
        }
    }
}
