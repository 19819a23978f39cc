//! int.cu (i64 tensors on the device) run through the CPU emulator from its launch plans, against
//! references written with Rust's wrapping integer arithmetic (the CPU backend's semantics):
//! the twelve binary ops through broadcast and transposed strides (x / 0 = 0, i64::MIN / -1 wraps),
//! fill, arange for every dtype, the
//! middle-dim reductions (sum wraps, argmax takes the first maximum), index_flat's clamping of bad
//! ids, row gathers, and the one-block index check (first bad position, ignore value, an earlier
//! error kept). Every launch runs in forward and reverse thread order with identical results.

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::Step;
use sinter_cuda::ops::binary::{BinaryOp, StridedIn};
use sinter_cuda::ops::int::{self, IntReduce};
use sinter_cuda::DType;

fn k(l: Option<sinter_cuda::launch::Launch>) -> Vec<Step> {
    l.into_iter().map(Step::Kernel).collect()
}

/// i64 values with the edge cases integer kernels get wrong: 0, ±1, the extremes, large products.
fn ints(rng: &mut Rng, n: usize) -> Vec<i64> {
    const EDGE: [i64; 7] = [0, 1, -1, i64::MIN, i64::MAX, 3_037_000_500, -7];
    (0..n)
        .map(|i| {
            if i % 5 == 0 {
                EDGE[rng.below(EDGE.len() as u64) as usize]
            } else {
                rng.below(41) as i64 - 20
            }
        })
        .collect()
}

fn cpu_op(op: BinaryOp, a: i64, b: i64) -> i64 {
    match op {
        BinaryOp::Add => a.wrapping_add(b),
        BinaryOp::Sub => a.wrapping_sub(b),
        BinaryOp::Mul => a.wrapping_mul(b),
        BinaryOp::Div => {
            if b == 0 {
                0
            } else {
                a.wrapping_div(b)
            }
        }
        BinaryOp::FloorDiv => sinter_types::floor_div_i64(a, b).unwrap_or(0),
        BinaryOp::Maximum => a.max(b),
        BinaryOp::Minimum => a.min(b),
    }
}

/// Element offset of flat index i of `shape` through `strides`.
fn offset(shape: &[usize], strides: &[i64], mut i: usize) -> usize {
    let mut off = 0i64;
    for d in (0..shape.len()).rev() {
        off += (i % shape[d]) as i64 * strides[d];
        i /= shape[d];
    }
    off as usize
}

#[test]
fn binary_ops_through_strides() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(31);
    // out [6, 5, 70]: a is a transposed [70, 5, 6] buffer, b broadcasts over the first and last dims.
    let shape = [6usize, 5, 70];
    let n: usize = shape.iter().product();
    let a_strides = [1i64, 6, 30];
    let b_strides = [0i64, 1, 0];
    let av = ints(&mut rng, n);
    let bv = ints(&mut rng, 5);
    for op in BinaryOp::ALL {
        let mut a = Buf::from_i64(&av);
        let mut b = Buf::from_i64(&bv);
        let mut out = Buf::zeros(DType::I64, n, 0);
        let steps = k(int::plan_int_binary(
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
        .unwrap());
        exec_both(e, &steps, &mut [&mut a, &mut b, &mut out]);
        let want: Vec<i64> = (0..n)
            .map(|i| {
                cpu_op(
                    op,
                    av[offset(&shape, &a_strides, i)],
                    bv[offset(&shape, &b_strides, i)],
                )
            })
            .collect();
        assert_eq!(out.get_i64(), want, "int {op:?}");
    }
}

#[test]
fn fill_and_arange() {
    let Some(e) = emu() else { return };
    let n = 9000; // more than one sweep of a 1-SM grid
    let mut y = Buf::zeros(DType::I64, n, 0);
    exec_both(
        e,
        &k(int::plan_fill_i64(&T1, y.slice(), i64::MIN + 5).unwrap()),
        &mut [&mut y],
    );
    assert!(y.get_i64().iter().all(|&v| v == i64::MIN + 5), "fill_i64");

    // (0.1, 0.3): 0.1 + 3 * 0.3 is just below 1 with the product rounded first (the CPU's
    // arithmetic, truncating to 0) and rounds to 1 with a fused multiply-add.
    for (start, step) in [(-3.5, 0.7), (10.0, -1.0 / 3.0), (0.0, 1.0), (0.1, 0.3)] {
        for d in [DType::F32, DType::F16, DType::BF16, DType::I64] {
            let mut y = Buf::zeros(d, n, 0);
            exec_both(
                e,
                &k(int::plan_arange(&T1, y.slice(), start, step).unwrap()),
                &mut [&mut y],
            );
            let what = format!("arange {d} start {start} step {step}");
            if d == DType::I64 {
                let want: Vec<i64> = (0..n).map(|i| (start + i as f64 * step) as i64).collect();
                if start == 0.1 {
                    assert_eq!(want[3], 0, "the reference rounds the product first");
                }
                assert_eq!(y.get_i64(), want, "{what}");
            } else {
                let want: Vec<f64> = (0..n)
                    .map(|i| q(d, (start + i as f64 * step) as f32 as f64))
                    .collect();
                assert_close(&what, &y.get(), &want, (0.0, 0.0));
            }
        }
    }
}

