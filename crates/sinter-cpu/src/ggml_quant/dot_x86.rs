//! The x86 dot-product kernels of `dot`: AVX2 and AVX512-VNNI, one generic body per format.
//!
//! Every format reduces to products of unsigned bytes (4-bit or 6-bit weights, or |w| with
//! the activation's sign moved onto it for signed Q8_0) and signed i8 activations, summed in
//! groups of four into i32 lanes: `vpmaddubsw` + `vpmaddwd` on AVX2, one `vpdpbusd` with
//! VNNI ([`Madd`]). Sums stay in range: a `vpmaddubsw` pair is at most 2·128·127 = 32,512
//! (activations are within ±127), below i16's 32,767. The k-quants multiply each sub-block's
//! i32 sums by its integer scale before one f32 conversion per block of 256.

use std::arch::x86_64::*;

use super::act::{ActQ8, ActQ8K, DotPath};
use super::blocks::{scales_mins_k4, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ6K, BlockQ8_0};
use super::groups::GROUP;
use super::{row_blocks as blocks, GgmlType};

/// The multiply-add both paths build on.
trait Madd {
    /// acc + (Σ of each four consecutive u8·i8 products of a and b, as 8 i32 lanes).
    unsafe fn dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// The same sums (from zero) with lanes 0..4 (bytes 0..16) times s0 and 4..8 times s1.
    unsafe fn dot4_scaled(a: __m256i, b: __m256i, s0: i32, s1: i32) -> __m256i;
    /// Σ over eight register pairs of `dot4`'s sums (from zero), where every byte of each
    /// `a` is below 16: on AVX2 an i16 lane then holds eight `vpmaddubsw` pair sums
    /// (8·2·15·127 = 30,480 < 32,767), so one `vpmaddwd` widens them all.
    unsafe fn dot4_u4x8(a: &[__m256i; 8], b: &[__m256i; 8]) -> __m256i;
    /// Adds `dot4`'s sums of a (every byte below 16) and b into a running sum that
    /// `u4_sums` turns into i32 lanes: on AVX2 the sum is kept in i16 lanes (eight such
    /// additions stay in range, as in `dot4_u4x8`) and widened once.
    unsafe fn u4_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// The i32 lanes of a running sum of `u4_add`.
    unsafe fn u4_sums(acc: __m256i) -> __m256i;
}

struct Avx2;
struct Vnni;

impl Madd for Avx2 {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe {
            let pairs = _mm256_maddubs_epi16(a, b);
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    unsafe fn dot4_scaled(a: __m256i, b: __m256i, s0: i32, s1: i32) -> __m256i {
        unsafe {
            let pairs = _mm256_maddubs_epi16(a, b);
            let s = _mm256_set_m128i(_mm_set1_epi16(s1 as i16), _mm_set1_epi16(s0 as i16));
            _mm256_madd_epi16(pairs, s)
        }
    }
    #[inline(always)]
    unsafe fn dot4_u4x8(a: &[__m256i; 8], b: &[__m256i; 8]) -> __m256i {
        unsafe {
            let mut s0 = _mm256_maddubs_epi16(a[0], b[0]);
            let mut s1 = _mm256_maddubs_epi16(a[1], b[1]);
            for i in (2..8).step_by(2) {
                s0 = _mm256_add_epi16(s0, _mm256_maddubs_epi16(a[i], b[i]));
                s1 = _mm256_add_epi16(s1, _mm256_maddubs_epi16(a[i + 1], b[i + 1]));
            }
            _mm256_madd_epi16(_mm256_add_epi16(s0, s1), _mm256_set1_epi16(1))
        }
    }
    #[inline(always)]
    unsafe fn u4_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi16(acc, _mm256_maddubs_epi16(a, b)) }
    }
    #[inline(always)]
    unsafe fn u4_sums(acc: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(acc, _mm256_set1_epi16(1)) }
    }
}

