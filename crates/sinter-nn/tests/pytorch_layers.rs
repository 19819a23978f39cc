//! Layers that behave like their PyTorch namesakes at the edges (issue 14): `Embedding`'s
//! `padding_idx`, `GELU`'s default (exact) form, and `BatchNorm2d` refusing a batch with one
//! value per channel in training, per-axis pooling with ceil mode. Expected values were printed by PyTorch 2.15 (CPU) with
//! crates/sinter-core/tests/semantics_torch.py.

use sinter_core::{Conv2dParams, DType, Device, Hw, Pool2dParams, Result, Rng, Tensor};
use sinter_nn::{AvgPool2d, BatchNorm2d, Conv2d, ConvBn, Embedding, Gelu, MaxPool2d, Module};

fn close(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol,
            "{what}[{i}]: got {g}, PyTorch {w}"
        );
    }
}

/// `nn.Embedding(4, 3, padding_idx=0)`: the row is zero-filled when made, returned as it is by
/// the lookup (here a loaded, non-zero row), and never receives a gradient.
#[test]
fn embedding_padding_row_gets_no_gradient() -> Result<()> {
    let e = Embedding::new(4, 3, 1.0, &mut Rng::new(1))?.with_padding_idx(0)?;
    assert_eq!(e.weight.to_vec_f32()?[..3], [0.0; 3]);
    let table = [
        0.5f32, -0.25, 1.0, 1.0, 2.0, 3.0, -1.0, 0.0, 1.0, 0.1, 0.2, 0.3,
    ];
    e.weight
        .assign(&Tensor::from_slice(&table, &[4, 3], Device::Cpu)?)?;
    let ids = Tensor::from_slice(&[0i64, 2, 0, 1], &[1, 4], Device::Cpu)?;
    let y = e.forward(&ids)?;
    let want = [
        0.5, -0.25, 1.0, -1.0, 0.0, 1.0, 0.5, -0.25, 1.0, 1.0, 2.0, 3.0,
    ];
    close("lookup", &y.to_vec_f32()?, &want, 0.0);
    let w = Tensor::arange(0.0, 12.0, 1.0, DType::F32, Device::Cpu)?.reshape(&[1, 4, 3])?;
    y.mul(&w)?.sum_all()?.backward()?;
    let g = e.weight.grad().expect("gradient").to_vec_f32()?;
    let want = [0.0, 0.0, 0.0, 9.0, 10.0, 11.0, 3.0, 4.0, 5.0, 0.0, 0.0, 0.0];
    close("gradient", &g, &want, 0.0);
    Ok(())
}

/// Negative indices count from the end (`padding_idx=-1` is row 3 of 4); outside the table is
/// an error ("Padding_idx must be within num_embeddings").
#[test]
fn embedding_padding_idx_is_checked_like_pytorch() -> Result<()> {
    let e = Embedding::new(4, 3, 1.0, &mut Rng::new(2))?.with_padding_idx(-1)?;
    assert_eq!(e.padding_idx, Some(3));
    assert_eq!(e.weight.to_vec_f32()?[9..], [0.0; 3]);
    for bad in [4, -5] {
        let err = Embedding::new(4, 3, 1.0, &mut Rng::new(2))?
            .with_padding_idx(bad)
            .err()
            .expect("an error");
        assert!(err.to_string().contains("padding_idx"), "{err}");
    }
    Ok(())
}

/// `nn.GELU()` is the exact form; `nn.GELU(approximate='tanh')` the approximation (PyTorch's
/// float64 values; the two differ by up to 4e-4 here).
#[test]
fn gelu_is_exact_by_default_and_tanh_on_request() -> Result<()> {
    let xs = [-3.0f32, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0];
    let x = Tensor::from_slice(&xs, &[7], Device::Cpu)?;
    let exact = [
        -0.00404969409489031,
        -0.15865525393145702,
        -0.15426876936299344,
        0.0,
        0.34573123063700656,
        0.841344746068543,
        2.99595030590511,
    ];
    let tanh = [
        -0.0036373920817729943,
        -0.15880800939172324,
        -0.15428599017485606,
        0.0,
        0.34571400982514394,
        0.8411919906082768,
        2.996362607918227,
    ];
    close(
        "GELU()",
        &Gelu::new().forward(&x)?.to_vec_f32()?,
        &exact,
        1e-6,
    );
    close(
        "GELU::default()",
        &Gelu::default().forward(&x)?.to_vec_f32()?,
        &exact,
        1e-6,
    );
    close(
        "GELU(tanh)",
        &Gelu::tanh().forward(&x)?.to_vec_f32()?,
        &tanh,
        1e-6,
    );
    Ok(())
}

