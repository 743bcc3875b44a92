//! The kernels' CUDA C source (`kernels.cu`), compiled to PTX by NVRTC for the device's
//! compute capability when a runner starts, and the loaded functions.
//!
//! A host without NVRTC can run kernels compiled elsewhere: [`PTX_ENV`] names a PTX file
//! (what `agent/gpu-check --stage` writes with [`compile_ptx`]); the driver JIT-compiles PTX
//! for any newer architecture than the one it was made for.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileOptions, Ptx, compile_ptx_with_opts};

use super::GpuError;
use crate::gpu_plan::Kernel;

/// The kernels' source.
pub const KERNEL_SOURCE: &str = include_str!("kernels.cu");

/// Every kernel entry point in [`KERNEL_SOURCE`]: those plans launch, and the no-op.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    Kernel::ALL
        .iter()
        .map(|k| k.name())
        .chain(std::iter::once(NOOP_NAME))
}

/// Environment variable naming a precompiled PTX file to load instead of compiling.
pub const PTX_ENV: &str = "DEN_CUDA_PTX";

/// The precompiled PTX file [`PTX_ENV`] names, if any.
pub fn ptx_file() -> Option<std::ffi::OsString> {
    std::env::var_os(PTX_ENV)
}

/// The architecture NVRTC targets for compute capability `(major, minor)`: PTX for
/// `compute_MN`, at least `compute_70` (the kernels use `__shfl_xor_sync`).
pub fn arch_for(major: i32, minor: i32) -> String {
    let (major, minor) = if major < 7 { (7, 0) } else { (major, minor) };
    format!("compute_{major}{minor}")
}

/// [`KERNEL_SOURCE`] compiled to PTX for `arch` (e.g. `compute_90`). Needs NVRTC, not a GPU.
pub fn compile_ptx(arch: &str) -> Result<String, GpuError> {
    let libs = super::libraries::CudaLibraries::probe();
    if !libs.nvrtc {
        return Err(GpuError::Missing {
            missing: "NVRTC (libnvrtc.so.13 or .12)".into(),
        });
    }
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some("den_kernels.cu".into()),
        ..Default::default()
    };
    let source = format!("{KERNEL_SOURCE}\n{NOOP}");
    let ptx = compile_ptx_with_opts(source, opts).map_err(|e| GpuError::Compile(one_line(&e)))?;
    Ok(ptx.to_src())
}

/// An empty kernel: launching it measures launch overhead (`gpu-check`).
const NOOP: &str = "extern \"C\" __global__ void den_noop() {}\n";
const NOOP_NAME: &str = "den_noop";

fn one_line(e: &impl std::fmt::Display) -> String {
    e.to_string()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

/// The loaded kernels.
#[derive(Debug)]
pub struct Kernels {
    /// In [`Kernel::ALL`]'s order, which is the enum's.
    functions: Vec<CudaFunction>,
    pub noop: CudaFunction,
    /// Where the PTX came from: `nvrtc compute_90` or the file's path.
    pub origin: String,
    _module: Arc<CudaModule>,
}

impl Kernels {
    /// Compiles (or reads, see [`PTX_ENV`]) and loads the kernels on `ctx`.
    pub fn load(ctx: &Arc<CudaContext>) -> Result<Kernels, GpuError> {
        let (ptx, origin) = match ptx_file() {
            Some(path) => {
                let text = std::fs::read_to_string(&path).map_err(|e| GpuError::Call {
                    what: format!("reading {PTX_ENV}={}", path.to_string_lossy()),
                    detail: e.to_string(),
                })?;
                (text, path.to_string_lossy().into_owned())
            }
            None => {
                let (major, minor) = ctx
                    .compute_capability()
                    .map_err(|e| GpuError::call("reading the compute capability", e))?;
                let arch = arch_for(major, minor);
                (compile_ptx(&arch)?, format!("nvrtc {arch}"))
            }
        };
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|e| GpuError::call("loading the kernels' PTX", e))?;
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| GpuError::call(&format!("finding kernel {name}"), e))
        };
        Ok(Kernels {
            functions: Kernel::ALL
                .iter()
                .map(|k| f(k.name()))
                .collect::<Result<_, _>>()?,
            noop: f(NOOP_NAME)?,
            origin,
            _module: module,
        })
    }

    /// The loaded function of `k`.
    pub fn get(&self, k: Kernel) -> Result<&CudaFunction, GpuError> {
        self.functions
            .get(k as usize)
            .ok_or_else(|| GpuError::Unsupported(format!("kernel {} is not loaded", k.name())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn architectures_are_named_for_nvrtc() {
        assert_eq!(arch_for(9, 0), "compute_90");
        assert_eq!(arch_for(8, 6), "compute_86");
        assert_eq!(arch_for(6, 1), "compute_70");
    }

    #[test]
    fn kernels_are_listed_in_their_enums_order() {
        // `Kernels::get` indexes by the enum's value.
        for (i, k) in Kernel::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i, "{k:?}");
        }
    }

    #[test]
    fn every_kernel_name_is_an_entry_of_the_source() {
        let source = format!("{KERNEL_SOURCE}\n{NOOP}");
        for name in kernel_names() {
            assert!(
                source.contains(&format!("__global__ void {name}(")),
                "{name} is not in kernels.cu"
            );
        }
    }
}
