//! The GPU forward pass as data: every kernel launch and matrix product of one pass, in
//! order, over named buffers ([`Buffer`]) instead of device addresses.
//!
//! Why data: the CUDA runner (`gpu::runner`, feature `cuda`) resolves a plan once per batch
//! shape, runs it, and captures it as a CUDA graph (one graph launch instead of hundreds of
//! kernel launches a step); and a machine without a GPU runs the *same* plan through the
//! CPU emulator of the kernels (`tests/it/gpu_emulated.rs`), so the order of the pass, its
//! buffers, strides and arguments are tested where no GPU is lent, not only each kernel.
//! Nothing here needs cudarc.
//!
//! A pass over `rows` rows: the embedding, then per layer the stacked Q/K/V product → per
//! head norm and RoPE with K and V written into the pages → paged attention → output
//! product → residual and FFN norm → the stacked gate/up product → activation → down
//! product → residual and the next layer's norm; then the rows that want logits normed
//! (gathered) and projected, and with `greedy` their argmax. 9 launches a layer.

use std::collections::HashMap;

use crate::arch::{Arch, BatchRow, Config, Layer, Model, ModelError};
use crate::kv::Sequence;
use crate::ops::math::{Activation, RopeStyle};

mod host;
pub use host::{HostData, HostTensor, WeightError, host_tensors};

/// Threads per block of the row kernels.
pub const BLOCK: u32 = 256;
/// Threads per block of attention (a head of up to 4 × this many dims).
pub const ATTENTION_BLOCK: u32 = 128;
/// Threads per block of the per-head kernel.
pub const HEAD_BLOCK: u32 = 128;
/// Threads per block of the argmax (its shared arrays).
pub const ARGMAX_BLOCK: u32 = 256;
/// The widest head the kernels take (their shared buffers).
pub const MAX_HEAD_DIM: usize = 512;

/// A weight tensor on the device. Products reading the same input are stacked (Q, K and
/// V; gate and up), so each is one product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tensor {
    TokenEmbd,
    /// The output projection when it is not tied to the embedding.
    Output,
    OutputNorm,
    AttnNorm(usize),
    /// Q's rows, then K's, then V's.
    Wqkv(usize),
    QNorm(usize),
    KNorm(usize),
    Wo(usize),
    PostAttnNorm(usize),
    FfnNorm(usize),
    /// The gate's rows, then up's.
    GateUp(usize),
    Down(usize),
    PostFfnNorm(usize),
}

/// A device buffer a plan reads or writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buffer {
    /// The residual stream, f32, `n_embd` a row.
    X,
    /// Each row's Q, K and V, f32.
    Qkv,
    /// A sublayer's output before the residual, f32, `n_embd` a row.
    O,
    /// Each row's gate and up, f32.
    Gu,
    /// f16 inputs of the products: normed rows, attention output, FFN activation.
    H16,
    Att16,
    Ff16,
    Logits,
    Tokens,
    Pos,
    RowSeq,
    LogitRows,
    PtOff,
    Pages,
    Argmax,
    /// The page arena K and V live in.
    Arena,
    Weight(Tensor),
}

/// A kernel argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    Ptr(Buffer),
    /// A null pointer (an absent optional tensor).
    Null,
    I32(i32),
    U64(u64),
    F32(f32),
}

/// A kernel of `kernels.cu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kernel {
    Embed,
    RmsNormH,
    QkRopeAppend,
    Attention,
    AddNormH,
    Glu,
    Argmax,
}

impl Kernel {
    /// Every kernel a plan launches.
    pub const ALL: [Kernel; 7] = [
        Kernel::Embed,
        Kernel::RmsNormH,
        Kernel::QkRopeAppend,
        Kernel::Attention,
        Kernel::AddNormH,
        Kernel::Glu,
        Kernel::Argmax,
    ];

    /// The kernel's entry point in `kernels.cu`.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Embed => "den_embed",
            Kernel::RmsNormH => "den_rms_norm_h",
            Kernel::QkRopeAppend => "den_qk_rope_append",
            Kernel::Attention => "den_attention",
            Kernel::AddNormH => "den_add_norm_h",
            Kernel::Glu => "den_glu",
            Kernel::Argmax => "den_argmax",
        }
    }
}

/// One step of a pass.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `kernel` over a `grid` of 1-D blocks of `block` threads.
    Launch {
        kernel: Kernel,
        grid: (u32, u32),
        block: u32,
        args: Vec<Arg>,
    },
    /// `out[rows × weight.rows] (f32) = input[rows × weight.cols] (f16) · weightᵀ`.
    Gemm {
        input: Buffer,
        weight: Tensor,
        out: Buffer,
        rows: u32,
        /// The weight's rows (outputs) and columns (inputs).
        m: u32,
        k: u32,
    },
}

