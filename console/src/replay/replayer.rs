//! The model at any moment of a recording.
//!
//! The replayer holds a model, a reader positioned after the last line it applied, and
//! the number of events applied (`ordinal`). Moving forward reads and applies lines;
//! moving backward (or far forward) restores the nearest snapshot before the target and
//! plays the events after it. Snapshots are checkpoints of the recorder's model after
//! exactly `events` event lines, so the model after a seek is the model after playing
//! from the start.

use std::path::Path;

use den_protocol::recording::{self as format, Kind, peek};
use den_protocol::session::Stamped;
use den_protocol::time::Millis;

use super::segment::{LineReader, RawLine};
use super::{Recording, ReplayError};
use crate::model::{Checkpoint, Model};
use crate::record::codec::Codec;

/// What went wrong along the way without stopping the replay.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Warnings {
    /// Bytes of a torn last line (a crash while writing), per segment path.
    pub torn: Vec<(String, u64)>,
    /// Event lines that could not be decoded (a newer minor version, damage).
    pub skipped: u64,
    /// The first such problem.
    pub first_skip: Option<String>,
    /// Where the recorder dropped events and how many (from its gap lines).
    pub gaps: Vec<(Millis, u64)>,
}

pub struct Replayer {
    recording: Recording,
    model: Model,
    codec: Codec,
    segment: usize,
    reader: Option<LineReader>,
    pending: Option<RawLine>,
    ordinal: u64,
    last_event_at: Millis,
    last_event: Option<Stamped>,
    position: Millis,
    start: Millis,
    end: Millis,
    warnings: Warnings,
}

impl Replayer {
    /// Open a recording at its start.
    pub fn open(path: &Path) -> Result<Replayer, ReplayError> {
        let recording = Recording::open(path)?;
        Replayer::new(recording)
    }

    pub fn new(recording: Recording) -> Result<Replayer, ReplayError> {
        let start = recording.start();
        let end = recording.end()?.max(start);
        let model = Model::new(recording.model_config());
        let mut r = Replayer {
            recording,
            model,
            codec: Codec::new(),
            segment: 0,
            reader: None,
            pending: None,
            ordinal: 0,
            last_event_at: start,
            last_event: None,
            position: start,
            start,
            end,
            warnings: Warnings::default(),
        };
        r.restore_before(0, start, u64::MAX)?;
        r.position = start;
        Ok(r)
    }

    pub fn recording(&self) -> &Recording {
        &self.recording
    }

    /// The model as of [`Replayer::position`], settled.
    pub fn model(&mut self) -> &Model {
        self.model.settle();
        &self.model
    }

    /// The model without settling (for readers that settle themselves).
    pub fn model_unsettled(&self) -> &Model {
        &self.model
    }

    /// The replay's time: frames are drawn as of this moment.
    pub fn position(&self) -> Millis {
        self.position
    }

    /// Event lines applied so far (over the whole recording).
    pub fn ordinal(&self) -> u64 {
        self.ordinal
    }

    /// The time of the last event applied.
    pub fn last_event_at(&self) -> Millis {
        self.last_event_at
    }

    pub fn start(&self) -> Millis {
        self.start
    }

    pub fn end(&self) -> Millis {
        self.end
    }

    pub fn warnings(&self) -> &Warnings {
        &self.warnings
    }

    /// Go to time `t` (clamped to the recording): every event stamped at or before it
    /// applied, none after.
    pub fn seek(&mut self, t: Millis) -> Result<(), ReplayError> {
        let t = t.clamp(self.start, self.end);
        let (segment, snapshot) = self.find_snapshot(t, u64::MAX)?;
        let going_back = t < self.position || t < self.last_event_at;
        let ahead_of_us =
            snapshot.is_some_and(|(_, _, events)| events > self.ordinal) || segment > self.segment;
        if going_back || ahead_of_us {
            self.restore_before(segment, t, u64::MAX)?;
        }
        self.play_until(t)?;
        self.position = t;
        Ok(())
    }