impl Madd for Vnni {
    #[inline(always)]
    unsafe fn dot4(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn dot4_scaled(a: __m256i, b: __m256i, s0: i32, s1: i32) -> __m256i {
        unsafe {
            let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
            let s = _mm256_set_m128i(_mm_set1_epi32(s1), _mm_set1_epi32(s0));
            _mm256_mullo_epi32(sums, s)
        }
    }
    #[inline(always)]
    unsafe fn dot4_u4x8(a: &[__m256i; 8], b: &[__m256i; 8]) -> __m256i {
        unsafe {
            // Four chains: `vpdpbusd`'s latency would serialize one.
            let mut s = [_mm256_setzero_si256(); 4];
            for i in 0..8 {
                s[i % 4] = _mm256_dpbusd_epi32(s[i % 4], a[i], b[i]);
            }
            _mm256_add_epi32(_mm256_add_epi32(s[0], s[1]), _mm256_add_epi32(s[2], s[3]))
        }
    }
    #[inline(always)]
    unsafe fn u4_add(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_dpbusd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn u4_sums(acc: __m256i) -> __m256i {
        acc
    }
}

/// Each weight row of `w` (rows of `row_bytes`, type Q8_0, Q4_0 or Q4_1) · each activation
/// row of `xs`, into `out` [w rows, xs.len()] (weight-row major): one call runs a whole
/// slice of rows, so the path and type are dispatched once per slice, not per row, and each
/// weight block is unpacked once for up to four activation rows.
///
/// # Safety
/// The CPU must support `path` (not `Scalar`).
pub(super) unsafe fn matrix_q8(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8]],
    out: &mut [f32],
) {
    unsafe {
        if path == DotPath::Avx512Vnni {
            vnni_q8(ty, w, row_bytes, xs, out)
        } else {
            avx2_q8(ty, w, row_bytes, xs, out)
        }
    }
}

/// As [`matrix_q8`] for Q4_K and Q6_K weights.
///
/// # Safety
/// As [`matrix_q8`].
pub(super) unsafe fn matrix_q8k(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8K]],
    out: &mut [f32],
) {
    unsafe {
        if path == DotPath::Avx512Vnni {
            vnni_q8k(ty, w, row_bytes, xs, out)
        } else {
            avx2_q8k(ty, w, row_bytes, xs, out)
        }
    }
}

/// How far ahead of its reads a GEMV asks for weight bytes. The weights stream from memory
/// once per token and the hardware prefetcher alone left a decode step's products well below
/// the memory's bandwidth (each product is short and starts a new stream): SmolLM2-shaped
/// products of a token (`benches/ggml_gemv.rs`, 2 Zen 3 cores, loaded machine, 4 alternating
/// runs) took 7.9–8.5 → 6.6–7.9 ms in Q8_0 and 4.9–5.4 → 4.1–4.7 ms in Q4_1 with 1 KiB.
const PREFETCH_AHEAD: usize = 1024;

/// Prefetches the `len` bytes that lie `PREFETCH_AHEAD` past `at`, a cache line at a time.
/// A prefetch never faults, so the lines may lie past the end of the weights.
#[inline(always)]
unsafe fn prefetch_ahead(at: *const u8, len: usize) {
    let mut off = PREFETCH_AHEAD;
    while off < PREFETCH_AHEAD + len {
        unsafe { _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off) as *const i8) };
        off += 64;
    }
}

