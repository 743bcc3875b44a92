//! Hyperparameters from GGUF metadata, per architecture.

use super::ModelError;
use crate::gguf::{Array, GgufFile, Value};
use crate::ops::math::{Activation, RopeStyle};

/// The architectures den runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// `llama` (SmolLM2 and other Llama-shaped models).
    Llama,
    /// `gemma3`.
    Gemma3,
}

impl Arch {
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }
}

/// One layer's attention variant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerConfig {
    /// Sliding window (keys with `t - pos >= window` masked), or global.
    pub window: Option<u32>,
    pub rope_base: f32,
    /// Positions are multiplied by this (1 / linear rope-scaling factor).
    pub rope_scale: f32,
}

/// Everything the forward pass needs besides the tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub arch: Arch,
    pub n_layers: usize,
    pub n_embd: usize,
    pub n_ff: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Dimensions of each head that RoPE rotates (`rope.dimension_count`, default all).
    pub n_rot: usize,
    pub vocab: usize,
    pub context_length: u32,
    pub eps: f32,
    pub rope_style: RopeStyle,
    /// Multiplies the queries before `q · k`.
    pub attn_scale: f32,
    /// Multiplies the token embeddings (Gemma: √n_embd).
    pub embd_scale: f32,
    pub activation: Activation,
    /// Gemma: RMSNorm of each query and key head (attn_q_norm, attn_k_norm).
    pub qk_norm: bool,
    /// Gemma: RMSNorm of the attention and FFN outputs before the residual adds.
    pub post_norms: bool,
    pub layers: Vec<LayerConfig>,
}

fn load_err(file: &GgufFile, msg: impl Into<String>) -> ModelError {
    ModelError::Load {
        file: file.name().to_owned(),
        msg: msg.into(),
    }
}

fn opt_u32(file: &GgufFile, key: &str) -> Result<Option<u32>, ModelError> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(file.get_u32(key)?)),
    }
}

fn opt_f32(file: &GgufFile, key: &str) -> Result<Option<f32>, ModelError> {
    match file.get(key) {
        None => Ok(None),
        Some(_) => Ok(Some(file.get_f32(key)?)),
    }
}

fn positive(file: &GgufFile, key: &str, v: u32) -> Result<usize, ModelError> {
    if v == 0 {
        return Err(load_err(file, format!("metadata {key:?} is 0")));
    }
    Ok(v as usize)
}

