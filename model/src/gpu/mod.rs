//! The forward pass on an NVIDIA GPU (feature `cuda`): the CPU path's computation
//! ([`crate::arch`]) with the matrix products in cuBLAS (f16 weights, dequantized once at
//! load, f16 inputs, f32 results) and everything else in kernels NVRTC compiles at run time
//! ([`kernels`]), K and V read and written **in den's page arena on the device**, in the
//! row layout the CPU path uses, so chunks move between CPU and GPU workers unchanged.
//!
//! Nothing here needs a CUDA toolkit to build: cudarc loads `libcuda`, `libnvrtc` and
//! `libcublas` when a runner is made, trying CUDA 13's `.so.13` names, then CUDA 12's
//! ([`libraries`] says which were loaded). Without them every entry point returns a one-line
//! [`GpuError`] naming what is missing; cudarc's own panics on absent libraries are never
//! reached because presence is checked first.
//!
//! Layout: [`libraries`] (finding and reporting the CUDA libraries), [`kernels`] (the
//! kernel source and its compilation), [`weights`] (upload), [`runner`] (the pass).

mod arena;
pub mod kernels;
pub mod libraries;
pub mod runner;
pub mod weights;

pub use arena::{DeviceArena, open_device};
pub use kernels::{KERNEL_SOURCE, compile_ptx, kernel_names};
pub use libraries::{CudaLibraries, LoadedLibrary, check_libraries, loaded_libraries};
pub use runner::{DeviceKv, GpuRunner};

/// The cudarc den-model was built with (the agent's page arena and tests use the same).
pub use cudarc;

/// What went wrong on the GPU path, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// A CUDA library could not be loaded.
    #[error(
        "the GPU forward pass needs {missing}: install the NVIDIA driver and the CUDA 13 or 12 runtime libraries (libcuda.so.1, libnvrtc.so.13/.12, libcublas.so.13/.12) on the library path, or run with --backend host"
    )]
    Missing { missing: String },
    /// NVRTC rejected the kernels (a bug, or an NVRTC too old for the architecture).
    #[error("compiling den's CUDA kernels failed: {0}")]
    Compile(String),
    /// A driver or cuBLAS call failed.
    #[error("CUDA {what} failed: {detail}")]
    Call { what: String, detail: String },
    /// The model cannot run here (a head too wide for the kernels, …).
    #[error("the GPU forward pass cannot run this model: {0}")]
    Unsupported(String),
}

impl GpuError {
    pub(crate) fn call(what: &str, e: impl std::fmt::Debug) -> GpuError {
        GpuError::Call {
            what: what.to_owned(),
            detail: format!("{e:?}"),
        }
    }
}

impl From<GpuError> for crate::ModelError {
    fn from(e: GpuError) -> Self {
        crate::ModelError::Internal(e.to_string())
    }
}
