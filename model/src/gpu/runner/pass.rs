//! A pass resolved to device addresses for one batch shape and arena, launched step by
//! step or captured once as a CUDA graph and replayed; cuBLAS's products and the kernel
//! launches it is made of.

use super::*;

/// A kernel argument resolved to its value.
#[derive(Debug, Clone, Copy)]
pub(super) enum Value {
    U64(u64),
    I32(i32),
    F32(f32),
}

/// A step resolved to device addresses.
#[derive(Debug)]
pub(super) enum Resolved {
    Launch {
        kernel: Kernel,
        cfg: LaunchConfig,
        args: Vec<Value>,
    },
    Gemm {
        input: u64,
        weight: u64,
        out: u64,
        rows: i32,
        m: i32,
        k: i32,
    },
}

/// A pass resolved for one shape and arena, and its graph once captured.
pub(super) struct Pass {
    pub(super) steps: Vec<Resolved>,
    pub(super) graph: Option<CudaGraph>,
    /// Times the shape has run: it is captured when it comes back, so a one-off shape (a
    /// prefill chunk of an odd size) pays no capture.
    pub(super) runs: u32,
}

impl<'m, 'a> GpuRunner<'m, 'a> {
    /// Runs the pass for `shape` on the arena at `arena`: its graph if captured, else
    /// captured now (graphs on), else launched step by step.
    pub(super) fn run_pass(&mut self, shape: PassShape, arena: u64) -> Result<(), GpuError> {
        let key = (shape, arena);
        if !self.passes.contains_key(&key) {
            if self.passes.len() >= MAX_PASSES {
                self.passes.clear();
            }
            let steps = gpu_plan::plan(self.model, shape)
                .iter()
                .map(|s| self.resolve(s, arena))
                .collect::<Result<Vec<_>, _>>()?;
            self.passes.insert(
                key,
                Pass {
                    steps,
                    graph: None,
                    runs: 0,
                },
            );
        }
        if let Some(pass) = self.passes.get_mut(&key) {
            pass.runs = pass.runs.saturating_add(1);
        }
        let Some(pass) = self.passes.get(&key) else {
            return Err(GpuError::Unsupported("a resolved pass went missing".into()));
        };
        if let Some(graph) = &pass.graph {
            return graph
                .launch()
                .map_err(|e| GpuError::call("replaying the pass's CUDA graph", e));
        }
        if self.graphs != Graphs::On || pass.runs < 2 {
            return self.execute(&pass.steps);
        }
        match self.capture(&pass.steps) {
            Ok(graph) => {
                let launched = graph
                    .launch()
                    .map_err(|e| GpuError::call("replaying the pass's CUDA graph", e));
                if let Some(pass) = self.passes.get_mut(&key) {
                    pass.graph = Some(graph);
                }
                launched
            }
            Err(e) => {
                // Launch eagerly from now on; the reason stays visible in `graphs()`.
                self.graphs = Graphs::Failed(e.to_string());
                let Some(pass) = self.passes.get(&key) else {
                    return Err(GpuError::Unsupported("a resolved pass went missing".into()));
                };
                self.execute(&pass.steps)
            }
        }
    }

    /// `steps` captured into a graph (not run).
    fn capture(&self, steps: &[Resolved]) -> Result<CudaGraph, GpuError> {
        self.stream
            .begin_capture(driver_sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| GpuError::call("starting a CUDA graph capture", e))?;
        let recorded = self.execute(steps);
        // End the capture whatever happened, so the stream leaves capture mode.
        let ended = self
            .stream
            .end_capture(driver_sys::CUgraphInstantiate_flags(0));
        recorded?;
        match ended {
            Ok(Some(graph)) => Ok(graph),
            Ok(None) => Err(GpuError::Unsupported(
                "the CUDA graph capture came back empty".into(),
            )),
            Err(e) => Err(GpuError::call("instantiating the pass's CUDA graph", e)),
        }
    }

    /// Launches `steps` on the stream.
    fn execute(&self, steps: &[Resolved]) -> Result<(), GpuError> {
        for step in steps {
            match step {
                Resolved::Launch { kernel, cfg, args } => {
                    let l = self.stream.launch_builder(self.k.get(*kernel)?);
                    launch_with(l, *cfg, args, kernel.name())?;
                }
                Resolved::Gemm {
                    input,
                    weight,
                    out,
                    rows,
                    m,
                    k,
                } => self.gemm(*input, *weight, *out, *rows, *m, *k)?,
            }
        }
        Ok(())
    }

