//! Misuse returns an error that names the op, on every device; nothing panics.

use crate::harness::*;
use crate::reference::Arr;
use sinter_core::{Conv2dParams, DType, Hw, Pool2dParams, Rng, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("shape_mismatches", F32, shape_mismatches),
        case("out_of_range_host_indices", F32, out_of_range_indices),
        case("bad_dimensions", F32, bad_dimensions),
        case(
            "convolution_and_pooling_misuse",
            F32,
            convolution_and_pooling_misuse,
        ),
        case("dtype_misuse", F32, dtype_misuse),
        case(
            "buffer_only_dtypes",
            F32,
            buffer_only_dtypes_are_refused_by_tensor_ops,
        ),
        case("device_mismatch", F32, device_mismatch).cuda_only(),
    ]
}

thread_local! {
    static DEV: std::cell::Cell<sinter_core::Device> = const { std::cell::Cell::new(sinter_core::Device::Cpu) };
}

fn tensor(data: &[f64], shape: &[usize]) -> Tensor {
    make(&Arr::new(shape, data.to_vec()), DType::F32, DEV.get())
}
/// Ids stay on the host: out-of-range host ids fail at the op on every device (device-resident
/// ones are reported at the next read, see `device::bad_device_indices`).
fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, sinter_core::Device::Cpu).unwrap()
}
fn u(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    make(&uniform(rng, shape, lo, hi), DType::F32, DEV.get())
}
fn x23() -> Tensor {
    tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
}

/// Mixing devices in one op is an error, not a panic.
fn device_mismatch(t: &Target) {
    use sinter_core::{Device, Error};
    let x = make(&Arr::new(&[2, 3], vec![1.0; 6]), DType::F32, Device::Cpu);
    let e = x.add(&x.to_device(t.dev).unwrap()).unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    let e = x
        .to_device(t.dev)
        .unwrap()
        .matmul(&x.t().unwrap())
        .unwrap_err();
    assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
}

fn shape_mismatches(t: &Target) {
    DEV.set(t.dev);
    let a = x23();
    for f in [
        Tensor::add,
        Tensor::sub,
        Tensor::mul,
        Tensor::div,
        Tensor::maximum,
        Tensor::lt,
    ] {
        let m = err_msg(f(&a, &tensor(&[1.0; 4], &[4])));
        assert!(
            m.contains("[2, 3]") && m.contains("[4]"),
            "the shapes are named: {m}"
        );
    }
    expect_err(a.add(&tensor(&[1.0; 4], &[4])), "add");
    expect_err(a.mul(&tensor(&[1.0; 6], &[3, 2])), "mul");
    expect_err(a.matmul(&tensor(&[1.0; 8], &[4, 2])), "matmul");
    expect_err(a.matmul(&tensor(&[1.0; 4], &[4])), "matmul");
    expect_err(
        tensor(&[1.0; 3], &[3]).matmul(&tensor(&[1.0; 2], &[2])),
        "matmul",
    );
    expect_err(
        tensor(&[1.0], &[]).matmul(&tensor(&[1.0; 2], &[2])),
        "matmul",
    );
    expect_err(
        tensor(&[1.0; 24], &[2, 3, 4]).matmul(&tensor(&[1.0; 60], &[3, 4, 5])),
        "matmul",
    );
    expect_err(
        Tensor::cat(&[a.clone(), tensor(&[1.0; 8], &[2, 4])], 0),
        "cat",
    );
    expect_err(Tensor::cat(&[a.clone(), tensor(&[1.0; 6], &[6])], 0), "cat");
    expect_err(Tensor::cat(&[], 0), "cat");
    expect_err(Tensor::stack(&[a.clone(), a.t().unwrap()], 0), "cat");
    expect_err(a.reshape(&[4, 2]), "reshape");
    expect_err(a.reshape(&[4, usize::MAX]), "reshape");
    expect_err(a.broadcast_as(&[3, 3]), "broadcast");
    expect_err(a.mse_loss(&a.t().unwrap()), "mse_loss");
    expect_err(
        a.layer_norm(&tensor(&[1.0; 2], &[2]), &tensor(&[0.0; 3], &[3]), 1e-5),
        "layer_norm",
    );
    expect_err(
        a.index_add(0, &ids(&[1], &[1]), &tensor(&[1.0; 6], &[2, 3])),
        "index_add",
    );
    expect_err(a.split(&[1, 1], 1), "split");
    expect_err(a.chunk(2, 1), "chunk");
    expect_err(a.squeeze(0), "squeeze");
    expect_err(
        Tensor::where_cond(&tensor(&[1.0; 4], &[4]).to_bool().unwrap(), &a, &a),
        "where",
    );
    expect_err(Tensor::from_vec(vec![1f32; 5], &[2, 3], t.dev), "from_vec");
    expect_err(
        a.cross_entropy(&ids(&[0, 1, 2], &[3]), -100),
        "cross_entropy",
    );
    expect_err(
        a.cross_entropy(&tensor(&[0.0, 1.0], &[2]), -100),
        "cross_entropy",
    );
}

