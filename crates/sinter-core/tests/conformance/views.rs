//! View ops (reshape, transpose, permute, narrow, squeeze/unsqueeze, broadcast, flatten):
//! values, storage sharing, contiguous copies, and gradients flowing back through them.

use crate::harness::*;
use crate::reference::Arr;
use sinter_core::{DType, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("values_and_sharing", ALL, values_and_sharing),
        case("gradients", FLOATS, gradients),
    ]
}

fn values_and_sharing(t: &Target) {
    let base = Tensor::arange(0.0, 24.0, 1.0, t.dtype, t.dev)
        .unwrap()
        .reshape(&[2, 3, 4])
        .unwrap();
    assert_eq!((base.device(), base.dtype()), (t.dev, t.dtype));
    let at = |i: usize, j: usize, k: usize| (i * 12 + j * 4 + k) as f64;
    let check = |v: &Tensor, want: Arr, what: &str, shares: bool| {
        assert_eq!(arr(v), want, "{what}");
        assert_eq!(
            v.shares_storage_with(&base),
            shares,
            "{what}: shares storage"
        );
    };
    let seq = |shape: &[usize], from: usize| {
        Arr::new(
            shape,
            (from..from + shape.iter().product::<usize>())
                .map(|v| v as f64)
                .collect(),
        )
    };
    check(
        &base,
        Arr::from_fn(&[2, 3, 4], |i| at(i[0], i[1], i[2])),
        "arange+reshape",
        true,
    );
    check(
        &base.reshape(&[4, 6]).unwrap(),
        seq(&[4, 6], 0),
        "reshape",
        true,
    );
    check(
        &base.reshape(&[6, usize::MAX]).unwrap(),
        seq(&[6, 4], 0),
        "reshape infer",
        true,
    );
    check(
        &base.flatten_from(1).unwrap(),
        seq(&[2, 12], 0),
        "flatten_from",
        true,
    );
    let tr = base.transpose(0, 2).unwrap();
    assert!(!tr.is_contiguous());
    check(
        &tr,
        Arr::from_fn(&[4, 3, 2], |i| at(i[2], i[1], i[0])),
        "transpose(0,2)",
        true,
    );
    check(
        &base.t().unwrap(),
        Arr::from_fn(&[2, 4, 3], |i| at(i[0], i[2], i[1])),
        "t()",
        true,
    );
    check(
        &base.transpose(-1, 0).unwrap(),
        Arr::from_fn(&[4, 3, 2], |i| at(i[2], i[1], i[0])),
        "transpose(-1,0)",
        true,
    );
    let pm = base.permute(&[1, 2, 0]).unwrap();
    check(
        &pm,
        Arr::from_fn(&[3, 4, 2], |i| at(i[2], i[0], i[1])),
        "permute",
        true,
    );
    let nr = base.narrow(2, 1, 2).unwrap();
    check(
        &nr,
        Arr::from_fn(&[2, 3, 2], |i| at(i[0], i[1], i[2] + 1)),
        "narrow",
        true,
    );
    check(
        &base.narrow(-2, 1, 2).unwrap(),
        Arr::from_fn(&[2, 2, 4], |i| at(i[0], i[1] + 1, i[2])),
        "narrow(-2)",
        true,
    );
    let nt = tr.narrow(0, 1, 2).unwrap().narrow(1, 2, 1).unwrap();
    check(
        &nt,
        Arr::from_fn(&[2, 1, 2], |i| at(i[2], i[1] + 2, i[0] + 1)),
        "narrow of transpose",
        true,
    );
    let pn = nr.permute(&[2, 0, 1]).unwrap();
    check(
        &pn,
        Arr::from_fn(&[2, 2, 3], |i| at(i[1], i[2], i[0] + 1)),
        "permute of narrow",
        true,
    );
    let col = base
        .narrow(2, 3, 1)
        .unwrap()
        .narrow(0, 0, 1)
        .unwrap()
        .squeeze(0)
        .unwrap();
    check(
        &col,
        Arr::from_fn(&[3, 1], |i| at(0, i[0], 3)),
        "squeeze",
        true,
    );
    let bc = col.broadcast_as(&[2, 3, 4]).unwrap();
    check(
        &bc,
        Arr::from_fn(&[2, 3, 4], |i| at(0, i[1], 3)),
        "broadcast_as",
        true,
    );
    check(
        &col.unsqueeze(0).unwrap(),
        Arr::from_fn(&[1, 3, 1], |i| at(0, i[1], 3)),
        "unsqueeze(0)",
        true,
    );
    check(
        &col.squeeze(-1).unwrap().unsqueeze(-1).unwrap(),
        Arr::from_fn(&[3, 1], |i| at(0, i[0], 3)),
        "unsqueeze(-1)",
        true,
    );
    check(
        &base.unsqueeze(3).unwrap(),
        Arr::from_fn(&[2, 3, 4, 1], |i| at(i[0], i[1], i[2])),
        "unsqueeze(3)",
        true,
    );
    // contiguous(): a no-op when contiguous, a copy otherwise; reshape of a strided view copies.
    assert!(base.contiguous().unwrap().shares_storage_with(&base));
    for (v, what) in [
        (&tr, "transpose"),
        (&pm, "permute"),
        (&nr, "narrow"),
        (&bc, "broadcast"),
    ] {
        let c = v.contiguous().unwrap();
        assert!(
            c.is_contiguous() && !c.shares_storage_with(&base),
            "{what}: contiguous() copies"
        );
        assert_eq!(
            (arr(&c), c.device(), c.dtype()),
            (arr(v), t.dev, t.dtype),
            "{what}: contiguous() keeps values"
        );
        let r = v.reshape(&[v.numel()]).unwrap();
        assert!(
            !r.shares_storage_with(&base),
            "{what}: reshape of a strided view copies"
        );
        assert_eq!(
            arr(&r).data,
            arr(v).data,
            "{what}: in row-major order of the view"
        );
    }
    // A contiguous narrow (leading dim) is still a view and reshapes without copying.
    let lead = base.narrow(0, 1, 1).unwrap();
    assert!(lead.is_contiguous());
    check(
        &lead.reshape(&[12]).unwrap(),
        seq(&[12], 12),
        "reshape of narrow",
        true,
    );
    let _ = DType::F32;
}

