//! Quantization of f32 data to the GEMM's operands.
//!
//! - Weights: symmetric, one scale per output channel: q = round(w / s) with
//!   s = max|w[j, :]| / 127, so q ∈ [-127, 127] and w ≈ s·q. No zero point, so the weight side
//!   of the product needs no correction.
//! - Activations: asymmetric u8, x ≈ s·(q − z) with q ∈ [0, 255]. The range [lo, hi] always
//!   includes 0 (so 0, ReLU's floor and zero padding, is exact), s = (hi − lo)/255 and
//!   z = round(−lo/s). Per row for dynamic quantization (each token of a Transformer gets its own
//!   range), per tensor with a calibrated range for static quantization (CNNs).
//!
//! Rounding is to nearest, ties to even, everywhere (the SIMD conversions' mode), so every
//! path of the GEMM and the epilogue's requantization agree.

use super::Int8Error;
use crate::simd::{load_lanes, store_lanes, Simd};
use crate::{with_isa, Isa};

/// How u8 values map to reals: x ≈ scale · (q − zero_point).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QParams {
    pub scale: f32,
    pub zero_point: i32,
}

impl QParams {
    /// The u8 mapping of the range [lo, hi] (widened to include 0). A zero-width range maps
    /// everything to q = 0 with scale 1.
    pub fn from_range(lo: f32, hi: f32) -> Result<QParams, Int8Error> {
        if !(lo.is_finite() && hi.is_finite()) || lo > hi {
            return Err(Int8Error(format!(
                "cannot quantize the range [{lo}, {hi}]: it must be finite and ordered (a NaN or infinite activation?)"
            )));
        }
        let (lo, hi) = (lo.min(0.0), hi.max(0.0));
        let scale = (hi - lo) / 255.0;
        if scale == 0.0 || !scale.is_normal() {
            return Ok(QParams {
                scale: 1.0,
                zero_point: 0,
            });
        }
        let zero_point = (-lo / scale).round_ties_even().clamp(0.0, 255.0) as i32;
        Ok(QParams { scale, zero_point })
    }

    /// q for one value.
    #[inline(always)]
    pub fn quantize(self, x: f32) -> u8 {
        quantize_one(x, 1.0 / self.scale, self.zero_point as f32)
    }

    /// x for one q.
    #[inline(always)]
    pub fn dequantize(self, q: u8) -> f32 {
        self.scale * (q as i32 - self.zero_point) as f32
    }
}

#[inline(always)]
fn quantize_one(x: f32, inv_scale: f32, zero_point: f32) -> u8 {
    (x * inv_scale + zero_point)
        .round_ties_even()
        .clamp(0.0, 255.0) as u8
}

/// Quantizes m rows of k values (`x` row-major, `x_stride` apart) to u8 rows `out_stride` apart,
/// all with `q`. Bytes k..out_stride of each output row are left as they are (the kernels
/// multiply them by zero weights).
pub fn quantize_rows_static(
    x: &[f32],
    m: usize,
    k: usize,
    x_stride: usize,
    q: QParams,
    out: &mut [u8],
    out_stride: usize,
) {
    check_rows(x.len(), m, k, x_stride, out.len(), out_stride);
    let isa = Isa::get();
    for i in 0..m {
        let row = &x[i * x_stride..i * x_stride + k];
        quantize_row(isa, row, q, &mut out[i * out_stride..i * out_stride + k]);
    }
}

/// Quantizes each of m rows with its own range (dynamic quantization); returns the rows'
/// parameters. A non-finite value is an error naming its row.
pub fn quantize_rows_dynamic(
    x: &[f32],
    m: usize,
    k: usize,
    x_stride: usize,
    out: &mut [u8],
    out_stride: usize,
) -> Result<Vec<QParams>, Int8Error> {
    check_rows(x.len(), m, k, x_stride, out.len(), out_stride);
    let mut params = Vec::with_capacity(m);
    for i in 0..m {
        let row = &x[i * x_stride..i * x_stride + k];
        let q = quantize_row_with_range(row, &mut out[i * out_stride..i * out_stride + k])
            .map_err(|e| Int8Error(format!("row {i}: {}", e.0)))?;
        params.push(q);
    }
    Ok(params)
}

