//! A quantized model on the CUDA device (the emulated one when there is no GPU: the kernel
//! emulator runs qmatmul.cu) gives the CPU int8 run's outputs: the layers call the one qmatmul
//! op on both devices, which computes the same integers and the same f32 operations in the
//! same order there. So outputs outside GELU are equal bit for bit — through a whole model,
//! since each layer then gets the same input on both devices. GELU's tanh and erf are each
//! device's own (a few ulps apart): those outputs are compared to 1e-6 relative.

use sinter_core::{no_grad, Conv2dParams, DType, Device, Pool2dParams, Rng, Tensor};
use sinter_nn::device::move_module;
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::quant::{self, Activation, QuantizedLinear};
use sinter_nn::{Conv2d, Embedding, Linear, Module};

/// The CUDA device: a real GPU when this process uses one, else the emulated one (None, test
/// skipped, when neither can run here; SINTER_REQUIRE_EMU=1 makes that a failure).
fn cuda() -> Option<Device> {
    let emulated = sinter_core::cuda::runtime::enable_emulation(1);
    if sinter_core::cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    if std::env::var("SINTER_REQUIRE_EMU").is_ok_and(|v| v == "1") {
        panic!("SINTER_REQUIRE_EMU=1 but no emulated CUDA device: {emulated:?}");
    }
    eprintln!("skipped: no CUDA device and no emulated one ({emulated:?})");
    None
}

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.to_vec_f32()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// images → conv1 → ReLU → max pool → conv2 (strided) → ReLU → fc: int8 convolutions with
/// calibrated static input mappings, then an int8 Linear.
struct Cnn {
    conv1: Conv2d,
    conv2: Conv2d,
    fc: Linear,
}

impl Cnn {
    fn new() -> Cnn {
        let mut rng = Rng::new(11);
        let same = Conv2dParams {
            padding: 1.into(),
            ..Default::default()
        };
        let strided = Conv2dParams {
            stride: 2.into(),
            ..Default::default()
        };
        Cnn {
            conv1: Conv2d::new(3, 8, 3, same, true, &mut rng).unwrap(),
            conv2: Conv2d::new(8, 6, 3, strided, false, &mut rng).unwrap(),
            fc: Linear::new(6 * 2 * 2, 5, true, &mut rng).unwrap(),
        }
    }
}