fn out_of_range_indices(t: &Target) {
    DEV.set(t.dev);
    let table = tensor(&[0.0; 12], &[4, 3]);
    expect_err(table.index_select(0, &ids(&[0, 4], &[2])), "index_select");
    expect_err(table.index_select(0, &ids(&[-1], &[1])), "index_select");
    expect_err(table.index_select(1, &ids(&[3], &[1])), "index_select");
    expect_err(table.index_select(0, &tensor(&[0.0], &[1])), "index_select");
    expect_err(table.embedding(&ids(&[1, 2, 9], &[3])), "embedding");
    expect_err(table.embedding(&ids(&[-3], &[1, 1])), "embedding");
    expect_err(
        table.index_add(0, &ids(&[5], &[1]), &tensor(&[0.0; 3], &[1, 3])),
        "index_add",
    );
    let logits = tensor(&[0.0; 12], &[4, 3]);
    expect_err(
        logits.cross_entropy(&ids(&[0, 1, 3, 2], &[4]), -100),
        "cross_entropy",
    );
    expect_err(
        logits.cross_entropy(&ids(&[0, -1, 2, 2], &[4]), -100),
        "cross_entropy",
    );
    // The ignore index itself is fine even though it is not a class.
    assert!(logits
        .cross_entropy(&ids(&[0, -100, 2, 2], &[4]), -100)
        .is_ok());
    expect_err(table.narrow(0, 3, 2), "narrow");
}

fn bad_dimensions(t: &Target) {
    DEV.set(t.dev);
    let a = tensor(&[0.0; 24], &[2, 3, 4]);
    expect_err(a.sum(&[3], false), "sum");
    expect_err(a.sum(&[-4], true), "sum");
    expect_err(a.mean(&[0, 5], false), "mean");
    expect_err(a.max(3, false), "max");
    expect_err(a.argmax(-4, false), "argmax");
    expect_err(a.softmax(3), "softmax");
    expect_err(a.log_softmax(-4), "softmax");
    expect_err(a.transpose(0, 3), "transpose");
    expect_err(a.permute(&[0, 1]), "permute");
    expect_err(a.permute(&[0, 1, 1]), "permute");
    expect_err(a.narrow(3, 0, 1), "narrow");
    expect_err(a.squeeze(5), "squeeze");
    expect_err(a.unsqueeze(4), "unsqueeze");
    expect_err(a.index_select(3, &ids(&[0], &[1])), "index_select");
    expect_err(a.index_select(0, &ids(&[0, 0], &[1, 2])), "index_select");
    expect_err(Tensor::cat(&[a.clone(), a.clone()], 3), "cat");
    expect_err(a.split(&[2, 2], 4), "split");
    expect_err(a.chunk(2, -4), "chunk");
    expect_err(tensor(&[1.0], &[]).layer_norm(&a, &a, 1e-5), "layer_norm");
    expect_err(
        tensor(&[1.0], &[]).cross_entropy(&ids(&[0], &[]), -100),
        "cross_entropy",
    );
}

