//! Bool tensors (`DType::Bool`, PyTorch's `torch.bool`): comparisons with NaN, two-bool
//! arithmetic, logical ops, `any` / `all` (empty included), casts to and from bool, the sum of
//! bools (i64), type promotion with bool, views and copies of bools, and the refusals PyTorch
//! makes. References are PyTorch's documented rules: non-zero (NaN included) is true; NaN
//! compares unequal to everything; bool + i64 is i64, bool + float that float.

use crate::harness::*;
use crate::reference::{self as r, Arr};
use sinter_core::storage::Storage;
use sinter_core::{DType, Layout, Result, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("nan_comparisons", FLOATS, nan_comparisons),
        case("bool_arithmetic", BOOL, bool_arithmetic),
        case("logical_ops", TENSOR, logical_ops),
        case("any_all", TENSOR, any_all),
        case("casts", TENSOR, casts),
        case("sum_max_argmax_of_bool", BOOL, sum_max_argmax_of_bool),
        case("promotion", ALL, promotion),
        case("views_and_copies", BOOL, views_and_copies),
        case("refusals", BOOL, refusals),
        case("storage_where_refusals", BOOL, storage_where_refusals),
    ]
}

type BinFn = fn(&Tensor, &Tensor) -> Result<Tensor>;

fn comparisons() -> Vec<(&'static str, BinFn, fn(f64, f64) -> bool)> {
    vec![
        ("eq", Tensor::eq, |a, b| a == b),
        ("ne", Tensor::ne, |a, b| a != b),
        ("lt", Tensor::lt, |a, b| a < b),
        ("le", Tensor::le, |a, b| a <= b),
        ("gt", Tensor::gt, |a, b| a > b),
        ("ge", Tensor::ge, |a, b| a >= b),
    ]
}

/// The values operands of every dtype hold: zero (both signs), fractions, negatives.
fn mixed() -> Arr {
    Arr::new(
        &[3, 4],
        vec![
            0.0, -0.0, 0.5, -2.0, 1.0, 0.0, 3.0, -0.25, 0.0, 7.0, 0.0, -1.0,
        ],
    )
}

/// `mixed` with NaN and ±inf where the target dtype holds them.
fn mixed_for(t: &Target) -> Arr {
    let mut a = mixed();
    if t.dtype.is_float() {
        a.data[1] = f64::NAN;
        a.data[6] = f64::INFINITY;
        a.data[11] = f64::NEG_INFINITY;
    }
    a
}

/// torch: NaN == x and every ordering with NaN are False, NaN != x True (x = NaN included).
fn nan_comparisons(t: &Target) {
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let a = Arr::new(&[2, 4], vec![nan, nan, 1.0, 2.0, -inf, inf, 0.0, nan]);
    let b = Arr::new(&[4], vec![nan, 1.0, nan, 2.0]);
    for (name, f, rf) in comparisons() {
        t.check_with(
            &format!("{name} with NaN, broadcast"),
            BOOL_OUT,
            &[In::Fixed(a.clone()), In::Fixed(b.clone())],
            |x| f(&x[0], &x[1]),
            |x, _| x[0].zip(&x[1], |p, q| rf(p, q) as u8 as f64),
        );
    }
}

