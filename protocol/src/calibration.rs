//! Exponentially weighted moving averages for live cost calibration (spec §6.2).
//!
//! The first sample initialises the average; afterwards `ewma = α·x + (1−α)·ewma`
//! (default α = 0.2). Non-finite or negative samples are ignored so a broken timer can
//! never poison routing.

use serde::{Deserialize, Serialize};

pub const DEFAULT_ALPHA: f64 = 0.2;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Ewma {
    pub alpha: f64,
    pub value: Option<f64>,
    pub count: u64,
    pub min: f64,
    pub max: f64,
    pub last: f64,
}

impl Default for Ewma {
    fn default() -> Self {
        Ewma::new(DEFAULT_ALPHA)
    }
}

impl Ewma {
    pub fn new(alpha: f64) -> Self {
        Ewma {
            alpha: alpha.clamp(0.0, 1.0),
            value: None,
            count: 0,
            min: 0.0,
            max: 0.0,
            last: 0.0,
        }
    }

    /// Adds a sample; returns false (and changes nothing) for a non-finite or negative one.
    pub fn observe(&mut self, x: f64) -> bool {
        if !x.is_finite() || x < 0.0 {
            return false;
        }
        self.value = Some(match self.value {
            None => x,
            Some(v) => self.alpha * x + (1.0 - self.alpha) * v,
        });
        if self.count == 0 {
            self.min = x;
            self.max = x;
        } else {
            self.min = self.min.min(x);
            self.max = self.max.max(x);
        }
        self.count += 1;
        self.last = x;
        true
    }

    /// The average, or `fallback` (the configured value) before the first sample.
    pub fn or(&self, fallback: f64) -> f64 {
        self.value.unwrap_or(fallback)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sample_initialises_then_blends() {
        let mut e = Ewma::default();
        assert_eq!(e.or(7.0), 7.0);
        assert!(e.observe(10.0));
        assert_eq!(e.value, Some(10.0));
        e.observe(20.0);
        assert!((e.or(0.0) - 12.0).abs() < 1e-9);
        assert_eq!((e.count, e.min, e.max, e.last), (2, 10.0, 20.0, 20.0));
        assert!(!e.observe(f64::NAN));
        assert!(!e.observe(-1.0));
        assert_eq!(e.count, 2);
    }
}