fn gradients(t: &Target) {
    let mut rng = t.rng(60);
    let x = uniform(&mut rng, &[2, 3, 4], -1.0, 1.0);
    type V = fn(&Tensor) -> sinter_core::Result<Tensor>;
    type RV = fn(&Arr) -> Arr;
    let cases: Vec<(&str, V, RV)> = vec![
        ("reshape", |v| v.reshape(&[4, 6]), |v| v.reshape(&[4, 6])),
        (
            "reshape of transpose",
            |v| v.transpose(0, 2)?.reshape(&[8, 3]),
            |v| v.transpose(0, 2).reshape(&[8, 3]),
        ),
        (
            "permute",
            |v| v.permute(&[2, 0, 1]),
            |v| v.permute(&[2, 0, 1]),
        ),
        ("narrow", |v| v.narrow(2, 1, 2), |v| v.narrow(2, 1, 2)),
        (
            "narrow of narrow",
            |v| v.narrow(1, 1, 2)?.narrow(0, 1, 1),
            |v| v.narrow(1, 1, 2).narrow(0, 1, 1),
        ),
        (
            "flatten_from",
            |v| v.t()?.flatten_from(1),
            |v| v.t().reshape(&[2, 12]),
        ),
        (
            "contiguous",
            |v| v.transpose(0, 1)?.contiguous(),
            |v| v.transpose(0, 1),
        ),
        (
            "unsqueeze/squeeze",
            |v| v.unsqueeze(1)?.squeeze(1),
            |v| v.clone(),
        ),
    ];
    for (name, f, rf) in cases {
        // Squared afterwards so the gradient depends on the values that went through the view.
        t.check_with(
            name,
            rounds(1.0),
            &[In::Var(x.clone())],
            |v| f(&v[0])?.sqr(),
            |v, _| rf(&v[0]).map(|a| a * a),
        );
    }
    let col = uniform(&mut rng, &[3, 1], -1.0, 1.0);
    t.check_with(
        "broadcast_as",
        rounds(1.0),
        &[In::Var(col.clone()), In::Fixed(x)],
        |v| v[0].broadcast_as(&[2, 3, 4])?.mul(&v[1]),
        |v, _| v[0].broadcast_to(&[2, 3, 4]).mul(&v[1]),
    );
    t.check(
        "broadcast_as of unsqueeze",
        &[In::Var(col)],
        |v| v[0].squeeze(1)?.unsqueeze(0)?.broadcast_as(&[5, 3])?.sqr(),
        |v, _| {
            v[0].squeeze(1)
                .unsqueeze(0)
                .broadcast_to(&[5, 3])
                .map(|a| a * a)
        },
    );
}
