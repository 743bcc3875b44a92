//! Page memory backends: where the bytes of the KV page pool live.
//!
//! The pool's accounting (refcounts, routes, reservations) is pure and lives in
//! `den-protocol`; it hands out page *numbers*. A [`PageMemory`] binds those numbers to
//! real bytes and moves rows in and out of them.
//!
//! # Layout
//!
//! An arena holds `page_count` pages. A page holds `page_size` token rows; a row is every
//! layer's K and V for one token, `row_bytes` bytes, in whatever order the engine uses
//! (the arena never looks inside a row). The arena is **page-major and token rows are
//! contiguous within a page**:
//!
//! ```text
//! byte offset of (page p, row r) = p × page_size × row_bytes + r × row_bytes
//! ```
//!
//! so consecutive rows of one page are one contiguous byte range, and the last row of page
//! `p` is immediately followed by the first row of page `p + 1`. Chunk payloads in host
//! buffers and in the storage tiers use the same token-major order (row of token `start`,
//! then `start + 1`, …), so a chunk moves as one contiguous host buffer scattered into
//! [`RowRun`]s.
//!
//! # Transfers
//!
//! Every operation is batched: the caller passes all runs of one chunk at once, the
//! backend validates them, merges runs that are contiguous both in the host buffer and in
//! the arena (e.g. consecutive physical pages) into one copy, and issues the copies as
//! one batch. Each operation returns [`TransferStats`] (bytes, copies, elapsed time and
//! its timing source) and adds it to running [`TransferTotals`] per direction, which the
//! cost model reads for calibration (spec §6.2, `gpu-restore bytes/ms` EWMA) and metrics.
//!
//! Backends: [`host::HostMemory`] (plain host memory, everywhere) and
//! [`cuda::CudaMemory`] (a device arena through cudarc with dynamic loading; opening it
//! on a host without a driver returns [`MemoryError::NoDriver`], never a panic).

use std::fmt;
use std::time::Duration;

use den_protocol::calibration::Ewma;
use serde::Serialize;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_absent.rs"]
pub mod cuda;
pub mod device;
pub mod host;
pub mod plan;

pub use cuda::{CudaMemory, CudaOptions, DeviceInfo};
pub use host::HostMemory;
pub use plan::{CopyOp, Gathered, plan_copies, split_batches};

/// A page number in `0..page_count`, as handed out by the pool.
pub type PageIndex = u32;

/// The shape of a page arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ArenaGeometry {
    /// Token rows per page.
    pub page_size: u32,
    /// Number of pages.
    pub page_count: u32,
    /// Bytes of one token row (all layers' K and V).
    pub row_bytes: u64,
}

impl ArenaGeometry {
    /// A validated geometry: every dimension non-zero and the arena addressable.
    pub fn new(page_size: u32, page_count: u32, row_bytes: u64) -> Result<Self, MemoryError> {
        if page_size == 0 || page_count == 0 || row_bytes == 0 {
            return Err(MemoryError::Geometry(format!(
                "page_size {page_size}, page_count {page_count} and row_bytes {row_bytes} must all be non-zero"
            )));
        }
        if page_count > i32::MAX as u32 {
            return Err(MemoryError::Geometry(format!(
                "page_count {page_count} exceeds i32::MAX: page indices must fit a signed 32-bit page table"
            )));
        }
        let g = ArenaGeometry {
            page_size,
            page_count,
            row_bytes,
        };
        let bytes = (page_size as u128) * (page_count as u128) * (row_bytes as u128);
        if bytes > isize::MAX as u128 {
            return Err(MemoryError::Geometry(format!(
                "arena of {bytes} bytes is not addressable on this host: use fewer pages"
            )));
        }
        Ok(g)
    }

    /// Bytes of one page (`page_size × row_bytes`).
    pub fn page_bytes(&self) -> u64 {
        self.page_size as u64 * self.row_bytes
    }

    /// Bytes of the whole arena.
    pub fn arena_bytes(&self) -> u64 {
        self.page_bytes() * self.page_count as u64
    }

    /// Bytes of `rows` token rows.
    pub fn rows_bytes(&self, rows: u64) -> u64 {
        rows * self.row_bytes
    }

    /// Byte offset of `(page, row)` in the arena (no range check).
    pub fn offset_of(&self, page: PageIndex, row: u32) -> u64 {
        page as u64 * self.page_bytes() + row as u64 * self.row_bytes
    }

