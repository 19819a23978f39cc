//! The 256-bit kernels: AVX-VNNI (`vpdpbusd` on ymm registers) and plain AVX2.
//!
//! A panel's 64-byte block is two ymm registers (channels 0–7 and 8–15). A tile is up to
//! 4 rows × 1 panel: 8 accumulators, 2 weight registers and the activation temporaries fit the
//! 16 ymm registers.
//!
//! **AVX2 and the i16 saturation of `vpmaddubsw`.** Without VNNI, u8·i8 dot products go through
//! `vpmaddubsw` (u8 × i8 products, adjacent pairs summed into an i16 *with saturation*) and
//! `vpmaddwd` against ones (pairs of i16 into i32). With a ∈ [0, 255] and w ∈ [-127, 127] a pair
//! can reach 2·255·127 = 64,770 and saturate, so plain use is not exact. We re-centre the
//! activations instead: a' = a − 128 ∈ [-128, 127] (one `xor 0x80`), and apply the *sign
//! trick*: |a'|·sign(w, a') = a'·w, with |a'| ≤ 128 unsigned (`vpabsb`) and sign(w, a') = ±w
//! (`vpsignb`, never overflowing since w ≠ -128). Now a pair is at most 2·128·127 = 32,512 <
//! 32,767: never saturated, so the sums are exact. Σ a'·w = Σ a·w − 128·Σ w, and the kernel
//! adds back 128·Σ w from the precomputed channel sums, so it returns the same accumulators as
//! every other path. We chose this over 7-bit weights or 7-bit activations (PyTorch's
//! `reduce_range`) because those lose a bit of precision on every machine to help only the
//! AVX2 ones; here the price is two cheap byte ops per block, on AVX2 only.

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use super::kernel::{Kernel, Tile, TileArgs, TILE_NR};

/// One instruction set's u8·i8 dot product on 256-bit registers.
trait Dot256 {
    /// The activation broadcast as the dot product wants it.
    type A: Copy;
    unsafe fn prepare(a4: i32) -> Self::A;
    unsafe fn dot(acc: __m256i, a: Self::A, w: __m256i) -> __m256i;
    /// Turns the tile's accumulators into Σ a·w (the AVX2 path adds back 128·Σ w).
    unsafe fn finish(acc: __m256i, sums: &[i32]) -> __m256i;
}

pub struct AvxVnni;
pub struct Avx2;

impl Dot256 for AvxVnni {
    type A = __m256i;
    #[inline(always)]
    unsafe fn prepare(a4: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(a4) }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, a: __m256i, w: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, a, w) }
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256i, _sums: &[i32]) -> __m256i {
        acc
    }
}

impl Dot256 for Avx2 {
    /// (|a'|, a') with a' = a − 128 as i8.
    type A = (__m256i, __m256i);
    #[inline(always)]
    unsafe fn prepare(a4: i32) -> (__m256i, __m256i) {
        unsafe {
            let centred = _mm256_xor_si256(_mm256_set1_epi32(a4), _mm256_set1_epi8(-128));
            (_mm256_abs_epi8(centred), centred)
        }
    }
    #[inline(always)]
    unsafe fn dot(acc: __m256i, (abs, centred): (__m256i, __m256i), w: __m256i) -> __m256i {
        unsafe {
            let pairs = _mm256_maddubs_epi16(abs, _mm256_sign_epi8(w, centred));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn finish(acc: __m256i, sums: &[i32]) -> __m256i {
        unsafe {
            let s = _mm256_loadu_si256(sums.as_ptr() as *const __m256i);
            _mm256_add_epi32(acc, _mm256_slli_epi32(s, 7))
        }
    }
}

impl Kernel for AvxVnni {
    const MR: usize = 4;
    const NP: usize = 1;
    #[inline(always)]
    unsafe fn tile(t: TileArgs<'_>, _np: usize, acc: &mut Tile) {
        // SAFETY: forwarded from the caller's contract (AVX-VNNI present).
        unsafe {
            match t.rows {
                1 => tile_vnni::<1>(t, acc),
                2 => tile_vnni::<2>(t, acc),
                3 => tile_vnni::<3>(t, acc),
                _ => tile_vnni::<4>(t, acc),
            }
        }
    }
}

impl Kernel for Avx2 {
    const MR: usize = 4;
    const NP: usize = 1;
    #[inline(always)]
    unsafe fn tile(t: TileArgs<'_>, _np: usize, acc: &mut Tile) {
        // SAFETY: forwarded from the caller's contract (AVX2 present).
        unsafe {
            match t.rows {
                1 => tile_avx2::<1>(t, acc),
                2 => tile_avx2::<2>(t, acc),
                3 => tile_avx2::<3>(t, acc),
                _ => tile_avx2::<4>(t, acc),
            }
        }
    }
}

#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn tile_vnni<const R: usize>(t: TileArgs<'_>, out: &mut Tile) {
    unsafe { tile_impl::<AvxVnni, R>(t, out) }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(t: TileArgs<'_>, out: &mut Tile) {
    unsafe { tile_impl::<Avx2, R>(t, out) }
}

/// One panel (two ymm columns of 8 channels) × R rows.
#[inline(always)]
unsafe fn tile_impl<D: Dot256, const R: usize>(t: TileArgs<'_>, out: &mut Tile) {
    unsafe {
        let w = t.w.as_ptr() as *const __m256i;
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..t.groups {
            // SAFETY: block g of the panel is 64 aligned bytes = two ymm.
            let w0 = _mm256_load_si256(w.add(2 * g));
            let w1 = _mm256_load_si256(w.add(2 * g + 1));
            for (r, acc_r) in acc.iter_mut().enumerate() {
                // SAFETY: row r has 4·groups readable bytes.
                let a4 = (t.a.add(r * t.lda + 4 * g) as *const i32).read_unaligned();
                let a = D::prepare(a4);
                acc_r[0] = D::dot(acc_r[0], a, w0);
                acc_r[1] = D::dot(acc_r[1], a, w1);
            }
        }
        for (r, acc_r) in acc.iter().enumerate() {
            for (h, v) in acc_r.iter().enumerate() {
                let v = D::finish(*v, &t.sums[8 * h..8 * h + 8]);
                _mm256_storeu_si256(out.as_mut_ptr().add(r * TILE_NR + 8 * h) as *mut __m256i, v);
            }
        }
    }
}
