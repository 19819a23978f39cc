//! f64 references for the math tests (shared by `math.rs` and `rows.rs`).

#![allow(dead_code)]

use std::f64::consts::PI;

/// erf in f64: its Taylor series below 2.5 (terms shrink fast; the largest is < e^x²), the
/// continued fraction of erfc above. Relative error < 1e-13 everywhere tested.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a < 2.5 {
        let (mut term, mut sum, x2) = (a, a, a * a);
        for n in 1..200 {
            term *= -x2 / n as f64;
            let t = term / (2 * n + 1) as f64;
            sum += t;
            if t.abs() < 1e-18 * sum.abs() {
                break;
            }
        }
        (2.0 / PI.sqrt() * sum).copysign(x)
    } else {
        (1.0 - erfc(a)).copysign(x)
    }
}

/// erfc in f64 with relative accuracy in the tail (continued fraction for x ≥ 2.5).
pub fn erfc(x: f64) -> f64 {
    if x < 2.5 {
        return 1.0 - erf(x);
    }
    if x.is_infinite() {
        return 0.0;
    }
    // erfc(x) = e^(−x²)/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + 2/(x + ...))))), from the tail.
    let mut f = x;
    for n in (1..200).rev() {
        f = x + (n as f64 / 2.0) / f;
    }
    (-x * x).exp() / PI.sqrt() / f
}

pub fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

pub fn gelu_tanh(x: f64) -> f64 {
    let u = (2.0 / PI).sqrt() * (x + 0.044715 * x * x * x);
    if x.is_infinite() {
        return if x > 0.0 { x } else { -0.0 };
    }
    x * sigmoid(2.0 * u)
}

pub fn gelu_tanh_grad(x: f64) -> f64 {
    if x.is_infinite() {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    let k = (2.0 / PI).sqrt();
    let u = k * (x + 0.044715 * x * x * x);
    let du = k * (1.0 + 3.0 * 0.044715 * x * x);
    let s = sigmoid(2.0 * u);
    s + x * 2.0 * du * s * sigmoid(-2.0 * u)
}

pub fn normal_cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

pub fn normal_cdf_any(x: f64) -> f64 {
    if x < 0.0 {
        0.5 * erfc(-x / std::f64::consts::SQRT_2)
    } else {
        1.0 - 0.5 * erfc(x / std::f64::consts::SQRT_2)
    }
}

pub fn gelu_erf(x: f64) -> f64 {
    if x.is_infinite() {
        return if x > 0.0 { x } else { -0.0 };
    }
    x * normal_cdf_any(x)
}

pub fn gelu_erf_grad(x: f64) -> f64 {
    if x.is_infinite() {
        return if x > 0.0 { 1.0 } else { 0.0 };
    }
    normal_cdf_any(x) + x * (-0.5 * x * x).exp() / (2.0 * PI).sqrt()
}

/// The spacing of f32 values at |y| (the subnormal spacing below the normal range).
pub fn ulp(y: f64) -> f64 {
    let a = (y.abs() as f32).max(f32::MIN_POSITIVE);
    if a.is_infinite() {
        return f64::INFINITY;
    }
    (f32::from_bits(a.to_bits() + 1) - a) as f64
}

/// |got − want| in f32 ulps of want (0 when both are the same infinity or both NaN).
pub fn ulps(got: f32, want: f64) -> f64 {
    if got.is_nan() && want.is_nan() {
        return 0.0;
    }
    if got.is_nan() || want.is_nan() {
        return f64::INFINITY;
    }
    let w32 = want as f32;
    if got.is_infinite() || w32.is_infinite() {
        return if got == w32 { 0.0 } else { f64::INFINITY };
    }
    (got as f64 - want).abs() / ulp(want)
}

/// Inputs for a sweep: a dense grid over [lo, hi] plus every 4099th f32 bit pattern inside it
/// (so tiny, huge and subnormal magnitudes are covered), plus the edge values.
pub fn sweep(lo: f32, hi: f32, dense: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..=dense)
        .map(|i| lo + (hi - lo) * (i as f32 / dense as f32))
        .collect();
    let mut bits = 0u32;
    while bits < 0x7f80_0000 {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            if x >= lo && x <= hi {
                v.push(x);
            }
        }
        bits += 4099;
    }
    let edges = [
        0.0,
        -0.0,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        1e-45,
        -1e-45,
        lo,
        hi,
    ];
    v.extend(edges.into_iter().filter(|&x| x >= lo && x <= hi));
    v
}
