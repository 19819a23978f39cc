//! Int8 quantization of every model in the zoo: the walk reaches each Linear, Conv2d and
//! Embedding (GPT's and BERT's tied heads included), the models still run (GPT's KV-cache
//! generation picks the same tokens as recomputation), and export → import reproduces a
//! quantized model exactly. Accuracy against f32 on trained models is checked end to end by
//! the CLI tests (`crates/sinter/tests/quantize_cli.rs`).

use std::collections::HashMap;

use sinter_core::{no_grad, DType, Device, Rng, Tensor};
use sinter_models::{Bert, BertConfig, Decoder, DecoderConfig, LeNet, ResNet18};
use sinter_nn::module::shared_rng;
use sinter_nn::quant::{self, StateTensor};
use sinter_nn::{MaxPool2d, Module};

fn kinds(report: &quant::QuantizeReport, kind: &str) -> usize {
    report.int8.iter().filter(|(_, k)| *k == kind).count()
}

fn no_calibration(_: &dyn Module) -> sinter_core::Result<()> {
    panic!("a model without convolutions needs no calibration")
}

fn images(shape: &[usize], seed: u64) -> Tensor {
    Tensor::randn(
        shape,
        0.0,
        1.0,
        &mut Rng::new(seed),
        DType::F32,
        Device::Cpu,
    )
    .unwrap()
}

fn round_trip(a: &dyn Module, b: &dyn Module) {
    let state: HashMap<String, StateTensor> = quant::export(a).unwrap().into_iter().collect();
    quant::import(b, &state).unwrap();
}

#[test]
fn gpt_quantizes_every_projection_and_the_tied_head_and_still_generates() {
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: 24,
        vocab_size: 40,
        dropout: 0.0,
        ..Default::default()
    };
    let m = Decoder::new(cfg.clone(), &mut Rng::new(1), &shared_rng(1)).unwrap();
    m.set_training(false);
    let report = quant::quantize(&m, &mut no_calibration).unwrap();
    assert_eq!(kinds(&report, "linear"), 4 * cfg.n_layer);
    assert_eq!(kinds(&report, "embedding"), 2); // wte (tied head) and wpe
    assert!(report.kept_f32.is_empty());
    let prompt = [1i64, 5, 7];
    let mut rng = Rng::new(0);
    let cached = m.generate(&prompt, 10, 0.0, 0, &mut rng).unwrap();
    let uncached = m.generate_uncached(&prompt, 10, 0.0, 0, &mut rng).unwrap();
    assert_eq!(
        cached, uncached,
        "KV cache and recomputation pick the same int8 tokens"
    );

    let b = Decoder::new(cfg, &mut Rng::new(2), &shared_rng(2)).unwrap();
    round_trip(&m, &b);
    let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9], &[2, 3], Device::Cpu).unwrap();
    let _g = no_grad();
    assert_eq!(
        m.forward(&ids).unwrap().to_vec_f32().unwrap(),
        b.forward(&ids).unwrap().to_vec_f32().unwrap()
    );
}

