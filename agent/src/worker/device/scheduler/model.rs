//! A real model's step: the forward pass over the step's rows — on the CPU over the host
//! page arena, or on the GPU that holds the device page arena — and each decode's next
//! token sampled from its logits (or chosen on the device when every decode is greedy).

use std::sync::Arc;

use den_model::BatchRow;
use den_model::Runner;
use den_model::kv::{ArenaRows, Sequence};
use den_model::sample::{GenerationError, Step};

use super::{Active, Generator, Part, Sampled};
use crate::model_file::ModelText;
use crate::worker::device::{Device, Stop, token_range};

/// A loaded model on the device thread.
pub struct ModelEngine<'m, 'a> {
    pub compute: Compute<'m, 'a>,
    pub text: Arc<ModelText>,
}

/// Where the model's forward pass runs: on the CPU over the host page arena, or on the
/// GPU that holds the device page arena. One per device thread, so the size difference
/// between the two does not matter.
#[allow(clippy::large_enum_variant)]
pub enum Compute<'m, 'a> {
    Cpu(Runner<'m, 'a>),
    #[cfg(feature = "cuda")]
    Gpu(den_model::gpu::GpuRunner<'m, 'a>),
}

impl<'m, 'a> ModelEngine<'m, 'a> {
    pub fn new(runner: Runner<'m, 'a>, text: Arc<ModelText>) -> Self {
        ModelEngine {
            compute: Compute::Cpu(runner),
            text,
        }
    }

    #[cfg(feature = "cuda")]
    pub fn gpu(runner: den_model::gpu::GpuRunner<'m, 'a>, text: Arc<ModelText>) -> Self {
        ModelEngine {
            compute: Compute::Gpu(runner),
            text,
        }
    }

    pub fn model(&self) -> &'m den_model::Model<'a> {
        match &self.compute {
            Compute::Cpu(r) => r.model(),
            #[cfg(feature = "cuda")]
            Compute::Gpu(r) => r.model(),
        }
    }
}

impl Device<'_, '_> {
    /// Runs the step's rows through the model and samples each decode's next token (in
    /// the order of the decode parts). Nothing is committed here.
    pub(super) fn model_pass(
        &mut self,
        active: &mut [Active],
        parts: &[Part],
    ) -> Result<Vec<Sampled>, Stop> {
        let seqs: Vec<Sequence> = parts
            .iter()
            .map(|p| {
                let pages = p
                    .pending
                    .as_ref()
                    .map(|r| r.reservation.pages_after.iter().map(|pg| pg.0).collect())
                    .unwrap_or_default();
                Sequence::with_pages(pages, p.start)
            })
            .collect();
        let mut rows: Vec<BatchRow<'_>> = Vec::new();
        for (p, seq) in parts.iter().zip(&seqs) {
            let a = &active[p.active];
            match &a.decoding {
                Some(d) => rows.push(BatchRow {
                    token: d.consumed,
                    pos: p.start,
                    seq,
                    logits: true,
                }),
                None => {
                    let tokens =
                        token_range(&a.op.work.request.tokens, p.start, p.start + p.count)?;
                    rows.extend(tokens.iter().enumerate().map(|(k, t)| BatchRow {
                        token: *t,
                        pos: p.start + k as u32,
                        seq,
                        logits: false,
                    }));
                }
            }
        }
        let Device { memory, model, .. } = self;
        let engine = model
            .as_mut()
            .ok_or_else(|| Stop::Failed("no model loaded".into()))?;
        let vocab = engine.model().vocab();
        let picked = match &mut engine.compute {
            Compute::Cpu(runner) => {
                let geometry = memory.geometry();
                let arena = memory.host_rows().ok_or_else(|| {
                    Stop::Failed(
                        "this model runs on the CPU and needs the host page arena: start the worker with --backend host".into(),
                    )
                })?;
                let mut kv =
                    ArenaRows::new(arena, geometry.page_size, geometry.row_bytes as usize)
                        .map_err(|e| Stop::Failed(format!("model: {e}")))?;
                runner.forward(&rows, &mut kv).map(Picked::Logits)
            }
            #[cfg(feature = "cuda")]
            Compute::Gpu(runner) => {
                let arena = memory.device_arena().ok_or_else(|| {
                    Stop::Failed(
                        "this model runs on the GPU and needs the device page arena: start the worker with --backend cuda".into(),
                    )
                })?;
                // A capture that failed in an earlier step, said once.
                if let Some(why) = runner.take_graph_failure() {
                    tracing::warn!(
                        error = %why,
                        "CUDA graph capture failed: the GPU pass launches its kernels one by one from now on"
                    );
                }
                // When every decode in the step samples greedily the device picks the
                // tokens and only their ids come back, not a vocabulary of logits per
                // row (64 rows of a 49 k vocabulary are 12.5 MB a step over PCIe).
                if all_greedy(active, parts) {
                    runner.forward_greedy(&rows, &arena.kv).map(Picked::Tokens)
                } else {
                    runner.forward(&rows, &arena.kv).map(Picked::Logits)
                }
            }
        }
        .map_err(|e| Stop::Failed(format!("model: {e}")))?;
        let text = &engine.text;
        let mut out = Vec::new();
        let mut k = 0;
        for p in parts {
            let Some(d) = active[p.active].decoding.as_mut() else {
                continue;
            };
            let Generator::Model(generation) = &mut d.generator else {
                return Err(Stop::Failed("a synthetic decode in a model's pass".into()));
            };
            let step = match &picked {
                Picked::Logits(logits) => {
                    let row = logits.get(k * vocab..(k + 1) * vocab).unwrap_or_default();
                    generation.step(&text.tokenizer, row)
                }
                Picked::Tokens(ids) => match ids.get(k) {
                    Some(Some(id)) => generation.accept(&text.tokenizer, *id),
                    // Every logit NaN: the host path's error, not a token.
                    Some(None) => Err(GenerationError::NoCandidates),
                    None => {
                        return Err(Stop::Failed(
                            "the pass chose fewer tokens than it had decodes".into(),
                        ));
                    }
                },
            };
            k += 1;
            out.push(match step {
                Ok(Step::Token { id, .. }) => Ok((id, None)),
                Ok(Step::Finished { id, reason, .. }) => Ok((id, Some(reason))),
                Err(e) => Err(format!("sampling: {e}")),
            });
        }
        Ok(out)
    }
}

/// What a pass hands back for its decode rows: their logits, to sample on the host, or
/// the tokens the device chose (every decode greedy).
enum Picked<'l> {
    Logits(&'l [f32]),
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Tokens(Vec<Option<u32>>),
}

/// Whether every decode row of the step samples greedily (the device can choose them all).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn all_greedy(active: &[Active], parts: &[Part]) -> bool {
    parts.iter().all(|p| {
        active
            .get(p.active)
            .and_then(|a| a.decoding.as_ref())
            .is_none_or(|d| match &d.generator {
                Generator::Model(g) => g.sampler().config().is_greedy(),
                Generator::Synthetic { .. } => false,
            })
    })
}
