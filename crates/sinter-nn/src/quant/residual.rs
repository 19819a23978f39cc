//! A second int8 plane: for embedding tables (and how a tied output head uses it) and for the
//! Linear layers asked to have one.
//!
//! An int8 row (output channel) is w ≈ s₁·q₁. The second plane quantizes what that leaves,
//! w − s₁·q₁ ≈ s₂·q₂ (again per row, max/127), so s₁·q₁ + s₂·q₂ is within about 1/64,000 of
//! the row's largest entry: table lookups read both planes and are all but exact, and a Linear
//! with two planes runs the int8 GEMM once per plane over the same u8 input and sums them
//! (weights ~16 bits precise for twice the int8 work, still well below an f32 GEMM's).
//!
//! A tied head keeps its int8 GEMM over plane 1 alone (the cost of a 50k-row head does not
//! double) and then *rescores* the rows that could be the largest output: for an input row x,
//! each output's plane-1 value is off from the two-plane value by at most
//! `M = max_j ‖s₂q₂ⱼ‖₂·‖x‖₂ + max_j ‖s₁q₁ⱼ‖₂·‖x̂ − x‖₂` (Cauchy–Schwarz: the first term for
//! the weights' plane 2, the second for the GEMM's u8 input x̂, whose error is computed
//! exactly by quantizing the row again the same way, in one or two terms). So only outputs
//! within 2M of the plane-1 maximum can be the two-plane maximum; those are recomputed in f32
//! from both planes and x. Greedy decoding then picks the argmax of the two-plane head
//! exactly, at the cost of a few dot products per row where the distribution is peaked (more
//! where the top is a near-tie, which is where it matters); sampling sees exact values at the
//! top of the distribution. The other outputs keep their plane-1 values.

use std::sync::Arc;

use sinter_core::kernels::qmatmul::QWeight;
use sinter_core::{bail, Result};
use sinter_cpu::int8::{quantize_rows_terms, quantize_weights, ActTerms, PackedWeights};
use sinter_cpu::math::dot_lanes;

use super::host::{check_scales, int8_err};

/// The second plane of an [n, k] int8 weight: values packed for the GEMM kernels, per-row
/// scales.
pub struct ResidualPlane {
    packed: Arc<PackedWeights>,
    scales: Arc<[f32]>,
    /// max_j ‖s₂ⱼ·q₂ⱼ‖₂: how far plane 2 moves any output per unit of ‖x‖₂.
    max_norm: f32,
    /// max_j ‖s₁ⱼ·q₁ⱼ‖₂ of the first plane: how far an input error moves any plane-1 output.
    plane1_max_norm: f32,
}

impl ResidualPlane {
    /// The plane carrying `w − s₁·q₁` for the f32 weight `w` ([n, k], row-major) and its first
    /// plane (`q1` row-major, `s1` per row).
    pub fn from_error(w: &[f32], q1: &[i8], s1: &[f32], k: usize) -> Result<ResidualPlane> {
        let n = s1.len();
        if w.len() != n * k || q1.len() != n * k {
            bail!(
                "second int8 plane: {} f32 and {} int8 values for [{n}, {k}]",
                w.len(),
                q1.len()
            );
        }
        let error: Vec<f32> = w
            .chunks_exact(k.max(1))
            .zip(q1.chunks_exact(k.max(1)))
            .zip(s1)
            .flat_map(|((wr, qr), &s)| wr.iter().zip(qr).map(move |(&v, &q)| v - s * q as f32))
            .collect();
        let (values, scales) = quantize_weights(&error, n, k).map_err(int8_err)?;
        ResidualPlane::from_int8(values, scales, q1, s1)
    }

    /// From stored values ([n, k] row-major, as the first plane `q1`) and per-row scales.
    pub fn from_int8(
        values: Vec<i8>,
        scales: Vec<f32>,
        q1: &[i8],
        s1: &[f32],
    ) -> Result<ResidualPlane> {
        if scales.len() != s1.len() || values.len() != q1.len() {
            bail!(
                "second int8 plane: {} values and {} scales for a first plane of {} values in {} rows",
                values.len(),
                scales.len(),
                q1.len(),
                s1.len()
            );
        }
        let k = q1.len() / s1.len().max(1);
        if let Err(e) = check_scales(&values, k, &scales) {
            bail!("second int8 plane: {e}");
        }
        if let Some(i) = values.iter().position(|&v| v == i8::MIN) {
            bail!(
                "second int8 plane: value -128 at row {}, column {} (symmetric int8 lies in [-127, 127])",
                i / k.max(1),
                i % k.max(1)
            );
        }
        Ok(ResidualPlane {
            max_norm: max_row_norm(&values, &scales, k),
            plane1_max_norm: max_row_norm(q1, s1, k),
            packed: Arc::new(PackedWeights::pack(&values, scales.len(), k).map_err(int8_err)?),
            scales: scales.into(),
        })
    }

