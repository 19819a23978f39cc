//! A Linear on f32 rows with dynamically quantized activations: each row gets its own u8
//! range at run time, in one or two terms, then the int8 GEMM and its epilogue; f32 rows out.
//!
//! Two terms: x ≈ s₁(q₁ − z₁) + s₂(q₂ − z₂), where q₂ quantizes the residual
//! x − s₁(q₁ − z₁) with its own range. The residual spans about one step of the first term,
//! so the second term's step is about s₁/255 and the activation's rounding error falls by
//! about 255× (to below the weights' int8 error, which then dominates). Both terms go through
//! one GEMM as 2m rows: the weights are read once, and at decode (a few rows) the GEMM is
//! bound by reading them, so the second term costs little there. The two f32 results are
//! added before the bias and the activation.

use super::epilogue::{activate, Epilogue};
use super::gemm::{gemm, Activations, Output};
use super::pack::PackedWeights;
use super::quant::{quantize_row_with_range, quantize_rows_dynamic, QParams};
use super::{ActQuant, Activation, Int8Error, Int8Path};

/// How many u8 terms carry each activation row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ActTerms {
    /// x ≈ s(q − z): one byte per value (u8's rounding error, ≈ range/510 at worst).
    One,
    /// x ≈ s₁(q₁ − z₁) + s₂(q₂ − z₂): the second term carries the first one's rounding error.
    Two,
    /// Two terms for a call of at most [`TWO_TERMS_MAX_ROWS`] rows (a generation step) against
    /// a weight of at least [`TWO_TERMS_MIN_WEIGHT`] bytes, one otherwise. The 2m GEMM rows of
    /// a few-row call cost about what m rows do when reading the weight bounds the GEMM (the
    /// model's weights do not stay in cache between steps: GPT-2's, generation 5.42× → 5.60×
    /// of f32), while for more rows they double its work (8 rows of GPT-2's mlp.fc: 2.3× as
    /// long), and so do they for small weights that stay in cache (gpt-tiny's, ≤ 64 KiB each:
    /// generation 1.95× → 1.52× of f32 with two terms).
    #[default]
    Auto,
}

/// The most rows for which [`ActTerms::Auto`] uses two terms.
pub const TWO_TERMS_MAX_ROWS: usize = 4;

/// The smallest weight (int8 values, padded) for which [`ActTerms::Auto`] uses two terms: a
/// quarter of a Zen 5 core's L2, between gpt-tiny's largest (64 KiB) and GPT-2's smallest
/// (attn.proj, 576 KiB).
pub const TWO_TERMS_MIN_WEIGHT: usize = 256 << 10;

impl ActTerms {
    /// `Auto` decided for a call of m rows against a weight of `weight_bytes` int8 values
    /// (`One` and `Two` as they are).
    pub fn for_weight(self, m: usize, weight_bytes: usize) -> ActTerms {
        match self {
            ActTerms::Auto if weight_bytes < TWO_TERMS_MIN_WEIGHT => ActTerms::One,
            ActTerms::Auto if m <= TWO_TERMS_MAX_ROWS => ActTerms::Two,
            ActTerms::Auto => ActTerms::One,
            t => t,
        }
    }

    /// Terms for a call of m rows (`Auto` by rows alone; see [`ActTerms::for_weight`]).
    pub fn count(self, m: usize) -> usize {
        match self {
            ActTerms::One => 1,
            ActTerms::Two => 2,
            ActTerms::Auto if m <= TWO_TERMS_MAX_ROWS => 2,
            ActTerms::Auto => 1,
        }
    }
}

/// Quantizes m rows of k values (`x` row-major, `x_stride` apart) as `terms.count(m)` u8
/// terms: term t
/// of row i goes to row t·m + i of `out` (rows `out_stride` apart), and its mapping to entry
/// t·m + i of the returned list. A non-finite value is an error naming its row.
pub fn quantize_rows_terms(
    x: &[f32],
    m: usize,
    k: usize,
    x_stride: usize,
    terms: ActTerms,
    out: &mut [u8],
    out_stride: usize,
) -> Result<Vec<QParams>, Int8Error> {
    let mut params = quantize_rows_dynamic(x, m, k, x_stride, out, out_stride)?;
    if terms.count(m) == 1 {
        return Ok(params);
    }
    let (first, second) = out.split_at_mut(m * out_stride);
    let mut residual = vec![0f32; k];
    for i in 0..m {
        let (row, q1, p1) = (
            &x[i * x_stride..i * x_stride + k],
            &first[i * out_stride..i * out_stride + k],
            params[i],
        );
        // x − s₁(q₁ − z₁), with `QParams::dequantize`'s arithmetic.
        for ((r, &v), &q) in residual.iter_mut().zip(row).zip(q1) {
            *r = v - p1.scale * (q as i32 - p1.zero_point) as f32;
        }
        let q2 = &mut second[i * out_stride..i * out_stride + k];
        params.push(
            quantize_row_with_range(&residual, q2)
                .map_err(|e| Int8Error(format!("row {i}: {}", e.0)))?,
        );
    }
    Ok(params)
}

