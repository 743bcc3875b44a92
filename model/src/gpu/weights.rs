//! A model's weights on the device, as [`crate::gpu_plan::host_tensors`] prepares them:
//! matrices dequantized once and rounded to f16 for cuBLAS (Q, K and V stacked; gate and
//! up stacked), norm vectors as f32. A tied output projection is the embedding's copy.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::GpuError;
use crate::arch::Model;
use crate::gpu_plan::{HostData, Tensor, WeightError, host_tensors};

/// A tensor in device memory.
#[derive(Debug)]
pub enum DeviceData {
    F16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
}

/// Every weight a plan names, on the device.
#[derive(Debug)]
pub struct DeviceWeights {
    pub tensors: HashMap<Tensor, DeviceData>,
    /// Bytes uploaded.
    pub bytes: u64,
}

impl From<WeightError> for GpuError {
    fn from(e: WeightError) -> Self {
        GpuError::Unsupported(e.0)
    }
}

impl DeviceWeights {
    /// Uploads `model`'s weights on `stream`, one tensor at a time.
    pub fn upload(model: &Model<'_>, stream: &Arc<CudaStream>) -> Result<DeviceWeights, GpuError> {
        let mut tensors = HashMap::new();
        let mut bytes = 0u64;
        host_tensors(model, |t, host| {
            bytes += host.bytes() as u64;
            let data = match &host.data {
                HostData::F16(v) => stream.clone_htod(v).map(DeviceData::F16),
                HostData::F32(v) => stream.clone_htod(v).map(DeviceData::F32),
            }
            .map_err(|e| GpuError::call(&format!("uploading {t:?}"), e))?;
            tensors.insert(t, data);
            Ok::<(), GpuError>(())
        })?;
        Ok(DeviceWeights { tensors, bytes })
    }

    /// Each tensor's device address (read on `stream`).
    pub fn addresses(&self, stream: &CudaStream) -> Vec<(Tensor, u64)> {
        self.tensors
            .iter()
            .map(|(t, d)| {
                let p = match d {
                    DeviceData::F16(s) => s.device_ptr(stream).0,
                    DeviceData::F32(s) => s.device_ptr(stream).0,
                };
                (*t, p)
            })
            .collect()
    }
}
