//! The CPU backend: storage as plain vectors, kernels over f32 (f16/bf16 widen to f32 and
//! round back), rayon across cores for large tensors, the `gemm` crate for matrix products.

pub mod alloc;
pub mod conv;
pub mod elementwise;
pub mod hot_workers;
pub mod matmul;
pub mod nn;
mod primitives;
pub mod reduce;

pub(crate) use primitives::linear_epilogue;
pub use primitives::CpuDevice;

use std::borrow::Cow;

use half::{bf16, f16};

use crate::{DType, Element, Layout};

/// Below this many elements a kernel runs on one thread: rayon's fork/join costs more.
pub const PAR_THRESHOLD: usize = 1 << 15;

#[derive(Clone, Debug)]
pub enum CpuStorage {
    F32(Vec<f32>),
    F16(Vec<f16>),
    BF16(Vec<bf16>),
    I64(Vec<i64>),
    /// `DType::Bool`: one byte per element, as PyTorch stores `torch.bool`.
    Bool(Vec<bool>),
}

/// Runs `$body` with `$v` bound to the typed vector of any variant.
#[macro_export]
macro_rules! with_cpu_vec {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::cpu::CpuStorage::F32($v) => $body,
            $crate::cpu::CpuStorage::F16($v) => $body,
            $crate::cpu::CpuStorage::BF16($v) => $body,
            $crate::cpu::CpuStorage::I64($v) => $body,
            $crate::cpu::CpuStorage::Bool($v) => $body,
        }
    };
}

/// A vector of `n` f32 values for a kernel that writes every one of them before anything
/// reads it (a GEMM with β = 0, a convolution's output): no zero fill (sinter-cpu's rule).
pub(crate) use sinter_cpu::math::output_vec;

/// Gathers the elements a layout addresses into a new row-major vector.
pub fn gather_strided<T: Copy + Send + Sync>(src: &[T], layout: &Layout) -> Vec<T> {
    if let Some(r) = layout.contiguous_range() {
        return src[r].to_vec();
    }
    let n = layout.numel();
    let (last, ls) = layout.last_dim();
    if n == 0 || last == 0 {
        return Vec::new();
    }
    let mut out: Vec<T> = Vec::with_capacity(n);
    // SAFETY: every element is written exactly once below before the vector is read.
    #[allow(clippy::uninit_vec)]
    unsafe {
        out.set_len(n)
    };
    let fill = |(row, dst): (usize, &mut [T])| {
        let base = layout.row_offset(row);
        if ls == 1 {
            dst.copy_from_slice(&src[base..base + last]);
        } else {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = src[base + j * ls];
            }
        }
    };
    if n >= PAR_THRESHOLD {
        use rayon::prelude::*;
        out.par_chunks_mut(last)
            .with_min_len((4096 / last).max(1))
            .enumerate()
            .for_each(fill);
    } else {
        out.chunks_mut(last).enumerate().for_each(fill);
    }
    out
}

/// Writes row-major `src` into the positions `layout` addresses in `dst`.
pub fn scatter_strided<T: Copy>(dst: &mut [T], layout: &Layout, src: &[T]) {
    if let Some(r) = layout.contiguous_range() {
        dst[r].copy_from_slice(src);
        return;
    }
    let (last, ls) = layout.last_dim();
    if last == 0 {
        return;
    }
    for (row, chunk) in src.chunks(last).enumerate() {
        let base = layout.row_offset(row);
        for (j, v) in chunk.iter().enumerate() {
            dst[base + j * ls] = *v;
        }
    }
}

/// CPU storage holds only the tensor dtypes; the others are refused where tensors are made
/// (`dtype::check_tensor_dtype`), so reaching this is a bug in that check.
fn not_a_tensor_dtype(d: DType) -> ! {
    unreachable!("internal error: CPU storage of {d} (tensors hold f32, f16, bf16, i64 or bool)")
}

fn convert<A: Element, B: Element>(v: &[A]) -> Vec<B> {
    use rayon::prelude::*;
    if v.len() >= PAR_THRESHOLD {
        v.par_iter().map(|x| B::from_f64(x.to_f64())).collect()
    } else {
        v.iter().map(|x| B::from_f64(x.to_f64())).collect()
    }
}

