//! Kernels against CPU references on a CUDA device: the real GPU when there is one, else the
//! emulated CUDA device (the same kernels, launch plans and library descriptors, on the CPU;
//! see `sinter_cuda::testing`). `SINTER_REQUIRE_GPU=1` makes them fail without a real GPU.

use std::sync::Arc;

use half::{bf16, f16};
use sinter_cuda::ops::{binary, conv, copy, dropout, embedding, reduce, unary};
use sinter_cuda::{
    testing, CudaDevice, DType, DevSlice, DeviceBuffer, Epilogue, GemmDType, GemmDesc, GemmShape,
    Pool,
};

fn dev() -> Option<Arc<CudaDevice>> {
    testing::gpu_tests(1)?;
    Some(CudaDevice::get(0).unwrap_or_else(|e| {
        panic!(
            "CUDA reported available but the device failed: {e}\n{}",
            sinter_cuda::report()
        )
    }))
}

/// Upload f32 values as `dt`.
fn up(d: &CudaDevice, v: &[f32], dt: DType) -> DeviceBuffer {
    match dt {
        DType::F32 => d.htod(v, Pool::Temporary),
        DType::BF16 => d.htod(
            &v.iter().map(|&x| bf16::from_f32(x)).collect::<Vec<_>>(),
            Pool::Temporary,
        ),
        DType::F16 => d.htod(
            &v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>(),
            Pool::Temporary,
        ),
        _ => panic!("float dtypes only"),
    }
    .unwrap()
}

/// Download as f32.
fn down(d: &CudaDevice, s: DevSlice<'_>) -> Vec<f32> {
    match s.dtype() {
        DType::F32 => d.dtoh::<f32>(s).unwrap(),
        DType::BF16 => d
            .dtoh::<bf16>(s)
            .unwrap()
            .into_iter()
            .map(f32::from)
            .collect(),
        DType::F16 => d
            .dtoh::<f16>(s)
            .unwrap()
            .into_iter()
            .map(f32::from)
            .collect(),
        other => panic!("{other}"),
    }
}

fn zeros(d: &CudaDevice, n: usize, dt: DType) -> DeviceBuffer {
    d.alloc_zeros(n, dt, Pool::Temporary).unwrap()
}

/// Values in [lo, hi), deterministic.
fn data(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Round through the storage dtype (the inputs the kernel actually saw).
fn q(v: &[f32], dt: DType) -> Vec<f32> {
    match dt {
        DType::BF16 => v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect(),
        DType::F16 => v.iter().map(|&x| f16::from_f32(x).to_f32()).collect(),
        _ => v.to_vec(),
    }
}

fn tol(dt: DType) -> f32 {
    match dt {
        DType::F32 => 2e-5,
        DType::F16 => 2e-3,
        _ => 1.6e-2,
    }
}

#[track_caller]
fn close(what: &str, got: &[f32], want: &[f32], rtol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let ok = (g.is_nan() && w.is_nan())
            || (g - w).abs() <= rtol * (1.0 + w.abs())
            || (g.is_infinite() && g == w);
        assert!(ok, "{what}[{i}]: got {g}, want {w}");
    }
}

#[test]
fn device_report_and_memory() {
    let Some(d) = dev() else { return };
    eprintln!("{}", sinter_cuda::report());
    d.preload_kernels().unwrap();
    let before = d.memory_stats();
    for _ in 0..3 {
        let a = d.alloc(12345, DType::F32, Pool::Temporary).unwrap();
        let b = d.alloc(999, DType::BF16, Pool::Permanent).unwrap();
        drop((a, b));
    }
    let after = d.memory_stats();
    assert!(after.temporary.device_allocs - before.temporary.device_allocs <= 1);
    assert!(after.permanent.device_allocs - before.permanent.device_allocs <= 1);
}

