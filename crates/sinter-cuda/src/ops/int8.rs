//! Wrappers for `kernels/int8_gemm.cu`: the int8 GEMM of quantized inference (u8 activations ×
//! i8 weights → exact i32 with dp4a, then the dequantize + bias + activation epilogue), the same
//! contract as the CPU's `sinter_cpu::int8`. i8 weights live in U8 buffers (the bytes as they
//! are; the kernel reads them as signed).

use super::{fake_slice, need, need_dtype, opt_need, ptr_of};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// Output tile edge of the GEMM kernels (rows and channels per block).
const TILE: usize = 64;
const BLOCK: u32 = 256;
/// Above this k the i32 accumulators could overflow (255 · 127 · k < 2³¹).
pub const MAX_K: usize = 65_536;

/// The function the epilogue applies after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Int8Activation {
    None = 0,
    Relu = 1,
    GeluTanh = 2,
    GeluErf = 3,
}

/// The operands' shape: A is m rows of `lda` bytes, W n rows of `ldw` bytes, each row holding k
/// values padded to k4 = ⌈k/4⌉ words (W's padding bytes zero).
#[derive(Clone, Copy, Debug)]
pub struct Int8Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub lda: usize,
    pub ldw: usize,
}

impl Int8Shape {
    fn k4(&self) -> usize {
        self.k.div_ceil(4)
    }
    fn check(&self, op: &'static str, a: &DevSlice<'_>, w: &DevSlice<'_>) -> Result<()> {
        let k4 = self.k4();
        if self.k > MAX_K {
            return Err(CudaError::invalid(
                op,
                format!(
                    "k = {} is above {MAX_K}: the i32 sums could overflow",
                    self.k
                ),
            ));
        }
        if !self.lda.is_multiple_of(4)
            || !self.ldw.is_multiple_of(4)
            || self.lda < 4 * k4
            || self.ldw < 4 * k4
        {
            return Err(CudaError::invalid(
                op,
                format!("row strides (lda {}, ldw {}) must be multiples of 4 holding ⌈k/4⌉·4 = {} bytes", self.lda, self.ldw, 4 * k4),
            ));
        }
        if !a.ptr().is_multiple_of(4) || !w.ptr().is_multiple_of(4) {
            return Err(CudaError::invalid(
                op,
                "activations and weights must be 4-byte aligned",
            ));
        }
        let rows_bytes = |rows: usize, ld: usize| {
            if rows == 0 {
                0
            } else {
                (rows - 1) * ld + 4 * k4
            }
        };
        need_dtype(op, "a", a, DType::U8)?;
        need_dtype(op, "w", w, DType::U8)?;
        if a.len() < rows_bytes(self.m, self.lda) || w.len() < rows_bytes(self.n, self.ldw) {
            return Err(CudaError::invalid(
                op,
                format!(
                    "a ({} bytes) or w ({} bytes) too short for {self:?}",
                    a.len(),
                    w.len()
                ),
            ));
        }
        if self.m.div_ceil(TILE) > 65_535 {
            return Err(CudaError::invalid(
                op,
                format!("{} rows: at most {} per launch", self.m, 65_535 * TILE),
            ));
        }
        Ok(())
    }
    fn grid(&self) -> (u32, u32, u32) {
        (
            self.n.div_ceil(TILE).max(1) as u32,
            self.m.div_ceil(TILE).max(1) as u32,
            1,
        )
    }
    fn args(&self) -> [Arg; 5] {
        [
            Arg::I64(self.m as i64),
            Arg::I64(self.n as i64),
            Arg::I64(self.k4() as i64),
            Arg::I64(self.lda as i64),
            Arg::I64(self.ldw as i64),
        ]
    }
}

fn gemm_launch(name: &str, s: &Int8Shape, args: Vec<Arg>) -> Launch {
    let mut l = Launch::new(KernelFile::Int8Gemm, name, 1, BLOCK, args);
    l.grid = s.grid();
    l
}

