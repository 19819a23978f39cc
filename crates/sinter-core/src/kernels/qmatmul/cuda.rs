//! qmatmul on CUDA: the kernels of `qmatmul.cu` as custom ops (so they also run on the emulated
//! device) — the per-row quantizer, the dp4a GEMM with its epilogue, and the weight's channel
//! sums (once per upload) — and the sequence one call runs.

use std::sync::OnceLock;

use sinter_cpu::int8::{ActTerms, Activation};

use crate::custom_op::{
    CudaKernel, CustomOp, KernelLaunch, OpClass, OutputSpec, TensorMeta, Traffic,
};
use crate::kernels::launch::kernel;
use crate::kernels::{cached, OpCache};
use crate::{bail, no_grad, DType, Result, Tensor};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first CUDA call).
pub const QMATMUL_CU: &str = include_str!("qmatmul.cu");

/// Output tile edge of the GEMM (rows and channels per block), threads per block.
const TILE: usize = 64;
const BLOCK: u32 = 256;
/// Blocks of a grid-stride launch at most.
const MAX_BLOCKS: usize = 65_535;
const DTYPES: [DType; 2] = [DType::F32, DType::I64];

/// A weight plane on the device (see `Plane::Device`).
pub(super) struct DevicePlane<'a> {
    pub values: &'a Tensor,
    pub sums: &'a Tensor,
    pub scales: &'a Tensor,
}

pub(super) fn qkernel(
    name: &str,
    launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
) -> Result<CudaKernel> {
    static SOURCE: OnceLock<CudaKernel> = OnceLock::new();
    kernel(&SOURCE, ("qmatmul.cu", QMATMUL_CU), name, launch)
}

/// A grid-stride launch of `items` threads.
pub(super) fn strided(items: usize) -> KernelLaunch {
    let blocks = items.div_ceil(BLOCK as usize).clamp(1, MAX_BLOCKS) as u32;
    KernelLaunch::new((blocks, 1, 1), (BLOCK, 1, 1))
}

/// Input: values [n, w] (i64 words of bytes); output: sums [n] (i64).
fn sums_op() -> Result<CustomOp> {
    static OPS: OpCache<()> = OnceLock::new();
    cached(&OPS, (), || {
        CustomOp::builder("qmatmul_weight_sums")
            .inputs(1)
            .dtypes(&DTYPES)
            .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape[..1], DType::I64)]))
            .cuda(qkernel("qmatmul_weight_sums", |m| {
                let (n, words) = (m[0].shape[0], m[0].shape[1]);
                let t = Traffic::bytes(n * words * 8, n * 8).with_flops(n * words * 8);
                // One warp per channel.
                Ok(strided(n * 32)
                    .arg(n as i64)
                    .arg(2 * words as i64)
                    .arg(8 * words as i64)
                    .with_cost(OpClass::Row, t))
            })?)
            .build()
    })
}

/// The channel sums of a device weight's values ([n, w] i64 words).
pub(super) fn weight_sums(values: &Tensor) -> Result<Tensor> {
    let _g = no_grad();
    Ok(sums_op()?.apply(&[values])?.remove(0))
}

/// Input x f32 [m, k]; outputs the u8 rows (i64 [terms·m, ⌈k/8⌉]), their scales (f32
/// [terms·m]) and zero points (i64 [terms·m]).
fn quantize_op(terms: usize) -> Result<CustomOp> {
    static OPS: OpCache<usize> = OnceLock::new();
    cached(&OPS, terms, || {
        CustomOp::builder("qmatmul_quantize_rows")
            .inputs(1)
            .dtypes(&DTYPES)
            .outputs(move |m| {
                let (rows, k) = (terms * m[0].shape[0], m[0].shape[1]);
                Ok(vec![
                    OutputSpec::new(&[rows, k.div_ceil(8)], DType::I64),
                    OutputSpec::new(&[rows], DType::F32),
                    OutputSpec::new(&[rows], DType::I64),
                ])
            })
            .cuda(qkernel("qmatmul_quantize_rows", move |m| {
                let (rows, k) = (m[0].shape[0], m[0].shape[1]);
                let lda = 8 * k.div_ceil(8);
                let t = Traffic::bytes(terms * rows * k * 4, terms * rows * (lda + 12))
                    .with_flops(4 * terms * rows * k);
                Ok(KernelLaunch {
                    grid: (rows.clamp(1, MAX_BLOCKS) as u32, 1, 1),
                    ..strided(0)
                }
                .arg(rows as i64)
                .arg(k as i64)
                .arg(lda as i64)
                .arg(terms as i64)
                .with_cost(OpClass::Row, t))
            })?)
            .build()
    })
}

