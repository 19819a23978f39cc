//! CUDA backend conformance: every op runs on `Device::Cuda(0)` and on the CPU with the same
//! inputs, for f32, bf16 and f16 (and i64 where it applies), and the outputs and the input
//! gradients must agree: f32 within 1e-5 (1e-3 for TF32 products), f16/bf16 within 1e-2, each
//! relative to the larger of the element and the reference's RMS (so cancellation near zero
//! does not count as an error). Composite graphs (a CNN training step, a Transformer attention
//! block) compare all parameter gradients.
//!
//! Without a usable GPU every device test prints `skipped: no CUDA device` and passes; the
//! tests at the end (errors, not panics, when CUDA is unavailable) run everywhere. On a GPU
//! machine: `cargo test -p sinter-core --test cuda_conformance`.

use sinter_core::cuda;
use sinter_core::fused;
use sinter_core::op::{BinaryOp, UnaryOp};
use sinter_core::{
    AdamWParams, Conv2dParams, DType, Device, Error, Pool2dParams, Result, Rng, SgdParams, Tensor,
};

const CPU: Device = Device::Cpu;
const FLOATS: [DType; 3] = [DType::F32, DType::BF16, DType::F16];

/// The GPU under test, or None (after printing the skip line).
fn gpu() -> Option<Device> {
    if cuda::is_available() {
        Some(Device::Cuda(0))
    } else {
        println!("skipped: no CUDA device");
        None
    }
}

macro_rules! need_gpu {
    () => {
        match gpu() {
            Some(d) => d,
            None => return,
        }
    };
}

fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 1e-5,
        _ => 1e-2,
    }
}

// ---- inputs -------------------------------------------------------------------------------------

fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    Tensor::rand_uniform(shape, lo, hi, rng, DType::F32, CPU).unwrap()
}

/// |x| in [0.25, 2) with random sign: clear of the kinks at 0.
fn away_from_zero(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|_| (rng.uniform(0.25, 2.0) * if rng.next_f64() < 0.5 { -1.0 } else { 1.0 }) as f32)
        .collect();
    Tensor::from_vec(v, shape, CPU).unwrap()
}

/// Distinct values on a 1/8 grid (exact in every float dtype), shuffled: no ties.
fn distinct(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n).map(|i| (i as f32 - n as f32 / 2.0) / 8.0).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    Tensor::from_vec(v, shape, CPU).unwrap()
}

/// Values on a coarse grid, so comparisons see equal pairs.
fn grid(rng: &mut Rng, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n).map(|_| rng.below(5) as f32 * 0.5 - 1.0).collect();
    Tensor::from_vec(v, shape, CPU).unwrap()
}

/// A copy of an f32 tensor with storage of its own on `dev` (`to_device` to the same device
/// shares storage, and the optimizer tests update parameters in place).
fn fresh(t: &Tensor, dev: Device) -> Tensor {
    Tensor::from_vec(t.to_vec_f32().unwrap(), t.shape(), dev).unwrap()
}

fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, CPU).unwrap()
}

// ---- comparing ----------------------------------------------------------------------------------

fn assert_close(what: &str, got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    let rms = (want
        .iter()
        .filter(|v| v.is_finite())
        .map(|v| v * v)
        .sum::<f64>()
        / want.len().max(1) as f64)
        .sqrt();
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if g.is_nan() && w.is_nan() || g == w {
            continue;
        }
        let err = (g - w).abs();
        let scale = w.abs().max(rms).max(1e-30);
        assert!(err <= tol * scale, "{what}: element {i}: cuda {g} vs cpu {w} (error {err:.3e}, allowed {:.3e}; rms {rms:.3e})", tol * scale);
    }
}

/// A CPU input of a case; float inputs are cast to the dtype under test, and become variables
/// when `grad`.
#[derive(Clone)]
struct Input {
    t: Tensor,
    grad: bool,
}

fn var(t: Tensor) -> Input {
    Input { t, grad: true }
}
fn fixed(t: Tensor) -> Input {
    Input { t, grad: false }
}

struct Outcome {
    out: Vec<f64>,
    dtype: DType,
    shape: Vec<usize>,
    grads: Vec<Option<Vec<f64>>>,
}

/// Fixed pseudo-random weights for the scalar loss Σ w·y (so every output element gets its own
/// gradient).
fn loss_weights(shape: &[usize], dtype: DType, dev: Device) -> Tensor {
    let n: usize = shape.iter().product();
    let mut rng = Rng::new(n as u64 + 17);
    let v: Vec<f32> = (0..n).map(|_| (rng.below(16) as f32 - 7.5) / 8.0).collect();
    Tensor::from_vec(v, shape, CPU)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
        .to_device(dev)
        .unwrap()
}

