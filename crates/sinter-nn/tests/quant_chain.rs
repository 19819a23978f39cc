//! Int8 convolution chains (`quant::chain`): u8 activations between the layers, pooled in u8,
//! equal bit for bit to running each int8 layer and the f32 max pooling one after the other;
//! and the NaN an int8 layer cannot carry, refused on both routes.

use std::sync::Arc;

use sinter_core::{no_grad, Conv2dParams, DType, Device, Hw, Pool2dParams, Rng, Tensor};
use sinter_cpu::int8::QParams;
use sinter_nn::quant::chain::{self, Stage};
use sinter_nn::quant::{Activation, QuantizedConv2d};
use sinter_nn::Conv2d;

fn int8_conv(
    cin: usize,
    cout: usize,
    p: Conv2dParams,
    range: (f32, f32),
    rng: &mut Rng,
) -> Arc<QuantizedConv2d> {
    let conv = Conv2d::new(cin, cout, 3, p, true, rng).unwrap();
    let input = QParams::from_range(range.0, range.1).unwrap();
    Arc::new(QuantizedConv2d::from_f32(&conv.weight, conv.bias.as_ref(), p, input).unwrap())
}

/// The layer-by-layer route: each convolution's `forward_with`, then `Tensor::max_pool2d`.
fn one_by_one(
    x: &Tensor,
    stages: &[(Arc<QuantizedConv2d>, Activation, Option<Pool2dParams>)],
) -> Tensor {
    let mut h = x.clone();
    for (conv, act, pool) in stages {
        h = conv.forward_with(&h, *act).unwrap();
        if let Some(p) = pool {
            h = h.max_pool2d(*p).unwrap();
        }
    }
    h
}