/// The epilogue's activation as `qmatmul.cu` numbers it.
fn act_code(a: Activation) -> i32 {
    match a {
        Activation::None => 0,
        Activation::Relu => 1,
        Activation::GeluTanh => 2,
        Activation::GeluErf => 3,
    }
}

/// The GEMM's launch: inputs (a [m, wa], w [n, ww], sums, row_scale, row_zero, w_scale, ..).
fn gemm_launch(m: &[TensorMeta], act: Option<Activation>) -> Result<KernelLaunch> {
    let (rows, wa) = (m[0].shape[0], m[0].shape[1]);
    let (n, ww) = (m[1].shape[0], m[1].shape[1]);
    let row_step = m
        .get(3)
        .map_or(0, |s| (s.numel() == rows && rows != 1) as i64);
    if rows.div_ceil(TILE) > MAX_BLOCKS {
        bail!(
            "qmatmul: {rows} rows in one call, at most {}; split the batch",
            MAX_BLOCKS * TILE
        );
    }
    let t = Traffic::bytes(
        rows.div_ceil(TILE) * n * ww * 8 + n.div_ceil(TILE) * rows * wa * 8,
        rows * n * if act.is_some() { 4 } else { 8 },
    )
    .with_flops(2 * rows * n * 8 * ww);
    let launch = KernelLaunch {
        grid: (
            n.div_ceil(TILE).max(1) as u32,
            rows.div_ceil(TILE).max(1) as u32,
            1,
        ),
        ..strided(0)
    }
    .arg(rows as i64)
    .arg(n as i64)
    .arg(2 * ww as i64)
    .arg(8 * wa as i64)
    .arg(8 * ww as i64);
    Ok(match act {
        Some(a) => launch.arg(row_step).arg(act_code(a)),
        None => launch,
    }
    .with_cost(OpClass::Gemm, t))
}

/// Checks the GEMM's operands' shapes (the launch and the kernel index by them).
fn gemm_outputs(m: &[TensorMeta], dtype: DType) -> Result<Vec<OutputSpec>> {
    let (rows, n) = (m[0].shape[0], m[1].shape[0]);
    let fits = m[0].shape.len() == 2
        && m[1].shape.len() == 2
        && m[0].shape[1] == m[1].shape[1]
        && m[2].shape == [n]
        && m.get(3).is_none_or(|s| s.numel() == rows || s.numel() == 1)
        && m.get(4).is_none_or(|z| z.numel() == m[3].numel())
        && m.iter().skip(5).all(|v| v.shape == [n]);
    if !fits {
        let shapes: Vec<_> = m.iter().map(|t| &t.shape).collect();
        bail!("operands that do not fit one GEMM: {shapes:?}");
    }
    Ok(vec![OutputSpec::new(&[rows, n], dtype)])
}

/// Inputs (a, w, sums, row_scale, row_zero, w_scale[, bias]); output f32 [m, n].
fn gemm_op(bias: bool, act: Activation) -> Result<CustomOp> {
    static OPS: OpCache<(bool, i32)> = OnceLock::new();
    cached(&OPS, (bias, act_code(act)), || {
        let name = if bias {
            "qmatmul_f32_bias"
        } else {
            "qmatmul_f32"
        };
        CustomOp::builder("qmatmul")
            .inputs(6 + bias as usize)
            .dtypes(&DTYPES)
            .outputs(|m| gemm_outputs(m, DType::F32))
            .cuda(qkernel(name, move |m| gemm_launch(m, Some(act)))?)
            .build()
    })
}

