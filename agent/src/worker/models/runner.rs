//! Loading a runner: the installed artifact's files are read, re-verified (size and
//! SHA-256: an installation changed on disk is refused and uninstalled) and copied into
//! memory on the worker's backend — host memory, or GPU memory through the CUDA driver —
//! and the runner's KV page pool is allocated there, sized from the card and the KV
//! budget: `pages = ⌊budget / (page_size × kv_bytes_per_token)⌋`, and the runner admits
//! `min(pages × page_size, context_length)` tokens per sequence.
//!
//! The synthetic engine (model-free) still computes tokens, from the worker's own page
//! arena; the runner's weights and pool are real allocations that a real engine would
//! use, held for the runner's lifetime and released when it is torn down (dropping
//! [`Loaded`] frees both).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::mpsc;

use den_model::sample::argmax;
use den_model::{HostKvPages, Model, Runner, Sequence};
use den_protocol::observation::RunnerPool;
use den_protocol::skulk::RunnerId;
use den_protocol::wire::{ArtifactFormat, ModelArtifact};

use super::ModelEvent;
use super::install::file_path;
use super::source::{FileCheck, check_file};
use crate::memory::{ArenaGeometry, CudaMemory, HostMemory, MemoryError, PageMemory, RowRun};
use crate::model_file::{ModelFile, runner_options};
use crate::worker::Backend;

/// Weights are copied in rows of this many bytes (one row per copy).
const WEIGHT_ROW: u64 = 1 << 20;

/// A loaded runner's memory. Dropping it releases both arenas.
pub struct Loaded {
    pub pool: RunnerPool,
    _weights: Option<Box<dyn PageMemory>>,
    _kv: Option<Box<dyn PageMemory>>,
    /// A gguf runner's model, until the worker's device adopts it ([`RealEngine`]).
    pub engine: Option<RealEngine>,
}

/// A real model ready to serve: its file (opened, checked and probed) and the runner's
/// KV page arena, which becomes the worker's page memory when the device switches to it.
pub struct RealEngine {
    pub model: ModelFile,
    pub memory: Box<dyn PageMemory>,
    pub pages: u32,
    pub context_tokens: u32,
    /// What the readiness generation produced (logged; never sent on).
    pub probe: String,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded").field("pool", &self.pool).finish()
    }
}

/// Why loading failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// The installation does not match its card any more: uninstall it.
    Corrupt(String),
    /// Memory, sizing, I/O or cancellation.
    Failed(String),
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Corrupt(m) | LoadError::Failed(m) => f.write_str(m),
        }
    }
}

/// Everything one load needs.
pub struct LoadJob {
    pub runner: RunnerId,
    pub dir: PathBuf,
    pub artifact: ModelArtifact,
    pub backend: Backend,
    pub device: usize,
    pub page_size: u32,
    pub kv_budget: u64,
    /// Threads of a real model's forward pass (the worker's `--model-threads`).
    pub threads: Option<usize>,
    pub cancel: Arc<AtomicBool>,
    pub events: mpsc::UnboundedSender<ModelEvent>,
}

/// The runner's page pool for a card: `(pages, context tokens)`, or why none fits.
pub fn size_pool(
    artifact: &ModelArtifact,
    page_size: u32,
    budget: u64,
) -> Result<(u32, u64), String> {
    let page_bytes = artifact
        .kv_bytes_per_token
        .checked_mul(u64::from(page_size))
        .filter(|b| *b > 0)
        .ok_or("the card's KV bytes per token overflow a page")?;
    let pages = (budget / page_bytes).min(i32::MAX as u64);
    if pages == 0 {
        return Err(format!(
            "the KV budget of {budget} bytes does not hold one page ({page_size} tokens × {} bytes per token); raise --kv-budget",
            artifact.kv_bytes_per_token
        ));
    }
    let pages = u32::try_from(pages).unwrap_or(u32::MAX);
    let context = (u64::from(pages) * u64::from(page_size)).min(artifact.context_length);
    Ok((pages, context))
}

