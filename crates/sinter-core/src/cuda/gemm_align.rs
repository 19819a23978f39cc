//! Zero-padded copies for cuBLASLt GEMMs whose sizes or rows are not 16-byte aligned.
//!
//! cuBLASLt's Hopper kernels (TMA loads: the `nvjet_sm90` family) need each matrix's base
//! pointer, leading dimension and batch stride to be multiples of 16 bytes (the cuBLAS guide's
//! Tensor Core usage rules), and in practice m, n and k too; otherwise its heuristic falls back to
//! Turing-era `align1` kernels. Measured on an H100 (session 6, bf16, 16384 rows x 768): GPT-2's
//! LM head with vocab 50257 ran each of its three GEMMs at 8-13 ms on
//! `cutlass_75_tensorop_bf16_s1688gemm_bf16_256x128_nn_align1`; PyTorch's same GEMMs with the
//! vocab padded to 50264 took 1.6-1.9 ms (4.6-6.8x faster), while padding only the leading
//! dimension (m, n, k unchanged) kept the slow kernel, and made sinter's GPT-2 training slower
//! (125.7k vs 138.2k tok/s without it).
//!
//! So a large GEMM runs with each misaligned m, n, k rounded up ([`aligned_ld`]) on copies of its
//! operands: A and B are gathered into zero-padded buffers (the zeros of a padded k add nothing
//! to the sums), C is computed into a padded buffer and its first m x n block copied back into
//! the packed result. An operand misaligned only in its pointer, leading dimension or batch
//! stride is copied to an aligned leading dimension. [`plan`] is the one place of the rule.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, Epilogue, GemmDesc, GemmShape};

use super::{alloc, alloc_zeros, GemmPadding, OnOp};
use crate::Result;

/// Alignment (bytes) of sizes, base pointers, leading dimensions and batch strides that
/// cuBLASLt's fast kernels need.
pub(crate) const ALIGN_BYTES: usize = 16;

/// GEMMs under this many multiply-adds keep their misaligned shapes (Auto). The slow kernel
/// costs about 1e-14 to 1.75e-14 s more per multiply-add than the fast one (H100 bf16, GPT-2's
/// LM head, 6.3e11 multiply-adds: 8.2-13.0 ms unpadded vs 1.6-1.9 ms padded, PyTorch), so 2^28
/// of them save ~3-5 µs: about the fixed cost (launches, allocations, tails) of the copies.
pub(crate) const MIN_MACS: u64 = 1 << 28;

/// Multiply-adds per copied byte a padded GEMM must have (Auto). A copy moves each byte twice
/// (read, write) at ~2.5 TB/s: 8e-13 s per byte, the time of 8e-13 / 1e-14 = 80 saved
/// multiply-adds at the smaller measured saving. 128 asks for a clear win; GPT-2's LM head has
/// ~365 (its 1.6 GB of bf16 logits plus the 77 MB embedding, per 6.3e11 multiply-adds).
pub(crate) const MIN_MACS_PER_COPIED_BYTE: u64 = 128;

/// GEMMs with a dimension under this are left as they are (Auto): they leave tensor-core tiles
/// mostly empty and are bound by memory, where the copies cost more than the kernel choice.
pub(crate) const MIN_DIM: usize = 128;

/// `ld` (a size or leading dimension, in elements of `esize` bytes) rounded up to a multiple of
/// [`ALIGN_BYTES`].
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

/// How a GEMM runs padded: its m, n, k as computed (rounded up where misaligned) and the leading
/// dimension of each operand's zero-padded copy (None: the operand is used as it is).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct PadPlan {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: Option<usize>,
    pub b: Option<usize>,
    pub c: Option<usize>,
}