    /// The runs that hold tokens `[start, start + count)` of a route whose logical pages
    /// are `pages` (logical page `i` holds tokens `[i × page_size, (i + 1) × page_size)`).
    /// A chunk that starts or ends mid-page gives partial runs at its ends.
    pub fn runs_for(
        &self,
        pages: &[PageIndex],
        start: u32,
        count: u32,
    ) -> Result<Vec<RowRun>, MemoryError> {
        let end = start as u64 + count as u64;
        let covered = pages.len() as u64 * self.page_size as u64;
        if end > covered {
            return Err(MemoryError::RouteTooShort {
                end,
                pages: pages.len(),
                covered,
            });
        }
        let mut runs = Vec::new();
        let mut token = start as u64;
        while token < end {
            let logical = (token / self.page_size as u64) as usize;
            let offset = (token % self.page_size as u64) as u32;
            let len = (self.page_size - offset).min((end - token) as u32);
            // `logical < pages.len()` because token < end ≤ pages.len() × page_size.
            let page = pages
                .get(logical)
                .copied()
                .ok_or(MemoryError::RouteTooShort {
                    end,
                    pages: pages.len(),
                    covered,
                })?;
            runs.push(RowRun { page, offset, len });
            token += len as u64;
        }
        Ok(runs)
    }
}

/// `len` consecutive token rows of one page, starting at row `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct RowRun {
    pub page: PageIndex,
    pub offset: u32,
    pub len: u32,
}

/// Which way bytes moved, relative to the page arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    /// Host buffer → arena (restore, prefill rows; H→D on CUDA).
    Upload,
    /// Arena → host buffer (checkpoint capture; D→H on CUDA).
    Download,
    /// Arena page → arena page (copy-on-write; D→D on CUDA).
    PageCopy,
}

impl Direction {
    pub const ALL: [Direction; 3] = [Direction::Upload, Direction::Download, Direction::PageCopy];

    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
            Direction::PageCopy => "page_copy",
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a transfer's `elapsed` came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimingSource {
    /// CUDA events around the copies on the device stream (copy time only).
    CudaEvents,
    /// `Instant` around the host copies.
    HostClock,
}

/// The measurement of one batched operation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct TransferStats {
    pub direction: Direction,
    /// Bytes moved between host buffer and arena (or page to page).
    pub bytes: u64,
    /// Copy commands issued after merging contiguous runs and splitting by staging size.
    pub copies: u32,
    /// Copy time: device time between CUDA events, or host wall time for the host backend.
    pub elapsed: Duration,
    /// Host wall time of the whole call, including staging copies and synchronisation.
    pub wall: Duration,
    pub timing: TimingSource,
}

impl TransferStats {
    /// Throughput in bytes per millisecond of `elapsed`; `None` when nothing was timed.
    pub fn bytes_per_ms(&self) -> Option<f64> {
        let ms = self.elapsed.as_secs_f64() * 1e3;
        (self.bytes > 0 && ms > 0.0).then(|| self.bytes as f64 / ms)
    }

    /// Throughput in GB/s (10⁹ bytes per second) of `elapsed`.
    pub fn gb_per_s(&self) -> Option<f64> {
        self.bytes_per_ms().map(|b| b / 1e6)
    }
}

/// Running totals of one direction.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct DirectionTotals {
    pub bytes: u64,
    pub elapsed_ns: u64,
    pub wall_ns: u64,
    /// Operations (calls).
    pub count: u64,
    /// Copy commands.
    pub copies: u64,
    /// EWMA of per-operation throughput in bytes/ms (the cost model's calibration input).
    pub bytes_per_ms: Ewma,
}

/// Running totals per direction.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct TransferTotals {
    pub upload: DirectionTotals,
    pub download: DirectionTotals,
    pub page_copy: DirectionTotals,
}

impl TransferTotals {
    pub fn get(&self, direction: Direction) -> &DirectionTotals {
        match direction {
            Direction::Upload => &self.upload,
            Direction::Download => &self.download,
            Direction::PageCopy => &self.page_copy,
        }
    }

