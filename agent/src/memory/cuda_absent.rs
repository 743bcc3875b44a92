//! The `cuda` backend in a binary built without the cargo feature `cuda` (the operator's
//! `den`, whose demo runs host memory only): the same API, and every way to open a device
//! says, in one line, that this binary cannot. `den-agent` is built with the feature.

pub use crate::memory::device::{CudaOptions, DEFAULT_STAGING_BYTES, DeviceInfo};
use crate::memory::{
    ArenaGeometry, BackendKind, Gathered, MemoryError, PageIndex, PageMemory, RowRun,
    TransferStats, TransferTotals,
};

fn not_built() -> MemoryError {
    MemoryError::Unavailable(
        "this binary was built without CUDA support (cargo feature `cuda`); use den-agent, or --backend host"
            .to_owned(),
    )
}

/// Always false: without the feature, no driver can be loaded.
pub fn driver_present() -> bool {
    false
}

pub fn device_count() -> Result<usize, MemoryError> {
    Err(not_built())
}

pub fn probe(_ordinal: usize) -> Result<DeviceInfo, MemoryError> {
    Err(not_built())
}

/// A device arena that cannot exist in this binary (no value of it can be made).
pub enum CudaMemory {}

impl CudaMemory {
    pub fn open(_ordinal: usize, _geometry: ArenaGeometry) -> Result<Self, MemoryError> {
        Err(not_built())
    }

    pub fn open_with(
        _ordinal: usize,
        _geometry: ArenaGeometry,
        _options: CudaOptions,
    ) -> Result<Self, MemoryError> {
        Err(not_built())
    }

    pub fn info(&self) -> &DeviceInfo {
        match *self {}
    }

    pub fn max_pages_for(&self, _budget_bytes: u64) -> u32 {
        match *self {}
    }
}

impl PageMemory for CudaMemory {
    fn kind(&self) -> BackendKind {
        match *self {}
    }
    fn geometry(&self) -> ArenaGeometry {
        match *self {}
    }
    fn write_gathered(
        &mut self,
        _runs: &[RowRun],
        _src: Gathered<'_>,
    ) -> Result<TransferStats, MemoryError> {
        match *self {}
    }
    fn read_runs(
        &mut self,
        _runs: &[RowRun],
        _dst: &mut [u8],
    ) -> Result<TransferStats, MemoryError> {
        match *self {}
    }
    fn copy_page(
        &mut self,
        _src: PageIndex,
        _dst: PageIndex,
    ) -> Result<TransferStats, MemoryError> {
        match *self {}
    }
    fn totals(&self) -> &TransferTotals {
        match *self {}
    }
    fn describe(&self) -> String {
        match *self {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_a_device_without_the_feature_is_one_clear_line() {
        let geometry = ArenaGeometry::new(16, 4, 64).unwrap();
        // CudaMemory has no values without the feature: the pattern is irrefutable.
        let Err(e) = CudaMemory::open(0, geometry);
        let m = e.to_string();
        assert!(
            m.contains("without CUDA support") && m.contains("--backend host"),
            "{m}"
        );
        assert!(!m.contains('\n'));
        assert!(!driver_present());
    }
}
