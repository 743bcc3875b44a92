//! The declared costs of operations with the worker's current calibration: what each
//! queued operation adds to the heartbeat's `queue_ms`, and what an accepted assignment
//! will still queue after it.

use super::*;

impl Actor {
    /// Declared cost of an operation with the current calibration (for `queue_ms`). A
    /// prefill's job goes on into its decode on the device, so it carries both.
    pub(super) fn predict(&self, op: &Operation) -> f64 {
        match op.kind {
            OperationKind::Prefill => {
                self.predict_kind(OperationKind::Prefill, &op.work)
                    + self.predict_kind(OperationKind::Decode, &op.work)
            }
            kind => self.predict_kind(kind, &op.work),
        }
    }

    /// Declared cost of the operations `op`'s assignment queues after it (a restore is
    /// followed by the prefill of the missing tokens and the decode it goes on into).
    pub(super) fn still_to_queue(&self, op: &Operation) -> f64 {
        match op.kind {
            OperationKind::Restore => {
                self.predict_kind(OperationKind::Prefill, &op.work)
                    + self.predict_kind(OperationKind::Decode, &op.work)
            }
            OperationKind::Prefill | OperationKind::Decode => 0.0,
        }
    }

    fn predict_kind(&self, kind: OperationKind, w: &Work) -> f64 {
        let (prefill, first, decode) = self.costs();
        match kind {
            OperationKind::Restore => w.candidate.prefix_load_ms + w.candidate.gpu_restore_ms,
            OperationKind::Prefill => w.estimate.missing.max(0) as f64 * prefill,
            OperationKind::Decode => {
                first + decode * w.request.max_new_tokens.saturating_sub(1) as f64
            }
        }
    }

    /// (prefill ms/token, first-token ms, decode ms/token): measured, else configured.
    pub(super) fn costs(&self) -> (f64, f64, f64) {
        let c = self.p.calibration.snapshot();
        let cfg = self.p.opts.costs;
        (
            c.prefill_ms_per_token.or(cfg.prefill_ms_per_token),
            c.first_token_ms.or(cfg.first_token_ms),
            c.decode_ms_per_token.or(cfg.decode_ms_per_token),
        )
    }
}
