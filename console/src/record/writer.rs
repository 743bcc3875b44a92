//! The writer thread: lines, snapshots, rotation and retention.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::SystemTime;

use den_protocol::recording::{self as format, End, Header, Redactor};
use den_protocol::session::Stamped;
use den_protocol::time::Millis;

use super::codec::Codec;
use super::sink::Sink;
use super::{Closed, Msg, RecordError, RecorderConfig, paths};
use crate::model::Model;

pub(super) struct Writer {
    config: RecorderConfig,
    redactor: Redactor,
    recording_id: String,
    sink: Sink,
    segment: u32,
    segments: Vec<PathBuf>,
    /// The model of everything written: snapshots are its checkpoints, and deltas are
    /// taken against it.
    model: Model,
    codec: Codec,
    events: u64,
    dropped_written: u64,
    dropped: Arc<AtomicU64>,
    last_at: Millis,
    /// Event bytes since the last snapshot, and that snapshot's size and time.
    since_snapshot: u64,
    last_snapshot_len: u64,
    last_snapshot_at: Millis,
    /// Uncompressed bytes of the current segment.
    segment_bytes: u64,
    /// Events written before the current segment began.
    segment_first: u64,
    /// File bytes of finished segments.
    finished_bytes: u64,
    deleted: Vec<PathBuf>,
}

impl Writer {
    pub fn open(config: RecorderConfig, dropped: Arc<AtomicU64>) -> Result<Writer, RecordError> {
        let redactor = Redactor::new(config.secrets.iter().cloned());
        // Unique per recording: segments of another recording with the same name
        // (an earlier run writing to the same path) are never taken for this one's.
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let nanos = SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let recording_id = config.recording_id.clone().unwrap_or_else(|| {
            format!(
                "{}-{}-{}-{nanos:09}-{}",
                paths::utc_stamp(config.started_at_unix_ms),
                paths::file_safe(&config.host),
                std::process::id(),
                STARTED.fetch_add(1, Ordering::Relaxed)
            )
        });
        let sink = create(&config.path)?;
        let mut writer = Writer {
            model: Model::new(config.model.clone()),
            codec: Codec::new(),
            segments: vec![config.path.clone()],
            config,
            redactor,
            recording_id,
            sink,
            segment: 0,
            events: 0,
            dropped_written: 0,
            dropped,
            last_at: Millis::ZERO,
            since_snapshot: 0,
            last_snapshot_len: 0,
            last_snapshot_at: Millis::ZERO,
            segment_bytes: 0,
            segment_first: 0,
            finished_bytes: 0,
            deleted: Vec::new(),
        };
        writer.begin_segment().map_err(|e| writer.error(e))?;
        // Sessions that crashed never swept: the limits hold from the start.
        writer.sweep();
        Ok(writer)
    }

    pub fn run(mut self, rx: Receiver<Msg>) -> Result<Closed, RecordError> {
        let mut close_at = None;
        for msg in rx.iter() {
            match msg {
                Msg::Event(stamped) => {
                    if let Err(e) = self.event(&stamped) {
                        // Stop writing; the handle counts what it can no longer send.
                        return Err(self.error(e));
                    }
                }
                Msg::Close(at) => {
                    close_at = Some(at);
                    break;
                }
            }
        }
        let at = close_at.unwrap_or(self.last_at).max(self.last_at);
        let path = self.current_path();
        self.finish(at).map_err(|e| RecordError::Write {
            path,
            detail: e.to_string(),
        })
    }

    fn event(&mut self, stamped: &Stamped) -> std::io::Result<()> {
        // Stamps are monotonic from the console; a stray older one is written at the
        // latest time so that the file stays ordered.
        let at = stamped.at.max(self.last_at);
        self.gap(at)?;
        // At least one event per segment, however small the limit.
        if self.sink.file_bytes() >= self.config.rotate_bytes && self.events > self.segment_first {
            self.rotate(at)?;
        }
        let stamped = if at == stamped.at {
            std::borrow::Cow::Borrowed(stamped)
        } else {
            std::borrow::Cow::Owned(Stamped::new(at, stamped.event.clone()))
        };
        let line = self.codec.encode(&self.redactor, &stamped, &self.model);
        self.sink.line(&line)?;
        self.events += 1;
        self.last_at = at;
        let len = line.len() as u64 + 1;
        self.segment_bytes += len;
        self.since_snapshot += len;
        // Apply what a replay will read, decoded the way it will decode it.
        if let Ok(decoded) = self.codec.decode(line.as_bytes(), &self.model) {
            self.model.apply(&decoded);
        }
        let policy = self.config.snapshots;
        let by_bytes = self.since_snapshot
            >= policy
                .min_bytes
                .max(self.last_snapshot_len.saturating_mul(policy.size_ratio));
        let by_time = at.since(self.last_snapshot_at) >= policy.max_interval_ms;
        if by_bytes || by_time {
            self.snapshot(at)?;
        }
        Ok(())
    }

