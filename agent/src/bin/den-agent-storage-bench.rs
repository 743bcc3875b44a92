//! Storage tier and host page memory benchmark.
//!
//! Writes a set of synthetic chunks (default 64 × 8 MiB: 256 tokens of 32 KiB rows, a
//! Llama-3.2-1B chunk) to the `ssd` tier, the `ram` tier and a `file://` object tier (and
//! to S3 when `DEN_TEST_S3_ENDPOINT` is set), then reads the whole set back through each tier's
//! verified `get` and compares the throughput with `cat FILES > /dev/null` over the very
//! same files. Every read is labelled *page-cache warm*: the files were just written and
//! read once before timing, and `cat` runs under the same conditions, so the ratio shows
//! the tier's own overhead (map, SHA-256 verification, copy out), not the disk.
//! Also reports the pieces (raw mmap copy, SHA-256 alone) and the host page memory
//! backend's scatter write / gather read throughput. Medians over `--iters` runs.
//!
//! Run: `cargo run --release -p den-agent --bin den-agent-storage-bench`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use memmap2::Mmap;

use den_agent::engine::SyntheticKv;
use den_agent::memory::{ArenaGeometry, HostMemory, PageMemory, RowRun};
use den_agent::tiers::{
    Chunk, ChunkKey, ChunkMeta, ChunkStore, ContentHash, ObjectConfig, ObjectTier, RamTier,
    S3Settings, Secret, SsdTier,
};
use den_protocol::chunk::plan_chunks;
use den_protocol::ids::ModelFingerprint;

/// Storage tier and host page memory benchmark (page-cache warm).
#[derive(Debug, Parser)]
#[command(name = "den-agent-storage-bench", version, about)]
struct Args {
    /// Scratch directory (a fresh subdirectory is created in it and removed at the end);
    /// defaults to the system temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Number of chunks.
    #[arg(long, default_value_t = 64)]
    chunks: u32,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 256)]
    chunk_tokens: u32,
    /// Bytes per token row.
    #[arg(long, default_value_t = 32 * 1024)]
    row_bytes: u64,
    /// Timed iterations (medians are printed).
    #[arg(long, default_value_t = 5)]
    iters: usize,
}

fn main() -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("den-agent-storage-bench: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("den-agent-storage-bench: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: &Args) -> Result<(), String> {
    let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = Scratch::new(&base)?;
    let set = make_chunks(args)?;
    let total: u64 = set.iter().map(|c| c.payload.len() as u64).sum();
    println!(
        "chunk set: {} chunks × {} tokens × {} B/row = {:.1} MiB payload; scratch {}",
        set.len(),
        args.chunk_tokens,
        args.row_bytes,
        total as f64 / (1 << 20) as f64,
        scratch.0.display()
    );
    println!("all reads page-cache warm (written, then read once before timing); GB = 10^9 B\n");

    // ssd tier.
    let ssd = SsdTier::open(scratch.0.join("ssd"), u64::MAX).map_err(|e| e.to_string())?;
    let put = time_puts(&ssd, &set).await?;
    let ssd_files: Vec<PathBuf> = set.iter().map(|c| ssd.path_of(c.key())).collect();
    let tier: Arc<dyn ChunkStore> = Arc::new(ssd.clone());
    let label = "ssd (mmap, verified get)";
    let cat_rate = report_tier(label, tier, &set, &ssd_files, put, args.iters).await?;
    let raw = median_of(args.iters, || mmap_copy(&ssd_files))?;
    let raw_rate = gbps(file_bytes(&ssd_files), raw);
    println!(
        "  raw mmap + copy, no verify     {raw_rate:>8.2} GB/s   {:>5.2}× cat",
        ratio(raw_rate, cat_rate)
    );
    let sha = median_of(args.iters, || {
        let t0 = Instant::now();
        for c in &set {
            std::hint::black_box(ContentHash::of(&c.payload));
        }
        Ok(t0.elapsed())
    })?;
    println!(
        "  SHA-256 alone, one core        {:>8.2} GB/s\n",
        gbps(total, sha)
    );

    // ram tier (no files: cat runs over the ssd files of the same chunks).
    let ram = RamTier::new(u64::MAX);
    let put = time_puts(&ram, &set).await?;
    let label = "ram (verified get; cat = the ssd files of the same chunks)";
    report_tier(label, Arc::new(ram), &set, &ssd_files, put, args.iters).await?;
    println!();

    // object tier, file://.
    let obj_dir = scratch.0.join("objects");
    let url = format!("file://{}", obj_dir.display());
    let object = ObjectTier::open(&ObjectConfig {
        url: url.parse().map_err(|e| format!("{e}"))?,
        s3: S3Settings::default(),
    })
    .map_err(|e| e.to_string())?;
    let put = time_puts(&object, &set).await?;
    let files: Vec<PathBuf> = set
        .iter()
        .map(|c| obj_dir.join(object.location(c.key()).as_ref()))
        .collect();
    let label = "object file:// (verified get)";
    report_tier(label, Arc::new(object), &set, &files, put, args.iters).await?;
    println!();

    // object tier, S3 (optional).
    let endpoint = std::env::var("DEN_TEST_S3_ENDPOINT").ok();
    match endpoint.filter(|e| !e.is_empty()) {
        Some(endpoint) => s3(args, &endpoint, &set, &ssd_files).await?,
        None => println!("object s3: skipped (DEN_TEST_S3_ENDPOINT not set)\n"),
    }

    host_memory(args, &set)?;
    Ok(())
}