/// y = act(x Wᵀ + b) for m rows of k f32 values (`x` row-major), with each row dynamically
/// quantized in `terms.for_weight(m, ..).count(m)` u8 terms; y is m rows of n = `w.n()`
/// values. Every path gives the same y bit for bit.
///
/// Panics when `path` is not supported by this CPU or a slice is too short for its shape.
pub fn linear_dynamic(
    path: Int8Path,
    x: &[f32],
    m: usize,
    w: &PackedWeights,
    epilogue: &Epilogue<'_>,
    terms: ActTerms,
    y: &mut [f32],
) -> Result<(), Int8Error> {
    linear_dynamic_planes(path, x, m, w, epilogue, None, terms, y).map(|_| ())
}

/// [`linear_dynamic`] for a weight in one or two int8 planes: W = s₁·Q₁ (`w` with
/// `epilogue.weight_scales`) + s₂·Q₂ (`second`: values of the same shape, their scales). Each
/// plane is one GEMM over the same u8 input; the products are summed before bias and
/// activation. Returns the activation terms used (`terms` decided: `One` or `Two`).
#[allow(clippy::too_many_arguments)]
pub fn linear_dynamic_planes(
    path: Int8Path,
    x: &[f32],
    m: usize,
    w: &PackedWeights,
    epilogue: &Epilogue<'_>,
    second: Option<(&PackedWeights, &[f32])>,
    terms: ActTerms,
    y: &mut [f32],
) -> Result<ActTerms, Int8Error> {
    let terms = terms.for_weight(m, w.k_padded() * w.n());
    let (k, n, kp, t) = (w.k(), w.n(), w.k_padded(), terms.count(m));
    assert!(x.len() >= m * k, "input too short: {} for {m}×{k}", x.len());
    assert!(
        y.len() >= m * n,
        "output too short: {} for {m}×{n}",
        y.len()
    );
    if let Some((w2, s2)) = second {
        assert!(
            w2.n() == n && w2.k() == k && s2.len() == n,
            "second plane [{}, {}] with {} scales for [{n}, {k}]",
            w2.n(),
            w2.k(),
            s2.len()
        );
    }
    let mut xq = vec![0u8; t * m * kp];
    let params = quantize_rows_terms(x, m, k, k, terms, &mut xq, kp)?;
    let a = Activations {
        data: &xq,
        rows: t * m,
        stride: kp,
        quant: ActQuant::PerRow(&params),
    };
    if t == 1 && second.is_none() {
        let out = Output::F32 { data: y, stride: n };
        gemm(path, &a, w, epilogue, out);
        return Ok(terms);
    }
    // Each plane's products for each term alone (no bias, no activation), then summed,
    // biased, activated.
    let planes = [Some((w, epilogue.weight_scales)), second];
    let mut parts = Vec::new();
    for (wp, scales) in planes.into_iter().flatten() {
        let mut p = vec![0f32; t * m * n];
        let bare = Epilogue {
            weight_scales: scales,
            bias: None,
            activation: Activation::None,
        };
        gemm(
            path,
            &a,
            wp,
            &bare,
            Output::F32 {
                data: &mut p,
                stride: n,
            },
        );
        parts.push(p);
    }
    for (i, yr) in y[..m * n].chunks_exact_mut(n.max(1)).enumerate() {
        yr.fill(0.0);
        // Plane by plane, term by term: for one plane and two terms, (p₁ + p₂) + bias as
        // before planes existed.
        for term in parts.iter().flat_map(|p| p.chunks_exact(m * n)) {
            for (o, v) in yr.iter_mut().zip(&term[i * n..(i + 1) * n]) {
                *o += v;
            }
        }
        if let Some(b) = epilogue.bias {
            for (o, b) in yr.iter_mut().zip(b) {
                *o += b;
            }
        }
        activate(epilogue.activation, yr);
    }
    Ok(terms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::int8::quantize_weights;

    fn rows(m: usize, k: usize, seed: u32) -> Vec<f32> {
        // A deterministic spread of magnitudes and signs, some rows shifted (non-zero mean).
        (0..m * k)
            .map(|i| {
                let h = (i as u32 ^ seed).wrapping_mul(2_654_435_761) >> 8;
                let u = h as f32 / (1u32 << 24) as f32 - 0.5;
                3.0 * u + if (i / k).is_multiple_of(3) { 0.7 } else { 0.0 }
            })
            .collect()
    }

    /// The two-term rows reproduce x to within half a step of the second term, far inside
    /// the first term's half step.
    #[test]
    fn two_terms_carry_the_first_terms_rounding_error() {
        let (m, k) = (5, 37);
        let x = rows(m, k, 1);
        let mut q = vec![0u8; 2 * m * k];
        let p = quantize_rows_terms(&x, m, k, k, ActTerms::Two, &mut q, k).unwrap();
        assert_eq!(p.len(), 2 * m);
        for i in 0..m {
            let (p1, p2) = (p[i], p[m + i]);
            assert!(p2.scale < p1.scale / 100.0, "row {i}: {p1:?} {p2:?}");
            for c in 0..k {
                let v = p1.dequantize(q[i * k + c]) + p2.dequantize(q[(m + i) * k + c]);
                let e = (v - x[i * k + c]).abs();
                assert!(e <= 0.5 * p2.scale + 1e-6, "row {i} col {c}: error {e}");
            }
        }
        // Auto: two terms up to TWO_TERMS_MAX_ROWS rows, then one.
        let big = rows(TWO_TERMS_MAX_ROWS + 1, k, 4);
        let mut qb = vec![0u8; 2 * big.len()];
        let n1 = quantize_rows_terms(
            &big,
            TWO_TERMS_MAX_ROWS + 1,
            k,
            k,
            ActTerms::Auto,
            &mut qb,
            k,
        );
        assert_eq!(n1.unwrap().len(), TWO_TERMS_MAX_ROWS + 1);
        let mut q3 = vec![0u8; 6 * k];
        let n2 = quantize_rows_terms(&x[..3 * k], 3, k, k, ActTerms::Auto, &mut q3, k).unwrap();
        assert_eq!(n2.len(), 6);
        let mut bad = x.clone();
        bad[k + 3] = f32::NAN;
        let e = quantize_rows_terms(&bad, m, k, k, ActTerms::Two, &mut q, k).unwrap_err();
        assert!(e.0.contains("row 1"), "{}", e.0);
    }

    /// Auto takes two terms only for a few rows against a weight too large to stay in cache.
    #[test]
    fn auto_takes_two_terms_for_few_rows_of_a_large_weight() {
        let (big, small) = (TWO_TERMS_MIN_WEIGHT, TWO_TERMS_MIN_WEIGHT - 1);
        assert_eq!(ActTerms::Auto.for_weight(1, big), ActTerms::Two);
        assert_eq!(
            ActTerms::Auto.for_weight(TWO_TERMS_MAX_ROWS, big),
            ActTerms::Two
        );
        assert_eq!(
            ActTerms::Auto.for_weight(TWO_TERMS_MAX_ROWS + 1, big),
            ActTerms::One
        );
        assert_eq!(ActTerms::Auto.for_weight(1, small), ActTerms::One);
        assert_eq!(ActTerms::Two.for_weight(64, small), ActTerms::Two);
        assert_eq!(ActTerms::One.for_weight(1, big), ActTerms::One);
    }

    /// Against an f64 reference on the dequantized weights: two terms leave only the f32
    /// rounding (the weights are exact here), one term the activations' u8 error; every path
    /// gives the same bits, with bias and GELU applied once.
    #[test]
    fn every_path_matches_the_reference_and_two_terms_are_far_closer() {
        let (m, k, n) = (3, 70, 21);
        let x = rows(m, k, 2);
        let wf = rows(n, k, 3);
        let (q, s) = quantize_weights(&wf, n, k).unwrap();
        let w = PackedWeights::pack(&q, n, k).unwrap();
        let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.1 - 1.0).collect();
        let reference: Vec<f64> = (0..m * n)
            .map(|e| {
                let (i, j) = (e / n, e % n);
                let dot: f64 = (0..k)
                    .map(|c| x[i * k + c] as f64 * (s[j] * q[j * k + c] as f32) as f64)
                    .sum();
                dot + bias[j] as f64
            })
            .collect();
        let scale = reference.iter().fold(0f64, |a, v| a.max(v.abs()));
        // A weight this small stays in cache: Auto is one term even for 3 rows.
        for (terms, limit) in [
            (ActTerms::One, 2e-2),
            (ActTerms::Two, 2e-4),
            (ActTerms::Auto, 2e-2),
        ] {
            let ep = Epilogue {
                weight_scales: &s,
                bias: Some(&bias),
                activation: Activation::None,
            };
            let mut seen: Option<Vec<u32>> = None;
            for path in Int8Path::available() {
                let mut y = vec![0f32; m * n];
                linear_dynamic(path, &x, m, &w, &ep, terms, &mut y).unwrap();
                let worst = y
                    .iter()
                    .zip(&reference)
                    .fold(0f64, |a, (y, r)| a.max((*y as f64 - r).abs()));
                assert!(
                    worst <= limit * scale,
                    "{path:?} {terms:?}: error {worst} vs {scale}"
                );
                if terms != ActTerms::Two {
                    assert!(worst > 2e-4 * scale, "one term should show u8 error");
                }
                let bits: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                assert_eq!(
                    seen.get_or_insert(bits.clone()),
                    &bits,
                    "{path:?} {terms:?}"
                );
                let gelu = Epilogue {
                    activation: Activation::GeluTanh,
                    ..ep
                };
                let mut g = vec![0f32; m * n];
                linear_dynamic(path, &x, m, &w, &gelu, terms, &mut g).unwrap();
                let mut want = y.clone();
                activate(Activation::GeluTanh, &mut want);
                assert_eq!(g, want, "{path:?} {terms:?}: GELU after the sum");
            }
        }
    }
}
