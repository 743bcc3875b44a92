//! The `cuda` backend: the page arena in device memory, through cudarc with dynamic
//! loading, so the binary builds and runs on hosts without CUDA.
//!
//! Opening it on a host without `libcuda.so` returns [`MemoryError::NoDriver`]: the
//! driver library is probed first (cudarc panics on the first driver call when the
//! library is absent), and every driver entry point used during opening runs inside
//! `catch_unwind` in case a symbol is missing from an old driver.
//!
//! Shape of the backend:
//! - the device arena is allocated **once**, zeroed, at open;
//! - two pinned host staging buffers of `staging_bytes` each: write-combined for uploads
//!   (the CPU only writes it, the DMA engine reads it) and plain (flags 0) for downloads,
//!   because the CPU must read it back and write-combined memory is very slow to read;
//! - one CUDA stream; every operation fills staging, issues all its copies between two
//!   timing-enabled events, waits for the end event and reads the device time between
//!   the events. Operations larger than the staging buffer run as several batches.
//!
//! cudarc's per-slice event tracking is switched off for this context: the backend uses a
//! single stream and synchronises before every return, so there is nothing to track, and
//! raw copies against the arena base pointer avoid a stream synchronisation per copy.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, DriverError, PinnedHostSlice, result,
    sys,
};

pub use crate::memory::device::{CudaOptions, DEFAULT_STAGING_BYTES, DeviceInfo};
use crate::memory::{
    ArenaGeometry, BackendKind, CopyOp, Direction, Gathered, MemoryError, PageIndex, PageMemory,
    RowRun, TimingSource, TransferStats, TransferTotals, plan_copies, split_batches,
};

/// Whether the CUDA driver library can be loaded on this host. Never panics.
pub fn driver_present() -> bool {
    // SAFETY: only tries to dlopen the library by name; no CUDA call is made.
    catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false)
}