/// One row quantized with its own range (x.len() values into `out`); returns the mapping.
pub(crate) fn quantize_row_with_range(x: &[f32], out: &mut [u8]) -> Result<QParams, Int8Error> {
    let isa = Isa::get();
    let (lo, hi) = min_max_with(isa, x);
    let q = QParams::from_range(lo, hi)?;
    quantize_row(isa, x, q, out);
    Ok(q)
}

/// One row through [`QParams::quantize`]'s arithmetic, `S::LANES` values at a time: the same
/// two roundings (x·(1/s), then + z) and ties-to-even, so every ISA gives the same bytes.
/// (Scalar `round_ties_even` is a libm call on baseline x86-64; this was 40 % of a
/// few-row int8 Linear.)
fn quantize_row(isa: Isa, x: &[f32], q: QParams, out: &mut [u8]) {
    debug_assert_eq!(x.len(), out.len());
    let (inv, zp) = (1.0 / q.scale, q.zero_point as f32);
    with_isa!(isa, S => quantize_row_with::<S>(x, inv, zp, out))
}

#[inline(always)]
unsafe fn quantize_row_with<S: Simd>(x: &[f32], inv: f32, zp: f32, out: &mut [u8]) {
    // SAFETY (whole body): the dispatch guarantees S's ISA; loads/stores stay inside `x`,
    // `out` and `lanes` (at most 16 lanes, checked below).
    unsafe {
        let (vinv, vzp, lo, hi) = (S::splat(inv), S::splat(zp), S::zero(), S::splat(255.0));
        // q + 2²³ is exact and holds q in its low mantissa byte: the byte is then a plain
        // truncating u32 → u8 per lane, which vectorises (an `f32 as u8` cast would not).
        let magic = S::splat(8_388_608.0);
        let mut lanes = [0f32; 16];
        debug_assert!(S::LANES <= lanes.len());
        let mut i = 0;
        while i < x.len() {
            let n = (x.len() - i).min(S::LANES);
            let v = load_lanes::<S>(x.as_ptr(), i, n);
            let v = S::round(S::add(S::mul(v, vinv), vzp));
            // max then min: a NaN (which the callers refuse earlier) would become 0 here.
            let v = S::add(S::min(S::max(v, lo), hi), magic);
            store_lanes::<S>(lanes.as_mut_ptr(), v, n);
            // One bounds check per vector, so the byte loop vectorises.
            let (dst, src) = if n == S::LANES {
                (&mut out[i..i + S::LANES], &lanes[..S::LANES])
            } else {
                (&mut out[i..i + n], &lanes[..n])
            };
            for (o, l) in dst.iter_mut().zip(src) {
                *o = l.to_bits() as u8;
            }
            i += n;
        }
    }
}

/// (min, max) of a slice; NaN if any value is NaN (so the caller's range check catches it).
pub fn min_max(v: &[f32]) -> (f32, f32) {
    min_max_with(Isa::get(), v)
}

fn min_max_with(isa: Isa, v: &[f32]) -> (f32, f32) {
    with_isa!(isa, S => min_max_simd::<S>(v))
}

#[inline(always)]
unsafe fn min_max_simd<S: Simd>(v: &[f32]) -> (f32, f32) {
    // SAFETY (whole body): S's ISA is present; every load stays inside `v`. The lane-wise
    // min/max propagate NaN, so a NaN anywhere makes both results NaN. The zero-padded tail
    // is masked back to the first value so that padding never widens the range.
    unsafe {
        if v.is_empty() {
            return (f32::INFINITY, f32::NEG_INFINITY);
        }
        let first = S::splat(v[0]);
        let (mut lo, mut hi) = (first, first);
        // Four vectors per step into four accumulator pairs: one pair would wait on its own
        // min/max latency every vector.
        let (mut lo4, mut hi4) = ([first; 4], [first; 4]);
        let mut i = 0;
        while i + 4 * S::LANES <= v.len() {
            for u in 0..4 {
                let x = S::load(v.as_ptr().add(i + u * S::LANES));
                lo4[u] = S::min(lo4[u], x);
                hi4[u] = S::max(hi4[u], x);
            }
            i += 4 * S::LANES;
        }
        for u in 0..4 {
            lo = S::min(lo, lo4[u]);
            hi = S::max(hi, hi4[u]);
        }
        while i < v.len() {
            let n = (v.len() - i).min(S::LANES);
            let mut x = load_lanes::<S>(v.as_ptr(), i, n);
            if n < S::LANES {
                let zeros = S::keep_first(S::splat(1.0), n);
                x = S::select(S::eq(zeros, S::zero()), first, x);
            }
            lo = S::min(lo, x);
            hi = S::max(hi, x);
            i += n;
        }
        (-S::reduce_max(S::sub(S::zero(), lo)), S::reduce_max(hi))
    }
}

