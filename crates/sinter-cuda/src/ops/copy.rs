//! Wrappers for `kernels/copy.cu`: strided copies (for `contiguous()` and strided writes) and
//! dtype casts.

use super::need_len;
use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot::*, Source};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{
    check_strided_bounds, coalesce, is_contiguous_coalesced, Arg, LaunchTarget, Step, StridedMeta,
};
use crate::nvrtc::KernelFile;

/// dst[dst_strides] = src[src_strides], by element size.
pub static STRIDED_COPY: Kernel = Kernel {
    source: Source::File(KernelFile::Copy),
    name: "strided_copy_{w}",
    ops: no_ops,
    // The kernels exist per element size (u8 .. u64): every dtype has one.
    dtypes: &DType::ALL,
    dtypes2: &[],
    args: &[In("src"), Out("dst"), Items, Strided],
    grid: Grid::PerItem,
    traffic: Cost::Items,
};

/// y = x converted to y's dtype (`{d}` to `{d2}`, the identities included).
pub static CAST: Kernel = Kernel {
    source: Source::File(KernelFile::Copy),
    name: "cast_{d}_{d2}",
    ops: no_ops,
    dtypes: &DType::ALL,
    dtypes2: &DType::ALL,
    args: &[In("x"), Out("y"), Items],
    grid: Grid::Packed,
    traffic: Cost::Moves { flops: 0 },
};

/// The rows of `kernels/copy.cu`.
pub static KERNELS: [&Kernel; 2] = [&STRIDED_COPY, &CAST];

/// Plan dst[dst_strides] = src[src_strides] over `shape` (same dtype). A copy that is contiguous
/// on both sides after merging dims becomes a plain device memcpy.
pub fn plan_strided_copy(
    t: &LaunchTarget,
    src: DevSlice<'_>,
    src_strides: &[i64],
    dst: DevSlice<'_>,
    dst_strides: &[i64],
    shape: &[usize],
) -> Result<Option<Step>> {
    let d = src.dtype();
    if dst.dtype() != d {
        return Err(CudaError::invalid(
            "strided_copy",
            format!("dtype {} -> {}: use cast", d, dst.dtype()),
        ));
    }
    check_strided_bounds("strided_copy", "src", src.len(), shape, src_strides)?;
    check_strided_bounds("strided_copy", "dst", dst.len(), shape, dst_strides)?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &s| a.checked_mul(s))
        .ok_or_else(|| CudaError::invalid("strided_copy", "shape overflows"))?;
    if n == 0 {
        return Ok(None);
    }
    let (cs, cst) = coalesce(shape, &[src_strides, dst_strides]);
    if cst.iter().all(|s| is_contiguous_coalesced(&cs, s)) {
        return Ok(Some(Step::Copy {
            src: src.ptr(),
            dst: dst.ptr(),
            bytes: n * d.size(),
        }));
    }
    let (operands, meta) = ([src, dst], [Arg::Strided(StridedMeta::new(&cs, &cst)?)]);
    let call = Call::new(d, n, &operands).scalars(&meta);
    Ok(STRIDED_COPY.plan(t, &call)?.map(Step::Kernel))
}

/// Plan y = cast(x), both contiguous with the same length. Same dtype = memcpy.
pub fn plan_cast(t: &LaunchTarget, x: DevSlice<'_>, y: DevSlice<'_>) -> Result<Option<Step>> {
    need_len("cast", "y", &y, x.len())?;
    if x.is_empty() {
        return Ok(None);
    }
    if x.dtype() == y.dtype() {
        return Ok(Some(Step::Copy {
            src: x.ptr(),
            dst: y.ptr(),
            bytes: x.num_bytes(),
        }));
    }
    let operands = [x, y];
    let call = Call::new(x.dtype(), x.len(), &operands).dtype2(y.dtype());
    Ok(CAST.plan(t, &call)?.map(Step::Kernel))
}

/// dst[dst_strides] = src[src_strides] over `shape`.
pub fn strided_copy(
    dev: &CudaDevice,
    src: DevSlice<'_>,
    src_strides: &[i64],
    dst: DevSlice<'_>,
    dst_strides: &[i64],
    shape: &[usize],
) -> Result<()> {
    dev.run_steps(
        plan_strided_copy(&dev.target(), src, src_strides, dst, dst_strides, shape)?.into_iter(),
    )
}

/// Gather a strided view into contiguous `dst` (what `Tensor::contiguous()` needs).
pub fn contiguous(
    dev: &CudaDevice,
    src: DevSlice<'_>,
    src_strides: &[i64],
    shape: &[usize],
    dst: DevSlice<'_>,
) -> Result<()> {
    let st = crate::launch::contiguous_strides(shape);
    strided_copy(dev, src, src_strides, dst, &st, shape)
}

/// y = x converted to y's dtype.
pub fn cast(dev: &CudaDevice, x: DevSlice<'_>, y: DevSlice<'_>) -> Result<()> {
    dev.run_steps(plan_cast(&dev.target(), x, y)?.into_iter())
}

#[cfg(test)]
mod tests {
    use super::super::fake_slice;
    use super::*;

    #[test]
    fn copy_plans() {
        let t = LaunchTarget { sm_count: 4 };
        let s = fake_slice(DType::BF16, 12);
        let d = fake_slice(DType::BF16, 12);
        // Transpose [4,3] -> [3,4].
        match plan_strided_copy(&t, s, &[1, 3], d, &[4, 1], &[3, 4])
            .unwrap()
            .unwrap()
        {
            Step::Kernel(l) => assert_eq!(l.name, "strided_copy_u16"),
            other => panic!("{other:?}"),
        }
        // Contiguous both sides -> memcpy.
        match plan_strided_copy(&t, s, &[4, 1], d, &[4, 1], &[3, 4])
            .unwrap()
            .unwrap()
        {
            Step::Copy { bytes, .. } => assert_eq!(bytes, 24),
            other => panic!("{other:?}"),
        }
        assert!(
            plan_strided_copy(&t, s, &[1, 3], fake_slice(DType::F32, 12), &[4, 1], &[3, 4])
                .is_err()
        );
        match plan_cast(&t, fake_slice(DType::F32, 5), fake_slice(DType::I64, 5))
            .unwrap()
            .unwrap()
        {
            Step::Kernel(l) => assert_eq!(l.name, "cast_f32_i64"),
            other => panic!("{other:?}"),
        }
    }
}
