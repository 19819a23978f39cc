//! What becomes of a tile of raw accumulators: dequantization with the zero-point correction,
//! bias, activation, and either f32 output or requantization to u8 for the next layer.
//!
//! For activation row i (scale sᵢ, zero point zᵢ) and channel j (weight scale wⱼ, channel sum
//! Σⱼ): y = (acc − zᵢ·Σⱼ)·(sᵢ·wⱼ) + biasⱼ, then ReLU or GELU; for u8 output
//! q = clamp(round(y/s_out) + z_out, 0, 255). The integer correction is exact (the products
//! fit i32; wrapping arithmetic keeps it exact even when an intermediate would not), and the f32
//! part runs the same operations in the same order on every path, so every path's output is
//! the same too.

use super::quant::QParams;
pub use crate::math::Activation;
use crate::math::{unary_in_place, Unary};

/// How the u8 activation rows map to reals.
#[derive(Clone, Copy, Debug)]
pub enum ActQuant<'a> {
    /// One mapping per row (dynamic quantization).
    PerRow(&'a [QParams]),
    /// One mapping for every row (static quantization).
    PerTensor(QParams),
}

impl ActQuant<'_> {
    #[inline(always)]
    pub fn row(&self, i: usize) -> QParams {
        match self {
            ActQuant::PerRow(p) => p[i],
            ActQuant::PerTensor(p) => *p,
        }
    }
}

/// Per-channel data of the epilogue.
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    /// wⱼ for each of the n channels.
    pub weight_scales: &'a [f32],
    /// biasⱼ, or none.
    pub bias: Option<&'a [f32]>,
    pub activation: Activation,
}

/// y for `cols` channels of one row, written to `out`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn dequantize_row(
    acc: &[i32],
    row: QParams,
    sums: &[i32],
    weight_scales: &[f32],
    bias: &[f32],
    activation: Activation,
    out: &mut [f32],
) {
    let n = out.len();
    let (acc, sums, ws, bias) = (&acc[..n], &sums[..n], &weight_scales[..n], &bias[..n]);
    let (sa, zp) = (row.scale, row.zero_point);
    for c in 0..n {
        let exact = acc[c].wrapping_sub(zp.wrapping_mul(sums[c]));
        out[c] = exact as f32 * (sa * ws[c]) + bias[c];
    }
    activate(activation, out);
}

/// Requantizes y into `out` with `q`: the arithmetic of `quant::quantize_rows_static` (so a
/// chain that requantizes here gives the bytes the next layer's quantizer would), NaN → 0.
#[inline(always)]
pub(crate) fn requantize_row(y: &[f32], q: QParams, out: &mut [u8]) {
    let (inv, zp) = (1.0 / q.scale, q.zero_point as f32);
    for (o, &v) in out.iter_mut().zip(y) {
        // q + 2²³ holds q in its low mantissa byte: a truncating u32 → u8 per lane, which
        // vectorises (a saturating `f32 as u8` does not). max then min, not clamp: NaN
        // becomes 0, where clamp would keep it and its payload's low byte would leak through.
        #[allow(clippy::manual_clamp)]
        let r = (v * inv + zp).round_ties_even().max(0.0).min(255.0) + 8_388_608.0;
        *o = r.to_bits() as u8;
    }
}

/// The activation, in place; GELU through the vectorised `math` kernels (the same functions
/// as the f32 path's).
#[inline(always)]
pub(crate) fn activate(activation: Activation, v: &mut [f32]) {
    match activation {
        Activation::None => {}
        // PyTorch's relu (and the f32 path's): negatives to 0, NaN and -0.0 kept.
        Activation::Relu => v
            .iter_mut()
            .for_each(|x| *x = if *x < 0.0 { 0.0 } else { *x }),
        Activation::GeluTanh => unary_in_place(Unary::GeluTanh, v),
        Activation::GeluErf => unary_in_place(Unary::GeluErf, v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dequantize_subtracts_the_zero_point_times_the_channel_sum() {
        let mut out = [0f32; 2];
        let row = QParams {
            scale: 0.5,
            zero_point: 3,
        };
        dequantize_row(
            &[10, -4],
            row,
            &[2, -1],
            &[2.0, 4.0],
            &[1.0, 0.0],
            Activation::Relu,
            &mut out,
        );
        // (10 - 6)·1 + 1 = 5; (-4 + 3)·2 = -2 → ReLU 0.
        assert_eq!(out, [5.0, 0.0]);
        let mut q = [0u8; 2];
        requantize_row(
            &[5.0, -1.0],
            QParams {
                scale: 0.5,
                zero_point: 4,
            },
            &mut q,
        );
        assert_eq!(q, [14, 2]);
    }

    #[test]
    fn relu_keeps_nan_and_negative_zero_like_the_f32_path() {
        let mut v = [f32::NAN, -1.5, -0.0, 2.0, f32::NEG_INFINITY];
        activate(Activation::Relu, &mut v);
        assert!(
            v[0].is_nan(),
            "NaN must propagate through ReLU, got {}",
            v[0]
        );
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&v[1..]), bits(&[0.0, -0.0, 2.0, 0.0]));
    }

    /// The epilogue's requantization is the static quantizer's, byte for byte (a u8 chain of
    /// layers relies on it), including ties, clamping at both ends and NaN.
    #[test]
    fn requantize_equals_the_static_quantizer() {
        let q = QParams {
            scale: 0.037,
            zero_point: 17,
        };
        let mut y: Vec<f32> = (-4000..4000).map(|i| i as f32 * 0.00371).collect();
        // Exact ties of v·(1/s) + z, huge values, infinities and NaN.
        y.extend((0..40).map(|i| (i as f32 + 0.5 - 17.0) * q.scale));
        y.extend([
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -0.0,
        ]);
        let mut got = vec![0u8; y.len()];
        requantize_row(&y, q, &mut got);
        let mut want = vec![0u8; y.len()];
        super::super::quantize_rows_static(&y, 1, y.len(), y.len(), q, &mut want, y.len());
        assert_eq!(got, want);
        assert_eq!(got[got.len() - 2], 0, "NaN requantizes to 0");
    }
}
