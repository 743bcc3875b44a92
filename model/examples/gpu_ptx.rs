//! Writes den's CUDA kernels as PTX for one architecture, for hosts without NVRTC:
//! `cargo run --release -p den-model --features cuda --example gpu_ptx -- compute_90 OUT.ptx`,
//! then run there with `DEN_CUDA_PTX=OUT.ptx` (`agent/gpu-check --stage` does this). Needs
//! NVRTC here, not a GPU.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [arch, out] = args.as_slice() else {
        eprintln!("usage: gpu_ptx ARCH OUT.ptx   (ARCH e.g. compute_90)");
        return ExitCode::from(2);
    };
    match den_model::gpu::compile_ptx(arch) {
        Ok(ptx) => match std::fs::write(out, ptx) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpu_ptx: {out}: {e}");
                ExitCode::from(1)
            }
        },
        Err(e) => {
            eprintln!("gpu_ptx: {e}");
            ExitCode::from(1)
        }
    }
}