/// What a pass is for: its row count, how many rows want logits, whether the argmax is
/// taken on the device, and the arena's geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PassShape {
    pub rows: usize,
    pub wanted: usize,
    pub greedy: bool,
    pub row_bytes: u64,
    pub page_size: u32,
}

/// What a scratch buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    F32,
    /// f16 bits.
    F16,
    U32,
}

impl Elem {
    pub fn bytes(self) -> usize {
        match self {
            Elem::F32 | Elem::U32 => 4,
            Elem::F16 => 2,
        }
    }
}

/// Every scratch buffer a plan names (the arena and the weights aside), with what it
/// holds: the runner allocates them, the emulator mirrors them.
pub const BUFFERS: [(Buffer, Elem); 15] = [
    (Buffer::X, Elem::F32),
    (Buffer::Qkv, Elem::F32),
    (Buffer::O, Elem::F32),
    (Buffer::Gu, Elem::F32),
    (Buffer::Logits, Elem::F32),
    (Buffer::H16, Elem::F16),
    (Buffer::Att16, Elem::F16),
    (Buffer::Ff16, Elem::F16),
    (Buffer::Tokens, Elem::U32),
    (Buffer::Pos, Elem::U32),
    (Buffer::RowSeq, Elem::U32),
    (Buffer::LogitRows, Elem::U32),
    (Buffer::PtOff, Elem::U32),
    (Buffer::Pages, Elem::U32),
    (Buffer::Argmax, Elem::U32),
];

/// Elements of scratch buffer `b` for batches of up to `cap` rows whose page tables
/// total up to `pages` entries (at least one, for an empty allocation).
pub fn buffer_len(model: &Model<'_>, b: Buffer, cap: usize, pages: usize) -> usize {
    let c = model.config();
    let qd = c.n_head * c.head_dim;
    let kvd = c.n_head_kv * c.head_dim;
    let widest = c.n_embd.max(qd).max(c.n_ff);
    let len = match b {
        Buffer::X | Buffer::O => cap * c.n_embd,
        Buffer::Qkv => cap * (qd + 2 * kvd),
        Buffer::Gu => cap * 2 * c.n_ff,
        Buffer::H16 => cap * widest,
        Buffer::Att16 => cap * qd,
        Buffer::Ff16 => cap * c.n_ff,
        Buffer::Logits => cap * c.vocab,
        Buffer::PtOff => cap + 1,
        Buffer::Tokens | Buffer::Pos | Buffer::RowSeq | Buffer::LogitRows | Buffer::Argmax => cap,
        Buffer::Pages => pages.max(cap),
        Buffer::Arena | Buffer::Weight(_) => 0,
    };
    len.max(1)
}

/// Which optional tensors a layer has on the device: the plan names exactly these and
/// [`host_tensors`] prepares exactly these.
struct Optional {
    qk_norm: bool,
    post_attn: bool,
    post_ffn: bool,
}

impl Optional {
    fn of(c: &Config, l: &Layer<'_>) -> Optional {
        Optional {
            qk_norm: c.qk_norm && !l.q_norm.is_empty() && !l.k_norm.is_empty(),
            post_attn: c.post_norms && !l.post_attn_norm.is_empty(),
            post_ffn: c.post_norms && !l.post_ffn_norm.is_empty(),
        }
    }
}

