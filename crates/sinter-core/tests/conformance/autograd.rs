//! Autograd semantics on every device: no_grad, detach, accumulation, shared uses, backward
//! hooks, custom ops and leaves.

use crate::harness::*;
use crate::reference::Arr;
use sinter_core::{is_grad_enabled, no_grad, DType, Rng, Tensor, TensorId};

pub fn cases() -> Vec<Case> {
    vec![
        case("no_grad_records_nothing", F32, no_grad_records_nothing),
        case("detach_stops_gradients", F32, detach_stops_gradients),
        case(
            "gradients_accumulate",
            F32,
            gradients_accumulate_across_backward_calls,
        ),
        case(
            "a_tensor_used_twice",
            F32,
            a_tensor_used_twice_gets_both_contributions,
        ),
        case(
            "hook_runs_once_per_variable",
            F32,
            hook_runs_once_per_variable_with_the_final_gradient,
        ),
        case(
            "hook_order_and_accumulation",
            F32,
            hook_sees_accumulated_gradient_and_chain_order,
        ),
        case(
            "grads_keep_dtype_and_shape",
            F32,
            grads_keep_dtype_and_shape_of_variables,
        ),
        case(
            "backward_with_grad",
            F32,
            backward_seeded_with_a_given_gradient,
        ),
        case(
            "with_custom_backward",
            F32,
            custom_backward_routes_gradients_through_its_closure,
        ),
        case("to_var_makes_a_leaf", F32, to_var_makes_a_contiguous_leaf),
        case("small_network", F32, small_network),
    ]
}

thread_local! {
    static DEV: std::cell::Cell<sinter_core::Device> = const { std::cell::Cell::new(sinter_core::Device::Cpu) };
}

fn tensor(data: &[f64], shape: &[usize]) -> Tensor {
    make(&Arr::new(shape, data.to_vec()), DType::F32, DEV.get())
}
fn var(data: &[f64], shape: &[usize]) -> Tensor {
    tensor(data, shape).to_var().unwrap()
}
fn vals(t: &Tensor) -> Vec<f64> {
    arr(t).data
}
fn u(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    make(&uniform(rng, shape, lo, hi), DType::F32, DEV.get())
}
fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, DEV.get()).unwrap()
}
fn assert_close_vec(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_close(
        what,
        got,
        want,
        Tol {
            rel: rtol.max(1e-6),
            rms: atol.max(1e-6),
        },
    );
}

fn no_grad_records_nothing(t: &Target) {
    DEV.set(t.dev);
    let x = var(&[1.0, 2.0, 3.0], &[3]);
    assert!(is_grad_enabled());
    let y = {
        let _g = no_grad();
        assert!(!is_grad_enabled());
        {
            let _inner = no_grad();
        }
        assert!(
            !is_grad_enabled(),
            "a nested guard restores the outer state"
        );
        let y = x.mul(&x).unwrap().exp().unwrap().sum_all().unwrap();
        assert!(!y.tracks_grad());
        assert!(!x.reshape(&[3, 1]).unwrap().t().unwrap().tracks_grad());
        y
    };
    assert!(is_grad_enabled(), "dropping the guard re-enables recording");
    let e = err_msg(y.backward());
    assert!(
        e.contains("backward") && e.contains("no_grad"),
        "unclear error: {e}"
    );
    assert!(x.grad().is_none());
    // Outside the guard recording resumes.
    let z = x.mul(&x).unwrap().sum_all().unwrap();
    assert!(z.tracks_grad());
    z.backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![2.0, 4.0, 6.0]);
}

fn detach_stops_gradients(t: &Target) {
    DEV.set(t.dev);
    let x = var(&[1.0, -2.0, 3.0], &[3]);
    let d = x.detach();
    assert!(!d.tracks_grad() && !d.is_variable());
    assert!(d.shares_storage_with(&x), "detach copies nothing");
    // y = detach(x) * x: only the second factor contributes.
    x.detach()
        .mul(&x)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![1.0, -2.0, 3.0]);
    // A fully detached result cannot be differentiated.
    let e = err_msg(x.mul(&x).unwrap().detach().sum_all().unwrap().backward());
    assert!(e.contains("backward"), "{e}");
    // Integer tensors cannot be variables.
    expect_err(ids(&[1, 2], &[2]).to_var(), "to_var");
}