/// PyTorch: "Expected more than 1 value per channel when training, got input size [1, 3, 1, 1]".
/// Two values per channel train; one value in evaluation mode is fine. The fused
/// convolution + BatchNorm training op refuses it too.
#[test]
fn batch_norm_refuses_one_value_per_channel_in_training() -> Result<()> {
    let bn = BatchNorm2d::new(3)?;
    let one = Tensor::ones(&[1, 3, 1, 1], DType::F32, Device::Cpu)?;
    let refused = |r: Result<Tensor>| {
        let err = r.expect_err("an error").to_string();
        assert!(err.contains("more than 1 value per channel"), "{err}");
    };
    refused(bn.forward(&one));
    let conv = Conv2d::new(2, 3, 1, Conv2dParams::default(), false, &mut Rng::new(3))?;
    let fused = ConvBn::new(conv, Some(BatchNorm2d::new(3)?))?.fused_training(true);
    let x = Tensor::ones(&[1, 2, 1, 1], DType::F32, Device::Cpu)?.to_var()?;
    refused(fused.forward(&x));
    let two = Tensor::from_slice(
        &[1.0f32, 2.0, 3.0, 3.0, 2.0, 1.0],
        &[2, 3, 1, 1],
        Device::Cpu,
    )?;
    assert_eq!(bn.forward(&two)?.shape(), [2, 3, 1, 1]);
    bn.set_training(false);
    assert_eq!(bn.forward(&one)?.shape(), [1, 3, 1, 1]);
    Ok(())
}

/// Per-axis pooling with `ceil_mode` (issue 14): `nn.MaxPool2d((3, 2), (2, 1), (1, 0),
/// ceil_mode=True)` and `nn.AvgPool2d((2, 3), (2, 2), (1, 1), ceil_mode=True,
/// count_include_pad=False / True)` on a 5×5 input (0.5·i − 3, one value −7), values printed
/// by PyTorch 2.15; and a Conv2d with a 3×1 kernel.
#[test]
fn per_axis_pooling_and_ceil_mode_match_pytorch() -> Result<()> {
    let mut v: Vec<f32> = (0..25).map(|i| i as f32 * 0.5 - 3.0).collect();
    v[2 * 5 + 3] = -7.0;
    let x = Tensor::from_slice(&v, &[1, 1, 5, 5], Device::Cpu)?;
    let max = MaxPool2d(Pool2dParams {
        stride: (2, 1).into(),
        padding: (1, 0).into(),
        ceil_mode: true,
        ..Pool2dParams::new((3, 2))
    });
    let y = max.forward(&x)?;
    assert_eq!(y.shape(), [1, 1, 3, 4]);
    let want = [0.0, 0.5, 1.0, 1.5, 5.0, 5.5, 6.0, 6.5, 7.5, 8.0, 8.5, 9.0];
    close("max_pool2d", &y.to_vec_f32()?, &want, 0.0);
    let avg = |count_include_pad| {
        AvgPool2d(Pool2dParams {
            stride: 2.into(),
            padding: 1.into(),
            ceil_mode: true,
            count_include_pad,
            ..Pool2dParams::new((2, 3))
        })
    };
    let y = avg(false).forward(&x)?;
    assert_eq!(y.shape(), [1, 1, 3, 3]);
    let want = [-2.75, -2.0, -1.25, 1.0, 0.0, -0.125, 6.0, 6.75, 7.5];
    close("avg_pool2d", &y.to_vec_f32()?, &want, 1e-6);
    let want = [
        -0.9166666666666666,
        -1.0,
        -0.4166666666666667,
        0.6666666666666666,
        0.0,
        -0.08333333333333333,
        4.0,
        6.75,
        5.0,
    ];
    close(
        "avg_pool2d count_include_pad",
        &avg(true).forward(&x)?.to_vec_f32()?,
        &want,
        1e-6,
    );
    // The square shorthand is the square window.
    assert_eq!(MaxPool2d::new(2, 2).0, Pool2dParams::square(2, 2, 0));
    assert_eq!(AvgPool2d::new((2, 1), 1).0.kernel, Hw::new(2, 1));
    let conv = Conv2d::new(
        1,
        2,
        (3, 1),
        Conv2dParams::default(),
        true,
        &mut Rng::new(1),
    )?;
    assert_eq!(conv.weight.shape(), [2, 1, 3, 1]);
    assert_eq!(conv.forward(&x)?.shape(), [1, 2, 3, 5]);
    assert!(Conv2d::new(
        1,
        2,
        (3, 0),
        Conv2dParams::default(),
        true,
        &mut Rng::new(1)
    )
    .is_err());
    Ok(())
}
