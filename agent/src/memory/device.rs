//! What den knows about a GPU and how it opens one, whether or not this binary was built
//! with CUDA support (cargo feature `cuda`): sizing and options live here so both the
//! cudarc backend and its stand-in share them.

/// Default size of each pinned staging buffer: a few 256-token chunks of a large model.
pub const DEFAULT_STAGING_BYTES: usize = 64 << 20;

/// Device memory kept free for the CUDA context, staging and other allocations when
/// sizing a page arena: the larger of 512 MiB and 2 % of the device.
pub(crate) const MIN_HEADROOM_BYTES: u64 = 512 << 20;

/// What the driver reports about one GPU.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub compute_capability: (i32, i32),
}

impl DeviceInfo {
    /// Bytes an arena may use: the smaller of `budget_bytes` and the free memory minus
    /// headroom (the larger of 512 MiB and 2 % of the device).
    pub fn usable_bytes(&self, budget_bytes: u64) -> u64 {
        let headroom = MIN_HEADROOM_BYTES.max(self.total_bytes / 50);
        budget_bytes.min(self.free_bytes.saturating_sub(headroom))
    }

    /// How many pages of `page_bytes` fit in `budget_bytes` on this device (see
    /// [`DeviceInfo::usable_bytes`]), capped at `i32::MAX`.
    pub fn max_pages_for(&self, budget_bytes: u64, page_bytes: u64) -> u32 {
        let pages = self.usable_bytes(budget_bytes) / page_bytes.max(1);
        pages.min(i32::MAX as u64) as u32
    }
}

/// Options for `CudaMemory::open_with`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    /// Bytes of each pinned staging buffer (one for uploads, one for downloads).
    pub staging_bytes: usize,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            staging_bytes: DEFAULT_STAGING_BYTES,
        }
    }
}