/// The loop of [`matrix_q8`]/[`matrix_q8k`] over weight rows and groups of up to four
/// activation rows: `$f::<$m, R>(ty, weight row, R activation rows)` per group.
macro_rules! rows_loop {
    ($f:ident, $m:ty, $ty:expr, $w:expr, $row_bytes:expr, $xs:expr, $out:expr) => {{
        let m = $xs.len();
        for (wr, o) in $w.chunks_exact($row_bytes).zip($out.chunks_exact_mut(m)) {
            prefetch_ahead(wr.as_ptr(), $row_bytes);
            for (g, og) in $xs.chunks(4).zip(o.chunks_mut(4)) {
                match g.len() {
                    1 => og.copy_from_slice(&$f::<$m, 1>($ty, wr, [g[0]])),
                    2 => og.copy_from_slice(&$f::<$m, 2>($ty, wr, [g[0], g[1]])),
                    3 => og.copy_from_slice(&$f::<$m, 3>($ty, wr, [g[0], g[1], g[2]])),
                    _ => og.copy_from_slice(&$f::<$m, 4>($ty, wr, [g[0], g[1], g[2], g[3]])),
                }
            }
        }
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_q8(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8]], out: &mut [f32]) {
    unsafe { rows_loop!(legacy, Avx2, ty, w, row_bytes, xs, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni_q8(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8]], out: &mut [f32]) {
    unsafe { rows_loop!(legacy, Vnni, ty, w, row_bytes, xs, out) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_q8k(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8K]], out: &mut [f32]) {
    unsafe { rows_loop!(kquant, Avx2, ty, w, row_bytes, xs, out) }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni_q8k(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8K]], out: &mut [f32]) {
    unsafe { rows_loop!(kquant, Vnni, ty, w, row_bytes, xs, out) }
}

#[inline(always)]
unsafe fn legacy<M: Madd, const R: usize>(ty: GgmlType, w: &[u8], x: [&[ActQ8]; R]) -> [f32; R] {
    unsafe {
        match ty {
            GgmlType::Q8_0 => q8_0::<M, R>(blocks(w), x),
            GgmlType::Q4_0 => q4_0::<M, R>(blocks(w), x),
            GgmlType::Q4_1 => q4_1::<M, R>(blocks(w), x),
            _ => unreachable!("only Q8_0/Q4_0/Q4_1 take blocks of 32"),
        }
    }
}

#[inline(always)]
unsafe fn kquant<M: Madd, const R: usize>(ty: GgmlType, w: &[u8], x: [&[ActQ8K]; R]) -> [f32; R] {
    unsafe {
        match ty {
            GgmlType::Q4_K => q4_k::<M, R>(blocks(w), x),
            GgmlType::Q6_K => q6_k::<M, R>(blocks(w), x),
            _ => unreachable!("only Q4_K/Q6_K take blocks of 256"),
        }
    }
}

#[inline(always)]
unsafe fn load(p: &[i8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    // SAFETY: 32 bytes are in bounds (checked above in debug, by the callers' slices always).
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

#[inline(always)]
unsafe fn load_u8(p: &[u8]) -> __m256i {
    debug_assert!(p.len() >= 32);
    unsafe { _mm256_loadu_si256(p.as_ptr() as *const __m256i) }
}

/// An f16 scale (little-endian bytes) to f32 by F16C, inline (a call per block to a
/// runtime-dispatched conversion cost a third of the decode step's time).
#[inline(always)]
unsafe fn f16v(b: [u8; 2]) -> f32 {
    unsafe {
        _mm_cvtss_f32(_mm_cvtph_ps(
            _mm_cvtsi32_si128(u16::from_le_bytes(b) as i32),
        ))
    }
}

/// Sum of the 8 lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    unsafe {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }
}

/// The 32 nibbles of a 4-bit block as bytes: low nibbles (values 0..16) then high ones.
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    unsafe {
        let b = _mm_loadu_si128(qs.as_ptr() as *const __m128i);
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(b, m);
        let hi = _mm_and_si128(_mm_srli_epi16(b, 4), m);
        _mm256_set_m128i(hi, lo)
    }
}

/// Runs `$body` (with `$b` the block's index, `$blk` the block, `$acc` its `[__m256; R]`
/// accumulators) over the blocks of a weight row, even blocks into one set of accumulators
/// and odd ones into another, so that consecutive blocks' FMAs do not wait on each other (a
/// row of a few dozen blocks was latency-bound on one chain); returns the two sets' sum.
macro_rules! two_chains {
    ($w:expr, $r:expr, |$b:ident, $blk:ident, $acc:ident| $body:block) => {{
        let w = $w;
        let mut even = [_mm256_setzero_ps(); $r];
        let mut odd = [_mm256_setzero_ps(); $r];
        let mut $b = 0;
        while $b + 1 < w.len() {
            {
                let ($blk, $acc) = (&w[$b], &mut even);
                $body
            }
            $b += 1;
            {
                let ($blk, $acc) = (&w[$b], &mut odd);
                $body
            }
            $b += 1;
        }
        if $b < w.len() {
            let ($blk, $acc) = (&w[$b], &mut even);
            $body
        }
        for r in 0..$r {
            even[r] = _mm256_add_ps(even[r], odd[r]);
        }
        even
    }};
}

#[inline(always)]
unsafe fn q8_0<M: Madd, const R: usize>(w: &[BlockQ8_0], x: [&[ActQ8]; R]) -> [f32; R] {
    unsafe {
        let acc = two_chains!(w, R, |b, w, acc| {
            let wq = load_u8(&w.qs);
            // w·x = |w|·(x with w's sign): an unsigned × signed product.
            let a = _mm256_sign_epi8(wq, wq);
            let dw = f16v(w.d);
            for r in 0..R {
                let x = &x[r][b];
                let s = M::dot4(_mm256_setzero_si256(), a, _mm256_sign_epi8(load(&x.qs), wq));
                let d = _mm256_set1_ps(dw * x.d);
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(s), acc[r]);
            }
        });
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }
}

