use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::{build, DataShape, Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

#[test]
fn gpt2_preset_has_gpt2_small_parameter_count() {
    // Counted without building 124M random numbers: embeddings + 12 blocks + ln_f, head tied.
    let c = DecoderConfig::preset("gpt2").unwrap();
    let (l, d, v, t) = (c.n_layer, c.n_embd, c.vocab_size, c.block_size);
    let per_block =
        2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
    let total = v * d + t * d + l * per_block + 2 * d;
    assert_eq!(total, 124_439_808);
}

#[test]
fn gpt_names_shapes_and_causality() {
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 16,
        block_size: 8,
        vocab_size: 11,
        dropout: 0.0,
        ..Default::default()
    };
    let m = Decoder::new(cfg, &mut Rng::new(0), &shared_rng(1)).unwrap();
    let names: Vec<String> = m.parameters().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.contains(&"blocks.0.attn.qkv.weight".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"blocks.1.mlp.proj.bias".to_string()));
    assert!(names.contains(&"ln_f.weight".to_string()));
    let ids = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[1, 6], Device::Cpu).unwrap();
    let logits = m.forward(&ids).unwrap();
    assert_eq!(logits.shape(), &[1, 6, 11]);
    // Changing a later token must not change earlier positions' logits.
    let ids2 = Tensor::from_vec(vec![1i64, 2, 3, 9, 9, 9], &[1, 6], Device::Cpu).unwrap();
    let a = logits.to_vec_f32().unwrap();
    let b = m.forward(&ids2).unwrap().to_vec_f32().unwrap();
    assert_eq!(a[..3 * 11], b[..3 * 11]);
    assert_ne!(a[3 * 11..], b[3 * 11..]);
    // Too long a sequence is an error, not a panic.
    let long = Tensor::zeros(&[1, 9], DType::I64, Device::Cpu).unwrap();
    assert!(m.forward(&long).is_err());
}

#[test]
fn every_model_builds_and_runs_backward() {
    let img = DataShape {
        input: vec![3, 16, 16],
        classes: 10,
    };
    for name in ["mlp", "cnn", "resnet18"] {
        let m = build(name, &img, &mut Rng::new(0), &shared_rng(0)).unwrap();
        let x = Tensor::randn(
            &[2, 3, 16, 16],
            0.0,
            1.0,
            &mut Rng::new(1),
            DType::F32,
            Device::Cpu,
        )
        .unwrap();
        let y = Tensor::from_vec(vec![3i64, 7], &[2], Device::Cpu).unwrap();
        let loss = m.forward(&x).unwrap().cross_entropy(&y, -100).unwrap();
        loss.backward().unwrap();
        for (n, p) in m.parameters() {
            assert!(p.grad().is_some(), "{name}: {n} got no gradient");
        }
    }
    let err = build("vgg", &img, &mut Rng::new(0), &shared_rng(0))
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("resnet18") && err.contains("gpt-tiny"),
        "{err}"
    );
}

#[test]
fn resnet18_has_the_published_parameter_count() {
    // ResNet-18 for CIFAR-10 has 11,173,962 parameters.
    let m = build(
        "resnet18",
        &DataShape {
            input: vec![3, 32, 32],
            classes: 10,
        },
        &mut Rng::new(0),
        &shared_rng(0),
    )
    .unwrap();
    assert_eq!(m.num_parameters(), 11_173_962);
}
