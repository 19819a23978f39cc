//! Packing: copies a block of an operand into the layout the micro-kernel reads, so its
//! inner loop sees unit-stride, cache-resident data whatever the operand's strides were.
//!
//! Layout ("panels"): the block's free dimension (rows of A or columns of B) is cut into
//! panels of `width` (MR for A, NR for B); panel `p` holds, for each k in 0..kc, the `width`
//! values of that k consecutively, at `p · width · kc`. A last partial panel is padded with
//! zeros, so the micro-kernel never branches on edges. A prepacked operand ([`super::PackedB`])
//! is the same layout, block after block.

use crate::im2col::copy_short;

/// A strided source block: element (f, k) at `ptr + f·fs + k·ks` (f along the free dimension).
#[derive(Clone, Copy)]
pub(crate) struct Src {
    pub ptr: *const f32,
    pub fs: isize,
    pub ks: isize,
}

/// Packs `free` × `kc` values of `src` into `dst` (at least `free.div_ceil(width)·width·kc`).
/// `avx`: the caller's kernels run on AVX2 or AVX-512, so a k-contiguous source may be
/// transposed in 8 × 8 register blocks (see [`transpose_rows_x86`]).
///
/// # Safety
/// Every (f, k) with f < free, k < kc must address a readable element of `src`; with `avx`
/// the CPU has AVX.
#[inline(always)]
pub(crate) unsafe fn pack_panels(
    src: Src,
    free: usize,
    kc: usize,
    width: usize,
    dst: &mut [f32],
    avx: bool,
) {
    let panels = free.div_ceil(width);
    debug_assert!(dst.len() >= panels * width * kc);
    for p in 0..panels {
        let f0 = p * width;
        let w = width.min(free - f0);
        let out = &mut dst[p * width * kc..(p + 1) * width * kc];
        let base = src.ptr.offset(f0 as isize * src.fs);
        if src.fs == 1 {
            // The free dimension is contiguous: one short copy per k, in fixed-size pieces
            // (a `memcpy` call per 16–32 values costs more than the copy).
            for k in 0..kc {
                let from = std::slice::from_raw_parts(base.offset(k as isize * src.ks), w);
                let to = &mut out[k * width..k * width + width];
                copy_short(&mut to[..w], from);
                to[w..].fill(0.0);
            }
        } else if src.ks == 1 && width <= 32 {
            // k is contiguous (a transposing copy).
            #[cfg(target_arch = "x86_64")]
            let done = if avx && w == width && width.is_multiple_of(8) {
                transpose_rows_x86(base, src.fs, width, kc, (out, width))
            } else {
                0
            };
            #[cfg(not(target_arch = "x86_64"))]
            let done = {
                let _ = avx;
                0
            };
            // The rest (all of it without AVX): one pointer per row of the panel, walking k,
            // so each row is read sequentially and the panel written in order.
            let mut rows = [base; 32];
            for (f, r) in rows.iter_mut().enumerate().take(w) {
                *r = base.offset(f as isize * src.fs);
            }
            for k in done..kc {
                let to = &mut out[k * width..(k + 1) * width];
                for f in 0..w {
                    to[f] = *rows[f].add(k);
                }
                to[w..].fill(0.0);
            }
        } else {
            for k in 0..kc {
                let row = base.offset(k as isize * src.ks);
                let to = &mut out[k * width..(k + 1) * width];
                for (f, t) in to.iter_mut().enumerate() {
                    *t = if f < w {
                        *row.offset(f as isize * src.fs)
                    } else {
                        0.0
                    };
                }
            }
        }
    }
}

