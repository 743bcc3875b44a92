//! What a real model's step costs, fitted from the steps the worker runs: the
//! [`StepCosts::Fitted`] its engine plan reports, which the router replays to predict a
//! request's first token.
//!
//! A step's wall time on a CPU is close to linear in four terms: a fixed cost (the weight
//! pass and the threads' hand-offs), its rows, the causal attention positions of its
//! prompt rows (Σ of their positions) and the KV tokens its decode rows read. A
//! least-squares fit of those over the recent steps, exponentially forgotten, follows a
//! changing machine load within a few dozen steps. The fit before this one took a row's
//! cost from 16-row steps and had no attention term: on a two-worker SmolLM2 cluster
//! whose queues grew to long prompts (steps of 64 rows over 190 k positions took 1.8 s,
//! 7× a short one) the router predicted about half the measured TTFT (`den-fleet validate
//! --model-file`, BENCHMARKS.md).

use std::time::Instant;

use den_model::Runner;
use den_model::kv::Sequence;
use den_protocol::engine_plan::{StepCosts, positions};

/// How much each older step's weight shrinks per step: the last ~50 steps dominate.
const FORGET: f64 = 0.98;
/// Feature scales: the normal equations stay well-conditioned (rows, positions and
/// context differ by orders of magnitude).
const SCALE: [f64; 4] = [1.0, 64.0, 1e5, 1e4];
/// Ridge on the three slopes, relative to the intercept's weight: a term the steps have
/// not exercised (no long context yet) is held at 0 rather than fitted to noise.
const RIDGE: f64 = 1e-6;
/// Steps seen before the fit reports costs.
const MIN_STEPS: f64 = 3.0;

/// One step's shape and duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSample {
    pub rows: u32,
    /// Σ of the causal attention positions of the step's prompt rows.
    pub positions: f64,
    /// KV tokens the step's decode rows read.
    pub context: u64,
    pub ms: f64,
}

impl StepSample {
    fn features(&self) -> [f64; 4] {
        [
            1.0,
            f64::from(self.rows) / SCALE[1],
            self.positions / SCALE[2],
            self.context as f64 / SCALE[3],
        ]
    }
}

/// Exponentially weighted normal equations of `ms = x · β`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StepFit {
    xtx: [[f64; 4]; 4],
    xty: [f64; 4],
    weight: f64,
}

impl StepFit {
    pub fn observe(&mut self, s: StepSample) {
        if s.rows == 0 || !s.ms.is_finite() || s.ms <= 0.0 || !s.positions.is_finite() {
            return;
        }
        let x = s.features();
        for i in 0..4 {
            for j in 0..4 {
                self.xtx[i][j] = FORGET * self.xtx[i][j] + x[i] * x[j];
            }
            self.xty[i] = FORGET * self.xty[i] + x[i] * s.ms;
        }
        self.weight = FORGET * self.weight + 1.0;
    }

    /// The fitted costs, every term ≥ 0 (a term whose fit came out negative is dropped and
    /// the rest refitted); `None` before [`MIN_STEPS`] steps.
    pub fn costs(&self) -> Option<StepCosts> {
        if self.weight < MIN_STEPS * FORGET.powi(3) {
            return None;
        }
        let mut active = [true; 4];
        let beta = loop {
            let beta = self.solve(&active)?;
            let worst = (0..4)
                .filter(|&i| active[i] && beta[i] < 0.0)
                .min_by(|&a, &b| beta[a].total_cmp(&beta[b]));
            match worst {
                Some(i) => active[i] = false,
                None => break beta,
            }
            if !active.iter().any(|a| *a) {
                return None;
            }
        };
        let us = |i: usize| beta[i] / SCALE[i] * 1e3;
        Some(StepCosts::Fitted {
            step_us: us(0),
            row_us: us(1),
            attention_us_per_position: us(2),
            context_us_per_token: us(3),
        })
    }