#[inline(always)]
unsafe fn q4_0<M: Madd, const R: usize>(w: &[BlockQ4_0], x: [&[ActQ8]; R]) -> [f32; R] {
    unsafe {
        // d_w·Σ(q − 8)·d_x·p = d_w·(d_x·Σ q·p − 8·s_x), with s_x = d_x·Σp.
        let mut offset = [0f32; R];
        let acc = two_chains!(w, R, |b, w, acc| {
            let q = nibbles(&w.qs);
            let dw = f16v(w.d);
            for r in 0..R {
                let x = &x[r][b];
                let s = M::dot4(_mm256_setzero_si256(), q, load(&x.qs));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x.d), _mm256_cvtepi32_ps(s), acc[r]);
                offset[r] += dw * x.s;
            }
        });
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) - 8.0 * offset[r];
        }
        out
    }
}

#[inline(always)]
unsafe fn q4_1<M: Madd, const R: usize>(w: &[BlockQ4_1], x: [&[ActQ8]; R]) -> [f32; R] {
    unsafe {
        let mut mins = [0f32; R];
        let acc = two_chains!(w, R, |b, w, acc| {
            let q = nibbles(&w.qs);
            let (dw, m) = (f16v(w.d), f16v(w.m));
            for r in 0..R {
                let x = &x[r][b];
                let s = M::dot4(_mm256_setzero_si256(), q, load(&x.qs));
                acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dw * x.d), _mm256_cvtepi32_ps(s), acc[r]);
                mins[r] += m * x.s;
            }
        });
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) + mins[r];
        }
        out
    }
}