/// Plan sums[j] = Σ_k w[j, k] (I32 [n]), which both GEMMs need; once per weight.
pub fn plan_int8_weight_sums(
    t: &LaunchTarget,
    w: DevSlice<'_>,
    sums: DevSlice<'_>,
    n: usize,
    k: usize,
    ldw: usize,
) -> Result<Option<Launch>> {
    let op = "int8_weight_sums";
    Int8Shape {
        m: 0,
        n,
        k,
        lda: ldw,
        ldw,
    }
    .check(op, &w, &w)?;
    need(op, "sums", &sums, DType::I32, n)?;
    if n == 0 {
        return Ok(None);
    }
    // One warp per channel.
    let grid = t.grid_for(n * 32, BLOCK);
    Ok(Some(Launch::new(
        KernelFile::Int8Gemm,
        op,
        grid,
        BLOCK,
        vec![
            Arg::Ptr(w.ptr()),
            Arg::Ptr(sums.ptr()),
            Arg::I64(n as i64),
            Arg::I64(k.div_ceil(4) as i64),
            Arg::I64(ldw as i64),
        ],
    )))
}

/// The GEMM's inputs: activations (U8), weights (U8 buffer holding i8) and the weight's
/// channel sums (I32 [n], from [`plan_int8_weight_sums`]).
#[derive(Clone, Copy, Debug)]
pub struct Int8Operands<'a> {
    pub a: DevSlice<'a>,
    pub w: DevSlice<'a>,
    pub sums: DevSlice<'a>,
}

/// Plan out[i, j] = Σ_k a[i, k]·w[j, k] (I32, rows `ldo` apart): the exact accumulators.
pub fn plan_int8_gemm_i32(
    s: &Int8Shape,
    o: &Int8Operands<'_>,
    out: DevSlice<'_>,
    ldo: usize,
) -> Result<Option<Launch>> {
    let op = "int8_gemm_i32";
    let (a, w, sums) = (o.a, o.w, o.sums);
    s.check(op, &a, &w)?;
    need(op, "sums", &sums, DType::I32, s.n)?;
    check_out(op, &out, DType::I32, s, ldo)?;
    if s.m == 0 || s.n == 0 {
        return Ok(None);
    }
    let mut args = vec![
        Arg::Ptr(a.ptr()),
        Arg::Ptr(w.ptr()),
        Arg::Ptr(sums.ptr()),
        Arg::Ptr(out.ptr()),
    ];
    args.extend(s.args());
    args.push(Arg::I64(ldo as i64));
    Ok(Some(gemm_launch(op, s, args)))
}

/// The epilogue's operands: row i's activation mapping is (row_scale, row_zero)[i·row_step]
/// (row_step 1: per row; 0: one static mapping for all rows); w_scale [n] and bias [n] per
/// channel.
#[derive(Clone, Copy, Debug)]
pub struct Int8Epilogue<'a> {
    pub row_scale: DevSlice<'a>,
    pub row_zero: DevSlice<'a>,
    pub per_row: bool,
    pub w_scale: DevSlice<'a>,
    pub bias: Option<DevSlice<'a>>,
    pub act: Int8Activation,
}

/// Plan out[i, j] = act((acc − z_i·Σ_j)·(s_i·w_j) + b_j) (F32, rows `ldo` apart).
pub fn plan_int8_gemm_f32(
    s: &Int8Shape,
    o: &Int8Operands<'_>,
    e: &Int8Epilogue<'_>,
    out: DevSlice<'_>,
    ldo: usize,
) -> Result<Option<Launch>> {
    let op = "int8_gemm_f32";
    let (a, w, sums) = (o.a, o.w, o.sums);
    s.check(op, &a, &w)?;
    need(op, "sums", &sums, DType::I32, s.n)?;
    let rows = if e.per_row { s.m } else { 1 };
    need(op, "row_scale", &e.row_scale, DType::F32, rows)?;
    need(op, "row_zero", &e.row_zero, DType::I32, rows)?;
    need(op, "w_scale", &e.w_scale, DType::F32, s.n)?;
    opt_need(op, "bias", &e.bias, DType::F32, s.n)?;
    check_out(op, &out, DType::F32, s, ldo)?;
    if s.m == 0 || s.n == 0 {
        return Ok(None);
    }
    let mut args = vec![
        Arg::Ptr(a.ptr()),
        Arg::Ptr(w.ptr()),
        Arg::Ptr(sums.ptr()),
        Arg::Ptr(e.row_scale.ptr()),
        Arg::Ptr(e.row_zero.ptr()),
        Arg::I64(e.per_row as i64),
        Arg::Ptr(e.w_scale.ptr()),
        Arg::Ptr(ptr_of(&e.bias)),
        Arg::I32(e.act as i32),
        Arg::Ptr(out.ptr()),
    ];
    args.extend(s.args());
    args.push(Arg::I64(ldo as i64));
    Ok(Some(gemm_launch(op, s, args)))
}