impl Module for Cnn {
    fn forward(&self, x: &Tensor) -> sinter_core::Result<Tensor> {
        let h = self.conv1.forward(x)?.relu()?;
        let h = h.max_pool2d(Pool2dParams::new(2))?;
        let h = self.conv2.forward(&h)?.relu()?;
        self.fc.forward(&h.flatten_from(1)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(&join(prefix, "conv1"), out);
        self.conv2.collect(&join(prefix, "conv2"), out);
        self.fc.collect(&join(prefix, "fc"), out);
    }
}

#[test]
fn a_quantized_cnn_on_cuda_gives_the_cpu_int8_outputs_bit_for_bit() {
    let Some(dev) = cuda() else { return };
    let _g = no_grad();
    let mut rng = Rng::new(12);
    let model = Cnn::new();
    let calib = randn(&[6, 3, 10, 10], &mut rng);
    let report = quant::quantize(&model, &mut |m| m.forward(&calib).map(drop)).unwrap();
    assert_eq!(report.int8.len(), 3, "{:?}", report.int8);
    let x = randn(&[4, 3, 10, 10], &mut rng);
    let on_cpu = model.forward(&x).unwrap();
    move_module(&model, dev).unwrap();
    let on_dev = model.forward(&x.to_device(dev).unwrap()).unwrap();
    assert_eq!((on_dev.device(), on_dev.shape()), (dev, &[4usize, 5][..]));
    assert_eq!(bits(&on_dev), bits(&on_cpu), "logits on {dev} vs the CPU");
    // NaN is refused on the device as on the CPU, naming where it is.
    let mut bad = x.to_vec_f32().unwrap();
    bad[40] = f32::NAN;
    let bad = Tensor::from_vec(bad, &[4, 3, 10, 10], dev).unwrap();
    let e = model.forward(&bad).unwrap_err().to_string();
    assert!(e.contains("NaN (first at flat index 40)"), "{e}");
}

/// ids → embedding → fc1 → ReLU → fc2 → ReLU → the tied head (the table's int8 GEMM).
struct Lm {
    emb: Embedding,
    fc1: Linear,
    fc2: Linear,
}

impl Lm {
    fn new() -> Lm {
        let mut rng = Rng::new(5);
        Lm {
            emb: Embedding::new(37, 24, 1.0, &mut rng).unwrap(),
            fc1: Linear::new(24, 70, true, &mut rng).unwrap(),
            fc2: Linear::new(70, 24, true, &mut rng).unwrap(),
        }
    }
}

impl Module for Lm {
    fn forward(&self, ids: &Tensor) -> sinter_core::Result<Tensor> {
        let h = self.fc1.forward(&self.emb.forward(ids)?)?.relu()?;
        self.emb.linear(&self.fc2.forward(&h)?.relu()?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.emb.collect(&join(prefix, "emb"), out);
        self.fc1.collect(&join(prefix, "fc1"), out);
        self.fc2.collect(&join(prefix, "fc2"), out);
    }
}

#[test]
fn a_quantized_model_on_cuda_gives_the_cpu_int8_outputs_bit_for_bit() {
    let Some(dev) = cuda() else { return };
    let _g = no_grad();
    let model = Lm::new();
    let report = quant::quantize(&model, &mut |_| Ok(())).unwrap();
    assert_eq!(report.int8.len(), 3, "{:?}", report.int8);
    let ids = Tensor::from_vec(vec![0i64, 36, 5, 5, 17, 2, 9, 30], &[2, 4], Device::Cpu).unwrap();
    let on_cpu = model.forward(&ids).unwrap();
    move_module(&model, dev).unwrap();
    let on_dev = model.forward(&ids.to_device(dev).unwrap()).unwrap();
    assert_eq!(on_dev.device(), dev);
    assert_eq!(on_dev.shape(), [2, 4, 37]);
    assert_eq!(bits(&on_dev), bits(&on_cpu), "logits on {dev} vs the CPU");
    // And back: the CPU run is unchanged by the device run.
    move_module(&model, Device::Cpu).unwrap();
    assert_eq!(bits(&model.forward(&ids).unwrap()), bits(&on_cpu));
}

#[test]
fn every_epilogue_term_count_and_plane_count_agrees_across_devices() {
    let Some(dev) = cuda() else { return };
    let _g = no_grad();
    let mut rng = Rng::new(8);
    let (k, n) = (45, 70);
    let lin = Linear::new(k, n, true, &mut rng).unwrap();
    let one = QuantizedLinear::from_f32(&lin.weight, lin.bias.as_ref()).unwrap();
    let two = QuantizedLinear::new(
        quant::Int8Weight::from_f32(&lin.weight)
            .unwrap()
            .with_residual_of(&lin.weight)
            .unwrap(),
        lin.bias.as_ref(),
    )
    .unwrap();
    let x = randn(&[3, 5, k], &mut rng);
    let xd = x.to_device(dev).unwrap();
    for (layer, planes) in [(&one, 1), (&two, 2)] {
        for terms in [quant::ActTerms::One, quant::ActTerms::Two] {
            let layer = layer.clone().with_act_terms(terms);
            for act in [
                Activation::None,
                Activation::Relu,
                Activation::GeluTanh,
                Activation::GeluErf,
            ] {
                let what = format!("{planes} plane(s), {terms:?}, {act:?}");
                let c = layer.forward_with(&x, act).unwrap();
                let d = layer.forward_with(&xd, act).unwrap();
                assert_eq!((d.device(), d.shape()), (dev, c.shape()), "{what}");
                if matches!(act, Activation::None | Activation::Relu) {
                    assert_eq!(bits(&d), bits(&c), "{what}");
                    continue;
                }
                let (c, d) = (c.to_vec_f32().unwrap(), d.to_vec_f32().unwrap());
                for (i, (a, b)) in c.iter().zip(&d).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-6 * a.abs().max(1.0),
                        "{what}[{i}]: {a} vs {b}"
                    );
                }
            }
        }
    }
}
