//! Opening a device, and a page arena of its own for runners used without den's worker
//! (tests, `gpu-check`); a worker gives its runner the arena of its CUDA page pool.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};

use super::{DeviceKv, GpuError, libraries::CudaLibraries};

/// GPU `ordinal`'s context, or one line saying why not (no driver, no such device).
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, GpuError> {
    if !CudaLibraries::probe().driver {
        return Err(GpuError::Missing {
            missing: "the CUDA driver (libcuda.so.1)".into(),
        });
    }
    catch_unwind(AssertUnwindSafe(|| CudaContext::new(ordinal)))
        .map_err(|_| GpuError::Missing {
            missing: "a CUDA driver entry point (the driver is older than CUDA 12)".into(),
        })?
        .map_err(|e| GpuError::call(&format!("opening GPU {ordinal}"), e))
}

/// `pages` pages of `page_size` rows of `row_bytes` in device memory, zeroed.
#[derive(Debug)]
pub struct DeviceArena {
    slice: CudaSlice<u8>,
    kv: DeviceKv,
}

impl DeviceArena {
    pub fn new(
        stream: &Arc<CudaStream>,
        page_size: u32,
        pages: u32,
        row_bytes: u64,
    ) -> Result<DeviceArena, GpuError> {
        let bytes = u64::from(page_size)
            .checked_mul(u64::from(pages))
            .and_then(|b| b.checked_mul(row_bytes))
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| GpuError::Unsupported("an arena too large to address".into()))?;
        let slice = stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|e| GpuError::call("allocating a page arena", e))?;
        // Runners use the arena from their own streams, by address: it must be zeroed
        // before this returns.
        stream
            .synchronize()
            .map_err(|e| GpuError::call("zeroing a page arena", e))?;
        let ptr = {
            let (ptr, _sync) = slice.device_ptr(stream);
            ptr
        };
        Ok(DeviceArena {
            kv: DeviceKv {
                ptr,
                bytes: bytes as u64,
                page_size,
                row_bytes,
            },
            slice,
        })
    }

    pub fn kv(&self) -> DeviceKv {
        self.kv
    }

    /// The arena's bytes (for copying rows back in tests).
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }
}
