//! The fused row kernels (softmax, cross-entropy, bias + activation, AdamW, RMSNorm) on
//! every ISA against f64 references, on row lengths that are not multiples of any vector.
//! LayerNorm's row kernels are tested in sinter-core's LayerNorm folder, beside the op's one
//! f64 reference.

mod reference;

use sinter_cpu::math::activation::Activation;
use sinter_cpu::math::adamw::{adamw, AdamW};
use sinter_cpu::math::bias_act::{bias_act_backward_rows, bias_act_rows};
use sinter_cpu::math::cross_entropy::{
    cross_entropy_rows, cross_entropy_rows_backward, STATS_PER_ROW,
};
use sinter_cpu::math::softmax::{softmax_rows, softmax_rows_backward};
use sinter_cpu::Isa;

fn vals(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

fn close(what: &str, got: &[f32], want: &[f64], rel: f64, abs: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= rel * w.abs() + abs,
            "{what}[{i}]: got {g}, want {w}"
        );
    }
}

const LENS: [usize; 5] = [1, 7, 17, 63, 129];

#[test]
fn softmax_and_log_softmax_rows_match_f64_forward_and_backward() {
    for isa in Isa::available() {
        for n in LENS {
            let rows = 3;
            let x = vals(rows * n, n as u64, 8.0);
            let g = vals(rows * n, 99, 1.0);
            for log in [false, true] {
                let mut y = vec![0f32; x.len()];
                softmax_rows(isa, &x, &mut y, n, log);
                let mut want = vec![0f64; x.len()];
                let mut want_dx = vec![0f64; x.len()];
                for r in 0..rows {
                    let row: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
                    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                    let gs: f64 = g[r * n..(r + 1) * n].iter().map(|&v| v as f64).sum();
                    let p: Vec<f64> = row.iter().map(|v| (v - m).exp() / s).collect();
                    let pg: f64 = p
                        .iter()
                        .zip(&g[r * n..(r + 1) * n])
                        .map(|(a, &b)| a * b as f64)
                        .sum();
                    for j in 0..n {
                        let gj = g[r * n + j] as f64;
                        want[r * n + j] = if log { row[j] - m - s.ln() } else { p[j] };
                        want_dx[r * n + j] = if log {
                            gj - p[j] * gs
                        } else {
                            p[j] * (gj - pg)
                        };
                    }
                }
                close(
                    &format!("{isa:?} softmax log={log} n={n}"),
                    &y,
                    &want,
                    2e-6,
                    1e-7,
                );
                let mut dx = vec![0f32; x.len()];
                softmax_rows_backward(isa, &y, &g, &mut dx, n, log);
                close(
                    &format!("{isa:?} softmax backward log={log} n={n}"),
                    &dx,
                    &want_dx,
                    1e-5,
                    1e-6,
                );
            }
        }
    }
}

#[test]
fn cross_entropy_keeps_precision_for_confident_predictions_and_checks_targets() {
    for isa in Isa::available() {
        for n in LENS {
            let rows = 4;
            let mut x = vals(rows * n, 7 + n as u64, 4.0);
            // Row 0: a confident prediction, large logits: the loss is ~e^-30 relative to them.
            x[0] = 1000.0;
            for v in &mut x[1..n] {
                *v = 970.0;
            }
            let targets: Vec<i64> = (0..rows as i64)
                .map(|r| if r == 2 { -100 } else { r % n as i64 })
                .collect();
            let (mut loss, mut stats) = (vec![0f32; rows], vec![0f32; rows * STATS_PER_ROW]);
            cross_entropy_rows(isa, &x, n, &targets, -100, &mut loss, &mut stats).unwrap();
            let mut want_loss = vec![0f64; rows];
            let mut want_stats = vec![0f64; rows * STATS_PER_ROW];
            let mut want_dx = vec![0f64; x.len()];
            for r in 0..rows {
                let row: Vec<f64> = x[r * n..(r + 1) * n].iter().map(|&v| v as f64).collect();
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                // ln Σ e^(x − m) = ln_1p(Σ over all but one max): f64 loses a tiny rest too.
                let top = row.iter().position(|&v| v == m).unwrap();
                let rest: f64 = row
                    .iter()
                    .enumerate()
                    .filter(|&(j, _)| j != top)
                    .map(|(_, v)| (v - m).exp())
                    .sum();
                let ls = rest.ln_1p();
                want_stats[r * STATS_PER_ROW] = m;
                want_stats[r * STATS_PER_ROW + 1] = ls;
                if targets[r] == -100 {
                    continue;
                }
                let t = targets[r] as usize;
                want_loss[r] = ls - (row[t] - m);
                for j in 0..n {
                    want_dx[r * n + j] = 0.25 * (row[j] - m - ls).exp();
                }
                // p_t − 1 without cancellation: row 0's is ~(n − 1)e^-30.
                want_dx[r * n + t] = 0.25 * (row[t] - m - ls).exp_m1();
            }
            // Relative precision of the loss itself, even where it is tiny (row 0: ~(n−1)e^-30).
            close(
                &format!("{isa:?} ce loss n={n}"),
                &loss,
                &want_loss,
                1e-5,
                1e-30,
            );
            close(
                &format!("{isa:?} ce stats n={n}"),
                &stats,
                &want_stats,
                1e-5,
                1e-30,
            );
            let mut dx = vec![0f32; x.len()];
            cross_entropy_rows_backward(isa, &x, n, &targets, -100, &stats, 0.25, &mut dx).unwrap();
            // Every probability to its own relative precision, the target's p − 1 included.
            close(
                &format!("{isa:?} ce backward n={n}"),
                &dx,
                &want_dx,
                1e-5,
                1e-30,
            );
        }
        let x = vals(6, 1, 1.0);
        let (mut loss, mut stats) = (vec![0f32; 2], vec![0f32; 2 * STATS_PER_ROW]);
        let e = cross_entropy_rows(isa, &x, 3, &[0, 3], -100, &mut loss, &mut stats).unwrap_err();
        assert!(e.to_string().contains("target 3 at row 1"), "{e}");
    }
}