#[test]
fn bert_quantizes_its_encoder_and_tied_decoder() {
    let cfg = BertConfig {
        vocab_size: 50,
        hidden: 32,
        n_layer: 2,
        n_head: 2,
        intermediate: 64,
        max_position: 16,
        type_vocab_size: 2,
        dropout: 0.0,
        attention_dropout: 0.0,
        hidden_act: sinter_models::HiddenAct::Gelu,
        pad_token_id: None,
        layer_norm_eps: 1e-12,
    };
    let m = Bert::new(cfg.clone(), &mut Rng::new(3), &shared_rng(3)).unwrap();
    m.set_training(false);
    let report = quant::quantize(&m, &mut no_calibration).unwrap();
    // Per layer the packed q/k/v, attention output, intermediate, output; and the head's
    // dense.
    assert_eq!(kinds(&report, "linear"), 4 * cfg.n_layer + 1);
    assert_eq!(kinds(&report, "embedding"), 3);
    let ids = Tensor::from_slice(&[3i64, 1, 4, 1, 5, 9], &[2, 3], Device::Cpu).unwrap();
    let _g = no_grad();
    let logits = m.forward(&ids).unwrap();
    assert_eq!(logits.shape(), &[2, 3, cfg.vocab_size]);
    assert!(logits.to_vec_f32().unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn cnns_calibrate_each_convolution_and_round_trip() {
    let m = LeNet::new(1, 8, 8, 10, &mut Rng::new(4)).unwrap();
    let mut calls = 0;
    let report = quant::quantize(&m, &mut |model: &dyn Module| {
        calls += 1;
        let _g = no_grad();
        model.forward(&images(&[16, 1, 8, 8], 5))?;
        Ok(())
    })
    .unwrap();
    assert_eq!(calls, 1);
    assert_eq!((kinds(&report, "conv2d"), kinds(&report, "linear")), (2, 2));
    let b = LeNet::new(1, 8, 8, 10, &mut Rng::new(6)).unwrap();
    round_trip(&m, &b);
    let x = images(&[3, 1, 8, 8], 7);
    let _g = no_grad();
    assert_eq!(
        m.forward(&x).unwrap().to_vec_f32().unwrap(),
        b.forward(&x).unwrap().to_vec_f32().unwrap()
    );
}

/// Quantized, LeNet runs its two conv stages as one u8 chain (`quant::chain`): the same logits,
/// bit for bit, as its layers run one after the other, with and without a BatchNorm folded
/// into each int8 convolution.
#[test]
fn quantized_lenet_equals_its_layers_run_one_by_one() {
    for batch_norm in [false, true] {
        let m = LeNet::with_options(1, 8, 8, 10, batch_norm, false, &mut Rng::new(4)).unwrap();
        if batch_norm {
            m.set_training(true);
            for seed in 0..3 {
                m.forward(&images(&[16, 1, 8, 8], 20 + seed)).unwrap();
            }
            m.set_training(false);
        }
        quant::quantize(&m, &mut |model: &dyn Module| {
            let _g = no_grad();
            model.forward(&images(&[16, 1, 8, 8], 5)).map(|_| ())
        })
        .unwrap();
        let folds = sinter_nn::fold::fold_for_inference(&m).unwrap();
        assert_eq!(folds, if batch_norm { 2 } else { 0 });
        let _g = no_grad();
        let x = images(&[5, 1, 8, 8], 7);
        let pool = MaxPool2d::new(2, 2);
        let h = pool.forward(&m.conv1.forward_relu(&x).unwrap()).unwrap();
        let h = pool.forward(&m.conv2.forward_relu(&h).unwrap()).unwrap();
        let h = m.fc1.forward(&h.flatten_from(1).unwrap()).unwrap();
        let want = m.fc2.forward(&h.relu().unwrap()).unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.to_vec_f32()
                .unwrap()
                .iter()
                .map(|v| v.to_bits())
                .collect()
        };
        assert_eq!(
            bits(&m.forward(&x).unwrap()),
            bits(&want),
            "batch norm {batch_norm}"
        );
    }
}

/// max |a − b| / max |b|.
fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn resnet18_folds_every_batch_norm_into_its_int8_convolution() {
    let _g = no_grad();
    let r = ResNet18::new(3, 10, &mut Rng::new(8)).unwrap();
    // BatchNorm statistics of real activations (a random network's defaults, mean 0 and
    // variance 1, let activations grow layer after layer until the logits are a cancellation
    // of large terms that any rounding difference upsets).
    r.set_training(true);
    for seed in 0..10 {
        r.forward(&images(&[8, 3, 16, 16], 100 + seed)).unwrap();
    }
    r.set_training(false);
    let x = images(&[4, 3, 16, 16], 10);
    let f32_out = r.forward(&x).unwrap().to_vec_f32().unwrap();
    let report = quant::quantize(&r, &mut |model: &dyn Module| {
        let _g = no_grad();
        model.forward(&images(&[8, 3, 16, 16], 9)).map(|_| ())
    })
    .unwrap();
    // Stem, 16 block convs, 3 projection shortcuts; one Linear.
    assert_eq!(
        (kinds(&report, "conv2d"), kinds(&report, "linear")),
        (20, 1)
    );
    let y = r.forward(&x).unwrap();
    assert_eq!(y.shape(), &[4, 10]);
    let unfolded = y.to_vec_f32().unwrap();
    assert_eq!(sinter_nn::fold::fold_for_inference(&r).unwrap(), 20);
    let folded = r.forward(&x).unwrap().to_vec_f32().unwrap();
    // Each folded layer equals its unfolded int8 layer to f32 rounding (sinter-nn's
    // conv_bn test); over 20 layers a value that rounding moves across a quantization step
    // boundary changes the next layer's u8 input by one step, so the whole model is compared
    // with the int8 error itself: folding must not add to it, and it must stay int8 (an f32
    // fold would bring the error to ~0).
    let (q, f) = (rel_err(&unfolded, &f32_out), rel_err(&folded, &f32_out));
    assert!(q > 1e-4, "the int8 path must be the one running ({q:e})");
    assert!(
        f > 1e-4 && f <= 1.5 * q,
        "folded {f:e} vs unfolded {q:e} error against f32"
    );
}