/// How the row-major GEMM `s` runs padded, or None to run it as it is. `ptrs`: the base
/// addresses of A, B and C; `c_movable`: whether C may be computed elsewhere and copied back (it
/// is packed, not read, and no epilogue reads or writes a vector or matrix sized by n). Without
/// it, m and n keep their sizes; k may always be padded (with zeros in A and B).
pub(crate) fn plan(
    s: &GemmShape,
    esize: usize,
    ptrs: [u64; 3],
    c_movable: bool,
    mode: GemmPadding,
) -> Option<PadPlan> {
    if mode == GemmPadding::Never || s.m == 0 || s.n == 0 || s.k == 0 {
        return None;
    }
    let round = |d: usize| aligned_ld(esize, d);
    let (m, n) = if c_movable {
        (round(s.m), round(s.n))
    } else {
        (s.m, s.n)
    };
    let padded = GemmShape {
        m,
        n,
        k: round(s.k),
        ..*s
    };
    let ix = s.indexing();
    let batched = s.batch > 1;
    let lds = [ix.lda, ix.ldb, ix.ldc];
    let strides = [ix.stride_a, ix.stride_b, ix.stride_c];
    let mut copied_bytes = 0u64;
    let mut new_ld = [None; 3];
    let stored = s.stored();
    for (i, &(rows, cols)) in padded.stored().iter().enumerate() {
        let stride = batched.then_some(strides[i]);
        let resized = (rows, cols) != stored[i];
        if (i == 2 && !c_movable) || (!resized && is_aligned(esize, ptrs[i], lds[i], stride)) {
            continue;
        }
        new_ld[i] = Some(round(cols));
        // A batch that shares one matrix (stride 0) copies it once.
        let copies = if stride == Some(0) { 1 } else { s.batch };
        let (r, c) = stored[i];
        copied_bytes += (copies * r * c * esize) as u64;
    }
    // Measured: padding the leading dimensions alone keeps the slow kernel, so Auto pads only
    // where every size ends up aligned.
    let sizes_aligned = [m, n, padded.k].into_iter().all(|d| round(d) == d);
    let pays = || {
        let macs = (s.batch as u64)
            .saturating_mul(s.m as u64)
            .saturating_mul(s.n as u64)
            .saturating_mul(s.k as u64);
        sizes_aligned
            && s.m.min(s.n).min(s.k) >= MIN_DIM
            && macs >= MIN_MACS
            && macs >= MIN_MACS_PER_COPIED_BYTE.saturating_mul(copied_bytes)
    };
    if copied_bytes == 0 || (mode == GemmPadding::Auto && !pays()) {
        return None;
    }
    Some(PadPlan {
        m: padded.m,
        n: padded.n,
        k: padded.k,
        a: new_ld[0],
        b: new_ld[1],
        c: new_ld[2],
    })
}

/// A copy of `batch` row-major `from` = (rows, cols) matrices (leading dimension `ld`, `stride`
/// apart; 0 = one shared matrix) as `to` = (rows, cols) >= `from` matrices with leading dimension
/// `new_ld`, zero outside the data: the copy, its leading dimension and its batch stride (None
/// when the plan leaves the operand as it is).
fn repack(
    dev: &CudaDevice,
    src: DevSlice<'_>,
    batch: usize,
    (from, to): ((usize, usize), (usize, usize)),
    (ld, stride): (usize, usize),
    new_ld: Option<usize>,
) -> Result<Option<(Arc<DeviceBuffer>, usize, usize)>> {
    let Some(new_ld) = new_ld else {
        return Ok(None);
    };
    let ((rows, cols), (new_rows, _)) = (from, to);
    let (copies, new_stride) = if batch > 1 && stride == 0 {
        (1, 0)
    } else {
        (batch, new_rows * new_ld)
    };
    let out = alloc(dev, copies * new_rows * new_ld, src.dtype())?;
    let dst_strides = [(new_rows * new_ld) as i64, new_ld as i64, 1];
    let copy = sinter_cuda::ops::copy::strided_copy;
    copy(
        dev,
        src,
        &[stride as i64, ld as i64, 1],
        out.as_slice(),
        &dst_strides,
        &[copies, rows, cols],
    )
    .on("padded gemm")?;
    // The padding: right of the data in its rows, then the rows below, from one zero.
    let zero = alloc_zeros(dev, 1, src.dtype())?;
    for (offset, shape) in [
        (cols, [copies, rows, new_ld - cols]),
        (rows * new_ld, [copies, new_rows - rows, new_ld]),
    ] {
        if shape.contains(&0) {
            continue;
        }
        let dst = out.slice(offset, out.len() - offset).on("padded gemm")?;
        copy(dev, zero.as_slice(), &[0; 3], dst, &dst_strides, &shape).on("padded gemm")?;
    }
    Ok(Some((out, new_ld, new_stride)))
}