#[test]
fn unary_forward_backward() {
    let Some(d) = dev() else { return };
    let n = 1000 + 7; // exercises the vector body and the scalar tail
    for dt in DType::FLOATS {
        for op in unary::UnaryOp::all() {
            let (lo, hi) = match op {
                unary::UnaryOp::Log
                | unary::UnaryOp::Sqrt
                | unary::UnaryOp::Powf(_)
                | unary::UnaryOp::Recip => (0.5, 3.0),
                _ => (-4.0, 4.0),
            };
            let xs = q(&data(n, 1, lo, hi), dt);
            let x = up(&d, &xs, dt);
            let y = zeros(&d, n, dt);
            unary::unary(&d, op, x.as_slice(), y.as_slice()).unwrap();
            let want: Vec<f32> = xs.iter().map(|&v| op.reference(v)).collect();
            close(
                &format!("{op:?} {dt}"),
                &down(&d, y.as_slice()),
                &want,
                tol(dt) * 2.0,
            );
            // Backward against a central difference of the reference, in f32 inputs.
            if dt == DType::F32 {
                let gys = data(n, 2, -1.0, 1.0);
                let gy = up(&d, &gys, dt);
                let gx = zeros(&d, n, dt);
                let saved = match op.saves() {
                    unary::Saved::Input => x.as_slice(),
                    unary::Saved::Output => y.as_slice(),
                    unary::Saved::Nothing => gy.as_slice(),
                };
                unary::unary_backward(&d, op, saved, gy.as_slice(), gx.as_slice()).unwrap();
                let want: Vec<f32> = xs
                    .iter()
                    .zip(&gys)
                    .map(|(&v, &g)| {
                        let h = 1e-3f64;
                        let f = |t: f64| op.reference(t as f32) as f64;
                        (g as f64 * (f(v as f64 + h) - f(v as f64 - h)) / (2.0 * h)) as f32
                    })
                    .collect();
                let got = down(&d, gx.as_slice());
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    if (op == unary::UnaryOp::Relu || op == unary::UnaryOp::Abs)
                        && xs[i].abs() < 1e-2
                    {
                        continue; // kink
                    }
                    assert!(
                        (a - b).abs() <= 2e-2 * (1.0 + b.abs()),
                        "{op:?} bwd [{i}] x={}: {a} vs {b}",
                        xs[i]
                    );
                }
            }
        }
        let f = zeros(&d, 33, dt);
        unary::fill(&d, f.as_slice(), 2.5).unwrap();
        close("fill", &down(&d, f.as_slice()), &[2.5; 33], 0.0);
    }
}

#[test]
fn binary_contiguous_and_broadcast() {
    let Some(d) = dev() else { return };
    let (rows, cols) = (37, 129);
    for dt in DType::FLOATS {
        let av = q(&data(rows * cols, 3, -2.0, 2.0), dt);
        let mut bv = q(&data(rows * cols, 4, -2.0, 2.0), dt);
        bv[5] = av[5]; // an equal pair for maximum / minimum
        let bias = q(&data(cols, 5, -1.0, 1.0), dt);
        let (a, b, bb) = (up(&d, &av, dt), up(&d, &bv, dt), up(&d, &bias, dt));
        let out = zeros(&d, rows * cols, dt);
        for op in binary::BinaryOp::ALL {
            if op == binary::BinaryOp::Div {
                continue;
            }
            binary::binary(&d, op, a.as_slice(), b.as_slice(), out.as_slice()).unwrap();
            let want: Vec<f32> = q(
                &av.iter()
                    .zip(&bv)
                    .map(|(&x, &y)| op.reference(x, y))
                    .collect::<Vec<_>>(),
                dt,
            );
            close(
                &format!("{op:?} {dt}"),
                &down(&d, out.as_slice()),
                &want,
                tol(dt),
            );
            binary::binary_strided(
                &d,
                op,
                binary::StridedIn {
                    data: a.as_slice(),
                    strides: &[cols as i64, 1],
                },
                binary::StridedIn {
                    data: bb.as_slice(),
                    strides: &[0, 1],
                },
                out.as_slice(),
                &[rows, cols],
            )
            .unwrap();
            let want: Vec<f32> = q(
                &(0..rows * cols)
                    .map(|i| op.reference(av[i], bias[i % cols]))
                    .collect::<Vec<_>>(),
                dt,
            );
            close(
                &format!("{op:?} bcast {dt}"),
                &down(&d, out.as_slice()),
                &want,
                tol(dt),
            );
        }
        // where with a column-broadcast bool condition (bytes 0/1).
        let cv: Vec<f32> = (0..rows).map(|r| (r % 2) as f32).collect();
        let c = d.alloc(rows, DType::Bool, Pool::Temporary).unwrap();
        let bytes: Vec<u8> = cv.iter().map(|&x| x as u8).collect();
        d.copy_htod(&bytes, c.as_slice().reinterpret(DType::U8).unwrap())
            .unwrap();
        sinter_cuda::ops::boolean::where_bool(
            &d,
            binary::StridedIn {
                data: c.as_slice(),
                strides: &[1, 0],
            },
            binary::StridedIn {
                data: a.as_slice(),
                strides: &[cols as i64, 1],
            },
            binary::StridedIn {
                data: b.as_slice(),
                strides: &[cols as i64, 1],
            },
            out.as_slice(),
            &[rows, cols],
        )
        .unwrap();
        let want: Vec<f32> = (0..rows * cols)
            .map(|i| if cv[i / cols] != 0.0 { av[i] } else { bv[i] })
            .collect();
        close("where", &down(&d, out.as_slice()), &want, 0.0);
    }
}

