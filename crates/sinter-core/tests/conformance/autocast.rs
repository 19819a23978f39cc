//! Autocast (mixed precision: matmul and conv in the low dtype, f32 master gradients) and the
//! float dtype promotion of elementwise ops. The trial's dtype is the autocast dtype.

use crate::harness::*;
use crate::reference::{self as r, Arr, Conv};
use sinter_core::{amp, fused, Conv2dParams, DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("matmul", HALVES, matmul),
        case("conv2d", HALVES, conv2d),
        case("mlp", HALVES, mlp),
        case("mixed_matmul", HALVES, mixed_matmul),
        case("linear", HALVES, linear),
        case("attention", HALVES, attention),
        case("residual_layer_norm", HALVES, residual_layer_norm),
        case("promotion", F32, promotion),
        case("per_thread", HALVES, per_thread).cpu_only(),
    ]
}

/// Under autocast the product runs on operands rounded to the low dtype and rounds its result
/// once; the gradient reaches the f32 weight as f32.
fn matmul(t: &Target) {
    let mut rng = t.rng(90);
    let dt = t.dtype;
    t.check_with(
        "x · w",
        rounds(2.0),
        &[
            In::F32(uniform(&mut rng, &[8, 16], -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &[16, 4], -1.0, 1.0)),
        ],
        |x| {
            let _ac = amp::autocast(dt);
            x[0].matmul(&x[1])
        },
        |x, rd| r::matmul(&rd.r(x[0].clone()), &rd.r(x[1].clone())),
    );
    // Outside the region nothing is cast.
    let a = t.tensor_as(&uniform(&mut rng, &[2, 3], -1.0, 1.0), DType::F32);
    assert_eq!(a.matmul(&a.t().unwrap()).unwrap().dtype(), DType::F32);
}

fn conv2d(t: &Target) {
    let mut rng = t.rng(91);
    let dt = t.dtype;
    let p = Conv2dParams::square(1, 1, 1, 1);
    let rp = Conv::square(1, 1, 1, 1);
    t.check_with(
        "conv2d",
        rounds(2.0),
        &[
            In::F32(uniform(&mut rng, &[2, 3, 6, 6], -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &[4, 3, 3, 3], -0.5, 0.5)),
        ],
        move |x| {
            let _ac = amp::autocast(dt);
            x[0].conv2d(&x[1], p)
        },
        move |x, rd| r::conv2d(&rd.r(x[0].clone()), &rd.r(x[1].clone()), rp),
    );
}

/// A two-layer MLP under autocast: linear, bias, tanh, linear in the low dtype, then an f32
/// loss; every parameter's gradient in f32 (tanh, not relu: a pre-activation within a rounding
/// of zero would flip a relu mask and move a gradient by a whole term).
fn mlp(t: &Target) {
    let mut rng = t.rng(92);
    let dt = t.dtype;
    t.check_with(
        "mlp",
        rounds(4.0),
        &[
            In::F32(uniform(&mut rng, &[16, 32], -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &[32, 24], -0.3, 0.3)),
            In::VarF32(uniform(&mut rng, &[24], -0.5, 0.5)),
            In::VarF32(uniform(&mut rng, &[24, 10], -0.3, 0.3)),
        ],
        |x| {
            let _ac = amp::autocast(dt);
            x[0].matmul(&x[1])?.add(&x[2])?.tanh()?.matmul(&x[3])
        },
        |x, rd| {
            // The bias is f32, so the sum promotes to f32 and tanh runs in f32; the second
            // matmul casts its operands again.
            let h = rd.r(r::matmul(&rd.r(x[0].clone()), &rd.r(x[1].clone())));
            let h = h.add(&x[2]).map(f64::tanh);
            r::matmul(&rd.r(h), &rd.r(x[3].clone()))
        },
    );
}

/// Fails unless `y` came out in `dt`.
fn in_dtype(y: Tensor, dt: DType, what: &str) -> sinter_core::Result<Tensor> {
    if y.dtype() != dt {
        sinter_core::bail!("{what} under autocast({dt}) gave {}", y.dtype());
    }
    Ok(y)
}

