//! Elementwise kernels (unary.cu, binary.cu, copy.cu) run through the CPU emulator from their
//! launch plans, against f64 references, for f32/f16/bf16, with sizes that hit the 128-bit path,
//! the scalar tail, unaligned views and more than one grid-stride sweep (LaunchTarget of 1 SM).
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::{contiguous_strides, Step};
use sinter_cuda::ops::binary::{self, BinaryOp, StridedIn};
use sinter_cuda::ops::copy;
use sinter_cuda::ops::unary::{self, erf, Saved, UnaryOp};
use sinter_cuda::DType;

/// Elements for one dtype: more than one sweep of a 1-SM grid (32 blocks x 256 threads x one
/// 128-bit pack), plus a tail that is not a whole pack.
fn big_n(d: DType) -> usize {
    32 * 256 * (16 / d.size()) + 77
}

fn sig(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn fwd(op: UnaryOp, x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Powf(p) => x.powf(p as f64),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => sig(x),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::GeluTanh => 0.5 * x * (1.0 + (c * (x + 0.044715 * x.powi(3))).tanh()),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f64::consts::SQRT_2)),
        UnaryOp::Silu => x * sig(x),
        UnaryOp::Abs => x.abs(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Affine { mul, add } => x * mul as f64 + add as f64,
    }
}

/// d f / d x at x, times g.
fn grad(op: UnaryOp, x: f64, g: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let d = match op {
        UnaryOp::Neg => -1.0,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => 1.0 / x,
        UnaryOp::Sqrt => 0.5 / x.sqrt(),
        UnaryOp::Powf(p) => p as f64 * x.powf(p as f64 - 1.0),
        UnaryOp::Tanh => 1.0 - x.tanh().powi(2),
        UnaryOp::Sigmoid => sig(x) * (1.0 - sig(x)),
        UnaryOp::Relu => (x > 0.0) as i32 as f64,
        UnaryOp::GeluTanh => {
            let u = c * (x + 0.044715 * x.powi(3));
            let t = u.tanh();
            0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044715 * x * x)
        }
        UnaryOp::GeluErf => {
            0.5 * (1.0 + erf(x / std::f64::consts::SQRT_2))
                + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
        }
        UnaryOp::Silu => sig(x) * (1.0 + x * (1.0 - sig(x))),
        UnaryOp::Abs => x.signum() * (x != 0.0) as i32 as f64,
        UnaryOp::Recip => -1.0 / (x * x),
        UnaryOp::Affine { mul, .. } => mul as f64,
    };
    g * d
}

fn domain(op: UnaryOp) -> (f64, f64) {
    match op {
        UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Powf(_) | UnaryOp::Recip => (0.25, 3.0),
        _ => (-3.0, 3.0),
    }
}

#[test]
fn unary_forward_and_backward_all_ops_all_dtypes() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(1);
    for d in FLOATS {
        for (k, op) in UnaryOp::all().into_iter().enumerate() {
            // Alternate the aligned (vector) path and an unaligned view (scalar path only).
            let (n, shift) = if k % 2 == 0 { (big_n(d), 0) } else { (1003, 1) };
            let (lo, hi) = domain(op);
            let xv: Vec<f64> = rng.vec(n, lo, hi).into_iter().map(|v| q(d, v)).collect();
            let x = Buf::from_f64(d, &xv, shift);
            let y = Buf::zeros(d, n, shift);
            let l = unary::plan_unary(&T1, op, x.slice(), y.slice())
                .unwrap()
                .unwrap();
            exec1(e, l, &[&x, &y]);
            let want: Vec<f64> = xv.iter().map(|&v| fwd(op, v)).collect();
            let (r, a) = tol(d);
            assert_close(&format!("{op:?} {d}"), &y.get(), &want, (r * 2.0, a * 4.0));

            let gv: Vec<f64> = rng.vec(n, -2.0, 2.0).into_iter().map(|v| q(d, v)).collect();
            let g = Buf::from_f64(d, &gv, shift);
            let gx = Buf::zeros(d, n, shift);
            let saved = match op.saves() {
                Saved::Output => &y,
                Saved::Input | Saved::Nothing => &x,
            };
            let l = unary::plan_unary_backward(&T1, op, saved.slice(), g.slice(), gx.slice())
                .unwrap()
                .unwrap();
            exec1(e, l, &[saved, &g, &gx]);
            // The kernel sees the stored (rounded) output for output-saving ops: evaluate the
            // derivative at the x that produced it, with a tolerance for that rounding.
            let want: Vec<f64> = xv.iter().zip(&gv).map(|(&x, &g)| grad(op, x, g)).collect();
            let scale = if matches!(op.saves(), Saved::Output) {
                4.0
            } else {
                2.0
            };
            assert_close(
                &format!("{op:?} backward {d}"),
                &gx.get(),
                &want,
                (r * scale, a * 8.0),
            );
        }
    }
}