fn eval(
    dev: Device,
    dtype: DType,
    inputs: &[Input],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Outcome {
    let xs: Vec<Tensor> = inputs
        .iter()
        .map(|i| {
            let t = if i.t.dtype().is_float() {
                i.t.to_dtype(dtype).unwrap()
            } else {
                i.t.clone()
            };
            let t = t.to_device(dev).unwrap();
            if i.grad && t.dtype().is_float() {
                t.to_var().unwrap()
            } else {
                t
            }
        })
        .collect();
    let y = f(&xs).unwrap_or_else(|e| panic!("on {dev}: {e}"));
    assert_eq!(y.device(), dev, "the output lives on the inputs' device");
    let out = y.to_vec_f64().unwrap();
    let mut grads = vec![None; xs.len()];
    if y.tracks_grad() {
        let w = loss_weights(y.shape(), y.dtype(), dev);
        y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        grads = xs
            .iter()
            .map(|x| {
                x.grad().map(|g| {
                    assert_eq!(g.device(), dev, "gradients live on the variable's device");
                    g.to_vec_f64().unwrap()
                })
            })
            .collect();
    }
    Outcome {
        out,
        dtype: y.dtype(),
        shape: y.shape().to_vec(),
        grads,
    }
}

/// Runs `f` on the CPU and on `gpu` for each dtype and compares outputs and gradients.
fn check(
    gpu: Device,
    name: &str,
    dtypes: &[DType],
    inputs: &[Input],
    tolerance: Option<f64>,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    for &dtype in dtypes {
        let t = tolerance.map_or(tol(dtype), |x| {
            if dtype == DType::F32 {
                x
            } else {
                x.max(tol(dtype))
            }
        });
        let want = eval(CPU, dtype, inputs, &f);
        let got = eval(gpu, dtype, inputs, &f);
        let what = format!("{name} [{dtype}]");
        assert_eq!(got.dtype, want.dtype, "{what}: output dtype");
        assert_eq!(got.shape, want.shape, "{what}: output shape");
        if want.dtype == DType::I64 {
            assert_eq!(got.out, want.out, "{what}: integer output");
        } else {
            assert_close(&format!("{what} output"), &got.out, &want.out, t);
        }
        for (i, (g, w)) in got.grads.iter().zip(&want.grads).enumerate() {
            match (g, w) {
                (Some(g), Some(w)) => {
                    assert_close(&format!("{what} gradient of input {i}"), g, w, t)
                }
                (None, None) => {}
                _ => panic!("{what}: gradient of input {i} present on one device only"),
            }
        }
    }
}

// ---- creation and transfer ----------------------------------------------------------------------

#[test]
fn creation_matches_cpu() {
    let g = need_gpu!();
    for dtype in [DType::F32, DType::BF16, DType::F16, DType::I64] {
        for (name, c, d) in [
            (
                "zeros",
                Tensor::zeros(&[3, 4], dtype, CPU).unwrap(),
                Tensor::zeros(&[3, 4], dtype, g).unwrap(),
            ),
            (
                "ones",
                Tensor::ones(&[5], dtype, CPU).unwrap(),
                Tensor::ones(&[5], dtype, g).unwrap(),
            ),
            (
                "full",
                Tensor::full(-2.5, &[2, 2, 2], dtype, CPU).unwrap(),
                Tensor::full(-2.5, &[2, 2, 2], dtype, g).unwrap(),
            ),
            (
                "arange",
                Tensor::arange(-3.0, 7.0, 0.5, dtype, CPU).unwrap(),
                Tensor::arange(-3.0, 7.0, 0.5, dtype, g).unwrap(),
            ),
            (
                "empty",
                Tensor::zeros(&[0, 3], dtype, CPU).unwrap(),
                Tensor::zeros(&[0, 3], dtype, g).unwrap(),
            ),
        ] {
            assert_eq!(d.device(), g);
            assert_eq!((d.shape(), d.dtype()), (c.shape(), c.dtype()), "{name}");
            assert_eq!(
                d.to_vec_f64().unwrap(),
                c.to_vec_f64().unwrap(),
                "{name} {dtype}"
            );
        }
    }
    let v: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
    let c = Tensor::from_vec(v.clone(), &[2, 3, 4], CPU).unwrap();
    let d = Tensor::from_vec(v.clone(), &[2, 3, 4], g).unwrap();
    assert_eq!(d.to_vec_f32().unwrap(), v);
    assert_eq!(d.to_le_bytes().unwrap(), c.to_le_bytes().unwrap());
    let back = Tensor::from_le_bytes(&c.to_le_bytes().unwrap(), DType::F32, &[2, 3, 4], g).unwrap();
    assert_eq!(back.to_vec_f32().unwrap(), v);
    let i = Tensor::from_vec(vec![5i64, -100, 7], &[3], g).unwrap();
    assert_eq!(i.to_vec_i64().unwrap(), vec![5, -100, 7]);
    assert_eq!(
        Tensor::from_vec(vec![4.5f32], &[], g)
            .unwrap()
            .to_scalar_f32()
            .unwrap(),
        4.5
    );
    // Random tensors come from the host Rng: the same seed gives the same values on both.
    for dtype in FLOATS {
        let a = Tensor::randn(&[64], 0.5, 2.0, &mut Rng::new(9), dtype, CPU).unwrap();
        let b = Tensor::randn(&[64], 0.5, 2.0, &mut Rng::new(9), dtype, g).unwrap();
        assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
        let a = Tensor::rand_uniform(&[33], -1.0, 3.0, &mut Rng::new(4), dtype, CPU).unwrap();
        let b = Tensor::rand_uniform(&[33], -1.0, 3.0, &mut Rng::new(4), dtype, g).unwrap();
        assert_eq!(a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    }
}

#[test]
fn transfer_round_trips_and_carries_gradients() {
    let g = need_gpu!();
    let mut rng = Rng::new(1);
    let x = uniform(&mut rng, &[4, 6], -1.0, 1.0);
    // A strided view moves as its values.
    let t = x.t().unwrap();
    let d = t.to_device(g).unwrap();
    assert_eq!(d.shape(), &[6, 4]);
    assert_eq!(d.to_vec_f32().unwrap(), t.to_vec_f32().unwrap());
    assert_eq!(
        d.to_device(CPU).unwrap().to_vec_f32().unwrap(),
        t.to_vec_f32().unwrap()
    );
    // Autograd across devices: CPU variable -> GPU compute -> CPU loss.
    let w = x.to_var().unwrap();
    let loss = w
        .to_device(g)
        .unwrap()
        .sqr()
        .unwrap()
        .to_device(CPU)
        .unwrap()
        .sum_all()
        .unwrap();
    loss.backward().unwrap();
    let grad = w.grad().unwrap();
    assert_eq!(grad.device(), CPU);
    assert_close(
        "d sum(x²)/dx",
        &grad.to_vec_f64().unwrap(),
        &x.mul_scalar(2.0).unwrap().to_vec_f64().unwrap(),
        1e-6,
    );
    // And the other way round: a GPU variable.
    let wg = x.to_device(g).unwrap().to_var().unwrap();
    wg.to_device(CPU)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gg = wg.grad().unwrap();
    assert_eq!(gg.device(), g);
    assert!(gg.to_vec_f32().unwrap().iter().all(|&v| v == 3.0));
    // Mixing devices in one op is an error, not a panic.
    let e = x.add(&x.to_device(g).unwrap()).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    let e = x.to_device(g).unwrap().matmul(&x.t().unwrap()).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

#[test]
fn casts_views_and_assign_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(2);
    let x = uniform(&mut rng, &[3, 5, 4], -4.0, 4.0);
    for from in FLOATS {
        for to in [DType::F32, DType::BF16, DType::F16, DType::I64] {
            check(
                g,
                &format!("to_dtype {from}->{to}"),
                &[from],
                &[fixed(x.clone())],
                Some(0.0),
                move |t| t[0].to_dtype(to),
            );
        }
    }
    let xi = x.mul_scalar(3.0).unwrap().to_dtype(DType::I64).unwrap();
    for to in FLOATS {
        check(
            g,
            &format!("to_dtype i64->{to}"),
            &[DType::F32],
            &[fixed(xi.clone())],
            Some(0.0),
            move |t| t[0].to_dtype(to),
        );
    }
    type View = fn(&Tensor) -> Result<Tensor>;
    let views: [(&str, View); 5] = [
        ("transpose", |t| t.transpose(0, 2)?.contiguous()),
        ("permute", |t| t.permute(&[1, 2, 0])?.contiguous()),
        ("narrow", |t| t.narrow(1, 1, 3)?.contiguous()),
        ("broadcast", |t| {
            t.narrow(2, 0, 1)?.broadcast_as(&[2, 3, 5, 4])?.contiguous()
        }),
        ("reshape of a view", |t| t.t()?.reshape(&[4, 15])),
    ];
    for (name, f) in views {
        check(g, name, &FLOATS, &[var(x.clone())], Some(0.0), move |t| {
            f(&t[0])
        });
        check(
            g,
            name,
            &[DType::F32],
            &[fixed(xi.clone())],
            Some(0.0),
            move |t| f(&t[0]),
        );
    }
    // assign writes through a strided view, casting.
    for dtype in FLOATS {
        let run = |dev: Device| {
            let dst = Tensor::zeros(&[4, 6], dtype, dev).unwrap();
            let src = x
                .narrow(0, 0, 1)
                .unwrap()
                .reshape(&[5, 4])
                .unwrap()
                .narrow(0, 0, 3)
                .unwrap()
                .to_device(dev)
                .unwrap();
            dst.narrow(1, 2, 3)
                .unwrap()
                .t()
                .unwrap()
                .narrow(1, 0, 4)
                .unwrap()
                .assign(&src.narrow(1, 0, 4).unwrap())
                .unwrap();
            dst.to_vec_f64().unwrap()
        };
        assert_eq!(run(g), run(CPU), "assign {dtype}");
    }
}

// ---- elementwise ---------------------------------------------------------------------------------

#[test]
fn unary_ops_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(3);
    let signed = away_from_zero(&mut rng, &[6, 7]);
    let positive = uniform(&mut rng, &[6, 7], 0.5, 2.0);
    let ops = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Sqr,
        UnaryOp::Recip,
        UnaryOp::Abs,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::GeluTanh,
        UnaryOp::GeluErf,
        UnaryOp::Silu,
        UnaryOp::Powf(1.7),
        UnaryOp::Affine(-1.5, 0.25),
    ];
    for op in ops {
        let x = if matches!(op, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Powf(_)) {
            positive.clone()
        } else {
            signed.clone()
        };
        check(g, op.name(), &FLOATS, &[var(x.clone())], None, move |t| {
            t[0].unary(op)
        });
        // Non-contiguous input.
        check(
            g,
            &format!("{} of a transpose", op.name()),
            &[DType::F32],
            &[var(x)],
            None,
            move |t| t[0].t()?.unary(op),
        );
    }
}

#[test]
fn binary_ops_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(4);
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[4, 5], &[4, 5]),
        (&[4, 5], &[5]),
        (&[3, 1, 5], &[4, 1]),
        (&[1], &[2, 3]),
        (&[2, 3, 4], &[]),
    ];
    let ops = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
    ];
    for (sa, sb) in shapes {
        let a = away_from_zero(&mut rng, sa);
        let b = away_from_zero(&mut rng, sb);
        for op in ops {
            check(
                g,
                &format!("{} {sa:?} {sb:?}", op.name()),
                &FLOATS,
                &[var(a.clone()), var(b.clone())],
                None,
                move |t| t[0].binary(&t[1], op),
            );
        }
        let (ga, gb) = (grid(&mut rng, sa), grid(&mut rng, sb));
        for op in [
            BinaryOp::Eq,
            BinaryOp::Ne,
            BinaryOp::Lt,
            BinaryOp::Le,
            BinaryOp::Gt,
            BinaryOp::Ge,
        ] {
            check(
                g,
                &format!("{} {sa:?} {sb:?}", op.name()),
                &FLOATS,
                &[fixed(ga.clone()), fixed(gb.clone())],
                Some(0.0),
                move |t| t[0].binary(&t[1], op),
            );
        }
        // Integers (computed on the host, results on the device).
        let (ia, ib) = (
            ga.mul_scalar(2.0).unwrap().to_dtype(DType::I64).unwrap(),
            gb.mul_scalar(2.0)
                .unwrap()
                .add_scalar(7.0)
                .unwrap()
                .to_dtype(DType::I64)
                .unwrap(),
        );
        for op in [
            BinaryOp::Add,
            BinaryOp::Sub,
            BinaryOp::Mul,
            BinaryOp::Div,
            BinaryOp::Maximum,
            BinaryOp::Eq,
            BinaryOp::Lt,
        ] {
            check(
                g,
                &format!("i64 {} {sa:?} {sb:?}", op.name()),
                &[DType::F32],
                &[fixed(ia.clone()), fixed(ib.clone())],
                Some(0.0),
                move |t| t[0].binary(&t[1], op),
            );
        }
    }
    // Strided operands: a transposed left side and a narrowed right side.
    let a = away_from_zero(&mut rng, &[5, 4]);
    let b = away_from_zero(&mut rng, &[4, 8]);
    check(g, "mul of views", &FLOATS, &[var(a), var(b)], None, |t| {
        t[0].t()?.mul(&t[1].narrow(1, 2, 5)?)
    });
}