/// The pass for `shape` over `model`.
pub fn plan(model: &Model<'_>, shape: PassShape) -> Vec<Step> {
    let c = model.config();
    let n = shape.rows as u32;
    let mut steps = Vec::with_capacity(model.layers.len() * 9 + 4);
    if n == 0 {
        return steps;
    }
    let (e, hd) = (c.n_embd as i32, c.head_dim as i32);
    let qd = c.n_head * c.head_dim;
    let kvd = c.n_head_kv * c.head_dim;
    let eps = c.eps;
    let launch = |kernel, grid, block, args: Vec<Arg>| Step::Launch {
        kernel,
        grid,
        block,
        args,
    };
    let gemm = |input, weight, out, rows: u32, m: usize, k: usize| Step::Gemm {
        input,
        weight,
        out,
        rows,
        m: m as u32,
        k: k as u32,
    };
    let w = |t| Arg::Ptr(Buffer::Weight(t));
    let p = Arg::Ptr;
    let scale = if c.arch == Arch::Gemma3 {
        c.embd_scale
    } else {
        1.0
    };
    steps.push(launch(
        Kernel::Embed,
        (n, 1),
        BLOCK,
        vec![
            w(Tensor::TokenEmbd),
            p(Buffer::Tokens),
            p(Buffer::X),
            Arg::I32(e),
            Arg::F32(scale),
        ],
    ));
    // `rows` rows of X (through `gather` when it names a row table) normed by `t` into
    // H16's first rows, the next product's input.
    let norm_rows = |rows: u32, t, gather: Arg| {
        launch(
            Kernel::RmsNormH,
            (rows, 1),
            BLOCK,
            vec![
                p(Buffer::X),
                w(t),
                p(Buffer::H16),
                gather,
                Arg::I32(e),
                Arg::F32(eps),
            ],
        )
    };
    let optional = |present: bool, t| if present { w(t) } else { Arg::Null };
    let add_norm = |post: Arg, next: Arg| {
        launch(
            Kernel::AddNormH,
            (n, 1),
            BLOCK,
            vec![
                p(Buffer::X),
                p(Buffer::O),
                post,
                next,
                p(Buffer::H16),
                Arg::I32(e),
                Arg::F32(eps),
            ],
        )
    };
    let arena = [
        p(Buffer::Arena),
        p(Buffer::RowSeq),
        p(Buffer::PtOff),
        p(Buffer::Pages),
    ];
    let qkv_stride = (qd + 2 * kvd) as i32;
    let layout = model.kv_layout();
    let last = model.layers.len().saturating_sub(1);
    if !model.layers.is_empty() {
        steps.push(norm_rows(n, Tensor::AttnNorm(0), Arg::Null));
    }
    for (li, (layer, lc)) in model.layers.iter().zip(&c.layers).enumerate() {
        steps.push(gemm(
            Buffer::H16,
            Tensor::Wqkv(li),
            Buffer::Qkv,
            n,
            qd + 2 * kvd,
            c.n_embd,
        ));
        let has = Optional::of(c, layer);
        let qk_norm = has.qk_norm;
        let (k_off, v_off) = (layout.k_offset(li) as u64, layout.v_offset(li) as u64);
        let mut args = vec![
            p(Buffer::Qkv),
            Arg::I32(qkv_stride),
            optional(qk_norm, Tensor::QNorm(li)),
            optional(qk_norm, Tensor::KNorm(li)),
            p(Buffer::Pos),
            Arg::I32(c.n_head as i32),
            Arg::I32(c.n_head_kv as i32),
            Arg::I32(hd),
            Arg::I32(c.n_rot as i32),
            Arg::I32(i32::from(c.rope_style == RopeStyle::Neox)),
            Arg::F32(lc.rope_base),
            Arg::F32(lc.rope_scale),
            Arg::F32(c.attn_scale),
            Arg::I32(i32::from(qk_norm)),
            Arg::F32(eps),
        ];
        args.extend(arena);
        args.extend([
            Arg::U64(shape.row_bytes),
            Arg::I32(shape.page_size as i32),
            Arg::U64(k_off),
            Arg::U64(v_off),
        ]);
        steps.push(launch(
            Kernel::QkRopeAppend,
            (n, (c.n_head + c.n_head_kv) as u32),
            HEAD_BLOCK,
            args,
        ));
        // The last layer's attention and FFN only feed logits.
        if li == last && shape.wanted == 0 {
            break;
        }
        let window = lc.window.map_or(0, |w| w.min(i32::MAX as u32) as i32);
        let args = vec![
            p(Buffer::Qkv),
            Arg::I32(qkv_stride),
            p(Buffer::Att16),
            p(Buffer::Arena),
            p(Buffer::RowSeq),
            p(Buffer::Pos),
            p(Buffer::PtOff),
            p(Buffer::Pages),
            Arg::I32(c.n_head as i32),
            Arg::I32(c.n_head_kv as i32),
            Arg::I32(hd),
            Arg::U64(shape.row_bytes),
            Arg::I32(shape.page_size as i32),
            Arg::U64(k_off),
            Arg::U64(v_off),
            Arg::I32(window),
        ];
        steps.push(launch(
            Kernel::Attention,
            (n, c.n_head as u32),
            ATTENTION_BLOCK,
            args,
        ));
        steps.push(gemm(
            Buffer::Att16,
            Tensor::Wo(li),
            Buffer::O,
            n,
            c.n_embd,
            qd,
        ));
        steps.push(add_norm(
            optional(has.post_attn, Tensor::PostAttnNorm(li)),
            w(Tensor::FfnNorm(li)),
        ));
        steps.push(gemm(
            Buffer::H16,
            Tensor::GateUp(li),
            Buffer::Gu,
            n,
            2 * c.n_ff,
            c.n_embd,
        ));
        let elements = u64::from(n) * c.n_ff as u64;
        steps.push(launch(
            Kernel::Glu,
            (elements.div_ceil(u64::from(BLOCK)) as u32, 1),
            BLOCK,
            vec![
                p(Buffer::Gu),
                p(Buffer::Ff16),
                Arg::U64(elements),
                Arg::I32(c.n_ff as i32),
                Arg::I32(i32::from(c.activation == Activation::GeluTanh)),
            ],
        ));
        steps.push(gemm(
            Buffer::Ff16,
            Tensor::Down(li),
            Buffer::O,
            n,
            c.n_embd,
            c.n_ff,
        ));
        let next = if li < last {
            w(Tensor::AttnNorm(li + 1))
        } else {
            Arg::Null
        };
        steps.push(add_norm(
            optional(has.post_ffn, Tensor::PostFfnNorm(li)),
            next,
        ));
    }
    let wanted = shape.wanted as u32;
    if wanted == 0 {
        return steps;
    }
    // The rows that want logits, normed into H16's first rows, then projected.
    steps.push(norm_rows(wanted, Tensor::OutputNorm, p(Buffer::LogitRows)));
    let output = if model.tied_embeddings() {
        Tensor::TokenEmbd
    } else {
        Tensor::Output
    };
    steps.push(gemm(
        Buffer::H16,
        output,
        Buffer::Logits,
        wanted,
        c.vocab,
        c.n_embd,
    ));
    if shape.greedy {
        steps.push(launch(
            Kernel::Argmax,
            (wanted, 1),
            ARGMAX_BLOCK,
            vec![
                p(Buffer::Logits),
                p(Buffer::Argmax),
                Arg::I32(c.vocab as i32),
            ],
        ));
    }
    steps
}