#[test]
fn fill_all_dtypes() {
    let Some(e) = emu() else { return };
    for d in FLOATS {
        for (n, shift) in [(big_n(d), 0), (37, 3)] {
            let y = Buf::zeros(d, n, shift);
            exec1(
                e,
                unary::plan_fill(&T1, y.slice(), 1.5).unwrap().unwrap(),
                &[&y],
            );
            assert!(y.get().iter().all(|&v| v == 1.5), "fill {d}");
        }
    }
}

fn binary_inputs(rng: &mut Rng, d: DType, n: usize) -> (Vec<f64>, Vec<f64>) {
    let a: Vec<f64> = rng.vec(n, -3.0, 3.0).into_iter().map(|v| q(d, v)).collect();
    let b: Vec<f64> = (0..n)
        .map(|i| {
            if i % 7 == 0 {
                a[i] // ties for maximum / minimum
            } else {
                let m = rng.uniform(0.5, 2.0);
                q(d, if i % 2 == 0 { m } else { -m })
            }
        })
        .collect();
    (a, b)
}

fn bref(op: BinaryOp, a: f64, b: f64) -> f64 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::FloorDiv => sinter_types::floor_div_f32(a as f32, b as f32) as f64,
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

#[test]
fn binary_contiguous_all_ops_all_dtypes() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(2);
    for d in FLOATS {
        for (k, op) in BinaryOp::ALL.into_iter().enumerate() {
            let (n, shift) = if k % 3 == 0 { (1001, 1) } else { (big_n(d), 0) };
            let (av, bv) = binary_inputs(&mut rng, d, n);
            let a = Buf::from_f64(d, &av, shift);
            let b = Buf::from_f64(d, &bv, shift);
            let out = Buf::zeros(d, n, shift);
            let l = binary::plan_binary(&T1, op, a.slice(), b.slice(), out.slice())
                .unwrap()
                .unwrap();
            exec1(e, l, &[&a, &b, &out]);
            let want: Vec<f64> = av.iter().zip(&bv).map(|(&x, &y)| bref(op, x, y)).collect();
            assert_close(&format!("{op:?} {d}"), &out.get(), &want, tol(d));
        }
    }
}

/// Logical index -> element offset through strides.
fn offset(shape: &[usize], strides: &[i64], mut i: usize) -> usize {
    let mut off = 0i64;
    for dd in (0..shape.len()).rev() {
        off += (i % shape[dd]) as i64 * strides[dd];
        i /= shape[dd];
    }
    off as usize
}

#[test]
fn binary_strided_broadcast_and_transposed() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(3);
    let shape = [6usize, 7, 33];
    let n: usize = shape.iter().product();
    for d in FLOATS {
        // a: a transposed [33, 7, 6] buffer seen as [6, 7, 33]; b: a [7, 1] column broadcast.
        let a_strides = [1i64, 6, 42];
        let b_strides = [0i64, 1, 0];
        let av: Vec<f64> = rng.vec(n, -2.0, 2.0).into_iter().map(|v| q(d, v)).collect();
        let bv: Vec<f64> = rng.vec(7, 0.5, 2.0).into_iter().map(|v| q(d, v)).collect();
        let a = Buf::from_f64(d, &av, 0);
        let b = Buf::from_f64(d, &bv, 1);
        for op in [BinaryOp::Sub, BinaryOp::Div, BinaryOp::Maximum] {
            let out = Buf::zeros(d, n, 0);
            let l = binary::plan_binary_strided(
                &T1,
                op,
                StridedIn {
                    data: a.slice(),
                    strides: &a_strides,
                },
                StridedIn {
                    data: b.slice(),
                    strides: &b_strides,
                },
                out.slice(),
                &shape,
            )
            .unwrap()
            .unwrap();
            assert!(l.name.contains("strided"), "{}", l.name);
            exec1(e, l, &[&a, &b, &out]);
            let want: Vec<f64> = (0..n)
                .map(|i| {
                    bref(
                        op,
                        av[offset(&shape, &a_strides, i)],
                        bv[offset(&shape, &b_strides, i)],
                    )
                })
                .collect();
            assert_close(&format!("{op:?} strided {d}"), &out.get(), &want, tol(d));
        }
    }
}

