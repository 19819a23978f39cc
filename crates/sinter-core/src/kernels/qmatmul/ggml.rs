//! The GGML kinds of qmatmul ([`QFormat::Ggml`]): weights that stay in a GGML block format
//! (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K as a GGUF file stores them, parts of different types
//! stacked by rows).
//!
//! - CPU: sinter-cpu's `QuantMatrix` (the activations quantized per block for the integer dot
//!   kernels, or the f32 GEMM over dequantized parts from a prefill's rows), then the bias and
//!   activation.
//! - CUDA: the blocks uploaded as they are (row after row, as i64 words: tensors hold no
//!   bytes); each call dequantizes a part into a temporary f32 [rows, k] with
//!   `ggml_dequantize_rows` of `qmatmul.cu` (exactly the CPU's values) and multiplies by it
//!   with the f32 GEMM, as llama.cpp's CUDA backend does for batched products. The weight's
//!   memory stays quantized between calls.
//!
//! The two devices' products differ in rounding (the CPU's integer dot products round the
//! activations to 8 bits per block); both are within the quantization error of the f32
//! product with the dequantized weight, which the tests check.

use std::sync::Arc;

use sinter_cpu::ggml_quant::{GgmlType, QuantMatrix};
use sinter_cpu::int8::Activation;
use sinter_cpu::math::bias_act::bias_act_rows;
use sinter_cpu::Isa;

use super::cuda;
use crate::custom_op::{CustomOp, OpClass, OutputSpec, Traffic};
use crate::kernels::{cached, OpCache};
use crate::{bail, no_grad, DType, Device, Error, Result, Tensor};

/// One part of a GGML weight on a CUDA device: its type, rows and blocks (i64 words).
#[derive(Clone)]
pub(super) struct DevicePart {
    pub ty: GgmlType,
    pub rows: usize,
    pub blocks: Tensor,
}

fn ggml_err(e: sinter_cpu::ggml_quant::GgmlError) -> Error {
    Error::Msg(format!("qmatmul (GGML): {e}"))
}

/// The parts of `m` on `device`.
pub(super) fn upload(m: &QuantMatrix, device: Device) -> Result<Vec<DevicePart>> {
    m.parts_row_major()
        .into_iter()
        .map(|(ty, rows, bytes)| {
            let words: Vec<i64> = bytes
                .chunks(8)
                .map(|c| {
                    let mut w = [0u8; 8];
                    w[..c.len()].copy_from_slice(c);
                    i64::from_le_bytes(w)
                })
                .collect();
            let len = words.len();
            Ok(DevicePart {
                ty,
                rows,
                blocks: Tensor::from_vec(words, &[len], Device::Cpu)?.to_device(device)?,
            })
        })
        .collect()
}

/// The device parts back as a CPU matrix of k columns.
pub(super) fn download(parts: &[DevicePart], k: usize) -> Result<QuantMatrix> {
    let matrices = parts
        .iter()
        .map(|p| {
            let len = p.ty.bytes_for(k).map_err(ggml_err)? * p.rows;
            let bytes: Vec<u8> = (p.blocks.to_vec_i64()?.iter())
                .flat_map(|w| w.to_le_bytes())
                .take(len)
                .collect();
            QuantMatrix::new(p.ty, p.rows, k, bytes).map_err(ggml_err)
        })
        .collect::<Result<Vec<_>>>()?;
    QuantMatrix::stack(matrices).map_err(ggml_err)
}