fn gradients_accumulate_across_backward_calls(t: &Target) {
    DEV.set(t.dev);
    let mut rng = Rng::new(1);
    let x = u(&mut rng, &[3, 4], -1.0, 1.0).to_var().unwrap();
    let w = u(&mut rng, &[3, 4], -1.0, 1.0);
    let loss = || x.mul(&w).unwrap().tanh().unwrap().sum_all().unwrap();
    loss().backward().unwrap();
    let g1 = vals(&x.grad().unwrap());
    loss().backward().unwrap();
    let g2 = vals(&x.grad().unwrap());
    assert_close_vec(
        &g2,
        &g1.iter().map(|g| 2.0 * g).collect::<Vec<_>>(),
        1e-6,
        0.0,
        "accumulated gradient",
    );
    // The same graph can be walked twice as well.
    let l = loss();
    x.zero_grad();
    assert!(x.grad().is_none());
    l.backward().unwrap();
    l.backward().unwrap();
    assert_close_vec(
        &vals(&x.grad().unwrap()),
        &g2,
        1e-6,
        0.0,
        "twice through one graph",
    );
}

fn a_tensor_used_twice_gets_both_contributions(t: &Target) {
    DEV.set(t.dev);
    let x = var(&[1.5, -2.0, 0.5], &[3]);
    x.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0, -4.0, 1.0]);
    // Through an intermediate used by two branches: y = e^x; z = y·y + y → dz/dx = (2y + 1)·y.
    let x = var(&[0.3, -0.7], &[2]);
    let y = x.exp().unwrap();
    y.mul(&y)
        .unwrap()
        .add(&y)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let want: Vec<f64> = [0.3f32, -0.7]
        .iter()
        .map(|&v| {
            let y = (v as f64).exp();
            (2.0 * y + 1.0) * y
        })
        .collect();
    assert_close_vec(&vals(&x.grad().unwrap()), &want, 1e-5, 0.0, "diamond");
    // A non-scalar root is seeded with ones.
    let x = var(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    x.mul_scalar(3.0).unwrap().backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![3.0; 4]);
    // A variable as the root.
    let x = var(&[1.0, 2.0], &[2]);
    x.backward().unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![1.0, 1.0]);
}

fn hook_runs_once_per_variable_with_the_final_gradient(t: &Target) {
    DEV.set(t.dev);
    let mut rng = Rng::new(2);
    let x = u(&mut rng, &[4, 3], -1.0, 1.0);
    let ws: Vec<Tensor> = (0..4)
        .map(|_| u(&mut rng, &[3, 3], -1.0, 1.0).to_var().unwrap())
        .collect();
    let bs: Vec<Tensor> = (0..4)
        .map(|_| u(&mut rng, &[3], -0.5, 0.5).to_var().unwrap())
        .collect();
    let forward = || {
        let mut h = x.clone();
        for (w, b) in ws.iter().zip(&bs) {
            h = h.matmul(w).unwrap().add(b).unwrap().tanh().unwrap();
        }
        // The first layer's weight is used once more at the end (a tied weight).
        h.matmul(&ws[0]).unwrap().sum_all().unwrap()
    };
    let mut calls: Vec<(TensorId, Vec<f64>)> = Vec::new();
    forward()
        .backward_with_hook(|v, g| {
            assert!(v.is_variable());
            calls.push((v.id(), vals(g)));
            Ok(())
        })
        .unwrap();
    let all: Vec<&Tensor> = ws.iter().chain(&bs).collect();
    assert_eq!(calls.len(), all.len(), "one call per variable");
    for v in &all {
        let hits: Vec<_> = calls.iter().filter(|(id, _)| *id == v.id()).collect();
        assert_eq!(hits.len(), 1, "exactly one call per variable");
        assert_eq!(
            hits[0].1,
            vals(&v.grad().unwrap()),
            "the hook sees the final gradient"
        );
    }
    // Layers 3, 2, 1 finish in reverse order (layer 0's weight is tied to the head, but its
    // bias finishes last).
    let pos = |t: &Tensor| calls.iter().position(|(id, _)| *id == t.id()).unwrap();
    for l in 1..3 {
        assert!(
            pos(&ws[l + 1]) < pos(&ws[l]),
            "weight of layer {} before layer {l}",
            l + 1
        );
        assert!(
            pos(&bs[l + 1]) < pos(&bs[l]),
            "bias of layer {} before layer {l}",
            l + 1
        );
    }
    assert!(pos(&bs[1]) < pos(&bs[0]) && pos(&ws[1]) < pos(&ws[0]));
    // The tied weight's gradient has both contributions: compare with finite differences.
    let w0 = vals(&ws[0]);
    let g0 = vals(&ws[0].grad().unwrap());
    let _ng = no_grad();
    let f = |delta: f64| {
        let mut v = w0.clone();
        v[4] += delta;
        ws[0].assign(&tensor(&v, &[3, 3])).unwrap();
        forward().to_scalar_f32().unwrap() as f64
    };
    let fd = (f(1e-2) - f(-1e-2)) / 2e-2;
    ws[0].assign(&tensor(&w0, &[3, 3])).unwrap();
    assert!(
        (fd - g0[4]).abs() < 2e-3 + 2e-2 * fd.abs(),
        "tied weight: fd {fd}, analytic {}",
        g0[4]
    );
}