#[test]
fn strided_copy_every_width() {
    let Some(e) = emu() else { return };
    let shape = [5usize, 9, 31];
    let n: usize = shape.iter().product();
    // Source: a [31, 5, 9] buffer permuted to [5, 9, 31]; destination contiguous, then the
    // reverse (strided destination).
    let src_strides = [9i64, 1, 45];
    let dst_strides = contiguous_strides(&shape);
    for d in [DType::U8, DType::F16, DType::F32, DType::I64] {
        let v: Vec<f64> = (0..n).map(|i| (i % 251) as f64).collect();
        let src = Buf::from_f64(d, &v, 1);
        let dst = Buf::zeros(d, n, 0);
        let s = copy::plan_strided_copy(
            &T1,
            src.slice(),
            &src_strides,
            dst.slice(),
            &dst_strides,
            &shape,
        )
        .unwrap()
        .unwrap();
        assert!(matches!(s, Step::Kernel(_)));
        exec(e, &[s], &[&src, &dst]);
        let want: Vec<f64> = (0..n).map(|i| v[offset(&shape, &src_strides, i)]).collect();
        assert_close(&format!("strided copy {d}"), &dst.get(), &want, (0.0, 0.0));
        let back = Buf::zeros(d, n, 0);
        let s = copy::plan_strided_copy(
            &T1,
            dst.slice(),
            &dst_strides,
            back.slice(),
            &src_strides,
            &shape,
        )
        .unwrap()
        .unwrap();
        exec(e, &[s], &[&dst, &back]);
        assert_close(
            &format!("strided copy back {d}"),
            &back.get(),
            &v,
            (0.0, 0.0),
        );
    }
}

#[test]
fn casts_between_every_pair() {
    let Some(e) = emu() else { return };
    let all = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];
    for from in all {
        for to in all {
            if from == to {
                continue;
            }
            let n = 2 * 32 * 256 * 8 + 13;
            // Values every type holds: small integers and (for floats) halves and negatives.
            let v: Vec<f64> = (0..n)
                .map(|i| {
                    let base = (i % 200) as f64;
                    match from {
                        // torch.bool holds 0 or 1.
                        DType::Bool => (i % 3 == 0) as u8 as f64,
                        DType::F32 | DType::F16 | DType::BF16 if to != DType::U8 => {
                            q(from, (base - 100.0) * 0.75)
                        }
                        DType::F32 | DType::F16 | DType::BF16 => q(from, base * 0.75),
                        DType::U8 => base,
                        _ if to == DType::U8 => base,
                        _ => base - 100.0,
                    }
                })
                .collect();
            let x = Buf::from_f64(from, &v, 0);
            let y = Buf::zeros(to, n, 0);
            let s = copy::plan_cast(&T1, x.slice(), y.slice()).unwrap().unwrap();
            exec(e, &[s], &[&x, &y]);
            let want: Vec<f64> = v
                .iter()
                .map(|&a| match to {
                    DType::F32 | DType::F16 | DType::BF16 => q(to, a),
                    // Non-zero is true (a zero, -0.0 included, false).
                    DType::Bool => (a != 0.0) as u8 as f64,
                    _ => a.trunc(),
                })
                .collect();
            assert_close(&format!("cast {from} -> {to}"), &y.get(), &want, (0.0, 0.0));
        }
    }
}