#[inline(always)]
unsafe fn q4_k<M: Madd, const R: usize>(w: &[BlockQ4K], x: [&[ActQ8K]; R]) -> [f32; R] {
    unsafe {
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); R];
        // Σ dmin·d_x·m_j·(sum of sub-block j's activations), subtracted at the end.
        let mut acc_min = [_mm256_setzero_ps(); R];
        for (b, w) in w.iter().enumerate() {
            let (sc, mn) = scales_mins_k4(&w.scales);
            // Each sub-block's minimum twice, as 16 i16 lanes: a `vpmaddwd` with the 16
            // activation sums of 16 values then gives each sub-block's Σ m_j·x in one lane.
            let mn = _mm_loadl_epi64(mn.as_ptr() as *const __m128i);
            let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));
            let mut sumi = [_mm256_setzero_si256(); R];
            // 32 bytes of qs per pair of sub-blocks: low nibbles are sub-block 2p, high 2p + 1.
            for pair in 0..4 {
                let (sc0, sc1) = (sc[2 * pair] as i32, sc[2 * pair + 1] as i32);
                let q = load_u8(&w.qs[32 * pair..]);
                let lo = _mm256_and_si256(q, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                for r in 0..R {
                    let xs = &x[r][b].qs[64 * pair..];
                    let s = _mm256_add_epi32(
                        M::dot4_scaled(lo, load(xs), sc0, sc0),
                        M::dot4_scaled(hi, load(&xs[32..]), sc1, sc1),
                    );
                    sumi[r] = _mm256_add_epi32(sumi[r], s);
                }
            }
            let (d, dmin) = (f16v(w.d), f16v(w.dmin));
            for r in 0..R {
                let x = &x[r][b];
                let dd = _mm256_set1_ps(d * x.d);
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi[r]), acc[r]);
                let bsums = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
                let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, mins));
                acc_min[r] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * x.d), m, acc_min[r]);
            }
        }
        // A loop, not array::from_fn: a closure would not inherit the target features, and
        // its call of `hsum` would not inline.
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]) - hsum(acc_min[r]);
        }
        out
    }
}

#[inline(always)]
unsafe fn q6_k<M: Madd, const R: usize>(w: &[BlockQ6K], x: [&[ActQ8K]; R]) -> [f32; R] {
    unsafe {
        let (m4, m2) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3));
        let mut acc = [_mm256_setzero_ps(); R];
        for (b, w) in w.iter().enumerate() {
            // The sixteen scales as i16 lanes, for the offset (below).
            let scales = _mm256_cvtepi8_epi16(_mm_loadu_si128(w.scales.as_ptr() as *const __m128i));
            let mut sumi = [_mm256_setzero_si256(); R];
            // As `BlockQ6K::dequantize`: value 128h + 32k + l has its low 4 bits in
            // ql[64h + 32(k % 2) + l] (low nibble for k < 2), its high 2 in qh[32h + l] at bit
            // 2k, and scale index (128h + 32k + l) / 16.
            for h in 0..2 {
                let ql = [load_u8(&w.ql[64 * h..]), load_u8(&w.ql[64 * h + 32..])];
                let qh = load_u8(&w.qh[32 * h..]);
                for k in 0..4 {
                    let src = ql[k % 2];
                    let low = if k < 2 {
                        _mm256_and_si256(src, m4)
                    } else {
                        _mm256_and_si256(_mm256_srli_epi16(src, 4), m4)
                    };
                    let shift = _mm_cvtsi32_si128(2 * k as i32);
                    let high = _mm256_and_si256(_mm256_srl_epi16(qh, shift), m2);
                    let q = _mm256_or_si256(low, _mm256_slli_epi16(high, 4));
                    let s = 8 * h + 2 * k;
                    let (s0, s1) = (w.scales[s] as i32, w.scales[s + 1] as i32);
                    for r in 0..R {
                        let xs = load(&x[r][b].qs[128 * h + 32 * k..]);
                        sumi[r] = _mm256_add_epi32(sumi[r], M::dot4_scaled(q, xs, s0, s1));
                    }
                }
            }
            let d = f16v(w.d);
            for r in 0..R {
                let x = &x[r][b];
                // The values are stored + 32: subtract 32·Σ scale·(sum of its 16 activations)
                // (`q6_k_offset`), in lanes, while still integers (|sum| < 2^31: 256·63·127·127).
                let bsums = _mm256_loadu_si256(x.bsums.as_ptr() as *const __m256i);
                let offset = _mm256_slli_epi32(_mm256_madd_epi16(scales, bsums), 5);
                let sumi = _mm256_sub_epi32(sumi[r], offset);
                let dd = _mm256_set1_ps(d * x.d);
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc[r]);
            }
        }
        // A loop, not array::from_fn: a closure would not inherit the target features, and
        // its call of `hsum` would not inline.
        let mut out = [0f32; R];
        for r in 0..R {
            out[r] = hsum(acc[r]);
        }
        out
    }
}