/// Packs the first `kc / 8 · 8` k of one full panel of `width` rows (a multiple of 8) whose k
/// is contiguous: 8 rows × 8 k are loaded as 8 vectors, transposed in registers and stored
/// as 8 k of 8 rows. The scalar walk it replaces (one load and one store per value, the row
/// pointers spilled) was ~30 % of a 64 × 3072 × 768 x·Wᵀ on Zen 3, where each call packs the
/// whole weight. Row f of k lands at `out[k·ld + f]` (ld ≥ width; the GEMM's panels have
/// ld = width, FlashAttention's transposed queries a padded stride). Returns how many k it
/// packed.
///
/// # Safety
/// Rows `base + f·fs`, f < width, hold kc readable values; `out` holds (kc − 1)·ld + width;
/// the CPU has AVX.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
pub(crate) unsafe fn transpose_rows_x86(
    base: *const f32,
    fs: isize,
    width: usize,
    kc: usize,
    (out, ld): (&mut [f32], usize),
) -> usize {
    use std::arch::x86_64::*;
    let whole = kc / 8 * 8;
    assert!(ld >= width && (kc == 0 || out.len() >= (kc - 1) * ld + width));
    let dst = out.as_mut_ptr();
    for g in (0..width).step_by(8) {
        let row0 = base.offset(g as isize * fs);
        for k in (0..whole).step_by(8) {
            let mut r = [_mm256_setzero_ps(); 8];
            for (f, v) in r.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(row0.offset(f as isize * fs).add(k));
            }
            // Pairs of rows interleaved (t), then pairs of pairs (s): each 128-bit lane of
            // s[j] holds 4 rows at one k, k + j in the low lane and k + j + 4 in the high;
            // s[j] has rows 0–3, s[4 + j] rows 4–7.
            let mut s = [_mm256_setzero_ps(); 8];
            for h in 0..2 {
                let lo01 = _mm256_unpacklo_ps(r[4 * h], r[4 * h + 1]);
                let hi01 = _mm256_unpackhi_ps(r[4 * h], r[4 * h + 1]);
                let lo23 = _mm256_unpacklo_ps(r[4 * h + 2], r[4 * h + 3]);
                let hi23 = _mm256_unpackhi_ps(r[4 * h + 2], r[4 * h + 3]);
                s[4 * h] = _mm256_shuffle_ps::<0x44>(lo01, lo23);
                s[4 * h + 1] = _mm256_shuffle_ps::<0xEE>(lo01, lo23);
                s[4 * h + 2] = _mm256_shuffle_ps::<0x44>(hi01, hi23);
                s[4 * h + 3] = _mm256_shuffle_ps::<0xEE>(hi01, hi23);
            }
            // The lanes recombined: 8 rows at one k per vector.
            for j in 0..4 {
                let lo = _mm256_permute2f128_ps::<0x20>(s[j], s[4 + j]);
                let hi = _mm256_permute2f128_ps::<0x31>(s[j], s[4 + j]);
                _mm256_storeu_ps(dst.add((k + j) * ld + g), lo);
                _mm256_storeu_ps(dst.add((k + j + 4) * ld + g), hi);
            }
        }
    }
    whole
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transposing pack gives the same panels with and without AVX, for full and partial
    /// panels, k with and without a tail of fewer than 8, and row strides wider than k.
    #[test]
    fn k_contiguous_pack_is_the_same_with_and_without_avx() {
        #[cfg(target_arch = "x86_64")]
        let has_avx = std::arch::is_x86_feature_detected!("avx");
        #[cfg(not(target_arch = "x86_64"))]
        let has_avx = false;
        for (free, kc, width, stride) in [
            (16usize, 64usize, 16usize, 64usize),
            (16, 67, 16, 80),
            (40, 13, 16, 13),
            (32, 8, 32, 9),
            (64, 128, 32, 130),
            (7, 24, 8, 24),
            (6, 33, 6, 40),
        ] {
            let src: Vec<f32> = (0..free * stride).map(|i| i as f32 * 0.5 - 3.0).collect();
            let panels = free.div_ceil(width) * width * kc;
            let s = Src {
                ptr: src.as_ptr(),
                fs: stride as isize,
                ks: 1,
            };
            let mut plain = vec![f32::NAN; panels];
            let mut fast = vec![f32::NAN; panels];
            // SAFETY: every (f, k) < (free, kc) is inside src; `fast` uses AVX only if present.
            unsafe {
                pack_panels(s, free, kc, width, &mut plain, false);
                pack_panels(s, free, kc, width, &mut fast, has_avx);
            }
            for (i, (&a, &b)) in plain.iter().zip(&fast).enumerate() {
                let (p, rest) = (i / (width * kc), i % (width * kc));
                let (k, f) = (rest / width, p * width + rest % width);
                let want = if f < free { src[f * stride + k] } else { 0.0 };
                assert_eq!(
                    a, want,
                    "plain pack at row {f}, k {k} ({free}×{kc}, width {width})"
                );
                assert_eq!(
                    b, want,
                    "AVX pack at row {f}, k {k} ({free}×{kc}, width {width})"
                );
            }
        }
    }
}
