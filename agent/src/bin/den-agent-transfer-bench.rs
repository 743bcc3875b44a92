//! Host↔device transfer benchmark for the `cuda` page memory backend.
//!
//! Moves contiguous runs of several sizes through `CudaMemory` (pinned staging, one batched
//! copy per run) and prints the median throughput per direction, both as device copy time
//! (CUDA events around the copies) and end to end (including the CPU copy between the
//! caller's buffer and pinned staging), next to the PCIe figures they should be compared
//! with, and next to a plain pinned copy of the same bytes in the same run (one
//! `cuMemcpyHtoDAsync` / `DtoH` of a pinned buffer into a device buffer: the ceiling a
//! restore is measured against). `--json FILE` also writes the figures. Exits with status
//! 2 and a one-line message when there is no CUDA driver or GPU.
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
    /// Also write the figures to this JSON file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
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
        "{:>9}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}  {:>9}  {:>9}",
        "run",
        "H→D copy",
        "H→D e2e",
        "D→H copy",
        "D→H e2e",
        "H→D pinned",
        "D→H pinned",
        "H→D e2e/p",
        "D→H e2e/p"
    );
    let mut best = (0.0f64, 0.0f64);
    let mut rows = Vec::new();
    let ctx = cudarc::driver::CudaContext::new(args.device).map_err(|e| e.to_string())?;
    let stream = ctx.new_stream().map_err(|e| e.to_string())?;
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
        let (pu, pd) = pinned_copies(&ctx, &stream, bytes, args.iters)?;
        println!(
            "{:>6} MiB  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s  {:>7.2} GB/s  {:>8.0} %  {:>8.0} %",
            mib,
            uc,
            ue,
            dc,
            de,
            pu,
            pd,
            ue / pu * 100.0,
            de / pd * 100.0
        );
        best = (best.0.max(uc), best.1.max(dc));
        rows.push(serde_json::json!({
            "mib": mib,
            "h2d_copy_gb_s": uc, "h2d_e2e_gb_s": ue, "h2d_pinned_gb_s": pu,
            "d2h_copy_gb_s": dc, "d2h_e2e_gb_s": de, "d2h_pinned_gb_s": pd,
            "h2d_e2e_of_pinned": ue / pu, "d2h_e2e_of_pinned": de / pd,
        }));
    }
    if let Some(path) = &args.json {
        let doc = serde_json::json!({ "device": m.describe(), "runs": rows });
        std::fs::write(path, doc.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
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

/// Median GB/s of a plain copy of `bytes` between a pinned host buffer and a device
/// buffer, each way: what the restore path is compared with.
fn pinned_copies(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    stream: &std::sync::Arc<cudarc::driver::CudaStream>,
    bytes: usize,
    iters: usize,
) -> Result<(f64, f64), String> {
    // SAFETY: the pinned buffer is written by the device before it is ever read back.
    let mut host = unsafe { ctx.alloc_pinned::<u8>(bytes) }.map_err(|e| e.to_string())?;
    let mut dev = stream.alloc_zeros::<u8>(bytes).map_err(|e| e.to_string())?;
    let mut up = Vec::new();
    let mut down = Vec::new();
    for i in 0..iters + 2 {
        let t = std::time::Instant::now();
        stream
            .memcpy_htod(&host, &mut dev)
            .map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        let u = t.elapsed();
        let t = std::time::Instant::now();
        stream
            .memcpy_dtoh(&dev, &mut host)
            .map_err(|e| e.to_string())?;
        stream.synchronize().map_err(|e| e.to_string())?;
        let d = t.elapsed();
        if i >= 2 {
            up.push(bytes as f64 / u.as_secs_f64().max(1e-12) / 1e9);
            down.push(bytes as f64 / d.as_secs_f64().max(1e-12) / 1e9);
        }
    }
    up.sort_by(f64::total_cmp);
    down.sort_by(f64::total_cmp);
    Ok((
        up.get(up.len() / 2).copied().unwrap_or(0.0),
        down.get(down.len() / 2).copied().unwrap_or(0.0),
    ))
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