fn check_out(
    op: &'static str,
    out: &DevSlice<'_>,
    d: DType,
    s: &Int8Shape,
    ldo: usize,
) -> Result<()> {
    need_dtype(op, "out", out, d)?;
    if ldo < s.n || (s.m > 0 && out.len() < (s.m - 1) * ldo + s.n) {
        return Err(CudaError::invalid(
            op,
            format!(
                "out ({} elements, ldo {ldo}) does not hold {} × {}",
                out.len(),
                s.m,
                s.n
            ),
        ));
    }
    Ok(())
}

/// sums[j] = Σ_k w[j, k].
pub fn int8_weight_sums(
    dev: &CudaDevice,
    w: DevSlice<'_>,
    sums: DevSlice<'_>,
    n: usize,
    k: usize,
    ldw: usize,
) -> Result<()> {
    dev.run_opt(plan_int8_weight_sums(&dev.target(), w, sums, n, k, ldw)?)
}

/// out = act(dequantize(A·Wᵀ) + bias), f32.
pub fn int8_gemm_f32(
    dev: &CudaDevice,
    s: &Int8Shape,
    o: &Int8Operands<'_>,
    e: &Int8Epilogue<'_>,
    out: DevSlice<'_>,
    ldo: usize,
) -> Result<()> {
    dev.run_opt(plan_int8_gemm_f32(s, o, e, out, ldo)?)
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let s = Int8Shape {
        m: 70,
        n: 33,
        k: 45,
        lda: 48,
        ldw: 48,
    };
    let (a, w) = (
        fake_slice(DType::U8, 70 * 48),
        fake_slice(DType::U8, 33 * 48),
    );
    let sums = fake_slice(DType::I32, 33);
    let e = Int8Epilogue {
        row_scale: fake_slice(DType::F32, 70),
        row_zero: fake_slice(DType::I32, 70),
        per_row: true,
        w_scale: fake_slice(DType::F32, 33),
        bias: Some(fake_slice(DType::F32, 33)),
        act: Int8Activation::GeluTanh,
    };
    let mut v = Vec::new();
    v.extend(plan_int8_weight_sums(t, w, sums, 33, 45, 48).unwrap());
    let o = Int8Operands { a, w, sums };
    v.extend(plan_int8_gemm_i32(&s, &o, fake_slice(DType::I32, 70 * 33), 33).unwrap());
    v.extend(plan_int8_gemm_f32(&s, &o, &e, fake_slice(DType::F32, 70 * 33), 33).unwrap());
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_tile_the_output_and_refuse_bad_shapes() {
        let t = LaunchTarget { sm_count: 4 };
        let plans = samples(&t);
        assert_eq!(plans.len(), 3);
        assert_eq!(plans[1].grid, (1, 2, 1));
        for p in &plans {
            p.validate().unwrap();
        }
        let s = Int8Shape {
            m: 2,
            n: 2,
            k: 5,
            lda: 6,
            ldw: 8,
        };
        let (a, w) = (fake_slice(DType::U8, 16), fake_slice(DType::U8, 16));
        let sums = fake_slice(DType::I32, 2);
        let e = plan_int8_gemm_i32(
            &s,
            &Int8Operands { a, w, sums },
            fake_slice(DType::I32, 4),
            2,
        )
        .unwrap_err();
        assert!(e.to_string().contains("multiples of 4"), "{e}");
        let s = Int8Shape { lda: 8, ..s };
        let e = plan_int8_gemm_i32(
            &s,
            &Int8Operands { a, w, sums },
            fake_slice(DType::I32, 3),
            2,
        )
        .unwrap_err();
        assert!(e.to_string().contains("does not hold"), "{e}");
        let big = Int8Shape {
            m: 1,
            n: 1,
            k: MAX_K + 1,
            lda: MAX_K + 4,
            ldw: MAX_K + 4,
        };
        let big_ops = Int8Operands {
            a: fake_slice(DType::U8, MAX_K + 4),
            w: fake_slice(DType::U8, MAX_K + 4),
            sums: fake_slice(DType::I32, 1),
        };
        assert!(plan_int8_gemm_i32(&big, &big_ops, fake_slice(DType::I32, 1), 1).is_err());
    }
}