/// y [rows, n] for x (CPU, float, last dimension k) and the CPU matrix.
pub(super) fn forward_cpu(
    x: &Tensor,
    m: &QuantMatrix,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Vec<f32>> {
    let (k, n) = (m.k(), m.n());
    let xs = x.host_values()?;
    let rows = xs.len() / k.max(1);
    let mut y = vec![0f32; rows * n];
    m.matmul(&xs, rows, &mut y).map_err(ggml_err)?;
    if bias.is_some() || act != Activation::None {
        let b = match bias {
            Some(b) => b.to_vec_f32()?,
            None => vec![0f32; n],
        };
        let pre = y.clone();
        bias_act_rows(Isa::get(), &pre, &b, act, &mut y);
    }
    Ok(y)
}

/// Rows `ids` (i64 on the part's device, each < the part's rows) of a device part, f32
/// [ids, k].
pub(super) fn dequantize_rows(p: &DevicePart, k: usize, ids: &Tensor) -> Result<Tensor> {
    let _g = no_grad();
    let row_bytes = p.ty.bytes_for(k).map_err(ggml_err)?;
    let (ty, be, bb) = (p.ty, p.ty.block_elems(), p.ty.block_bytes());
    static OPS: OpCache<(u32, usize)> = std::sync::OnceLock::new();
    let op = cached(&OPS, (ty.id(), k), || {
        CustomOp::builder("ggml_dequantize_rows")
            .inputs(2)
            .dtypes(&[DType::I64])
            .outputs(move |m| Ok(vec![OutputSpec::new(&[m[1].numel(), k], DType::F32)]))
            .cuda(cuda::qkernel("ggml_dequantize_rows", move |m| {
                let count = m[1].numel();
                let t = Traffic::bytes(count * row_bytes + count * 8, count * k * 4)
                    .with_flops(2 * count * k);
                Ok(cuda::strided(count * k)
                    .arg(ty.id() as i64)
                    .arg(k as i64)
                    .arg(row_bytes as i64)
                    .arg(count as i64)
                    .arg(be as i64)
                    .arg(bb as i64)
                    .with_cost(OpClass::Elementwise, t))
            })?)
            .build()
    })?;
    Ok(op.apply(&[&p.blocks, ids])?.remove(0))
}

/// y [rows, n] for x (f32 [rows, k], contiguous, on the parts' device): each part
/// dequantized and multiplied, the parts' columns side by side, then bias and activation.
pub(super) fn forward_device(
    x: &Tensor,
    parts: &[DevicePart],
    k: usize,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let _g = no_grad();
    let dev = x.device();
    let mut cols = Vec::with_capacity(parts.len());
    for p in parts {
        let ids = Tensor::arange(0.0, p.rows as f64, 1.0, DType::I64, dev)?;
        let w = dequantize_rows(p, k, &ids)?;
        cols.push(x.matmul(&w.t()?)?);
    }
    let mut y = if cols.len() == 1 {
        cols.swap_remove(0)
    } else {
        Tensor::cat(&cols, 1)?
    };
    if let Some(b) = bias {
        y = y.add(&b.reshape(&[1, b.numel()])?)?;
    }
    match act {
        Activation::None => Ok(y),
        Activation::Relu => y.relu(),
        Activation::GeluTanh => y.gelu(),
        Activation::GeluErf => y.gelu_erf(),
    }
}

/// The weight's rows `ids` dequantized, for token tables kept quantized: f32 [ids.., k] on
/// the weight's device (one part on CUDA: a table is not stacked).
pub(super) fn lookup_device(parts: &[DevicePart], k: usize, ids: &Tensor) -> Result<Tensor> {
    let [p] = parts else {
        bail!(
            "qmatmul (GGML): a lookup in a matrix stacked from {} parts; token tables have one",
            parts.len()
        );
    };
    let flat = ids.reshape(&[ids.numel()])?.contiguous()?;
    let rows = dequantize_rows(p, k, &flat)?;
    let mut shape = ids.shape().to_vec();
    shape.push(k);
    rows.reshape(&shape)
}

/// The CPU matrix's rows `ids` dequantized.
pub(super) fn lookup_cpu(m: &Arc<QuantMatrix>, ids: &[i64]) -> Result<Vec<f32>> {
    let k = m.k();
    let mut out = vec![0f32; ids.len() * k];
    for (&id, o) in ids.iter().zip(out.chunks_exact_mut(k.max(1))) {
        m.dequantize_row(id as usize, o).map_err(ggml_err)?;
    }
    Ok(out)
}