#[test]
fn reductions_over_the_middle_dim() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(32);
    for (outer, n, inner) in [
        (1usize, 1usize, 1usize),
        (3, 7, 5),
        (2, 300, 1),
        (1, 4, 2500),
    ] {
        let mut xv = ints(&mut rng, outer * n * inner);
        if n > 2 {
            xv[2 * inner] = xv[0]; // ties: the first maximum wins
        }
        for op in [
            IntReduce::Sum,
            IntReduce::Max,
            IntReduce::Min,
            IntReduce::ArgMax,
        ] {
            let mut x = Buf::from_i64(&xv);
            let mut out = Buf::zeros(DType::I64, outer * inner, 0);
            exec_both(
                e,
                &k(int::plan_int_reduce(&T1, op, x.slice(), out.slice(), outer, n, inner).unwrap()),
                &mut [&mut x, &mut out],
            );
            let want: Vec<i64> = (0..outer * inner)
                .map(|t| {
                    let (o, i) = (t / inner, t % inner);
                    let col: Vec<i64> = (0..n).map(|j| xv[(o * n + j) * inner + i]).collect();
                    match op {
                        IntReduce::Sum => col.iter().fold(0i64, |a, &v| a.wrapping_add(v)),
                        IntReduce::Max => *col.iter().max().unwrap(),
                        IntReduce::Min => *col.iter().min().unwrap(),
                        IntReduce::ArgMax => {
                            let m = *col.iter().max().unwrap();
                            col.iter().position(|&v| v == m).unwrap() as i64
                        }
                    }
                })
                .collect();
            assert_eq!(
                out.get_i64(),
                want,
                "int_reduce {op:?} [{outer}, {n}, {inner}]"
            );
        }
    }
}

#[test]
fn index_flat_gathers_and_index_check() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(33);
    // index_flat: ids into x viewed as [outer * n, inner]; bad ids become row 0 of their block.
    let (outer, n) = (3usize, 11usize);
    let idv: Vec<i64> = (0..40)
        .map(|j| match j % 13 {
            4 => -1,
            9 => n as i64,
            _ => rng.below(n as u64) as i64,
        })
        .collect();
    let mut idx = Buf::from_i64(&idv);
    let mut flat = Buf::zeros(DType::I64, outer * idv.len(), 0);
    exec_both(
        e,
        &k(int::plan_index_flat(&T1, idx.slice(), flat.slice(), outer, n).unwrap()),
        &mut [&mut idx, &mut flat],
    );
    let want: Vec<i64> = (0..outer * idv.len())
        .map(|t| {
            let (o, j) = (t / idv.len(), t % idv.len());
            let v = idv[j];
            (o * n) as i64 + if (0..n as i64).contains(&v) { v } else { 0 }
        })
        .collect();
    assert_eq!(flat.get_i64(), want, "index_flat");

    // Row gathers through the flat ids.
    let inner = 7;
    let xv = ints(&mut rng, outer * n * inner);
    let mut x = Buf::from_i64(&xv);
    let mut out = Buf::zeros(DType::I64, want.len() * inner, 0);
    exec_both(
        e,
        &k(
            int::plan_gather_rows_i64(&T1, x.slice(), flat.slice(), out.slice(), outer * n, inner)
                .unwrap(),
        ),
        &mut [&mut x, &mut flat, &mut out],
    );
    let wg: Vec<i64> = want
        .iter()
        .flat_map(|&r| xv[r as usize * inner..(r as usize + 1) * inner].to_vec())
        .collect();
    assert_eq!(out.get_i64(), wg, "gather_rows_i64");

    // index_check over more ids than the block has threads: the first bad position wins, the
    // ignore value passes, and an error already in the slot is kept.
    let len = 3000;
    let bound = 50usize;
    for (bad, ignore, prior) in [
        (vec![2500, 1700], None, 0i64),
        (vec![10, 2999], Some(-100i64), 0),
        (vec![], Some(-100), 0),
        (vec![5], None, 77),
    ] {
        let mut v: Vec<i64> = (0..len).map(|_| rng.below(bound as u64) as i64).collect();
        for (k, &p) in bad.iter().enumerate() {
            v[p] = if k == 0 { bound as i64 } else { -3 };
        }
        if let Some(ig) = ignore {
            v[1] = ig;
            v[2999 - 1] = ig;
        }
        let mut ids = Buf::from_i64(&v);
        let mut slot = Buf::from_i64(&[prior, 0, 0, 0]);
        exec_both(
            e,
            &k(int::plan_index_check(ids.slice(), bound, ignore, 9, slot.slice()).unwrap()),
            &mut [&mut ids, &mut slot],
        );
        let first = bad.iter().min();
        let want = match (prior, first) {
            (0, Some(&p)) => vec![p as i64 + 1, v[p], bound as i64, 9],
            _ => vec![prior, 0, 0, 0],
        };
        assert_eq!(
            slot.get_i64(),
            want,
            "index_check bad {bad:?} ignore {ignore:?}"
        );
    }
}
