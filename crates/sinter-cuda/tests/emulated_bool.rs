//! bool.cu run through the CPU emulator from its launch plans: comparisons of every operand
//! dtype (NaN and ±inf included for floats) writing bools, or / and of two bools, where with a
//! bool condition for every dtype, and the bool fill — a transposed operand, a broadcast one,
//! and more elements than one grid-stride sweep of a 1-SM grid.

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::contiguous_strides;
use sinter_cuda::ops::binary::StridedIn;
use sinter_cuda::ops::boolean::{self, BoolOp};
use sinter_cuda::ops::int::IntReduce;
use sinter_cuda::DType;

/// [40, 7, 33] = 9240 elements: more than the 32 × 256 threads of one sweep.
const SHAPE: [usize; 3] = [40, 7, 33];
/// A transposed [33, 7, 40] buffer seen as [40, 7, 33].
const A_STRIDES: [i64; 3] = [1, 40, 280];
/// A [7, 1] column broadcast over the other two dims.
const B_STRIDES: [i64; 3] = [0, 1, 0];

fn n() -> usize {
    SHAPE.iter().product()
}

/// Logical index -> element offset through strides.
fn offset(strides: &[i64], mut i: usize) -> usize {
    let mut off = 0i64;
    for d in (0..SHAPE.len()).rev() {
        off += (i % SHAPE[d]) as i64 * strides[d];
        i /= SHAPE[d];
    }
    off as usize
}

fn strided<'a>(b: &'a Buf, strides: &'a [i64]) -> StridedIn<'a> {
    StridedIn {
        data: b.slice(),
        strides,
    }
}

/// Values of `d` with repeats (so equality happens) and, for floats, NaN and ±inf.
fn values(rng: &mut Rng, d: DType, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| match d {
            DType::Bool => rng.below(2) as f64,
            DType::I64 => rng.below(5) as f64 - 2.0 + if i % 11 == 0 { 1e12 } else { 0.0 },
            _ => match i % 13 {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                _ => q(d, rng.below(5) as f64 * 0.5 - 1.0),
            },
        })
        .collect()
}

#[test]
fn comparisons_write_bools_for_every_dtype() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(11);
    type Cmp = (BoolOp, fn(f64, f64) -> bool);
    let cmps: [Cmp; 6] = [
        (BoolOp::Eq, |a, b| a == b),
        (BoolOp::Ne, |a, b| a != b),
        (BoolOp::Lt, |a, b| a < b),
        (BoolOp::Le, |a, b| a <= b),
        (BoolOp::Gt, |a, b| a > b),
        (BoolOp::Ge, |a, b| a >= b),
    ];
    for d in boolean::DTYPES {
        let (av, bv) = (values(&mut rng, d, n()), values(&mut rng, d, 7));
        let (a, b) = (Buf::from_f64(d, &av, 0), Buf::from_f64(d, &bv, 1));
        for (op, rf) in cmps {
            let out = Buf::zeros(DType::Bool, n(), 0);
            let (sa, sb) = (strided(&a, &A_STRIDES), strided(&b, &B_STRIDES));
            let l = boolean::plan_bool_binary(&T1, op, sa, sb, out.slice(), &SHAPE)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&a, &b, &out]);
            let want: Vec<f64> = (0..n())
                .map(|i| rf(av[offset(&A_STRIDES, i)], bv[offset(&B_STRIDES, i)]) as u8 as f64)
                .collect();
            assert_close(&format!("{op:?} {d}"), &out.get(), &want, (0.0, 0.0));
        }
    }
}

#[test]
fn two_bools_combine_with_or_and_and() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(12);
    let (av, bv) = (
        values(&mut rng, DType::Bool, n()),
        values(&mut rng, DType::Bool, 7),
    );
    let (a, b) = (
        Buf::from_f64(DType::Bool, &av, 0),
        Buf::from_f64(DType::Bool, &bv, 0),
    );
    type Logic = (BoolOp, fn(bool, bool) -> bool);
    let ops: [Logic; 2] = [(BoolOp::Or, |p, q| p | q), (BoolOp::And, |p, q| p & q)];
    for (op, rf) in ops {
        let out = Buf::zeros(DType::Bool, n(), 0);
        let (sa, sb) = (strided(&a, &A_STRIDES), strided(&b, &B_STRIDES));
        let l = boolean::plan_bool_binary(&T1, op, sa, sb, out.slice(), &SHAPE)
            .unwrap()
            .unwrap();
        exec1(e, l, &[&a, &b, &out]);
        let want: Vec<f64> = (0..n())
            .map(|i| {
                let (p, q) = (av[offset(&A_STRIDES, i)], bv[offset(&B_STRIDES, i)]);
                rf(p != 0.0, q != 0.0) as u8 as f64
            })
            .collect();
        assert_close(&format!("{op:?} of bools"), &out.get(), &want, (0.0, 0.0));
    }
}

