//! Model-level Conv+BatchNorm fusion: the BatchNorm-folded digits CNN (`cnn-bn`) and ResNet-18
//! give the unfused models' outputs within 1e-5 relative, with BatchNorm statistics far from
//! their initial values; models trained with `fuse_conv_bn` give the same loss, gradients and
//! running statistics as unfused ones; checkpoint names do not depend on fusion.

use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::{build_with, DataShape, Model, ModelOptions};
use sinter_nn::fold::fold_for_inference;
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

fn model(name: &str, data: &DataShape, fuse: bool) -> Box<dyn Model> {
    let options = ModelOptions {
        fuse_conv_bn: fuse,
        ..Default::default()
    };
    build_with(name, data, &mut Rng::new(3), &shared_rng(3), options).unwrap()
}

fn shape(c: usize, hw: usize) -> DataShape {
    DataShape {
        input: vec![c, hw, hw],
        classes: 10,
    }
}

/// Gives every BatchNorm parameter and running statistic values far from 1 and 0.
fn randomise_batch_norms(m: &dyn Module, rng: &mut Rng) -> usize {
    let mut count = 0;
    for t in m.named_tensors() {
        let (layer, field) = t.name.rsplit_once('.').unwrap();
        let is_bn =
            layer.rsplit('.').next().unwrap().starts_with("bn") || layer.ends_with("shortcut.1");
        let range = if is_bn {
            match field {
                "weight" => (0.3, 2.0),
                "bias" | "running_mean" => (-1.0, 1.0),
                "running_var" => (0.1, 3.0),
                other => panic!("unexpected BatchNorm tensor {other}"),
            }
        } else {
            continue;
        };
        count += 1;
        let v = Tensor::rand_uniform(
            t.tensor.shape(),
            range.0,
            range.1,
            rng,
            DType::F32,
            Device::Cpu,
        )
        .unwrap();
        t.tensor.assign(&v).unwrap();
    }
    count
}

fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    let max = |t: &Tensor| {
        t.to_vec_f64()
            .unwrap()
            .iter()
            .fold(0.0f64, |m, v| m.max(v.abs()))
    };
    max(&a.sub(b).unwrap()) / max(b)
}

#[test]
fn folded_models_equal_unfused_models() {
    let mut rng = Rng::new(5);
    // (model, input channels, size, batch norms, folds)
    for (name, c, hw, folds) in [("cnn-bn", 1, 8, 2), ("resnet18", 3, 16, 20)] {
        let m = model(name, &shape(c, hw), false);
        assert_eq!(
            randomise_batch_norms(m.as_ref(), &mut rng),
            4 * folds,
            "{name}"
        );
        m.set_training(false);
        let x =
            Tensor::randn(&[3, c, hw, hw], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        let unfused = m.forward(&x).unwrap();
        assert_eq!(fold_for_inference(m.as_ref()).unwrap(), folds, "{name}");
        let folded = m.forward(&x).unwrap();
        let e = rel_err(&folded, &unfused);
        assert!(e <= 1e-5, "{name}: folded output relative error {e:e}");
        assert_ne!(
            folded.to_vec_f32().unwrap(),
            unfused.to_vec_f32().unwrap(),
            "{name}: not folded"
        );
        // Back to training: the separate layers again, with batch statistics.
        m.set_training(true);
        m.set_training(false);
        assert_eq!(
            m.forward(&x).unwrap().to_vec_f32().unwrap(),
            unfused.to_vec_f32().unwrap()
        );
    }
}

#[test]
fn fused_training_equals_unfused_training() {
    for (name, c, hw) in [("cnn-bn", 1, 8), ("resnet18", 3, 16)] {
        let data = shape(c, hw);
        let (plain, fused) = (model(name, &data, false), model(name, &data, true));
        let names = |m: &dyn Module| -> Vec<String> {
            m.named_tensors().into_iter().map(|t| t.name).collect()
        };
        assert_eq!(names(plain.as_ref()), names(fused.as_ref()));
        let mut rng = Rng::new(6);
        let x =
            Tensor::randn(&[4, c, hw, hw], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
        let y = Tensor::from_vec(vec![1i64, 4, 7, 9], &[4], Device::Cpu).unwrap();
        let mut losses = Vec::new();
        for m in [&plain, &fused] {
            let loss = m.forward(&x).unwrap().cross_entropy(&y, -100).unwrap();
            loss.backward().unwrap();
            losses.push(loss.to_scalar_f32().unwrap());
        }
        assert!(
            (losses[0] - losses[1]).abs() <= 1e-5 * losses[0].abs(),
            "{name}: {losses:?}"
        );
        for (a, b) in plain.named_tensors().iter().zip(fused.named_tensors()) {
            let (ga, gb) = match (a.tensor.grad(), b.tensor.grad()) {
                (Some(ga), Some(gb)) => (ga, gb),
                (None, None) => (a.tensor.clone(), b.tensor.clone()), // running statistics
                _ => panic!("{name}: {} has a gradient on one side only", a.name),
            };
            let e = rel_err(&gb, &ga);
            assert!(e <= 1e-4, "{name}: {} relative error {e:e}", a.name);
        }
    }
}

#[test]
fn resnet_checkpoint_names_are_the_separate_layers() {
    let m = model("resnet18", &shape(3, 8), true);
    let names: Vec<String> = m.named_tensors().into_iter().map(|t| t.name).collect();
    for n in [
        "conv1.weight",
        "bn1.running_var",
        "layer1.0.conv1.weight",
        "layer1.0.bn2.bias",
        "layer2.0.shortcut.0.weight",
        "layer2.0.shortcut.1.running_mean",
        "layer4.1.bn2.weight",
        "fc.bias",
    ] {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
    }
    // 20 convolutions, 20 BatchNorms of 4 tensors, the classifier's weight and bias.
    assert_eq!(names.len(), 20 + 4 * 20 + 2);
}

#[test]
fn fusion_needs_a_model_with_batch_norm() {
    let opts = ModelOptions {
        fuse_conv_bn: true,
        ..Default::default()
    };
    for name in ["cnn", "mlp", "gpt-tiny"] {
        let data = if name == "gpt-tiny" {
            DataShape {
                input: vec![8],
                classes: 256,
            }
        } else {
            shape(1, 8)
        };
        let e = build_with(name, &data, &mut Rng::new(0), &shared_rng(0), opts)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("cnn-bn") && e.contains(name), "{e}");
    }
}
