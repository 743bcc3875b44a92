//! Declared costs of the synthetic engine: what the execution queue really spends (it
//! sleeps or busy-waits for these durations), and what the worker advertises as its
//! initial calibration before live EWMAs exist (spec §6.2).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Per-token costs in milliseconds. All values are finite and ≥ 0 (checked by
/// [`EngineCosts::new`] and [`EngineCosts::validate`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EngineCosts {
    /// Cost of prefilling one prompt token that has no cached KV.
    pub prefill_ms_per_token: f64,
    /// Cost of each decode step after the first token.
    pub decode_ms_per_token: f64,
    /// Fixed cost of producing the first token once the prefix is in place.
    pub first_token_ms: f64,
}

impl Default for EngineCosts {
    /// Roughly a 1B-parameter model on one modern GPU, scaled so that the demo shows
    /// visible differences between cache hits and misses: 0.05 ms per prefilled token
    /// (12.8 ms for a 256-token chunk), 5 ms per decode step, 2 ms to the first token.
    fn default() -> Self {
        EngineCosts {
            prefill_ms_per_token: 0.05,
            decode_ms_per_token: 5.0,
            first_token_ms: 2.0,
        }
    }
}

/// A cost that is negative, NaN or infinite.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("engine cost {name} = {value} is invalid: costs must be finite milliseconds ≥ 0")]
pub struct CostError {
    pub name: &'static str,
    pub value: f64,
}

impl EngineCosts {
    pub fn new(
        prefill_ms_per_token: f64,
        decode_ms_per_token: f64,
        first_token_ms: f64,
    ) -> Result<Self, CostError> {
        let c = EngineCosts {
            prefill_ms_per_token,
            decode_ms_per_token,
            first_token_ms,
        };
        c.validate()?;
        Ok(c)
    }

    /// Checks every field (use after deserialising from configuration).
    pub fn validate(&self) -> Result<(), CostError> {
        for (name, value) in [
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            ("decode_ms_per_token", self.decode_ms_per_token),
            ("first_token_ms", self.first_token_ms),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(CostError { name, value });
            }
        }
        Ok(())
    }

    /// Milliseconds to prefill `tokens` uncached tokens.
    pub fn prefill_ms(&self, tokens: u64) -> f64 {
        self.prefill_ms_per_token * tokens as f64
    }

    /// Milliseconds to produce `new_tokens` tokens once the prefix is in place: the first
    /// token costs `first_token_ms`, every further one `decode_ms_per_token`.
    pub fn generate_ms(&self, new_tokens: u64) -> f64 {
        match new_tokens {
            0 => 0.0,
            n => self.first_token_ms + self.decode_ms_per_token * (n - 1) as f64,
        }
    }

    pub fn prefill(&self, tokens: u64) -> Duration {
        duration_ms(self.prefill_ms(tokens))
    }

    pub fn first_token(&self) -> Duration {
        duration_ms(self.first_token_ms)
    }

    pub fn decode_step(&self) -> Duration {
        duration_ms(self.decode_ms_per_token)
    }
}

/// Milliseconds as a `Duration`; invalid values (rejected at the edge) give zero.
fn duration_ms(ms: f64) -> Duration {
    if ms.is_finite() && ms > 0.0 {
        Duration::from_secs_f64(ms / 1e3)
    } else {
        Duration::ZERO
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_scale_with_tokens_and_reject_bad_values() {
        let c = EngineCosts::new(0.5, 4.0, 3.0).unwrap();
        assert_eq!(c.prefill_ms(10), 5.0);
        assert_eq!(c.generate_ms(0), 0.0);
        assert_eq!(c.generate_ms(1), 3.0);
        assert_eq!(c.generate_ms(3), 11.0);
        assert_eq!(c.prefill(4), Duration::from_millis(2));
        assert_eq!(c.decode_step(), Duration::from_millis(4));
        assert!(EngineCosts::new(-1.0, 1.0, 1.0).is_err());
        let e = EngineCosts::new(1.0, f64::NAN, 1.0).unwrap_err();
        assert_eq!(e.name, "decode_ms_per_token");
        assert!(EngineCosts::default().validate().is_ok());
    }
}