/// Two bools as PyTorch combines them: + and maximum are or, * and minimum and, comparisons
/// order false < true; `-` and `floor_divide` are refused; `/` is true division in f32.
fn bool_arithmetic(t: &Target) {
    let a = Arr::ints(&[3, 4], &[1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0]);
    let b = Arr::ints(&[4], &[1, 0, 0, 1]);
    let or = |p: f64, q: f64| (p != 0.0 || q != 0.0) as u8 as f64;
    let and = |p: f64, q: f64| (p != 0.0 && q != 0.0) as u8 as f64;
    let ops: Vec<(&str, BinFn, fn(f64, f64) -> f64)> = vec![
        ("add", Tensor::add, or),
        ("maximum", Tensor::maximum, or),
        ("mul", Tensor::mul, and),
        ("minimum", Tensor::minimum, and),
    ];
    for (name, f, rf) in ops {
        t.check_with(
            name,
            EXACT,
            &[In::Fixed(a.clone()), In::Fixed(b.clone())],
            |x| f(&x[0], &x[1]),
            |x, _| x[0].zip(&x[1], rf),
        );
    }
    for (name, f, rf) in comparisons() {
        t.check_with(
            &format!("{name} of bools, transposed"),
            BOOL_OUT,
            &[In::Fixed(a.clone()), In::Fixed(a.t())],
            |x| f(&x[0], &x[1].t()?),
            |x, _| x[0].zip(&x[1].t(), |p, q| rf(p, q) as u8 as f64),
        );
    }
    t.check_with(
        "true division",
        Opts {
            out: Some(DType::F32),
            ..EXACT
        },
        &[In::Fixed(a.clone()), In::Fixed(b.clone())],
        |x| x[0].div(&x[1]),
        |x, _| x[0].zip(&x[1], |p, q| p / q),
    );
    let (ta, tb) = (t.tensor(&a), t.tensor(&b));
    for e in [err_msg(ta.sub(&tb)), err_msg(ta.floor_divide(&tb))] {
        assert!(
            e.contains("two bool tensors") && e.contains("logical"),
            "{e}"
        );
    }
}

/// logical_and / or / xor / not of operands in the target dtype (non-zero, NaN included, is
/// true), broadcast and strided; the result is bool and never tracks gradients.
fn logical_ops(t: &Target) {
    let a = mixed_for(t);
    let b = Arr::new(&[4], vec![0.0, 2.0, -0.0, 0.5]);
    let nz = |v: f64| v != 0.0;
    let ops: Vec<(&str, BinFn, fn(bool, bool) -> bool)> = vec![
        ("logical_and", Tensor::logical_and, |p, q| p && q),
        ("logical_or", Tensor::logical_or, |p, q| p || q),
        ("logical_xor", Tensor::logical_xor, |p, q| p != q),
    ];
    for (name, f, rf) in ops {
        t.check_with(
            name,
            BOOL_OUT,
            &[In::Fixed(a.clone()), In::Fixed(b.clone())],
            |x| f(&x[0], &x[1]),
            |x, _| x[0].zip(&x[1], |p, q| rf(nz(p), nz(q)) as u8 as f64),
        );
        t.check_with(
            &format!("{name} with a bool operand, transposed"),
            BOOL_OUT,
            &[In::Fixed(a.clone()), In::Bool(a.t())],
            |x| f(&x[0].t()?, &x[1]),
            |x, _| x[0].t().zip(&x[1], |p, q| rf(nz(p), nz(q)) as u8 as f64),
        );
    }
    t.check_with(
        "logical_not",
        BOOL_OUT,
        &[In::Fixed(a.clone())],
        |x| x[0].t()?.logical_not(),
        |x, _| x[0].t().map(|p| (p == 0.0) as u8 as f64),
    );
    if t.dtype.is_float() {
        let v = t.tensor(&a).to_var().unwrap();
        assert!(!v.logical_and(&v).unwrap().tracks_grad());
        assert!(!v.gt(&v).unwrap().tracks_grad());
    }
}

