//! The recorder: every event the console applies, written to a recording file by a
//! dedicated thread.
//!
//! The UI loop hands each stamped event to [`Recorder::record`], which never blocks: it
//! puts the event on a bounded channel, and if the writer has fallen behind (a stalled
//! disk), drops it and counts it; the writer then writes a `gap` line saying how many
//! were lost, and the end line and `den replay --summary` repeat the total.
//!
//! The writer thread redacts each event ([`den_protocol::recording::redact`]), encodes it
//! ([`codec`]), writes and flushes the line (a crash loses at most the line being
//! written), and applies it to a model of its own — the model a replay rebuilds from the
//! same lines. Every so often (by bytes written since the last one, at least
//! [`SnapshotPolicy::size_ratio`] times what the last snapshot took, so snapshots stay
//! under a third of the file) it writes that model
//! as a snapshot line and fsyncs: replay seeks to the nearest snapshot and plays forward
//! from there. At the size limit it ends the segment and continues in the next file
//! (`x.jsonl` → `x.1.jsonl` …), which starts with a header and a snapshot of its own,
//! then applies the retention limits (total bytes, age) to old recordings.

pub mod codec;
pub mod paths;
pub mod session;
mod sink;
pub mod synthetic;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::thread::JoinHandle;
use std::time::{SystemTime, UNIX_EPOCH};

use den_protocol::recording::SourceInfo;
use den_protocol::session::Stamped;
use den_protocol::time::Millis;

use crate::model::ModelConfig;

pub use paths::Retention;
pub use sink::SKIPPABLE_MAGIC;

/// Events waiting for the writer before new ones are dropped.
pub const CHANNEL: usize = 8192;

/// When the writer checkpoints its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotPolicy {
    /// Event bytes written since the last snapshot before the next one (at least
    /// `size_ratio` times the size of the last snapshot).
    pub min_bytes: u64,
    /// Snapshots take at most 1/(1 + size_ratio) of the recording: a busy router's
    /// console model holds minutes of decision records, and snapshotting it after every
    /// few seconds of events would make snapshots most of the file. A larger ratio
    /// means more events to replay after a seek (2 keeps a seek in a 200 MB recording
    /// well under a second; BENCHMARKS.md).
    pub size_ratio: u64,
    /// A snapshot at least this often while events arrive (bounds the replay work of a
    /// seek in time as well as in bytes).
    pub max_interval_ms: u64,
}

impl Default for SnapshotPolicy {
    fn default() -> Self {
        SnapshotPolicy {
            min_bytes: 256 * 1024,
            size_ratio: 2,
            max_interval_ms: 300_000,
        }
    }
}

/// Everything the recorder needs.
#[derive(Debug, Clone)]
pub struct RecorderConfig {
    /// The first segment; `.zst` at the end compresses.
    pub path: PathBuf,
    /// A segment is closed and the next begun past this many file bytes.
    pub rotate_bytes: u64,
    pub retention: Retention,
    /// Whether retention looks at every recording in the directory (the default
    /// directory is den's) or only at this recording's segments (a path the user chose).
    pub sweep_directory: bool,
    pub snapshots: SnapshotPolicy,
    pub model: ModelConfig,
    pub sources: Vec<SourceInfo>,
    /// Values scrubbed wherever they appear (the bearer token).
    pub secrets: Vec<String>,
    pub host: String,
    /// Wall-clock time of session offset 0.
    pub started_at_unix_ms: u64,
    pub channel: usize,
    /// The recording's id (default: time, host, process and a counter). Fixed ids make
    /// generated samples byte-for-byte reproducible.
    pub recording_id: Option<String>,
}

impl RecorderConfig {
    pub fn new(path: PathBuf, model: ModelConfig, sources: Vec<SourceInfo>) -> RecorderConfig {
        RecorderConfig {
            path,
            rotate_bytes: 64 * 1024 * 1024,
            retention: Retention::default(),
            sweep_directory: false,
            snapshots: SnapshotPolicy::default(),
            model,
            sources,
            secrets: Vec::new(),
            host: paths::host_name(),
            started_at_unix_ms: unix_ms_now(),
            channel: CHANNEL,
            recording_id: None,
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Why recording failed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("cannot record to {path}: {detail}")]
    Open { path: String, detail: String },
    #[error("recording to {path} stopped: {detail}")]
    Write { path: String, detail: String },
}

/// What a finished recording holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Closed {
    /// The segment files written, first to last (some may since have been deleted by
    /// retention).
    pub segments: Vec<PathBuf>,
    pub events: u64,
    pub dropped: u64,
    /// File bytes over all segments.
    pub bytes: u64,
    /// Segments (of any recording) deleted by retention.
    pub deleted: Vec<PathBuf>,
}

enum Msg {
    Event(Box<Stamped>),
    Close(Millis),
}

/// A running recorder.
pub struct Recorder {
    tx: Option<SyncSender<Msg>>,
    dropped: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<Closed, RecordError>>>,
    path: PathBuf,
}

impl Recorder {
    /// Open the file (creating its directory), write the header and the first
    /// snapshot, and start the writer. Errors here are the user's to fix (a path that
    /// cannot be written).
    pub fn start(config: RecorderConfig) -> Result<Recorder, RecordError> {
        let path = config.path.clone();
        let (tx, rx) = mpsc::sync_channel(config.channel.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        let writer = writer::Writer::open(config, dropped.clone())?;
        let thread = std::thread::Builder::new()
            .name("den-recorder".to_owned())
            .spawn(move || writer.run(rx))
            .map_err(|e| RecordError::Open {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        Ok(Recorder {
            tx: Some(tx),
            dropped,
            thread: Some(thread),
            path,
        })
    }

    /// Hand one event to the writer. Never blocks; a full channel drops and counts it.
    pub fn record(&self, stamped: &Stamped) {
        let Some(tx) = &self.tx else {
            return;
        };
        match tx.try_send(Msg::Event(Box::new(stamped.clone()))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Hand one event to the writer, waiting while it is behind. For offline tools that
    /// generate recordings (samples, benchmarks); the console uses [`Recorder::record`].
    pub fn record_waiting(&self, stamped: &Stamped) {
        if let Some(tx) = &self.tx
            && tx.send(Msg::Event(Box::new(stamped.clone()))).is_err()
        {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Events dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// The first segment.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write the end line at `at`, finish the file and stop the writer.
    pub fn close(mut self, at: Millis) -> Result<Closed, RecordError> {
        self.shutdown(at)
    }

    fn shutdown(&mut self, at: Millis) -> Result<Closed, RecordError> {
        if let Some(tx) = self.tx.take() {
            // A blocking send: the writer drains what is queued, then closes.
            let _ = tx.send(Msg::Close(at));
        }
        match self.thread.take() {
            Some(thread) => thread.join().unwrap_or_else(|_| {
                Err(RecordError::Write {
                    path: self.path.display().to_string(),
                    detail: "the recorder thread panicked".to_owned(),
                })
            }),
            None => Err(RecordError::Write {
                path: self.path.display().to_string(),
                detail: "already closed".to_owned(),
            }),
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if self.thread.is_some() {
            // The end line takes the time of the last event written.
            let _ = self.shutdown(Millis::ZERO);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;