async fn s3(
    args: &Args,
    endpoint: &str,
    set: &[Chunk],
    ssd_files: &[PathBuf],
) -> Result<(), String> {
    let bucket = std::env::var("DEN_TEST_S3_BUCKET").unwrap_or_else(|_| "den-test".into());
    // moto accepts an unsigned CreateBucket; elsewhere the bucket must already exist.
    let _ = reqwest::Client::new()
        .put(format!("{endpoint}/{bucket}"))
        .send()
        .await;
    let s3 = ObjectTier::open(&ObjectConfig {
        url: format!("s3://{bucket}/bench-{}", std::process::id())
            .parse()
            .map_err(|e| format!("{e}"))?,
        s3: S3Settings {
            endpoint: Some(endpoint.to_owned()),
            access_key_id: Some("testing".into()),
            secret_access_key: Some(Secret::new("testing")),
            ..S3Settings::from_env()
        },
    })
    .map_err(|e| e.to_string())?;
    let put = time_puts(&s3, set).await?;
    // No file behind an S3 object: compare with cat over the ssd copies of the same chunks.
    let label = format!("object s3 {endpoint} (cat = the ssd files of the same chunks)");
    report_tier(
        &label,
        Arc::new(s3.clone()),
        set,
        ssd_files,
        put,
        args.iters,
    )
    .await?;
    for c in set {
        let _ = s3.delete(c.key()).await;
    }
    println!();
    Ok(())
}

/// A fresh scratch directory, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(base: &Path) -> Result<Self, String> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir = base.join(format!("den-storage-bench-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create scratch directory {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn make_chunks(args: &Args) -> Result<Vec<Chunk>, String> {
    let model = ModelFingerprint::from("bench-model");
    let kv = SyntheticKv::new(&model);
    let n = args.chunks.max(1) * args.chunk_tokens.max(1);
    let tokens: Vec<u32> = (0..n)
        .map(|i| i.wrapping_mul(2_654_435_761) % 50_000)
        .collect();
    plan_chunks(&tokens, args.chunk_tokens.max(1))
        .iter()
        .map(|d| {
            let toks = tokens
                .get(d.start as usize..d.end() as usize)
                .unwrap_or_default();
            let payload = kv.rows(d.start, toks, args.row_bytes as usize);
            Chunk::new(
                ChunkMeta::for_descriptor(&model, d, args.row_bytes),
                payload,
            )
            .map_err(|e| e.to_string())
        })
        .collect()
}

async fn time_puts(tier: &dyn ChunkStore, set: &[Chunk]) -> Result<Duration, String> {
    let t0 = Instant::now();
    for c in set {
        tier.put(c).await.map_err(|e| e.to_string())?;
    }
    Ok(t0.elapsed())
}

/// Prints put, get (sequential and one task per core) and cat throughput over the same
/// files; returns cat's GB/s.
async fn report_tier(
    label: &str,
    tier: Arc<dyn ChunkStore>,
    set: &[Chunk],
    files: &[PathBuf],
    put: Duration,
    iters: usize,
) -> Result<f64, String> {
    let stored = file_bytes(files);
    // Warm-up pass (also checks every chunk reads back equal).
    for c in set {
        let got = tier.get(c.key()).await.map_err(|e| e.to_string())?;
        if got != *c {
            return Err(format!("{label}: chunk {} read back different", c.key()));
        }
    }
    let mut gets = Vec::new();
    for _ in 0..iters.max(1) {
        gets.push(parallel_gets(&tier, set, 1).await?);
    }
    // Verification is CPU-bound per chunk, so a restore of many chunks runs them concurrently.
    let lanes = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut par = Vec::new();
    for _ in 0..iters.max(1) {
        par.push(parallel_gets(&tier, set, lanes).await?);
    }
    let cat = median_of(iters, || cat(files))?;
    let (g, p, c) = (
        gbps(stored, median(gets)),
        gbps(stored, median(par)),
        gbps(stored, cat),
    );
    println!("{label}");
    println!(
        "  put (durable receipts)         {:>8.2} GB/s",
        gbps(stored, put)
    );
    println!(
        "  get, one at a time             {g:>8.2} GB/s   {:>5.2}× cat",
        ratio(g, c)
    );
    let conc = format!("get, {lanes} concurrent");
    println!("  {conc:<30} {p:>8.2} GB/s   {:>5.2}× cat", ratio(p, c));
    println!("  cat FILES > /dev/null          {c:>8.2} GB/s");
    Ok(c)
}