#[test]
fn where_and_masked_fill_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(5);
    let cond = grid(&mut rng, &[4, 1, 5])
        .gt(&Tensor::zeros(&[], DType::F32, CPU).unwrap())
        .unwrap();
    let a = uniform(&mut rng, &[4, 3, 5], -1.0, 1.0);
    let b = uniform(&mut rng, &[3, 1], -1.0, 1.0);
    check(
        g,
        "where",
        &FLOATS,
        &[fixed(cond.clone()), var(a.clone()), var(b.clone())],
        Some(0.0),
        |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
    );
    // A condition of another dtype than the operands.
    let c64 = cond.to_dtype(DType::I64).unwrap();
    check(
        g,
        "where (i64 condition)",
        &FLOATS,
        &[fixed(c64.clone()), var(a.clone()), var(b.clone())],
        Some(0.0),
        |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
    );
    check(
        g,
        "where of i64 values",
        &[DType::F32],
        &[
            fixed(cond.clone()),
            fixed(a.mul_scalar(4.0).unwrap().to_dtype(DType::I64).unwrap()),
            fixed(c64),
        ],
        Some(0.0),
        |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
    );
    let mask = Tensor::from_vec(
        (0..15)
            .map(|i| (i % 4 == 0) as u8 as f32)
            .collect::<Vec<_>>(),
        &[3, 5],
        CPU,
    )
    .unwrap();
    check(
        g,
        "masked_fill",
        &FLOATS,
        &[var(a), fixed(mask)],
        Some(0.0),
        |t| {
            t[0].masked_fill(&t[1].to_dtype(t[0].dtype())?, -1e4)?
                .softmax(-1)
        },
    );
}

// ---- reductions -----------------------------------------------------------------------------------

#[test]
fn reductions_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(6);
    let x = distinct(&mut rng, &[3, 4, 5]);
    for dims in [vec![0], vec![1], vec![2], vec![0, 2], vec![0, 1, 2]] {
        for keep in [false, true] {
            let d = dims.clone();
            check(
                g,
                &format!("sum {dims:?} keep {keep}"),
                &FLOATS,
                &[var(x.clone())],
                None,
                move |t| t[0].sum(&d.iter().map(|&v| v as isize).collect::<Vec<_>>(), keep),
            );
            let d = dims.clone();
            check(
                g,
                &format!("mean {dims:?}"),
                &FLOATS,
                &[var(x.clone())],
                None,
                move |t| t[0].mean(&d.iter().map(|&v| v as isize).collect::<Vec<_>>(), keep),
            );
        }
    }
    for dim in [0isize, 1, -1] {
        check(
            g,
            &format!("max {dim}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].max(dim, false),
        );
        check(
            g,
            &format!("min {dim}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].min(dim, true),
        );
        check(
            g,
            &format!("argmax {dim}"),
            &FLOATS,
            &[fixed(x.clone())],
            None,
            move |t| t[0].argmax(dim, false),
        );
        // Integer reductions.
        let xi = x.mul_scalar(8.0).unwrap().to_dtype(DType::I64).unwrap();
        check(
            g,
            &format!("i64 sum {dim}"),
            &[DType::F32],
            &[fixed(xi.clone())],
            Some(0.0),
            move |t| t[0].sum(&[dim], false),
        );
        check(
            g,
            &format!("i64 argmax {dim}"),
            &[DType::F32],
            &[fixed(xi)],
            Some(0.0),
            move |t| t[0].argmax(dim, true),
        );
    }
    check(
        g,
        "sum of a transpose",
        &FLOATS,
        &[var(x.clone())],
        None,
        |t| t[0].transpose(0, 2)?.sum(&[1], false),
    );
    check(
        g,
        "sum_all / mean_all",
        &FLOATS,
        &[var(x.clone())],
        None,
        |t| t[0].sum_all()?.add(&t[0].mean_all()?),
    );
    // A longer row (several warps) and a wide middle reduction.
    let long = uniform(&mut rng, &[3, 3000], -1.0, 1.0);
    check(
        g,
        "sum of long rows",
        &FLOATS,
        &[var(long.clone())],
        None,
        |t| t[0].sum(&[1], false),
    );
    check(
        g,
        "sum over a long middle dim",
        &FLOATS,
        &[var(long.clone())],
        None,
        |t| t[0].t()?.contiguous()?.sum(&[0], false),
    );
    check(g, "max of long rows", &FLOATS, &[var(long)], None, |t| {
        t[0].max(-1, false)
    });
    // Empty dimension: sums are zero.
    check(
        g,
        "sum over an empty dim",
        &[DType::F32],
        &[fixed(Tensor::zeros(&[2, 0, 3], DType::F32, CPU).unwrap())],
        None,
        |t| t[0].sum(&[1], false),
    );
}

#[test]
fn softmax_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(7);
    let x = uniform(&mut rng, &[3, 4, 9], -3.0, 3.0);
    for dim in [-1isize, 0, 1] {
        check(
            g,
            &format!("softmax {dim}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].softmax(dim),
        );
        check(
            g,
            &format!("log_softmax {dim}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].log_softmax(dim),
        );
    }
    let wide = uniform(&mut rng, &[2, 5000], -5.0, 5.0);
    check(
        g,
        "softmax of wide rows",
        &FLOATS,
        &[var(wide)],
        None,
        |t| t[0].softmax(-1),
    );
}

// ---- linear algebra ---------------------------------------------------------------------------------

type Graph = fn(&[Tensor]) -> Result<Tensor>;

fn matmul_cases(rng: &mut Rng) -> Vec<(&'static str, Vec<Input>, Graph)> {
    let mut u = |s: &[usize]| var(uniform(rng, s, -1.0, 1.0));
    let mut v: Vec<(&'static str, Vec<Input>, Graph)> = Vec::new();
    v.push(("2-D", vec![u(&[5, 7]), u(&[7, 3])], |t| t[0].matmul(&t[1])));
    v.push((
        "batched x shared (one tall GEMM)",
        vec![u(&[2, 5, 7]), u(&[7, 3])],
        |t| t[0].matmul(&t[1]),
    ));
    v.push(("batched", vec![u(&[2, 5, 7]), u(&[2, 7, 3])], |t| {
        t[0].matmul(&t[1])
    }));
    v.push(("shared x batched", vec![u(&[5, 7]), u(&[3, 7, 2])], |t| {
        t[0].matmul(&t[1])
    }));
    v.push((
        "broadcast batch dims",
        vec![u(&[3, 1, 4, 6]), u(&[2, 6, 5])],
        |t| t[0].matmul(&t[1]),
    ));
    v.push(("transposed operands", vec![u(&[7, 5]), u(&[3, 7])], |t| {
        t[0].t()?.matmul(&t[1].t()?)
    }));
    v.push(("x · Wᵀ (linear)", vec![u(&[2, 3, 8]), u(&[6, 8])], |t| {
        t[0].matmul(&t[1].t()?)
    }));
    v.push(("narrowed views", vec![u(&[5, 10]), u(&[9, 4])], |t| {
        t[0].narrow(1, 2, 7)?.matmul(&t[1].narrow(0, 1, 7)?)
    }));
    v.push((
        "attention scores",
        vec![u(&[2, 3, 4, 8]), u(&[2, 3, 6, 8])],
        |t| t[0].matmul(&t[1].t()?),
    ));
    v.push((
        "permuted batch",
        vec![u(&[3, 2, 4, 5]), u(&[2, 3, 5, 4])],
        |t| t[0].permute(&[1, 0, 2, 3])?.matmul(&t[1]),
    ));
    v.push(("vector-like", vec![u(&[1, 9]), u(&[9, 1])], |t| {
        t[0].matmul(&t[1])
    }));
    v.push(("larger", vec![u(&[64, 96]), u(&[96, 80])], |t| {
        t[0].matmul(&t[1])
    }));
    v
}

#[test]
fn matmul_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(8);
    for (name, inputs, f) in matmul_cases(&mut rng) {
        check(g, &format!("matmul {name}"), &FLOATS, &inputs, None, f);
    }
}

#[test]
fn matmul_tf32_within_1e_3() {
    let g = need_gpu!();
    let _s = serial();
    let mut rng = Rng::new(9);
    cuda::set_allow_tf32(true);
    for (name, inputs, f) in matmul_cases(&mut rng) {
        check(
            g,
            &format!("matmul tf32 {name}"),
            &[DType::F32],
            &inputs,
            Some(1e-3),
            f,
        );
    }
    cuda::set_allow_tf32(false);
}

// ---- convolution and pooling -----------------------------------------------------------------------

#[test]
fn conv2d_matches_cpu() {
    let g = need_gpu!();
    let _s = serial();
    let mut rng = Rng::new(10);
    let cases: [(&[usize], &[usize], Conv2dParams); 6] = [
        (
            &[2, 3, 8, 8],
            &[4, 3, 3, 3],
            Conv2dParams {
                stride: 1,
                padding: 1,
                dilation: 1,
                groups: 1,
            },
        ),
        (
            &[1, 3, 8, 8],
            &[4, 3, 3, 3],
            Conv2dParams {
                stride: 1,
                padding: 0,
                dilation: 1,
                groups: 1,
            },
        ),
        (
            &[3, 4, 9, 7],
            &[6, 2, 3, 2],
            Conv2dParams {
                stride: 2,
                padding: 1,
                dilation: 1,
                groups: 2,
            },
        ),
        (
            &[2, 2, 11, 11],
            &[3, 2, 3, 3],
            Conv2dParams {
                stride: 1,
                padding: 2,
                dilation: 2,
                groups: 1,
            },
        ),
        (
            &[2, 4, 6, 6],
            &[4, 1, 3, 3],
            Conv2dParams {
                stride: 1,
                padding: 1,
                dilation: 1,
                groups: 4,
            },
        ),
        (
            &[4, 8, 5, 5],
            &[16, 8, 1, 1],
            Conv2dParams {
                stride: 1,
                padding: 0,
                dilation: 1,
                groups: 1,
            },
        ),
    ];
    for (xs, ws, p) in cases {
        let x = uniform(&mut rng, xs, -1.0, 1.0);
        let w = uniform(&mut rng, ws, -0.5, 0.5);
        check(
            g,
            &format!("conv2d {xs:?} {ws:?} {p:?}"),
            &FLOATS,
            &[var(x), var(w)],
            Some(2e-5),
            move |t| t[0].conv2d(&t[1], p),
        );
    }
    // Only the weight, or only the input, needs a gradient.
    let x = uniform(&mut rng, &[2, 3, 6, 6], -1.0, 1.0);
    let w = uniform(&mut rng, &[2, 3, 3, 3], -0.5, 0.5);
    let p = Conv2dParams {
        stride: 1,
        padding: 1,
        dilation: 1,
        groups: 1,
    };
    check(
        g,
        "conv2d dw only",
        &FLOATS,
        &[fixed(x.clone()), var(w.clone())],
        Some(2e-5),
        move |t| t[0].conv2d(&t[1], p),
    );
    check(
        g,
        "conv2d dx only",
        &FLOATS,
        &[var(x.clone()), fixed(w.clone())],
        Some(2e-5),
        move |t| t[0].conv2d(&t[1], p),
    );
    // A non-contiguous input.
    check(
        g,
        "conv2d of a permuted input",
        &[DType::F32],
        &[
            var(x.permute(&[0, 1, 3, 2]).unwrap().contiguous().unwrap()),
            var(w),
        ],
        Some(2e-5),
        move |t| t[0].permute(&[0, 1, 3, 2])?.conv2d(&t[1], p),
    );
}

#[test]
fn conv2d_splits_large_batches_into_chunks() {
    let g = need_gpu!();
    // 96 images of a 64-channel 3x3 conv over 32x32 make a column matrix larger than one chunk.
    let mut rng = Rng::new(11);
    let x = uniform(&mut rng, &[96, 64, 32, 32], -1.0, 1.0);
    let w = uniform(&mut rng, &[8, 64, 3, 3], -0.1, 0.1);
    let p = Conv2dParams {
        stride: 1,
        padding: 1,
        dilation: 1,
        groups: 1,
    };
    check(
        g,
        "conv2d chunked",
        &[DType::F32],
        &[var(x), var(w)],
        Some(1e-4),
        move |t| t[0].conv2d(&t[1], p),
    );
}

#[test]
fn pooling_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(12);
    let x = distinct(&mut rng, &[2, 3, 8, 7]);
    for p in [
        Pool2dParams {
            kernel: 2,
            stride: 2,
            padding: 0,
        },
        Pool2dParams {
            kernel: 3,
            stride: 2,
            padding: 1,
        },
        Pool2dParams {
            kernel: 3,
            stride: 1,
            padding: 0,
        },
    ] {
        check(
            g,
            &format!("max_pool2d {p:?}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].max_pool2d(p),
        );
        check(
            g,
            &format!("avg_pool2d {p:?}"),
            &FLOATS,
            &[var(x.clone())],
            None,
            move |t| t[0].avg_pool2d(p),
        );
    }
}

// ---- NN ops --------------------------------------------------------------------------------------------

#[test]
fn layer_norm_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(13);
    for shape in [&[4, 6, 32][..], &[3, 1000], &[5, 7]] {
        let n = *shape.last().unwrap();
        let x = uniform(&mut rng, shape, -2.0, 3.0);
        let (ga, be) = (
            uniform(&mut rng, &[n], 0.5, 1.5),
            uniform(&mut rng, &[n], -0.5, 0.5),
        );
        check(
            g,
            &format!("layer_norm {shape:?}"),
            &FLOATS,
            &[var(x), var(ga), var(be)],
            Some(2e-5),
            |t| t[0].layer_norm(&t[1], &t[2], 1e-5),
        );
    }
    let x = uniform(&mut rng, &[6, 5], -2.0, 2.0);
    let (ga, be) = (
        uniform(&mut rng, &[6], 0.5, 1.5),
        uniform(&mut rng, &[6], -0.5, 0.5),
    );
    check(
        g,
        "layer_norm of a transpose, fixed affine",
        &FLOATS,
        &[var(x), fixed(ga), fixed(be)],
        Some(2e-5),
        |t| t[0].t()?.layer_norm(&t[1], &t[2], 1e-5),
    );
}

#[test]
fn cross_entropy_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(14);
    let logits = uniform(&mut rng, &[6, 10], -3.0, 3.0);
    let t = ids(&[3, -100, 0, 9, 9, -100], &[6]);
    check(
        g,
        "cross_entropy",
        &FLOATS,
        &[var(logits.clone()), fixed(t.clone())],
        None,
        |x| x[0].cross_entropy(&x[1], -100),
    );
    // (`check` moves the targets to the device too.) Targets left on the host work as well.
    for dtype in FLOATS {
        let want = logits
            .to_dtype(dtype)
            .unwrap()
            .cross_entropy(&t, -100)
            .unwrap()
            .to_scalar_f32()
            .unwrap();
        let got = logits
            .to_dtype(dtype)
            .unwrap()
            .to_device(g)
            .unwrap()
            .cross_entropy(&t, -100)
            .unwrap();
        assert_eq!((got.dtype(), got.device()), (DType::F32, g));
        assert_close(
            "cross_entropy (host targets)",
            &[got.to_scalar_f32().unwrap() as f64],
            &[want as f64],
            tol(dtype),
        );
    }
    let l3 = uniform(&mut rng, &[2, 3, 50], -3.0, 3.0);
    let t3 = ids(&[1, 49, 0, 7, 7, 30], &[2, 3]);
    check(
        g,
        "cross_entropy [2, 3, 50]",
        &FLOATS,
        &[var(l3), fixed(t3)],
        None,
        |x| x[0].cross_entropy(&x[1], -100),
    );
    // A bad host target is an error naming it.
    let e = logits
        .to_device(g)
        .unwrap()
        .cross_entropy(&ids(&[3, 1, 0, 10, 9, 2], &[6]), -100)
        .unwrap_err();
    assert!(e.to_string().contains("target 10"), "{e}");
    check(
        g,
        "mse_loss",
        &FLOATS,
        &[
            var(uniform(&mut rng, &[4, 3], -1.0, 1.0)),
            var(uniform(&mut rng, &[4, 3], -1.0, 1.0)),
        ],
        None,
        |x| x[0].mse_loss(&x[1]),
    );
}

