//! The vectorised math against f64 on every ISA: dense sweeps (with every magnitude down to
//! the subnormals), the edge cases (±0, ±inf, NaN, huge and tiny arguments), the stated
//! error bounds, and each SIMD path against the scalar reference path.
//!
//! `cargo test -p sinter-cpu --test math -- --nocapture` prints the measured max errors.

mod reference;

use reference as r;
use sinter_cpu::math::{unary_backward_isa, unary_isa, Unary};
use sinter_cpu::Isa;

/// (f, its f64 reference, the domain swept, the bound in ulps, the extra ulps allowed at x
/// for the conditioning of the definition itself, an absolute floor below which differences
/// are not counted as ulps: subnormal results).
struct Spec {
    f: Unary,
    reference: fn(f64) -> f64,
    lo: f32,
    hi: f32,
    max_ulps: f64,
    slack: fn(f64) -> f64,
    abs_floor: f64,
}

fn none(_: f64) -> f64 {
    0.0
}

/// GELU-tanh of negative x is x·e^(2u) in its tail: rounding 2u in f32 (|2u| up to ~80)
/// moves the result by about 3·|2u| ulp. No f32 formula avoids it (u itself is rounded).
fn gelu_tanh_slack(x: f64) -> f64 {
    let u2 = 2.0 * (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    if x < 0.0 {
        3.0 * u2.abs()
    } else {
        0.0
    }
}

/// GELU-erf of negative x: rounding x/√2 moves −x²/2 by about x²·2^−24, i.e. x² ulp.
fn gelu_erf_slack(x: f64) -> f64 {
    if x < 0.0 {
        1.5 * x * x
    } else {
        0.0
    }
}

/// x·(a subnormal factor) carries the factor's absolute error 2^−149 times |x| ≤ 120: below
/// this the product functions' error is absolute, not relative.
const SUBNORMAL_PRODUCT: f64 = 120.0 * 1.5e-45;

fn specs() -> Vec<Spec> {
    let s = |f, reference, lo, hi, max_ulps, abs_floor| Spec {
        f,
        reference,
        lo,
        hi,
        max_ulps,
        slack: none,
        abs_floor,
    };
    vec![
        s(
            Unary::Exp,
            f64::exp as fn(f64) -> f64,
            -110.0,
            100.0,
            2.0,
            0.0,
        ),
        s(Unary::Ln, f64::ln, 0.0, f32::MAX, 2.0, 0.0),
        s(Unary::Tanh, f64::tanh, -30.0, 30.0, 2.0, 0.0),
        s(Unary::Sigmoid, r::sigmoid, -120.0, 120.0, 2.5, 0.0),
        s(
            Unary::Silu,
            |x| x * r::sigmoid(x),
            -120.0,
            120.0,
            3.0,
            SUBNORMAL_PRODUCT,
        ),
        s(Unary::Erf, r::erf, -12.0, 12.0, 2.0, 0.0),
        s(Unary::Relu, |x| x.max(0.0), -10.0, 10.0, 0.0, 0.0),
        Spec {
            slack: gelu_tanh_slack,
            ..s(
                Unary::GeluTanh,
                r::gelu_tanh,
                -30.0,
                30.0,
                4.0,
                SUBNORMAL_PRODUCT,
            )
        },
        Spec {
            slack: gelu_erf_slack,
            ..s(
                Unary::GeluErf,
                r::gelu_erf,
                -30.0,
                30.0,
                4.0,
                SUBNORMAL_PRODUCT,
            )
        },
    ]
}

/// The worst error of `got` against `want` over `xs`, less the slack at each x:
/// (ulps over the slack, at x).
fn worst(
    xs: &[f32],
    got: &[f32],
    want: impl Fn(f64) -> f64,
    slack: fn(f64) -> f64,
    abs_floor: f64,
) -> (f64, f32) {
    let mut w = (0.0, 0.0);
    for (&x, &g) in xs.iter().zip(got) {
        let t = want(x as f64);
        let e = if (g as f64 - t).abs() <= abs_floor {
            0.0
        } else {
            r::ulps(g, t) - slack(x as f64)
        };
        if e > w.0 {
            w = (e, x);
        }
    }
    w
}

#[test]
fn every_function_is_within_its_stated_ulps_of_f64_on_every_isa() {
    for spec in specs() {
        let xs = r::sweep(spec.lo, spec.hi, 200_000);
        let mut scalar_out = None;
        for isa in Isa::available() {
            let mut y = vec![0f32; xs.len()];
            unary_isa(isa, spec.f, &xs, &mut y);
            let (e, at) = worst(&xs, &y, spec.reference, spec.slack, spec.abs_floor);
            println!(
                "{:?} {isa:?}: max {e:.2} ulp beyond the slack (at x = {at:e})",
                spec.f
            );
            assert!(
                e <= spec.max_ulps,
                "{:?} on {isa:?}: {e} ulp at x = {at:e} (bound {})",
                spec.f,
                spec.max_ulps
            );
            // The SIMD paths run the scalar path's polynomial: within 1 ulp of it.
            match &scalar_out {
                None => scalar_out = Some(y),
                Some(s) => {
                    for ((&x, &a), &b) in xs.iter().zip(&y).zip(s) {
                        let d = r::ulps(a, b as f64);
                        assert!(
                            d <= 1.0,
                            "{:?} {isa:?} vs scalar at {x:e}: {a} vs {b}",
                            spec.f
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn edge_cases_follow_ieee_conventions() {
    let inf = f32::INFINITY;
    let nan = f32::NAN;
    // (f, x, expected); NaN expected means NaN.
    let cases: &[(Unary, f32, f32)] = &[
        (Unary::Exp, 0.0, 1.0),
        (Unary::Exp, -0.0, 1.0),
        (Unary::Exp, inf, inf),
        (Unary::Exp, -inf, 0.0),
        (Unary::Exp, 89.0, inf),
        (Unary::Exp, -104.0, 0.0),
        (Unary::Exp, nan, nan),
        (Unary::Ln, 1.0, 0.0),
        (Unary::Ln, 0.0, -inf),
        (Unary::Ln, -0.0, -inf),
        (Unary::Ln, -1.0, nan),
        (Unary::Ln, inf, inf),
        (Unary::Ln, -inf, nan),
        (Unary::Ln, nan, nan),
        (Unary::Tanh, 0.0, 0.0),
        (Unary::Tanh, inf, 1.0),
        (Unary::Tanh, -inf, -1.0),
        (Unary::Tanh, nan, nan),
        (Unary::Sigmoid, inf, 1.0),
        (Unary::Sigmoid, -inf, 0.0),
        (Unary::Sigmoid, nan, nan),
        (Unary::Silu, -inf, -0.0),
        (Unary::Silu, nan, nan),
        (Unary::Erf, inf, 1.0),
        (Unary::Erf, -inf, -1.0),
        (Unary::Erf, 0.0, 0.0),
        (Unary::Erf, nan, nan),
        (Unary::Relu, nan, nan),
        (Unary::Relu, -inf, 0.0),
        (Unary::GeluTanh, inf, inf),
        (Unary::GeluTanh, -inf, -0.0),
        (Unary::GeluTanh, nan, nan),
        (Unary::GeluErf, inf, inf),
        (Unary::GeluErf, -inf, -0.0),
        (Unary::GeluErf, nan, nan),
    ];
    for isa in Isa::available() {
        for &(f, x, want) in cases {
            // Put the case in every lane position of a vector with a tail.
            for pos in [0, 5, 16, 18] {
                let mut xs = vec![0.5f32; 19];
                xs[pos] = x;
                let mut y = vec![0f32; 19];
                unary_isa(isa, f, &xs, &mut y);
                let got = y[pos];
                let ok = if want.is_nan() {
                    got.is_nan()
                } else {
                    got == want && got.is_sign_negative() == want.is_sign_negative()
                };
                assert!(
                    ok,
                    "{f:?}({x}) on {isa:?} at lane {pos}: got {got}, want {want}"
                );
            }
        }
        // Signs of zero survive the odd functions.
        let mut y = [0f32; 1];
        for f in [Unary::Tanh, Unary::Erf] {
            unary_isa(isa, f, &[-0.0], &mut y);
            assert!(
                y[0] == 0.0 && y[0].is_sign_negative(),
                "{f:?}(-0) on {isa:?} = {}",
                y[0]
            );
        }
    }
}

#[test]
fn derivatives_match_f64_on_every_isa() {
    // (f, f' in f64, domain)
    type Grad = (Unary, fn(f64) -> f64, f32, f32);
    let grads: Vec<Grad> = vec![
        (Unary::Exp, f64::exp, -100.0, 88.0),
        (Unary::Ln, |x| 1.0 / x, 1e-30, 1e30),
        (Unary::Tanh, |x| 1.0 - x.tanh().powi(2), -20.0, 20.0),
        (
            Unary::Sigmoid,
            |x| r::sigmoid(x) * r::sigmoid(-x),
            -80.0,
            80.0,
        ),
        (
            Unary::Silu,
            |x| {
                let s = r::sigmoid(x);
                s * (1.0 + x * r::sigmoid(-x))
            },
            -80.0,
            80.0,
        ),
        (
            Unary::Erf,
            |x| 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp(),
            -9.0,
            9.0,
        ),
        (Unary::GeluTanh, r::gelu_tanh_grad, -30.0, 30.0),
        (Unary::GeluErf, r::gelu_erf_grad, -30.0, 30.0),
    ];
    for (f, d, lo, hi) in grads {
        let xs = r::sweep(lo, hi, 100_000);
        let g: Vec<f32> = (0..xs.len())
            .map(|i| if i % 2 == 0 { 1.0 } else { -0.5 })
            .collect();
        for isa in Isa::available() {
            let mut dx = vec![0f32; xs.len()];
            unary_backward_isa(isa, f, &xs, &g, &mut dx);
            let mut worst = (0f64, 0f32);
            for ((&x, &gi), &got) in xs.iter().zip(&g).zip(&dx) {
                let want = gi as f64 * d(x as f64);
                // Relative error with a floor: derivatives cross zero (GELU's at x ≈ −0.75,
                // SiLU's at −1.28), where the error is absolute (≤ 5e-8).
                let err = (got as f64 - want).abs() / want.abs().max(1e-2);
                if err > worst.0 {
                    worst = (err, x);
                }
            }
            println!(
                "{f:?}' {isa:?}: max rel err {:.2e} (at x = {:e})",
                worst.0, worst.1
            );
            assert!(
                worst.0 < 5e-6,
                "{f:?}' on {isa:?}: rel err {} at x = {:e}",
                worst.0,
                worst.1
            );
        }
    }
}

#[test]
fn in_place_and_tails_of_every_length_agree_with_the_out_of_place_form() {
    for n in [0, 1, 7, 8, 15, 16, 17, 33] {
        let xs: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - 3.0).collect();
        let mut y = vec![0f32; n];
        sinter_cpu::math::unary(Unary::GeluTanh, &xs, &mut y);
        let mut z = xs.clone();
        sinter_cpu::math::unary_in_place(Unary::GeluTanh, &mut z);
        assert_eq!(y, z, "n = {n}");
    }
}