#[test]
fn copies_and_casts() {
    let Some(d) = dev() else { return };
    let (r, c) = (19, 23);
    for dt in DType::FLOATS {
        let v = q(&data(r * c, 6, -3.0, 3.0), dt);
        let x = up(&d, &v, dt);
        let t = zeros(&d, r * c, dt);
        // Transpose: view [c, r] with strides [1, c].
        copy::contiguous(&d, x.as_slice(), &[1, c as i64], &[c, r], t.as_slice()).unwrap();
        let want: Vec<f32> = (0..c * r).map(|i| v[(i % r) * c + i / r]).collect();
        close("transpose", &down(&d, t.as_slice()), &want, 0.0);
        for to in DType::FLOATS {
            let y = zeros(&d, r * c, to);
            copy::cast(&d, x.as_slice(), y.as_slice()).unwrap();
            close(
                &format!("cast {dt}->{to}"),
                &down(&d, y.as_slice()),
                &q(&v, to),
                0.0,
            );
        }
        let yi = d.alloc(r * c, DType::I64, Pool::Temporary).unwrap();
        copy::cast(&d, x.as_slice(), yi.as_slice()).unwrap();
        let got = d.dtoh::<i64>(yi.as_slice()).unwrap();
        let want: Vec<i64> = v.iter().map(|&f| f as i64).collect();
        assert_eq!(got, want, "f -> i64 truncates");
    }
}

#[test]
fn reductions() {
    let Some(d) = dev() else { return };
    for dt in DType::FLOATS {
        for (rows, n) in [(5usize, 3usize), (64, 1000), (3, 70000)] {
            let v = q(&data(rows * n, 7, -1.0, 1.0), dt);
            let x = up(&d, &v, dt);
            let out = zeros(&d, rows, dt);
            let idx = d.alloc(rows, DType::I64, Pool::Temporary).unwrap();
            reduce::sum_last(&d, x.as_slice(), out.as_slice(), rows, n, 1.0 / n as f32).unwrap();
            let want: Vec<f32> = (0..rows)
                .map(|r| {
                    v[r * n..(r + 1) * n].iter().map(|&a| a as f64).sum::<f64>() as f32 / n as f32
                })
                .collect();
            close("mean_last", &down(&d, out.as_slice()), &want, tol(dt) * 4.0);
            reduce::arg_last(
                &d,
                reduce::ArgReduce::Max,
                x.as_slice(),
                out.as_slice(),
                Some(idx.as_slice()),
                rows,
                n,
            )
            .unwrap();
            let got_i = d.dtoh::<i64>(idx.as_slice()).unwrap();
            for r in 0..rows {
                let row = &v[r * n..(r + 1) * n];
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let first = row.iter().position(|&a| a == m).unwrap();
                assert_eq!(got_i[r] as usize, first, "argmax row {r}");
            }
        }
        // Middle dim, including the chunked two-pass path (inner small, n large).
        for (outer, n, inner) in [(3usize, 5usize, 4usize), (1, 20000, 96), (2, 100, 1)] {
            let v = q(&data(outer * n * inner, 8, -1.0, 1.0), dt);
            let x = up(&d, &v, dt);
            let out = zeros(&d, outer * inner, dt);
            reduce::sum_mid(&d, x.as_slice(), out.as_slice(), outer, n, inner, 1.0).unwrap();
            let want: Vec<f32> = (0..outer * inner)
                .map(|t| {
                    (0..n)
                        .map(|j| v[((t / inner) * n + j) * inner + t % inner] as f64)
                        .sum::<f64>() as f32
                })
                .collect();
            close("sum_mid", &down(&d, out.as_slice()), &want, tol(dt) * 8.0);
            let first = down(&d, out.as_slice());
            reduce::sum_mid(&d, x.as_slice(), out.as_slice(), outer, n, inner, 1.0).unwrap();
            assert_eq!(first, down(&d, out.as_slice()), "deterministic");
            reduce::arg_mid(
                &d,
                reduce::ArgReduce::Min,
                x.as_slice(),
                out.as_slice(),
                None,
                outer,
                n,
                inner,
            )
            .unwrap();
            let want: Vec<f32> = (0..outer * inner)
                .map(|t| {
                    (0..n)
                        .map(|j| v[((t / inner) * n + j) * inner + t % inner])
                        .fold(f32::INFINITY, f32::min)
                })
                .collect();
            close("min_mid", &down(&d, out.as_slice()), &want, 0.0);
        }
    }
}

