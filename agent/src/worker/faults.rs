//! Fault injection for end-to-end tests. **Off by default**: nothing here has any effect
//! unless the worker runs with `--fault-admin ADDR`, which serves a loopback-only HTTP
//! endpoint that flips these switches (see `worker::admin`).
//!
//! - `drop_inbound`: drop every frame arriving from the router (a directed partition
//!   router → worker; heartbeats and results still flow out);
//! - `restore_delay_ms`: sleep this long before scattering each restored chunk (to kill or
//!   pause a worker in the middle of a restore);
//! - `fetch_delay_ms`: every chunk fetch of a restore waits this long before it reads
//!   (a remote store's latency; fetches of one restore overlap, see `worker::fetch`);
//! - `outbound`: what happens to frames on their way to the router: each sent twice
//!   (duplicated), each pair swapped (reordered), or each held back a while (late).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

/// What the fault injector does to frames the worker sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbound {
    AsIs,
    /// Every frame is sent twice.
    Duplicate,
    /// Frames go in swapped pairs: the second of each pair before the first (a lone
    /// frame is sent after a short wait for a partner).
    Reorder,
    /// Every frame waits `outbound_delay_ms` before it is sent.
    Delay,
}

impl Outbound {
    pub fn parse(s: &str) -> Option<Outbound> {
        Some(match s {
            "none" => Outbound::AsIs,
            "duplicate" => Outbound::Duplicate,
            "reorder" => Outbound::Reorder,
            "delay" => Outbound::Delay,
            _ => return None,
        })
    }
}

#[derive(Debug, Default)]
pub struct Faults {
    drop_inbound: AtomicBool,
    restore_delay_ms: AtomicU64,
    fetch_delay_ms: AtomicU64,
    outbound: AtomicU8,
    outbound_delay_ms: AtomicU64,
}

impl Faults {
    pub fn drop_inbound(&self) -> bool {
        self.drop_inbound.load(Ordering::Relaxed)
    }

    pub fn set_drop_inbound(&self, on: bool) {
        self.drop_inbound.store(on, Ordering::Relaxed);
    }

    pub fn restore_delay_ms(&self) -> u64 {
        self.restore_delay_ms.load(Ordering::Relaxed)
    }

    pub fn set_restore_delay_ms(&self, ms: u64) {
        self.restore_delay_ms.store(ms, Ordering::Relaxed);
    }

    pub fn fetch_delay_ms(&self) -> u64 {
        self.fetch_delay_ms.load(Ordering::Relaxed)
    }

    pub fn set_fetch_delay_ms(&self, ms: u64) {
        self.fetch_delay_ms.store(ms, Ordering::Relaxed);
    }

    pub fn outbound(&self) -> Outbound {
        match self.outbound.load(Ordering::Relaxed) {
            1 => Outbound::Duplicate,
            2 => Outbound::Reorder,
            3 => Outbound::Delay,
            _ => Outbound::AsIs,
        }
    }

    pub fn outbound_delay_ms(&self) -> u64 {
        self.outbound_delay_ms.load(Ordering::Relaxed)
    }

    pub fn set_outbound(&self, mode: Outbound, delay_ms: u64) {
        let code = match mode {
            Outbound::AsIs => 0,
            Outbound::Duplicate => 1,
            Outbound::Reorder => 2,
            Outbound::Delay => 3,
        };
        self.outbound_delay_ms.store(delay_ms, Ordering::Relaxed);
        self.outbound.store(code, Ordering::Relaxed);
    }
}
