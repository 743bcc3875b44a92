//! [`GpuRunner`]: a batch of rows through every layer on the device, as
//! [`crate::Runner::forward`] computes it on the CPU — the same rows ([`BatchRow`]: token,
//! position, the sequence whose page table holds it), the same checks, the same order of
//! operations — with K and V in a page arena in device memory ([`DeviceKv`]).
//!
//! Per call: the rows' tokens, positions and page tables are copied up, then the pass runs
//! as [`crate::gpu_plan::plan`] lists it (9 launches a layer), and the logits (or, greedy,
//! the argmax tokens) are copied back. One stream; the call returns when they are on the
//! host.
//!
//! The pass for a batch shape (rows, rows wanting logits, greedy) is resolved to device
//! addresses once and captured as a **CUDA graph** the second time it runs (a shape seen
//! once, such as an odd-sized prefill chunk, costs no capture): later steps of the same
//! shape replay the graph — one launch instead of ~300 for a 30-layer model,
//! which is what bounds small-batch decode. Everything a step changes (tokens, positions,
//! page tables) is copied into the same device buffers before the replay. If capture or
//! instantiation fails, the runner says why ([`GpuRunner::graphs`]) and launches eagerly
//! from then on; `DEN_CUDA_GRAPHS=0` turns graphs off.
//!
//! Differences from the CPU path, by design: weights are f16 (the CPU multiplies the
//! quantized blocks with 8-bit activations), so logits agree within a tolerance and greedy
//! tokens agree, not bit for bit (`agent/gpu-check` measures both); the last layer's FFN
//! runs on every row, not only those that want logits (row-wise, so no result changes).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::cublas::{CudaBlas, result as blas, sys as blas_sys};
use cudarc::driver::{
    CudaContext, CudaGraph, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
    sys as driver_sys,
};

use super::GpuError;
use super::kernels::Kernels;
use super::libraries::{LoadedLibrary, check_libraries, loaded_libraries};
use super::weights::DeviceWeights;
use crate::arch::{BatchRow, Model, ModelError};
use crate::gpu_plan::{self, Arg, BatchTable, Buffer, Elem, Kernel, MAX_HEAD_DIM, PassShape, Step};
use crate::kv::{KvError, Sequence};

mod pass;

use pass::{Pass, dptr, grid, launch_with};

/// A page arena in device memory, as the runner reads and writes it: `bytes` at device
/// address `ptr`, pages of `page_size` rows of `row_bytes` (see [`crate::kv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceKv {
    pub ptr: u64,
    pub bytes: u64,
    pub page_size: u32,
    pub row_bytes: u64,
}

impl DeviceKv {
    /// Pages the arena holds.
    pub fn pages(&self) -> u64 {
        let page = u64::from(self.page_size).saturating_mul(self.row_bytes);
        self.bytes.checked_div(page).unwrap_or(0)
    }
}

/// Environment variable that turns CUDA graphs off (`0`).
pub const GRAPHS_ENV: &str = "DEN_CUDA_GRAPHS";

/// cuBLAS's workspace, owned by the runner so that captured products never allocate.
const BLAS_WORKSPACE: usize = 32 << 20;

/// Passes kept resolved (and captured) at once; a batch shape past this evicts them all.
const MAX_PASSES: usize = 64;

/// Device buffers for up to `cap` rows, reused by every call.
#[derive(Debug)]
struct Buffers {
    cap: usize,
    f32s: HashMap<Buffer, CudaSlice<f32>>,
    u16s: HashMap<Buffer, CudaSlice<u16>>,
    u32s: HashMap<Buffer, CudaSlice<u32>>,
}

/// Whether the runner captures and replays graphs (what [`GraphState`] reports, less
/// the count it derives).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Graphs {
    On,
    Off,
    Failed(String),
}

/// Whether the runner replays CUDA graphs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GraphState {
    /// Passes are captured and replayed; `captured` graphs are held.
    On { captured: usize },
    /// Turned off by [`GRAPHS_ENV`] or [`GpuRunner::set_graphs`].
    Off,
    /// Capture failed once (the error); the runner launches eagerly.
    Failed(String),
}