/// any / all over dims (keepdim or not), of every element, and over empty dimensions:
/// any([]) = false, all([]) = true, as in PyTorch.
fn any_all(t: &Target) {
    let a = mixed_for(t).reshape(&[3, 2, 2]);
    let any = |v: &[f64]| v.iter().any(|&x| x != 0.0) as u8 as f64;
    let all = |v: &[f64]| v.iter().all(|&x| x != 0.0) as u8 as f64;
    for (dims, keep) in [(vec![0isize], false), (vec![-1], true), (vec![0, 2], false)] {
        let d = dims.clone();
        t.check_with(
            &format!("any over {dims:?}, keepdim {keep}"),
            BOOL_OUT,
            &[In::Fixed(a.clone())],
            |x| x[0].any(&d, keep),
            |x, _| r::reduce(&x[0], &dims, keep, any),
        );
        t.check_with(
            &format!("all over {dims:?}, keepdim {keep}"),
            BOOL_OUT,
            &[In::Fixed(a.clone())],
            |x| x[0].all(&d, keep),
            |x, _| r::reduce(&x[0], &dims, keep, all),
        );
    }
    let x = t.tensor(&a);
    let full = t.tensor(&Arr::new(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]));
    assert_eq!(x.any_all().unwrap().to_vec_bool().unwrap(), [true]);
    assert_eq!(x.all_all().unwrap().to_vec_bool().unwrap(), [false]);
    assert_eq!(full.all_all().unwrap().to_vec_bool().unwrap(), [true]);
    // Empty: [2, 0] reduced over its empty dim gives [false, false] / [true, true], and the
    // whole empty tensor false / true.
    let empty = t.zeros(&[2, 0], t.dtype);
    assert_eq!(
        empty.any(&[1], false).unwrap().to_vec_bool().unwrap(),
        [false, false]
    );
    assert_eq!(
        empty.all(&[1], false).unwrap().to_vec_bool().unwrap(),
        [true, true]
    );
    assert_eq!(empty.any_all().unwrap().to_vec_bool().unwrap(), [false]);
    assert_eq!(empty.all_all().unwrap().to_vec_bool().unwrap(), [true]);
    assert_eq!(empty.any(&[0], true).unwrap().shape(), &[1, 0]);
}

/// to_dtype(Bool) from the target dtype (non-zero is true: NaN and ±inf true, -0.0 false),
/// from a strided view; and Bool to the target dtype (1 / 0).
fn casts(t: &Target) {
    let a = mixed_for(t);
    t.check_with(
        "to bool",
        BOOL_OUT,
        &[In::Fixed(a.clone())],
        |x| x[0].to_dtype(DType::Bool),
        |x, _| x[0].map(|v| (v != 0.0) as u8 as f64),
    );
    t.check_with(
        "to bool, transposed",
        BOOL_OUT,
        &[In::Fixed(a.clone())],
        |x| x[0].t()?.to_bool(),
        |x, _| x[0].t().map(|v| (v != 0.0) as u8 as f64),
    );
    t.check_with(
        "from bool",
        EXACT,
        &[In::Bool(a.clone())],
        |x| x[0].to_dtype(t.dtype),
        |x, _| x[0].clone(),
    );
    t.check_with(
        "from bool, transposed",
        EXACT,
        &[In::Bool(a)],
        |x| x[0].t()?.to_dtype(t.dtype),
        |x, _| x[0].t(),
    );
}

/// sum of bools is the i64 count (PyTorch); max / min / argmax order false < true.
fn sum_max_argmax_of_bool(t: &Target) {
    let a = Arr::ints(&[3, 4], &[1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1]);
    let i64_out = Opts {
        out: Some(DType::I64),
        ..EXACT
    };
    for dims in [vec![0isize], vec![1], vec![0, 1]] {
        let d = dims.clone();
        t.check_with(
            &format!("sum over {dims:?}"),
            i64_out,
            &[In::Fixed(a.clone())],
            |x| x[0].sum(&d, false),
            |x, _| r::reduce(&x[0], &dims, false, r::sum),
        );
    }
    t.check_with(
        "sum_all",
        i64_out,
        &[In::Fixed(a.clone())],
        |x| x[0].sum_all(),
        |x, _| Arr::scalar(r::sum(&x[0].data)),
    );
    // Over dim 1 (inner 1): rows all false, all true and mixed; over dim 0 (inner 4): mixed.
    for dim in [0isize, 1] {
        t.check_with(
            &format!("max over {dim}"),
            EXACT,
            &[In::Fixed(a.clone())],
            |x| x[0].max(dim, false),
            |x, _| r::reduce(&x[0], &[dim], false, r::max),
        );
        t.check_with(
            &format!("min over {dim}, keepdim"),
            EXACT,
            &[In::Fixed(a.clone())],
            |x| x[0].min(dim, true),
            |x, _| r::reduce(&x[0], &[dim], true, r::min),
        );
        t.check_with(
            &format!("argmax over {dim}"),
            i64_out,
            &[In::Fixed(a.clone())],
            |x| x[0].argmax(dim, false),
            |x, _| r::reduce(&x[0], &[dim], false, r::argmax),
        );
    }
    // A strided view (the transpose) and a longer row (the reductions read the bools directly).
    t.check_with(
        "sum over 1 of the transpose",
        i64_out,
        &[In::Fixed(a.clone())],
        |x| x[0].t()?.sum(&[1], false),
        |x, _| r::reduce(&x[0].t(), &[1], false, r::sum),
    );
    t.check_with(
        "argmax over 0 of the transpose",
        i64_out,
        &[In::Fixed(a)],
        |x| x[0].t()?.argmax(0, true),
        |x, _| r::reduce(&x[0].t(), &[0], true, r::argmax),
    );
    let long = Arr::from_fn(&[2, 300], |i| ((i[1] * 7 + i[0]) % 5 == 0) as u8 as f64);
    type Reduction = (
        &'static str,
        fn(&Tensor) -> Result<Tensor>,
        fn(&[f64]) -> f64,
    );
    let reductions: [Reduction; 2] = [
        ("sum", |x| x.sum(&[1], false), r::sum),
        ("argmax", |x| x.argmax(1, false), r::argmax),
    ];
    for (name, op, f) in reductions {
        t.check_with(
            &format!("{name} over a row of 300"),
            i64_out,
            &[In::Fixed(long.clone())],
            |x| op(&x[0]),
            |x, _| r::reduce(&x[0], &[1], false, f),
        );
    }
}