#[test]
fn embedding_forward_backward_deterministic() {
    let Some(d) = dev() else { return };
    let (vocab, dim) = (50usize, 72usize);
    // Token 7 appears 3000 times (beyond the in-block sort capacity), others a few times.
    let idx: Vec<i64> = (0..4000)
        .map(|i| {
            if i % 4 != 0 {
                7
            } else {
                (i * 13 % vocab) as i64
            }
        })
        .collect();
    for dt in DType::FLOATS {
        let wv = q(&data(vocab * dim, 16, -1.0, 1.0), dt);
        let w = up(&d, &wv, dt);
        let ix = d.htod(&idx, Pool::Temporary).unwrap();
        let out = zeros(&d, idx.len() * dim, dt);
        embedding::embedding_forward(&d, w.as_slice(), ix.as_slice(), out.as_slice(), vocab, dim)
            .unwrap();
        let want: Vec<f32> = idx
            .iter()
            .flat_map(|&i| wv[i as usize * dim..(i as usize + 1) * dim].to_vec())
            .collect();
        close("emb fwd", &down(&d, out.as_slice()), &want, 0.0);
        let gyv = q(&data(idx.len() * dim, 17, -1.0, 1.0), dt);
        let gy = up(&d, &gyv, dt);
        let gw = zeros(&d, vocab * dim, dt);
        embedding::embedding_backward(
            &d,
            gy.as_slice(),
            ix.as_slice(),
            gw.as_slice(),
            vocab,
            dim,
            false,
        )
        .unwrap();
        let mut want = vec![0f64; vocab * dim];
        for (i, &t) in idx.iter().enumerate() {
            for j in 0..dim {
                want[t as usize * dim + j] += gyv[i * dim + j] as f64;
            }
        }
        let want: Vec<f32> = want.into_iter().map(|a| a as f32).collect();
        let first = down(&d, gw.as_slice());
        close(
            &format!("emb bwd {dt}"),
            &first,
            &want,
            if dt == DType::F32 { 1e-4 } else { 5e-2 },
        );
        embedding::embedding_backward(
            &d,
            gy.as_slice(),
            ix.as_slice(),
            gw.as_slice(),
            vocab,
            dim,
            false,
        )
        .unwrap();
        assert_eq!(first, down(&d, gw.as_slice()), "bit-identical across runs");
    }
}