/// Gets every chunk of `set` from `lanes` tasks; returns the wall time.
async fn parallel_gets(
    tier: &Arc<dyn ChunkStore>,
    set: &[Chunk],
    lanes: usize,
) -> Result<Duration, String> {
    let keys: Vec<ChunkKey> = set.iter().map(|c| c.key()).collect();
    let per = keys.len().div_ceil(lanes.max(1)).max(1);
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for group in keys.chunks(per) {
        let tier = Arc::clone(tier);
        let group = group.to_vec();
        tasks.spawn(async move {
            for k in group {
                std::hint::black_box(tier.get(k).await.map_err(|e| e.to_string())?);
            }
            Ok::<(), String>(())
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.map_err(|e| e.to_string())??;
    }
    Ok(t0.elapsed())
}

fn ratio(x: f64, base: f64) -> f64 {
    if base > 0.0 { x / base } else { 0.0 }
}

fn host_memory(args: &Args, set: &[Chunk]) -> Result<(), String> {
    let geometry = ArenaGeometry::new(16, 4096, args.row_bytes).map_err(|e| e.to_string())?;
    let mut m = HostMemory::open(geometry).map_err(|e| e.to_string())?;
    let chunk = set.first().ok_or("no chunks")?;
    let tokens = chunk.meta.token_count;
    let pages_needed = tokens.div_ceil(16);
    // Scattered: every 7th page (never contiguous); contiguous: pages 0..n.
    let scattered: Vec<u32> = (0..pages_needed).map(|i| (i * 7) % 4096).collect();
    let contiguous: Vec<u32> = (0..pages_needed).collect();
    println!(
        "host page memory ({} pages × 16 rows × {} B; one {} MiB chunk per op)",
        geometry.page_count,
        geometry.row_bytes,
        chunk.payload.len() >> 20
    );
    for (name, pages) in [
        ("scattered pages", &scattered),
        ("contiguous pages", &contiguous),
    ] {
        let runs: Vec<RowRun> = geometry
            .runs_for(pages, 0, tokens)
            .map_err(|e| e.to_string())?;
        let mut back = vec![0u8; chunk.payload.len()];
        let mut w = Vec::new();
        let mut r = Vec::new();
        let mut copies = 0;
        for i in 0..args.iters.max(1) * 4 + 1 {
            let ws = m
                .write_runs(&runs, &chunk.payload)
                .map_err(|e| e.to_string())?;
            let rs = m.read_runs(&runs, &mut back).map_err(|e| e.to_string())?;
            copies = ws.copies;
            if i > 0 {
                w.push(ws.elapsed);
                r.push(rs.elapsed);
            }
        }
        if back != chunk.payload {
            return Err("host memory read back different bytes".into());
        }
        let n = chunk.payload.len() as u64;
        println!(
            "  {name:<17} write {:>6.2} GB/s   read {:>6.2} GB/s   ({} copies per op)",
            gbps(n, median(w)),
            gbps(n, median(r)),
            copies
        );
    }
    Ok(())
}

fn cat(files: &[PathBuf]) -> Result<Duration, String> {
    let t0 = Instant::now();
    let status = Command::new("cat")
        .args(files)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run cat: {e}"))?;
    let elapsed = t0.elapsed();
    if !status.success() {
        return Err(format!("cat exited with {status}"));
    }
    Ok(elapsed)
}

fn mmap_copy(files: &[PathBuf]) -> Result<Duration, String> {
    let t0 = Instant::now();
    for f in files {
        let file = std::fs::File::open(f).map_err(|e| format!("{}: {e}", f.display()))?;
        // SAFETY: the benchmark's own files, not modified while mapped.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| format!("{}: {e}", f.display()))?;
        std::hint::black_box(map.to_vec());
    }
    Ok(t0.elapsed())
}

fn file_bytes(files: &[PathBuf]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(Path::new(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn median_of(
    iters: usize,
    mut f: impl FnMut() -> Result<Duration, String>,
) -> Result<Duration, String> {
    let mut v = Vec::new();
    for _ in 0..iters.max(1) {
        v.push(f()?);
    }
    Ok(median(v))
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 { bytes as f64 / s / 1e9 } else { 0.0 }
}