/// Weight rows stored in groups of eight (`super::groups`; Q8_0, Q4_0 or Q4_1) · each
/// activation row of `xs`, into `out` [w rows, xs.len()] (weight-row major): per group and
/// activation row, one pass over the group's blocks leaves the eight rows' products in the
/// eight lanes of one register.
///
/// # Safety
/// The CPU must support `path` (not `Scalar`); `w` is whole groups of rows of `row_bytes`,
/// each activation row `row_bytes` worth of blocks, and `out` one value per weight row and
/// activation row.
pub(super) unsafe fn groups_q8(
    path: DotPath,
    ty: GgmlType,
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8]],
    out: &mut [f32],
) {
    unsafe {
        if path == DotPath::Avx512Vnni {
            vnni_groups(ty, w, row_bytes, xs, out)
        } else {
            avx2_groups(ty, w, row_bytes, xs, out)
        }
    }
}

/// The grouped formats, as `group_dot`'s const parameter.
const G_Q8_0: u8 = 0;
const G_Q4_0: u8 = 1;
const G_Q4_1: u8 = 2;

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn avx2_groups(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8]], out: &mut [f32]) {
    unsafe {
        match ty {
            GgmlType::Q8_0 => groups_of::<Avx2, G_Q8_0>(w, row_bytes, xs, out),
            GgmlType::Q4_0 => groups_of::<Avx2, G_Q4_0>(w, row_bytes, xs, out),
            GgmlType::Q4_1 => groups_of::<Avx2, G_Q4_1>(w, row_bytes, xs, out),
            _ => unreachable!("only Q8_0/Q4_0/Q4_1 are stored in groups"),
        }
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vnni_groups(ty: GgmlType, w: &[u8], row_bytes: usize, xs: &[&[ActQ8]], out: &mut [f32]) {
    unsafe {
        match ty {
            GgmlType::Q8_0 => groups_of::<Vnni, G_Q8_0>(w, row_bytes, xs, out),
            GgmlType::Q4_0 => groups_of::<Vnni, G_Q4_0>(w, row_bytes, xs, out),
            GgmlType::Q4_1 => groups_of::<Vnni, G_Q4_1>(w, row_bytes, xs, out),
            _ => unreachable!("only Q8_0/Q4_0/Q4_1 are stored in groups"),
        }
    }
}

#[inline(always)]
unsafe fn groups_of<M: Madd, const KIND: u8>(
    w: &[u8],
    row_bytes: usize,
    xs: &[&[ActQ8]],
    out: &mut [f32],
) {
    unsafe {
        let m = xs.len();
        for (gi, g) in w.chunks_exact(GROUP * row_bytes).enumerate() {
            if m == 1 {
                let v = group_dot::<M, KIND>(g, xs[0]);
                _mm256_storeu_ps(out[gi * GROUP..(gi + 1) * GROUP].as_mut_ptr(), v);
                continue;
            }
            // Several activation rows (a decode step of several sequences): up to four at a
            // time share each block's loads and unpacking.
            let mut r0 = 0;
            while r0 < m {
                let n = (m - r0).min(4);
                let rows = &xs[r0..r0 + n];
                let mut vals = [[0f32; GROUP]; 4];
                let mut put = |vs: &[__m256]| {
                    for (v, o) in vs.iter().zip(&mut vals) {
                        _mm256_storeu_ps(o.as_mut_ptr(), *v);
                    }
                };
                match n {
                    4 => put(&group_dot_rows::<M, KIND, 4>(
                        g,
                        std::array::from_fn(|r| rows[r]),
                    )),
                    3 => put(&group_dot_rows::<M, KIND, 3>(
                        g,
                        std::array::from_fn(|r| rows[r]),
                    )),
                    2 => put(&group_dot_rows::<M, KIND, 2>(
                        g,
                        std::array::from_fn(|r| rows[r]),
                    )),
                    _ => put(&[group_dot::<M, KIND>(g, rows[0])]),
                }
                for (r, v) in vals.iter().take(n).enumerate() {
                    for (i, v) in v.iter().enumerate() {
                        out[(gi * GROUP + i) * m + r0 + r] = *v;
                    }
                }
                r0 += n;
            }
        }
    }
}

/// Four activations (bytes 4t..4t + 4 of a block) in every 32-bit lane.
#[inline(always)]
unsafe fn four(x: &ActQ8, t: usize) -> __m256i {
    let q = &x.qs[4 * t..4 * t + 4];
    let bytes = [q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8];
    unsafe { _mm256_set1_epi32(i32::from_le_bytes(bytes)) }
}

/// One group (eight rows of whole blocks) · one activation row: lane i is row i's product.
#[inline(always)]
unsafe fn group_dot<M: Madd, const KIND: u8>(g: &[u8], x: &[ActQ8]) -> __m256 {
    unsafe {
        let (header, quants) = match KIND {
            G_Q8_0 => (2, 32),
            G_Q4_0 => (2, 16),
            _ => (4, 16),
        };
        let gbb = GROUP * (header + quants);
        assert_eq!(
            g.len(),
            x.len() * gbb,
            "group_dot: one block of activations per group block"
        );
        // Every read below is within block b's `gbb` bytes of g, so within g (asserted).
        let gp = g.as_ptr();
        macro_rules! ld {
            ($at:expr) => {
                _mm256_loadu_si256(gp.add($at) as *const __m256i)
            };
        }
        macro_rules! ld_f16x8 {
            ($at:expr) => {
                _mm256_cvtph_ps(_mm_loadu_si128(gp.add($at) as *const __m128i))
            };
        }
        let mut acc = _mm256_setzero_ps();
        let mut off = _mm256_setzero_ps();
        for (b, x) in x.iter().enumerate() {
            let base = b * gbb;
            prefetch_ahead(gp.wrapping_add(base), gbb);
            let d = ld_f16x8!(base);
            let q = base + GROUP * header;
            let sumi = if KIND == G_Q8_0 {
                // w·x = |w|·(x with w's sign), as in `q8_0`; two chains.
                let mut s = [_mm256_setzero_si256(); 2];
                for t in 0..8 {
                    let wq = ld!(q + 32 * t);
                    let xs = _mm256_sign_epi8(four(x, t), wq);
                    s[t % 2] = M::dot4(s[t % 2], _mm256_sign_epi8(wq, wq), xs);
                }
                _mm256_add_epi32(s[0], s[1])
            } else {
                let m4 = _mm256_set1_epi8(0x0F);
                let mut a = [_mm256_setzero_si256(); 8];
                let mut xv = [_mm256_setzero_si256(); 8];
                for c in 0..4 {
                    // Chunk c's low nibbles are values 4c..4c + 4, its high ones 16 + 4c...
                    let l = ld!(q + 32 * c);
                    a[c] = _mm256_and_si256(l, m4);
                    a[c + 4] = _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    xv[c] = four(x, c);
                    xv[c + 4] = four(x, c + 4);
                }
                M::dot4_u4x8(&a, &xv)
            };
            let dd = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
            acc = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sumi), acc);
            if KIND == G_Q4_1 {
                off = _mm256_fmadd_ps(ld_f16x8!(base + 16), _mm256_set1_ps(x.s), off);
            } else if KIND == G_Q4_0 {
                off = _mm256_fmadd_ps(d, _mm256_set1_ps(x.s), off);
            }
        }
        match KIND {
            // d·Σ(q − 8)·x = d·Σq·x − 8·d·s_x.
            G_Q4_0 => _mm256_fnmadd_ps(_mm256_set1_ps(8.0), off, acc),
            G_Q4_1 => _mm256_add_ps(acc, off),
            _ => acc,
        }
    }
}