#[test]
fn gather_scatter_and_cat_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(15);
    let table = uniform(&mut rng, &[20, 8], -1.0, 1.0);
    let tok = ids(&[3, 19, 0, 3, 3, 7, 12, 0, 5, 5, 5, 1], &[3, 4]);
    check(
        g,
        "embedding",
        &FLOATS,
        &[var(table.clone()), fixed(tok.clone())],
        None,
        |t| t[0].embedding(&t[1]),
    );
    let x = uniform(&mut rng, &[3, 5, 4], -1.0, 1.0);
    let idx = ids(&[4, 0, 4, 2], &[4]);
    for dim in [0isize, 1, 2] {
        let i = if dim == 1 {
            idx.clone()
        } else {
            ids(&[2, 0, 2], &[3])
        };
        check(
            g,
            &format!("index_select {dim}"),
            &FLOATS,
            &[var(x.clone()), fixed(i.clone())],
            None,
            move |t| t[0].index_select(dim, &t[1]),
        );
        check(
            g,
            &format!("i64 index_select {dim}"),
            &[DType::F32],
            &[
                fixed(x.mul_scalar(9.0).unwrap().to_dtype(DType::I64).unwrap()),
                fixed(i),
            ],
            Some(0.0),
            move |t| t[0].index_select(dim, &t[1]),
        );
    }
    check(
        g,
        "index_select of a transpose",
        &FLOATS,
        &[var(x.clone())],
        Some(0.0),
        |t| {
            t[0].transpose(0, 1)?
                .index_select(0, &Tensor::from_vec(vec![1i64, 1, 4], &[3], t[0].device())?)
        },
    );
    let base = uniform(&mut rng, &[5, 3], -1.0, 1.0);
    let src = uniform(&mut rng, &[3, 3], -1.0, 1.0);
    check(
        g,
        "index_add",
        &FLOATS,
        &[var(base), fixed(ids(&[1, 3, 1], &[3])), var(src)],
        None,
        |t| t[0].index_add(0, &t[1], &t[2]),
    );
    // Out-of-range indices are errors.
    let e = table
        .to_device(g)
        .unwrap()
        .embedding(&ids(&[1, 20], &[2]))
        .unwrap_err();
    assert!(e.to_string().contains("20"), "{e}");
    let parts = [
        uniform(&mut rng, &[2, 3], -1.0, 1.0),
        uniform(&mut rng, &[2, 1], -1.0, 1.0),
        uniform(&mut rng, &[4, 2], -1.0, 1.0),
    ];
    check(
        g,
        "cat",
        &FLOATS,
        &[
            var(parts[0].clone()),
            var(parts[1].clone()),
            var(parts[2].clone()),
        ],
        Some(0.0),
        |t| Tensor::cat(&[t[0].clone(), t[1].clone(), t[2].t()?], 1),
    );
    check(
        g,
        "i64 cat",
        &[DType::F32],
        &[fixed(ids(&[1, 2, 3], &[3])), fixed(ids(&[4, 5], &[2]))],
        Some(0.0),
        |t| Tensor::cat(&[t[0].clone(), t[1].clone()], 0),
    );
    check(
        g,
        "stack / split / chunk",
        &FLOATS,
        &[
            var(parts[0].clone()),
            var(parts[0].mul_scalar(2.0).unwrap()),
        ],
        Some(0.0),
        |t| {
            let s = Tensor::stack(&[t[0].clone(), t[1].clone()], 1)?;
            let pieces = s.split(&[1, 2], 2)?;
            let halves = s.chunk(2, 1)?;
            pieces[1].mul(&halves[0].narrow(2, 0, 2)?)
        },
    );
}