fn chained(
    x: &Tensor,
    stages: &[(Arc<QuantizedConv2d>, Activation, Option<Pool2dParams>)],
) -> sinter_core::Result<Tensor> {
    let stages: Vec<Stage> = stages
        .iter()
        .map(|(conv, activation, pool)| Stage {
            conv: conv.clone(),
            activation: *activation,
            pool: *pool,
        })
        .collect();
    chain::run(x, &stages)
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn a_u8_chain_equals_the_layer_by_layer_route_bit_for_bit() {
    let mut rng = Rng::new(11);
    let same = Conv2dParams::square(1, 1, 1, 1);
    let strided = Conv2dParams {
        stride: (2, 1).into(),
        padding: 1.into(),
        ..Default::default()
    };
    let pool2 = Pool2dParams::square(2, 2, 0);
    // 3×3 stride 2 padding 1 with ceil mode: windows in the padding and past the edge.
    let pool3 = Pool2dParams {
        ceil_mode: true,
        ..Pool2dParams::square(3, 2, 1)
    };
    let dilated = Pool2dParams {
        dilation: Hw::new(1, 2),
        ..Pool2dParams::square(2, 1, 0)
    };
    // The calibrated ranges are narrower than the data in places, so the requantization
    // clamps at both ends (the bytes 0 and 255 meet the pooling too).
    let (c1, c2, c3) = (
        int8_conv(3, 8, same, (-1.5, 1.5), &mut rng),
        int8_conv(8, 12, strided, (0.0, 0.6), &mut rng),
        int8_conv(12, 5, same, (-0.2, 0.9), &mut rng),
    );
    let relu = Activation::Relu;
    let none = Activation::None;
    let cases = [
        // The CNN's shape: conv → ReLU → pool, twice.
        vec![
            (c1.clone(), relu, Some(pool2)),
            (c2.clone(), relu, Some(pool2)),
        ],
        // No activation before a pool, a padded ceil-mode pool, and a last stage without one.
        vec![
            (c1.clone(), none, Some(pool3)),
            (c2.clone(), relu, None),
            (c3.clone(), none, None),
        ],
        vec![(c1.clone(), relu, None), (c2.clone(), none, Some(dilated))],
        vec![(c1.clone(), relu, Some(pool2))],
    ];
    let _g = no_grad();
    for (i, stages) in cases.iter().enumerate() {
        for shape in [[4, 3, 12, 10], [1, 3, 9, 7]] {
            let x = Tensor::randn(&shape, 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
            let want = one_by_one(&x, stages);
            let got = chained(&x, stages).unwrap();
            assert_eq!(got.shape(), want.shape(), "case {i} {shape:?}");
            assert_eq!(bits(&got), bits(&want), "case {i} {shape:?}");
        }
    }
}

#[test]
fn nan_is_refused_by_the_chain_and_the_single_layer() {
    let mut rng = Rng::new(3);
    let conv = int8_conv(
        1,
        4,
        Conv2dParams::square(1, 1, 1, 1),
        (-1.0, 1.0),
        &mut rng,
    );
    let mut v = vec![0.5f32; 2 * 36];
    v[40] = f32::NAN;
    let x = Tensor::from_vec(v, &[2, 1, 6, 6], Device::Cpu).unwrap();
    let _g = no_grad();
    let e = conv
        .forward_with(&x, Activation::Relu)
        .unwrap_err()
        .to_string();
    assert!(e.contains("NaN") && e.contains("index 40"), "{e}");
    let stages = [(conv, Activation::Relu, Some(Pool2dParams::square(2, 2, 0)))];
    let e = chained(&x, &stages).unwrap_err().to_string();
    assert!(e.contains("NaN") && e.contains("index 40"), "{e}");
}

#[test]
fn a_chain_checks_its_shapes() {
    let mut rng = Rng::new(4);
    let p = Conv2dParams::square(1, 1, 1, 1);
    let (a, b) = (
        int8_conv(2, 4, p, (-1.0, 1.0), &mut rng),
        int8_conv(3, 4, p, (-1.0, 1.0), &mut rng),
    );
    let x = Tensor::zeros(&[1, 2, 5, 5], DType::F32, Device::Cpu).unwrap();
    let _g = no_grad();
    let relu = Activation::Relu;
    let e = chained(&x, &[(a.clone(), relu, None), (b, relu, None)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("stage 1 expects 3 input channels, got 4"), "{e}");
    // A pooling sinter-core refuses (padding above half the kernel) is refused here too.
    let bad = Pool2dParams::square(2, 2, 2);
    let e = chained(&x, &[(a, relu, Some(bad))])
        .unwrap_err()
        .to_string();
    assert!(e.contains("padding"), "{e}");
}

/// On a CUDA device (the emulated one without a GPU) a chain runs its stages in turn through
/// the convolutions' device op and gives the CPU chain's output bit for bit.
#[test]
fn a_chain_on_the_cuda_device_equals_the_cpu_chain() {
    let emulated = sinter_core::cuda::runtime::enable_emulation(1);
    if !sinter_core::cuda::is_available() {
        let required = std::env::var("SINTER_REQUIRE_EMU").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "SINTER_REQUIRE_EMU=1 but no emulated CUDA device: {emulated:?}"
        );
        eprintln!("skipped: no CUDA device and no emulated one ({emulated:?})");
        return;
    }
    let dev = Device::Cuda(0);
    let mut rng = Rng::new(21);
    let same = Conv2dParams::square(1, 1, 1, 1);
    let stages = vec![
        (
            int8_conv(3, 8, same, (-1.5, 1.5), &mut rng),
            Activation::Relu,
            Some(Pool2dParams::square(2, 2, 0)),
        ),
        (
            int8_conv(8, 6, same, (0.0, 0.8), &mut rng),
            Activation::Relu,
            Some(Pool2dParams::square(2, 2, 0)),
        ),
    ];
    let _g = no_grad();
    let x = Tensor::randn(&[3, 3, 12, 12], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
    let on_cpu = chained(&x, &stages).unwrap();
    let on_dev = chained(&x.to_device(dev).unwrap(), &stages).unwrap();
    assert_eq!((on_dev.device(), on_dev.shape()), (dev, on_cpu.shape()));
    assert_eq!(bits(&on_dev), bits(&on_cpu));
}