/// One group (eight rows of whole blocks) · R activation rows: lane i of result r is weight
/// row i's product with activation row r, as `group_dot` gives it, but each block's weights
/// are loaded and unpacked once for all R rows (a decode step of several sequences does R×
/// the arithmetic of one over the same weights; this shares the part that is the weights').
#[inline(always)]
// Block b indexes the group's bytes and every row's activations alike.
#[allow(clippy::needless_range_loop)]
unsafe fn group_dot_rows<M: Madd, const KIND: u8, const R: usize>(
    g: &[u8],
    xs: [&[ActQ8]; R],
) -> [__m256; R] {
    unsafe {
        let (header, quants) = match KIND {
            G_Q8_0 => (2, 32),
            G_Q4_0 => (2, 16),
            _ => (4, 16),
        };
        let gbb = GROUP * (header + quants);
        let nb = g.len() / gbb;
        assert!(
            xs.iter().all(|x| x.len() * gbb == g.len()),
            "group_dot_rows: one block of activations per group block, in every row"
        );
        // Every read below is within block b's `gbb` bytes of g, so within g (asserted).
        let gp = g.as_ptr();
        macro_rules! ld {
            ($at:expr) => {
                _mm256_loadu_si256(gp.add($at) as *const __m256i)
            };
        }
        macro_rules! ld_f16x8 {
            ($at:expr) => {
                _mm256_cvtph_ps(_mm_loadu_si128(gp.add($at) as *const __m128i))
            };
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let mut off = [_mm256_setzero_ps(); R];
        for b in 0..nb {
            let base = b * gbb;
            prefetch_ahead(gp.wrapping_add(base), gbb);
            let d = ld_f16x8!(base);
            let q = base + GROUP * header;
            let mut sums = [_mm256_setzero_si256(); R];
            if KIND == G_Q8_0 {
                // w·x = |w|·(x with w's sign), as in `group_dot`.
                for t in 0..8 {
                    let wq = ld!(q + 32 * t);
                    let aw = _mm256_sign_epi8(wq, wq);
                    for r in 0..R {
                        let xv = _mm256_sign_epi8(four(&xs[r][b], t), wq);
                        sums[r] = M::dot4(sums[r], aw, xv);
                    }
                }
            } else {
                let m4 = _mm256_set1_epi8(0x0F);
                for c in 0..4 {
                    // Chunk c's low nibbles are values 4c..4c + 4, its high ones 16 + 4c...
                    let l = ld!(q + 32 * c);
                    let lo = _mm256_and_si256(l, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(l, 4), m4);
                    for r in 0..R {
                        sums[r] = M::u4_add(sums[r], lo, four(&xs[r][b], c));
                        sums[r] = M::u4_add(sums[r], hi, four(&xs[r][b], c + 4));
                    }
                }
                for s in &mut sums {
                    *s = M::u4_sums(*s);
                }
            }
            let mins = if KIND == G_Q4_1 {
                ld_f16x8!(base + 16)
            } else {
                d
            };
            for r in 0..R {
                let x = &xs[r][b];
                let dd = _mm256_mul_ps(d, _mm256_set1_ps(x.d));
                acc[r] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sums[r]), acc[r]);
                if KIND != G_Q8_0 {
                    off[r] = _mm256_fmadd_ps(mins, _mm256_set1_ps(x.s), off[r]);
                }
            }
        }
        std::array::from_fn(|r| match KIND {
            // d·Σ(q − 8)·x = d·Σq·x − 8·d·s_x.
            G_Q4_0 => _mm256_fnmadd_ps(_mm256_set1_ps(8.0), off[r], acc[r]),
            G_Q4_1 => _mm256_add_ps(acc[r], off[r]),
            _ => acc[r],
        })
    }
}
