//! Fault injection for end-to-end tests. **Off by default**: nothing here has any effect
//! unless the worker runs with `--fault-admin ADDR`, which serves a loopback-only HTTP
//! endpoint that flips these switches (see `worker::admin`).
//!
//! - `drop_inbound`: drop every frame arriving from the router (a directed partition
//!   router → worker; heartbeats and results still flow out);
//! - `restore_delay_ms`: sleep this long before scattering each restored chunk (to kill or
//!   pause a worker in the middle of a restore).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Faults {
    drop_inbound: AtomicBool,
    restore_delay_ms: AtomicU64,
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
}
