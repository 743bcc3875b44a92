//! The device thread with a real model: prefill and decode run den-model's forward pass
//! over the route's pages in the worker's own arena.
//!
//! Every row goes through the pool's two-phase append like the synthetic engine's: the
//! slots are reserved (a shared tail copied first), the forward pass writes the new rows
//! in place through the reservation's page table (`pages_after`), and the append commits
//! only when the pass succeeded; a failure or a cancellation aborts it and the route is as
//! it was. Restored chunks are checked by the hash their tier stored, not by recomputation:
//! real KV is not bit-reproducible across batch shapes (spec of issue 12, item 2).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use den_model::kv::{ArenaRows, Sequence};
use den_model::sample::{FinishReason, Generation, Step};
use den_model::{ModelError, Runner};
use den_protocol::pool::AppendReservation;
use den_protocol::request::Token;
use den_protocol::wire::StopReason;
use den_protocol::worker::{OperationOutcome, Work};

use super::{Device, DeviceEvent, Mismatch, Stop, append_with, token_range};
use crate::memory::PageMemory;
use crate::model_file::{ModelText, generation_config};

/// A loaded model on the device thread.
pub struct ModelEngine<'m, 'a> {
    pub runner: Runner<'m, 'a>,
    pub text: Arc<ModelText>,
    /// The page table handed to the forward pass, reused for every step.
    pages: Vec<u32>,
}

impl<'m, 'a> ModelEngine<'m, 'a> {
    pub fn new(runner: Runner<'m, 'a>, text: Arc<ModelText>) -> Self {
        ModelEngine {
            runner,
            text,
            pages: Vec::with_capacity(256),
        }
    }

    /// Runs `tokens` at positions `start..` of the route the reservation extends, writing
    /// their rows into the reserved slots; returns the last token's logits.
    fn run(
        &mut self,
        memory: &mut dyn PageMemory,
        reservation: &AppendReservation,
        start: u32,
        tokens: &[Token],
    ) -> Result<&[f32], Stop> {
        let geometry = memory.geometry();
        let rows = memory.host_rows().ok_or_else(|| {
            Stop::Failed(
                "a real model runs on the CPU and needs the host page arena: start the worker with --backend host".into(),
            )
        })?;
        let mut kv = ArenaRows::new(rows, geometry.page_size, geometry.row_bytes as usize)
            .map_err(|e| Stop::Failed(format!("model: {e}")))?;
        let mut pages = std::mem::take(&mut self.pages);
        pages.clear();
        pages.extend(reservation.pages_after.iter().map(|p| p.0));
        let mut seq = Sequence::with_pages(pages, start);
        let result = self.runner.prefill(tokens, &mut kv, &mut seq);
        self.pages = seq.take_pages();
        result.map_err(model_stop)
    }
}

fn model_stop(e: ModelError) -> Stop {
    Stop::Failed(format!("model: {e}"))
}

impl Device<'_, '_> {
    /// Prefill with the model: the prompt's rows the route lacks, a chunk at a time.
    pub(super) fn fill_model(&mut self, work: &Work, cancel: &AtomicBool) -> Result<u32, Stop> {
        let request = &work.request;
        let route = &work.route;
        let upto = request.processed();
        self.ensure_route(route)?;
        let piece = self.ctx.config.chunk_size.max(1);
        let mut computed = 0;
        loop {
            let have = self.route_len(route);
            if have >= upto {
                break;
            }
            if cancel.load(Ordering::Relaxed) {
                return Err(Stop::Cancelled);
            }
            let n = (upto - have).min(piece);
            let tokens = token_range(&request.tokens, have, have + n)?;
            let t0 = Instant::now();
            let Device {
                memory, ctx, model, ..
            } = self;
            let engine = model
                .as_mut()
                .ok_or_else(|| Stop::Failed("no model loaded".into()))?;
            append_with(&ctx.pool, memory.as_mut(), route, have, n, |mem, res| {
                engine.run(mem, res, have, tokens).map(|_| Ok(()))
            })?
            .map_err(|Mismatch(d)| Stop::Failed(d))?;
            self.ctx
                .calibration
                .prefill(t0.elapsed().as_secs_f64() * 1e3, n);
            self.ctx.metrics.counter_add(
                "den_recomputed_tokens_total",
                "Prompt tokens whose KV was computed (not reused from a cache).",
                &[],
                n as f64,
            );
            computed += n;
        }
        Ok(computed)
    }

    /// Repair the prefix, then generate: each step runs the token it consumes (the pending
    /// prompt token, then each generated token) and samples the next from its logits,
    /// until a stop (EOS, a stop token or string), `max_new_tokens`, or the context's end.
    pub(super) fn decode_model(
        &mut self,
        work: &Work,
        cancel: &AtomicBool,
    ) -> Result<OperationOutcome, Stop> {
        self.fill_model(work, cancel)?;
        let request = &work.request;
        let route = &work.route;
        let processed = request.processed();
        let Device {
            memory, ctx, model, ..
        } = self;
        let engine = model
            .as_mut()
            .ok_or_else(|| Stop::Failed("no model loaded".into()))?;
        let text = Arc::clone(&engine.text);
        let context = engine.runner.model().config().context_length as usize;
        let config = generation_config(&request.sampling, &request.id, request.max_new_tokens);
        let mut generation =
            Generation::new(&text.tokenizer, config, request.tokens.len(), context)
                .map_err(|e| Stop::Failed(format!("generation: {e}")))?;
        let mut out: Vec<Token> = Vec::with_capacity(generation.limit().min(4096));
        let mut consumed = request
            .tokens
            .last()
            .copied()
            .ok_or_else(|| Stop::Failed("a request has at least one token".into()))?;
        let finish = loop {
            if cancel.load(Ordering::Relaxed) {
                return Err(Stop::Cancelled);
            }
            let i = out.len() as u32;
            let t0 = Instant::now();
            let position = processed + i;
            let (token, finished) = append_with(
                &ctx.pool,
                memory.as_mut(),
                route,
                position,
                1,
                |mem, res| {
                    let logits = engine.run(mem, res, position, &[consumed])?;
                    match generation.step(&text.tokenizer, logits) {
                        Ok(Step::Token { id, .. }) => Ok(Ok((id, None))),
                        Ok(Step::Finished { id, reason, .. }) => Ok(Ok((id, Some(reason)))),
                        Err(e) => Err(Stop::Failed(format!("sampling: {e}"))),
                    }
                },
            )?
            .map_err(|Mismatch(d)| Stop::Failed(d))?;
            out.push(token);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            if i == 0 {
                ctx.calibration.first_token(ms);
            } else {
                ctx.calibration.decode_step(ms);
            }
            let _ = ctx.events.send(DeviceEvent::Token {
                assignment: work.assignment.clone(),
                token,
                index: i,
            });
            if let Some(reason) = finished {
                break reason;
            }
            consumed = token;
        };
        let stop = match finish {
            FinishReason::Stop => StopReason::Eos,
            FinishReason::Length if out.len() < request.max_new_tokens as usize => {
                StopReason::Capacity
            }
            FinishReason::Length => StopReason::Length,
        };
        Ok(OperationOutcome::Decoded { tokens: out, stop })
    }
}