#[test]
fn dropout_on_the_device() {
    let g = need_gpu!();
    for dtype in FLOATS {
        let x = Tensor::ones(&[4000], dtype, g).unwrap().to_var().unwrap();
        let y = x.dropout(0.3, &mut Rng::new(1)).unwrap();
        let v = y.to_vec_f32().unwrap();
        let dropped = v.iter().filter(|&&a| a == 0.0).count() as f64 / v.len() as f64;
        assert!((dropped - 0.3).abs() < 0.04, "{dtype}: dropped {dropped}");
        assert!(
            v.iter().all(|&a| a == 0.0 || (a - 1.0 / 0.7).abs() <= 1e-2),
            "{dtype}: kept values are scaled by 1/(1-p)"
        );
        // The same Rng state gives the same mask; the backward applies that mask.
        let y2 = x.detach().dropout(0.3, &mut Rng::new(1)).unwrap();
        assert_eq!(y2.to_vec_f32().unwrap(), v);
        y.sum_all().unwrap().backward().unwrap();
        assert_eq!(
            x.grad().unwrap().to_vec_f32().unwrap(),
            v,
            "{dtype}: d sum(dropout(1))/dx is the mask"
        );
        // The Rng advanced: the next mask differs.
        let mut r = Rng::new(1);
        let a = x
            .detach()
            .dropout(0.3, &mut r)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        let b = x
            .detach()
            .dropout(0.3, &mut r)
            .unwrap()
            .to_vec_f32()
            .unwrap();
        assert_ne!(a, b);
    }
}

// ---- optimizers -----------------------------------------------------------------------------------------

#[test]
fn optimizer_steps_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(16);
    let p0 = uniform(&mut rng, &[7, 9], -1.0, 1.0);
    let grads: Vec<Tensor> = (0..3)
        .map(|_| uniform(&mut rng, &[7, 9], -1.0, 1.0))
        .collect();
    let h = |step| AdamWParams {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        step,
    };
    let run_adam = |dev: Device, gdtype: DType| {
        let p = fresh(&p0, dev).to_var().unwrap();
        let (m, v) = (p.zeros_like().unwrap(), p.zeros_like().unwrap());
        for (i, gr) in grads.iter().enumerate() {
            p.adamw_step(
                &gr.to_dtype(gdtype).unwrap().to_device(dev).unwrap(),
                &m,
                &v,
                h(i as u64 + 1),
            )
            .unwrap();
        }
        [p, m, v].map(|t| t.to_vec_f64().unwrap())
    };
    for gdtype in FLOATS {
        let (c, d) = (run_adam(CPU, gdtype), run_adam(g, gdtype));
        for (name, (a, b)) in ["param", "m", "v"].iter().zip(d.iter().zip(&c)) {
            assert_close(&format!("adamw {name} (grad {gdtype})"), a, b, 1e-5);
        }
    }
    for (momentum, nesterov) in [(0.0, false), (0.9, false), (0.9, true)] {
        let hs = SgdParams {
            lr: 0.1,
            momentum,
            nesterov,
            weight_decay: 0.01,
        };
        let run = |dev: Device| {
            let p = fresh(&p0, dev).to_var().unwrap();
            let buf = p.zeros_like().unwrap();
            for gr in &grads {
                let gr = gr.to_device(dev).unwrap();
                if momentum > 0.0 {
                    p.sgd_step(&gr, Some(&buf), hs).unwrap();
                } else {
                    p.sgd_step(&gr, None, hs).unwrap();
                }
            }
            p.to_vec_f64().unwrap()
        };
        assert_close(
            &format!("sgd momentum {momentum} nesterov {nesterov}"),
            &run(g),
            &run(CPU),
            1e-5,
        );
    }
    // Misuse is an error.
    let p = p0.to_device(g).unwrap().to_var().unwrap();
    let e = p
        .adamw_step(
            &grads[0].to_device(g).unwrap(),
            &p,
            &p.zeros_like().unwrap(),
            h(1),
        )
        .unwrap_err();
    assert!(e.to_string().contains("share"), "{e}");
    let pb = p0
        .to_dtype(DType::BF16)
        .unwrap()
        .to_device(g)
        .unwrap()
        .to_var()
        .unwrap();
    let e = pb
        .adamw_step(
            &pb.zeros_like().unwrap(),
            &pb.zeros_like().unwrap(),
            &pb.zeros_like().unwrap(),
            h(1),
        )
        .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
}

#[test]
fn parameters_live_in_the_permanent_pool() {
    let g = need_gpu!();
    // Everything starts in the temporary pool.
    let w = Tensor::ones(&[1024, 1024], DType::F32, g)
        .unwrap()
        .to_var()
        .unwrap();
    let grad = w.mul_scalar(0.5).unwrap();
    assert_eq!(w.cuda_pool(), Some(cuda::Pool::Temporary));
    // The first optimizer step moves the parameter and its state (made with zeros_like) to the
    // permanent pool, in place: views and clones taken before see the move.
    let view = w.t().unwrap();
    let (m, v) = (w.zeros_like().unwrap(), w.zeros_like().unwrap());
    w.adamw_step(
        &grad,
        &m,
        &v,
        AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 1,
        },
    )
    .unwrap();
    for (name, t) in [("param", &w), ("its view", &view), ("m", &m), ("v", &v)] {
        assert_eq!(t.cuda_pool(), Some(cuda::Pool::Permanent), "{name}");
    }
    assert_eq!(grad.cuda_pool(), Some(cuda::Pool::Temporary));
    // The update went to the moved buffer (AdamW's first step moves each weight by about lr).
    let vals = view.to_vec_f32().unwrap();
    assert!(
        vals.iter().all(|&x| (x - (1.0 - 1e-3)).abs() < 1e-5),
        "{:?}",
        &vals[..4]
    );
    let s = cuda::memory_stats(0).unwrap();
    assert!(s.permanent >= 3 * (4 << 20), "{s:?}");
    assert!(
        s.peak >= s.in_use && s.reserved >= s.in_use && s.in_use >= s.permanent,
        "{s:?}"
    );
    assert_eq!(
        Tensor::zeros(&[2], DType::F32, CPU).unwrap().cuda_pool(),
        None
    );
}

// ---- fused ops ------------------------------------------------------------------------------------------

#[test]
fn fused_ops_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(17);
    let (q, k, v) = (
        uniform(&mut rng, &[2, 3, 5, 8], -1.0, 1.0),
        uniform(&mut rng, &[2, 3, 7, 8], -1.0, 1.0),
        uniform(&mut rng, &[2, 3, 7, 8], -1.0, 1.0),
    );
    // On the device these run as composites of device ops, which round f16/bf16 between the
    // steps the CPU kernels fuse: half precision gets a little more room.
    let cases: [(&[DType], f64); 2] = [(&[DType::F32], 2e-5), (&[DType::BF16, DType::F16], 3e-2)];
    for (dtypes, t) in cases {
        for causal in [false, true] {
            check(
                g,
                &format!("attention causal {causal}"),
                dtypes,
                &[var(q.clone()), var(k.clone()), var(v.clone())],
                Some(t),
                move |t| fused::attention(&t[0], &t[1], &t[2], causal, 0.35),
            );
        }
        let x = uniform(&mut rng, &[4, 6], -2.0, 2.0);
        let b = uniform(&mut rng, &[6], -1.0, 1.0);
        check(
            g,
            "bias_gelu",
            dtypes,
            &[var(x.clone()), var(b.clone())],
            Some(t.max(1e-5)),
            |t| fused::bias_gelu(&t[0], &t[1]),
        );
        let r = uniform(&mut rng, &[4, 6], -2.0, 2.0);
        let ga = uniform(&mut rng, &[6], 0.5, 1.5);
        check(
            g,
            "residual_layer_norm",
            dtypes,
            &[var(x), var(r), var(ga), var(b)],
            Some(t),
            |t| {
                let (s, n) = fused::residual_layer_norm(&t[0], &t[1], &t[2], &t[3], 1e-5)?;
                s.add(&n)
            },
        );
    }
    let x = uniform(&mut rng, &[4, 6], -2.0, 2.0);
    let b = uniform(&mut rng, &[6], -1.0, 1.0);
    let gs = [x.clone(), b.clone(), uniform(&mut rng, &[300], -1.0, 1.0)];
    let want = fused::global_grad_norm(&gs);
    let on_gpu: Vec<Tensor> = gs.iter().map(|t| t.to_device(g).unwrap()).collect();
    let got = fused::global_grad_norm(&on_gpu);
    assert_close("global_grad_norm", &[got], &[want], 1e-5);
}