/// PyTorch's lattice: bool with any dtype gives that dtype (bool + i64 → i64, bool + f16 →
/// f16), in either order; comparing a bool with a number compares 0/1.
fn promotion(t: &Target) {
    let m = Arr::ints(&[4], &[1, 0, 0, 1]);
    let x = Arr::new(
        &[3, 4],
        vec![
            1.0, -2.0, 3.0, 0.5, 4.0, 0.0, -1.0, 2.0, 5.0, 6.0, -3.0, 1.5,
        ],
    );
    let x = if t.dtype == DType::I64 {
        x.map(f64::trunc)
    } else {
        x
    };
    t.check_with(
        "bool + x",
        EXACT,
        &[In::Bool(m.clone()), In::Fixed(x.clone())],
        |v| v[0].add(&v[1]),
        |v, _| v[0].zip(&v[1], |p, q| p + q),
    );
    t.check_with(
        "x * bool",
        EXACT,
        &[In::Fixed(x.clone()), In::Bool(m.clone())],
        |v| v[0].mul(&v[1]),
        |v, _| v[0].zip(&v[1], |p, q| p * q),
    );
    t.check_with(
        "bool ge x",
        BOOL_OUT,
        &[In::Bool(m), In::Fixed(x)],
        |v| v[0].ge(&v[1]),
        |v, _| v[0].zip(&v[1], |p, q| (p >= q) as u8 as f64),
    );
    if t.dtype.is_float() {
        // A float multiplied by a mask keeps its gradient (the mask's cast has none).
        let v = t.tensor(&Arr::new(&[2], vec![1.0, 2.0])).to_var().unwrap();
        let m = t.tensor_as(&Arr::ints(&[2], &[1, 0]), DType::Bool);
        v.mul(&m).unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(v.grad().unwrap().to_vec_f64().unwrap(), [1.0, 0.0]);
    }
}