#[test]
fn where_moves_every_dtype_under_a_bool_condition() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(13);
    // The condition broadcast over the first two dims; a transposed; b contiguous.
    let c_strides = [0i64, 0, 1];
    let cv: Vec<f64> = (0..33).map(|i| (i % 3 == 0) as u8 as f64).collect();
    let c = Buf::from_f64(DType::Bool, &cv, 0);
    let b_strides = contiguous_strides(&SHAPE);
    for d in boolean::DTYPES {
        let (av, bv) = (values(&mut rng, d, n()), values(&mut rng, d, n()));
        let (a, b) = (Buf::from_f64(d, &av, 0), Buf::from_f64(d, &bv, 1));
        let out = Buf::zeros(d, n(), 0);
        let l = boolean::plan_where_bool(
            &T1,
            strided(&c, &c_strides),
            strided(&a, &A_STRIDES),
            strided(&b, &b_strides),
            out.slice(),
            &SHAPE,
        )
        .unwrap()
        .unwrap();
        exec1(e, l, &[&a, &b, &c, &out]);
        let want: Vec<f64> = (0..n())
            .map(|i| {
                if cv[i % 33] != 0.0 {
                    av[offset(&A_STRIDES, i)]
                } else {
                    bv[i]
                }
            })
            .collect();
        assert_close(&format!("where {d}"), &out.get(), &want, (0.0, 0.0));
    }
}

#[test]
fn fill_bool_writes_ones_or_zeros() {
    let Some(e) = emu() else { return };
    for (v, want) in [(true, 1.0), (false, 0.0)] {
        let out = Buf::from_f64(DType::Bool, &vec![1.0 - want; n()], 3);
        exec1(
            e,
            boolean::plan_fill_bool(&T1, out.slice(), v)
                .unwrap()
                .unwrap(),
            &[&out],
        );
        assert!(out.get().iter().all(|&x| x == want), "fill {v}");
    }
}

#[test]
fn reductions_count_any_all_and_find_the_first_true() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(14);
    // [outer, n, inner]: over a middle dim; over the last dim with more outputs than one sweep
    // of a 1-SM grid; over a dim of one.
    for [outer, n, inner] in [[5usize, 37, 66], [9000, 3, 1], [2, 1, 3]] {
        let at = |o: usize, k: usize, i: usize| (o * n + k) * inner + i;
        let mut xv = values(&mut rng, DType::Bool, outer * n * inner);
        // Output 0 sees only false, output 1 only true.
        for t in [0, 1] {
            for k in 0..n {
                xv[at(t / inner, k, t % inner)] = t as f64;
            }
        }
        let x = Buf::from_f64(DType::Bool, &xv, 0);
        for op in [
            IntReduce::Sum,
            IntReduce::Max,
            IntReduce::Min,
            IntReduce::ArgMax,
        ] {
            let out = Buf::zeros(boolean::bool_reduce_dtype(op), outer * inner, 0);
            let l = boolean::plan_bool_reduce(&T1, op, x.slice(), out.slice(), outer, n, inner)
                .unwrap()
                .unwrap();
            exec1(e, l, &[&x, &out]);
            let want: Vec<f64> = (0..outer * inner)
                .map(|t| {
                    let col: Vec<bool> = (0..n)
                        .map(|k| xv[at(t / inner, k, t % inner)] != 0.0)
                        .collect();
                    let r = match op {
                        IntReduce::Sum => col.iter().filter(|&&b| b).count(),
                        IntReduce::Max => col.iter().any(|&b| b) as usize,
                        IntReduce::Min => col.iter().all(|&b| b) as usize,
                        IntReduce::ArgMax => col.iter().position(|&b| b).unwrap_or(0),
                    };
                    r as f64
                })
                .collect();
            let what = format!("{op:?} over [{outer}, {n}, {inner}]");
            assert_close(&what, &out.get(), &want, (0.0, 0.0));
        }
    }
}
