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

/// The function applied after the bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    Relu,
    /// GELU, tanh approximation (GPT-2).
    GeluTanh,
    /// GELU with erf (BERT).
    GeluErf,
}

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

/// Requantizes y (in place in `y`) into `out` with `q`.
#[inline(always)]
pub(crate) fn requantize_row(y: &[f32], q: QParams, out: &mut [u8]) {
    let (inv, zp) = (1.0 / q.scale, q.zero_point as f32);
    for (o, &v) in out.iter_mut().zip(y) {
        *o = (v * inv + zp).round_ties_even().clamp(0.0, 255.0) as u8;
    }
}

#[inline(always)]
pub(crate) fn activate(activation: Activation, v: &mut [f32]) {
    match activation {
        Activation::None => {}
        Activation::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
        Activation::GeluTanh => v.iter_mut().for_each(|x| *x = gelu_tanh(*x)),
        Activation::GeluErf => v.iter_mut().for_each(|x| *x = gelu_erf(*x)),
    }
}

const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU, tanh form, in f32.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x)).tanh())
}

/// GELU, erf form, in f32 (erf to 1.5e-7 absolute: Abramowitz–Stegun 7.1.26).
#[inline(always)]
pub fn gelu_erf(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.327_591_1 * z);
    let poly = t
        * (0.254_829_6
            + t * (-0.284_496_74 + t * (1.421_413_7 + t * (-1.453_152 + t * 1.061_405_4))));
    let erf = 1.0 - poly * (-z * z).exp();
    0.5 * x * (1.0 + erf.copysign(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gelus_match_their_definitions() {
        for i in -60..=60 {
            let x = i as f64 * 0.1;
            let tanh_ref = 0.5
                * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh());
            let tol = 1e-6 * (1.0 + x.abs());
            assert!((gelu_tanh(x as f32) as f64 - tanh_ref).abs() < tol, "{x}");
            // erf(x/√2) = 2Φ(x) − 1; Φ by a direct sum of its series is exact enough here.
            let phi = 0.5 * (1.0 + erf_series(x / 2f64.sqrt()));
            assert!((gelu_erf(x as f32) as f64 - x * phi).abs() < tol, "{x}");
        }
    }

    fn erf_series(x: f64) -> f64 {
        // erf(x) = 2/√π Σ (-1)^n x^(2n+1) / (n! (2n+1)), converging fast for |x| ≤ 4.3.
        let (mut term, mut sum) = (x, 0.0);
        for n in 0..200 {
            sum += term / (2 * n + 1) as f64;
            term *= -x * x / (n + 1) as f64;
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    }

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
}
