//! Choosing the next token from the logits, and the generation loop around it (sans-IO:
//! fed logits, it says what to emit and when to stop).
//!
//! [`Sampler`]: greedy when `temperature <= 0`; otherwise temperature, then top-k, min-p
//! and top-p over the tempered distribution (Hugging Face's order), then a draw from a
//! seeded [`Rng`]: the same seed and the same logits give the same tokens. Reuses its
//! buffers: no allocation per token once warm.
//!
//! [`Generation`]: samples, detokenizes (never a partial UTF-8 character), holds back
//! text that may begin a stop string (matched across token boundaries; the stop text is
//! not returned), and ends on EOS and the end-of-turn tokens, on stop token ids, on a stop
//! string, or at `max_tokens` (default: what is left of the context).

mod generation;
mod rng;

pub use generation::{FinishReason, Generation, GenerationConfig, GenerationError, Step};
pub use rng::Rng;

use std::cmp::Ordering;

/// How to choose a token.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerConfig {
    /// Divides the logits; `<= 0` means greedy (the most likely token, the lowest id on a
    /// tie), and the other settings are ignored.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`;
    /// `>= 1` keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; `<= 0` keeps all.
    pub min_p: f32,
    /// The random stream's seed.
    pub seed: u64,
}

impl Default for SamplerConfig {
    /// Temperature 1 over the whole distribution (OpenAI's defaults), seed 0.
    fn default() -> SamplerConfig {
        SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }
}

impl SamplerConfig {
    /// Always the most likely token.
    pub fn greedy() -> SamplerConfig {
        SamplerConfig {
            temperature: 0.0,
            ..SamplerConfig::default()
        }
    }

    pub fn is_greedy(&self) -> bool {
        // NaN counts as greedy too.
        self.temperature.is_nan() || self.temperature <= 0.0
    }
}

/// Chooses tokens from logits. NaN and `-inf` logits are never chosen; `+inf` counts as
/// the largest finite value.
#[derive(Debug, Clone)]
pub struct Sampler {
    config: SamplerConfig,
    rng: Rng,
    /// (logit, then weight; token id), reused across calls.
    cand: Vec<(f32, u32)>,
}

/// Descending by value, then ascending by id: a total order, so selection is repeatable.
fn by_value_desc(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

impl Sampler {
    pub fn new(config: SamplerConfig) -> Sampler {
        let rng = Rng::seeded(config.seed);
        Sampler {
            config,
            rng,
            cand: Vec::new(),
        }
    }

    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// The next token, or `None` when no logit can be chosen (empty, all NaN or `-inf`).
    pub fn sample(&mut self, logits: &[f32]) -> Option<u32> {
        if self.config.is_greedy() {
            return argmax(logits);
        }
        let cfg = &self.config;
        self.cand.clear();
        self.cand.extend(
            logits
                .iter()
                .zip(0u32..)
                .filter(|(l, _)| **l > f32::NEG_INFINITY)
                .map(|(&l, id)| (l.min(f32::MAX), id)),
        );
        if self.cand.is_empty() {
            return None;
        }
        // Top-k (temperature does not change the order).
        if cfg.top_k > 0 && cfg.top_k < self.cand.len() {
            self.cand
                .select_nth_unstable_by(cfg.top_k - 1, by_value_desc);
            self.cand.truncate(cfg.top_k);
        }
        // Tempered weights exp((l - max) / t): the most likely token weighs 1.
        let max = self
            .cand
            .iter()
            .map(|c| c.0)
            .fold(f32::NEG_INFINITY, f32::max);
        let inv_t = 1.0 / cfg.temperature;
        for c in &mut self.cand {
            c.0 = ((c.0 - max) * inv_t).exp();
        }
        // Min-p: relative to the most likely token, whose weight is 1.
        if cfg.min_p > 0.0 {
            let min_p = cfg.min_p;
            self.cand.retain(|c| c.0 >= min_p);
        }
        if cfg.top_p < 1.0 {
            truncate_top_p(&mut self.cand, cfg.top_p.max(0.0));
        }
        let total: f64 = self.cand.iter().map(|c| f64::from(c.0)).sum();
        let mut r = self.rng.next_f64() * total;
        for c in &self.cand {
            r -= f64::from(c.0);
            if r < 0.0 {
                return Some(c.1);
            }
        }
        // Rounding left a sliver past the end: the last candidate.
        self.cand.last().map(|c| c.1)
    }
}

/// The most likely token; the lowest id on a tie; NaN never.
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best: Option<(f32, u32)> = None;
    for (&l, id) in logits.iter().zip(0u32..) {
        if l.is_nan() {
            continue;
        }
        if best.is_none_or(|(b, _)| l > b) {
            best = Some((l, id));
        }
    }
    best.filter(|(b, _)| *b > f32::NEG_INFINITY)
        .map(|(_, id)| id)
}

/// Keeps the fewest most likely candidates whose weights reach `top_p` of the total
/// (always at least one), sorted most likely first. Sorts only as far as needed: the
/// top 256, then 8 times more, until the mass is reached.
fn truncate_top_p(cand: &mut Vec<(f32, u32)>, top_p: f32) {
    let total: f64 = cand.iter().map(|c| f64::from(c.0)).sum();
    let target = f64::from(top_p) * total;
    let n = cand.len();
    let mut k = n.min(256);
    loop {
        if k < n {
            cand.select_nth_unstable_by(k - 1, by_value_desc);
        }
        if let Some(head) = cand.get_mut(..k) {
            head.sort_unstable_by(by_value_desc);
        }
        let mut cum = 0.0f64;
        let mut keep = None;
        for (i, c) in cand.iter().take(k).enumerate() {
            cum += f64::from(c.0);
            if cum >= target {
                keep = Some(i + 1);
                break;
            }
        }
        match keep {
            Some(m) => {
                cand.truncate(m);
                return;
            }
            None if k >= n => return,
            None => k = n.min(k.saturating_mul(8)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_skips_nan_and_prefers_the_lowest_id() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, f32::NAN]), Some(1));
        assert_eq!(argmax(&[f32::NAN, -1.0]), Some(1));
        assert_eq!(argmax(&[]), None);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN]), None);
    }

    #[test]
    fn top_p_sorts_only_as_far_as_needed() {
        // 2000 candidates; the first three hold nearly all the mass.
        let mut cand: Vec<(f32, u32)> = (0..2000).map(|i| (1e-6, i)).collect();
        cand[1500] = (0.5, 1500);
        cand[7] = (0.3, 7);
        cand[999] = (0.2, 999);
        truncate_top_p(&mut cand, 0.9);
        assert_eq!(
            cand.iter().map(|c| c.1).collect::<Vec<_>>(),
            vec![1500, 7, 999]
        );
        // A flat distribution needs everything.
        let mut flat: Vec<(f32, u32)> = (0..3000).map(|i| (1.0, i)).collect();
        truncate_top_p(&mut flat, 1.0 - 1e-7);
        assert!(flat.len() >= 2999);
    }
}