/// Number of CUDA devices; [`MemoryError::NoDriver`] without a driver.
pub fn device_count() -> Result<usize, MemoryError> {
    if !driver_present() {
        return Err(MemoryError::NoDriver);
    }
    let n = guarded("counting devices", CudaContext::device_count)?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Reports one device without allocating an arena (e.g. to size one).
pub fn probe(ordinal: usize) -> Result<DeviceInfo, MemoryError> {
    let ctx = context(ordinal)?;
    device_info(&ctx)
}

/// A page arena in GPU memory.
pub struct CudaMemory {
    geometry: ArenaGeometry,
    info: DeviceInfo,
    // Field order is drop order: buffers and events go before the stream and context.
    arena: CudaSlice<u8>,
    upload: Staging,
    download: Staging,
    start: CudaEvent,
    end: CudaEvent,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    totals: TransferTotals,
    /// The upload [`PageMemory::start_write`] left in flight.
    in_flight: Option<InFlight>,
}

/// An upload whose last batch may still be in flight on the stream: what it moves, and
/// the device time of the batches before it.
struct InFlight {
    bytes: u64,
    copies: usize,
    elapsed: Duration,
    t0: Instant,
    /// A batch was issued and not waited for (none when there was nothing to copy).
    pending: bool,
}

impl Drop for CudaMemory {
    fn drop(&mut self) {
        // The staging an in-flight upload reads is freed with this arena.
        let _ = self.settle();
    }
}

impl CudaMemory {
    /// Opens GPU `ordinal` and allocates the arena with default options.
    pub fn open(ordinal: usize, geometry: ArenaGeometry) -> Result<Self, MemoryError> {
        Self::open_with(ordinal, geometry, CudaOptions::default())
    }

    pub fn open_with(
        ordinal: usize,
        geometry: ArenaGeometry,
        options: CudaOptions,
    ) -> Result<Self, MemoryError> {
        let ctx = context(ordinal)?;
        // SAFETY: this backend uses one stream and synchronises before each call returns
        // (see the module comment), which is what disabling event tracking requires.
        unsafe { ctx.disable_event_tracking() };
        let info = device_info(&ctx)?;
        let stream = ctx
            .new_stream()
            .map_err(|e| driver_error("creating a stream", e))?;
        let arena_bytes = geometry.arena_bytes();
        let usable = info.usable_bytes(u64::MAX);
        if arena_bytes > usable {
            return Err(MemoryError::Alloc {
                what: "device page arena",
                bytes: arena_bytes,
                message: format!(
                    "{} has {} bytes free and at most {usable} usable ({} pages of {} bytes)",
                    info.name,
                    info.free_bytes,
                    info.max_pages_for(u64::MAX, geometry.page_bytes()),
                    geometry.page_bytes()
                ),
            });
        }
        let arena = guarded("allocating the device page arena", || {
            stream.alloc_zeros::<u8>(arena_bytes as usize)
        })
        .map_err(|e| alloc_error("device page arena", arena_bytes, e))?;
        let staging = options.staging_bytes.max(1);
        // SAFETY (both): the staging buffers are plain bytes; stale contents are never read
        // before being written by the CPU (upload) or the DMA engine (download).
        let upload = guarded("allocating pinned upload staging", || unsafe {
            ctx.alloc_pinned::<u8>(staging)
        })
        .map_err(|e| alloc_error("pinned upload staging buffer", staging as u64, e))?;
        let download = guarded("allocating pinned download staging", || unsafe {
            ctx.alloc_pinned_with_flags::<u8>(staging, 0)
        })
        .map_err(|e| alloc_error("pinned download staging buffer", staging as u64, e))?;
        let timing = Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC);
        let start = ctx
            .new_event(timing)
            .map_err(|e| driver_error("creating a timing event", e))?;
        let end = ctx
            .new_event(timing)
            .map_err(|e| driver_error("creating a timing event", e))?;
        stream
            .synchronize()
            .map_err(|e| driver_error("zeroing the device page arena", e))?;
        Ok(CudaMemory {
            geometry,
            info,
            arena,
            upload: Staging(upload),
            download: Staging(download),
            start,
            end,
            stream,
            ctx,
            totals: TransferTotals::default(),
            in_flight: None,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Pages of this arena's page size that fit in `budget_bytes` on this device, as
    /// measured when the arena was opened (so it includes the arena itself as used).
    pub fn max_pages_for(&self, budget_bytes: u64) -> u32 {
        self.info
            .max_pages_for(budget_bytes, self.geometry.page_bytes())
    }

    /// Makes this arena's context current on the calling thread: the raw copies below do
    /// not do it themselves, and the backend may be used from any thread.
    fn bind(&self) -> Result<(), MemoryError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_error("binding the CUDA context", e))
    }

    fn base(&self) -> sys::CUdeviceptr {
        // Event tracking is disabled, so the returned guard records nothing.
        let (ptr, _guard) = self.arena.device_ptr(&self.stream);
        ptr
    }

    /// Copies `src` into `runs` through the upload staging, a batch at a time, waiting for
    /// each batch but the last, which it leaves in flight ([`CudaMemory::complete`] waits).
    fn upload(&mut self, runs: &[RowRun], src: Gathered<'_>) -> Result<InFlight, MemoryError> {
        let len = src.len();
        let copies = plan_copies(&self.geometry, runs, len)?;
        let t0 = Instant::now();
        self.bind()?;
        let base = self.base();
        let mut elapsed = Duration::ZERO;
        let mut issued = 0usize;
        let mut pending = false;
        for batch in split_batches(&copies, self.upload.0.len()) {
            if pending {
                elapsed += waited(&self.start, &self.end, "host-to-device copy")?;
            }
            let Self {
                upload,
                start,
                end,
                stream,
                ..
            } = &mut *self;
            let staging = upload
                .0
                .as_mut_slice()
                .map_err(|e| driver_error("mapping upload staging", e))?;
            let mut at = 0usize;
            for c in &batch {
                let filled = staging
                    .get_mut(at..at + c.len)
                    .is_some_and(|to| src.copy_to(c.buffer_offset, to));
                if !filled {
                    return Err(staging_error(c, len));
                }
                at += c.len;
            }
            let staging: &[u8] = staging;
            let mut pieces = Vec::with_capacity(batch.len());
            let mut at = 0usize;
            for c in &batch {
                let Some(from) = staging.get(at..at + c.len) else {
                    return Err(staging_error(c, len));
                };
                pieces.push((base + c.arena_offset, from));
                at += c.len;
            }
            issued += batch.len();
            issue(start, end, stream, "host-to-device copy", |cu| {
                for (to, from) in &pieces {
                    // SAFETY: `from` is pinned host memory left untouched until the end
                    // event completes (a write left in flight keeps the staging until
                    // `settle`, which every other call runs first); `to` lies inside the
                    // arena (plan_copies).
                    unsafe { result::memcpy_htod_async(*to, from, cu)? };
                }
                Ok(())
            })?;
            pending = true;
        }
        Ok(InFlight {
            bytes: len as u64,
            copies: issued,
            elapsed,
            t0,
            pending,
        })
    }

    /// Waits for what `upload` left in flight and records the whole upload.
    fn complete(&mut self, w: InFlight) -> Result<TransferStats, MemoryError> {
        let last = if w.pending {
            self.bind()?;
            waited(&self.start, &self.end, "host-to-device copy")?
        } else {
            Duration::ZERO
        };
        Ok(self.finish(Direction::Upload, w.bytes, w.copies, w.elapsed + last, w.t0))
    }

    fn finish(
        &mut self,
        direction: Direction,
        bytes: u64,
        copies: usize,
        elapsed: Duration,
        t0: Instant,
    ) -> TransferStats {
        let stats = TransferStats {
            direction,
            bytes,
            copies: u32::try_from(copies).unwrap_or(u32::MAX),
            elapsed,
            wall: t0.elapsed(),
            timing: TimingSource::CudaEvents,
        };
        self.totals.record(&stats);
        stats
    }
}

impl PageMemory for CudaMemory {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn geometry(&self) -> ArenaGeometry {
        self.geometry
    }

    fn write_gathered(
        &mut self,
        runs: &[RowRun],
        src: Gathered<'_>,
    ) -> Result<TransferStats, MemoryError> {
        self.settle()?;
        let w = self.upload(runs, src)?;
        self.complete(w)
    }

    fn start_write(&mut self, runs: &[RowRun], src: Gathered<'_>) -> Result<(), MemoryError> {
        self.settle()?;
        self.in_flight = Some(self.upload(runs, src)?);
        Ok(())
    }

    fn settle(&mut self) -> Result<Option<TransferStats>, MemoryError> {
        match self.in_flight.take() {
            Some(w) => self.complete(w).map(Some),
            None => Ok(None),
        }
    }

    fn read_runs(&mut self, runs: &[RowRun], dst: &mut [u8]) -> Result<TransferStats, MemoryError> {
        self.settle()?;
        let copies = plan_copies(&self.geometry, runs, dst.len())?;
        let t0 = Instant::now();
        self.bind()?;
        let base = self.base();
        let dst_len = dst.len();
        let mut elapsed = Duration::ZERO;
        let mut issued = 0usize;
        for batch in split_batches(&copies, self.download.0.len()) {
            let Self {
                download,
                start,
                end,
                stream,
                ..
            } = &mut *self;
            let staging = download
                .0
                .as_mut_slice()
                .map_err(|e| driver_error("mapping download staging", e))?;
            let total: usize = batch.iter().map(|c| c.len).sum();
            let Some(window) = staging.get_mut(..total) else {
                return Err(MemoryError::BufferSize {
                    expected: total as u64,
                    got: dst_len as u64,
                });
            };
            let mut pieces = Vec::with_capacity(batch.len());
            let mut rest: &mut [u8] = window;
            for c in &batch {
                let (piece, tail) = rest.split_at_mut(c.len);
                pieces.push((piece, base + c.arena_offset));
                rest = tail;
            }
            elapsed += timed(start, end, stream, "device-to-host copy", |cu| {
                for (to, from) in pieces.iter_mut() {
                    // SAFETY: `to` is pinned host memory read only after the end event
                    // completes; `from` lies inside the arena (plan_copies).
                    unsafe { result::memcpy_dtoh_async(to, *from, cu)? };
                }
                Ok(())
            })?;
            let mut at = 0usize;
            for c in &batch {
                let (Some(from), Some(to)) = (
                    staging.get(at..at + c.len),
                    dst.get_mut(c.buffer_offset..c.buffer_offset + c.len),
                ) else {
                    return Err(staging_error(c, dst_len));
                };
                to.copy_from_slice(from);
                at += c.len;
            }
            issued += batch.len();
        }
        Ok(self.finish(Direction::Download, dst_len as u64, issued, elapsed, t0))
    }

    fn copy_page(&mut self, src: PageIndex, dst: PageIndex) -> Result<TransferStats, MemoryError> {
        self.settle()?;
        for page in [src, dst] {
            if page >= self.geometry.page_count {
                return Err(MemoryError::PageOutOfRange {
                    page,
                    page_count: self.geometry.page_count,
                });
            }
        }
        let t0 = Instant::now();
        if src == dst {
            return Ok(self.finish(Direction::PageCopy, 0, 0, Duration::ZERO, t0));
        }
        self.bind()?;
        let base = self.base();
        let bytes = self.geometry.page_bytes();
        let from = base + self.geometry.offset_of(src, 0);
        let to = base + self.geometry.offset_of(dst, 0);
        let (start, end, stream) = (&self.start, &self.end, &self.stream);
        let elapsed = timed(start, end, stream, "device-to-device page copy", |stream| {
            // SAFETY: both pages were checked to lie inside the arena and are distinct, so
            // the ranges do not overlap.
            unsafe { result::memcpy_dtod_async(to, from, bytes as usize, stream) }
        })?;
        Ok(self.finish(Direction::PageCopy, bytes, 1, elapsed, t0))
    }

    fn totals(&self) -> &TransferTotals {
        &self.totals
    }

    fn device_arena(&self) -> Option<crate::memory::DeviceArenaRef> {
        let (ptr, _sync) = self.arena.device_ptr(&self.stream);
        Some(crate::memory::DeviceArenaRef {
            ctx: Arc::clone(&self.ctx),
            kv: den_model::gpu::DeviceKv {
                ptr,
                bytes: self.geometry.arena_bytes(),
                page_size: self.geometry.page_size,
                row_bytes: self.geometry.row_bytes,
            },
        })
    }

    fn describe(&self) -> String {
        let g = self.geometry;
        format!(
            "cuda:{} {} (sm_{}{}, {:.1} GiB total): {} pages × {} rows × {} B/row ({:.1} MiB)",
            self.info.ordinal,
            self.info.name,
            self.info.compute_capability.0,
            self.info.compute_capability.1,
            self.info.total_bytes as f64 / (1u64 << 30) as f64,
            g.page_count,
            g.page_size,
            g.row_bytes,
            g.arena_bytes() as f64 / (1024.0 * 1024.0)
        )
    }
}

/// A pinned staging buffer.
struct Staging(PinnedHostSlice<u8>);

// SAFETY: pinned host memory is ordinary process memory that any thread may access; the
// buffer is owned by one `CudaMemory` and only touched through `&mut self`.
unsafe impl Send for Staging {}

/// Records `start`, runs `issue` on the stream, records `end`, waits for it and returns
/// the device time between the two events.
fn timed(
    start: &CudaEvent,
    end: &CudaEvent,
    stream: &CudaStream,
    op: &'static str,
    run: impl FnOnce(sys::CUstream) -> Result<(), DriverError>,
) -> Result<Duration, MemoryError> {
    issue(start, end, stream, op, run)?;
    waited(start, end, op)
}

/// Records `start`, runs `run` on the stream and records `end`, without waiting.
fn issue(
    start: &CudaEvent,
    end: &CudaEvent,
    stream: &CudaStream,
    op: &'static str,
    run: impl FnOnce(sys::CUstream) -> Result<(), DriverError>,
) -> Result<(), MemoryError> {
    let err = |e| driver_error(op, e);
    start.record(stream).map_err(err)?;
    run(stream.cu_stream()).map_err(err)?;
    end.record(stream).map_err(err)
}

/// Waits for `end` and returns the device time since `start`.
fn waited(start: &CudaEvent, end: &CudaEvent, op: &'static str) -> Result<Duration, MemoryError> {
    let err = |e| driver_error(op, e);
    end.synchronize().map_err(err)?;
    let ms = start.elapsed_ms(end).map_err(err)?;
    Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
}

fn context(ordinal: usize) -> Result<Arc<CudaContext>, MemoryError> {
    // A driver without a usable GPU fails cuInit (e.g. CUDA_ERROR_NO_DEVICE).
    let count = device_count().map_err(|e| match e {
        MemoryError::Driver { op, message } => {
            MemoryError::Unavailable(format!("{op} failed ({message}); use --backend host"))
        }
        other => other,
    })?;
    if count == 0 {
        return Err(MemoryError::Unavailable(
            "the CUDA driver reports no GPU on this host; use --backend host".into(),
        ));
    }
    if ordinal >= count {
        return Err(MemoryError::Unavailable(format!(
            "GPU {ordinal} does not exist: this host has {count} CUDA device(s) (0..{count})"
        )));
    }
    guarded("creating a CUDA context", || CudaContext::new(ordinal))
}

fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, MemoryError> {
    let name = ctx
        .name()
        .map_err(|e| driver_error("reading the device name", e))?;
    let total = ctx
        .total_mem()
        .map_err(|e| driver_error("reading device memory", e))?;
    let (free, _) = ctx
        .mem_get_info()
        .map_err(|e| driver_error("reading free device memory", e))?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| driver_error("reading the compute capability", e))?;
    Ok(DeviceInfo {
        ordinal: ctx.ordinal(),
        name,
        total_bytes: total as u64,
        free_bytes: free as u64,
        compute_capability: cc,
    })
}