#[test]
fn conv_helpers() {
    let Some(d) = dev() else { return };
    let g = conv::Window2d {
        n: 2,
        c: 3,
        h: 7,
        w: 6,
        kernel: (3, 2),
        stride: (2, 1),
        padding: (1, 1),
        dilation: (1, 2),
        ceil_mode: false,
    };
    let nin = g.n * g.c * g.h * g.w;
    let (oh, ow) = g.out_hw().unwrap();
    let xv = data(nin, 18, -1.0, 1.0);
    let x = up(&d, &xv, DType::F32);
    let col = zeros(&d, g.col_len().unwrap(), DType::F32);
    conv::im2col(&d, x.as_slice(), col.as_slice(), &g, g.c * g.h * g.w).unwrap();
    let colv = down(&d, col.as_slice());
    // CPU im2col.
    let mut want = vec![0f32; colv.len()];
    let mut i = 0;
    for n in 0..g.n {
        for c in 0..g.c {
            for ki in 0..g.kernel.0 {
                for kj in 0..g.kernel.1 {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let iy =
                                (oy * g.stride.0 + ki * g.dilation.0) as i64 - g.padding.0 as i64;
                            let ix =
                                (ox * g.stride.1 + kj * g.dilation.1) as i64 - g.padding.1 as i64;
                            if iy >= 0 && iy < g.h as i64 && ix >= 0 && ix < g.w as i64 {
                                want[i] =
                                    xv[((n * g.c + c) * g.h + iy as usize) * g.w + ix as usize];
                            }
                            i += 1;
                        }
                    }
                }
            }
        }
    }
    close("im2col", &colv, &want, 0.0);
    // col2im is the adjoint: <im2col(x), c> == <x, col2im(c)>.
    let cv = data(colv.len(), 19, -1.0, 1.0);
    let cb = up(&d, &cv, DType::F32);
    let back = zeros(&d, nin, DType::F32);
    conv::col2im(
        &d,
        cb.as_slice(),
        back.as_slice(),
        &g,
        g.c * g.h * g.w,
        false,
    )
    .unwrap();
    let lhs: f64 = colv
        .iter()
        .zip(&cv)
        .map(|(a, b)| *a as f64 * *b as f64)
        .sum();
    let rhs: f64 = xv
        .iter()
        .zip(down(&d, back.as_slice()))
        .map(|(a, b)| *a as f64 * b as f64)
        .sum();
    assert!(
        (lhs - rhs).abs() < 1e-3 * (1.0 + lhs.abs()),
        "{lhs} vs {rhs}"
    );

    // Max pool 2x2 stride 2 and its backward.
    let p = conv::Window2d {
        n: 1,
        c: 2,
        h: 4,
        w: 4,
        kernel: (2, 2),
        stride: (2, 2),
        padding: (0, 0),
        dilation: (1, 1),
        ceil_mode: false,
    };
    let pv = data(32, 20, -1.0, 1.0);
    let px = up(&d, &pv, DType::F32);
    let (py, am) = (
        zeros(&d, 8, DType::F32),
        d.alloc(8, DType::I64, Pool::Temporary).unwrap(),
    );
    conv::maxpool2d_forward(&d, px.as_slice(), py.as_slice(), Some(am.as_slice()), &p).unwrap();
    let yv = down(&d, py.as_slice());
    for pl in 0..2 {
        for oy in 0..2 {
            for ox in 0..2 {
                let m = (0..4)
                    .map(|k| pv[pl * 16 + (oy * 2 + k / 2) * 4 + ox * 2 + k % 2])
                    .fold(f32::NEG_INFINITY, f32::max);
                assert_eq!(yv[pl * 4 + oy * 2 + ox], m);
            }
        }
    }
    let gy = up(&d, &[1.0; 8], DType::F32);
    let gx = zeros(&d, 32, DType::F32);
    conv::maxpool2d_backward(&d, gy.as_slice(), am.as_slice(), gx.as_slice(), &p).unwrap();
    assert_eq!(down(&d, gx.as_slice()).iter().sum::<f32>(), 8.0);
    conv::avgpool2d_forward(&d, px.as_slice(), py.as_slice(), &p, true).unwrap();
    let av = down(&d, py.as_slice());
    assert!((av[0] - (pv[0] + pv[1] + pv[4] + pv[5]) / 4.0).abs() < 1e-6);

    // Batch-norm statistics.
    let bn = conv::BnShape { n: 3, c: 4, hw: 10 };
    let bv = data(120, 21, -2.0, 2.0);
    let bx = up(&d, &bv, DType::F32);
    let (mean, var) = (zeros(&d, 4, DType::F32), zeros(&d, 4, DType::F32));
    conv::batchnorm_stats(&d, bx.as_slice(), mean.as_slice(), var.as_slice(), &bn).unwrap();
    let (mv, vv) = (down(&d, mean.as_slice()), down(&d, var.as_slice()));
    for c in 0..4 {
        let vals: Vec<f64> = (0..3)
            .flat_map(|n| (0..10).map(move |s| (n, s)))
            .map(|(n, s)| bv[(n * 4 + c) * 10 + s] as f64)
            .collect();
        let mu = vals.iter().sum::<f64>() / 30.0;
        let var = vals.iter().map(|v| (v - mu).powi(2)).sum::<f64>() / 30.0;
        assert!((mv[c] as f64 - mu).abs() < 1e-5 && (vv[c] as f64 - var).abs() < 1e-5);
    }
}