/// A batch's rows as the kernels index them: each sequence's page table once.
pub struct BatchTable {
    pub tokens: Vec<u32>,
    pub pos: Vec<u32>,
    /// Each row's sequence, an index into `pt_off`.
    pub row_seq: Vec<u32>,
    /// Where each sequence's page table starts in `pages` (and one past the last).
    pub pt_off: Vec<u32>,
    pub pages: Vec<u32>,
    /// The rows that want logits.
    pub logit_rows: Vec<u32>,
}

impl BatchTable {
    /// Each table with the buffer it is copied into before a pass.
    pub fn uploads(&self) -> [(Buffer, &[u32]); 6] {
        [
            (Buffer::Tokens, &self.tokens),
            (Buffer::Pos, &self.pos),
            (Buffer::RowSeq, &self.row_seq),
            (Buffer::PtOff, &self.pt_off),
            (Buffer::Pages, &self.pages),
            (Buffer::LogitRows, &self.logit_rows),
        ]
    }

    /// `rows`' table, every page below `arena_pages`.
    pub fn of(rows: &[BatchRow<'_>], arena_pages: u64) -> Result<BatchTable, ModelError> {
        let n = rows.len();
        let mut seq_index: HashMap<*const Sequence, u32> = HashMap::new();
        let mut pt_off: Vec<u32> = Vec::new();
        let mut pages: Vec<u32> = Vec::new();
        let mut row_seq = Vec::with_capacity(n);
        for r in rows {
            let key: *const Sequence = r.seq;
            let i = match seq_index.get(&key) {
                Some(i) => *i,
                None => {
                    let i = pt_off.len() as u32;
                    pt_off.push(pages.len() as u32);
                    if let Some(p) = r.seq.pages().iter().find(|p| u64::from(**p) >= arena_pages) {
                        return Err(ModelError::Input(format!(
                            "page {p} is past the device arena ({arena_pages} pages)"
                        )));
                    }
                    pages.extend_from_slice(r.seq.pages());
                    seq_index.insert(key, i);
                    i
                }
            };
            row_seq.push(i);
        }
        pt_off.push(pages.len() as u32);
        Ok(BatchTable {
            tokens: rows.iter().map(|r| r.token).collect(),
            pos: rows.iter().map(|r| r.pos).collect(),
            row_seq,
            pt_off,
            pages,
            logit_rows: (0..n as u32).filter(|i| rows[*i as usize].logits).collect(),
        })
    }
}
