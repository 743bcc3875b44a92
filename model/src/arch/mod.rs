//! The architectures: tensor names and hyperparameters mapped to a forward pass over KV
//! rows in den's pages.
//!
//! - `llama` (SmolLM2): RMSNorm → Q, K, V → RoPE (adjacent pairs, llama.cpp type 0, which
//!   the converter's Wq/Wk permutation expects) → GQA attention → Wo → residual; RMSNorm →
//!   SwiGLU FFN → residual. Tied embeddings when there is no `output.weight`.
//! - `gemma3`: embeddings × √n_embd; per-head RMSNorm of Q and K (`attn_q_norm`,
//!   `attn_k_norm`), RoPE NEOX (halves) with base `rope.freq_base` (10⁶) on global layers
//!   and 10⁴ on sliding-window layers (llama.cpp's default: not in the GGUF); queries ×
//!   1/√query_pre_attn_scalar (= 1/√head_dim); `post_attention_norm` and `post_ffw_norm`
//!   before each residual add; GeGLU (GELU-tanh) FFN; a window of
//!   `attention.sliding_window` on layers `l % 6 < 5`. Norm weights in the GGUF already
//!   include Gemma's `1 +`.
//!
//! [`Model::load`] checks every shape and type once; [`Runner`] holds the scratch, the
//! threads and the kernels and runs [`Runner::prefill`], [`Runner::decode`] and the
//! batched [`Runner::forward`], in which rows of several sequences share each weight pass.

mod config;
pub(crate) mod forward;

pub use config::{Arch, Config, LayerConfig};
pub use forward::{BatchRow, Runner, RunnerOptions};

use crate::ggml_type::GgmlType;
use crate::gguf::{GgufError, GgufFile, Tensor};
use crate::kv::{KvError, KvLayout, kv_fingerprint};
pub use crate::ops::matmul::{MatmulMode, Weight};
use crate::quant;

/// Why a model could not be loaded or run. One line.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The file is not a model den can run: `{file}: {msg}`.
    #[error("{file}: {msg}")]
    Load { file: String, msg: String },
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A call's arguments were wrong (token past the vocabulary, position past the
    /// context, empty prompt, …).
    #[error("{0}")]
    Input(String),
    /// A bug: a thread panicked or a checked tensor failed to decode.
    #[error("forward pass failed: {0}")]
    Internal(String),
}

/// One transformer block's tensors.
#[derive(Debug, Clone)]
pub(crate) struct Layer<'a> {
    pub attn_norm: Vec<f32>,
    pub wq: Weight<'a>,
    pub wk: Weight<'a>,
    pub wv: Weight<'a>,
    pub wo: Weight<'a>,
    pub q_norm: Vec<f32>,
    pub k_norm: Vec<f32>,
    pub post_attn_norm: Vec<f32>,
    pub ffn_norm: Vec<f32>,
    pub gate: Weight<'a>,
    pub up: Weight<'a>,
    pub down: Weight<'a>,
    pub post_ffn_norm: Vec<f32>,
}

/// A loaded model: hyperparameters, and weights that stay encoded in the file's bytes.
#[derive(Debug, Clone)]
pub struct Model<'a> {
    file: &'a GgufFile,
    config: Config,
    pub(crate) token_embd: Weight<'a>,
    pub(crate) output: Weight<'a>,
    pub(crate) output_norm: Vec<f32>,
    pub(crate) layers: Vec<Layer<'a>>,
}

/// Types a weight matrix may have (every type den dequantizes).
const MATMUL_TYPES: &str = "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q6_K";

struct Loader<'a> {
    file: &'a GgufFile,
}

impl<'a> Loader<'a> {
    fn err(&self, msg: String) -> ModelError {
        ModelError::Load {
            file: self.file.name().to_owned(),
            msg,
        }
    }

    fn tensor(&self, name: &str) -> Result<Tensor<'a>, ModelError> {
        Ok(self.file.tensor(name)?)
    }

    fn check_dims(&self, t: &Tensor<'a>, want: &[usize], what: &str) -> Result<(), ModelError> {
        let dims = t.dims();
        if dims.len() != want.len() || dims.iter().zip(want).any(|(d, w)| *d != *w as u64) {
            return Err(self.err(format!(
                "tensor {:?} has shape {dims:?}, expected {want:?} ({what})",
                t.name()
            )));
        }
        Ok(())
    }

    /// A matrix of `rows` rows of `cols`.
    fn weight(
        &self,
        name: &str,
        cols: usize,
        rows: usize,
        what: &str,
    ) -> Result<Weight<'a>, ModelError> {
        let t = self.tensor(name)?;
        self.check_dims(&t, &[cols, rows], what)?;
        self.matrix(t)
    }

    fn matrix(&self, t: Tensor<'a>) -> Result<Weight<'a>, ModelError> {
        let ty = t.ggml_type();
        if !ty.can_dequantize() {
            return Err(self.err(format!(
                "tensor {:?} is {ty}, which den-model cannot multiply (supported: {MATMUL_TYPES})",
                t.name()
            )));
        }
        let cols = t.ne0() as usize;
        let rows = t.rows() as usize;
        let row_bytes = quant::row_bytes(ty, cols as u64)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| self.err(format!("tensor {:?}: rows do not fit in memory", t.name())))?;
        if row_bytes.checked_mul(rows) != Some(t.data().len()) {
            return Err(self.err(format!(
                "tensor {:?}: {} bytes for {rows} rows of {row_bytes}",
                t.name(),
                t.data().len()
            )));
        }
        if ty != GgmlType::F32
            && ty != GgmlType::F16
            && ty != GgmlType::BF16
            && !cols.is_multiple_of(32)
        {
            return Err(self.err(format!(
                "tensor {:?}: rows of {cols} are not whole blocks of 32",
                t.name()
            )));
        }
        Ok(Weight {
            name: t.name(),
            ty,
            rows,
            cols,
            row_bytes,
            data: t.data(),
        })
    }

    fn vector(&self, name: &str, n: usize, what: &str) -> Result<Vec<f32>, ModelError> {
        let t = self.tensor(name)?;
        self.check_dims(&t, &[n], what)?;
        Ok(t.dequantize()?)
    }
}