fn convolution_and_pooling_misuse(t: &Target) {
    DEV.set(t.dev);
    let mut rng = Rng::new(3);
    let x = u(&mut rng, &[1, 2, 4, 4], -1.0, 1.0);
    let p = Conv2dParams::default();
    // Kernel larger than the input.
    expect_err(
        x.conv2d(&u(&mut rng, &[3, 2, 5, 5], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &u(&mut rng, &[3, 2, 3, 3], -1.0, 1.0),
            Conv2dParams {
                dilation: 2.into(),
                ..p
            },
        ),
        "conv2d",
    );
    assert!(x
        .conv2d(
            &u(&mut rng, &[3, 2, 5, 5], -1.0, 1.0),
            Conv2dParams {
                padding: 1.into(),
                ..p
            }
        )
        .is_ok());
    // Per axis: the kernel fits along the rows only (3x5 kernel over 4x4, padding (0, 0)); a
    // dilation along the columns only; padding along the columns makes it fit.
    expect_conv_err(
        x.conv2d(&u(&mut rng, &[3, 2, 3, 5], -1.0, 1.0), p),
        "does not fit a 4x4 input",
    );
    expect_conv_err(
        x.conv2d(
            &u(&mut rng, &[3, 2, 1, 3], -1.0, 1.0),
            Conv2dParams {
                dilation: (1, 2).into(),
                ..p
            },
        ),
        "dilation 1x2",
    );
    assert_eq!(
        x.conv2d(
            &u(&mut rng, &[3, 2, 3, 5], -1.0, 1.0),
            Conv2dParams {
                padding: (0, 1).into(),
                ..p
            }
        )
        .unwrap()
        .shape(),
        [1, 3, 2, 2]
    );
    // An empty kernel.
    expect_err(
        x.conv2d(&Tensor::zeros(&[3, 2, 0, 0], DType::F32, t.dev).unwrap(), p),
        "conv2d",
    );
    // Channel / group mismatches, ranks, zero stride.
    expect_err(
        x.conv2d(&u(&mut rng, &[3, 3, 3, 3], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &u(&mut rng, &[3, 1, 3, 3], -1.0, 1.0),
            Conv2dParams { groups: 2, ..p },
        ),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &u(&mut rng, &[4, 2, 3, 3], -1.0, 1.0),
            Conv2dParams { groups: 0, ..p },
        ),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &u(&mut rng, &[4, 2, 3, 3], -1.0, 1.0),
            Conv2dParams {
                stride: 0.into(),
                ..p
            },
        ),
        "conv2d",
    );
    // A zero stride along one axis only.
    expect_conv_err(
        x.conv2d(
            &u(&mut rng, &[4, 2, 3, 3], -1.0, 1.0),
            Conv2dParams {
                stride: (1, 0).into(),
                ..p
            },
        ),
        "at least 1",
    );
    expect_err(
        x.reshape(&[2, 4, 4])
            .unwrap()
            .conv2d(&u(&mut rng, &[3, 2, 3, 3], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(x.conv2d(&u(&mut rng, &[3, 2, 3], -1.0, 1.0), p), "conv2d");
    // Pooling: a window larger than the input, zero stride, padding above half the kernel (as
    // PyTorch refuses), each per axis too; dilation for average pooling; rank.
    let pool = |k: (usize, usize), s: (usize, usize), pd: (usize, usize)| Pool2dParams {
        stride: s.into(),
        padding: pd.into(),
        ..Pool2dParams::new(k)
    };
    let bad = [
        (pool((5, 5), (1, 1), (0, 0)), "does not fit a 4x4 input"),
        (pool((2, 5), (1, 1), (0, 0)), "does not fit a 4x4 input"),
        (pool((2, 2), (0, 0), (0, 0)), "at least 1"),
        (pool((2, 2), (1, 0), (0, 0)), "at least 1"),
        (pool((0, 2), (1, 1), (0, 0)), "at least 1"),
        (pool((2, 2), (1, 1), (2, 2)), "at most half the kernel"),
        (pool((3, 2), (1, 1), (1, 2)), "at most half the kernel"),
        (
            Pool2dParams {
                dilation: (1, 0).into(),
                ..pool((2, 2), (1, 1), (0, 0))
            },
            "at least 1",
        ),
        // A dilated window (span 7) that does not fit even in ceil mode.
        (
            Pool2dParams {
                dilation: (3, 1).into(),
                ceil_mode: true,
                ..pool((3, 2), (1, 1), (1, 0))
            },
            "does not fit",
        ),
    ];
    for (p, want) in bad {
        for (op, r) in [
            ("max_pool2d", x.max_pool2d(p)),
            ("avg_pool2d", x.avg_pool2d(p)),
        ] {
            // Average pooling refuses a (valid) dilation before fitting the window.
            let dilated = !p.dilation.any_zero() && p.dilation != Hw::square(1);
            let want = if op == "avg_pool2d" && dilated {
                "no dilation"
            } else {
                want
            };
            let m = err_msg(r);
            assert!(m.contains(op) && m.contains(want), "{op} {p:?}: {m:?}");
        }
    }
    let dilated = Pool2dParams {
        dilation: (2, 1).into(),
        ..pool((2, 2), (1, 1), (0, 0))
    };
    assert_eq!(x.max_pool2d(dilated).unwrap().shape(), [1, 2, 2, 3]);
    let m = err_msg(x.avg_pool2d(dilated));
    assert!(
        m.contains("avg_pool2d") && m.contains("no dilation"),
        "{m:?}"
    );
    expect_err(
        x.reshape(&[2, 4, 4])
            .unwrap()
            .avg_pool2d(Pool2dParams::square(2, 2, 0)),
        "avg_pool2d",
    );
}

/// An error from conv2d whose message holds `want`.
fn expect_conv_err<T: std::fmt::Debug>(r: sinter_core::Result<T>, want: &str) {
    let m = err_msg(r);
    assert!(m.contains("conv2d") && m.contains(want), "{m:?}");
}

fn dtype_misuse(t: &Target) {
    DEV.set(t.dev);
    let a = x23();
    let i = ids(&[1, 2, 3, 4, 5, 6], &[2, 3]).to_device(t.dev).unwrap();
    // i64 meets a float as that float (`DType::promote`), but matmul does not promote.
    assert_eq!(a.add(&i).unwrap().dtype(), a.dtype());
    expect_err(i.exp(), "exp");
    expect_err(a.matmul(&i.t().unwrap()), "matmul");
    // `where` promotes its value operands (as torch.where) but needs a bool condition.
    let c = a.gt(&a.zeros_like().unwrap()).unwrap();
    assert_eq!(Tensor::where_cond(&c, &a, &i).unwrap().dtype(), a.dtype());
    expect_err(Tensor::where_cond(&a, &a, &i), "where");
    // Float dtypes promote in elementwise ops (see `sinter_core::amp`) and in `where`, but not
    // in matmul outside an autocast region.
    let h = a.to_dtype(DType::F16).unwrap();
    assert_eq!(h.add(&a).unwrap().dtype(), DType::F32);
    assert_eq!(Tensor::where_cond(&c, &h, &a).unwrap().dtype(), DType::F32);
    expect_err(h.matmul(&a.t().unwrap()), "matmul");
    expect_err(i.to_var(), "to_var");
}

fn buffer_only_dtypes_are_refused_by_tensor_ops(t: &Target) {
    DEV.set(t.dev);
    // i32 and u8 name device-buffer element types (one DType for tensors and kernels); every
    // way a dtype enters a tensor answers with an error that names the op and the dtype.
    let a = x23();
    let dev = t.dev;
    for d in [DType::I32, DType::U8] {
        let check = |m: String, op: &str| {
            assert!(
                m.contains(op)
                    && m.contains(d.as_str())
                    && m.contains("f32, f16, bf16, i64 or bool"),
                "{m}"
            );
        };
        check(err_msg(Tensor::zeros(&[2], d, dev)), "full");
        check(err_msg(Tensor::arange(0.0, 3.0, 1.0, d, dev)), "arange");
        check(err_msg(a.to_dtype(d)), "to_dtype");
        check(
            err_msg(Tensor::from_le_bytes(&[0; 8], d, &[2], dev)),
            "from_le_bytes",
        );
        let mut rng = Rng::new(1);
        check(
            err_msg(Tensor::randn(&[2], 0.0, 1.0, &mut rng, d, dev)),
            "randn",
        );
        check(
            err_msg(Tensor::rand_uniform(&[2], 0.0, 1.0, &mut rng, d, dev)),
            "rand_uniform",
        );
    }
}