/// The flash attention kernels (f16/bf16, head dims 64 and 128) against the CPU fused op:
/// outputs and all three gradients, causal and not, tq = tk, tq < tk (KV cache), tq > tk (rows
/// that see no key), lengths that are not multiples of the tiles, and q/k/v read in place as
/// heads narrowed out of one packed projection. Half-precision tolerance: P and dS are rounded
/// to the input dtype before their tensor-core products, as in FlashAttention-2.
#[test]
fn flash_attention_kernels_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(29);
    for d in [64usize, 128] {
        for (tq, tk) in [(77usize, 77usize), (20, 100), (1, 45), (70, 40)] {
            let (b, h) = (2usize, 3usize);
            let q = uniform(&mut rng, &[b, h, tq, d], -1.0, 1.0);
            let k = uniform(&mut rng, &[b, h, tk, d], -1.0, 1.0);
            let v = uniform(&mut rng, &[b, h, tk, d], -1.0, 1.0);
            let scale = 1.0 / (d as f32).sqrt();
            for causal in [false, true] {
                check(
                    g,
                    &format!("flash attention d {d} tq {tq} tk {tk} causal {causal}"),
                    &[DType::BF16, DType::F16],
                    &[var(q.clone()), var(k.clone()), var(v.clone())],
                    Some(3e-2),
                    move |t| fused::attention(&t[0], &t[1], &t[2], causal, scale),
                );
            }
        }
        // Strided views: [b, t, 3, h, d] packed qkv, each operand [b, h, t, d] with row stride
        // 3·h·d, read in place by the kernels.
        let (b, h, t) = (2usize, 2usize, 50usize);
        let qkv = uniform(&mut rng, &[b, t, 3 * h * d], -1.0, 1.0);
        check(
            g,
            &format!("flash attention d {d} packed qkv views"),
            &[DType::BF16, DType::F16],
            &[var(qkv)],
            Some(3e-2),
            move |x| {
                let p = x[0].reshape(&[b, t, 3, h, d])?;
                let part = |i: usize| -> Result<Tensor> {
                    p.narrow(2, i, 1)?.squeeze(2)?.permute(&[0, 2, 1, 3])
                };
                fused::attention(&part(0)?, &part(1)?, &part(2)?, true, 0.125)
            },
        );
    }
}

/// Linear + bias + GELU: one cuBLASLt GEMM with the GELU_AUX_BIAS epilogue at f16/bf16 when
/// the width is a multiple of 8 (out = 64), the composite otherwise (out = 12, and f32); values
/// and the gradients of x, W and b against the CPU op.
#[test]
fn linear_bias_gelu_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(37);
    for out in [64usize, 12] {
        let x = uniform(&mut rng, &[3, 10, 40], -1.0, 1.0);
        let w = uniform(&mut rng, &[out, 40], -0.3, 0.3);
        let b = uniform(&mut rng, &[out], -0.5, 0.5);
        for (dtypes, t) in [
            (&[DType::F32][..], 1e-3),
            (&[DType::BF16, DType::F16][..], 3e-2),
        ] {
            check(
                g,
                &format!("linear_bias_gelu out {out}"),
                dtypes,
                &[var(x.clone()), var(w.clone()), var(b.clone())],
                Some(t),
                |t| fused::linear_bias_gelu(&t[0], &t[1], &t[2]),
            );
        }
    }
}

/// The residual + LayerNorm kernel at a Transformer width (vectorised rows, several warps per
/// row) and a ragged one, in every float dtype, gradients to all four inputs.
#[test]
fn residual_layer_norm_kernel_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(31);
    for (rows, n) in [(64usize, 768usize), (33, 100)] {
        let x = uniform(&mut rng, &[rows, n], -2.0, 2.0);
        let r = uniform(&mut rng, &[rows, n], -2.0, 2.0);
        let ga = uniform(&mut rng, &[n], 0.5, 1.5);
        let be = uniform(&mut rng, &[n], -1.0, 1.0);
        for (dtypes, t) in [
            (&[DType::F32][..], 1e-4),
            (&[DType::BF16, DType::F16][..], 3e-2),
        ] {
            check(
                g,
                &format!("residual_layer_norm {rows}x{n}"),
                dtypes,
                &[
                    var(x.clone()),
                    var(r.clone()),
                    var(ga.clone()),
                    var(be.clone()),
                ],
                Some(t),
                |t| {
                    let (s, y) = fused::residual_layer_norm(&t[0], &t[1], &t[2], &t[3], 1e-5)?;
                    // Weight the two outputs differently so both gradient paths count.
                    s.mul_scalar(0.5)?.add(&y)
                },
            );
        }
    }
}

// ---- composite graphs --------------------------------------------------------------------------------

/// Gradients of every parameter after one step of `f`, on `dev`.
fn param_grads(
    dev: Device,
    params: &[Tensor],
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> (f64, Vec<Vec<f64>>) {
    let ps: Vec<Tensor> = params
        .iter()
        .map(|p| p.to_device(dev).unwrap().to_var().unwrap())
        .collect();
    let loss = f(&ps).unwrap();
    loss.backward().unwrap();
    (
        loss.to_scalar_f32().unwrap() as f64,
        ps.iter()
            .map(|p| p.grad().unwrap().to_vec_f64().unwrap())
            .collect(),
    )
}

fn compare_steps(
    g: Device,
    name: &str,
    params: &[Tensor],
    tol: f64,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let (lc, gc) = param_grads(CPU, params, &f);
    let (lg, gg) = param_grads(g, params, &f);
    assert_close(&format!("{name}: loss"), &[lg], &[lc], tol);
    for (i, (a, b)) in gg.iter().zip(&gc).enumerate() {
        assert_close(&format!("{name}: gradient of parameter {i}"), a, b, tol);
    }
}

#[test]
fn cnn_training_step_matches_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(18);
    let x = uniform(&mut rng, &[4, 3, 8, 8], -1.0, 1.0);
    let labels = ids(&[1, 0, 9, 4], &[4]);
    let params = [
        uniform(&mut rng, &[8, 3, 3, 3], -0.3, 0.3),
        uniform(&mut rng, &[8, 1, 1], -0.1, 0.1),
        uniform(&mut rng, &[8 * 4 * 4, 10], -0.1, 0.1),
        uniform(&mut rng, &[10], -0.1, 0.1),
    ];
    let step = move |p: &[Tensor]| -> Result<Tensor> {
        let dev = p[0].device();
        let h = x
            .to_device(dev)?
            .conv2d(
                &p[0],
                Conv2dParams {
                    stride: 1,
                    padding: 1,
                    dilation: 1,
                    groups: 1,
                },
            )?
            .add(&p[1])?
            .relu()?;
        let h = h
            .max_pool2d(Pool2dParams {
                kernel: 2,
                stride: 2,
                padding: 0,
            })?
            .flatten_from(1)?;
        h.matmul(&p[2])?
            .add(&p[3])?
            .cross_entropy(&labels.to_device(dev)?, -100)
    };
    compare_steps(g, "CNN step", &params, 1e-4, &step);
    // One AdamW step on both keeps them together.
    let train = |dev: Device| {
        let ps: Vec<Tensor> = params
            .iter()
            .map(|p| fresh(p, dev).to_var().unwrap())
            .collect();
        let state: Vec<(Tensor, Tensor)> = ps
            .iter()
            .map(|p| (p.zeros_like().unwrap(), p.zeros_like().unwrap()))
            .collect();
        for s in 1..=3 {
            for p in &ps {
                p.zero_grad();
            }
            step(&ps).unwrap().backward().unwrap();
            for (p, (m, v)) in ps.iter().zip(&state) {
                // A large eps keeps the update smooth in the gradient (near-zero gradients
                // would otherwise turn rounding noise into full-size steps).
                p.adamw_step(
                    &p.grad().unwrap(),
                    m,
                    v,
                    AdamWParams {
                        lr: 1e-3,
                        beta1: 0.9,
                        beta2: 0.999,
                        eps: 1e-3,
                        weight_decay: 0.01,
                        step: s,
                    },
                )
                .unwrap();
            }
        }
        ps.iter()
            .map(|p| p.to_vec_f64().unwrap())
            .collect::<Vec<_>>()
    };
    for (i, (a, b)) in train(g).iter().zip(&train(CPU)).enumerate() {
        assert_close(
            &format!("CNN after 3 AdamW steps: parameter {i}"),
            a,
            b,
            1e-4,
        );
    }
}