#[test]
fn bias_activation_rows_match_f64_forward_and_backward() {
    use reference as r;
    for isa in Isa::available() {
        for n in LENS {
            let rows = 3;
            let x = vals(rows * n, 21 + n as u64, 4.0);
            let bias = vals(n, 23, 1.0);
            let g = vals(rows * n, 29, 1.0);
            for act in [
                Activation::None,
                Activation::Relu,
                Activation::GeluTanh,
                Activation::GeluErf,
            ] {
                let f = |u: f64| match act {
                    Activation::None => (u, 1.0),
                    Activation::Relu => (u.max(0.0), if u > 0.0 { 1.0 } else { 0.0 }),
                    Activation::GeluTanh => (r::gelu_tanh(u), r::gelu_tanh_grad(u)),
                    Activation::GeluErf => (r::gelu_erf(u), r::gelu_erf_grad(u)),
                };
                let mut y = vec![0f32; x.len()];
                bias_act_rows(isa, &x, &bias, act, &mut y);
                let (mut dx, mut db) = (vec![0f32; x.len()], vec![0.5f32; n]);
                bias_act_backward_rows(isa, &x, &bias, act, &g, &mut dx, &mut db);
                let (mut wy, mut wdx, mut wdb) =
                    (vec![0f64; x.len()], vec![0f64; x.len()], vec![0.5f64; n]);
                for i in 0..x.len() {
                    let (v, d) = f(x[i] as f64 + bias[i % n] as f64);
                    wy[i] = v;
                    wdx[i] = g[i] as f64 * d;
                    wdb[i % n] += wdx[i];
                }
                close(&format!("{isa:?} {act:?} n={n}"), &y, &wy, 1e-5, 1e-6);
                close(&format!("{isa:?} {act:?} dx n={n}"), &dx, &wdx, 1e-5, 1e-6);
                close(
                    &format!("{isa:?} {act:?} dbias n={n}"),
                    &db,
                    &wdb,
                    1e-5,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn adamw_follows_pytorchs_formula_on_every_isa() {
    let h = AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
        step: 3,
    };
    for isa in Isa::available() {
        for n in [1, 17, 129] {
            let (mut p, g, mut m, mut v) = (
                vals(n, 1, 1.0),
                vals(n, 2, 1.0),
                vals(n, 3, 0.1),
                vals(n, 4, 0.01),
            );
            for x in &mut v {
                *x = x.abs();
            }
            let (p0, m0, v0) = (p.clone(), m.clone(), v.clone());
            adamw(isa, &mut p, &g, &mut m, &mut v, h, 0.5);
            let (bc1, bc2) = (1.0 - 0.9f64.powi(3), 1.0 - 0.999f64.powi(3));
            let f = h.factors();
            for i in 0..n {
                // Bit for bit the shared scalar rule (the CUDA kernel's too).
                let want = f.update(p0[i], g[i] * 0.5, m0[i], v0[i]);
                assert_eq!((p[i], m[i], v[i]), want, "{isa:?} adamw n={n} element {i}");
                let gi = g[i] as f64 * 0.5;
                let mi = m0[i] as f64 + 0.1 * (gi - m0[i] as f64);
                let vi = 0.999 * v0[i] as f64 + 0.001 * gi * gi;
                let pi =
                    p0[i] as f64 * (1.0 - 1e-5) - 1e-3 / bc1 * mi / (vi.sqrt() / bc2.sqrt() + 1e-8);
                close(
                    &format!("{isa:?} adamw m n={n}"),
                    &m[i..=i],
                    &[mi],
                    1e-6,
                    1e-9,
                );
                close(
                    &format!("{isa:?} adamw v n={n}"),
                    &v[i..=i],
                    &[vi],
                    1e-6,
                    1e-12,
                );
                close(
                    &format!("{isa:?} adamw p n={n}"),
                    &p[i..=i],
                    &[pi],
                    1e-6,
                    1e-9,
                );
            }
        }
    }
}

/// RMSNorm in f64 per row of n: (y, 1/rms per row).
fn rms_norm_f64(x: &[f32], w: &[f32], eps: f32) -> (Vec<f64>, Vec<f64>) {
    let n = w.len();
    let (mut y, mut inv) = (Vec::with_capacity(x.len()), vec![]);
    for row in x.chunks(n) {
        let ms: f64 = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / n as f64;
        let r = 1.0 / (ms + eps as f64).sqrt();
        y.extend(row.iter().zip(w).map(|(&v, &g)| v as f64 * r * g as f64));
        inv.push(r);
    }
    (y, inv)
}

#[test]
fn rms_norm_rows_match_f64_on_every_isa() {
    use sinter_cpu::math::rms_norm::{residual_rms_norm_rows, rms_norm_rows};
    for isa in Isa::available() {
        for n in LENS {
            let rows = 3;
            let x = vals(rows * n, n as u64 + 5, 4.0);
            let a = vals(rows * n, n as u64 + 6, 2.0);
            let w = vals(n, 17, 2.0);
            let eps = 1e-5f32;
            let mut y = vec![0f32; x.len()];
            rms_norm_rows(isa, &x, &w, eps, &mut y);
            close(
                &format!("rms_norm {isa:?} n={n}"),
                &y,
                &rms_norm_f64(&x, &w, eps).0,
                1e-5,
                1e-6,
            );
            // The residual form: the sum exactly, its norm bit-identical to the plain kernel's.
            let (mut s, mut ys) = (vec![f32::NAN; x.len()], vec![f32::NAN; x.len()]);
            residual_rms_norm_rows(isa, &x, &a, &w, eps, &mut s, &mut ys);
            let sum: Vec<f32> = x.iter().zip(&a).map(|(p, q)| p + q).collect();
            assert_eq!(s, sum, "residual_rms_norm sum {isa:?} n={n}");
            rms_norm_rows(isa, &sum, &w, eps, &mut y);
            assert_eq!(ys, y, "residual_rms_norm {isa:?} n={n}");
        }
    }
}

/// dx = r·dy·w − x·r³·Σ(dy·w·x)/n (+ the sum's gradient) and dw += Σ_rows dy·x·r, in f64.
#[test]
fn rms_norm_backward_rows_match_f64_on_every_isa() {
    use sinter_cpu::math::rms_norm::rms_norm_backward_rows;
    for isa in Isa::available() {
        for n in LENS {
            let rows = 3;
            let x = vals(rows * n, n as u64 + 7, 4.0);
            let dy = vals(rows * n, n as u64 + 8, 1.0);
            let ds = vals(rows * n, n as u64 + 9, 1.0);
            let w = vals(n, 19, 2.0);
            let eps = 1e-5f32;
            let (_, inv) = rms_norm_f64(&x, &w, eps);
            let (mut want_dx, mut want_dw) = (vec![0f64; x.len()], vec![0.5f64; n]);
            for (r, &ri) in inv.iter().enumerate() {
                let at = r * n..(r + 1) * n;
                let dot: f64 = at
                    .clone()
                    .map(|i| dy[i] as f64 * w[i - r * n] as f64 * x[i] as f64)
                    .sum();
                for i in at {
                    let j = i - r * n;
                    want_dx[i] =
                        ri * dy[i] as f64 * w[j] as f64 - x[i] as f64 * ri.powi(3) * dot / n as f64;
                    want_dw[j] += dy[i] as f64 * x[i] as f64 * ri;
                }
            }
            for with_sum in [false, true] {
                let (mut dx, mut dw) = (vec![f32::NAN; x.len()], vec![0.5f32; n]);
                let dsum = with_sum.then_some(&ds[..]);
                rms_norm_backward_rows(isa, &x, &w, eps, &dy, dsum, &mut dx, &mut dw);
                let want: Vec<f64> = if with_sum {
                    want_dx
                        .iter()
                        .zip(&ds)
                        .map(|(d, &s)| d + s as f64)
                        .collect()
                } else {
                    want_dx.clone()
                };
                let what = format!("rms_norm_backward {isa:?} n={n} sum {with_sum}");
                close(&format!("{what}: dx"), &dx, &want, 1e-4, 1e-5);
                close(
                    &format!("{what}: dw (accumulated onto 0.5)"),
                    &dw,
                    &want_dw,
                    1e-4,
                    1e-5,
                );
            }
        }
    }
}

#[test]
fn swiglu_matches_f64_on_every_isa() {
    for isa in Isa::available() {
        for n in LENS {
            let (g, u) = (vals(n, 3, 12.0), vals(n, 4, 3.0));
            let mut y = vec![0f32; n];
            sinter_cpu::math::swiglu_isa(isa, &g, &u, &mut y);
            let want: Vec<f64> = (g.iter().zip(&u))
                .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
                .collect();
            close(&format!("swiglu {isa:?} n={n}"), &y, &want, 1e-5, 1e-7);
            // The backward: dgate = dy·up·silu'(gate), dup = dy·silu(gate).
            let dy = vals(n, 5, 1.0);
            let (mut dg, mut du) = (vec![f32::NAN; n], vec![f32::NAN; n]);
            sinter_cpu::math::swiglu_backward_isa(isa, &g, &u, &dy, &mut dg, &mut du);
            let sig = |g: f32| 1.0 / (1.0 + (-g as f64).exp());
            let want_dg: Vec<f64> = (0..n)
                .map(|i| {
                    let s = sig(g[i]);
                    dy[i] as f64 * u[i] as f64 * s * (1.0 + g[i] as f64 * (1.0 - s))
                })
                .collect();
            let want_du: Vec<f64> = (0..n)
                .map(|i| dy[i] as f64 * g[i] as f64 * sig(g[i]))
                .collect();
            close(
                &format!("swiglu dgate {isa:?} n={n}"),
                &dg,
                &want_dg,
                1e-5,
                1e-6,
            );
            close(
                &format!("swiglu dup {isa:?} n={n}"),
                &du,
                &want_du,
                1e-5,
                1e-6,
            );
        }
    }
}

/// Rotary positions over 3 heads of d on every ISA, both directions, against f64; the inverse
/// undoes the forward.
#[test]
fn rope_rotation_matches_f64_and_its_inverse_undoes_it_on_every_isa() {
    use sinter_cpu::math::rope::rope_rotate_isa;
    for isa in Isa::available() {
        for d in [2usize, 14, 34] {
            let half = d / 2;
            let x = vals(3 * d, d as u64 + 21, 3.0);
            let angle = vals(d, 23, 3.0);
            let cos: Vec<f32> = angle.iter().map(|a| a.cos()).collect();
            let sin: Vec<f32> = angle.iter().map(|a| a.sin()).collect();
            for sign in [1.0f32, -1.0] {
                let mut y = vec![f32::NAN; x.len()];
                rope_rotate_isa(isa, &x, &cos, &sin, sign, &mut y);
                let mut want = vec![0f64; x.len()];
                for (h, xh) in x.chunks(d).enumerate() {
                    for i in 0..half {
                        let (a, b) = (xh[i] as f64, xh[half + i] as f64);
                        let (s1, s2) = (
                            sign as f64 * sin[i] as f64,
                            sign as f64 * sin[half + i] as f64,
                        );
                        want[h * d + i] = a * cos[i] as f64 - b * s1;
                        want[h * d + half + i] = b * cos[half + i] as f64 + a * s2;
                    }
                }
                close(
                    &format!("rope {isa:?} d={d} sign {sign}"),
                    &y,
                    &want,
                    1e-5,
                    1e-6,
                );
            }
        }
    }
    // Tables of one angle per pair (as RoPE builds them) make the rotation orthogonal.
    let d = 34;
    let angle = vals(d / 2, 29, 3.0).repeat(2);
    let (cos, sin): (Vec<f32>, Vec<f32>) = angle.iter().map(|a| (a.cos(), a.sin())).unzip();
    let x = vals(2 * d, 31, 3.0);
    let (mut y, mut back) = (vec![0f32; x.len()], vec![0f32; x.len()]);
    rope_rotate_isa(Isa::get(), &x, &cos, &sin, 1.0, &mut y);
    rope_rotate_isa(Isa::get(), &y, &cos, &sin, -1.0, &mut back);
    let want: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    close("rope inverse of forward", &back, &want, 1e-5, 1e-5);
}
