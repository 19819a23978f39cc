//! Wrappers for `kernels/copy.cu`: strided copies (for `contiguous()` and strided writes) and
//! dtype casts.

use super::{fake_slice, need_len};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{
    check_strided_bounds, coalesce, is_contiguous_coalesced, Arg, Launch, LaunchTarget, Step,
    StridedMeta, Traffic, ELEMWISE_BLOCK,
};
use crate::nvrtc::KernelFile;

fn word_name(d: DType) -> &'static str {
    match d.size() {
        1 => "u8",
        2 => "u16",
        4 => "u32",
        _ => "u64",
    }
}

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
    let meta = StridedMeta::new(&cs, &cst)?;
    Ok(Some(Step::Kernel(
        Launch::new(
            KernelFile::Copy,
            format!("strided_copy_{}", word_name(d)),
            t.grid_for(n, ELEMWISE_BLOCK),
            ELEMWISE_BLOCK,
            vec![
                Arg::Ptr(src.ptr()),
                Arg::Ptr(dst.ptr()),
                Arg::I64(n as i64),
                Arg::Strided(meta),
            ],
        )
        .with_traffic(Traffic::bytes(n * d.size(), n * d.size())),
    )))
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
    Ok(Some(Step::Kernel(
        Launch::new(
            KernelFile::Copy,
            format!("cast_{}_{}", x.dtype().suffix(), y.dtype().suffix()),
            t.elementwise_grid(x.len(), x.dtype().size()),
            ELEMWISE_BLOCK,
            vec![
                Arg::Ptr(x.ptr()),
                Arg::Ptr(y.ptr()),
                Arg::I64(x.len() as i64),
            ],
        )
        .with_traffic(Traffic::bytes(x.num_bytes(), y.num_bytes())),
    )))
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

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let mut v = Vec::new();
    for d in [DType::U8, DType::F16, DType::F32, DType::I64] {
        let (s, o) = (fake_slice(d, 12), fake_slice(d, 12));
        if let Some(Step::Kernel(l)) =
            plan_strided_copy(t, s, &[1, 3], o, &[4, 1], &[3, 4]).unwrap()
        {
            v.push(l);
        }
    }
    for a in DType::ALL {
        for b in DType::ALL {
            if let Some(Step::Kernel(l)) =
                plan_cast(t, fake_slice(a, 100), fake_slice(b, 100)).unwrap()
            {
                v.push(l);
            }
        }
    }
    // The identity casts exist as kernels too (cast_f32_f32, ...): plan them directly.
    for a in DType::ALL {
        v.push(Launch::new(
            KernelFile::Copy,
            format!("cast_{0}_{0}", a.suffix()),
            1,
            ELEMWISE_BLOCK,
            vec![Arg::Ptr(0), Arg::Ptr(0), Arg::I64(0)],
        ));
    }
    v
}

#[cfg(test)]
mod tests {
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