/// Runs a [`Model`] on a GPU. One runner runs one batch at a time (`&mut self`).
pub struct GpuRunner<'m, 'a> {
    model: &'m Model<'a>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    _blas_workspace: CudaSlice<u8>,
    k: Kernels,
    w: DeviceWeights,
    b: Buffers,
    /// Every buffer's and weight's device address (the arena's is per call).
    addresses: HashMap<Buffer, u64>,
    passes: HashMap<(PassShape, u64), Pass>,
    graphs: Graphs,
    /// Whether [`GpuRunner::take_graph_failure`] has handed out the failure.
    failure_taken: bool,
    logits: Vec<f32>,
    libraries: Vec<LoadedLibrary>,
    device_name: String,
}

impl std::fmt::Debug for GpuRunner<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRunner")
            .field("device", &self.device_name)
            .field("kernels", &self.k.origin)
            .field("weight_bytes", &self.w.bytes)
            .field("graphs", &self.graphs)
            .finish_non_exhaustive()
    }
}

impl<'m, 'a> GpuRunner<'m, 'a> {
    /// A runner for `model` on `ctx` (the context that owns the page arena it will be
    /// given): the libraries checked, the kernels compiled and loaded, the weights
    /// uploaded, buffers for `max_batch` rows allocated.
    pub fn new(
        model: &'m Model<'a>,
        ctx: &Arc<CudaContext>,
        max_batch: usize,
    ) -> Result<GpuRunner<'m, 'a>, GpuError> {
        check_libraries(super::kernels::ptx_file().is_none())?;
        let c = model.config();
        if c.head_dim > MAX_HEAD_DIM
            || c.n_rot > c.head_dim
            || c.head_dim == 0
            || !c.head_dim.is_multiple_of(2)
        {
            return Err(GpuError::Unsupported(format!(
                "head_dim {} (rotated {}): the kernels take even heads of 2 to {MAX_HEAD_DIM} dims",
                c.head_dim, c.n_rot
            )));
        }
        if c.n_head_kv == 0 || !c.n_head.is_multiple_of(c.n_head_kv) {
            return Err(GpuError::Unsupported(format!(
                "{} query heads over {} KV heads",
                c.n_head, c.n_head_kv
            )));
        }
        let device_name = ctx.name().unwrap_or_else(|_| "GPU".into());
        let stream = ctx
            .new_stream()
            .map_err(|e| GpuError::call("creating a stream", e))?;
        let blas =
            CudaBlas::new(Arc::clone(&stream)).map_err(|e| GpuError::call("starting cuBLAS", e))?;
        let workspace = stream
            .alloc_zeros::<u8>(BLAS_WORKSPACE)
            .map_err(|e| GpuError::call("allocating cuBLAS's workspace", e))?;
        // SAFETY: the workspace is device memory of the stated size that outlives the
        // handle (both are fields of the runner; the handle is dropped first).
        let set = unsafe {
            blas_sys::cublasSetWorkspace_v2(
                *blas.handle(),
                dptr(&workspace, &stream) as *mut _,
                BLAS_WORKSPACE,
            )
        };
        if set != blas_sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(GpuError::Unsupported(format!(
                "cuBLAS refused its workspace ({set:?})"
            )));
        }
        let k = Kernels::load(ctx)?;
        let w = DeviceWeights::upload(model, &stream)?;
        let b = Buffers::new(&stream, model, max_batch.max(1), 1)?;
        stream
            .synchronize()
            .map_err(|e| GpuError::call("uploading the weights", e))?;
        let graphs = if std::env::var_os(GRAPHS_ENV).is_some_and(|v| v == "0") {
            Graphs::Off
        } else {
            Graphs::On
        };
        let mut runner = GpuRunner {
            model,
            stream,
            blas,
            _blas_workspace: workspace,
            k,
            w,
            b,
            addresses: HashMap::new(),
            passes: HashMap::new(),
            graphs,
            failure_taken: false,
            logits: Vec::new(),
            libraries: loaded_libraries(),
            device_name,
        };
        runner.resolve_addresses();
        Ok(runner)
    }

    pub fn model(&self) -> &'m Model<'a> {
        self.model
    }

    /// The CUDA libraries loaded when the runner started, and their files.
    pub fn libraries(&self) -> &[LoadedLibrary] {
        &self.libraries
    }

    /// Where the kernels came from (`nvrtc compute_90`, or a PTX file).
    pub fn kernels_origin(&self) -> &str {
        &self.k.origin
    }

    /// The device's name.
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// Bytes of weights on the device.
    pub fn weight_bytes(&self) -> u64 {
        self.w.bytes
    }

    /// Whether passes replay as CUDA graphs.
    pub fn graphs(&self) -> GraphState {
        match &self.graphs {
            Graphs::On => GraphState::On {
                captured: self.passes.values().filter(|p| p.graph.is_some()).count(),
            },
            Graphs::Off => GraphState::Off,
            Graphs::Failed(why) => GraphState::Failed(why.clone()),
        }
    }

    /// Why graph capture failed, once (the first call after the failure), for a log line.
    pub fn take_graph_failure(&mut self) -> Option<String> {
        match &self.graphs {
            Graphs::Failed(why) if !self.failure_taken => {
                self.failure_taken = true;
                Some(why.clone())
            }
            _ => None,
        }
    }

    /// Turns graph replay on or off (a failed capture stays failed).
    pub fn set_graphs(&mut self, on: bool) {
        match (&self.graphs, on) {
            (Graphs::Failed(_), _) => {}
            (_, true) => self.graphs = Graphs::On,
            (_, false) => {
                self.graphs = Graphs::Off;
                self.passes.values_mut().for_each(|p| p.graph = None);
            }
        }
    }

    /// Runs `rows` (any mix of sequences) and returns the logits of the rows with `logits`
    /// set, in order, `vocab` each, as [`crate::Runner::forward`] does.
    pub fn forward(&mut self, rows: &[BatchRow<'_>], kv: &DeviceKv) -> Result<&[f32], ModelError> {
        let wanted = self.run(rows, kv, false)?;
        let vocab = self.model.config().vocab;
        let need = wanted * vocab;
        self.logits.resize(need, 0.0);
        if need > 0 {
            let view = self.b.f32(Buffer::Logits)?.slice(0..need);
            self.stream
                .memcpy_dtoh(&view, &mut self.logits[..need])
                .map_err(|e| GpuError::call("copying logits back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("finishing the pass", e))?;
        Ok(&self.logits[..need])
    }

    /// Appends `tokens` to `seq` (positions `seq.len()..`, its pages covering them) and
    /// returns the last token's logits, as [`crate::Runner::prefill`] does.
    pub fn prefill(
        &mut self,
        tokens: &[u32],
        kv: &DeviceKv,
        seq: &mut Sequence,
    ) -> Result<&[f32], ModelError> {
        let start = seq.len();
        let n = u32::try_from(tokens.len())
            .ok()
            .filter(|n| *n > 0 && start.checked_add(*n).is_some())
            .ok_or_else(|| ModelError::Input("a prefill of no tokens, or too many".into()))?;
        let seq_ref: &Sequence = seq;
        let rows: Vec<BatchRow<'_>> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| BatchRow {
                token: *t,
                pos: start + i as u32,
                seq: seq_ref,
                logits: i + 1 == tokens.len(),
            })
            .collect();
        self.forward(&rows, kv)?;
        seq.set_len(start + n);
        Ok(&self.logits)
    }

    /// Runs `rows` and returns the greedy token of each row with `logits` set, chosen on
    /// the device (only the token ids are copied back): the most likely, the lowest id on
    /// a tie, as [`crate::sample::argmax`]; `None` where every logit is NaN.
    pub fn forward_greedy(
        &mut self,
        rows: &[BatchRow<'_>],
        kv: &DeviceKv,
    ) -> Result<Vec<Option<u32>>, ModelError> {
        let wanted = self.run(rows, kv, true)?;
        let mut out = vec![0u32; wanted];
        if wanted > 0 {
            let view = self.b.u32(Buffer::Argmax)?.slice(0..wanted);
            self.stream
                .memcpy_dtoh(&view, &mut out[..])
                .map_err(|e| GpuError::call("copying tokens back", e))?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("finishing the pass", e))?;
        Ok(out
            .into_iter()
            .map(|t| (t != u32::MAX).then_some(t))
            .collect())
    }

    /// Launches an empty kernel `n` times and waits: launch overhead, for `gpu-check`.
    pub fn launch_noops(&self, n: usize) -> Result<(), GpuError> {
        for _ in 0..n {
            let l = self.stream.launch_builder(&self.k.noop);
            launch_with(l, grid((1, 1), 32), &[], "den_noop")?;
        }
        self.stream
            .synchronize()
            .map_err(|e| GpuError::call("waiting for no-ops", e))
    }

    /// Checks `rows` against the model and the arena (before anything is written).
    fn check(&self, rows: &[BatchRow<'_>], kv: &DeviceKv) -> Result<(), ModelError> {
        let c = self.model.config();
        let want = self.model.kv_layout().row_bytes() as u64;
        if kv.row_bytes != want {
            return Err(KvError::RowSize {
                got: kv.row_bytes as usize,
                expected: want as usize,
            }
            .into());
        }
        let pages = kv.pages();
        for r in rows {
            crate::arch::forward::check_row(c, r)?;
            let (page, _) = r.seq.locate_or_err(r.pos, kv.page_size)?;
            if u64::from(page) >= pages {
                return Err(ModelError::Input(format!(
                    "page {page} is past the device arena ({pages} pages)"
                )));
            }
        }
        Ok(())
    }

    /// The pass up to the logits (and with `greedy` the argmax) on the device; returns how
    /// many rows want logits.
    fn run(
        &mut self,
        rows: &[BatchRow<'_>],
        kv: &DeviceKv,
        greedy: bool,
    ) -> Result<usize, ModelError> {
        self.check(rows, kv)?;
        let n = rows.len();
        if n == 0 {
            return Ok(0);
        }
        let table = BatchTable::of(rows, kv.pages())?;
        let page_room = self.b.u32(Buffer::Pages)?.len();
        if n > self.b.cap || table.pages.len() > page_room {
            // New buffers, never smaller: every resolved pass and graph names the old
            // addresses.
            self.passes.clear();
            self.b = Buffers::new(
                &self.stream,
                self.model,
                n.max(self.b.cap),
                table.pages.len().max(page_room),
            )?;
            self.resolve_addresses();
        }
        for (buffer, host) in table.uploads() {
            if host.is_empty() {
                continue;
            }
            let dev = self
                .b
                .u32s
                .get_mut(&buffer)
                .ok_or(GpuError::Unsupported(format!("no buffer {buffer:?}")))?;
            let mut view = dev.slice_mut(0..host.len());
            self.stream
                .memcpy_htod(host, &mut view)
                .map_err(|e| GpuError::call("copying the batch up", e))?;
        }
        let shape = PassShape {
            rows: n,
            wanted: table.logit_rows.len(),
            greedy,
            row_bytes: kv.row_bytes,
            page_size: kv.page_size,
        };
        self.run_pass(shape, kv.ptr)?;
        Ok(table.logit_rows.len())
    }
}

impl Buffers {
    fn new(
        stream: &Arc<CudaStream>,
        model: &Model<'_>,
        cap: usize,
        pages: usize,
    ) -> Result<Buffers, GpuError> {
        let err = |e| GpuError::call("allocating activations", e);
        let mut b = Buffers {
            cap,
            f32s: HashMap::new(),
            u16s: HashMap::new(),
            u32s: HashMap::new(),
        };
        for (buf, elem) in gpu_plan::BUFFERS {
            let len = gpu_plan::buffer_len(model, buf, cap, pages);
            match elem {
                Elem::F32 => {
                    b.f32s.insert(buf, stream.alloc_zeros(len).map_err(err)?);
                }
                Elem::F16 => {
                    b.u16s.insert(buf, stream.alloc_zeros(len).map_err(err)?);
                }
                Elem::U32 => {
                    b.u32s.insert(buf, stream.alloc_zeros(len).map_err(err)?);
                }
            }
        }
        Ok(b)
    }

    fn f32(&self, b: Buffer) -> Result<&CudaSlice<f32>, GpuError> {
        self.f32s
            .get(&b)
            .ok_or_else(|| GpuError::Unsupported(format!("no buffer {b:?}")))
    }

    fn u32(&self, b: Buffer) -> Result<&CudaSlice<u32>, GpuError> {
        self.u32s
            .get(&b)
            .ok_or_else(|| GpuError::Unsupported(format!("no buffer {b:?}")))
    }
}