/// Loads on the calling (blocking) thread; reports `LoadProgress` as layers arrive.
pub fn load(job: &LoadJob) -> Result<Loaded, LoadError> {
    if job.artifact.format == ArtifactFormat::Gguf {
        return load_gguf(job);
    }
    let failed = |m: String| LoadError::Failed(m);
    let (pages, context_tokens) =
        size_pool(&job.artifact, job.page_size, job.kv_budget).map_err(failed)?;
    let total = job.artifact.total_bytes();
    let row = WEIGHT_ROW.min(total.max(1));
    let rows = u32::try_from(total.div_ceil(row).max(1)).map_err(|_| {
        failed(format!(
            "the artifact of {total} bytes is too large to load"
        ))
    })?;
    let mut weights = open(job, ArenaGeometry::new(1, rows, row), "weights")?;
    // `row` ≤ WEIGHT_ROW (1 MiB), so it fits a usize.
    let mut buf = vec![0u8; usize::try_from(row).unwrap_or(1 << 20)];
    let mut filled = 0usize;
    let mut next_row: u32 = 0;
    // Copies whole rows into the arena; the last one is zero-padded.
    let mut flush = |buf: &mut [u8], filled: &mut usize| -> Result<(), LoadError> {
        if *filled == 0 {
            return Ok(());
        }
        buf.iter_mut().skip(*filled).for_each(|b| *b = 0);
        let run = RowRun {
            page: next_row,
            offset: 0,
            len: 1,
        };
        weights
            .write_runs(&[run], buf)
            .map_err(|e| failed(format!("copying weights into memory failed: {e}")))?;
        next_row += 1;
        *filled = 0;
        Ok(())
    };
    let mut base: u64 = 0;
    for file in &job.artifact.files {
        let path = file_path(&job.dir, &file.path);
        verify_file(
            job,
            &path,
            file,
            (base, total),
            &mut |mut bytes: &[u8]| {
                while !bytes.is_empty() {
                    let space = buf.len() - filled;
                    let n = space.min(bytes.len());
                    let (now, rest) = bytes.split_at(n);
                    if let Some(dst) = buf.get_mut(filled..filled + n) {
                        dst.copy_from_slice(now);
                    }
                    filled += n;
                    bytes = rest;
                    if filled == buf.len() {
                        flush(&mut buf, &mut filled)?;
                    }
                }
                Ok(())
            },
        )?;
        base = base.saturating_add(file.bytes);
    }
    flush(&mut buf, &mut filled)?;
    let kv = open(
        job,
        ArenaGeometry::new(job.page_size, pages, job.artifact.kv_bytes_per_token),
        "KV page pool",
    )?;
    let page_bytes = u64::from(job.page_size) * job.artifact.kv_bytes_per_token;
    Ok(Loaded {
        pool: RunnerPool {
            weights_bytes: total,
            pages,
            page_size: job.page_size,
            page_bytes,
            context_tokens,
        },
        _weights: Some(weights),
        _kv: Some(kv),
        engine: None,
    })
}

/// A gguf runner: the file is re-verified (size and SHA-256), opened and checked by
/// den-model, named by its fingerprint (which must be the card's), its KV page arena is
/// allocated in f16 rows of the model's layout, and a short greedy generation must give
/// finite logits before the runner is ready. Weights stay in the file's map.
fn load_gguf(job: &LoadJob) -> Result<Loaded, LoadError> {
    let failed = |m: String| LoadError::Failed(m);
    if job.backend != Backend::Host {
        return Err(failed(
            "real models run on the CPU over the host page arena for now: start the worker with --backend host".into(),
        ));
    }
    let file = job
        .artifact
        .gguf_file()
        .ok_or_else(|| failed("a gguf artifact names exactly one file".into()))?;
    let path = file_path(&job.dir, &file.path);
    verify_file(job, &path, file, (0, file.bytes), &mut |_| Ok(()))?;
    let model = ModelFile::open(&path, Some(job.artifact.model_id.as_str())).map_err(failed)?;
    if model.fingerprint() != &job.artifact.fingerprint {
        return Err(failed(format!(
            "{} is model {}, the card says {}: the router and this worker disagree on what the file is (are they the same den version?)",
            file.path,
            model.fingerprint(),
            job.artifact.fingerprint
        )));
    }
    let row_bytes = model.row_bytes();
    let artifact = ModelArtifact {
        kv_bytes_per_token: row_bytes,
        context_length: job
            .artifact
            .context_length
            .min(u64::from(model.text.context_length)),
        ..job.artifact.clone()
    };
    let (pages, context_tokens) =
        size_pool(&artifact, job.page_size, job.kv_budget).map_err(failed)?;
    let memory = open(
        job,
        ArenaGeometry::new(job.page_size, pages, row_bytes),
        "KV page pool",
    )?;
    if job.cancel.load(Ordering::Relaxed) {
        return Err(failed(
            "cancelled: the runner was removed while loading".into(),
        ));
    }
    let probe = probe(&model, job.threads)
        .map_err(|e| failed(format!("the readiness generation failed: {e}")))?;
    let context_tokens = u32::try_from(context_tokens).unwrap_or(u32::MAX);
    Ok(Loaded {
        pool: RunnerPool {
            weights_bytes: file.bytes,
            pages,
            page_size: job.page_size,
            page_bytes: u64::from(job.page_size) * row_bytes,
            context_tokens: u64::from(context_tokens),
        },
        _weights: None,
        _kv: None,
        engine: Some(RealEngine {
            model,
            memory,
            pages,
            context_tokens,
            probe,
        }),
    })
}

/// Tokens the readiness generation produces.
const PROBE_TOKENS: usize = 4;

