//! qmatmul on the CPU: sinter-cpu's int8 GEMM (packed panels; the fastest path this CPU has,
//! every path bit-identical) over the input read in place when it is contiguous f32.

use sinter_cpu::int8::{
    linear_dynamic_planes, ActTerms, Activation, Epilogue, Int8Path, PackedWeights,
};

use crate::{Error, Result, Tensor};

/// y ([rows, n] row-major) for `x` (CPU, float, last dimension k) against one or two planes
/// (packed values, scales), `terms` decided (`One` or `Two`).
pub(super) fn forward(
    x: &Tensor,
    planes: &[(&PackedWeights, &[f32])],
    bias: Option<&Tensor>,
    activation: Activation,
    terms: ActTerms,
) -> Result<Vec<f32>> {
    let (first, scales) = planes[0];
    let (k, n) = (first.k(), first.n());
    let xs = x.host_values()?;
    let bias = bias.map(Tensor::host_values).transpose()?;
    let rows = xs.len() / k.max(1);
    let mut y = vec![0f32; rows * n];
    linear_dynamic_planes(
        Int8Path::get(),
        &xs,
        rows,
        first,
        &Epilogue {
            weight_scales: scales,
            bias: bias.as_deref(),
            activation,
        },
        planes.get(1).copied(),
        terms,
        &mut y,
    )
    .map_err(|e| Error::Msg(format!("qmatmul: {e}")))?;
    Ok(y)
}
