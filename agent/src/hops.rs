//! Where one request's round trip goes: a timestamp at each hop of the path from a
//! client's submission through the router, a worker's WebSocket, its actor and its
//! device thread, and back. Built only with `--features hop-trace`
//! (`den-agent-bench --latency` then prints the median of every hop); without the
//! feature [`mark`] is an empty inline function and nothing is recorded.
//!
//! Each hop keeps only its latest timestamp, so the breakdown is meaningful for one
//! request at a time — the bench's latency loop — and not under concurrent load.

/// A point on one request's path, in path order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hop {
    /// The client hands the request to the router.
    Submitted,
    /// The router actor takes the submission from its inbox.
    AtRouter,
    /// The router node has decided: the offer is among its effects.
    Decided,
    /// The offer's frame is encoded and queued for the worker's connection.
    OfferQueued,
    /// The worker's connection has read and decoded the offer.
    OfferRead,
    /// The worker actor takes the offer.
    OfferAtWorker,
    /// The worker actor queues the prefill on the device thread.
    JobQueued,
    /// The device thread takes the job.
    JobTaken,
    /// The device thread reports the decode's outcome.
    Decoded,
    /// The worker actor takes that outcome.
    DoneAtWorker,
    /// The result's frame is encoded and queued for the router.
    ResultQueued,
    /// The router's connection has read and decoded the result.
    ResultRead,
    /// The router actor takes the result.
    ResultAtRouter,
    /// The client has the completed delivery.
    Delivered,
}

/// Every hop, in path order, with what the time since the previous one is spent on.
pub const PATH: [(Hop, &str); 14] = [
    (Hop::Submitted, "submission"),
    (Hop::AtRouter, "client → router actor (channel)"),
    (Hop::Decided, "router node: the decision"),
    (Hop::OfferQueued, "offer encoded and queued"),
    (
        Hop::OfferRead,
        "router writer → socket → worker reader, decoded",
    ),
    (Hop::OfferAtWorker, "worker reader → worker actor (channel)"),
    (Hop::JobQueued, "worker machine: admission, accept queued"),
    (Hop::JobTaken, "worker actor → device thread (wake)"),
    (Hop::Decoded, "device: prefill and decode step"),
    (Hop::DoneAtWorker, "device thread → worker actor (wake)"),
    (
        Hop::ResultQueued,
        "worker machine: result encoded and queued",
    ),
    (
        Hop::ResultRead,
        "worker writer → socket → router reader, decoded",
    ),
    (
        Hop::ResultAtRouter,
        "router reader → router actor (channel)",
    ),
    (Hop::Delivered, "router node → client (channel)"),
];

#[cfg(feature = "hop-trace")]
mod on {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    static AT: [AtomicU64; super::PATH.len()] = [const { AtomicU64::new(0) }; super::PATH.len()];
    static EPOCH: OnceLock<Instant> = OnceLock::new();

    pub fn mark(hop: super::Hop) {
        let ns = EPOCH.get_or_init(Instant::now).elapsed().as_nanos();
        AT[hop as usize].store(u64::try_from(ns).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    pub fn read() -> Option<[u64; super::PATH.len()]> {
        Some(std::array::from_fn(|i| AT[i].load(Ordering::Relaxed)))
    }
}

/// Records that the request being traced reached `hop` now.
#[cfg(feature = "hop-trace")]
pub use on::mark;

/// Each hop's latest timestamp (ns), in [`PATH`] order; `None` without `hop-trace`.
#[cfg(feature = "hop-trace")]
pub use on::read;

/// Records nothing: built without `hop-trace`.
#[cfg(not(feature = "hop-trace"))]
#[inline(always)]
pub fn mark(_hop: Hop) {}

/// `None`: built without `hop-trace`.
#[cfg(not(feature = "hop-trace"))]
pub fn read() -> Option<[u64; PATH.len()]> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_lists_every_hop_once_in_order() {
        for (i, (hop, _)) in PATH.iter().enumerate() {
            assert_eq!(*hop as usize, i, "{hop:?} is out of place");
        }
    }
}
