//! One download attempt: fetch every artifact file from its source ([`super::source`]:
//! object_store with the object tier's URL and S3 settings, or HTTP), stream it into a staging directory while
//! hashing it, verify its size and SHA-256, fsync, write the marker, and rename the
//! staging directory into place (atomic), then fsync the models directory.
//!
//! Any failure — the source unreachable or missing a file, a size or checksum mismatch,
//! a disk error, a cancellation — is the attempt's failure with a one-line reason, and
//! the staging directory is removed: nothing partial is ever installed.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use den_protocol::skulk::AttemptId;
use den_protocol::wire::ModelArtifact;

use super::ModelEvent;
use super::install::{Installed, MARKER, Marker, STAGING, file_path, sync_dir};
use super::source::Source;

/// How often progress is reported while bytes flow.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);

/// Everything one attempt needs.
pub struct DownloadJob {
    pub attempt: AttemptId,
    pub artifact: ModelArtifact,
    pub source: String,
    pub models_dir: PathBuf,
    pub cancel: Arc<AtomicBool>,
    pub events: mpsc::UnboundedSender<ModelEvent>,
}

/// Runs the attempt to its end; reports `Downloaded` with the outcome.
pub async fn run(job: DownloadJob) {
    let staging = job.models_dir.join(STAGING).join(job.attempt.as_str());
    let result = fetch(&job, &staging).await;
    if result.is_err() {
        let _ = tokio::fs::remove_dir_all(&staging).await;
    }
    let _ = job.events.send(ModelEvent::Downloaded {
        attempt: job.attempt.clone(),
        result,
    });
}

struct Progress<'a> {
    job: &'a DownloadJob,
    started: Instant,
    last: Instant,
    bytes: u64,
    files: u32,
}

impl Progress<'_> {
    fn report(&mut self, force: bool) {
        let now = Instant::now();
        if !force && now.duration_since(self.last) < PROGRESS_EVERY {
            return;
        }
        self.last = now;
        let secs = now.duration_since(self.started).as_secs_f64();
        let rate = if secs > 0.0 {
            self.bytes as f64 / secs
        } else {
            0.0
        };
        let _ = self.job.events.send(ModelEvent::Progress {
            attempt: self.job.attempt.clone(),
            bytes_done: self.bytes,
            files_done: self.files,
            bytes_per_s: rate,
        });
    }
}

async fn fetch(job: &DownloadJob, staging: &Path) -> Result<Installed, String> {
    let source = Source::parse(&job.source)?;
    tokio::fs::create_dir_all(staging)
        .await
        .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
    let mut progress = Progress {
        job,
        started: Instant::now(),
        last: Instant::now(),
        bytes: 0,
        files: 0,
    };
    progress.report(true);
    for file in &job.artifact.files {
        let target = file_path(staging, &file.path);
        if let Some(parent) = target.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
        }
        source
            .fetch_verified(file, &target, |n| {
                if job.cancel.load(Ordering::Relaxed) {
                    return Err("cancelled: the runner that needed it was removed".to_owned());
                }
                progress.bytes = progress.bytes.saturating_add(n as u64);
                progress.report(false);
                Ok(())
            })
            .await?;
        progress.files += 1;
        progress.report(true);
    }
    finalize(job, staging).await
}

/// Marker, fsyncs and the atomic rename into `models/<digest>`.
async fn finalize(job: &DownloadJob, staging: &Path) -> Result<Installed, String> {
    let marker = Marker {
        attempt_id: job.attempt.clone(),
        model_id: job.artifact.model_id.clone(),
        card_digest: job.artifact.card_digest.clone(),
        bytes_total: job.artifact.total_bytes(),
        files: job.artifact.files.clone(),
        installed_at_unix_ms: crate::router::manage::unix_now_ms(),
    };
    let models_dir = job.models_dir.clone();
    let staging = staging.to_path_buf();
    let digest = job.artifact.card_digest.clone();
    let files = job.artifact.files.clone();
    tokio::task::spawn_blocking(move || -> Result<Installed, String> {
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        let text = serde_json::to_vec_pretty(&marker).map_err(|e| e.to_string())?;
        let marker_path = staging.join(MARKER);
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&marker_path)
                .map_err(|e| io("writing the installation marker", e))?;
            f.write_all(&text)
                .and_then(|_| f.sync_all())
                .map_err(|e| io("writing the installation marker", e))?;
        }
        // Every directory that gained an entry, deepest first, then the staging root.
        let mut dirs: Vec<PathBuf> = files
            .iter()
            .filter_map(|f| file_path(&staging, &f.path).parent().map(Path::to_path_buf))
            .collect();
        dirs.sort();
        dirs.dedup();
        dirs.reverse();
        for d in dirs.iter().chain(std::iter::once(&staging)) {
            sync_dir(d).map_err(|e| io(&format!("fsync of {}", d.display()), e))?;
        }
        let target = models_dir.join(&digest);
        if target.exists() {
            // A stale or corrupt installation the index already dropped.
            std::fs::remove_dir_all(&target)
                .map_err(|e| io(&format!("removing the old {}", target.display()), e))?;
        }
        std::fs::rename(&staging, &target)
            .map_err(|e| io(&format!("installing into {}", target.display()), e))?;
        sync_dir(&models_dir).map_err(|e| io("fsync of the models directory", e))?;
        Ok(Installed {
            dir: target,
            marker,
        })
    })
    .await
    .map_err(|e| format!("the installer stopped: {e}"))?
}