/// Run `desc` through cuBLASLt, padded where [`plan`] says so under the process's
/// [`GemmPadding`] (C counts as movable when it is packed, `beta` is 0 and the epilogue has no
/// bias vector or aux matrix: those are sized by n).
pub(crate) fn gemm(dev: &CudaDevice, desc: &GemmDesc<'_>, op: &'static str) -> Result<()> {
    let s = desc.shape;
    let ix = s.indexing();
    let c_movable = desc.beta == 0.0
        && matches!(desc.epilogue, Epilogue::None | Epilogue::Gelu)
        && ix.ldc == s.n.max(1)
        && (s.batch <= 1 || ix.stride_c == s.m * s.n);
    let esize = desc.dtype.storage().size();
    let ptrs = [desc.a.ptr(), desc.b.ptr(), desc.c.ptr()];
    let Some(p) = plan(&s, esize, ptrs, c_movable, super::gemm_padding()) else {
        return dev.gemm(desc).on(op);
    };
    super::PADDED_GEMMS.fetch_add(1, Ordering::Relaxed);
    let mut padded = GemmShape {
        m: p.m,
        n: p.n,
        k: p.k,
        ..s
    };
    let [da, db, _] = s.stored();
    let [pa, pb, _] = padded.stored();
    let mut g = *desc;
    let batched = |stride: usize| (s.batch > 1).then_some(stride);
    let a_copy = repack(dev, desc.a, s.batch, (da, pa), (ix.lda, ix.stride_a), p.a)?;
    if let Some((buf, ld, stride)) = &a_copy {
        (padded.lda, padded.stride_a, g.a) = (Some(*ld), batched(*stride), buf.as_slice());
    }
    let b_copy = repack(dev, desc.b, s.batch, (db, pb), (ix.ldb, ix.stride_b), p.b)?;
    if let Some((buf, ld, stride)) = &b_copy {
        (padded.ldb, padded.stride_b, g.b) = (Some(*ld), batched(*stride), buf.as_slice());
    }
    let Some(ldc) = p.c else {
        g.shape = padded;
        return dev.gemm(&g).on(op);
    };
    let c_pad = alloc(dev, s.batch * p.m * ldc, desc.c.dtype())?;
    padded.ldc = Some(ldc);
    padded.stride_c = batched(p.m * ldc);
    g.shape = padded;
    g.c = c_pad.as_slice();
    dev.gemm(&g).on(op)?;
    sinter_cuda::ops::copy::strided_copy(
        dev,
        c_pad.as_slice(),
        &[(p.m * ldc) as i64, ldc as i64, 1],
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

    fn auto(s: &GemmShape, esize: usize) -> Option<PadPlan> {
        plan(s, esize, [P; 3], true, GemmPadding::Auto)
    }

    fn always(s: &GemmShape, ptrs: [u64; 3]) -> Option<PadPlan> {
        plan(s, BF16, ptrs, true, GemmPadding::Always)
    }

    /// The plan that keeps `s`'s sizes and copies the operands given new leading dimensions.
    fn relaid(s: &GemmShape, [a, b, c]: [Option<usize>; 3]) -> PadPlan {
        PadPlan {
            m: s.m,
            n: s.n,
            k: s.k,
            a,
            b,
            c,
        }
    }

    #[test]
    fn sizes_and_leading_dims_round_up_to_16_bytes() {
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

    /// GPT-2's LM head at batch 16 x context 1024 (16384 rows, vocab 50257, width 768): the
    /// vocab is padded to 50264 wherever it is m, n or k.
    #[test]
    fn gpt2_lm_head_gemms_pad_the_vocab() {
        let (rows, vocab, c) = (16384, 50257, 768);
        // logits = x · wteᵀ: n = vocab. wte (B, stored [n, k]) gains 7 zero rows, the logits
        // are computed 50264 wide and copied back.
        let fwd = GemmShape::new(rows, vocab, c).trans(false, true);
        let padded = PadPlan {
            m: rows,
            n: 50264,
            k: c,
            a: None,
            b: Some(c),
            c: Some(50264),
        };
        assert_eq!(auto(&fwd, BF16), Some(padded));
        // dx = dlogits · wte: k = vocab. dlogits gains 7 zero columns, wte 7 zero rows.
        let dx = GemmShape::new(rows, c, vocab);
        let padded = PadPlan {
            m: rows,
            n: c,
            k: 50264,
            a: Some(50264),
            b: Some(c),
            c: None,
        };
        assert_eq!(auto(&dx, BF16), Some(padded));
        // dwte = dlogitsᵀ · x: m = vocab, A read transposed from [rows, vocab] gains 7 zero
        // columns; dwte is computed with 50264 rows and its first 50257 copied back.
        let dw = GemmShape::new(vocab, c, rows).trans(true, false);
        let padded = PadPlan {
            m: 50264,
            n: c,
            k: rows,
            a: Some(50264),
            b: None,
            c: Some(c),
        };
        assert_eq!(auto(&dw, BF16), Some(padded));
        // The same gradient as xᵀ · dlogits (then transposed): n = vocab, B and C are padded.
        let dwt = GemmShape::new(c, vocab, rows).trans(true, false);
        let padded = PadPlan {
            m: c,
            n: 50264,
            k: rows,
            a: None,
            b: Some(50264),
            c: Some(50264),
        };
        assert_eq!(auto(&dwt, BF16), Some(padded));
        // f32 sizes round to 4 elements.
        assert_eq!(
            auto(&fwd, 4).map(|p| (p.n, p.c)),
            Some((50260, Some(50260)))
        );
        // The aligned GEMMs of the same step are left alone.
        let qkv = GemmShape::new(rows, 3 * c, c).trans(false, true);
        assert_eq!(auto(&qkv, BF16), None);
    }

    #[test]
    fn odd_sizes_pad_the_operands_they_shape() {
        // m odd: A (rows) and C.
        let s = GemmShape::new(5, 16, 24);
        let p = always(&s, [P; 3]).unwrap();
        assert_eq!((p.m, p.n, p.k), (8, 16, 24));
        assert_eq!((p.a, p.b, p.c), (Some(24), None, Some(16)));
        // m odd with A transposed (stored [k, m]): A's columns.
        let p = always(&s.trans(true, false), [P; 3]).unwrap();
        assert_eq!((p.a, p.b, p.c), (Some(8), None, Some(16)));
        // k odd: A and B, whichever way they are stored, and not C.
        let s = GemmShape::new(16, 24, 7);
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let p = always(&s.trans(ta, tb), [P; 3]).unwrap();
            assert_eq!((p.m, p.n, p.k), (16, 24, 8), "{ta} {tb}");
            assert!(p.a.is_some() && p.b.is_some() && p.c.is_none(), "{ta} {tb}");
        }
        // A C that may not move keeps m and n; k is still padded.
        let s = GemmShape::new(5, 9, 7);
        let p = plan(&s, BF16, [P; 3], false, GemmPadding::Always).unwrap();
        assert_eq!((p.m, p.n, p.k, p.c), (5, 9, 8, None));
        assert_eq!((p.a, p.b), (Some(8), Some(16)), "B keeps n = 9 columns");
        // ... and under Auto it stays as it is: n would remain misaligned, and measured, only
        // aligned sizes get the fast kernels.
        let big = GemmShape::new(4096, 4095, 4095);
        let pinned = plan(&big, BF16, [P; 3], false, GemmPadding::Auto);
        assert_eq!(pinned, None);
        assert_eq!(auto(&big, BF16).map(|p| (p.n, p.k)), Some((4096, 4096)));
    }

    #[test]
    fn small_or_thin_gemms_keep_their_layout() {
        // Under MIN_MACS.
        let small = GemmShape::new(256, 257, 256);
        assert_eq!(auto(&small, BF16), None);
        assert_eq!(
            always(&small, [P; 3]).map(|p| (p.n, p.c)),
            Some((264, Some(264)))
        );
        // Large but thin: n = 3 is memory-bound.
        let thin = GemmShape::new(1 << 20, 3, 768);
        assert_eq!(auto(&thin, BF16), None);
        // Large, but too few multiply-adds per copied byte (k = 128 over 2-byte elements: 64).
        let shallow = GemmShape::new(16384, 50257, 128).trans(false, true);
        assert_eq!(auto(&shallow, BF16), None);
        // Never means never.
        let fwd = GemmShape::new(16384, 50257, 768).trans(false, true);
        assert_eq!(plan(&fwd, BF16, [P; 3], true, GemmPadding::Never), None);
        // Nothing to pad in an empty product.
        assert_eq!(always(&GemmShape::new(5, 0, 7), [P; 3]), None);
    }

    #[test]
    fn pointers_and_batch_strides_count() {
        let s = GemmShape::new(512, 512, 512);
        assert_eq!(always(&s, [P; 3]), None);
        // A view starting 3 elements into its buffer: copied, sizes as they are.
        assert_eq!(
            always(&s, [P + 6, P, P]),
            Some(relaid(&s, [Some(512), None, None]))
        );
        // ... under Auto too (every size is aligned, so the copy gets the fast kernel).
        let big = GemmShape::new(4096, 4096, 4096);
        let p = plan(&big, BF16, [P, P + 2, P], true, GemmPadding::Auto);
        assert_eq!(p, Some(relaid(&big, [None, Some(4096), None])));
        // Batches 512 * 513 elements apart: every matrix but the first is misaligned.
        let batched = GemmShape {
            ldb: Some(513),
            stride_b: Some(512 * 513),
            ..GemmShape::new(512, 512, 512).batched(4)
        };
        assert_eq!(always(&batched, [P; 3]).and_then(|p| p.b), Some(512));
        // A shared (stride 0) right matrix with aligned rows is fine as it is.
        let shared = GemmShape {
            stride_b: Some(0),
            ..GemmShape::new(512, 512, 512).batched(4)
        };
        assert_eq!(always(&shared, [P; 3]), None);
        // Copied once: with k = 4096 the shared B's bytes are few next to the multiply-adds.
        let shared_odd = GemmShape {
            stride_b: Some(0),
            ..GemmShape::new(4096, 4095, 4096).batched(8)
        };
        let p = auto(&shared_odd, BF16).unwrap();
        assert_eq!((p.n, p.b, p.c), (4096, Some(4096), Some(4096)));
    }
}