    /// Every buffer's and weight's device address, after (re)allocation.
    pub(super) fn resolve_addresses(&mut self) {
        let s = &self.stream;
        let mut a = HashMap::new();
        for (b, slice) in &self.b.f32s {
            a.insert(*b, dptr(slice, s));
        }
        for (b, slice) in &self.b.u16s {
            a.insert(*b, dptr(slice, s));
        }
        for (b, slice) in &self.b.u32s {
            a.insert(*b, dptr(slice, s));
        }
        for (t, p) in self.w.addresses(s) {
            a.insert(Buffer::Weight(t), p);
        }
        self.addresses = a;
    }

    fn address(&self, b: Buffer, arena: u64) -> Result<u64, GpuError> {
        if b == Buffer::Arena {
            return Ok(arena);
        }
        self.addresses.get(&b).copied().ok_or_else(|| {
            GpuError::Unsupported(format!("the pass names {b:?}, not on the device"))
        })
    }

    fn resolve(&self, step: &Step, arena: u64) -> Result<Resolved, GpuError> {
        Ok(match step {
            Step::Launch {
                kernel,
                grid: g,
                block,
                args,
            } => Resolved::Launch {
                kernel: *kernel,
                cfg: grid(*g, *block),
                args: args
                    .iter()
                    .map(|a| {
                        Ok(match a {
                            Arg::Ptr(b) => Value::U64(self.address(*b, arena)?),
                            Arg::Null => Value::U64(0),
                            Arg::I32(v) => Value::I32(*v),
                            Arg::U64(v) => Value::U64(*v),
                            Arg::F32(v) => Value::F32(*v),
                        })
                    })
                    .collect::<Result<_, GpuError>>()?,
            },
            Step::Gemm {
                input,
                weight,
                out,
                rows,
                m,
                k,
            } => Resolved::Gemm {
                input: self.address(*input, arena)?,
                weight: self.address(Buffer::Weight(*weight), arena)?,
                out: self.address(*out, arena)?,
                rows: *rows as i32,
                m: *m as i32,
                k: *k as i32,
            },
        })
    }

    /// `out[n × m] (f32) = input[n × k] (f16) · wᵀ` for a `m × k` weight: in cuBLAS's
    /// column-major terms `outᵀ = op(W) · inputᵀ` with W read transposed.
    fn gemm(
        &self,
        input: u64,
        weights: u64,
        out: u64,
        n: i32,
        m: i32,
        k: i32,
    ) -> Result<(), GpuError> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        // SAFETY: `weights` holds m × k f16, `input` at least n × k f16 and `out` at least
        // n × m f32 (the plan names buffers sized for the batch and the model); the handle
        // runs on this runner's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                (&alpha) as *const f32 as *const _,
                weights as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                k,
                input as *const _,
                blas_sys::cudaDataType_t::CUDA_R_16F,
                k,
                (&beta) as *const f32 as *const _,
                out as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| GpuError::call(&format!("cuBLAS GemmEx ({m} × {k} by {n} rows)"), e))
    }
}

pub(super) fn dptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

/// `x × y` blocks of `threads` threads.
pub(super) fn grid((x, y): (u32, u32), threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (x, y, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches with `args` pushed in order.
pub(super) fn launch_with<'a>(
    mut l: cudarc::driver::LaunchArgs<'a>,
    cfg: LaunchConfig,
    args: &'a [Value],
    what: &str,
) -> Result<(), GpuError> {
    for a in args {
        match a {
            Value::U64(v) => l.arg(v),
            Value::I32(v) => l.arg(v),
            Value::F32(v) => l.arg(v),
        };
    }
    // SAFETY: the plan (`gpu_plan::plan`) pushes exactly each kernel's parameters, in
    // order and of the kernel's types (pointers as u64 device addresses, ints as i32,
    // sizes as u64), every buffer sized for the batch it launches over; the emulated
    // tests run the same plan against the kernels' signatures.
    unsafe { l.launch(cfg) }.map_err(|e| GpuError::call(&format!("launching {what}"), e))?;
    Ok(())
}
