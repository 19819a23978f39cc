//! Error-feedback rounding of int8 weights from calibration inputs (GPTQ: Frantar et al.,
//! "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers", 2022).
//!
//! Rounding each weight to nearest minimises each weight's own error, but what matters is the
//! layer's output error ‖X(W − Ŵ)ᵀ‖² over real inputs X. With H = XᵀX (the inputs' Gram
//! matrix), the channels are independent and each row w is rounded one input at a time: after
//! rounding w_i, its error is spread over the inputs not yet rounded, w_{>i} −= e·U_{i,>i}/U_ii,
//! where H⁻¹ = UᵀU (U upper triangular), which is the least-squares correction given the
//! inputs' correlations. The per-channel scale stays the round-to-nearest one (max|w|/127), so
//! the file format and the kernels do not change; only which of the two nearest int8 values
//! each weight takes (and, rarely, one step further) does.
//!
//! H is damped by 1 % of its mean diagonal (the paper's default), which keeps the inverse
//! well conditioned when there are fewer calibration rows than inputs, and an input no
//! calibration row touched (a zero diagonal) is treated as uncorrelated.

use rayon::prelude::*;
use sinter_cpu::int8::WeightChannel;

/// Relative damping of H (added to the diagonal, times its mean).
pub const DAMPING: f64 = 0.01;

/// The Gram matrix Σ x xᵀ of a layer's calibration inputs (k × k, row-major), accumulated
/// over batches.
#[derive(Clone, Debug)]
pub struct Gram {
    pub k: usize,
    pub h: Vec<f64>,
    /// Input rows seen.
    pub rows: usize,
}

impl Gram {
    pub fn new(k: usize) -> Gram {
        Gram {
            k,
            h: vec![0.0; k * k],
            rows: 0,
        }
    }

    /// Adds the product xᵀx of `rows` rows (given as that k × k product, f32).
    pub fn add(&mut self, xtx: &[f32], rows: usize) {
        debug_assert_eq!(xtx.len(), self.h.len());
        self.h
            .iter_mut()
            .zip(xtx)
            .for_each(|(h, v)| *h += *v as f64);
        self.rows += rows;
    }

    /// U (upper triangular, row-major, f32) with (H + λI)⁻¹ = UᵀU.
    ///
    /// With P the index reversal, P(H + λI)P = L Lᵀ (Cholesky), and then
    /// (H + λI)⁻¹ = (P L⁻¹ P)ᵀ (P L⁻¹ P), so U = P L⁻¹ P: one Cholesky factorisation and one
    /// triangular inverse, both O(k³/6).
    pub fn inverse_factor(&self) -> Vec<f32> {
        let k = self.k;
        let mean = (0..k).map(|i| self.h[i * k + i]).sum::<f64>() / k.max(1) as f64;
        let damp = DAMPING * mean.max(f64::MIN_POSITIVE);
        let rev = |i: usize| k - 1 - i;
        let mut l = vec![0f64; k * k];
        for i in 0..k {
            for j in 0..=i {
                let a = self.h[rev(i) * k + rev(j)];
                let dot: f64 = l[i * k..i * k + j]
                    .iter()
                    .zip(&l[j * k..j * k + j])
                    .map(|(x, y)| x * y)
                    .sum();
                l[i * k + j] = if i == j {
                    // A dead input (no calibration row touched it) stands alone.
                    let d = a + damp - dot;
                    let d = if self.h[rev(i) * k + rev(i)] == 0.0 {
                        d + 1.0
                    } else {
                        d
                    };
                    d.max(damp).sqrt()
                } else {
                    (a - dot) / l[j * k + j]
                };
            }
        }
        let li = lower_inverse(&l, k);
        let mut u = vec![0f32; k * k];
        for i in 0..k {
            for j in i..k {
                u[i * k + j] = li[rev(i) * k + rev(j)] as f32;
            }
        }
        u
    }
}

/// The inverse of a lower-triangular k × k matrix (row-major), row by row:
/// row i = (e_i − Σ_{m<i} L_im · row m) / L_ii.
fn lower_inverse(l: &[f64], k: usize) -> Vec<f64> {
    let mut inv = vec![0f64; k * k];
    let mut row = vec![0f64; k];
    for i in 0..k {
        row[..=i].fill(0.0);
        row[i] = 1.0;
        for m in 0..i {
            let c = l[i * k + m];
            if c != 0.0 {
                for (r, v) in row[..=m].iter_mut().zip(&inv[m * k..m * k + m + 1]) {
                    *r -= c * v;
                }
            }
        }
        let d = l[i * k + i];
        for (o, r) in inv[i * k..i * k + i + 1].iter_mut().zip(&row) {
            *o = r / d;
        }
    }
    inv
}

