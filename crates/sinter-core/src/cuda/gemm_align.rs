//! Padded copies for cuBLASLt operands whose rows are not 16-byte aligned.
//!
//! cuBLASLt's Hopper kernels (TMA loads: the `nvjet_sm90` family) need each matrix's base
//! pointer, leading dimension and batch stride to be multiples of 16 bytes (the cuBLAS guide's
//! Tensor Core usage rules); otherwise its heuristic falls back to Turing-era `align1` kernels.
//! Measured on an H100 (bench/gpu, session 6): GPT-2's LM head, whose vocab 50257 makes the
//! logits' leading dimension odd, ran each of its three GEMMs at 10-12 ms on
//! `cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nn_align1`.
//!
//! So a large GEMM runs on copies whose leading dimension is rounded up ([`aligned_ld`]): a
//! misaligned A or B is gathered into one, a misaligned C is computed into one and copied back
//! into the packed result. m, n and k are unchanged, so cuBLASLt never reads the padding, which
//! is left as allocated. [`plan`] is the one place of the rule.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, Epilogue, GemmDesc, GemmShape};

use super::{alloc, GemmPadding, OnOp};
use crate::Result;

/// Alignment (bytes) of base pointers, leading dimensions and batch strides that cuBLASLt's
/// fast kernels need.
pub(crate) const ALIGN_BYTES: usize = 16;

/// GEMMs under this many multiply-adds keep their misaligned operands (Auto). The slow kernel
/// costs about 1.3e-14 s more per multiply-add than the fast one (H100 bf16: the align1 LM head
/// ran at ~126 TFLOPS, nvjet GEMMs at ~600), so 2^28 of them save ~3 µs: about the fixed cost
/// (launch, allocation, tail) of the copy kernels. Below it the copies cost more than they save.
pub(crate) const MIN_MACS: u64 = 1 << 28;

/// Multiply-adds per copied byte a padded GEMM must have (Auto). A copy moves each byte twice
/// (read, write) at ~2.5 TB/s: 8e-13 s per byte, the time of 8e-13 / 1.3e-14 ≈ 64 saved
/// multiply-adds. Twice that asks for a clear win; GPT-2's LM head has 384 (k = 768 per
/// 2-byte logit).
pub(crate) const MIN_MACS_PER_COPIED_BYTE: u64 = 128;

/// GEMMs with a dimension under this are left as they are (Auto): they leave tensor-core tiles
/// mostly empty and are bound by memory, where the copies cost more than the kernel choice.
pub(crate) const MIN_DIM: usize = 128;

/// `ld` (in elements of `esize` bytes) rounded up to a multiple of [`ALIGN_BYTES`].
pub(crate) fn aligned_ld(esize: usize, ld: usize) -> usize {
    let q = (ALIGN_BYTES / esize).max(1);
    ld.div_ceil(q) * q
}

/// True when an operand at `ptr` with leading dimension `ld` (and batch stride `stride`, when
/// batched) meets cuBLASLt's alignment rule.
fn is_aligned(esize: usize, ptr: u64, ld: usize, stride: Option<usize>) -> bool {
    let ok = |elems: usize| (elems * esize).is_multiple_of(ALIGN_BYTES);
    ptr.is_multiple_of(ALIGN_BYTES as u64) && ok(ld) && stride.is_none_or(ok)
}

/// The new leading dimension of each operand that runs on a padded copy (None: as it is).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PadPlan {
    pub a: Option<usize>,
    pub b: Option<usize>,
    pub c: Option<usize>,
}

/// Which operands of the row-major GEMM `s` run on padded copies. `ptrs`: the base addresses of
/// A, B and C; `c_movable`: whether C may be computed elsewhere and copied back (it is packed,
/// not read, and no epilogue writes another matrix at its layout).
pub(crate) fn plan(
    s: &GemmShape,
    esize: usize,
    ptrs: [u64; 3],
    c_movable: bool,
    mode: GemmPadding,
) -> PadPlan {
    if mode == GemmPadding::Never {
        return PadPlan::default();
    }
    let ix = s.indexing();
    let batched = s.batch > 1;
    let lds = [ix.lda, ix.ldb, ix.ldc];
    let strides = [ix.stride_a, ix.stride_b, ix.stride_c];
    let mut copied_bytes = 0u64;
    let mut new_ld = [None; 3];
    for (i, &(rows, cols)) in s.stored().iter().enumerate() {
        let stride = batched.then_some(strides[i]);
        if (i == 2 && !c_movable) || is_aligned(esize, ptrs[i], lds[i], stride) {
            continue;
        }
        new_ld[i] = Some(aligned_ld(esize, cols.max(1)));
        // A batch that shares one matrix (stride 0) copies it once.
        let copies = if stride == Some(0) { 1 } else { s.batch };
        copied_bytes += (copies * rows * cols * esize) as u64;
    }
    let pays = || {
        let macs = (s.batch as u64)
            .saturating_mul(s.m as u64)
            .saturating_mul(s.n as u64)
            .saturating_mul(s.k as u64);
        s.m.min(s.n).min(s.k) >= MIN_DIM
            && macs >= MIN_MACS
            && macs >= MIN_MACS_PER_COPIED_BYTE.saturating_mul(copied_bytes)
    };
    if copied_bytes == 0 || (mode == GemmPadding::Auto && !pays()) {
        return PadPlan::default();
    }
    PadPlan {
        a: new_ld[0],
        b: new_ld[1],
        c: new_ld[2],
    }
}