    /// Adds one operation. Operations that moved nothing count but do not feed the EWMA.
    pub fn record(&mut self, stats: &TransferStats) {
        let t = match stats.direction {
            Direction::Upload => &mut self.upload,
            Direction::Download => &mut self.download,
            Direction::PageCopy => &mut self.page_copy,
        };
        t.bytes = t.bytes.saturating_add(stats.bytes);
        t.elapsed_ns = t.elapsed_ns.saturating_add(duration_ns(stats.elapsed));
        t.wall_ns = t.wall_ns.saturating_add(duration_ns(stats.wall));
        t.count += 1;
        t.copies += stats.copies as u64;
        if let Some(rate) = stats.bytes_per_ms() {
            t.bytes_per_ms.observe(rate);
        }
    }
}

/// Which backend holds the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    Host,
    Cuda,
}

impl BackendKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// A page arena with batched row transfers. One trait for every backend, so the worker
/// runtime is written once.
///
/// Buffers are token-major: for `write_runs`/`read_runs` the host buffer holds the rows of
/// `runs[0]`, then of `runs[1]`, … back to back, and must be exactly
/// `Σ len × row_bytes` bytes long. Runs may be given in any page order; runs with zero
/// rows are ignored. Calls are synchronous — when they return, the bytes are in place —
/// except [`PageMemory::start_write`], which [`PageMemory::settle`] (or any other call)
/// completes.
pub trait PageMemory: Send {
    fn kind(&self) -> BackendKind;

    fn geometry(&self) -> ArenaGeometry;

    /// Copies rows from `src` into the arena.
    fn write_runs(&mut self, runs: &[RowRun], src: &[u8]) -> Result<TransferStats, MemoryError> {
        self.write_gathered(runs, Gathered(&[src]))
    }

    /// [`PageMemory::write_runs`] from a buffer in pieces.
    fn write_gathered(
        &mut self,
        runs: &[RowRun],
        src: Gathered<'_>,
    ) -> Result<TransferStats, MemoryError>;

    /// [`PageMemory::write_gathered`] that may return before the rows have landed: GPU
    /// memory leaves the last copies in flight on its own stream, which the model's stream
    /// does not wait for, so a step computes while a restore uploads. The rows must not
    /// be read (or their append committed) before [`PageMemory::settle`] returns; every
    /// other call settles first. One write is in flight at a time: a second one settles
    /// the first. Host memory writes at once.
    fn start_write(&mut self, runs: &[RowRun], src: Gathered<'_>) -> Result<(), MemoryError> {
        self.write_gathered(runs, src).map(|_| ())
    }

    /// Waits for the write [`PageMemory::start_write`] left in flight, if any, and
    /// returns what it moved (counted in [`PageMemory::totals`] from then on).
    fn settle(&mut self) -> Result<Option<TransferStats>, MemoryError> {
        Ok(None)
    }

    /// Copies rows from the arena into `dst`.
    fn read_runs(&mut self, runs: &[RowRun], dst: &mut [u8]) -> Result<TransferStats, MemoryError>;

    /// Copies the whole page `src` onto page `dst` (copy-on-write of a shared tail).
    /// Copying a page onto itself is a no-op that moves 0 bytes.
    fn copy_page(&mut self, src: PageIndex, dst: PageIndex) -> Result<TransferStats, MemoryError>;

    /// Running totals since the arena was opened.
    fn totals(&self) -> &TransferTotals;

    /// One line for logs and `--help` output, e.g. `cuda:0 NVIDIA H200 (…)`.
    fn describe(&self) -> String;

    /// The whole arena as host bytes (page-major, `page × page_size + slot` rows), where
    /// it lives in host memory: the CPU forward pass reads and writes KV rows in place.
    /// `None` for device memory.
    fn host_rows(&mut self) -> Option<&mut [u8]> {
        None
    }

    /// The arena in GPU memory, for a forward pass on that GPU: its context and its
    /// device address and shape. `None` for host memory.
    #[cfg(feature = "cuda")]
    fn device_arena(&self) -> Option<DeviceArenaRef> {
        None
    }
}

/// A page arena in GPU memory as a GPU forward pass needs it ([`PageMemory::device_arena`]).
#[cfg(feature = "cuda")]
#[derive(Clone)]
pub struct DeviceArenaRef {
    pub ctx: std::sync::Arc<cudarc::driver::CudaContext>,
    pub kv: den_model::gpu::DeviceKv,
}

