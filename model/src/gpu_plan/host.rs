//! The weights as the device holds them: every tensor a plan names, dequantized, rounded
//! to f16 and stacked where the plan stacks them, ready to upload.

use super::{Optional, Tensor};
use crate::arch::Model;
use crate::ops::half::f32_to_f16;
use crate::quant;

/// A weight the device cannot be given as the plan needs it (a tensor that fails to
/// dequantize, products of one input with different widths), in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct WeightError(pub String);

/// A tensor's values as the device holds them.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// A matrix, f16 bits, row-major.
    F16(Vec<u16>),
    /// A norm vector.
    F32(Vec<f32>),
}

/// A tensor ready to upload: `rows × cols` (a vector is one row).
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub rows: usize,
    pub cols: usize,
    pub data: HostData,
}

impl HostTensor {
    /// Bytes on the device.
    pub fn bytes(&self) -> usize {
        match &self.data {
            HostData::F16(v) => v.len() * 2,
            HostData::F32(v) => v.len() * 4,
        }
    }
}

/// Every tensor a plan of `model` names, prepared for the device: matrices dequantized
/// (den's dequantizers, bit-for-bit ggml's) and rounded to f16, stacked where the plan
/// stacks them; norm vectors as f32; absent optional tensors left out. `each` is called
/// once per tensor, so the caller can upload one at a time (a model's f16 weights are
/// several times its file); its error, or a [`WeightError`] of the preparation, ends the
/// walk.
pub fn host_tensors<E: From<WeightError>>(
    model: &Model<'_>,
    mut each: impl FnMut(Tensor, HostTensor) -> Result<(), E>,
) -> Result<(), E> {
    use crate::ops::matmul::Weight;
    let stacked = |ws: &[&Weight<'_>]| -> Result<HostTensor, WeightError> {
        let cols = ws.first().map_or(0, |w| w.cols);
        if let Some(w) = ws.iter().find(|w| w.cols != cols) {
            return Err(WeightError(format!(
                "{} has {} columns where {} has {cols}: they read the same input",
                w.name, w.cols, ws[0].name
            )));
        }
        let mut data = Vec::new();
        for w in ws {
            dequantize_f16(w, &mut data)?;
        }
        Ok(HostTensor {
            rows: ws.iter().map(|w| w.rows).sum(),
            cols,
            data: HostData::F16(data),
        })
    };
    let vector = |v: &[f32]| HostTensor {
        rows: 1,
        cols: v.len(),
        data: HostData::F32(v.to_vec()),
    };
    let c = model.config();
    each(Tensor::TokenEmbd, stacked(&[&model.token_embd])?)?;
    if !model.tied_embeddings() {
        each(Tensor::Output, stacked(&[&model.output])?)?;
    }
    each(Tensor::OutputNorm, vector(&model.output_norm))?;
    for (li, l) in model.layers.iter().enumerate() {
        each(Tensor::AttnNorm(li), vector(&l.attn_norm))?;
        each(Tensor::Wqkv(li), stacked(&[&l.wq, &l.wk, &l.wv])?)?;
        let has = Optional::of(c, l);
        if has.qk_norm {
            each(Tensor::QNorm(li), vector(&l.q_norm))?;
            each(Tensor::KNorm(li), vector(&l.k_norm))?;
        }
        each(Tensor::Wo(li), stacked(&[&l.wo])?)?;
        if has.post_attn {
            each(Tensor::PostAttnNorm(li), vector(&l.post_attn_norm))?;
        }
        each(Tensor::FfnNorm(li), vector(&l.ffn_norm))?;
        each(Tensor::GateUp(li), stacked(&[&l.gate, &l.up])?)?;
        each(Tensor::Down(li), stacked(&[&l.down])?)?;
        if has.post_ffn {
            each(Tensor::PostFfnNorm(li), vector(&l.post_ffn_norm))?;
        }
    }
    Ok(())
}

/// `w` dequantized row by row and rounded to f16 (nearest, ties to even), appended to `out`.
fn dequantize_f16(
    w: &crate::ops::matmul::Weight<'_>,
    out: &mut Vec<u16>,
) -> Result<(), WeightError> {
    out.reserve(w.rows * w.cols);
    let mut row = vec![0f32; w.cols];
    for j in 0..w.rows {
        quant::dequantize(w.ty, w.row(j), w.cols, &mut row)
            .map_err(|e| WeightError(format!("dequantizing {} row {j}: {e}", w.name)))?;
        out.extend(row.iter().map(|v| f32_to_f16(*v)));
    }
    Ok(())
}