    /// The values, row-major.
    pub fn values(&self) -> Vec<i8> {
        self.packed.unpack()
    }
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// The plane as the qmatmul kernel takes it, on the CPU (sharing the packed values).
    pub(crate) fn qweight(&self) -> Result<QWeight> {
        QWeight::int8_cpu(self.packed.clone(), self.scales.clone())
    }
    /// Bytes in a checkpoint: one per value, four per row scale.
    pub fn bytes(&self) -> usize {
        self.packed.n() * self.packed.k() + 4 * self.scales.len()
    }

    /// out += s₂ⱼ·q₂ⱼ (row j's share of plane 2), with `q` (k values) as scratch.
    pub fn add_row(&self, j: usize, q: &mut [i8], out: &mut [f32]) {
        self.packed.row_into(j, q);
        let s = self.scales[j];
        for (o, &q) in out.iter_mut().zip(q.iter()) {
            *o += s * q as f32;
        }
    }

    /// Rescoring of one output row (see the module comment): `y` holds the plane-1 outputs
    /// (bias added) for the input row `x`, which the GEMM quantized in `terms` (decided, not
    /// `Auto`); the outputs that could be the two-plane maximum are recomputed from both
    /// planes. Returns how many were.
    pub(crate) fn rescore_row(
        &self,
        plane1: &PackedWeights,
        s1: &[f32],
        bias: Option<&[f32]>,
        x: &[f32],
        terms: ActTerms,
        y: &mut [f32],
    ) -> Result<usize> {
        let Some(top) = y.iter().copied().filter(|v| !v.is_nan()).reduce(f32::max) else {
            return Ok(0);
        };
        let x_norm = dot_lanes(x, x).sqrt() * 1.001;
        let bound = self.max_norm * x_norm + self.plane1_max_norm * input_error(x, terms)?;
        // With a slack for the f32 rounding of the GEMM epilogue and of the sums here.
        let threshold = top - 2.0 * bound * 1.01 - 1e-5 * top.abs().max(1.0);
        let (mut q, mut q2) = (vec![0i8; x.len()], vec![0i8; x.len()]);
        let mut rescored = 0;
        // (NaN outputs are never candidates.)
        for j in 0..y.len() {
            if y[j] >= threshold {
                plane1.row_into(j, &mut q);
                self.packed.row_into(j, &mut q2);
                let (d1, d2) = (dot_lanes(&q, x), dot_lanes(&q2, x));
                y[j] = s1[j] * d1 + self.scales[j] * d2 + bias.map_or(0.0, |b| b[j]);
                rescored += 1;
            }
        }
        Ok(rescored)
    }
}

/// ‖x̂ − x‖₂ for the u8 terms the GEMM made of the row x (the same quantizer, so the same
/// bytes), with a margin for the f32 arithmetic here.
fn input_error(x: &[f32], terms: ActTerms) -> Result<f32> {
    let k = x.len();
    let mut bytes = vec![0u8; 2 * k];
    let params = quantize_rows_terms(x, 1, k, k, terms, &mut bytes, k).map_err(int8_err)?;
    let mut err = x.to_vec();
    for (p, b) in params.iter().zip(bytes.chunks_exact(k.max(1))) {
        for (e, &q) in err.iter_mut().zip(b) {
            *e -= p.dequantize(q);
        }
    }
    let (norm, x_max) = (
        dot_lanes(&err, &err).sqrt(),
        x.iter().fold(0f32, |m, v| m.max(v.abs())),
    );
    // Each subtraction rounds by at most 2⁻²⁴ of |x|'s largest: a slack of 10⁻⁶·√k·max|x|.
    Ok(norm * 1.001 + 1e-6 * (k as f32).sqrt() * x_max)
}

/// max over rows of ‖s·q‖₂.
fn max_row_norm(values: &[i8], scales: &[f32], k: usize) -> f32 {
    values
        .chunks_exact(k.max(1))
        .zip(scales)
        .map(|(r, &s)| {
            s * r
                .iter()
                .map(|&q| (q as f32) * (q as f32))
                .sum::<f32>()
                .sqrt()
        })
        .fold(0f32, f32::max)
}
