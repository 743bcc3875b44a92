//! One segment file: its header, where its snapshots are, and readers from any of them.
//!
//! Plain files are never read whole: lines are ordered by time and start with
//! `{"at":N,`, so the first line after a time is found by bisecting byte offsets, and
//! the snapshot before it by scanning backwards from there (snapshots are at most a few
//! hundred KiB apart). zstd files are walked once for their marker frames
//! ([`super::zst`]); reading starts at the marker of the snapshot wanted. Either way the
//! memory used is one line plus the model.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use den_protocol::recording::{self as format, Header, Kind, Peek, peek};
use den_protocol::time::Millis;

use super::ReplayError;
use super::zst::{self, Marker};

/// Bytes read per step when scanning.
const CHUNK: usize = 64 * 1024;
/// Enough bytes for any line prefix `peek` reads.
const PREFIX: usize = 96;

/// A line as read: its bytes (newline removed) and where it starts.
#[derive(Debug, Clone)]
pub struct RawLine {
    pub bytes: Vec<u8>,
    /// Byte offset in a plain file; the frame's marker offset in a zstd file.
    pub offset: u64,
}

/// Reads lines from a position, reporting a torn last line.
pub struct LineReader {
    inner: Box<dyn BufRead + Send>,
    /// Plain files: the offset of the next line.
    offset: Option<u64>,
    /// Set once the end was reached and the last line was incomplete (or the compressed
    /// stream ended early): how many bytes were dropped.
    pub torn: Option<u64>,
    /// Set when a line was longer than `MAX_LINE_BYTES`: reading stopped there.
    pub oversized: bool,
    done: bool,
}

/// Longest line the replayer reads (a segment is at most 64 MiB, so no line den writes
/// is longer).
pub const MAX_LINE_BYTES: usize = 64 << 20;

impl LineReader {
    /// The next complete line, `None` at the end.
    pub fn next_line(&mut self) -> Option<RawLine> {
        if self.done {
            return None;
        }
        let start = self.offset.unwrap_or(0);
        let mut bytes = Vec::new();
        // Bounded: a file that is not a recording (or a hostile one) may hold a "line" of
        // gigabytes; no line den writes comes near the limit.
        match (&mut self.inner)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut bytes)
        {
            Ok(0) => {
                self.done = true;
                None
            }
            Ok(n) if n > MAX_LINE_BYTES => {
                self.done = true;
                self.oversized = true;
                None
            }
            Ok(n) => {
                if bytes.last() != Some(&b'\n') {
                    // The end of the file without a newline: a line cut by a crash.
                    self.done = true;
                    self.torn = Some(n as u64);
                    return None;
                }
                bytes.pop();
                if let Some(o) = &mut self.offset {
                    *o += n as u64;
                }
                Some(RawLine {
                    bytes,
                    offset: start,
                })
            }
            Err(_) => {
                // A zstd stream cut by a crash ends in an error after its complete
                // blocks; whatever partial line came before it is dropped.
                self.done = true;
                self.torn = Some(bytes.len() as u64);
                None
            }
        }
    }
}

/// One segment file.
#[derive(Debug, Clone)]
pub struct Segment {
    pub path: PathBuf,
    pub header: Header,
    pub compressed: bool,
    /// File size when opened.
    pub len: u64,
    /// Plain files: the offset of the first line after the header.
    pub data_start: u64,
    /// zstd files: every snapshot marker.
    pub markers: Vec<Marker>,
    /// zstd files: the file ends inside a frame.
    pub truncated: bool,
    /// Time of the first line after the header (the segment's opening snapshot).
    pub first_at: Millis,
    /// Events before the segment's opening snapshot.
    pub first_events: u64,
}

