//! Misuse returns an error that names the op; nothing panics.

use super::common::*;
use sinter_core::{Conv2dParams, DType, Pool2dParams, Rng, Tensor};

fn x23() -> Tensor {
    tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])
}

#[test]
fn shape_mismatches() {
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
    expect_err(a.matmul(&tensor(&[1.0; 3], &[3])), "matmul");
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
        Tensor::where_cond(&tensor(&[1.0; 4], &[4]), &a, &a),
        "where",
    );
    expect_err(Tensor::from_vec(vec![1f32; 5], &[2, 3], CPU), "from_vec");
    expect_err(
        a.cross_entropy(&ids(&[0, 1, 2], &[3]), -100),
        "cross_entropy",
    );
    expect_err(
        a.cross_entropy(&tensor(&[0.0, 1.0], &[2]), -100),
        "cross_entropy",
    );
}

#[test]
fn out_of_range_indices() {
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

#[test]
fn bad_dimensions() {
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

#[test]
fn convolution_and_pooling_misuse() {
    let mut rng = Rng::new(3);
    let x = uniform(&mut rng, &[1, 2, 4, 4], -1.0, 1.0);
    let p = Conv2dParams::default();
    // Kernel larger than the input.
    expect_err(
        x.conv2d(&uniform(&mut rng, &[3, 2, 5, 5], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &uniform(&mut rng, &[3, 2, 3, 3], -1.0, 1.0),
            Conv2dParams { dilation: 2, ..p },
        ),
        "conv2d",
    );
    assert!(x
        .conv2d(
            &uniform(&mut rng, &[3, 2, 5, 5], -1.0, 1.0),
            Conv2dParams { padding: 1, ..p }
        )
        .is_ok());
    // An empty kernel.
    expect_err(
        x.conv2d(&Tensor::zeros(&[3, 2, 0, 0], DType::F32, CPU).unwrap(), p),
        "conv2d",
    );
    // Channel / group mismatches, ranks, zero stride.
    expect_err(
        x.conv2d(&uniform(&mut rng, &[3, 3, 3, 3], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &uniform(&mut rng, &[3, 1, 3, 3], -1.0, 1.0),
            Conv2dParams { groups: 2, ..p },
        ),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &uniform(&mut rng, &[4, 2, 3, 3], -1.0, 1.0),
            Conv2dParams { groups: 0, ..p },
        ),
        "conv2d",
    );
    expect_err(
        x.conv2d(
            &uniform(&mut rng, &[4, 2, 3, 3], -1.0, 1.0),
            Conv2dParams { stride: 0, ..p },
        ),
        "conv2d",
    );
    expect_err(
        x.reshape(&[2, 4, 4])
            .unwrap()
            .conv2d(&uniform(&mut rng, &[3, 2, 3, 3], -1.0, 1.0), p),
        "conv2d",
    );
    expect_err(
        x.conv2d(&uniform(&mut rng, &[3, 2, 3], -1.0, 1.0), p),
        "conv2d",
    );
    // Pooling.
    expect_err(
        x.max_pool2d(Pool2dParams {
            kernel: 5,
            stride: 1,
            padding: 0,
        }),
        "max_pool2d",
    );
    expect_err(
        x.avg_pool2d(Pool2dParams {
            kernel: 5,
            stride: 1,
            padding: 0,
        }),
        "avg_pool2d",
    );
    expect_err(
        x.max_pool2d(Pool2dParams {
            kernel: 2,
            stride: 0,
            padding: 0,
        }),
        "max_pool2d",
    );
    expect_err(
        x.max_pool2d(Pool2dParams {
            kernel: 2,
            stride: 1,
            padding: 2,
        }),
        "max_pool2d",
    );
    expect_err(
        x.reshape(&[2, 4, 4]).unwrap().avg_pool2d(Pool2dParams {
            kernel: 2,
            stride: 2,
            padding: 0,
        }),
        "avg_pool2d",
    );
}

#[test]
fn dtype_misuse() {
    let a = x23();
    let i = ids(&[1, 2, 3, 4, 5, 6], &[2, 3]);
    expect_err(a.add(&i), "add");
    expect_err(i.exp(), "exp");
    expect_err(i.matmul(&i.t().unwrap()), "matmul");
    expect_err(Tensor::where_cond(&a, &a, &i), "where");
    // Float dtypes promote in elementwise ops (see `sinter_core::amp`), but not where the op
    // cannot promote: `where` between f16 and f32, and matmul outside an autocast region.
    let h = a.to_dtype(DType::F16).unwrap();
    assert_eq!(h.add(&a).unwrap().dtype(), DType::F32);
    expect_err(Tensor::where_cond(&a, &h, &a), "where");
    expect_err(h.matmul(&a.t().unwrap()), "matmul");
    expect_err(i.to_var(), "to_var");
}

#[test]
fn buffer_only_dtypes_are_refused_by_tensor_ops() {
    // i32 and u8 name device-buffer element types (one DType for tensors and kernels); every
    // way a dtype enters a tensor answers with an error that names the op and the dtype.
    let a = x23();
    let dev = sinter_core::Device::Cpu;
    for d in [DType::I32, DType::U8] {
        let check = |m: String, op: &str| {
            assert!(
                m.contains(op) && m.contains(d.as_str()) && m.contains("f32, f16, bf16 or i64"),
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