/// A Linear runs wholly in the autocast dtype, bias included (PyTorch's rule): the output stays
/// in that dtype and equals the product of rounded operands plus the rounded bias, rounded.
fn linear(t: &Target) {
    let mut rng = t.rng(94);
    let dt = t.dtype;
    t.check_with(
        "linear",
        rounds(4.0),
        &[
            In::F32(uniform(&mut rng, &[6, 16], -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &[8, 16], -0.5, 0.5)),
            In::VarF32(uniform(&mut rng, &[8], -0.5, 0.5)),
        ],
        |x| {
            let _ac = amp::autocast(dt);
            in_dtype(fused::linear(&x[0], &x[1], Some(&x[2]))?, dt, "linear")
        },
        |x, rd| {
            let y = rd.r(r::matmul(&rd.r(x[0].clone()), &rd.r(x[1].t())));
            rd.r(y.add(&rd.r(x[2].clone())))
        },
    );
}

/// Attention casts q, k and v to the autocast dtype (so CUDA's half-precision flash kernel
/// applies to an f32 model's activations) and answers in that dtype.
fn attention(t: &Target) {
    let mut rng = t.rng(95);
    let dt = t.dtype;
    let shape = [1, 2, 9, 64];
    t.check_with(
        "attention",
        rounds(8.0),
        &[
            In::VarF32(uniform(&mut rng, &shape, -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &shape, -1.0, 1.0)),
            In::VarF32(uniform(&mut rng, &shape, -1.0, 1.0)),
        ],
        |x| {
            let _ac = amp::autocast(dt);
            in_dtype(
                fused::attention(&x[0], &x[1], &x[2], true, 0.125)?,
                dt,
                "attention",
            )
        },
        |x, rd| {
            let [q, k, v] = [0, 1, 2].map(|i| rd.r(x[i].clone()));
            rd.r(r::attention(&q, &k, &v, true, 0.125))
        },
    );
}

/// An f32 residual stream plus a half-precision sub-layer output promotes to f32, as
/// `x + residual` does, before the fused LayerNorm.
fn residual_layer_norm(t: &Target) {
    let mut rng = t.rng(96);
    t.check_with(
        "f32 stream + half residual",
        Opts {
            out: Some(DType::F32),
            ..rounds(4.0)
        },
        &[
            In::VarF32(uniform(&mut rng, &[5, 24], -2.0, 2.0)),
            In::Var(uniform(&mut rng, &[5, 24], -2.0, 2.0)),
            In::VarF32(uniform(&mut rng, &[24], 0.5, 1.5)),
            In::VarF32(uniform(&mut rng, &[24], -1.0, 1.0)),
        ],
        |x| {
            let (s, y) = fused::residual_layer_norm(&x[0], &x[1], &x[2], &x[3], 1e-5)?;
            Tensor::cat(&[s.reshape(&[120])?, y.reshape(&[120])?], 0)
        },
        |x, rd| {
            let s = x[0].add(&rd.r(x[1].clone()));
            let y = r::layer_norm(&s, &x[2], &x[3], 1e-5f32 as f64);
            r::cat(&[s.reshape(&[120]), y.reshape(&[120])], 0)
        },
    );
}

/// Mixed float operands: matmul refuses them outside autocast and takes them inside (both to
/// the autocast dtype); integer operands are never cast.
fn mixed_matmul(t: &Target) {
    let mut rng = t.rng(93);
    let a = t.tensor_as(&uniform(&mut rng, &[2, 3], -1.0, 1.0), DType::F32);
    let h = a.to_dtype(DType::F16).unwrap();
    assert!(
        h.matmul(&a.t().unwrap()).is_err(),
        "matmul does not promote outside autocast"
    );
    let i = t.ids(&[1, 2, 3, 4, 5, 6], &[2, 3]);
    let _ac = amp::autocast(t.dtype);
    assert_eq!(h.matmul(&a.t().unwrap()).unwrap().dtype(), t.dtype);
    assert_eq!(
        i.matmul(&i.t().unwrap()).unwrap().dtype(),
        DType::I64,
        "integer operands are not cast"
    );
}