fn hook_sees_accumulated_gradient_and_chain_order(t: &Target) {
    DEV.set(t.dev);
    // A plain chain of scalar layers: y = w3·tanh(w2·tanh(w1·x)).
    let x = tensor(&[0.7], &[1]);
    let w: Vec<Tensor> = [0.9, -1.2, 0.8].iter().map(|&v| var(&[v], &[1])).collect();
    let run = || {
        w.iter()
            .fold(x.clone(), |h, w| h.mul(w).unwrap().tanh().unwrap())
            .sum_all()
            .unwrap()
    };
    let mut order = Vec::new();
    run()
        .backward_with_hook(|v, _| {
            order.push(v.id());
            Ok(())
        })
        .unwrap();
    assert_eq!(
        order,
        vec![w[2].id(), w[1].id(), w[0].id()],
        "reverse layer order"
    );
    let first: Vec<f64> = w.iter().map(|t| vals(&t.grad().unwrap())[0]).collect();
    let mut seen = Vec::new();
    run()
        .backward_with_hook(|v, g| {
            seen.push((v.id(), vals(g)[0]));
            Ok(())
        })
        .unwrap();
    for (i, t) in w.iter().enumerate() {
        let (_, g) = seen.iter().find(|(id, _)| *id == t.id()).unwrap();
        assert!(
            (g - 2.0 * first[i]).abs() < 1e-6,
            "hook gets the accumulated gradient"
        );
    }
    // A hook error stops the pass and is returned.
    let r = run().backward_with_hook(|_, _| Err(sinter_core::Error::Msg("hook failed".into())));
    assert!(err_msg(r).contains("hook failed"));
}

fn grads_keep_dtype_and_shape_of_variables(t: &Target) {
    DEV.set(t.dev);
    let x = Tensor::ones(&[2, 3], DType::F32, t.dev)
        .unwrap()
        .to_var()
        .unwrap();
    let b = Tensor::ones(&[3], DType::F32, t.dev)
        .unwrap()
        .to_var()
        .unwrap();
    x.t()
        .unwrap()
        .mul(&b.unsqueeze(1).unwrap())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gx = x.grad().unwrap();
    let gb = b.grad().unwrap();
    assert_eq!((gx.shape(), gb.shape()), (&[2usize, 3][..], &[3usize][..]));
    assert!(gx.is_contiguous());
    assert_eq!(vals(&gb), vec![2.0; 3]);
    // Intermediate (non-variable) tensors do not keep gradients.
    let y = x.mul_scalar(2.0).unwrap();
    y.sum_all().unwrap().backward().unwrap();
    assert!(y.grad().is_none());
}