impl Segment {
    pub fn open(path: &Path) -> Result<Segment, ReplayError> {
        let io = |e: io::Error| ReplayError::Io {
            path: path.display().to_string(),
            detail: e.to_string(),
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        let compressed = is_zstd(&file).map_err(io)?;
        let mut segment = Segment {
            path: path.to_path_buf(),
            header: placeholder_header(),
            compressed,
            len,
            data_start: 0,
            markers: Vec::new(),
            truncated: false,
            first_at: Millis::ZERO,
            first_events: 0,
        };
        let mut reader = segment.reader_from(0).map_err(io)?;
        let header_line = reader.next_line().ok_or_else(|| ReplayError::Format {
            path: path.display().to_string(),
            detail: if reader.oversized {
                format!(
                    "not a recording: its first line is longer than {} MiB",
                    MAX_LINE_BYTES >> 20
                )
            } else {
                "empty file: no recording header".to_owned()
            },
        })?;
        segment.header =
            format::decode_header(&header_line.bytes).map_err(|e| ReplayError::Format {
                path: path.display().to_string(),
                detail: e.to_string(),
            })?;
        segment.data_start = header_line.bytes.len() as u64 + 1;
        if compressed {
            let frames = zst::walk(&file).map_err(io)?;
            segment.markers = frames.markers;
            segment.truncated = frames.truncated;
        }
        if let Some(first) = reader.next_line()
            && let Some(p) = peek(&first.bytes)
        {
            segment.first_at = p.at;
            if let Kind::Snapshot { events } = p.kind {
                segment.first_events = events;
            }
        }
        Ok(segment)
    }

    /// A reader from the start of the file (`0`), a line start (plain) or a marker
    /// offset (zstd).
    pub fn reader_from(&self, offset: u64) -> io::Result<LineReader> {
        let mut file = File::open(&self.path)?;
        file.seek(SeekFrom::Start(offset))?;
        if self.compressed {
            let decoder = zstd::stream::read::Decoder::new(file)?;
            Ok(LineReader {
                inner: Box::new(BufReader::with_capacity(CHUNK, decoder)),
                offset: None,
                torn: None,
                oversized: false,
                done: false,
            })
        } else {
            Ok(LineReader {
                inner: Box::new(BufReader::with_capacity(CHUNK, file)),
                offset: Some(offset),
                torn: None,
                oversized: false,
                done: false,
            })
        }
    }

    /// Where to start reading to rebuild the state after the `max_events`-th event at
    /// time `at`: the last snapshot with `at ≤ at` and `events ≤ max_events`, as the
    /// offset to read from and the snapshot's `(at, events)`.
    pub fn snapshot_before(
        &self,
        at: Millis,
        max_events: u64,
    ) -> io::Result<Option<(u64, Millis, u64)>> {
        if self.compressed {
            return Ok(self
                .markers
                .iter()
                .rev()
                .find(|m| m.at <= at && m.events <= max_events)
                .map(|m| (m.offset, m.at, m.events)));
        }
        let file = File::open(&self.path)?;
        let end = self.first_line_after(&file, at)?;
        self.scan_back_for_snapshot(&file, end, at, max_events)
    }

    /// The time of the last complete line (the end of the segment).
    pub fn last_at(&self) -> io::Result<Millis> {
        if self.compressed {
            // Decompress from the last snapshot to the end (at most one snapshot
            // interval of lines).
            let start = self.markers.last().map_or(0, |m| m.offset);
            let mut reader = self.reader_from(start)?;
            let mut last = self.markers.last().map_or(self.first_at, |m| m.at);
            while let Some(line) = reader.next_line() {
                if let Some(p) = peek(&line.bytes)
                    && p.kind != Kind::Header
                {
                    last = last.max(p.at);
                }
            }
            return Ok(last);
        }
        let file = File::open(&self.path)?;
        let mut end = self.len;
        // Lines are short except snapshots; look back chunk by chunk.
        while end > self.data_start {
            let start = end.saturating_sub(CHUNK as u64).max(self.data_start);
            let chunk = read_range(&file, start, end)?;
            let mut found = None;
            for ls in line_starts_back(&chunk, start, self.data_start) {
                if let Some(p) = self.peek_at(&file, ls, &chunk, start)?
                    && p.kind != Kind::Header
                    && self.line_is_complete(&file, ls)?
                {
                    found = Some(p.at);
                    break;
                }
            }
            if let Some(at) = found {
                return Ok(at);
            }
            end = start;
        }
        Ok(self.first_at)
    }

    /// Whether the line starting at `ls` ends with a newline.
    fn line_is_complete(&self, file: &File, ls: u64) -> io::Result<bool> {
        let mut pos = ls;
        while pos < self.len {
            let to = (pos + CHUNK as u64).min(self.len);
            let chunk = read_range(file, pos, to)?;
            if chunk.contains(&b'\n') {
                return Ok(true);
            }
            pos = to;
        }
        Ok(false)
    }

    /// Offset of the first line with time `> at` (or the end of the file).
    fn first_line_after(&self, file: &File, at: Millis) -> io::Result<u64> {
        let mut lo = self.data_start;
        let mut hi = self.len;
        while hi - lo > CHUNK as u64 {
            let mid = lo + (hi - lo) / 2;
            match self.next_line_start(file, mid)? {
                Some(ls) if ls < hi => match self.peek_line(file, ls)? {
                    Some(p) if p.at <= at => lo = ls,
                    _ => hi = mid,
                },
                _ => hi = mid,
            }
        }
        // A linear scan of the last stretch.
        let mut reader = self.reader_from(lo)?;
        while let Some(line) = reader.next_line() {
            if let Some(p) = peek(&line.bytes)
                && p.at > at
            {
                return Ok(line.offset);
            }
        }
        Ok(self.len)
    }

    fn scan_back_for_snapshot(
        &self,
        file: &File,
        end: u64,
        at: Millis,
        max_events: u64,
    ) -> io::Result<Option<(u64, Millis, u64)>> {
        let mut end = end;
        while end > self.data_start {
            let start = end.saturating_sub(CHUNK as u64).max(self.data_start);
            let chunk = read_range(file, start, end)?;
            for ls in line_starts_back(&chunk, start, self.data_start) {
                if let Some(p) = self.peek_at(file, ls, &chunk, start)?
                    && let Kind::Snapshot { events } = p.kind
                    && p.at <= at
                    && events <= max_events
                    && self.line_is_complete(file, ls)?
                {
                    return Ok(Some((ls, p.at, events)));
                }
            }
            end = start;
        }
        Ok(None)
    }

    /// Peek the line at `ls`, from `chunk` (which starts at `chunk_start`) when it holds
    /// the prefix, else from the file.
    fn peek_at(
        &self,
        file: &File,
        ls: u64,
        chunk: &[u8],
        chunk_start: u64,
    ) -> io::Result<Option<Peek>> {
        let from = (ls - chunk_start) as usize;
        match chunk.get(from..from + PREFIX) {
            Some(prefix) => Ok(peek(prefix)),
            None => self.peek_line(file, ls),
        }
    }

    fn peek_line(&self, file: &File, ls: u64) -> io::Result<Option<Peek>> {
        let prefix = read_range(file, ls, (ls + PREFIX as u64).min(self.len))?;
        Ok(peek(&prefix))
    }

    /// The first line start at or after `pos`.
    fn next_line_start(&self, file: &File, pos: u64) -> io::Result<Option<u64>> {
        if pos <= self.data_start {
            return Ok(Some(self.data_start));
        }
        // `pos` is a line start when the byte before it is a newline.
        let mut at = pos - 1;
        while at < self.len {
            let to = (at + CHUNK as u64).min(self.len);
            let chunk = read_range(file, at, to)?;
            if let Some(i) = chunk.iter().position(|b| *b == b'\n') {
                let ls = at + i as u64 + 1;
                return Ok((ls < self.len).then_some(ls));
            }
            at = to;
        }
        Ok(None)
    }
}

/// Line starts inside `chunk` (which covers `[start, start + len)`), last first: every
/// byte after a newline, and `start` itself when it is the first data byte.
fn line_starts_back(chunk: &[u8], start: u64, data_start: u64) -> Vec<u64> {
    let mut starts: Vec<u64> = chunk
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .map(|(i, _)| start + i as u64 + 1)
        .filter(|ls| *ls < start + chunk.len() as u64)
        .collect();
    if start == data_start {
        starts.insert(0, start);
    }
    starts.reverse();
    starts
}

fn read_range(file: &File, from: u64, to: u64) -> io::Result<Vec<u8>> {
    let mut f = file;
    f.seek(SeekFrom::Start(from))?;
    let mut buf = Vec::with_capacity(to.saturating_sub(from) as usize);
    f.take(to.saturating_sub(from)).read_to_end(&mut buf)?;
    Ok(buf)
}

fn is_zstd(file: &File) -> io::Result<bool> {
    let mut magic = [0u8; 4];
    let n = read_range(file, 0, 4)?;
    if n.len() < 4 {
        return Ok(false);
    }
    magic.copy_from_slice(&n);
    let m = u32::from_le_bytes(magic);
    Ok(m == 0xFD2F_B528 || m & 0xFFFF_FFF0 == 0x184D_2A50)
}

fn placeholder_header() -> Header {
    Header::new(
        "",
        "",
        0,
        0,
        "",
        Vec::new(),
        den_protocol::recording::Redactor::default().policy(),
        serde_json::Value::Null,
    )
}
