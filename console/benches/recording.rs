//! Recording benchmarks: seeking in a 200 MB recording (cold open and warm seeks, peak
//! memory), and bytes per hour of a `den demo`-like session.
//!
//! `cargo bench -p den-console --bench recording` (set DEN_BENCH_MB to change the size;
//! the recording is kept under target/ between runs).
//!
//! The measurement runs in a child process so that its peak RSS (VmHWM) is the
//! replayer's, not the generator's.
// A benchmark may unwrap, expect and panic: a broken set-up should stop it loudly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use den_console::model::ModelConfig;
use den_console::record::synthetic::{self, Bulk};
use den_console::record::{Recorder, RecorderConfig};
use den_console::replay::Replayer;
use den_protocol::time::Millis;

fn main() {
    let mb: u64 = std::env::var("DEN_BENCH_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let dir = target_dir().join("den-bench-recordings");
    let plain = dir.join(format!("bulk-{mb}mb.jsonl"));
    let zst = dir.join(format!("bulk-{mb}mb.jsonl.zst"));
    if let Ok(phase) = std::env::var("DEN_BENCH_MEASURE") {
        measure(Path::new(&phase));
        return;
    }
    for path in [&plain, &zst] {
        if !path.exists() {
            generate(path, mb * 1024 * 1024, &plain);
        }
    }
    for path in [&plain, &zst] {
        let exe = std::env::current_exe().expect("exe");
        let status = Command::new(exe)
            .env("DEN_BENCH_MEASURE", path)
            .status()
            .expect("child");
        assert!(status.success());
    }
    bytes_per_hour();
}

fn target_dir() -> PathBuf {
    // target/release/deps/recording-HASH → target/
    std::env::current_exe()
        .ok()
        .and_then(|e| e.parent()?.parent()?.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("target"))
}

fn config(path: &Path) -> RecorderConfig {
    let mut c = RecorderConfig::new(path.to_path_buf(), ModelConfig::default(), Vec::new());
    c.rotate_bytes = u64::MAX;
    c.retention.max_total_bytes = u64::MAX;
    c.channel = 1 << 16;
    c
}

/// Record the bulk stream until the plain file reaches `bytes`; the compressed one
/// records the same number of events.
fn generate(path: &Path, bytes: u64, plain: &Path) {
    std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
    let started = Instant::now();
    let recorder = Recorder::start(config(path)).expect("recorder");
    let target_events = if path == plain {
        None
    } else {
        count_events(plain)
    };
    let mut n = 0u64;
    let mut last = Millis::ZERO;
    for e in Bulk::new(16, 20).expect("bulk") {
        last = e.at;
        recorder.record_waiting(&e);
        n += 1;
        if n.is_multiple_of(4096) {
            match target_events {
                Some(t) if n >= t => break,
                None if std::fs::metadata(path).map_or(0, |m| m.len()) >= bytes => break,
                _ => {}
            }
        }
    }
    let closed = recorder.close(last).expect("close");
    eprintln!(
        "generated {}: {} events, {} bytes, {:.1} s of session, in {:.1} s",
        path.display(),
        closed.events,
        closed.bytes,
        last.0 as f64 / 1000.0,
        started.elapsed().as_secs_f64()
    );
}

fn count_events(path: &Path) -> Option<u64> {
    let text = std::fs::read(path).ok()?;
    Some(
        text.split(|b| *b == b'\n')
            .filter(|l| l.windows(9).any(|w| w == b",\"event\":"))
            .count() as u64,
    )
}

fn measure(path: &Path) {
    let size = std::fs::metadata(path).map_or(0, |m| m.len());
    // Cold: a fresh process-level open (no index in memory; the OS page cache is warm).
    let t = Instant::now();
    let mut r = Replayer::open(path).expect("open");
    let open = t.elapsed();
    let end = r.end();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let points: Vec<Millis> = (0..40).map(|_| Millis(next() % end.0.max(1))).collect();
    let mut cold = Vec::new();
    for p in points.iter().take(10) {
        let t = Instant::now();
        let mut fresh = Replayer::open(path).expect("open");
        fresh.seek(*p).expect("seek");
        fresh.model();
        cold.push(t.elapsed());
    }
    let mut warm = Vec::new();
    for p in &points {
        let t = Instant::now();
        r.seek(*p).expect("seek");
        r.model();
        warm.push(t.elapsed());
    }
    let t = Instant::now();
    r.seek(end).expect("seek");
    let to_end = t.elapsed();
    let events = r.ordinal();
    println!(
        "{} ({:.0} MB, {} events, {:.0} min of session):",
        path.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        size as f64 / 1e6,
        events,
        end.0 as f64 / 60_000.0
    );
    println!("  open (header, zstd frame walk, end time): {}", ms(open));
    println!(
        "  cold open + seek (10 random points): {}",
        stats(&mut cold)
    );
    println!(
        "  warm seek, random order (40 points): {}",
        stats(&mut warm)
    );
    println!("  seek to the end: {}", ms(to_end));
    println!("  peak RSS (VmHWM): {}", vm_hwm());
}

fn stats(v: &mut [Duration]) -> String {
    v.sort();
    let median = v.get(v.len() / 2).copied().unwrap_or_default();
    let p95 = v.get(v.len() * 95 / 100).copied().unwrap_or_default();
    let max = v.last().copied().unwrap_or_default();
    format!("median {}, p95 {}, max {}", ms(median), ms(p95), ms(max))
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn vm_hwm() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM"))
                .map(|l| l.trim_start_matches("VmHWM:").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

/// A `den demo`-like session (three workers heartbeating every second, a request every
/// 500 ms, the router's management API every 2 s) for 10 minutes, extrapolated to an
/// hour.
fn bytes_per_hour() {
    let dir = tempfile_dir();
    let events = synthetic::demo(600).expect("demo");
    for name in ["demo.jsonl", "demo.jsonl.zst"] {
        let path = dir.join(name);
        let recorder = Recorder::start(config(&path)).expect("recorder");
        for e in &events {
            recorder.record_waiting(e);
        }
        let closed = recorder.close(Millis(600_000)).expect("close");
        println!(
            "synthetic demo-like stream (far more repetitive than a real den demo: BENCHMARKS.md), {name}: {} events, {} bytes in 10 min = {:.1} MB/hour",
            closed.events,
            closed.bytes,
            closed.bytes as f64 * 6.0 / 1e6
        );
        let _ = std::fs::remove_file(&path);
    }
}

fn tempfile_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("den-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("tmp");
    d
}