fn backward_seeded_with_a_given_gradient(t: &Target) {
    DEV.set(t.dev);
    let mut rng = Rng::new(4);
    let x = u(&mut rng, &[2, 3], -1.0, 1.0).to_var().unwrap();
    let y = x.tanh().unwrap();
    let seed = u(&mut rng, &[2, 3], -1.0, 1.0);
    y.backward_with_grad(&seed, |_, _| Ok(())).unwrap();
    let want: Vec<f64> = vals(&y)
        .iter()
        .zip(vals(&seed))
        .map(|(y, g)| (1.0 - y * y) * g)
        .collect();
    assert_close_vec(
        &vals(&x.grad().unwrap()),
        &want,
        1e-5,
        1e-7,
        "backward_with_grad",
    );
    expect_err(
        y.backward_with_grad(&seed.t().unwrap(), |_, _| Ok(())),
        "backward_with_grad",
    );
}

fn custom_backward_routes_gradients_through_its_closure(t: &Target) {
    DEV.set(t.dev);
    let x = var(&[1.0, -2.0, 0.5], &[3]);
    let value = {
        let _g = no_grad();
        x.mul_scalar(3.0).unwrap()
    };
    let y = sinter_core::with_custom_backward(&value, "triple", &[&x], |g, _| {
        Ok(vec![Some(g.mul_scalar(3.0)?)])
    });
    assert!(y.tracks_grad());
    assert_eq!(vals(&y), vec![3.0, -6.0, 1.5]);
    y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    // d/dx (3x)^2 = 18x
    assert_eq!(vals(&x.grad().unwrap()), vec![18.0, -36.0, 9.0]);
}

fn to_var_makes_a_contiguous_leaf(t: &Target) {
    DEV.set(t.dev);
    let base = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let v = base.to_var().unwrap();
    assert!(v.is_variable() && v.tracks_grad() && v.grad().is_none());
    assert!(
        v.shares_storage_with(&base),
        "a contiguous tensor becomes a variable without a copy"
    );
    let t = base.t().unwrap();
    let vt = t.to_var().unwrap();
    assert!(
        vt.is_contiguous(),
        "variables are contiguous (optimizers update them in place)"
    );
    assert_eq!(vt.shape(), &[3, 2]);
    assert_eq!(vals(&vt), vals(&t));
    // A variable made from another tensor's result is a fresh leaf.
    let y = v.mul_scalar(2.0).unwrap().to_var().unwrap();
    assert!(y.is_variable());
    y.sum_all().unwrap().backward().unwrap();
    assert!(v.grad().is_none(), "gradients stop at the new leaf");
    assert_eq!(vals(&y.grad().unwrap()), vec![1.0; 6]);
}

/// A small network end to end: linear, bias, GELU, linear, cross-entropy; every parameter's
/// gradient against the composed reference.
fn small_network(t: &Target) {
    use crate::reference as r;
    let mut rng = t.rng(1150);
    let x = uniform(&mut rng, &[5, 4], -1.0, 1.0);
    let labels = Arr::ints(&[5], &[0, 2, 1, 2, 0]);
    t.check_with(
        "mlp",
        Opts {
            out: Some(DType::F32),
            ..Opts::default()
        },
        &[
            In::Fixed(x),
            In::Ids(labels),
            In::Var(uniform(&mut rng, &[4, 6], -1.0, 1.0)),
            In::Var(uniform(&mut rng, &[6], -0.5, 0.5)),
            In::Var(uniform(&mut rng, &[3, 6], -1.0, 1.0)),
        ],
        |v| {
            let h = v[0].matmul(&v[2])?.add(&v[3])?.gelu()?;
            h.matmul(&v[4].t()?)?.cross_entropy(&v[1], -100)
        },
        |v, _| {
            let h = r::matmul(&v[0], &v[2]).add(&v[3]).map(r::gelu_tanh);
            r::cross_entropy(&r::matmul(&h, &v[4].t()), &v[1], -100)
        },
    );
}