fn check_rows(x_len: usize, m: usize, k: usize, xs: usize, out_len: usize, os: usize) {
    assert!(xs >= k && os >= k, "row strides {xs}, {os} below k = {k}");
    if m > 0 {
        assert!(x_len >= (m - 1) * xs + k, "input too short for {m} rows");
        assert!(out_len >= (m - 1) * os + k, "output too short for {m} rows");
    }
}

/// Symmetric per-channel quantization of a row-major [n, k] weight: (q, scales) with
/// w[j, :] ≈ scales[j] · q[j, :], q ∈ [-127, 127]. An all-zero channel gets scale 0.
pub fn quantize_weights(w: &[f32], n: usize, k: usize) -> Result<(Vec<i8>, Vec<f32>), Int8Error> {
    if w.len() != n * k {
        return Err(Int8Error(format!(
            "weight has {} values, [{n}, {k}] needs {}",
            w.len(),
            n * k
        )));
    }
    let mut q = vec![0i8; n * k];
    let mut scales = vec![0f32; n];
    for j in 0..n {
        let row = &w[j * k..(j + 1) * k];
        let amax = row.iter().fold(0f32, |m, &v| m.max(v.abs()));
        if !amax.is_finite() || row.iter().any(|v| v.is_nan()) {
            return Err(Int8Error(format!(
                "weight row {j} holds a NaN or infinite value; it cannot be quantized"
            )));
        }
        let Some(c) = WeightChannel::of(row) else {
            continue;
        };
        for (o, &v) in q[j * k..(j + 1) * k].iter_mut().zip(row) {
            *o = c.quantize(v);
        }
        scales[j] = c.scale;
    }
    Ok((q, scales))
}

/// One weight channel's symmetric mapping: w ≈ scale · q with scale = max|w| / 127 (the one
/// rule for every way of choosing the int8 values: to nearest here, with error feedback in
/// sinter-nn's GPTQ).
#[derive(Clone, Copy, Debug)]
pub struct WeightChannel {
    pub scale: f32,
    inv: f32,
}

impl WeightChannel {
    /// The mapping of a channel's values; None for an all-zero channel (scale 0, q 0).
    pub fn of(row: &[f32]) -> Option<WeightChannel> {
        let amax = row.iter().fold(0f32, |m, &v| m.max(v.abs()));
        (amax != 0.0).then(|| WeightChannel {
            scale: amax / 127.0,
            inv: 127.0 / amax,
        })
    }