/// A real generation: the tokenized probe prompt, prefilled, then greedy decoding; every
/// logit must be finite and every token in the vocabulary. Returns the text produced.
fn probe(model: &ModelFile, threads: Option<usize>) -> Result<String, String> {
    let m = Model::load(&model.file).map_err(|e| e.to_string())?;
    let mut runner = Runner::new(&m, runner_options(threads)).map_err(|e| e.to_string())?;
    let prompt = model
        .text
        .tokenizer
        .encode("The capital of France is", true)
        .map_err(|e| e.to_string())?;
    let need = u32::try_from(prompt.len() + PROBE_TOKENS).unwrap_or(u32::MAX);
    let page = 16u32;
    let mut kv =
        HostKvPages::new(m.kv_layout(), page, need.div_ceil(page)).map_err(|e| e.to_string())?;
    let mut seq = Sequence::new();
    kv.reserve(&mut seq, need).map_err(|e| e.to_string())?;
    let mut logits = runner
        .prefill(&prompt, &mut kv, &mut seq)
        .map_err(|e| e.to_string())?
        .to_vec();
    let mut out = Vec::with_capacity(PROBE_TOKENS);
    for i in 0..PROBE_TOKENS {
        if logits.iter().any(|v| !v.is_finite()) {
            return Err(format!("the logits of step {i} are not finite"));
        }
        let token = argmax(&logits).ok_or("the model produced no logits")?;
        out.push(token);
        if i + 1 < PROBE_TOKENS {
            logits = runner
                .decode(token, &mut kv, &mut seq)
                .map_err(|e| e.to_string())?
                .to_vec();
        }
    }
    Ok(model.text.tokenizer.decode(&out, true))
}

/// Reads `path` through, checking its size and SHA-256 against the card; `chunk` sees
/// every buffer read (the opaque loader copies them into its weights arena). Layer
/// progress is reported over the whole artifact: `(bytes before this file, total)`.
fn verify_file(
    job: &LoadJob,
    path: &std::path::Path,
    file: &den_protocol::wire::ArtifactFile,
    (base, total): (u64, u64),
    chunk: &mut dyn FnMut(&[u8]) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let layers = u64::from(job.artifact.layers);
    let mut reported = u64::MAX;
    let mut read: u64 = 0;
    let checked = check_file(path, file, |bytes| {
        if job.cancel.load(Ordering::Relaxed) {
            return Err(LoadError::Failed(
                "cancelled: the runner was removed while loading".into(),
            ));
        }
        chunk(bytes)?;
        read += bytes.len() as u64;
        let done = ((base + read).saturating_mul(layers) / total.max(1)).min(layers);
        if done != reported {
            reported = done;
            let _ = job.events.send(ModelEvent::LoadProgress {
                runner: job.runner.clone(),
                layers_loaded: done,
                total_layers: layers,
            });
        }
        Ok(())
    });
    checked.map_err(|e| match e {
        FileCheck::Open(e) => {
            LoadError::Corrupt(format!("installed file {} cannot be read: {e}", file.path))
        }
        FileCheck::Read(e) => LoadError::Failed(format!("reading {} failed: {e}", file.path)),
        FileCheck::Stopped(e) => e,
        FileCheck::Size(got) => LoadError::Corrupt(format!(
            "installed {} has {got} bytes, the card says {}",
            file.path, file.bytes
        )),
        FileCheck::Sha256(got) => LoadError::Corrupt(format!(
            "installed {} changed on disk: expected sha256 {}, got {got}",
            file.path, file.sha256
        )),
    })
}

/// Opens an arena on the worker's backend.
fn open(
    job: &LoadJob,
    geometry: Result<ArenaGeometry, MemoryError>,
    what: &str,
) -> Result<Box<dyn PageMemory>, LoadError> {
    let geometry = geometry.map_err(|e| LoadError::Failed(format!("{what}: {e}")))?;
    let memory: Result<Box<dyn PageMemory>, MemoryError> = match job.backend {
        Backend::Host => HostMemory::open(geometry).map(|m| Box::new(m) as Box<dyn PageMemory>),
        Backend::Cuda => {
            CudaMemory::open(job.device, geometry).map(|m| Box::new(m) as Box<dyn PageMemory>)
        }
    };
    memory.map_err(|e| LoadError::Failed(format!("allocating the {what}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(bpt: u64, context: u64) -> ModelArtifact {
        ModelArtifact {
            model_id: "m".into(),
            fingerprint: "m".into(),
            card_digest: "0".repeat(64),
            registry_card_id: None,
            layers: 4,
            kv_bytes_per_token: bpt,
            context_length: context,
            files: vec![],
            format: Default::default(),
        }
    }

    #[test]
    fn the_pool_is_sized_from_the_card_and_the_budget() {
        // 16-token pages of 1 KiB rows: 16 KiB a page; 1 MiB holds 64 pages.
        assert_eq!(
            size_pool(&artifact(1024, 1 << 20), 16, 1 << 20),
            Ok((64, 1024))
        );
        // The card's context caps the per-sequence limit, not the pages.
        assert_eq!(size_pool(&artifact(1024, 100), 16, 1 << 20), Ok((64, 100)));
        let e = size_pool(&artifact(1 << 20, 100), 16, 1 << 20).unwrap_err();
        assert!(e.contains("--kv-budget"), "{e}");
    }
}