/// Bools move like any dtype: contiguous copies of views, cat, narrow, index_select, device
/// round trips, little-endian bytes (one byte each), full / zeros / ones.
fn views_and_copies(t: &Target) {
    let a = Arr::ints(&[3, 4], &[1, 0, 1, 0, 0, 0, 1, 1, 1, 1, 0, 0]);
    t.check_with(
        "contiguous transpose",
        EXACT,
        &[In::Fixed(a.clone())],
        |x| x[0].t()?.contiguous(),
        |x, _| x[0].t(),
    );
    t.check_with(
        "cat of a narrow and a transpose",
        EXACT,
        &[In::Fixed(a.clone()), In::Fixed(a.t())],
        |x| Tensor::cat(&[x[0].narrow(0, 1, 2)?.t()?, x[1].clone()], 1),
        |x, _| r::cat(&[x[0].narrow(0, 1, 2).t(), x[1].clone()], 1),
    );
    t.check_with(
        "index_select of rows",
        EXACT,
        &[
            In::Fixed(a.clone()),
            In::Ids(Arr::ints(&[4], &[2, 0, 2, 1])),
        ],
        |x| x[0].index_select(0, &x[1]),
        |x, _| r::index_select(&x[0], 0, &x[1]),
    );
    let x = t.tensor(&a);
    let v: Vec<bool> = a.data.iter().map(|&p| p != 0.0).collect();
    assert_eq!(x.to_vec_bool().unwrap(), v);
    let bytes = x.to_le_bytes().unwrap();
    assert_eq!(bytes, v.iter().map(|&b| b as u8).collect::<Vec<_>>());
    let back = Tensor::from_le_bytes(&bytes, DType::Bool, &[3, 4], t.dev).unwrap();
    assert_eq!(
        (back.dtype(), back.to_vec_bool().unwrap()),
        (DType::Bool, v)
    );
    let e = err_msg(Tensor::from_le_bytes(&[0, 1, 2], DType::Bool, &[3], t.dev));
    assert!(e.contains("not 0 or 1"), "{e}");
    for (value, want) in [(0.0, false), (1.0, true), (-3.5, true)] {
        let f = Tensor::full(value, &[2], DType::Bool, t.dev).unwrap();
        assert_eq!(f.to_vec_bool().unwrap(), [want, want], "full({value})");
    }
    assert_eq!(
        Tensor::ones(&[3], DType::Bool, t.dev)
            .unwrap()
            .to_vec_i64()
            .unwrap(),
        [1, 1, 1]
    );
}

/// What PyTorch refuses on bools is refused, saying what: gradients, mean, matmul, float math.
fn refusals(t: &Target) {
    let x = t.tensor(&Arr::ints(&[2, 2], &[1, 0, 0, 1]));
    let e = err_msg(x.to_var());
    assert!(e.contains("float") && e.contains("bool"), "{e}");
    let e = err_msg(x.mean_all());
    assert!(e.contains("mean") && e.contains("bool"), "{e}");
    let e = err_msg(x.matmul(&x));
    assert!(e.contains("matmul") && e.contains("bool"), "{e}");
    let e = err_msg(x.exp());
    assert!(e.contains("exp") && e.contains("bool"), "{e}");
    let e = err_msg(x.softmax(-1));
    assert!(e.contains("softmax") && e.contains("bool"), "{e}");
    let e = err_msg(Tensor::arange(0.0, 3.0, 1.0, DType::Bool, t.dev));
    assert!(e.contains("arange") && e.contains("bool"), "{e}");
}

/// The backend seam's `where` (below the tensor op, which refuses first) refuses a non-bool
/// condition instead of reading it as non-zero, and a and b of two dtypes, on every backend.
fn storage_where_refusals(t: &Target) {
    let l = Layout::contiguous(&[4]);
    let full = |v: f64, d| Storage::full(t.dev, 4, v, d).unwrap();
    let (a, b) = (full(2.0, DType::F32), full(3.0, DType::F32));
    let run = |c: &Storage, b: &Storage| c.where_cond(&l, &a, &l, b, &l).map(|_| ());
    for d in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        let e = err_msg(run(&full(1.0, d), &b));
        assert!(
            e.contains("where") && e.contains("must be bool") && e.contains(&d.to_string()),
            "{e}"
        );
    }
    let e = err_msg(run(&full(1.0, DType::Bool), &full(3.0, DType::I64)));
    assert!(e.contains("where") && e.contains("f32 and i64"), "{e}");
    // A bool condition still selects.
    for (c, want) in [(true, 2.0), (false, 3.0)] {
        let out = full(c as u8 as f64, DType::Bool)
            .where_cond(&l, &a, &l, &b, &l)
            .unwrap();
        let host = out.to_cpu(&l).unwrap();
        assert_eq!(host.f32_contiguous(&l).as_ref(), [want; 4], "cond {c}");
    }
}
