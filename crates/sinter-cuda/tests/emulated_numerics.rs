//! PyTorch's semantics at the edges (issue 14) in the kernels, run through the CPU emulator:
//! NaN through relu, maximum/minimum and max pooling, and AdamW's scalars (the precision of
//! cross-entropy on a confident prediction is sinter-core's kernels/cross_entropy/ tests). Expected values marked "PyTorch" were printed by
//! PyTorch 2.15 (CPU) with crates/sinter-core/tests/semantics_torch.py.

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::ops::adamw::{self, ctl, AdamW};
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

/// Two steps of `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`
/// on f32, plain and driven by the step control block: bit for bit the shared rule
/// (`sinter_types::AdamW`: the f64 hyper-parameters, each scalar factor rounded to f32 once, as
/// PyTorch computes them from Python floats). PyTorch's own values for these two steps are
/// checked on the CPU and the CUDA device by sinter-core's tests/semantics.rs.
#[test]
fn adamw_follows_the_shared_rule_step_by_step() {
    let Some(e) = emu() else { return };
    let grads = [[0.1, -0.2, 3.0, 1e-3], [-0.3, 0.05, 2.5, 0.0]];
    for with_ctl in [false, true] {
        let p = Buf::from_f64(DType::F32, &[0.5, -1.25, 2.0, 0.0], 0);
        let m = Buf::from_f64(DType::F32, &[0.0; 4], 0);
        let v = Buf::from_f64(DType::F32, &[0.0; 4], 0);
        for (step, gv) in grads.iter().enumerate() {
            let cfg = AdamW {
                hyper: sinter_types::AdamW {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.01,
                    step: step as u64 + 1,
                },
                grad_scale: 1.0,
            };
            let g = Buf::from_f64(DType::F32, gv, 0);
            let (l, c) = if with_ctl {
                // lr and the step count from the block (its lr is f32: 1e-3 within 1e-11).
                let mut block = vec![0.0; ctl::LEN];
                block[ctl::LR] = 1e-3;
                block[ctl::STEPS] = step as f64;
                block[ctl::GRAD_FACTOR] = 1.0;
                let c = Buf::from_f64(DType::F32, &block, 0);
                let cfg = AdamW {
                    hyper: sinter_types::AdamW {
                        lr: 99.0,
                        ..cfg.hyper
                    },
                    ..cfg
                }
                .at_step(1);
                let l = adamw::plan_adamw_ctl(
                    &T1,
                    p.slice(),
                    g.slice(),
                    m.slice(),
                    v.slice(),
                    None,
                    &cfg,
                    c.slice(),
                );
                (l, Some(c))
            } else {
                let l = adamw::plan_adamw(
                    &T1,
                    p.slice(),
                    g.slice(),
                    m.slice(),
                    v.slice(),
                    None,
                    &cfg,
                    None,
                );
                (l, None)
            };
            let before = (p.get(), m.get(), v.get());
            let mut bufs = vec![&p, &g, &m, &v];
            bufs.extend(c.as_ref());
            exec1(e, l.unwrap().unwrap(), &bufs);
            // The host reference (`AdamW::reference`) is the kernel's arithmetic, bit for bit
            // (with the block's f32 learning rate when the block drives the step).
            let lr = if with_ctl {
                1e-3f32 as f64
            } else {
                cfg.hyper.lr
            };
            let cfg = AdamW {
                hyper: sinter_types::AdamW { lr, ..cfg.hyper },
                ..cfg
            };
            for (i, &gi) in gv.iter().enumerate() {
                let f = |x: f64| x as f32;
                let (rp, rm, rv) =
                    cfg.reference(f(before.0[i]), f(gi), f(before.1[i]), f(before.2[i]));
                let got = (f(p.get()[i]), f(m.get()[i]), f(v.get()[i]));
                assert_eq!(got, (rp, rm, rv), "adamw (ctl {with_ctl}) element {i}");
            }
        }
    }
}
