//! Host↔device transfer benchmark for the `cuda` page memory backend.
//!
//! Moves contiguous runs of several sizes through `CudaMemory` (pinned staging, one batched
//! copy per run) and prints the median throughput per direction, both as device copy time
//! (CUDA events around the copies) and end to end (including the CPU copy between the
//! caller's buffer and pinned staging), next to the PCIe figures they should be compared
//! with. Exits with status 2 and a one-line message when there is no CUDA driver or GPU.
//!
//! Run on a GPU host: `cargo run --release -p den-agent --bin den-agent-transfer-bench`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;

use den_agent::memory::cuda::{self, CudaOptions};
use den_agent::memory::{ArenaGeometry, CudaMemory, PageMemory, RowRun, TransferStats};

/// Host↔device transfer benchmark for den's cuda page memory backend.
#[derive(Debug, Parser)]
#[command(name = "den-agent-transfer-bench", version, about)]
struct Args {
    /// GPU ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Run sizes in MiB, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16,256")]
    sizes_mib: Vec<u64>,
    /// Timed iterations per size and direction (after 2 warm-up iterations).
    #[arg(long, default_value_t = 9)]
    iters: usize,
}

const MIB: u64 = 1 << 20;
/// 1 MiB pages: 16 token rows of 64 KiB (a large model's row).
const PAGE_SIZE: u32 = 16;
const ROW_BYTES: u64 = 64 * 1024;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("den-agent-transfer-bench: {e}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    let largest = args.sizes_mib.iter().copied().max().unwrap_or(1).max(1);
    let geometry = ArenaGeometry::new(PAGE_SIZE, (largest + 1) as u32, ROW_BYTES)
        .map_err(|e| e.to_string())?;
    // Staging as large as the largest run, so every run is a single copy.
    let options = CudaOptions {
        staging_bytes: (largest * MIB) as usize,
    };
    let info = cuda::probe(args.device).map_err(|e| e.to_string())?;
    let mut m = CudaMemory::open_with(args.device, geometry, options).map_err(|e| e.to_string())?;
    println!("device: {}", m.describe());
    println!(
        "device memory: {:.1} GiB total, {:.1} GiB free before the arena",
        info.total_bytes as f64 / (1u64 << 30) as f64,
        info.free_bytes as f64 / (1u64 << 30) as f64
    );
    println!(
        "iterations: 2 warm-up + {} timed per size; medians; GB = 10^9 bytes",
        args.iters
    );
    println!();
    println!(
        "{:>9}  {:>12}  {:>12}  {:>12}  {:>12}",
        "run", "H→D copy", "H→D e2e", "D→H copy", "D→H e2e"
    );
    let mut best = (0.0f64, 0.0f64);
    for &mib in &args.sizes_mib {
        let pages = mib.max(1) as u32;
        let runs: Vec<RowRun> = (0..pages)
            .map(|p| RowRun {
                page: p,
                offset: 0,
                len: PAGE_SIZE,
            })
            .collect();
        let bytes = (pages as u64 * MIB) as usize;
        let src: Vec<u8> = (0..bytes).map(|i| (i as u8).wrapping_mul(13)).collect();
        let mut dst = vec![0u8; bytes];
        let mut up = Vec::new();
        let mut down = Vec::new();
        for i in 0..args.iters + 2 {
            let u = m.write_runs(&runs, &src).map_err(|e| e.to_string())?;
            let d = m.read_runs(&runs, &mut dst).map_err(|e| e.to_string())?;
            if i >= 2 {
                up.push(u);
                down.push(d);
            }
        }
        if dst != src {
            return Err(format!(
                "{mib} MiB run read back different bytes than written"
            ));
        }
        let (uc, ue) = (median(&up, |s| s.elapsed), median(&up, |s| s.wall));
        let (dc, de) = (median(&down, |s| s.elapsed), median(&down, |s| s.wall));
        println!(
            "{:>6} MiB  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s",
            mib, uc, ue, dc, de
        );
        best = (best.0.max(uc), best.1.max(dc));
    }
    let mut page_copies = Vec::new();
    for i in 0..args.iters + 2 {
        let s = m.copy_page(0, 1).map_err(|e| e.to_string())?;
        if i >= 2 {
            page_copies.push(s);
        }
    }
    println!(
        "page copy (D→D, 1 MiB page): {:.1} GB/s",
        median(&page_copies, |s| s.elapsed)
    );
    println!();
    println!("compare with (anchors.md §10):");
    println!(
        "  PCIe Gen5 x16: 63 GB/s per direction theoretical, ≈55 GB/s achievable with pinned memory"
    );
    println!(
        "  PCIe Gen4 x16: 31.5 GB/s per direction theoretical, ≈27 GB/s achievable with pinned memory"
    );
    println!(
        "best copy throughput: H→D {:.2} GB/s ({:.0} % of Gen5 achievable), D→H {:.2} GB/s ({:.0} %)",
        best.0,
        best.0 / 55.0 * 100.0,
        best.1,
        best.1 / 55.0 * 100.0
    );
    Ok(())
}

/// Median throughput in GB/s of `time(stat)` over the samples.
fn median(samples: &[TransferStats], time: impl Fn(&TransferStats) -> Duration) -> f64 {
    let mut rates: Vec<f64> = samples
        .iter()
        .map(|s| {
            let secs = time(s).as_secs_f64();
            if secs > 0.0 {
                s.bytes as f64 / secs / 1e9
            } else {
                0.0
            }
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}
