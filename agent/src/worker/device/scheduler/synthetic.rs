//! The synthetic engine's step: model-free rows and tokens on the same scheduler as a
//! real model, so the simulator's workers, the fault tests and the benchmarks exercise
//! the batching den serves with.
//!
//! A step writes each participant's deterministic synthetic KV rows (of model, position
//! and token: what a restore is verified against) into the slots reserved for it, gives
//! every decode the engine's next output token, and spends exactly what
//! [`StepCosts::Synthetic`] of its declared costs says the step costs — the plan the
//! worker publishes, so the router and the fleet simulator price a synthetic worker by
//! the rule it runs: prompt rows at `prefill_ms_per_token`, and a step with decode rows at
//! least one pass (`decode_ms_per_token`, what a GPU's decode step costs whatever the
//! batch), or `first_token_ms` when it yields some decode's first token.

use std::time::Duration;

use den_model::sample::FinishReason;
use den_protocol::engine_plan::StepCosts;

use super::{Active, Generator, Part, Sampled};
use crate::engine::{EngineCosts, output_token};
use crate::worker::device::{Device, Stop, slot_runs, token_range};

/// The plan a synthetic worker publishes: its declared costs as steps.
pub(in crate::worker::device) fn step_costs(costs: &EngineCosts) -> StepCosts {
    StepCosts::Synthetic {
        prefill_us_per_token: costs.prefill_ms_per_token * 1e3,
        decode_us_per_step: costs.decode_ms_per_token * 1e3,
        first_token_us: costs.first_token_ms * 1e3,
    }
}

impl Device<'_, '_> {
    /// Writes the step's synthetic rows into the reserved slots, picks each decode's next
    /// token and spends the step's cost. Nothing is committed here.
    pub(super) fn synthetic_pass(
        &mut self,
        active: &mut [Active],
        parts: &[Part],
    ) -> Result<Vec<Sampled>, Stop> {
        let row_bytes = self.ctx.config.row_bytes as usize;
        let (mut prompt_rows, mut decodes, mut first_token) = (0u64, 0u64, false);
        let mut out = Vec::new();
        for p in parts {
            let a = &active[p.active];
            let request = &a.op.work.request;
            let pending = p
                .pending
                .as_ref()
                .ok_or_else(|| Stop::Failed("a step part without reserved slots".into()))?;
            let tokens = match &a.decoding {
                Some(d) => std::slice::from_ref(&d.consumed),
                None => token_range(&request.tokens, p.start, p.start + p.count)?,
            };
            let bytes = self.kv(&request.model).rows(p.start, tokens, row_bytes);
            self.memory
                .write_runs(&slot_runs(&pending.reservation.slots), &bytes)?;
            let Some(d) = &a.decoding else {
                prompt_rows += u64::from(p.count);
                continue;
            };
            let Generator::Synthetic { context } = d.generator else {
                return Err(Stop::Failed("a model's decode in a synthetic pass".into()));
            };
            let index = d.out.len() as u32;
            decodes += 1;
            first_token |= index == 0;
            let token = output_token(&request.model, context, index);
            let last = index + 1 >= request.max_new_tokens;
            out.push(Ok((token, last.then_some(FinishReason::Length))));
        }
        let us = step_costs(&self.ctx.config.costs).step_us_with_first(
            prompt_rows,
            0.0,
            decodes,
            0,
            first_token,
        );
        if us > 0 {
            std::thread::sleep(Duration::from_micros(us));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_plan_is_the_declared_costs() {
        let c = EngineCosts::new(0.5, 5.0, 8.0).expect("valid costs");
        let plan = step_costs(&c);
        assert_eq!(plan.step_us(4, 0.0, 0, 0), 2_000);
        assert_eq!(plan.step_us(0, 0.0, 8, 0), 5_000);
        assert_eq!(plan.step_us_with_first(0, 0.0, 8, 0, true), 8_000);
    }
}