    /// β over the `active` features (the others 0), by Gaussian elimination with partial
    /// pivoting on the ridged normal equations.
    fn solve(&self, active: &[bool; 4]) -> Option<[f64; 4]> {
        let idx: Vec<usize> = (0..4).filter(|&i| active[i]).collect();
        let n = idx.len();
        let mut a = vec![vec![0.0; n + 1]; n];
        let ridge = RIDGE * self.xtx[0][0].max(1e-12);
        for (r, &i) in idx.iter().enumerate() {
            for (c, &j) in idx.iter().enumerate() {
                a[r][c] = self.xtx[i][j] + if i == j && i != 0 { ridge } else { 0.0 };
            }
            a[r][n] = self.xty[i];
        }
        for col in 0..n {
            let pivot = (col..n).max_by(|&x, &y| a[x][col].abs().total_cmp(&a[y][col].abs()))?;
            if a[pivot][col].abs() < 1e-12 {
                return None;
            }
            a.swap(col, pivot);
            for r in 0..n {
                if r != col {
                    let f = a[r][col] / a[col][col];
                    let pivot_row = a[col].clone();
                    for (x, p) in a[r][col..].iter_mut().zip(&pivot_row[col..]) {
                        *x -= f * p;
                    }
                }
            }
        }
        let mut beta = [0.0; 4];
        for (r, &i) in idx.iter().enumerate() {
            beta[i] = a[r][n] / a[r][r];
            if !beta[i].is_finite() {
                return None;
            }
        }
        Some(beta)
    }

    /// A fit seeded by timing the model on scratch KV before the worker serves (after one
    /// untimed pass that warms the weights' pages and the thread pool): a prompt of
    /// [`CALIBRATION_CHUNKS`] full steps of `chunk` rows (growing attention), one-row
    /// decode steps after it, and a 16-row step. Without it the worker reports no plan
    /// until its first steps, and the router prices every request of a cold burst by
    /// defaults (on a cold two-worker SmolLM2 cluster its predictions were 99 % low).
    /// `None` when the scratch run fails (the fit then starts from the first real steps).
    pub fn calibrated(runner: &mut Runner<'_, '_>, chunk: u32) -> Option<StepFit> {
        let chunk = chunk.clamp(1, 64);
        let layout = runner.model().kv_layout();
        let vocab = u32::try_from(runner.model().vocab()).ok()?.max(1);
        let page = 16u32;
        let prompt_len = CALIBRATION_CHUNKS * chunk;
        let need = prompt_len + DECODES + 16 + 2;
        let mut kv = den_model::HostKvPages::new(layout, page, need.div_ceil(page) + 1).ok()?;
        let token = |i: u32| (i * 7 + 1) % vocab;
        let mut fit = StepFit::default();
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, need).ok()?;
        runner.prefill(&[token(0)], &mut kv, &mut seq).ok()?; // warm-up, untimed
        kv.release(&mut seq);
        let mut seq = Sequence::new();
        kv.reserve(&mut seq, need).ok()?;
        let mut len = 0u32;
        let mut timed = |rows: &[u32], decode: bool, len: &mut u32| -> Option<StepSample> {
            let t0 = Instant::now();
            if decode {
                runner.decode(rows[0], &mut kv, &mut seq).ok()?;
            } else {
                runner.prefill(rows, &mut kv, &mut seq).ok()?;
            }
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            let n = u32::try_from(rows.len()).ok()?;
            let s = StepSample {
                rows: n,
                positions: if decode {
                    0.0
                } else {
                    positions(*len, *len + n)
                },
                context: if decode { u64::from(*len) } else { 0 },
                ms,
            };
            *len += n;
            Some(s)
        };
        for c in 0..CALIBRATION_CHUNKS {
            let rows: Vec<u32> = (c * chunk..(c + 1) * chunk).map(token).collect();
            fit.observe(timed(&rows, false, &mut len)?);
        }
        for d in 0..DECODES {
            fit.observe(timed(&[token(prompt_len + d)], true, &mut len)?);
        }
        let rows: Vec<u32> = (0..16).map(|i| token(need + i)).collect();
        fit.observe(timed(&rows, false, &mut len)?);
        Some(fit)
    }
}