/// Runs a driver call, turning both an `Err` and a panic (missing library or symbol) into
/// a [`MemoryError`].
fn guarded<T>(
    op: &'static str,
    f: impl FnOnce() -> Result<T, DriverError>,
) -> Result<T, MemoryError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(driver_error(op, e)),
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            let first = msg.lines().next().unwrap_or(msg);
            Err(MemoryError::Unavailable(format!(
                "{op} failed inside the CUDA driver library ({first}); use --backend host"
            )))
        }
    }
}

fn driver_error(op: &'static str, e: DriverError) -> MemoryError {
    let detail = e
        .error_string()
        .ok()
        .and_then(|s| s.to_str().ok().map(str::to_owned));
    let message = match detail {
        Some(d) => format!("{:?}: {d}", e.0),
        None => format!("{:?}", e.0),
    };
    MemoryError::Driver { op, message }
}

fn alloc_error(what: &'static str, bytes: u64, e: MemoryError) -> MemoryError {
    match e {
        MemoryError::Driver { message, .. } => MemoryError::Alloc {
            what,
            bytes,
            message,
        },
        other => other,
    }
}

fn staging_error(c: &CopyOp, buffer: usize) -> MemoryError {
    MemoryError::BufferSize {
        expected: (c.buffer_offset + c.len) as u64,
        got: buffer as u64,
    }
}

#[cfg(test)]
mod tests;
