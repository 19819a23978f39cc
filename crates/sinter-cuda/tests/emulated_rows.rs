//! Row kernels (reduce.cu; softmax's, cross-entropy's and LayerNorm's are sinter-core's kernels/) run
//! through the CPU emulator from their launch plans, against f64 references, for f32/f16/bf16. Row
//! lengths cover a
//! warp per row (several rows per block), rows longer than one block's first sweep, unaligned rows
//! (scalar path) and row counts beyond one grid (grid-stride over rows). Every run is repeated in
//! reverse thread order and must give bit-identical results (deterministic reductions, barriers).
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::Step;
use sinter_cuda::ops::reduce::{self, ArgReduce};
use sinter_cuda::DType;

/// (rows, n): warp-per-row with a grid-stride over rows, odd lengths (unaligned rows), rows
/// longer than 8 elements per thread of a 1024-thread block.
const SHAPES: [(usize, usize); 7] = [
    (1, 1),
    (33, 2),
    (300, 5),
    (19, 100),
    (7, 1000),
    (5, 3001),
    (3, 9000),
];

fn k(l: Option<sinter_cuda::launch::Launch>) -> Vec<Step> {
    l.into_iter().map(Step::Kernel).collect()
}

fn inputs(rng: &mut Rng, d: DType, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    rng.vec(n, lo, hi).into_iter().map(|v| q(d, v)).collect()
}

#[test]
fn sum_last_and_arg_last() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(10);
    for d in FLOATS {
        for (rows, n) in SHAPES {
            let mut xv = inputs(&mut rng, d, rows * n, -2.0, 2.0);
            // Ties (first index wins), a NaN row and an all -inf row for the arg reductions.
            xv[n / 2] = xv[0];
            if rows > 2 {
                xv[n + n / 3] = f64::NAN;
                for v in &mut xv[2 * n..3 * n] {
                    *v = f64::NEG_INFINITY;
                }
            }
            let mut x = Buf::from_f64(d, &xv, 0);
            let mut out = Buf::zeros(d, rows, 0);
            let steps =
                k(reduce::plan_sum_last(&T1, x.slice(), out.slice(), rows, n, 0.5).unwrap());
            exec_both(e, &steps, &mut [&mut x, &mut out]);
            let want: Vec<f64> = (0..rows)
                .map(|r| 0.5 * xv[r * n..(r + 1) * n].iter().sum::<f64>())
                .collect();
            let (rt, at) = tol(d);
            let what = format!("sum_last {d} {rows}x{n}");
            assert_close(&what, &out.get(), &want, (rt, at * (n as f64).sqrt() * 4.0));

            for which in [ArgReduce::Max, ArgReduce::Min] {
                let mut out = Buf::zeros(d, rows, 0);
                let mut idx = Buf::zeros(DType::I64, rows, 0);
                let steps = k(reduce::plan_arg_last(
                    &T1,
                    which,
                    x.slice(),
                    out.slice(),
                    Some(idx.slice()),
                    rows,
                    n,
                )
                .unwrap());
                exec_both(e, &steps, &mut [&mut x, &mut out, &mut idx]);
                let got_i = idx.get_i64();
                let got_v = out.get();
                for r in 0..rows {
                    let row = &xv[r * n..(r + 1) * n];
                    let (mut bv, mut bi) = (row[0], 0usize);
                    for (j, &v) in row.iter().enumerate() {
                        if bv.is_nan() {
                            break;
                        }
                        let better = v.is_nan()
                            || if which == ArgReduce::Max {
                                v > bv
                            } else {
                                v < bv
                            };
                        if better {
                            bv = v;
                            bi = j;
                        }
                    }
                    let what = format!("{which:?}_last {d} {rows}x{n} row {r}");
                    assert_eq!(got_i[r], bi as i64, "{what}: index");
                    assert_close(&what, &[got_v[r]], &[bv], (0.0, 0.0));
                }
            }
        }
    }
}

#[test]
fn sum_mid_and_arg_mid() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(11);
    // (outer, n, inner): one chunk; several chunks (partial + finish); inner not a multiple of 32;
    // inner 1 (planned as a last-dim sum).
    for (outer, n, inner) in [
        (1usize, 1usize, 2usize),
        (4, 100, 1),
        (3, 50, 70),
        (1, 2000, 40),
        (2, 700, 5),
    ] {
        for d in FLOATS {
            let total = outer * n * inner;
            let xv = inputs(&mut rng, d, total, -1.0, 1.0);
            let mut x = Buf::from_f64(d, &xv, 0);
            let mut out = Buf::zeros(d, outer * inner, 0);
            let sl = reduce::sum_mid_scratch_len(&T1, outer, n, inner);
            let mut part = Buf::zeros(DType::F32, sl.max(1), 0);
            let steps = reduce::plan_sum_mid(
                &T1,
                x.slice(),
                out.slice(),
                (sl > 0).then(|| part.slice()),
                outer,
                n,
                inner,
                2.0,
            )
            .unwrap();
            exec_both(e, &steps, &mut [&mut x, &mut out, &mut part]);
            let at = |o: usize, j: usize, i: usize| xv[(o * n + j) * inner + i];
            let want: Vec<f64> = (0..outer * inner)
                .map(|t| 2.0 * (0..n).map(|j| at(t / inner, j, t % inner)).sum::<f64>())
                .collect();
            let (rt, a) = tol(d);
            let what = format!("sum_mid {d} {outer}x{n}x{inner} ({} steps)", steps.len());
            assert_close(&what, &out.get(), &want, (rt, a * (n as f64).sqrt() * 8.0));

            for which in [ArgReduce::Max, ArgReduce::Min] {
                let out = Buf::zeros(d, outer * inner, 0);
                let idx = Buf::zeros(DType::I64, outer * inner, 0);
                let l = reduce::plan_arg_mid(
                    &T1,
                    which,
                    x.slice(),
                    out.slice(),
                    Some(idx.slice()),
                    outer,
                    n,
                    inner,
                )
                .unwrap()
                .unwrap();
                exec1(e, l, &[&x, &out, &idx]);
                let gi = idx.get_i64();
                let gv = out.get();
                for t in 0..outer * inner {
                    let (o, i) = (t / inner, t % inner);
                    let mut bi = 0;
                    for j in 1..n {
                        let v = at(o, j, i);
                        if (which == ArgReduce::Max && v > at(o, bi, i))
                            || (which == ArgReduce::Min && v < at(o, bi, i))
                        {
                            bi = j;
                        }
                    }
                    assert_eq!(gi[t], bi as i64, "{which:?}_mid {d} output {t}");
                    assert_eq!(gv[t], at(o, bi, i), "{which:?}_mid {d} output {t}");
                }
            }
        }
    }
}
