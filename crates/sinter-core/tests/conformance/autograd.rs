//! Autograd semantics: no_grad, detach, accumulation, shared uses, and backward hooks.

use super::common::*;
use sinter_core::{is_grad_enabled, no_grad, DType, Rng, Tensor, TensorId};

fn var(data: &[f64], shape: &[usize]) -> Tensor {
    tensor(data, shape).to_var().unwrap()
}

#[test]
fn no_grad_records_nothing() {
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

#[test]
fn detach_stops_gradients() {
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

#[test]
fn gradients_accumulate_across_backward_calls() {
    let mut rng = Rng::new(1);
    let x = uniform(&mut rng, &[3, 4], -1.0, 1.0).to_var().unwrap();
    let w = uniform(&mut rng, &[3, 4], -1.0, 1.0);
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

#[test]
fn a_tensor_used_twice_gets_both_contributions() {
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

#[test]
fn max_splits_gradient_among_ties() {
    let x = var(&[1.0, 3.0, 3.0, 0.0, 2.0, -1.0], &[2, 3]);
    x.max(1, false)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    assert_eq!(vals(&x.grad().unwrap()), vec![0.0, 0.5, 0.5, 0.0, 1.0, 0.0]);
}

#[test]
fn hook_runs_once_per_variable_with_the_final_gradient() {
    let mut rng = Rng::new(2);
    let x = uniform(&mut rng, &[4, 3], -1.0, 1.0);
    let ws: Vec<Tensor> = (0..4)
        .map(|_| uniform(&mut rng, &[3, 3], -1.0, 1.0).to_var().unwrap())
        .collect();
    let bs: Vec<Tensor> = (0..4)
        .map(|_| uniform(&mut rng, &[3], -0.5, 0.5).to_var().unwrap())
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

#[test]
fn hook_sees_accumulated_gradient_and_chain_order() {
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

#[test]
fn grads_keep_dtype_and_shape_of_variables() {
    let x = Tensor::ones(&[2, 3], DType::F32, CPU)
        .unwrap()
        .to_var()
        .unwrap();
    let b = Tensor::ones(&[3], DType::F32, CPU)
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

#[test]
fn backward_seeded_with_a_given_gradient() {
    let mut rng = Rng::new(4);
    let x = uniform(&mut rng, &[2, 3], -1.0, 1.0).to_var().unwrap();
    let y = x.tanh().unwrap();
    let seed = uniform(&mut rng, &[2, 3], -1.0, 1.0);
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

#[test]
fn custom_op_routes_gradients_through_its_closure() {
    let x = var(&[1.0, -2.0, 0.5], &[3]);
    let value = {
        let _g = no_grad();
        x.mul_scalar(3.0).unwrap()
    };
    let y = sinter_core::custom_op(&value, "triple", &[&x], |g, _| {
        Ok(vec![Some(g.mul_scalar(3.0)?)])
    });
    assert!(y.tracks_grad());
    assert_eq!(vals(&y), vec![3.0, -6.0, 1.5]);
    y.sqr().unwrap().sum_all().unwrap().backward().unwrap();
    // d/dx (3x)^2 = 18x
    assert_eq!(vals(&x.grad().unwrap()), vec![18.0, -36.0, 9.0]);
}

#[test]
fn to_var_makes_a_contiguous_leaf() {
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