fn f32_to<B: Element>(v: &[f32]) -> Vec<B> {
    use rayon::prelude::*;
    if v.len() >= PAR_THRESHOLD {
        v.par_iter().map(|&x| B::from_f32(x)).collect()
    } else {
        v.iter().map(|&x| B::from_f32(x)).collect()
    }
}

fn to_f32<A: Element>(v: &[A]) -> Vec<f32> {
    use rayon::prelude::*;
    if v.len() >= PAR_THRESHOLD {
        v.par_iter().map(|x| x.to_f32()).collect()
    } else {
        v.iter().map(|x| x.to_f32()).collect()
    }
}

impl CpuStorage {
    pub fn dtype(&self) -> DType {
        match self {
            CpuStorage::F32(_) => DType::F32,
            CpuStorage::F16(_) => DType::F16,
            CpuStorage::BF16(_) => DType::BF16,
            CpuStorage::I64(_) => DType::I64,
            CpuStorage::Bool(_) => DType::Bool,
        }
    }
    pub fn len(&self) -> usize {
        with_cpu_vec!(self, v => v.len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn zeros(n: usize, dtype: DType) -> Self {
        alloc::tune_once();
        match dtype {
            DType::F32 => CpuStorage::F32(vec![0.0; n]),
            DType::F16 => CpuStorage::F16(vec![f16::ZERO; n]),
            DType::BF16 => CpuStorage::BF16(vec![bf16::ZERO; n]),
            DType::I64 => CpuStorage::I64(vec![0; n]),
            DType::Bool => CpuStorage::Bool(vec![false; n]),
            d => not_a_tensor_dtype(d),
        }
    }
    pub fn full(n: usize, value: f64, dtype: DType) -> Self {
        alloc::tune_once();
        match dtype {
            DType::F32 => CpuStorage::F32(vec![value as f32; n]),
            DType::F16 => CpuStorage::F16(vec![<f16 as Element>::from_f64(value); n]),
            DType::BF16 => CpuStorage::BF16(vec![<bf16 as Element>::from_f64(value); n]),
            DType::I64 => CpuStorage::I64(vec![value as i64; n]),
            DType::Bool => CpuStorage::Bool(vec![<bool as Element>::from_f64(value); n]),
            d => not_a_tensor_dtype(d),
        }
    }
    /// Builds storage of `dtype` from f32 values (the result of a kernel).
    pub fn from_f32(v: Vec<f32>, dtype: DType) -> Self {
        alloc::tune_once();
        match dtype {
            DType::F32 => CpuStorage::F32(v),
            DType::F16 => CpuStorage::F16(f32_to(&v)),
            DType::BF16 => CpuStorage::BF16(f32_to(&v)),
            DType::I64 => CpuStorage::I64(v.iter().map(|&x| x as i64).collect()),
            DType::Bool => CpuStorage::Bool(f32_to(&v)),
            d => not_a_tensor_dtype(d),
        }
    }
    /// The addressed elements as row-major f32, borrowed when they already are.
    pub fn f32_contiguous(&self, layout: &Layout) -> Cow<'_, [f32]> {
        match self {
            CpuStorage::F32(v) => match layout.contiguous_range() {
                Some(r) => Cow::Borrowed(&v[r]),
                None => Cow::Owned(gather_strided(v, layout)),
            },
            CpuStorage::F16(v) => Cow::Owned(to_f32(&gather_strided(v, layout))),
            CpuStorage::BF16(v) => Cow::Owned(to_f32(&gather_strided(v, layout))),
            CpuStorage::I64(v) => Cow::Owned(to_f32(&gather_strided(v, layout))),
            CpuStorage::Bool(v) => Cow::Owned(to_f32(&gather_strided(v, layout))),
        }
    }
    /// The addressed elements as row-major i64 (indices).
    pub fn i64_contiguous(&self, layout: &Layout) -> Cow<'_, [i64]> {
        match self {
            CpuStorage::I64(v) => match layout.contiguous_range() {
                Some(r) => Cow::Borrowed(&v[r]),
                None => Cow::Owned(gather_strided(v, layout)),
            },
            CpuStorage::Bool(v) => Cow::Owned(
                gather_strided(v, layout)
                    .iter()
                    .map(|&b| b as i64)
                    .collect(),
            ),
            other => Cow::Owned(
                other
                    .f32_contiguous(layout)
                    .iter()
                    .map(|&x| x as i64)
                    .collect(),
            ),
        }
    }
    /// The addressed elements as row-major bools (a condition): non-zero is true, NaN included.
    pub fn bool_contiguous(&self, layout: &Layout) -> Cow<'_, [bool]> {
        match self {
            CpuStorage::Bool(v) => match layout.contiguous_range() {
                Some(r) => Cow::Borrowed(&v[r]),
                None => Cow::Owned(gather_strided(v, layout)),
            },
            other => Cow::Owned(
                other
                    .f32_contiguous(layout)
                    .iter()
                    .map(|&x| x != 0.0)
                    .collect(),
            ),
        }
    }
    /// A row-major copy of the elements `layout` addresses.
    pub fn gather(&self, layout: &Layout) -> CpuStorage {
        match self {
            CpuStorage::F32(v) => CpuStorage::F32(gather_strided(v, layout)),
            CpuStorage::F16(v) => CpuStorage::F16(gather_strided(v, layout)),
            CpuStorage::BF16(v) => CpuStorage::BF16(gather_strided(v, layout)),
            CpuStorage::I64(v) => CpuStorage::I64(gather_strided(v, layout)),
            CpuStorage::Bool(v) => CpuStorage::Bool(gather_strided(v, layout)),
        }
    }
    /// A row-major copy of the elements `layout` addresses, converted to `dtype`.
    pub fn gather_as(&self, layout: &Layout, dtype: DType) -> CpuStorage {
        let src = self.gather(layout);
        if src.dtype() == dtype {
            return src;
        }
        macro_rules! to {
            ($v:expr) => {
                match dtype {
                    DType::F32 => CpuStorage::F32(convert($v)),
                    DType::F16 => CpuStorage::F16(convert($v)),
                    DType::BF16 => CpuStorage::BF16(convert($v)),
                    DType::I64 => CpuStorage::I64(convert($v)),
                    DType::Bool => CpuStorage::Bool(convert($v)),
                    d => not_a_tensor_dtype(d),
                }
            };
        }
        with_cpu_vec!(&src, v => to!(v))
    }
    /// Copies row-major `src` (same dtype) into the region `dst_layout` addresses.
    pub fn write_strided(&mut self, dst_layout: &Layout, src: &CpuStorage) -> crate::Result<()> {
        match (self, src) {
            (CpuStorage::F32(d), CpuStorage::F32(s)) => scatter_strided(d, dst_layout, s),
            (CpuStorage::F16(d), CpuStorage::F16(s)) => scatter_strided(d, dst_layout, s),
            (CpuStorage::BF16(d), CpuStorage::BF16(s)) => scatter_strided(d, dst_layout, s),
            (CpuStorage::I64(d), CpuStorage::I64(s)) => scatter_strided(d, dst_layout, s),
            (CpuStorage::Bool(d), CpuStorage::Bool(s)) => scatter_strided(d, dst_layout, s),
            (d, s) => {
                return Err(crate::Error::DTypeMismatch {
                    op: "copy",
                    expected: d.dtype(),
                    got: s.dtype(),
                })
            }
        }
        Ok(())
    }
    pub fn as_f32_slice_mut(&mut self) -> Option<&mut [f32]> {
        match self {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl From<Vec<f32>> for CpuStorage {
    fn from(v: Vec<f32>) -> Self {
        alloc::tune_once();
        CpuStorage::F32(v)
    }
}
impl From<Vec<half::f16>> for CpuStorage {
    fn from(v: Vec<half::f16>) -> Self {
        CpuStorage::F16(v)
    }
}
impl From<Vec<half::bf16>> for CpuStorage {
    fn from(v: Vec<half::bf16>) -> Self {
        CpuStorage::BF16(v)
    }
}
impl From<Vec<i64>> for CpuStorage {
    fn from(v: Vec<i64>) -> Self {
        CpuStorage::I64(v)
    }
}
impl From<Vec<bool>> for CpuStorage {
    fn from(v: Vec<bool>) -> Self {
        CpuStorage::Bool(v)
    }
}