    /// v's nearest q (ties to even), clamped to [-127, 127].
    #[inline(always)]
    pub fn quantize(self, v: f32) -> i8 {
        (v * self.inv).round_ties_even().clamp(-127.0, 127.0) as i8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn activation_ranges_include_zero_and_round_trip_within_half_a_step() {
        for (lo, hi) in [(-1.5f32, 3.0), (0.0, 6.0), (-2.0, -0.5), (0.25, 0.75)] {
            let q = QParams::from_range(lo, hi).unwrap();
            assert_eq!(q.dequantize(q.quantize(0.0)), 0.0, "[{lo}, {hi}]");
            for i in 0..=100 {
                let x = lo + (hi - lo) * i as f32 / 100.0;
                let err = (q.dequantize(q.quantize(x)) - x).abs();
                assert!(
                    err <= q.scale * 0.5 + 1e-6,
                    "x {x}: error {err}, step {}",
                    q.scale
                );
            }
        }
        assert_eq!(QParams::from_range(0.0, 0.0).unwrap().quantize(0.0), 0);
        assert!(QParams::from_range(f32::NAN, 1.0).is_err());
        assert!(QParams::from_range(0.0, f32::INFINITY).is_err());
    }

    #[test]
    fn dynamic_rows_get_their_own_ranges_and_padding_is_untouched() {
        let x = [1.0f32, -1.0, 0.5, 100.0, 0.0, 25.0];
        let mut out = [7u8; 8];
        let p = quantize_rows_dynamic(&x, 2, 3, 3, &mut out, 4).unwrap();
        assert_eq!(out[3], 7);
        assert_eq!(out[7], 7);
        assert!((p[0].scale - 2.0 / 255.0).abs() < 1e-7);
        assert!((p[1].scale - 100.0 / 255.0).abs() < 1e-6);
        assert_eq!((out[4], out[5], out[6]), (255, 0, 64));
        let e = quantize_rows_dynamic(&[1.0, f32::NAN], 2, 1, 1, &mut out, 1).unwrap_err();
        assert!(e.0.contains("row 1"), "{}", e.0);
    }

    #[test]
    fn weights_are_symmetric_per_channel() {
        let w = [0.5f32, -1.0, 0.25, 0.0, 0.0, 0.0, 2.0, 1.0, -2.0];
        let (q, s) = quantize_weights(&w, 3, 3).unwrap();
        assert_eq!(&q[..3], &[64, -127, 32]);
        assert_eq!(s[1], 0.0);
        assert_eq!(&q[6..], &[127, 64, -127]);
        for j in 0..3 {
            for t in 0..3 {
                assert!((s[j] * q[j * 3 + t] as f32 - w[j * 3 + t]).abs() <= s[j] * 0.5 + 1e-7);
            }
        }
        assert!(quantize_weights(&[f32::NAN], 1, 1).is_err());
    }

    #[test]
    fn every_isa_quantizes_rows_to_the_same_bytes_as_the_scalar_rule() {
        // Lengths cover full vectors and every tail; values include exact ties (k + 0.5
        // steps), values past both ends, and the zero point itself.
        let q = QParams::from_range(-3.0, 5.0).unwrap();
        for len in 0..50 {
            let x: Vec<f32> = (0..len)
                .map(|i| match i % 5 {
                    0 => (i as f32 - 20.0) * 0.37,
                    1 => q.scale * (i as f32 + 0.5 - q.zero_point as f32),
                    2 => 1e6 * if i % 2 == 0 { 1.0 } else { -1.0 },
                    3 => 0.0,
                    _ => (i as f32).sin() * 4.0,
                })
                .collect();
            let want: Vec<u8> = x.iter().map(|&v| q.quantize(v)).collect();
            let mut seen_range = None;
            for isa in Isa::available() {
                let mut out = vec![9u8; len];
                quantize_row(isa, &x, q, &mut out);
                assert_eq!(out, want, "{isa:?}, {len} values");
                let range = min_max_with(isa, &x);
                if len > 0 {
                    let lo = x.iter().copied().fold(f32::INFINITY, f32::min);
                    let hi = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    assert_eq!(range, (lo, hi), "{isa:?}, {len} values");
                }
                assert_eq!(*seen_range.get_or_insert(range), range, "{isa:?}");
                if len > 0 {
                    let mut bad = x.clone();
                    bad[len - 1] = f32::NAN;
                    let (lo, hi) = min_max_with(isa, &bad);
                    assert!(lo.is_nan() && hi.is_nan(), "{isa:?}, NaN last of {len}");
                }
            }
        }
    }

    #[test]
    fn min_max_sees_every_value_and_nan() {
        let v: Vec<f32> = (0..19).map(|i| (i as f32 - 7.0) * 0.5).collect();
        assert_eq!(min_max(&v), (-3.5, 5.5));
        let mut w = v.clone();
        w[17] = f32::NAN;
        assert!(min_max(&w).0.is_nan());
    }
}