#[test]
fn dropout_matches_cpu_mirror() {
    let Some(d) = dev() else { return };
    let n = 10_001;
    for dt in DType::FLOATS {
        let x = up(&d, &vec![1.0; n], dt);
        let y = zeros(&d, n, dt);
        dropout::dropout(&d, x.as_slice(), y.as_slice(), 0.25, 1234, 99).unwrap();
        let got = down(&d, y.as_slice());
        for (i, g) in got.iter().enumerate() {
            let keep = dropout::dropout_keep(1234, 99, i as u64, 0.25);
            let want = if keep { q(&[1.0 / 0.75], dt)[0] } else { 0.0 };
            assert_eq!(*g, want, "element {i}");
        }
        dropout::rand_normal(&d, y.as_slice(), 0.0, 1.0, 5, 0).unwrap();
        let v = down(&d, y.as_slice());
        let mean = v.iter().map(|&a| a as f64).sum::<f64>() / n as f64;
        let var = v.iter().map(|&a| (a as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.08,
            "{mean} {var}"
        );
    }
}

#[test]
fn gemm_all_dtypes_transposes_and_epilogues() {
    let Some(d) = dev() else { return };
    let (m, n, k, batch) = (33usize, 48usize, 40usize, 3usize);
    for dt in [
        GemmDType::F32,
        GemmDType::Tf32,
        GemmDType::BF16,
        GemmDType::F16,
    ] {
        let st = dt.storage();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let av = q(&data(batch * m * k, 26, -1.0, 1.0), st);
            let bv = q(&data(batch * k * n, 27, -1.0, 1.0), st);
            let biasv = q(&data(n, 28, -1.0, 1.0), st);
            let (a, b, bias) = (up(&d, &av, st), up(&d, &bv, st), up(&d, &biasv, st));
            let c = zeros(&d, batch * m * n, st);
            let shape = GemmShape::new(m, n, k).trans(ta, tb).batched(batch);
            let mut desc = GemmDesc::new(dt, shape, a.as_slice(), b.as_slice(), c.as_slice());
            desc.epilogue = Epilogue::Bias(bias.as_slice());
            d.gemm(&desc).unwrap();
            let mut want = vec![0f32; batch * m * n];
            for bt in 0..batch {
                for i in 0..m {
                    for j in 0..n {
                        let mut acc = biasv[j] as f64;
                        for kk in 0..k {
                            let x = if ta {
                                av[bt * m * k + kk * m + i]
                            } else {
                                av[bt * m * k + i * k + kk]
                            };
                            let y = if tb {
                                bv[bt * k * n + j * k + kk]
                            } else {
                                bv[bt * k * n + kk * n + j]
                            };
                            acc += x as f64 * y as f64;
                        }
                        want[bt * m * n + i * n + j] = acc as f32;
                    }
                }
            }
            let rt = match dt {
                GemmDType::F32 => 1e-5,
                GemmDType::Tf32 => 5e-3,
                GemmDType::F16 => 5e-3,
                GemmDType::BF16 => 2e-2,
            };
            close(
                &format!("gemm {dt:?} ta={ta} tb={tb}"),
                &down(&d, c.as_slice()),
                &want,
                rt,
            );
        }
    }
}