/// A copy of `batch` row-major rows x cols matrices (leading dimension `ld`, `stride` apart; 0 =
/// one shared matrix) with leading dimension `new_ld`: the copy, its leading dimension and its
/// batch stride (None when the plan leaves the operand as it is).
fn repack(
    dev: &CudaDevice,
    src: DevSlice<'_>,
    batch: usize,
    (rows, cols): (usize, usize),
    (ld, stride): (usize, usize),
    new_ld: Option<usize>,
) -> Result<Option<(Arc<DeviceBuffer>, usize, usize)>> {
    let Some(new_ld) = new_ld else {
        return Ok(None);
    };
    let (copies, new_stride) = if batch > 1 && stride == 0 {
        (1, 0)
    } else {
        (batch, rows * new_ld)
    };
    let out = alloc(dev, copies * rows * new_ld, src.dtype())?;
    sinter_cuda::ops::copy::strided_copy(
        dev,
        src,
        &[stride as i64, ld as i64, 1],
        out.as_slice(),
        &[(rows * new_ld) as i64, new_ld as i64, 1],
        &[copies, rows, cols],
    )
    .on("padded gemm")?;
    Ok(Some((out, new_ld, new_stride)))
}

/// Run `desc` through cuBLASLt, on padded copies where [`plan`] says so under the process's
/// [`GemmPadding`] (C counts as movable when it is packed, `beta` is 0 and the epilogue writes
/// no aux matrix).
pub(crate) fn gemm(dev: &CudaDevice, desc: &GemmDesc<'_>, op: &'static str) -> Result<()> {
    let s = desc.shape;
    let ix = s.indexing();
    let c_movable = desc.beta == 0.0
        && !matches!(desc.epilogue, Epilogue::BiasGeluAux { .. })
        && ix.ldc == s.n.max(1)
        && (s.batch <= 1 || ix.stride_c == s.m * s.n);
    let esize = desc.dtype.storage().size();
    let ptrs = [desc.a.ptr(), desc.b.ptr(), desc.c.ptr()];
    let p = plan(&s, esize, ptrs, c_movable, super::gemm_padding());
    if p == PadPlan::default() {
        return dev.gemm(desc).on(op);
    }
    super::PADDED_GEMMS.fetch_add(1, Ordering::Relaxed);
    let [da, db, _] = s.stored();
    let mut padded = s;
    let mut g = *desc;
    let batched = |stride: usize| (s.batch > 1).then_some(stride);
    let a_copy = repack(dev, desc.a, s.batch, da, (ix.lda, ix.stride_a), p.a)?;
    if let Some((buf, ld, stride)) = &a_copy {
        (padded.lda, padded.stride_a, g.a) = (Some(*ld), batched(*stride), buf.as_slice());
    }
    let b_copy = repack(dev, desc.b, s.batch, db, (ix.ldb, ix.stride_b), p.b)?;
    if let Some((buf, ld, stride)) = &b_copy {
        (padded.ldb, padded.stride_b, g.b) = (Some(*ld), batched(*stride), buf.as_slice());
    }
    let Some(ldc) = p.c else {
        g.shape = padded;
        return dev.gemm(&g).on(op);
    };
    let c_pad = alloc(dev, s.batch * s.m * ldc, desc.c.dtype())?;
    padded.ldc = Some(ldc);
    padded.stride_c = batched(s.m * ldc);
    g.shape = padded;
    g.c = c_pad.as_slice();
    dev.gemm(&g).on(op)?;
    sinter_cuda::ops::copy::strided_copy(
        dev,
        c_pad.as_slice(),
        &[(s.m * ldc) as i64, ldc as i64, 1],
        desc.c,
        &[(s.m * s.n) as i64, s.n as i64, 1],
        &[s.batch, s.m, s.n],
    )
    .on(op)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x7f00_0000_0000; // an aligned base address
    const BF16: usize = 2;

    fn auto(s: &GemmShape, esize: usize) -> PadPlan {
        plan(s, esize, [P; 3], true, GemmPadding::Auto)
    }

    #[test]
    fn leading_dims_round_up_to_16_bytes() {
        assert_eq!(aligned_ld(BF16, 50257), 50264);
        assert_eq!(aligned_ld(BF16, 50264), 50264);
        assert_eq!(aligned_ld(BF16, 30522), 30528);
        assert_eq!(aligned_ld(BF16, 1), 8);
        assert_eq!(aligned_ld(4, 50257), 50260);
        assert_eq!(aligned_ld(4, 768), 768);
        assert_eq!(aligned_ld(8, 3), 4);
        for esize in [1, 2, 4, 8] {
            for ld in 1..100 {
                let r = aligned_ld(esize, ld);
                assert!(
                    r >= ld && (r * esize).is_multiple_of(ALIGN_BYTES),
                    "{esize} {ld} -> {r}"
                );
                assert!(
                    (r - ld) * esize < ALIGN_BYTES,
                    "{esize} {ld} -> {r}: too much"
                );
            }
        }
    }

    /// GPT-2's LM head at batch 16 x context 1024 (n = 16384 rows, vocab 50257, width 768).
    #[test]
    fn gpt2_lm_head_gemms_are_padded() {
        let (rows, vocab, c) = (16384, 50257, 768);
        // logits = x · wteᵀ: only the output is misaligned.
        let fwd = GemmShape::new(rows, vocab, c).trans(false, true);
        assert_eq!(
            auto(&fwd, BF16),
            PadPlan {
                a: None,
                b: None,
                c: Some(50264)
            }
        );
        // dx = dlogits · wte: A (k = vocab) is misaligned.
        let dx = GemmShape::new(rows, c, vocab);
        assert_eq!(
            auto(&dx, BF16),
            PadPlan {
                a: Some(50264),
                ..PadPlan::default()
            }
        );
        // dwte = dlogitsᵀ · x: A is read transposed from [rows, vocab].
        let dw = GemmShape::new(vocab, c, rows).trans(true, false);
        assert_eq!(
            auto(&dw, BF16),
            PadPlan {
                a: Some(50264),
                ..PadPlan::default()
            }
        );
        // The same gradient as xᵀ · dlogits (then transposed): B and C are misaligned.
        let dwt = GemmShape::new(c, vocab, rows).trans(true, false);
        assert_eq!(
            auto(&dwt, BF16),
            PadPlan {
                a: None,
                b: Some(50264),
                c: Some(50264)
            }
        );
        // f32 rows of 50257 are misaligned too (4 elements per 16 bytes).
        assert_eq!(auto(&fwd, 4).c, Some(50260));
        // The aligned GEMMs of the same step are left alone.
        let qkv = GemmShape::new(rows, 3 * c, c).trans(false, true);
        assert_eq!(auto(&qkv, BF16), PadPlan::default());
    }

    #[test]
    fn small_or_thin_gemms_keep_their_layout() {
        // Under MIN_MACS.
        let small = GemmShape::new(256, 257, 256);
        assert_eq!(auto(&small, BF16), PadPlan::default());
        assert_eq!(
            plan(&small, BF16, [P; 3], true, GemmPadding::Always).c,
            Some(264)
        );
        // Large but thin: n = 3 is memory-bound.
        let thin = GemmShape::new(1 << 20, 3, 768);
        assert_eq!(auto(&thin, BF16), PadPlan::default());
        // Large, but too few multiply-adds per copied byte (k = 128 over 2-byte elements: 64).
        let shallow = GemmShape::new(16384, 50257, 128).trans(false, true);
        assert_eq!(auto(&shallow, BF16), PadPlan::default());
        // Never means never.
        let fwd = GemmShape::new(16384, 50257, 768).trans(false, true);
        assert_eq!(
            plan(&fwd, BF16, [P; 3], true, GemmPadding::Never),
            PadPlan::default()
        );
        // A C that may not move (read by beta, or written by an aux epilogue) stays.
        assert_eq!(
            plan(&fwd, BF16, [P; 3], false, GemmPadding::Always),
            PadPlan::default()
        );
    }

    #[test]
    fn pointers_and_batch_strides_count() {
        let s = GemmShape::new(512, 512, 512);
        let always = |s: &GemmShape, ptrs| plan(s, BF16, ptrs, true, GemmPadding::Always);
        assert_eq!(always(&s, [P; 3]), PadPlan::default());
        // A view starting 3 elements into its buffer.
        assert_eq!(
            always(&s, [P + 6, P, P]),
            PadPlan {
                a: Some(512),
                ..PadPlan::default()
            }
        );
        // Batches 512 * 513 elements apart: every matrix but the first is misaligned.
        let batched = GemmShape {
            ldb: Some(513),
            stride_b: Some(512 * 513),
            ..GemmShape::new(512, 512, 512).batched(4)
        };
        assert_eq!(always(&batched, [P; 3]).b, Some(512));
        // A shared (stride 0) right matrix with aligned rows is fine as it is.
        let shared = GemmShape {
            stride_b: Some(0),
            ..GemmShape::new(512, 512, 512).batched(4)
        };
        assert_eq!(always(&shared, [P; 3]), PadPlan::default());
        // Copied once: with k = 4096 the shared B's bytes are few next to the multiply-adds.
        let shared_odd = GemmShape {
            stride_b: Some(0),
            ..GemmShape::new(4096, 4095, 4096).batched(8)
        };
        assert_eq!(auto(&shared_odd, BF16).b, Some(4096));
    }
}