/// Why a memory operation failed. Every message says what was wrong and what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemoryError {
    #[error("cuda backend: no CUDA driver (libcuda.so) found on this host; use --backend host")]
    NoDriver,
    #[error("cuda backend: {0}")]
    Unavailable(String),
    #[error("cuda backend: {op} failed: {message}")]
    Driver { op: &'static str, message: String },
    #[error("invalid page arena geometry: {0}")]
    Geometry(String),
    #[error("cannot allocate {bytes} bytes for the {what}: {message}; use fewer pages")]
    Alloc {
        what: &'static str,
        bytes: u64,
        message: String,
    },
    #[error("page {page} is out of range: the arena has {page_count} pages")]
    PageOutOfRange { page: PageIndex, page_count: u32 },
    #[error(
        "run on page {page} covers rows {offset}..{end}, past the end of the page: a page holds {page_size} rows"
    )]
    RunPastPage {
        page: PageIndex,
        offset: u32,
        end: u64,
        page_size: u32,
    },
    #[error("host buffer is {got} bytes but the runs cover {expected} bytes")]
    BufferSize { expected: u64, got: u64 },
    #[error("token range ends at {end} but the route's {pages} pages cover only {covered} tokens")]
    RouteTooShort {
        end: u64,
        pages: usize,
        covered: u64,
    },
}

fn duration_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_rejects_zero_and_huge_dimensions() {
        assert!(ArenaGeometry::new(0, 1, 1).is_err());
        assert!(ArenaGeometry::new(1, 0, 1).is_err());
        assert!(ArenaGeometry::new(1, 1, 0).is_err());
        assert!(ArenaGeometry::new(16, u32::MAX, 1).is_err());
        assert!(ArenaGeometry::new(16, 1 << 30, 1 << 40).is_err());
        let g = ArenaGeometry::new(16, 4, 10).unwrap();
        assert_eq!((g.page_bytes(), g.arena_bytes()), (160, 640));
        assert_eq!(g.offset_of(2, 3), 2 * 160 + 30);
    }

    #[test]
    fn runs_for_splits_a_chunk_at_page_boundaries() {
        let g = ArenaGeometry::new(4, 16, 8).unwrap();
        // Tokens 2..11 of a route on physical pages [9, 3, 5].
        let runs = g.runs_for(&[9, 3, 5], 2, 9).unwrap();
        assert_eq!(
            runs,
            vec![
                RowRun {
                    page: 9,
                    offset: 2,
                    len: 2
                },
                RowRun {
                    page: 3,
                    offset: 0,
                    len: 4
                },
                RowRun {
                    page: 5,
                    offset: 0,
                    len: 3
                },
            ]
        );
        assert_eq!(runs.iter().map(|r| r.len).sum::<u32>(), 9);
        assert!(matches!(
            g.runs_for(&[9, 3], 2, 9),
            Err(MemoryError::RouteTooShort {
                end: 11,
                pages: 2,
                covered: 8
            })
        ));
        assert!(g.runs_for(&[1], 0, 0).unwrap().is_empty());
    }

    #[test]
    fn totals_accumulate_per_direction_and_feed_the_ewma() {
        let mut t = TransferTotals::default();
        let s = TransferStats {
            direction: Direction::Upload,
            bytes: 2_000,
            copies: 2,
            elapsed: Duration::from_millis(2),
            wall: Duration::from_millis(3),
            timing: TimingSource::HostClock,
        };
        t.record(&s);
        t.record(&s);
        let up = t.get(Direction::Upload);
        assert_eq!((up.bytes, up.count, up.copies), (4_000, 2, 4));
        assert_eq!(up.elapsed_ns, 4_000_000);
        assert!((up.bytes_per_ms.or(0.0) - 1_000.0).abs() < 1e-6);
        assert_eq!(t.get(Direction::Download).count, 0);
        // A zero-byte operation counts but does not move the EWMA.
        t.record(&TransferStats {
            bytes: 0,
            direction: Direction::PageCopy,
            ..s
        });
        assert_eq!(t.page_copy.count, 1);
        assert_eq!(t.page_copy.bytes_per_ms.count, 0);
    }

    #[test]
    fn no_driver_message_is_one_clear_line() {
        let m = MemoryError::NoDriver.to_string();
        assert!(m.contains("libcuda.so") && m.contains("--backend host"));
        assert!(!m.contains('\n'));
    }
}