/// Binary ops promote float dtypes to the wider (bf16 with f16 to f32), comparisons too, and
/// each operand's gradient comes back in its own dtype; an i64 operand meets a float as that
/// float (PyTorch's promotion, every float dtype); `where` between floats still errors.
fn promotion(t: &Target) {
    let mut rng = t.rng(94);
    let a = make(&uniform(&mut rng, &[3, 4], -1.0, 1.0), DType::F32, t.dev)
        .to_var()
        .unwrap();
    let b16 = make(
        &r::rounded(&uniform(&mut rng, &[4], -1.0, 1.0), DType::BF16),
        DType::BF16,
        t.dev,
    )
    .to_var()
    .unwrap();
    let h = make(&uniform(&mut rng, &[3, 4], -1.0, 1.0), DType::F16, t.dev);
    let y = a.add(&b16).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(b16.mul(&a).unwrap().dtype(), DType::F32);
    assert_eq!(
        h.sub(&b16).unwrap().dtype(),
        DType::F32,
        "bf16 with f16: neither holds the other"
    );
    assert_eq!(h.add(&h).unwrap().dtype(), DType::F16);
    // A comparison of mixed floats compares the promoted values and gives bools.
    assert_eq!(h.lt(&a).unwrap().dtype(), DType::Bool);
    // The exact f32 sum of the half values.
    let sum = h.add(&h.to_dtype(DType::F32).unwrap()).unwrap();
    assert_eq!(arr(&sum), arr(&h).map(|x| 2.0 * x));
    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().dtype(), DType::F32);
    let gb = b16.grad().unwrap();
    assert_eq!(
        (gb.dtype(), gb.shape(), gb.device()),
        (DType::BF16, &[4usize][..], t.dev)
    );
    // d Σ (a + b)² / db_j = Σ_i 2 (a_ij + b_j), rounded once to bf16.
    let (av, bv) = (arr(&a), arr(&b16));
    let want = Arr::from_fn(&[4], |j| {
        (0..3)
            .map(|i| 2.0 * (av.get(&[i, j[0]]) + bv.data[j[0]]))
            .sum()
    });
    assert_close(
        "promoted gradient",
        &arr(&gb).data,
        &want.data,
        tol(DType::BF16, 2.0),
    );
    let i = t.ids(&[1, -2, 3, 4, 5, 6, 7, 8], &[2, 4]);
    let a2 = a.detach().narrow(0, 0, 2).unwrap();
    let iv = arr(&i);
    for d in [DType::F32, DType::BF16, DType::F16] {
        let x = a2.to_dtype(d).unwrap();
        for (name, y, want) in [
            (
                "i64 + float",
                i.add(&x).unwrap(),
                iv.zip(&arr(&x), |p, q| p + q),
            ),
            (
                "float * i64",
                x.mul(&i).unwrap(),
                arr(&x).zip(&iv, |p, q| p * q),
            ),
        ] {
            assert_eq!(y.dtype(), d, "{name} in {d}");
            let want = r::rounded(&want, d);
            assert_close(name, &arr(&y).data, &want.data, tol(d, 1.0));
        }
        let y = i.lt(&x).unwrap();
        assert_eq!(y.dtype(), DType::Bool, "i64 < {d}");
        let want = iv.zip(&arr(&x), |p, q| (p < q) as u8 as f64);
        assert_close(
            "i64 < float",
            &arr(&y).data,
            &want.data,
            tol(DType::I64, 1.0),
        );
    }
    // where promotes its value operands (f16 with f32 is f32), as torch.where does.
    let c = a2.gt(&a2.zeros_like().unwrap()).unwrap();
    let y = Tensor::where_cond(&c, &a2.to_dtype(DType::F16).unwrap(), &a2).unwrap();
    assert_eq!(y.dtype(), DType::F32);
}

fn per_thread(t: &Target) {
    let _ac = amp::autocast(t.dtype);
    let other = std::thread::spawn(amp::autocast_dtype).join().unwrap();
    assert_eq!(other, None);
    assert_eq!(amp::autocast_dtype(), Some(t.dtype));
}