/// Per-channel symmetric int8 of a row-major [n, k] weight, rounded with error feedback
/// through `u` (`Gram::inverse_factor`): the same scales as round-to-nearest
/// (`sinter_cpu::int8::quantize_weights`), values chosen to minimise the output error on the
/// calibration inputs. The caller has checked that every weight is finite.
pub fn quantize_weights_gptq(w: &[f32], n: usize, k: usize, u: &[f32]) -> (Vec<i8>, Vec<f32>) {
    debug_assert_eq!(w.len(), n * k);
    debug_assert_eq!(u.len(), k * k);
    let mut q = vec![0i8; n * k];
    let mut scales = vec![0f32; n];
    q.par_chunks_mut(k.max(1))
        .zip(scales.par_iter_mut())
        .zip(w.par_chunks(k.max(1)))
        .for_each(|((q, scale), row)| {
            let Some(c) = WeightChannel::of(row) else {
                return;
            };
            *scale = c.scale;
            let mut w = row.to_vec();
            for i in 0..k {
                q[i] = c.quantize(w[i]);
                let e = (w[i] - q[i] as f32 * c.scale) / u[i * k + i];
                let ui = &u[i * k + i + 1..(i + 1) * k];
                for (wj, uj) in w[i + 1..].iter_mut().zip(ui) {
                    *wj -= e * uj;
                }
            }
        });
    (q, scales)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::Rng;
    use sinter_cpu::int8::quantize_weights;

    /// (H + λI)⁻¹ = UᵀU with U upper triangular.
    #[test]
    fn inverse_factor_inverts_the_damped_gram() {
        let k = 9;
        let mut rng = Rng::new(5);
        let x: Vec<f32> = (0..40 * k).map(|_| rng.normal() as f32).collect();
        let mut g = Gram::new(k);
        g.add(&xtx(&x, k), 40);
        let u = g.inverse_factor();
        let mean = (0..k).map(|i| g.h[i * k + i]).sum::<f64>() / k as f64;
        for i in 0..k {
            for j in 0..i {
                assert_eq!(u[i * k + j], 0.0, "U must be upper triangular");
            }
            for j in 0..k {
                // ((UᵀU)(H + λI))_ij = δ_ij
                let v: f64 = (0..k)
                    .map(|m| {
                        let utu: f64 = (0..k)
                            .map(|r| u[r * k + i] as f64 * u[r * k + m] as f64)
                            .sum();
                        let hd = g.h[m * k + j] + if m == j { DAMPING * mean } else { 0.0 };
                        utu * hd
                    })
                    .sum();
                let want = if i == j { 1.0 } else { 0.0 };
                assert!((v - want).abs() < 1e-4, "({i}, {j}): {v}");
            }
        }
    }

    /// On correlated inputs, error feedback gives a smaller output error than rounding to
    /// nearest, with the same scales and every value in range.
    #[test]
    fn error_feedback_beats_rounding_to_nearest_on_correlated_inputs() {
        let (n, k, rows) = (16, 48, 400);
        let mut rng = Rng::new(9);
        // Inputs with a shared component (as LayerNorm or GELU outputs have) and noise.
        let x: Vec<f32> = (0..rows)
            .flat_map(|_| {
                let c = rng.normal() as f32;
                (0..k)
                    .map(|i| c * (1.0 + (i % 3) as f32 * 0.5) + 0.3 * rng.normal() as f32)
                    .collect::<Vec<_>>()
            })
            .collect();
        let w: Vec<f32> = (0..n * k).map(|_| 0.02 * rng.normal() as f32).collect();
        let mut g = Gram::new(k);
        g.add(&xtx(&x, k), rows);
        let (qg, sg) = quantize_weights_gptq(&w, n, k, &g.inverse_factor());
        let (qr, sr) = quantize_weights(&w, n, k).unwrap();
        assert_eq!(sg, sr, "the scales are round-to-nearest's");
        assert!(qg.iter().all(|&v| v >= -127), "values stay in [-127, 127]");
        let err = |q: &[i8], s: &[f32]| -> f64 {
            let mut e = 0.0;
            for r in 0..rows {
                for j in 0..n {
                    let d: f64 = (0..k)
                        .map(|i| {
                            (x[r * k + i] * (w[j * k + i] - s[j] * q[j * k + i] as f32)) as f64
                        })
                        .sum();
                    e += d * d;
                }
            }
            e
        };
        let (eg, er) = (err(&qg, &sg), err(&qr, &sr));
        assert!(eg < 0.5 * er, "error feedback {eg} vs nearest {er}");
    }

    fn xtx(x: &[f32], k: usize) -> Vec<f32> {
        let rows = x.len() / k;
        let mut g = vec![0f32; k * k];
        for r in 0..rows {
            for i in 0..k {
                for j in 0..k {
                    g[i * k + j] += x[r * k + i] * x[r * k + j];
                }
            }
        }
        g
    }
}