    /// A gap line for events the handle dropped since the last one.
    fn gap(&mut self, at: Millis) -> std::io::Result<()> {
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > self.dropped_written {
            let line = format::encode_gap(at, dropped - self.dropped_written);
            self.sink.line(&line)?;
            self.segment_bytes += line.len() as u64 + 1;
            self.dropped_written = dropped;
        }
        Ok(())
    }

    fn snapshot(&mut self, at: Millis) -> std::io::Result<()> {
        let state = self
            .model
            .checkpoint_json()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let marker = format!("{{\"at\":{},\"snapshot\":{}}}", at.0, self.events);
        self.sink.new_frame(&marker)?;
        let line = format::encode_snapshot(at, self.events, &state);
        self.sink.line(&line)?;
        // Readers that start here start with no delta bases: neither does the writer.
        self.codec.clear();
        self.sink.sync()?;
        let len = line.len() as u64 + 1;
        self.segment_bytes += len;
        self.last_snapshot_len = len;
        self.last_snapshot_at = at;
        self.since_snapshot = 0;
        Ok(())
    }

    fn header(&self) -> Header {
        let console = serde_json::json!({ "model": self.config.model });
        Header::new(
            env!("CARGO_PKG_VERSION"),
            &self.recording_id,
            self.segment,
            self.config.started_at_unix_ms,
            &self.config.host,
            self.config.sources.clone(),
            self.redactor.policy(),
            console,
        )
    }

    /// Header and a snapshot: every segment can be replayed on its own.
    fn begin_segment(&mut self) -> std::io::Result<()> {
        let header = format::encode_header(&self.header());
        self.sink.line(&header)?;
        self.segment_bytes = header.len() as u64 + 1;
        self.segment_first = self.events;
        self.snapshot(self.last_at)
    }

    fn end_line(&mut self, at: Millis, reason: &str, next: Option<String>) -> std::io::Result<()> {
        self.gap(at)?;
        let end = End {
            reason: reason.to_owned(),
            events: self.events,
            dropped: self.dropped_written,
            bytes: self.segment_bytes,
            next,
        };
        self.sink.line(&format::encode_end(at, &end))
    }

    fn rotate(&mut self, at: Millis) -> std::io::Result<()> {
        let next_path = paths::segment_path(&self.config.path, self.segment + 1);
        let next_name = next_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        self.end_line(at, "rotated", next_name)?;
        let next = create(&next_path).map_err(|e| std::io::Error::other(e.to_string()))?;
        let old = std::mem::replace(&mut self.sink, next);
        self.finished_bytes += old.finish()?;
        self.segment += 1;
        self.segments.push(next_path.clone());
        self.begin_segment()?;
        self.sweep();
        Ok(())
    }

    fn sweep(&mut self) {
        let Some(dir) = self.config.path.parent() else {
            return;
        };
        let dir = if dir.as_os_str().is_empty() {
            std::path::Path::new(".")
        } else {
            dir
        };
        let keep = self
            .segments
            .last()
            .cloned()
            .into_iter()
            .collect::<Vec<_>>();
        let only = (!self.config.sweep_directory).then_some(self.config.path.as_path());
        let deleted = paths::sweep(dir, only, self.config.retention, &keep, SystemTime::now());
        self.deleted.extend(deleted);
    }

    fn finish(mut self, at: Millis) -> std::io::Result<Closed> {
        self.end_line(at, "closed", None)?;
        self.sweep();
        let bytes = self.finished_bytes + self.sink.finish()?;
        Ok(Closed {
            segments: self.segments,
            events: self.events,
            dropped: self.dropped.load(Ordering::Relaxed),
            bytes,
            deleted: self.deleted,
        })
    }

    fn current_path(&self) -> String {
        self.segments
            .last()
            .unwrap_or(&self.config.path)
            .display()
            .to_string()
    }

    fn error(&self, e: std::io::Error) -> RecordError {
        RecordError::Write {
            path: self.current_path(),
            detail: e.to_string(),
        }
    }
}

fn create(path: &std::path::Path) -> Result<Sink, RecordError> {
    let err = |e: std::io::Error| RecordError::Open {
        path: path.display().to_string(),
        detail: e.to_string(),
    };
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir).map_err(err)?;
    }
    let file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(err)?;
    Sink::open(file, paths::is_compressed(path)).map_err(err)
}