/// Full prompt steps the calibration times.
const CALIBRATION_CHUNKS: u32 = 3;
/// One-row decode steps the calibration times.
const DECODES: u32 = 3;

#[cfg(test)]
mod tests {
    use super::*;

    fn costs(f: &StepFit) -> [f64; 4] {
        match f.costs() {
            Some(StepCosts::Fitted {
                step_us,
                row_us,
                attention_us_per_position,
                context_us_per_token,
            }) => [
                step_us,
                row_us,
                attention_us_per_position,
                context_us_per_token,
            ],
            other => panic!("no fitted costs: {other:?}"),
        }
    }

    #[test]
    fn recovers_a_linear_step_cost_from_mixed_steps() {
        // 12 ms + 2.5 ms/row + 6 µs/position + 20 µs per context token.
        let truth = |rows: u32, pos: f64, ctx: u64| {
            12.0 + 2.5 * f64::from(rows) + 0.006 * pos + 0.02 * ctx as f64
        };
        let mut f = StepFit::default();
        assert!(f.costs().is_none(), "no steps, no costs");
        for k in 0..200u32 {
            let rows = [1, 3, 16, 64][k as usize % 4];
            let start = (k * 37) % 3000;
            let (pos, ctx) = if rows <= 3 {
                (0.0, u64::from(start) * u64::from(rows))
            } else {
                (positions(start, start + rows), 0)
            };
            f.observe(StepSample {
                rows,
                positions: pos,
                context: ctx,
                ms: truth(rows, pos, ctx),
            });
        }
        let c = costs(&f);
        let want = [12_000.0, 2_500.0, 6.0, 20.0];
        for (got, want) in c.iter().zip(want) {
            assert!((got - want).abs() <= 0.01 * want, "{c:?} vs {want:?}");
        }
    }

    #[test]
    fn an_unexercised_term_stays_at_zero_and_no_term_goes_negative() {
        // Short-context steps only (no attention, no decode context), with a little noise.
        let mut f = StepFit::default();
        for k in 0..60u32 {
            let rows = [1, 16, 64][k as usize % 3];
            let noise = if k % 2 == 0 { 0.3 } else { -0.3 };
            f.observe(StepSample {
                rows,
                positions: 0.0,
                context: 0,
                ms: 10.0 + 3.0 * f64::from(rows) + noise,
            });
        }
        let c = costs(&f);
        assert!(c.iter().all(|v| *v >= 0.0), "{c:?}");
        assert!((c[1] - 3_000.0).abs() < 50.0, "{c:?}");
        assert!(c[2] < 1e-3 && c[3] < 1e-3, "{c:?}");
    }

    #[test]
    fn follows_a_change_of_machine_load() {
        let mut f = StepFit::default();
        for k in 0..100u32 {
            let rows = [1, 64][k as usize % 2];
            f.observe(StepSample {
                rows,
                positions: 0.0,
                context: 0,
                ms: 5.0 + 2.0 * f64::from(rows),
            });
        }
        // Twice as slow from here (another process took half the cores).
        for k in 0..300u32 {
            let rows = [1, 64][k as usize % 2];
            f.observe(StepSample {
                rows,
                positions: 0.0,
                context: 0,
                ms: 10.0 + 4.0 * f64::from(rows),
            });
        }
        let c = costs(&f);
        assert!((c[1] - 4_000.0).abs() < 100.0, "{c:?}");
    }

    #[test]
    fn refuses_nonsense_samples() {
        let mut f = StepFit::default();
        for ms in [f64::NAN, -1.0, 0.0, f64::INFINITY] {
            f.observe(StepSample {
                rows: 4,
                positions: 0.0,
                context: 0,
                ms,
            });
        }
        f.observe(StepSample {
            rows: 0,
            positions: 0.0,
            context: 0,
            ms: 3.0,
        });
        assert!(f.costs().is_none());
    }
}