    /// Apply the next event, whatever its time; the position moves to it. `false` at
    /// the end of the recording.
    pub fn step_forward(&mut self) -> Result<bool, ReplayError> {
        let before = self.ordinal;
        self.advance(None, Some(self.ordinal + 1))?;
        if self.ordinal > before {
            self.position = self.last_event_at;
        }
        Ok(self.ordinal > before)
    }

    /// The last event applied (`None` right after a seek to a snapshot).
    pub fn last_event(&self) -> Option<&Stamped> {
        self.last_event.as_ref()
    }

    /// Undo the last event: the model after the event before it. `false` at the start.
    pub fn step_back(&mut self) -> Result<bool, ReplayError> {
        let first = self
            .recording
            .segments
            .first()
            .map_or(0, |s| s.first_events);
        if self.ordinal <= first {
            return Ok(false);
        }
        let target = self.ordinal - 1;
        let at = self.last_event_at;
        let (segment, _) = self.find_snapshot(at, target)?;
        self.restore_before(segment, at, target)?;
        self.advance(None, Some(target))?;
        self.position = self.last_event_at;
        Ok(true)
    }

    /// The time of the next event, without applying it.
    pub fn next_event_at(&mut self) -> Result<Option<Millis>, ReplayError> {
        loop {
            let Some(line) = self.peek_line()? else {
                return Ok(None);
            };
            match peek(&line.bytes) {
                Some(p) if p.kind == Kind::Event => return Ok(Some(p.at)),
                Some(p) => self.consume_other(&line, p.kind),
                None => {
                    self.pending = None;
                    self.skip("a line that is not a recording line");
                }
            }
        }
    }

    /// The segment and snapshot to restore for the state after `max_events` events at
    /// time `t`.
    #[allow(clippy::type_complexity)]
    fn find_snapshot(
        &self,
        t: Millis,
        max_events: u64,
    ) -> Result<(usize, Option<(u64, Millis, u64)>), ReplayError> {
        for (i, seg) in self.recording.segments.iter().enumerate().rev() {
            if seg.first_at > t || seg.first_events > max_events {
                continue;
            }
            let found = seg
                .snapshot_before(t, max_events)
                .map_err(|e| io_error(&seg.path, e))?;
            if found.is_some() {
                return Ok((i, found));
            }
        }
        Ok((0, None))
    }

    /// Restore the last usable snapshot before `(t, max_events)`, falling back to
    /// earlier ones when one cannot be read (a torn last snapshot).
    fn restore_before(
        &mut self,
        segment: usize,
        t: Millis,
        max_events: u64,
    ) -> Result<(), ReplayError> {
        let mut seg_index = segment;
        let mut t = t;
        let mut max_events = max_events;
        loop {
            let Some(seg) = self.recording.segments.get(seg_index) else {
                return Err(ReplayError::Format {
                    path: self.recording.header().recording.clone(),
                    detail: "no readable snapshot: the recording is damaged".to_owned(),
                });
            };
            let found = seg
                .snapshot_before(t, max_events)
                .map_err(|e| io_error(&seg.path, e))?;
            let Some((offset, at, events)) = found else {
                if seg_index == 0 {
                    return Err(ReplayError::Format {
                        path: seg.path.display().to_string(),
                        detail: "no snapshot at the start: not a complete den recording".to_owned(),
                    });
                }
                seg_index -= 1;
                continue;
            };
            let mut reader = seg
                .reader_from(offset)
                .map_err(|e| io_error(&seg.path, e))?;
            let restored = reader
                .next_line()
                .and_then(|line| format::decode_snapshot::<Checkpoint>(&line.bytes).ok());
            match restored {
                Some((at, events, checkpoint)) => {
                    self.model = Model::from_checkpoint(checkpoint);
                    self.codec.clear();
                    self.segment = seg_index;
                    self.reader = Some(reader);
                    self.pending = None;
                    self.ordinal = events;
                    self.last_event_at = at;
                    self.last_event = None;
                    self.position = at;
                    return Ok(());
                }
                None => {
                    // Try the one before it: strictly fewer events, or with none before
                    // it strictly earlier, so every turn moves back (a damaged snapshot
                    // at 5 ms with no events before it once made this loop forever).
                    if events > 0 {
                        t = at;
                        max_events = events - 1;
                    } else if at > Millis::ZERO {
                        t = Millis(at.0 - 1);
                        max_events = 0;
                    } else if seg_index == 0 {
                        return Err(ReplayError::Format {
                            path: seg.path.display().to_string(),
                            detail: "the first snapshot cannot be read".to_owned(),
                        });
                    } else {
                        seg_index -= 1;
                        max_events = 0;
                    }
                }
            }
        }
    }

