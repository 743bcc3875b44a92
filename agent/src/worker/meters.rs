//! What the worker measures about itself for its heartbeat (spec §6.2): the predicted
//! remaining work of the execution queue, and live calibration of the engine's costs.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use den_protocol::calibration::Ewma;
use den_protocol::ids::AssignmentId;

/// The execution queue's predicted remaining work: the sum of the declared costs of
/// queued operations plus what is left of the running one, plus the operations accepted
/// assignments will still queue (an assignment queues one operation at a time — restore,
/// prefill, decode — and on the FIFO device a later request's first token waits for the
/// decode of one that was prefilling when it arrived). This is the heartbeat's
/// `queue_ms`, so a busy worker is priced by the work it really has ahead of it.
#[derive(Debug, Default)]
pub struct QueueMeter {
    jobs: Mutex<BTreeMap<u64, QueuedJob>>,
    /// Per accepted assignment, the declared cost of its operations not queued yet.
    future: Mutex<BTreeMap<AssignmentId, f64>>,
}

#[derive(Debug, Clone, Copy)]
struct QueuedJob {
    predicted_ms: f64,
    started: Option<Instant>,
}

impl QueueMeter {
    /// A job entered the queue with a predicted cost.
    pub fn enqueue(&self, job: u64, predicted_ms: f64) {
        self.lock().insert(
            job,
            QueuedJob {
                predicted_ms: predicted_ms.max(0.0),
                started: None,
            },
        );
    }

    /// The device thread picked the job up.
    pub fn start(&self, job: u64) {
        if let Some(j) = self.lock().get_mut(&job) {
            j.started = Some(Instant::now());
        }
    }

    /// The job left the queue (finished, failed or skipped).
    pub fn finish(&self, job: u64) {
        self.lock().remove(&job);
    }

    /// The operations `assignment` will still queue after the ones queued so far.
    pub fn set_future(&self, assignment: &AssignmentId, predicted_ms: f64) {
        let mut future = self.future.lock().unwrap_or_else(|p| p.into_inner());
        if predicted_ms > 0.0 {
            future.insert(assignment.clone(), predicted_ms);
        } else {
            future.remove(assignment);
        }
    }

    /// The assignment ended: it queues nothing more.
    pub fn clear_future(&self, assignment: &AssignmentId) {
        self.future
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(assignment);
    }

    /// Predicted milliseconds until the queue is empty, including the operations
    /// accepted assignments will still queue.
    pub fn remaining_ms(&self) -> f64 {
        let future: f64 = self
            .future
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .sum();
        future + self.queued_ms()
    }

    /// Predicted milliseconds of the operations in the queue now.
    fn queued_ms(&self) -> f64 {
        let now = Instant::now();
        self.lock()
            .values()
            .map(|j| match j.started {
                Some(t) => (j.predicted_ms - now.duration_since(t).as_secs_f64() * 1e3).max(0.0),
                None => j.predicted_ms,
            })
            .sum::<f64>()
            .max(0.0)
    }

    /// Jobs queued or running.
    pub fn depth(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, QueuedJob>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Live EWMAs of the engine's measured costs; the configured values are the fallback
/// until the first sample (spec §6.2).
#[derive(Debug, Default)]
pub struct Calibration {
    inner: Mutex<CalibrationValues>,
}

/// A copy of the calibration at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct CalibrationValues {
    pub prefill_ms_per_token: Ewma,
    pub first_token_ms: Ewma,
    pub decode_ms_per_token: Ewma,
    /// Tokens each finished decode produced: the engine plan's mean output length.
    pub output_tokens: Ewma,
}

impl Calibration {
    pub fn prefill(&self, ms: f64, tokens: u32) {
        if tokens > 0 {
            self.lock().prefill_ms_per_token.observe(ms / tokens as f64);
        }
    }

    pub fn first_token(&self, ms: f64) {
        self.lock().first_token_ms.observe(ms);
    }

    pub fn decode_step(&self, ms: f64) {
        self.lock().decode_ms_per_token.observe(ms);
    }

    pub fn output(&self, tokens: usize) {
        self.lock().output_tokens.observe(tokens as f64);
    }

    pub fn snapshot(&self) -> CalibrationValues {
        *self.lock()
    }

    fn lock(&self) -> MutexGuard<'_, CalibrationValues> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use den_protocol::ids::RequestId;

    use super::*;

    #[test]
    fn queue_counts_what_accepted_assignments_will_still_queue() {
        let q = QueueMeter::default();
        let a = AssignmentId {
            request: RequestId::new("r"),
            attempt: 1,
        };
        q.enqueue(1, 10.0);
        q.set_future(&a, 40.0);
        assert!((q.remaining_ms() - 50.0).abs() < 1e-9);
        // Its next operation is queued: the future shrinks by as much.
        q.finish(1);
        q.enqueue(2, 30.0);
        q.set_future(&a, 10.0);
        assert!((q.remaining_ms() - 40.0).abs() < 1e-9);
        q.clear_future(&a);
        assert!((q.remaining_ms() - 30.0).abs() < 1e-9);
    }

    #[test]
    fn queue_sums_queued_and_remaining_work() {
        let q = QueueMeter::default();
        q.enqueue(1, 100.0);
        q.enqueue(2, 50.0);
        assert_eq!(q.depth(), 2);
        assert!((q.remaining_ms() - 150.0).abs() < 1e-9);
        q.start(1);
        let r = q.remaining_ms();
        assert!(r <= 150.0 && r > 100.0, "{r}");
        q.finish(1);
        q.finish(2);
        assert_eq!(q.remaining_ms(), 0.0);
        assert_eq!(q.depth(), 0);
    }

    #[test]
    fn calibration_averages_per_token() {
        let c = Calibration::default();
        c.prefill(100.0, 10);
        assert_eq!(c.snapshot().prefill_ms_per_token.or(0.0), 10.0);
        c.prefill(5.0, 0);
        assert_eq!(c.snapshot().prefill_ms_per_token.count, 1);
    }
}
