//! PyTorch's semantics at the edges (issue 14) in the kernels, run through the CPU emulator:
//! NaN through relu, maximum/minimum and max pooling (AdamW's scalars are sinter-core's
//! kernels/optimizer/ tests, the precision of cross-entropy on a confident prediction its
//! kernels/cross_entropy/ tests). Expected values marked "PyTorch" were printed by
//! PyTorch 2.15 (CPU) with crates/sinter-core/tests/semantics_torch.py.

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::ops::binary::{self, BinaryOp};
use sinter_cuda::ops::conv::{self, Window2d};
use sinter_cuda::ops::unary::{self, UnaryOp};
use sinter_cuda::DType;

/// Bit-exact comparison, NaN matching any NaN (the sign of a zero counts).
fn assert_same(what: &str, got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let same = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
        assert!(same, "{what}[{i}]: got {g}, PyTorch {w} (all: {got:?})");
    }
}

#[test]
fn relu_keeps_nan_and_negative_zero() {
    let Some(e) = emu() else { return };
    for d in FLOATS {
        // PyTorch: relu([nan, -1, 2, -0.0]) = [nan, 0, 2, -0.0]; its gradient [1, 0, 1, 0].
        let x = Buf::from_f64(d, &[f64::NAN, -1.0, 2.0, -0.0], 0);
        let y = Buf::zeros(d, 4, 0);
        let l = unary::plan_unary(&T1, UnaryOp::Relu, x.slice(), y.slice()).unwrap();
        exec1(e, l.unwrap(), &[&x, &y]);
        assert_same(&format!("relu {d}"), &y.get(), &[f64::NAN, 0.0, 2.0, -0.0]);
        let gy = Buf::from_f64(d, &[1.0; 4], 0);
        let gx = Buf::zeros(d, 4, 0);
        let l = unary::plan_unary_backward(&T1, UnaryOp::Relu, x.slice(), gy.slice(), gx.slice());
        exec1(e, l.unwrap().unwrap(), &[&x, &gy, &gx]);
        assert_same(
            &format!("relu backward {d}"),
            &gx.get(),
            &[1.0, 0.0, 1.0, 0.0],
        );
    }
}

#[test]
fn maximum_and_minimum_propagate_nan() {
    let Some(e) = emu() else { return };
    let nan = f64::NAN;
    for d in FLOATS {
        // PyTorch: maximum / minimum([nan, 1, 2], [1, nan, 1]) = [nan, nan, 2] / [nan, nan, 1].
        let a = Buf::from_f64(d, &[nan, 1.0, 2.0], 0);
        let b = Buf::from_f64(d, &[1.0, nan, 1.0], 0);
        for (op, want) in [
            (BinaryOp::Maximum, [nan, nan, 2.0]),
            (BinaryOp::Minimum, [nan, nan, 1.0]),
        ] {
            let out = Buf::zeros(d, 3, 0);
            let l = binary::plan_binary(&T1, op, a.slice(), b.slice(), out.slice()).unwrap();
            exec1(e, l.unwrap(), &[&a, &b, &out]);
            assert_same(&format!("{op:?} {d}"), &out.get(), &want);
        }
    }
}

/// A 2×2 window pools to NaN when it holds one, and the gradient goes to the window's last NaN
/// (PyTorch's indices: [nan, 1, nan, 0] → 2, [1, 2, nan, 0] → 2, [nan, 5, 1, 0] → 0).
#[test]
fn max_pool_propagates_nan_to_the_last_nan() {
    let Some(e) = emu() else { return };
    let nan = f64::NAN;
    let g = Window2d {
        n: 1,
        c: 3,
        h: 2,
        w: 2,
        kernel: (2, 2),
        stride: (2, 2),
        padding: (0, 0),
        dilation: (1, 1),
        ceil_mode: false,
    };
    let xv = [nan, 1.0, nan, 0.0, 1.0, 2.0, nan, 0.0, nan, 5.0, 1.0, 0.0];
    for d in FLOATS {
        let x = Buf::from_f64(d, &xv, 0);
        let y = Buf::zeros(d, 3, 0);
        let am = Buf::zeros(DType::I64, 3, 0);
        let l = conv::plan_maxpool2d_forward(&T1, x.slice(), y.slice(), Some(am.slice()), &g);
        exec1(e, l.unwrap().unwrap(), &[&x, &y, &am]);
        assert_same(&format!("max_pool2d {d}"), &y.get(), &[nan, nan, nan]);
        assert_eq!(am.get_i64(), [2, 2, 0], "max_pool2d indices {d}");
        let gy = Buf::from_f64(d, &[1.0, 2.0, 3.0], 0);
        let gx = Buf::zeros(d, 12, 0);
        let l = conv::plan_maxpool2d_backward(&T1, gy.slice(), am.slice(), gx.slice(), &g);
        exec1(e, l.unwrap().unwrap(), &[&gy, &am, &gx]);
        let want = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 3.0, 0.0, 0.0, 0.0];
        assert_same(&format!("max_pool2d backward {d}"), &gx.get(), &want);
    }
}