    /// Play every event stamped at or before `t`.
    fn play_until(&mut self, t: Millis) -> Result<(), ReplayError> {
        self.advance(Some(t), None)
    }

    /// Apply lines until the next event is after `until` or `count` events were applied
    /// in total.
    fn advance(&mut self, until: Option<Millis>, count: Option<u64>) -> Result<(), ReplayError> {
        loop {
            if count.is_some_and(|c| self.ordinal >= c) {
                return Ok(());
            }
            let Some(line) = self.peek_line()? else {
                return Ok(());
            };
            let Some(p) = peek(&line.bytes) else {
                self.pending = None;
                self.skip("a line that is not a recording line");
                continue;
            };
            if p.kind != Kind::Event {
                self.consume_other(&line, p.kind);
                continue;
            }
            if until.is_some_and(|u| p.at > u) {
                return Ok(());
            }
            self.pending = None;
            self.ordinal += 1;
            self.last_event_at = self.last_event_at.max(p.at);
            match self.codec.decode(&line.bytes, &self.model) {
                Ok(stamped) => {
                    self.model.apply(&stamped);
                    self.last_event = Some(stamped);
                }
                Err(e) => {
                    self.last_event = None;
                    self.skip(&e.to_string());
                }
            }
        }
    }

    /// Consume a line that is not an event.
    fn consume_other(&mut self, line: &RawLine, kind: Kind) {
        self.pending = None;
        if matches!(kind, Kind::Snapshot { .. }) {
            // The writer forgot its delta bases here.
            self.codec.clear();
        }
        if let Kind::Gap { dropped } = kind
            && let Some(p) = peek(&line.bytes)
            && !self.warnings.gaps.contains(&(p.at, dropped))
        {
            self.warnings.gaps.push((p.at, dropped));
        }
        if let Kind::Snapshot { events } = kind
            && events != self.ordinal
            && let Ok((at, events, c)) = format::decode_snapshot::<Checkpoint>(&line.bytes)
        {
            // Events are missing before it (a lost segment): resynchronise.
            self.model = Model::from_checkpoint(c);
            self.ordinal = events;
            self.last_event_at = at;
            self.last_event = None;
        }
    }

    /// The next line (kept as pending until consumed), moving to the next segment at
    /// the end of one.
    fn peek_line(&mut self) -> Result<Option<RawLine>, ReplayError> {
        loop {
            if let Some(line) = &self.pending {
                return Ok(Some(line.clone()));
            }
            let next = self.reader.as_mut().and_then(LineReader::next_line);
            if let Some(line) = next {
                self.pending = Some(line);
                continue;
            }
            // The end of this segment.
            if let Some(reader) = &self.reader
                && let Some(bytes) = reader.torn.or(reader
                    .oversized
                    .then_some(super::segment::MAX_LINE_BYTES as u64))
                && let Some(seg) = self.recording.segments.get(self.segment)
            {
                let path = seg.path.display().to_string();
                if !self.warnings.torn.iter().any(|(p, _)| *p == path) {
                    self.warnings.torn.push((path, bytes));
                }
            }
            let next_segment = self.segment + 1;
            let Some(seg) = self.recording.segments.get(next_segment) else {
                self.reader = None;
                return Ok(None);
            };
            let reader = seg.reader_from(0).map_err(|e| io_error(&seg.path, e))?;
            self.segment = next_segment;
            self.reader = Some(reader);
        }
    }

    fn skip(&mut self, why: &str) {
        self.warnings.skipped += 1;
        if self.warnings.first_skip.is_none() {
            self.warnings.first_skip = Some(why.to_owned());
        }
    }
}

fn io_error(path: &Path, e: std::io::Error) -> ReplayError {
    ReplayError::Io {
        path: path.display().to_string(),
        detail: e.to_string(),
    }
}