impl<'a> Model<'a> {
    /// Maps `file`'s tensors to its architecture (`general.architecture`), checking every
    /// shape and type. Weights are not copied: a [`Weight`] is a slice of the file's map.
    pub fn load(file: &'a GgufFile) -> Result<Model<'a>, ModelError> {
        let l = Loader { file };
        // The architecture check comes first, so an unknown one is the error reported.
        let arch = file.get_str("general.architecture")?;
        if arch != "llama" && arch != "gemma3" {
            return Err(l.err(format!(
                "unknown architecture {arch:?} (den-model runs llama and gemma3)"
            )));
        }
        let embd = l.tensor("token_embd.weight")?;
        if embd.dims().len() != 2 {
            return Err(l.err(format!(
                "tensor \"token_embd.weight\" has shape {:?}, expected [embedding_length, vocabulary]",
                embd.dims()
            )));
        }
        let vocab = embd.rows() as usize;
        let c = Config::from_gguf(file, vocab)?;
        let token_embd = l.weight(
            "token_embd.weight",
            c.n_embd,
            vocab,
            "embedding_length × vocabulary",
        )?;
        let output = match file.tensor_info("output.weight") {
            Some(_) => l.weight(
                "output.weight",
                c.n_embd,
                vocab,
                "embedding_length × vocabulary",
            )?,
            None => token_embd,
        };
        let output_norm = l.vector("output_norm.weight", c.n_embd, "embedding_length")?;
        let qd = c.n_head * c.head_dim;
        let kvd = c.n_head_kv * c.head_dim;
        let mut layers = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let n = |s: &str| format!("blk.{i}.{s}.weight");
            let e = c.n_embd;
            let gemma = c.arch == Arch::Gemma3;
            let opt_vec = |name: &str, len: usize, what: &str| {
                if gemma {
                    l.vector(&n(name), len, what)
                } else {
                    Ok(Vec::new())
                }
            };
            layers.push(Layer {
                attn_norm: l.vector(&n("attn_norm"), e, "embedding_length")?,
                wq: l.weight(
                    &n("attn_q"),
                    e,
                    qd,
                    "embedding_length × head_count·head_dim",
                )?,
                wk: l.weight(
                    &n("attn_k"),
                    e,
                    kvd,
                    "embedding_length × head_count_kv·head_dim",
                )?,
                wv: l.weight(
                    &n("attn_v"),
                    e,
                    kvd,
                    "embedding_length × head_count_kv·head_dim",
                )?,
                wo: l.weight(
                    &n("attn_output"),
                    qd,
                    e,
                    "head_count·head_dim × embedding_length",
                )?,
                q_norm: opt_vec("attn_q_norm", c.head_dim, "key_length")?,
                k_norm: opt_vec("attn_k_norm", c.head_dim, "key_length")?,
                post_attn_norm: opt_vec("post_attention_norm", e, "embedding_length")?,
                ffn_norm: l.vector(&n("ffn_norm"), e, "embedding_length")?,
                gate: l.weight(
                    &n("ffn_gate"),
                    e,
                    c.n_ff,
                    "embedding_length × feed_forward_length",
                )?,
                up: l.weight(
                    &n("ffn_up"),
                    e,
                    c.n_ff,
                    "embedding_length × feed_forward_length",
                )?,
                down: l.weight(
                    &n("ffn_down"),
                    c.n_ff,
                    e,
                    "feed_forward_length × embedding_length",
                )?,
                post_ffn_norm: opt_vec("post_ffw_norm", e, "embedding_length")?,
            });
        }
        Ok(Model {
            file,
            config: c,
            token_embd,
            output,
            output_norm,
            layers,
        })
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The file the weights are in.
    pub fn file(&self) -> &'a GgufFile {
        self.file
    }

    /// The KV row this model writes: see [`crate::kv`].
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout {
            layers: self.config.n_layers as u32,
            kv_heads: self.config.n_head_kv as u32,
            head_dim: self.config.head_dim as u32,
        }
    }

    /// What this model's KV bytes depend on: the weights digest with the KV dtype and row
    /// layout ([`kv_fingerprint`]). Hashes every tensor (about a second per GB).
    pub fn fingerprint(&self) -> [u8; 32] {
        kv_fingerprint(&crate::weights_digest(self.file), &self.kv_layout())
    }

    /// Vocabulary size (rows of the embedding).
    pub fn vocab(&self) -> usize {
        self.config.vocab
    }

    /// Whether the output projection is the embedding (tied).
    pub fn tied_embeddings(&self) -> bool {
        std::ptr::eq(self.output.data, self.token_embd.data)
    }
}