/// Inputs (a, w, sums); output the exact accumulators Σ_k a·w, i64 [m, n].
#[cfg(test)]
pub(super) fn accumulators(a: &Tensor, w: &Tensor, sums: &Tensor) -> Result<Tensor> {
    static OPS: OpCache<()> = OnceLock::new();
    let op = cached(&OPS, (), || {
        CustomOp::builder("qmatmul_i32")
            .inputs(3)
            .dtypes(&DTYPES)
            .outputs(|m| gemm_outputs(m, DType::I64))
            .cuda(qkernel("qmatmul_i32", |m| gemm_launch(m, None))?)
            .build()
    })?;
    Ok(op.apply(&[a, w, sums])?.remove(0))
}

/// Row-quantizes x ([m, k] f32 on a CUDA device) in `terms` terms: (u8 rows, scales, zeros).
#[cfg(test)]
pub(super) fn quantize_rows(x: &Tensor, terms: usize) -> Result<Vec<Tensor>> {
    quantize_op(terms)?.apply(&[x])
}

/// y [m, n] for x ([m, k] f32, contiguous, on a CUDA device), `terms` decided. One term and one
/// plane: one fused GEMM. Otherwise each plane's GEMM over all terms' rows without bias or
/// activation, the parts summed plane by plane, term by term, then the bias and the activation
/// — the CPU's order (`sinter_cpu::int8::linear_dynamic_planes`).
pub(super) fn forward(
    x: &Tensor,
    planes: &[DevicePlane<'_>],
    bias: Option<&Tensor>,
    act: Activation,
    terms: ActTerms,
) -> Result<Tensor> {
    let _g = no_grad();
    let (m, n, dev) = (x.shape()[0], planes[0].values.shape()[0], x.device());
    if m == 0 {
        return Tensor::zeros(&[0, n], DType::F32, dev);
    }
    let t = terms.count(m);
    let q = quantize_op(t)?.apply(&[x])?;
    let gemm = |p: &DevicePlane<'_>, bias: Option<&Tensor>, act: Activation| -> Result<Tensor> {
        let mut inputs = vec![&q[0], p.values, p.sums, &q[1], &q[2], p.scales];
        inputs.extend(bias);
        Ok(gemm_op(bias.is_some(), act)?.apply(&inputs)?.remove(0))
    };
    if t == 1 && planes.len() == 1 {
        return gemm(&planes[0], bias, act);
    }
    let mut y = Tensor::zeros(&[m, n], DType::F32, dev)?;
    for p in planes {
        let part = gemm(p, None, Activation::None)?;
        for term in 0..t {
            y = y.add(&part.narrow(0, term * m, m)?)?;
        }
    }
    if let Some(b) = bias {
        y = y.add(&b.reshape(&[1, n])?)?;
    }
    match act {
        Activation::None => Ok(y),
        Activation::Relu => y.relu(),
        Activation::GeluTanh => y.gelu(),
        Activation::GeluErf => y.gelu_erf(),
    }
}

/// y [m, n] = act((a·Wᵀ − z·Σw)·(s·w_scale) + bias) for u8 rows `a` (i64 words [m, ⌈k/8⌉])
/// that all share one static mapping (`scale` f32 [1], `zero` i64 [1]): the int8
/// convolution's columns.
pub(super) fn gemm_static(
    a: &Tensor,
    p: &DevicePlane<'_>,
    scale: &Tensor,
    zero: &Tensor,
    bias: Option<&Tensor>,
    act: Activation,
) -> Result<Tensor> {
    let mut inputs = vec![a, p.values, p.sums, scale, zero, p.scales];
    inputs.extend(bias);
    Ok(gemm_op(bias.is_some(), act)?.apply(&inputs)?.remove(0))
}