#[test]
fn attention_block_gradients_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(19);
    let (b, t, c, h) = (2, 6, 16, 4);
    let x = uniform(&mut rng, &[b, t, c], -1.0, 1.0);
    let params = [
        uniform(&mut rng, &[c], 0.8, 1.2),
        uniform(&mut rng, &[c], -0.1, 0.1),
        uniform(&mut rng, &[3 * c, c], -0.3, 0.3),
        uniform(&mut rng, &[3 * c], -0.1, 0.1),
        uniform(&mut rng, &[c, c], -0.3, 0.3),
        uniform(&mut rng, &[4 * c, c], -0.3, 0.3),
        uniform(&mut rng, &[c, 4 * c], -0.3, 0.3),
    ];
    let block = move |p: &[Tensor], fused_attention: bool| -> Result<Tensor> {
        let dev = p[0].device();
        let x = x.to_device(dev)?;
        let n = x.layer_norm(&p[0], &p[1], 1e-5)?;
        let qkv = n.matmul(&p[2].t()?)?.add(&p[3])?;
        let heads = |i: usize| {
            qkv.narrow(-1, i * c, c)?
                .reshape(&[b, t, h, c / h])?
                .permute(&[0, 2, 1, 3])
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scale = 1.0 / ((c / h) as f32).sqrt();
        let a = if fused_attention {
            fused::attention(&q, &k, &v, true, scale)?
        } else {
            let mask: Vec<f32> = (0..t * t)
                .map(|i| ((i % t) > (i / t)) as u8 as f32)
                .collect();
            let mask = Tensor::from_vec(mask, &[t, t], dev)?;
            q.matmul(&k.t()?)?
                .mul_scalar(scale)?
                .masked_fill(&mask, f32::NEG_INFINITY)?
                .softmax(-1)?
                .matmul(&v)?
        };
        let a = a.permute(&[0, 2, 1, 3])?.reshape(&[b, t, c])?;
        let x = x.add(&a.matmul(&p[4].t()?)?)?;
        let m = x.matmul(&p[5].t()?)?.gelu()?.matmul(&p[6].t()?)?;
        x.add(&m)?.sqr()?.mean_all()
    };
    compare_steps(g, "attention block", &params, 1e-4, |p| block(p, false));
    compare_steps(g, "attention block (fused attention)", &params, 1e-4, |p| {
        block(p, true)
    });
}

// ---- without CUDA: errors, not panics (these run everywhere) ----------------------------------------------

fn assert_unavailable<T: std::fmt::Debug>(what: &str, r: Result<T>) {
    match r {
        Err(Error::DeviceUnavailable(d, why)) => {
            assert!(d.is_cuda(), "{what}: {d}");
            assert!(!why.trim().is_empty(), "{what}: the error says why");
        }
        other => panic!("{what}: expected DeviceUnavailable, got {other:?}"),
    }
}

#[test]
fn cuda_requests_without_a_device_are_errors() {
    let d = Device::Cuda(0);
    if cuda::is_available() {
        // Here the same calls succeed.
        assert!(Tensor::zeros(&[2], DType::F32, d).is_ok());
        assert!(Tensor::from_vec(vec![1f32, 2.], &[2], d).is_ok());
        assert!(Tensor::zeros(&[2], DType::F32, CPU)
            .unwrap()
            .to_device(d)
            .is_ok());
    } else {
        assert_unavailable("zeros", Tensor::zeros(&[2, 3], DType::F32, d));
        assert_unavailable("ones", Tensor::ones(&[2], DType::BF16, d));
        assert_unavailable("full", Tensor::full(1.0, &[2], DType::I64, d));
        assert_unavailable("from_vec", Tensor::from_vec(vec![1f32, 2.0], &[2], d));
        assert_unavailable("from_slice", Tensor::from_slice(&[1i64, 2], &[2], d));
        assert_unavailable("arange", Tensor::arange(0.0, 4.0, 1.0, DType::F32, d));
        assert_unavailable(
            "rand_uniform",
            Tensor::rand_uniform(&[3], 0.0, 1.0, &mut Rng::new(0), DType::F32, d),
        );
        assert_unavailable(
            "randn",
            Tensor::randn(&[3], 0.0, 1.0, &mut Rng::new(0), DType::F32, d),
        );
        let x = Tensor::from_vec(vec![1f32, 2.0, 3.0], &[3], CPU).unwrap();
        assert_unavailable("to_device", x.to_device(d));
        assert_unavailable("to_device of a variable", x.to_var().unwrap().to_device(d));
        assert_unavailable("memory_stats", cuda::memory_stats(0));
        match Tensor::zeros(&[1], DType::F32, d) {
            Err(e) => assert!(
                e.to_string().contains("cuda:0") || e.to_string().contains("Cuda(0)"),
                "{e}"
            ),
            Ok(_) => unreachable!(),
        }
        assert_eq!(cuda::device_count(), 0);
    }
    // A device that does not exist is an error everywhere.
    assert_unavailable("cuda:99", Tensor::zeros(&[1], DType::F32, Device::Cuda(99)));
    // CPU tensors are untouched by all of this.
    let x = Tensor::from_vec(vec![1f32, 2.0], &[2], CPU).unwrap();
    assert_eq!(
        x.to_device(CPU).unwrap().to_vec_f32().unwrap(),
        vec![1.0, 2.0]
    );
}

#[test]
fn report_explains_what_is_missing() {
    let r = cuda::report();
    assert!(r.contains("libcuda") || r.contains("driver"), "{r}");
}

// ---- i64 on the device, device-side index checks, cuDNN ---------------------------------------

/// Serialises the tests that flip process-wide settings (TF32, the conv backend), so the
/// tests running beside them see the defaults.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn integer_ops_run_on_the_device_and_match_cpu() {
    let g = need_gpu!();
    // Negative values, zero divisors and equal pairs; b broadcasts over a's rows.
    let a = ids(&[7, -7, 0, 5, i64::MAX, -3, 12, 1, -9, 4, 4, 6], &[3, 4]);
    let b = ids(&[2, -2, 0, 4], &[4]);
    let ops: [(&str, BinaryOp); 12] = [
        ("add", BinaryOp::Add),
        ("sub", BinaryOp::Sub),
        ("mul", BinaryOp::Mul),
        ("div", BinaryOp::Div),
        ("maximum", BinaryOp::Maximum),
        ("minimum", BinaryOp::Minimum),
        ("eq", BinaryOp::Eq),
        ("ne", BinaryOp::Ne),
        ("lt", BinaryOp::Lt),
        ("le", BinaryOp::Le),
        ("gt", BinaryOp::Gt),
        ("ge", BinaryOp::Ge),
    ];
    for (name, op) in ops {
        check(
            g,
            &format!("i64 {name}"),
            &[DType::F32],
            &[fixed(a.clone()), fixed(b.clone())],
            Some(0.0),
            move |t| t[0].binary(&t[1], op),
        );
        // A transposed (strided) left operand.
        check(
            g,
            &format!("i64 {name} of a transpose"),
            &[DType::F32],
            &[fixed(a.clone()), fixed(ids(&[1, 0, -1], &[3, 1]))],
            Some(0.0),
            move |t| t[0].t()?.binary(&t[1].t()?, op),
        );
    }
    // where with an i64 result and float or i64 conditions (0.5 counts as true, like the CPU).
    let cond_f = Tensor::from_vec(vec![0.5f32, 0.0, -1.0, 0.0], &[4], CPU).unwrap();
    let cond_i = ids(&[0, 3, 0, -1], &[4]);
    for (name, cond) in [("float", cond_f), ("i64", cond_i)] {
        check(
            g,
            &format!("i64 where ({name} condition)"),
            &FLOATS,
            &[fixed(cond), fixed(a.clone()), fixed(b.clone())],
            Some(0.0),
            |t| Tensor::where_cond(&t[0], &t[1], &t[2]),
        );
    }
    // Reductions along each dim, kept and not.
    for dim in [0isize, 1] {
        for keep in [false, true] {
            let what = format!("dim {dim} keep {keep}");
            check(
                g,
                &format!("i64 sum {what}"),
                &[DType::F32],
                &[fixed(a.clone())],
                Some(0.0),
                move |t| t[0].sum(&[dim], keep),
            );
            check(
                g,
                &format!("i64 max {what}"),
                &[DType::F32],
                &[fixed(a.clone())],
                Some(0.0),
                move |t| t[0].max(dim, keep),
            );
            check(
                g,
                &format!("i64 min {what}"),
                &[DType::F32],
                &[fixed(a.clone())],
                Some(0.0),
                move |t| t[0].min(dim, keep),
            );
        }
    }
    // argmax with ties: the first maximum (values small enough to be exact in f32 on the CPU).
    let tied = ids(&[3, 9, 9, 1, 4, 4, 2, 4], &[2, 4]);
    for dim in [0isize, 1] {
        check(
            g,
            &format!("i64 argmax {dim}"),
            &[DType::F32],
            &[fixed(tied.clone())],
            Some(0.0),
            move |t| t[0].argmax(dim, false),
        );
    }
    // Casts both ways.
    check(
        g,
        "i64 -> float",
        &FLOATS,
        &[fixed(tied.clone())],
        None,
        |t| t[0].to_dtype(DType::F32),
    );
    let fl = Tensor::from_vec(vec![1.9f32, -1.9, 0.4, 7.0], &[4], CPU).unwrap();
    check(
        g,
        "float -> i64 (truncates)",
        &FLOATS,
        &[fixed(fl)],
        Some(0.0),
        |t| t[0].to_dtype(DType::I64),
    );
    // Creation straight on the device.
    for v in [0.0, 1.0, -5.0, 123456789.0] {
        let t = Tensor::full(v, &[2, 3], DType::I64, g).unwrap();
        assert_eq!(t.device(), g);
        assert_eq!(t.to_vec_i64().unwrap(), vec![v as i64; 6], "full({v})");
    }
    for (start, end, step) in [(0.0, 10.0, 1.0), (-3.0, 4.0, 2.5), (5.0, -2.0, -0.75)] {
        for dtype in [DType::I64, DType::F32, DType::BF16, DType::F16] {
            let want = Tensor::arange(start, end, step, dtype, CPU).unwrap();
            let got = Tensor::arange(start, end, step, dtype, g).unwrap();
            assert_eq!(
                (got.dtype(), got.device(), got.shape()),
                (dtype, g, want.shape())
            );
            assert_eq!(
                got.to_vec_f64().unwrap(),
                want.to_vec_f64().unwrap(),
                "arange({start}, {end}, {step}) {dtype}"
            );
        }
    }
    // An i64 gather with ids already on the device, and masks built from comparisons.
    let table = ids(&(0..30).collect::<Vec<i64>>(), &[10, 3]);
    check(
        g,
        "i64 embedding with device ids",
        &[DType::F32],
        &[fixed(table), fixed(ids(&[9, 0, 4, 4], &[2, 2]))],
        Some(0.0),
        |t| t[0].embedding(&t[1]),
    );
    check(
        g,
        "mask from an i64 comparison",
        &[DType::F32],
        &[fixed(a.clone())],
        Some(0.0),
        |t| t[0].gt(&Tensor::zeros(&[1], DType::I64, t[0].device())?),
    );
}