impl Config {
    /// Reads the hyperparameters of `file`'s `general.architecture`; `vocab` comes from
    /// the embedding tensor. Missing keys and impossible values are one-line errors.
    pub fn from_gguf(file: &GgufFile, vocab: usize) -> Result<Config, ModelError> {
        let arch_name = file.get_str("general.architecture")?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "gemma3" => Arch::Gemma3,
            other => {
                return Err(load_err(
                    file,
                    format!("unknown architecture {other:?} (den-model runs llama and gemma3)"),
                ));
            }
        };
        let a = arch.name();
        let key = |k: &str| format!("{a}.{k}");
        let req = |k: &str| -> Result<usize, ModelError> {
            let name = key(k);
            let v = file.get_u32(&name)?;
            positive(file, &name, v)
        };
        let n_layers = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_ff = req("feed_forward_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = match opt_u32(file, &key("attention.head_count_kv"))? {
            Some(v) => positive(file, &key("attention.head_count_kv"), v)?,
            None => n_head,
        };
        if !n_head.is_multiple_of(n_head_kv) {
            return Err(load_err(
                file,
                format!(
                    "{n_head} attention heads are not a multiple of {n_head_kv} KV heads ({})",
                    key("attention.head_count_kv")
                ),
            ));
        }
        let eps = file.get_f32(&key("attention.layer_norm_rms_epsilon"))?;
        let context_length = file.get_u32(&key("context_length"))?;
        if context_length == 0 {
            return Err(load_err(
                file,
                format!("metadata {:?} is 0", key("context_length")),
            ));
        }
        let head_dim = match opt_u32(file, &key("attention.key_length"))? {
            Some(v) => positive(file, &key("attention.key_length"), v)?,
            None if n_embd.is_multiple_of(n_head) => n_embd / n_head,
            None => {
                return Err(load_err(
                    file,
                    format!(
                        "{} is missing and embedding_length {n_embd} is not a multiple of head_count {n_head}",
                        key("attention.key_length")
                    ),
                ));
            }
        };
        if let Some(v) = opt_u32(file, &key("attention.value_length"))?
            && v as usize != head_dim
        {
            return Err(load_err(
                file,
                format!(
                    "{} = {v} differs from the key length {head_dim}: den's KV rows need equal K and V heads",
                    key("attention.value_length")
                ),
            ));
        }
        let n_rot = match opt_u32(file, &key("rope.dimension_count"))? {
            Some(v) => v as usize,
            None => head_dim,
        };
        if n_rot == 0 || n_rot > head_dim || !n_rot.is_multiple_of(2) {
            return Err(load_err(
                file,
                format!(
                    "{} = {n_rot} must be even and at most the head size {head_dim}",
                    key("rope.dimension_count")
                ),
            ));
        }
        let default_base = match arch {
            Arch::Llama => 10_000.0,
            Arch::Gemma3 => 1_000_000.0,
        };
        let rope_base = opt_f32(file, &key("rope.freq_base"))?.unwrap_or(default_base);
        let rope_scale = match file.get(&key("rope.scaling.type")) {
            None => 1.0,
            Some(_) => match file.get_str(&key("rope.scaling.type"))? {
                "none" => 1.0,
                "linear" => {
                    let f = file.get_f32(&key("rope.scaling.factor"))?;
                    if f.is_nan() || f <= 0.0 {
                        return Err(load_err(
                            file,
                            format!("{} = {f} must be positive", key("rope.scaling.factor")),
                        ));
                    }
                    1.0 / f
                }
                other => {
                    return Err(load_err(
                        file,
                        format!(
                            "rope scaling {other:?} ({}) is not supported (only none and linear)",
                            key("rope.scaling.type")
                        ),
                    ));
                }
            },
        };
        let global = LayerConfig {
            window: None,
            rope_base,
            rope_scale,
        };
        let (layers, rope_style, attn_scale, embd_scale, activation, gemma) = match arch {
            Arch::Llama => {
                if let Some(w) = opt_u32(file, &key("attention.sliding_window"))?
                    && w > 0
                {
                    return Err(load_err(
                        file,
                        format!("llama with a sliding window ({w}) is not supported"),
                    ));
                }
                (
                    vec![global; n_layers],
                    RopeStyle::Norm,
                    1.0 / (head_dim as f32).sqrt(),
                    1.0,
                    Activation::Silu,
                    false,
                )
            }
            Arch::Gemma3 => {
                let window = file.get_u32(&key("attention.sliding_window"))?;
                if window == 0 {
                    return Err(load_err(
                        file,
                        format!("metadata {:?} is 0", key("attention.sliding_window")),
                    ));
                }
                let local_base = opt_f32(file, &key("rope.freq_base_swa"))?.unwrap_or(10_000.0);
                let local = LayerConfig {
                    window: Some(window),
                    rope_base: local_base,
                    rope_scale: 1.0,
                };
                let swa = swa_layers(file, &key("attention.sliding_window_pattern"), n_layers)?;
                let layers = swa
                    .iter()
                    .map(|s| if *s { local } else { global })
                    .collect();
                // llama.cpp: 1/√(n_embd/n_head) for the 27B (62 layers), 1/√head_dim otherwise
                // (query_pre_attn_scalar).
                let scalar = if n_layers == 62 {
                    (n_embd / n_head) as f32
                } else {
                    head_dim as f32
                };
                (
                    layers,
                    RopeStyle::Neox,
                    1.0 / scalar.sqrt(),
                    (n_embd as f32).sqrt(),
                    Activation::GeluTanh,
                    true,
                )
            }
        };
        Ok(Config {
            arch,
            n_layers,
            n_embd,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            n_rot,
            vocab,
            context_length,
            eps,
            rope_style,
            attn_scale,
            embd_scale,
            activation,
            qk_norm: gemma,
            post_norms: gemma,
            layers,
        })
    }
}

/// Which layers use the sliding window: the key as a u32 period `p` (layer `l` is local
/// when `l % p < p - 1`) or a per-layer bool array; absent, Gemma 3's period of 6.
fn swa_layers(file: &GgufFile, key: &str, n_layers: usize) -> Result<Vec<bool>, ModelError> {
    let period = |p: usize| (0..n_layers).map(|l| l % p < p - 1).collect::<Vec<bool>>();
    match file.get(key) {
        None => Ok(period(6)),
        Some(Value::Array(Array::Bool(v))) if v.len() == n_layers => Ok(v.clone()),
        Some(Value::Array(_)) => Err(load_err(
            file,
            format!("metadata {key:?} is not {n_layers} bools"),
        )),
        Some(_) => match file.get_u32(key)? {
            0 => Ok(vec![true; n_layers]),
            p => Ok(period(p as usize)),
        },
    }
}
