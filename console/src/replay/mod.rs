//! Replay: a recording driven back through the console's model, with time travel.
//!
//! - [`Recording`]: the segment files of one recording and their headers (version
//!   checked);
//! - [`Replayer`]: the model at any moment — seek by time (nearest snapshot, then the
//!   events after it), step by event forwards and backwards;
//! - [`scan`]: one streaming pass over every line (event markers, `n`/`N` search);
//! - [`summary`]: `den replay --summary`, the incident timeline, and `--at`;
//! - [`tui`]: `den replay`, the console's panels with a timeline bar.

mod replayer;
pub mod scan;
mod segment;
pub mod summary;
pub mod tui;
mod zst;

use std::path::{Path, PathBuf};

use den_protocol::recording::Header;
use den_protocol::time::Millis;

use crate::model::ModelConfig;
use crate::record::paths;

pub use replayer::{Replayer, Warnings};
pub use segment::{LineReader, RawLine, Segment};

/// Why a recording cannot be replayed (one line for the user).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("{path}: {detail}")]
    Io { path: String, detail: String },
    #[error("{path}: {detail}")]
    Format { path: String, detail: String },
}

/// The segments of one recording, in order.
#[derive(Debug, Clone)]
pub struct Recording {
    pub segments: Vec<Segment>,
    /// Segments before the first one found were deleted (retention) or are missing.
    pub missing_before: bool,
}

impl Recording {
    /// Open the recording `path` belongs to: `path` itself and every other segment of the
    /// same recording next to it.
    pub fn open(path: &Path) -> Result<Recording, ReplayError> {
        let given = Segment::open(path)?;
        let n = given.header.segment;
        let id = given.header.recording.clone();
        let first = paths::first_segment(path, n);
        let mut segments = Vec::new();
        let mut missing_before = false;
        for i in 0..n {
            let p = paths::segment_path(&first, i);
            match open_same(&p, &id) {
                Some(s) => segments.push(s),
                None => {
                    // Only a gap at the start (retention deletes the oldest) is usable.
                    segments.clear();
                    missing_before = true;
                }
            }
        }
        segments.push(given);
        let mut i = n + 1;
        while let Some(s) = open_same(&paths::segment_path(&first, i), &id) {
            segments.push(s);
            i += 1;
        }
        Ok(Recording {
            segments,
            missing_before,
        })
    }

    /// The header of the first segment found.
    pub fn header(&self) -> &Header {
        // `open` always pushes the given segment, so the list is never empty.
        &self.segments[0].header
    }

    pub fn paths(&self) -> Vec<PathBuf> {
        self.segments.iter().map(|s| s.path.clone()).collect()
    }

    /// The model settings the recording was made with.
    pub fn model_config(&self) -> ModelConfig {
        self.header()
            .console
            .get("model")
            .and_then(|m| serde_json::from_value(m.clone()).ok())
            .unwrap_or_default()
    }

    /// The time of the first snapshot.
    pub fn start(&self) -> Millis {
        self.segments.first().map_or(Millis::ZERO, |s| s.first_at)
    }

    /// The time of the last complete line.
    pub fn end(&self) -> Result<Millis, ReplayError> {
        let Some(last) = self.segments.last() else {
            return Ok(Millis::ZERO);
        };
        last.last_at().map_err(|e| ReplayError::Io {
            path: last.path.display().to_string(),
            detail: e.to_string(),
        })
    }
}

fn open_same(path: &Path, id: &str) -> Option<Segment> {
    if !path.exists() {
        return None;
    }
    Segment::open(path)
        .ok()
        .filter(|s| s.header.recording == id)
}

#[cfg(test)]
mod samples;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tui_tests;