#[test]
fn index_ops_with_device_ids_match_cpu() {
    let g = need_gpu!();
    let mut rng = Rng::new(41);
    let x = uniform(&mut rng, &[3, 5, 4], -1.0, 1.0);
    // `check` moves the ids to the device, so these take the device-id path.
    for (dim, i) in [
        (0isize, ids(&[2, 0, 2], &[3])),
        (1, ids(&[4, 0, 4, 2], &[4])),
        (2, ids(&[3, 3, 1], &[3])),
    ] {
        let mut src_shape = x.shape().to_vec();
        src_shape[dim as usize] = i.numel();
        let src = uniform(&mut rng, &src_shape, -1.0, 1.0);
        check(
            g,
            &format!("index_add {dim} (device ids)"),
            &FLOATS,
            &[var(x.clone()), fixed(i.clone()), var(src)],
            None,
            move |t| t[0].index_add(dim, &t[1], &t[2]),
        );
        check(
            g,
            &format!("index_select {dim} (device ids)"),
            &FLOATS,
            &[var(x.clone()), fixed(i)],
            None,
            move |t| t[0].index_select(dim, &t[1]),
        );
    }
}

#[test]
fn bad_device_indices_are_reported_with_value_and_position() {
    let g = need_gpu!();
    let mut rng = Rng::new(42);
    let logits = uniform(&mut rng, &[6, 10], -3.0, 3.0).to_device(g).unwrap();
    // Targets already on the device: the op itself does not wait for the device ...
    let bad = ids(&[3, 1, 0, 10, 9, 12], &[6]).to_device(g).unwrap();
    let loss = logits.cross_entropy(&bad, -100).unwrap();
    // ... the first read does, and names the first bad target instead of returning NaN.
    let e = loss.to_scalar_f32().unwrap_err().to_string();
    assert!(e.contains("cross_entropy: target 10 at position 3"), "{e}");
    // Reported once: the next reads work again.
    let good = ids(&[3, -100, 0, 9, 9, 1], &[6]).to_device(g).unwrap();
    let l = logits
        .cross_entropy(&good, -100)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    assert!(l.is_finite());
    // A negative target that is not the ignore index, reported through synchronize.
    let neg = ids(&[3, -1, 0, 1, 2, -7], &[6]).to_device(g).unwrap();
    let _ = logits.cross_entropy(&neg, -100).unwrap();
    let e = cuda::synchronize(0).unwrap_err().to_string();
    assert!(e.contains("target -1 at position 1"), "{e}");
    cuda::synchronize(0).unwrap();
    // index_select / embedding ids on the device: the gather stays in bounds, the read errs.
    let table = uniform(&mut rng, &[20, 8], -1.0, 1.0).to_device(g).unwrap();
    let bad_ids = ids(&[3, 19, 25, 0], &[4]).to_device(g).unwrap();
    let rows = table.index_select(0, &bad_ids).unwrap();
    let e = rows.to_vec_f32().unwrap_err().to_string();
    assert!(e.contains("index_select: index 25 at position 2"), "{e}");
    let e = table
        .embedding(&ids(&[1, -2], &[1, 2]).to_device(g).unwrap())
        .unwrap()
        .to_vec_f32()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index -2 at position 1"), "{e}");
    let src = Tensor::ones(&[2, 8], DType::F32, g).unwrap();
    let e = table
        .index_add(0, &ids(&[0, 20], &[2]).to_device(g).unwrap(), &src)
        .unwrap()
        .to_vec_f32()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index_add: index 20 at position 1"), "{e}");
    assert_eq!(table.to_vec_f32().unwrap().len(), 160);
}

#[test]
fn bad_targets_are_errors_on_the_cpu() {
    let mut rng = Rng::new(43);
    let logits = uniform(&mut rng, &[6, 10], -3.0, 3.0);
    for (t, want) in [
        (vec![3, 1, 0, 10, 9, 2], "target 10 at position 3"),
        (vec![3, -1, 0, 1, 9, 2], "target -1 at position 1"),
    ] {
        let e = logits
            .cross_entropy(&ids(&t, &[6]), -100)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e}");
        assert!(e.contains("0..10"), "{e}");
    }
    // The ignore index is not an error, and the ignored row counts for nothing.
    let l = logits
        .cross_entropy(&ids(&[3, -100, 0, 1, 9, 2], &[6]), -100)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    assert!(l.is_finite() && l > 0.0);
    // Host ids out of range are immediate errors too.
    let e = logits
        .index_select(0, &ids(&[0, 6], &[2]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("index 6 at position 1"), "{e}");
}

fn conv_cases() -> Vec<(Vec<usize>, Vec<usize>, Conv2dParams)> {
    let p = |stride, padding, dilation, groups| Conv2dParams {
        stride,
        padding,
        dilation,
        groups,
    };
    vec![
        (vec![2, 3, 8, 8], vec![4, 3, 3, 3], p(1, 1, 1, 1)),
        (vec![3, 4, 9, 7], vec![6, 2, 3, 2], p(2, 1, 1, 2)),
        (vec![2, 2, 11, 11], vec![3, 2, 3, 3], p(1, 2, 2, 1)),
        (vec![2, 4, 6, 6], vec![4, 1, 3, 3], p(1, 1, 1, 4)),
        (vec![4, 8, 5, 5], vec![16, 8, 1, 1], p(1, 0, 1, 1)),
        (vec![2, 16, 12, 12], vec![32, 16, 3, 3], p(2, 1, 1, 1)),
    ]
}

/// The GPU, when cuDNN loads there (else prints why the test is skipped).
fn cudnn_gpu() -> Option<Device> {
    let g = gpu()?;
    if cuda::cudnn_available() {
        Some(g)
    } else {
        println!("skipped: cuDNN not loadable here");
        None
    }
}

#[test]
fn cudnn_conv_matches_cpu() {
    let Some(g) = cudnn_gpu() else { return };
    let _s = serial();
    cuda::set_conv_backend(cuda::ConvBackend::Auto);
    let mut rng = Rng::new(44);
    for (xs, ws, p) in conv_cases() {
        let x = uniform(&mut rng, &xs, -1.0, 1.0);
        let w = uniform(&mut rng, &ws, -0.5, 0.5);
        let before = cuda::cudnn_conv_passes();
        check(
            g,
            &format!("cudnn conv2d {xs:?} {ws:?} {p:?}"),
            &FLOATS,
            &[var(x), var(w)],
            Some(2e-5),
            move |t| t[0].conv2d(&t[1], p),
        );
        // Forward, backward-data and backward-filter ran in cuDNN for each of the 3 dtypes.
        let ran = cuda::cudnn_conv_passes() - before;
        assert!(
            ran >= 9,
            "{xs:?} {ws:?}: cuDNN ran {ran} passes, expected 9"
        );
    }
}

#[test]
fn cudnn_conv_matches_im2col() {
    let Some(g) = cudnn_gpu() else { return };
    let _s = serial();
    let mut rng = Rng::new(45);
    for (xs, ws, p) in conv_cases() {
        let x = uniform(&mut rng, &xs, -1.0, 1.0);
        let w = uniform(&mut rng, &ws, -0.5, 0.5);
        for dtype in FLOATS {
            let mut runs = Vec::new();
            for backend in [cuda::ConvBackend::Im2col, cuda::ConvBackend::Auto] {
                cuda::set_conv_backend(backend);
                let before = cuda::cudnn_conv_passes();
                runs.push(eval(g, dtype, &[var(x.clone()), var(w.clone())], &|t| {
                    t[0].conv2d(&t[1], p)
                }));
                let ran = cuda::cudnn_conv_passes() - before;
                match backend {
                    cuda::ConvBackend::Im2col => {
                        assert_eq!(ran, 0, "SINTER_CONV=im2col must not use cuDNN")
                    }
                    cuda::ConvBackend::Auto => assert_eq!(ran, 3, "cuDNN runs all three passes"),
                }
            }
            cuda::set_conv_backend(cuda::ConvBackend::Auto);
            let (im, dnn) = (&runs[0], &runs[1]);
            let what = format!("cudnn vs im2col {xs:?} {ws:?} {p:?} [{dtype}]");
            let t = if dtype == DType::F32 {
                2e-5
            } else {
                tol(dtype)
            };
            assert_close(&format!("{what} output"), &dnn.out, &im.out, t);
            for (i, (a, b)) in dnn.grads.iter().zip(&im.grads).enumerate() {
                assert_close(
                    &format!("{what} gradient {i}"),
                    a.as_ref().unwrap(),
                    b.as_ref().unwrap(),
                    t,
                );
            }
        }
    }
}
