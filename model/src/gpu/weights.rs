//! A model's weights on the device: every matrix dequantized once (den's dequantizers,
//! bit-for-bit ggml's) and rounded to f16 for cuBLAS, every norm vector as f32. A tied
//! output projection shares the embedding's copy.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};

use super::GpuError;
use crate::arch::Model;
use crate::ops::half::f32_to_f16;
use crate::ops::matmul::Weight;
use crate::quant;

/// A `rows × cols` matrix as f16, row-major (a weight row is one output).
#[derive(Debug)]
pub struct DeviceMatrix {
    pub rows: usize,
    pub cols: usize,
    pub data: CudaSlice<u16>,
}

/// One block's tensors on the device.
#[derive(Debug)]
pub struct DeviceLayer {
    pub attn_norm: CudaSlice<f32>,
    pub wq: DeviceMatrix,
    pub wk: DeviceMatrix,
    pub wv: DeviceMatrix,
    pub wo: DeviceMatrix,
    pub q_norm: Option<CudaSlice<f32>>,
    pub k_norm: Option<CudaSlice<f32>>,
    pub post_attn_norm: Option<CudaSlice<f32>>,
    pub ffn_norm: CudaSlice<f32>,
    pub gate: DeviceMatrix,
    pub up: DeviceMatrix,
    pub down: DeviceMatrix,
    pub post_ffn_norm: Option<CudaSlice<f32>>,
}

/// Every weight of a model on the device.
#[derive(Debug)]
pub struct DeviceWeights {
    pub token_embd: DeviceMatrix,
    /// `None` when tied to the embedding.
    pub output: Option<DeviceMatrix>,
    pub output_norm: CudaSlice<f32>,
    pub layers: Vec<DeviceLayer>,
    /// Bytes uploaded.
    pub bytes: u64,
}

impl DeviceWeights {
    /// The output projection (the embedding when tied).
    pub fn output(&self) -> &DeviceMatrix {
        self.output.as_ref().unwrap_or(&self.token_embd)
    }

    /// Uploads `model`'s weights on `stream`.
    pub fn upload(model: &Model<'_>, stream: &Arc<CudaStream>) -> Result<DeviceWeights, GpuError> {
        let mut bytes = 0u64;
        let mut matrix = |w: &Weight<'_>| -> Result<DeviceMatrix, GpuError> {
            let host = dequantize_f16(w)?;
            bytes += host.len() as u64 * 2;
            let data = stream
                .clone_htod(&host)
                .map_err(|e| GpuError::call(&format!("uploading {}", w.name), e))?;
            Ok(DeviceMatrix {
                rows: w.rows,
                cols: w.cols,
                data,
            })
        };
        let token_embd = matrix(&model.token_embd)?;
        let output = if model.tied_embeddings() {
            None
        } else {
            Some(matrix(&model.output)?)
        };
        let mut layers = Vec::with_capacity(model.layers.len());
        for l in &model.layers {
            layers.push(DeviceLayer {
                attn_norm: vector(stream, &l.attn_norm)?,
                wq: matrix(&l.wq)?,
                wk: matrix(&l.wk)?,
                wv: matrix(&l.wv)?,
                wo: matrix(&l.wo)?,
                q_norm: optional(stream, &l.q_norm)?,
                k_norm: optional(stream, &l.k_norm)?,
                post_attn_norm: optional(stream, &l.post_attn_norm)?,
                ffn_norm: vector(stream, &l.ffn_norm)?,
                gate: matrix(&l.gate)?,
                up: matrix(&l.up)?,
                down: matrix(&l.down)?,
                post_ffn_norm: optional(stream, &l.post_ffn_norm)?,
            });
        }
        Ok(DeviceWeights {
            token_embd,
            output,
            output_norm: vector(stream, &model.output_norm)?,
            layers,
            bytes,
        })
    }
}

/// `w` dequantized row by row and rounded to f16 (nearest, ties to even).
pub fn dequantize_f16(w: &Weight<'_>) -> Result<Vec<u16>, GpuError> {
    let mut out = Vec::with_capacity(w.rows * w.cols);
    let mut row = vec![0f32; w.cols];
    for j in 0..w.rows {
        quant::dequantize(w.ty, w.row(j), w.cols, &mut row).map_err(|e| GpuError::Call {
            what: format!("dequantizing {} row {j}", w.name),
            detail: e.to_string(),
        })?;
        out.extend(row.iter().map(|v| f32_to_f16(*v)));
    }
    Ok(out)
}

fn vector(stream: &Arc<CudaStream>, v: &[f32]) -> Result<CudaSlice<f32>, GpuError> {
    stream
        .clone_htod(v)
        .map_err(|e| GpuError::call("uploading a norm vector", e))
}

fn optional(stream: &Arc<CudaStream>, v: &[f32]) -> Result<Option<CudaSlice<f32>>, GpuError> {
    if v.is_empty() {
        Ok(None)
    } else {
        vector(stream, v).map(Some)
    }
}
