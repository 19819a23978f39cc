//! Int8 layers against their f32 originals, within the error their scales imply; the model
//! walk (every layer rewritten, the f32 weights no longer read, calibration of convolutions);
//! export and import; and the errors a user can run into.

use std::collections::HashMap;

use sinter_core::{no_grad, Conv2dParams, DType, Device, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::quant::{
    self, export, import, Activation, Int8Weight, LayerKind, QuantizedConv2d, QuantizedLinear,
    StateTensor,
};
use sinter_nn::{Conv2d, Embedding, Linear, Module};

fn randn(shape: &[usize], std: f64, rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, std, rng, DType::F32, Device::Cpu).unwrap()
}
fn vals(t: &Tensor) -> Vec<f32> {
    t.to_vec_f32().unwrap()
}

/// Half a quantization step of each row of x (dynamic u8: (max(x,0) − min(x,0))/255 / 2).
fn row_half_steps(x: &[f32], k: usize) -> Vec<f64> {
    x.chunks(k)
        .map(|r| {
            let hi = r.iter().fold(0f32, |m, &v| m.max(v));
            let lo = r.iter().fold(0f32, |m, &v| m.min(v));
            (hi - lo) as f64 / 255.0 / 2.0
        })
        .collect()
}

/// |Σ x·w − Σ x̂·ŵ| ≤ Σ |x|·δw + |w|·δx + δx·δw for one output.
fn dot_bound(x: &[f32], w: &[f32], dx: f64, dw: f64) -> f64 {
    x.iter()
        .zip(w)
        .map(|(&a, &b)| a.abs() as f64 * dw + b.abs() as f64 * dx + dx * dw)
        .sum::<f64>()
        // f32 rounding of the two sides' sums
        + 1e-6 * x.iter().zip(w).map(|(&a, &b)| (a * b).abs() as f64).sum::<f64>()
        + 1e-6
}

#[test]
fn quantized_linear_is_within_its_quantization_error() {
    let mut rng = Rng::new(1);
    let (rows, k, n) = (7, 45, 33);
    let lin = Linear::new(k, n, true, &mut rng).unwrap();
    let x = randn(&[rows, k], 1.5, &mut rng);
    let q = QuantizedLinear::from_f32(&lin.weight, lin.bias.as_ref()).unwrap();
    let (xv, wv) = (vals(&x), vals(&lin.weight));
    let wq = Int8Weight::from_f32(&lin.weight).unwrap();
    let _g = no_grad();
    let want = vals(&lin.forward(&x).unwrap());
    let got = vals(&q.forward(&x).unwrap());
    let gelu_got = vals(
        &q.forward_with(&x, quant::slot::Activation::GeluTanh)
            .unwrap(),
    );
    let gelu_want = vals(&lin.forward(&x).unwrap().gelu().unwrap());
    let dxs = row_half_steps(&xv, k);
    for i in 0..rows {
        for j in 0..n {
            let b = dot_bound(
                &xv[i * k..(i + 1) * k],
                &wv[j * k..(j + 1) * k],
                dxs[i],
                wq.scales()[j] as f64 / 2.0,
            );
            let e = (got[i * n + j] - want[i * n + j]).abs() as f64;
            assert!(e <= b, "({i}, {j}): error {e} above the bound {b}");
            // GELU's slope lies in [-0.13, 1.13], so the error grows by at most 1.13×.
            let eg = (gelu_got[i * n + j] - gelu_want[i * n + j]).abs() as f64;
            assert!(
                eg <= 1.13 * b + 1e-6,
                "GELU ({i}, {j}): error {eg} above {}",
                1.13 * b
            );
        }
    }
    // The errors are real quantization errors, not zero (the test would pass a no-op otherwise).
    assert!(got.iter().zip(&want).any(|(a, b)| a != b));
}

/// Square and per-axis geometries (kernel, stride, padding, dilation as (rows, columns)): each
/// output within the bound of its own patch's quantization error.
#[test]
fn quantized_conv_is_within_its_quantization_error() {
    let cases = [
        ((3, 3), (2, 2), (1, 1), (1, 1), (4, 3)),
        ((3, 2), (2, 1), (1, 0), (1, 2), (4, 4)),
        ((1, 3), (1, 3), (0, 1), (1, 1), (7, 2)),
    ];
    for (k, s, pd, d, (oh, ow)) in cases {
        let mut rng = Rng::new(2);
        let p = Conv2dParams {
            stride: s.into(),
            padding: pd.into(),
            dilation: d.into(),
            groups: 1,
        };
        let conv = Conv2d::new(3, 5, k, p, true, &mut rng).unwrap();
        let x = randn(&[2, 3, 7, 6], 1.0, &mut rng);
        let xv = vals(&x);
        let (lo, hi) = xv
            .iter()
            .fold((0f32, 0f32), |(a, b), &v| (a.min(v), b.max(v)));
        let input = sinter_cpu::int8::QParams::from_range(lo, hi).unwrap();
        let q = QuantizedConv2d::from_f32(&conv.weight, conv.bias.as_ref(), p, input).unwrap();
        let _g = no_grad();
        let want = vals(&conv.forward(&x).unwrap());
        let got_t = q.forward(&x).unwrap();
        assert_eq!(got_t.shape(), &[2, 5, oh, ow], "{p:?}");
        let got = vals(&got_t);
        // The ReLU of the fused epilogue is the ReLU of the output.
        let relu = vals(&q.forward_with(&x, Activation::Relu).unwrap());
        let want_relu: Vec<f32> = got.iter().map(|v| v.max(0.0)).collect();
        assert_eq!(relu, want_relu, "{p:?} relu");
        let (w, ws) = (
            vals(&conv.weight),
            Int8Weight::from_f32(&conv.weight).unwrap(),
        );
        let dx = input.scale as f64 / 2.0;
        for n in 0..2 {
            for o in 0..5 {
                for oy in 0..oh {
                    for ox in 0..ow {
                        // The patch inside the image (padding is an exact 0 on both sides).
                        let (mut xs, mut wsl) = (Vec::new(), Vec::new());
                        for c in 0..3 {
                            for ky in 0..k.0 {
                                for kx in 0..k.1 {
                                    let iy = (oy * s.0 + ky * d.0) as isize - pd.0 as isize;
                                    let ix = (ox * s.1 + kx * d.1) as isize - pd.1 as isize;
                                    if (0..7).contains(&iy) && (0..6).contains(&ix) {
                                        xs.push(
                                            xv[((n * 3 + c) * 7 + iy as usize) * 6 + ix as usize],
                                        );
                                        wsl.push(w[((o * 3 + c) * k.0 + ky) * k.1 + kx]);
                                    }
                                }
                            }
                        }
                        let b = dot_bound(&xs, &wsl, dx, ws.scales()[o] as f64 / 2.0);
                        let i = ((n * 5 + o) * oh + oy) * ow + ox;
                        let e = (got[i] - want[i]).abs() as f64;
                        assert!(
                            e <= b,
                            "{p:?} ({n}, {o}, {oy}, {ox}): error {e} above the bound {b}"
                        );
                    }
                }
            }
        }
    }
}

/// A small model with each kind of layer: conv → ReLU → flatten → Linear, plus an embedding
/// whose table is also used as a tied head.
struct Tiny {
    conv: Conv2d,
    fc: Linear,
    emb: Embedding,
}

impl Tiny {
    fn new(seed: u64) -> Tiny {
        let mut rng = Rng::new(seed);
        let p = Conv2dParams {
            padding: 1.into(),
            ..Default::default()
        };
        Tiny {
            conv: Conv2d::new(2, 4, 3, p, true, &mut rng).unwrap(),
            fc: Linear::new(4 * 5 * 5, 6, true, &mut rng).unwrap(),
            emb: Embedding::new(10, 6, 1.0, &mut rng).unwrap(),
        }
    }
    /// Image logits through the tied head, plus the embedding rows of some ids.
    fn run(&self, x: &Tensor, ids: &Tensor) -> (Vec<f32>, Vec<f32>) {
        let h = self.forward(x).unwrap();
        (
            vals(&self.emb.linear(&h).unwrap()),
            vals(&self.emb.forward(ids).unwrap()),
        )
    }
}

impl Module for Tiny {
    fn forward(&self, x: &Tensor) -> sinter_core::Result<Tensor> {
        self.fc
            .forward(&self.conv.forward(x)?.relu()?.flatten_from(1)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv.collect(&join(prefix, "conv"), out);
        self.fc.collect(&join(prefix, "fc"), out);
        self.emb.collect(&join(prefix, "emb"), out);
    }
}

fn inputs() -> (Tensor, Tensor, Vec<Tensor>) {
    let mut rng = Rng::new(9);
    let x = randn(&[3, 2, 5, 5], 1.0, &mut rng);
    let ids = Tensor::from_vec(vec![0i64, 9, 3, 3], &[2, 2], Device::Cpu).unwrap();
    let calib = (0..2)
        .map(|_| randn(&[4, 2, 5, 5], 1.0, &mut rng))
        .collect();
    (x, ids, calib)
}

/// Quantized with defaults, except that its small table gets a second plane (`auto` gives
/// one), so the walk and the file carry both kinds of weight.
fn quantize_tiny(m: &Tiny, calib: &[Tensor]) -> quant::QuantizeReport {
    let options = quant::QuantizeOptions {
        table_planes: quant::TablePlanes::Two,
        ..Default::default()
    };
    quant::quantize_with(m, &options, &mut |model: &dyn Module| {
        let _g = no_grad();
        for b in calib {
            model.forward(b)?;
        }
        Ok(())
    })
    .unwrap()
}

#[test]
fn the_walk_rewrites_every_layer_and_the_f32_weights_are_no_longer_read() {
    let (x, ids, calib) = inputs();
    let m = Tiny::new(3);
    let _g = no_grad();
    let (f32_logits, f32_rows) = m.run(&x, &ids);
    let report = quantize_tiny(&m, &calib);
    let kinds: Vec<_> = report.int8.iter().map(|(n, k)| (n.as_str(), *k)).collect();
    assert_eq!(
        kinds,
        [("conv", "conv2d"), ("fc", "linear"), ("emb", "embedding")]
    );
    assert!(report.int8_bytes * 3 < report.f32_bytes, "{report:?}");
    let (q_logits, q_rows) = m.run(&x, &ids);
    assert_ne!(
        q_logits, f32_logits,
        "the int8 path must be the one running"
    );
    // Embedding rows: within half a step of each row's scale.
    let wq = Int8Weight::from_f32(&m.emb.weight).unwrap();
    for (i, (a, b)) in q_rows.iter().zip(&f32_rows).enumerate() {
        let id = [0, 9, 3, 3][i / 6];
        assert!((a - b).abs() <= wq.scales()[id] / 2.0 + 1e-7);
    }
    // Zeroing every f32 weight changes nothing: no path reads them any more.
    for (_, h) in quant::layers(&m) {
        h.weight.assign(&h.weight.zeros_like().unwrap()).unwrap();
    }
    assert_eq!(m.run(&x, &ids), (q_logits, q_rows));
}

#[test]
fn export_then_import_reproduces_the_quantized_model_exactly() {
    let (x, ids, calib) = inputs();
    let a = Tiny::new(4);
    quantize_tiny(&a, &calib);
    let state = export(&a).unwrap();
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    for want in [
        "conv.weight.q",
        "conv.weight.scale",
        "conv.input.scale",
        "conv.input.zero_point",
        "conv.bias",
        "fc.weight.q",
        "fc.bias",
        "emb.weight.q",
        "emb.weight.scale",
        "emb.weight.q2",
        "emb.weight.scale2",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(!names.contains(&"fc.weight"));
    let map: HashMap<String, StateTensor> = state.into_iter().collect();
    let b = Tiny::new(5); // other random weights, replaced by the import
    import(&b, &map).unwrap();
    let _g = no_grad();
    assert_eq!(a.run(&x, &ids), b.run(&x, &ids));
    for (_, h) in quant::layers(&b) {
        assert!(h.slot.int8().is_some());
    }
    // A shape that does not fit is named with both shapes.
    let mut bad = map.clone();
    bad.insert(
        "fc.weight.q".into(),
        StateTensor::I8 {
            values: vec![0; 12],
            shape: vec![6, 2],
        },
    );
    let e = import(&Tiny::new(6), &bad).unwrap_err().to_string();
    assert!(
        e.contains("fc.weight.q") && e.contains("[6, 2]") && e.contains("[6, 100]"),
        "{e}"
    );
    // A Conv2d has no second plane, and a second plane needs its scales.
    let mut stray2 = map.clone();
    stray2.insert("conv.weight.q2".into(), map["conv.weight.q"].clone());
    let e = import(&Tiny::new(6), &stray2).unwrap_err().to_string();
    assert!(
        e.contains("conv.weight.q2") && e.contains("Conv2d has no second"),
        "{e}"
    );
    let mut no_scale2 = map.clone();
    no_scale2.remove("emb.weight.scale2");
    let e = import(&Tiny::new(6), &no_scale2).unwrap_err().to_string();
    assert!(e.contains("emb.weight.scale2"), "{e}");
    let mut missing = map.clone();
    missing.remove("conv.input.zero_point");
    let e = import(&Tiny::new(6), &missing).unwrap_err().to_string();
    assert!(e.contains("conv.input.zero_point"), "{e}");
    let mut stray = map;
    stray.insert(
        "head.weight.q".into(),
        StateTensor::I8 {
            values: vec![1],
            shape: vec![1, 1],
        },
    );
    let e = import(&Tiny::new(6), &stray).unwrap_err().to_string();
    assert!(e.contains("head.weight.q"), "{e}");
}

#[test]
fn misuse_gets_clear_errors() {
    let (x, _, calib) = inputs();
    let m = Tiny::new(7);
    // Calibration that never reaches the conv.
    let e = quant::quantize(&m, &mut |_m: &dyn Module| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("no batch reached conv"), "{e}");
    // A second plane for a convolution, or for a name that is no layer.
    for (planes, want) in [
        ("conv", "conv is a Conv2d"),
        ("head", "'head' names no layer"),
    ] {
        let options = quant::QuantizeOptions {
            two_planes: vec![planes.into()],
            ..Default::default()
        };
        let e = quant::quantize_with(&m, &options, &mut |model: &dyn Module| {
            calib.iter().try_for_each(|b| model.forward(b).map(|_| ()))
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains(want), "{e}");
    }
    assert!(
        quant::layers(&m)
            .iter()
            .all(|(_, h)| h.slot.int8().is_none()),
        "all or nothing"
    );
    quantize_tiny(&m, &calib);
    // A gradient-tracking input (training through an int8 layer) is refused.
    let xv = x.to_var().unwrap();
    let e = m.forward(&xv).unwrap_err().to_string();
    assert!(e.contains("no gradient") && e.contains("no_grad"), "{e}");
    // Wrong input width, ids outside the table.
    let _g = no_grad();
    let e =
        m.fc.forward(&Tensor::zeros(&[2, 7], DType::F32, Device::Cpu).unwrap())
            .unwrap_err()
            .to_string();
    assert!(e.contains("last dimension 100"), "{e}");
    let e = m
        .emb
        .forward(&Tensor::from_vec(vec![10i64], &[1], Device::Cpu).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("id 10") && e.contains("10 rows"), "{e}");
    // A NaN activation cannot be quantized.
    let nan = Tensor::from_vec(vec![f32::NAN; 100], &[1, 100], Device::Cpu).unwrap();
    assert!(m.fc.forward(&nan).is_err());
    assert!(matches!(quant::layers(&m)[0].1.kind, LayerKind::Conv2d(_)));
}

/// BatchNorm folded into an int8 convolution: the folded layer is int8 (its weight scales
/// absorb γ/√(σ²+ε), a negative γ included) and computes what the int8 convolution followed by
/// the f32 BatchNorm computes, to f32 rounding; `set_training(true)` unfolds.
#[test]
fn batch_norm_folds_into_an_int8_convolution() {
    let mut rng = Rng::new(5);
    let p = Conv2dParams::square(1, 1, 1, 1);
    let conv = Conv2d::new(3, 6, 3, p, false, &mut rng).unwrap();
    let bn = sinter_nn::BatchNorm2d::new(6).unwrap();
    let set = |t: &Tensor, v: &[f32]| t.assign(&Tensor::from_slice(v, &[6], Device::Cpu).unwrap());
    set(&bn.weight, &[1.5, -0.7, 0.3, 2.0, -1.2, 0.9]).unwrap();
    set(&bn.bias, &[0.1, -0.2, 0.3, 0.0, 0.5, -0.4]).unwrap();
    set(&bn.running_mean, &[0.2, -0.1, 0.0, 0.4, -0.3, 0.1]).unwrap();
    set(&bn.running_var, &[0.5, 1.2, 2.0, 0.8, 0.3, 1.0]).unwrap();
    let layer = sinter_nn::ConvBn::new(conv, Some(bn)).unwrap();
    layer.set_training(false);
    let x = randn(&[2, 3, 7, 7], 1.0, &mut rng);
    let _g = no_grad();
    let want_f32 = vals(&layer.forward(&x).unwrap());
    quant::quantize(&layer, &mut |m: &dyn Module| m.forward(&x).map(|_| ())).unwrap();
    let unfolded = vals(&layer.forward(&x).unwrap());
    assert_eq!(sinter_nn::fold::fold_for_inference(&layer).unwrap(), 1);
    let folded = layer.folded().expect("folded");
    assert!(
        folded.quant.int8().is_some(),
        "the folded convolution is int8"
    );
    let got = vals(&layer.forward(&x).unwrap());
    let scale = want_f32.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (&g, &u)) in got.iter().zip(&unfolded).enumerate() {
        assert!(
            (g - u).abs() <= 1e-5 * scale,
            "at {i}: folded {g} vs unfolded {u}"
        );
    }
    // And both are the f32 layer up to quantization error (a loose check that the int8 path,
    // not a stale copy, ran: the values differ from f32 but stay close).
    let err = got
        .iter()
        .zip(&want_f32)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        err > 0.0 && err < 0.05 * scale,
        "int8 vs f32: {err} of {scale}"
    );
    layer.set_training(true);
    assert!(layer.folded().is_none());
}

#[test]
fn layers_named_to_keep_stay_f32_and_round_trip_as_f32() {
    let (x, ids, calib) = inputs();
    let (a, f) = (Tiny::new(8), Tiny::new(8));
    let _g = no_grad();
    let (f32_logits, f32_rows) = f.run(&x, &ids);
    let keep = ["emb".to_string()];
    let report = quant::quantize_keeping(&a, &keep, &mut |model: &dyn Module| {
        calib.iter().try_for_each(|b| model.forward(b).map(|_| ()))
    })
    .unwrap();
    let int8: Vec<&str> = report.int8.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(int8, ["conv", "fc"]);
    assert_eq!(report.kept_f32.len(), 1);
    assert_eq!(report.kept_f32[0].0, "emb");
    // The kept table serves lookups exactly; the head's input still comes from int8 layers.
    let (q_logits, q_rows) = a.run(&x, &ids);
    assert_eq!(q_rows, f32_rows);
    assert_ne!(q_logits, f32_logits);
    // Its weight is exported as the f32 tensor and imported back as f32.
    let state = export(&a).unwrap();
    let names: Vec<&str> = state.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.contains(&"emb.weight") && !names.contains(&"emb.weight.q"));
    let b = Tiny::new(5);
    import(&b, &state.into_iter().collect()).unwrap();
    assert_eq!(b.run(&x, &ids), (q_logits, q_rows));
    assert!(b.emb.quant.int8().is_none() && b.fc.quant.int8().is_some());
    // A prefix keeps the layers below it only at a dot; a name matching nothing is an error
    // that lists the layers, and nothing was quantized.
    let c = Tiny::new(8);
    let e = quant::quantize_keeping(&c, &["em".into()], &mut |_m: &dyn Module| Ok(()))
        .unwrap_err()
        .to_string();
    assert!(e.contains("'em'") && e.contains("conv, fc, emb"), "{e}");
    assert!(quant::layers(&c)
        .iter()
        .all(|(_, h)| h.slot.int8().is_none()));
}

/// The default (Auto) on a weight too large to stay in cache (512 × 512 int8 values): two
/// terms for a call of a few rows (a generation step), one for more.
#[test]
fn auto_activation_terms_take_two_for_few_rows_of_a_large_weight() {
    let mut rng = Rng::new(6);
    let (k, n) = (512, 512);
    let lin = Linear::new(k, n, true, &mut rng).unwrap();
    let x = randn(&[6, k], 1.0, &mut rng);
    let few = x.narrow(0, 0, 2).unwrap();
    let _g = no_grad();
    quant::quantize(&lin, &mut |_| Ok(())).unwrap();
    let (auto_few, auto_all) = (
        vals(&lin.forward(&few).unwrap()),
        vals(&lin.forward(&x).unwrap()),
    );
    assert_eq!(quant::set_act_terms(&lin, quant::ActTerms::Two), 1);
    assert_eq!(auto_few, vals(&lin.forward(&few).unwrap()));
    assert_ne!(auto_all, vals(&lin.forward(&x).unwrap()));
    assert_eq!(quant::set_act_terms(&lin, quant::ActTerms::One), 1);
    assert_eq!(auto_all, vals(&lin.forward(&x).unwrap()));
    assert_ne!(auto_few, vals(&lin.forward(&few).unwrap()));
}

/// Two u8 terms per activation row (the default for calls of a few rows against a large
/// weight) leave only the weights' error: each output
/// within the bound of activations off by the second term's half step (about 1/255 of the
/// first's), where one term (`set_act_terms`) needs the first term's whole half step and
/// shows it.
#[test]
fn two_activation_terms_leave_only_the_weights_error() {
    let mut rng = Rng::new(4);
    let (rows, k, n) = (6, 70, 19);
    let lin = Linear::new(k, n, true, &mut rng).unwrap();
    let x = randn(&[rows, k], 1.5, &mut rng);
    let _g = no_grad();
    let want = vals(&lin.forward(&x).unwrap());
    quant::quantize(&lin, &mut |_| Ok(())).unwrap();
    // The default (Auto) on a weight this small (it stays in cache): one term for any rows.
    let few = x.narrow(0, 0, 2).unwrap();
    let auto_few = vals(&lin.forward(&few).unwrap());
    let auto_all = vals(&lin.forward(&x).unwrap());
    assert_eq!(quant::set_act_terms(&lin, quant::ActTerms::Two), 1);
    let two = vals(&lin.forward(&x).unwrap());
    assert_ne!(auto_few, vals(&lin.forward(&few).unwrap()));
    assert_eq!(quant::set_act_terms(&lin, quant::ActTerms::One), 1);
    let one = vals(&lin.forward(&x).unwrap());
    assert_eq!(auto_all, one);
    assert_eq!(auto_few, vals(&lin.forward(&few).unwrap()));
    let (xv, wv) = (vals(&x), vals(&lin.weight));
    let wq = Int8Weight::from_f32(&lin.weight).unwrap();
    let dxs = row_half_steps(&xv, k);
    let (mut e1, mut e2) = (0f64, 0f64);
    for i in 0..rows {
        for j in 0..n {
            let (xr, wr, dw) = (
                &xv[i * k..(i + 1) * k],
                &wv[j * k..(j + 1) * k],
                wq.scales()[j] as f64 / 2.0,
            );
            let (a, b) = (
                (two[i * n + j] - want[i * n + j]).abs() as f64,
                (one[i * n + j] - want[i * n + j]).abs() as f64,
            );
            let tight = dot_bound(xr, wr, dxs[i] / 250.0, dw);
            assert!(a <= tight, "({i}, {j}): two terms' error {a} above {tight}");
            assert!(
                b <= dot_bound(xr, wr, dxs[i], dw),
                "({i}, {j}): one term {b}"
            );
            // The exact-weights part of the error: what the terms change.
            let exact = dot_q(xr, &wq, j, lin.bias.as_ref());
            e2 += (two[i * n + j] as f64 - exact).powi(2);
            e1 += (one[i * n + j] as f64 - exact).powi(2);
        }
    }
    assert!(
        e2 < e1 / 1000.0,
        "activation error: two terms {e2}, one term {e1}"
    );
}

/// Σ x·ŵ_j + b_j in f64 with the int8 weight's values (the exact-activation result).
fn dot_q(x: &[f32], wq: &Int8Weight, j: usize, bias: Option<&Tensor>) -> f64 {
    let k = wq.k();
    let mut row = vec![0f32; k];
    wq.dequantize_row(j, &mut row);
    let b = bias.map_or(0.0, |b| vals(b)[j] as f64);
    x.iter()
        .zip(&row)
        .map(|(a, w)| *a as f64 * *w as f64)
        .sum::<f64>()
        + b
}

/// Inputs with a shared component (as LayerNorm and GELU outputs have): x = c·v + noise.
fn correlated(rows: usize, k: usize, rng: &mut Rng) -> Tensor {
    let v: Vec<f32> = (0..k).map(|i| 1.0 + (i % 4) as f32 * 0.4).collect();
    let data: Vec<f32> = (0..rows)
        .flat_map(|_| {
            let c = rng.normal() as f32;
            v.iter()
                .map(|&vi| c * vi + 0.3 * rng.normal() as f32)
                .collect::<Vec<_>>()
        })
        .collect();
    Tensor::from_vec(data, &[rows, k], Device::Cpu).unwrap()
}

/// GPTQ rounding (`Rounding::ErrorFeedback`) from calibration batches: on fresh inputs from
/// the calibration batches' distribution the output error is well below rounding to nearest,
/// with the same scales; the file round-trips it exactly; a layer no batch reached is rounded
/// to nearest (and not listed).
#[test]
fn error_feedback_rounding_lowers_the_output_error_on_calibrated_inputs() {
    let mut rng = Rng::new(6);
    let (k, n) = (64, 24);
    let make = || {
        let mut r = Rng::new(7);
        (
            Linear::new(k, n, true, &mut r).unwrap(),
            Embedding::new(10, k, 0.02, &mut r).unwrap(),
        )
    };
    let calib: Vec<Tensor> = (0..4).map(|_| correlated(64, k, &mut rng)).collect();
    let test = correlated(200, k, &mut rng);
    let _g = no_grad();
    let (f32_lin, _) = make();
    let want = vals(&f32_lin.forward(&test).unwrap());
    let mut errors = Vec::new();
    for rounding in [quant::Rounding::Nearest, quant::Rounding::ErrorFeedback] {
        let (lin, emb) = make();
        let options = quant::QuantizeOptions {
            keep_f32: vec![],
            rounding,
            table_planes: quant::TablePlanes::One,
            two_planes: vec![],
        };
        let mut runs = 0;
        let report = quant::quantize_with(&lin, &options, &mut |m| {
            runs += 1;
            calib.iter().try_for_each(|x| m.forward(x).map(|_| ()))
        })
        .unwrap();
        let emb_report = quant::quantize_with(&emb, &options, &mut |_| Ok(())).unwrap();
        assert!(
            emb_report.error_feedback.is_empty(),
            "no batch reached the table"
        );
        let feedback = rounding == quant::Rounding::ErrorFeedback;
        assert_eq!(runs, usize::from(feedback), "calibrated only for GPTQ");
        assert_eq!(report.error_feedback.len(), usize::from(feedback));
        let got = vals(&lin.forward(&test).unwrap());
        let err: f64 = got
            .iter()
            .zip(&want)
            .map(|(a, b)| ((a - b) as f64).powi(2))
            .sum();
        errors.push(err);
        // Same scales as rounding to nearest; the exported values load back exactly.
        let form = lin.quant.int8().unwrap();
        let q = form.as_any().downcast_ref::<QuantizedLinear>().unwrap();
        let nearest = Int8Weight::from_f32(&lin.weight).unwrap();
        assert_eq!(q.weight().scales(), nearest.scales());
        assert_eq!(feedback, q.weight().values() != nearest.values());
        let state: HashMap<String, StateTensor> = export(&lin).unwrap().into_iter().collect();
        let (back, _) = make();
        import(&back, &state).unwrap();
        assert_eq!(vals(&back.forward(&test).unwrap()), got);
    }
    assert!(
        errors[1] < 0.5 * errors[0],
        "output error: GPTQ {} vs nearest {}",
        errors[1],
        errors[0]
    );
}

/// argmax of a row (first of equals).
fn argmax(v: &[f64]) -> usize {
    (0..v.len()).fold(0, |b, j| if v[j] > v[b] { j } else { b })
}

/// An embedding table with a second int8 plane (`quant::residual`): lookups are within a
/// plane-2 step of the f32 rows (≥ 100× closer than one plane), and a tied head over rows that
/// are near-ties (v + 10⁻³·u: one plane cannot tell them apart) picks, for every input row, the
/// argmax of the two-plane weights, with that output equal to the f64 two-plane value. One
/// plane alone picks differently on some rows here, so the test shows what rescoring adds.
#[test]
fn a_second_table_plane_gives_near_exact_rows_and_the_two_plane_argmax() {
    let mut rng = Rng::new(21);
    let (n, k, rows) = (400, 48, 64);
    let v: Vec<f32> = (0..k).map(|_| rng.normal() as f32).collect();
    let w: Vec<f32> = (0..n * k)
        .map(|i| v[i % k] + 1e-3 * rng.normal() as f32)
        .collect();
    let w = Tensor::from_vec(w, &[n, k], Device::Cpu).unwrap();
    let one = Int8Weight::from_f32(&w).unwrap();
    let two = Int8Weight::from_f32(&w)
        .unwrap()
        .with_residual_of(&w)
        .unwrap();
    assert!(one.residual().is_none() && two.residual().is_some());
    // `auto`: GPT-2's tables get two planes, gpt-tiny's (32 Ki entries) one.
    use quant::TablePlanes::{Auto, One, Two};
    assert!(Auto.two_for(50257 * 768) && Auto.two_for(1024 * 768) && !Auto.two_for(256 * 128));
    assert!(Two.two_for(1) && !One.two_for(1 << 30));
    assert_eq!(two.bytes(), 2 * one.bytes());
    let wv = vals(&w);
    let (mut e1, mut e2, mut row) = (0f32, 0f32, vec![0f32; k]);
    for j in 0..n {
        let want = &wv[j * k..(j + 1) * k];
        let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        one.dequantize_row(j, &mut row);
        e1 = e1.max(
            row.iter()
                .zip(want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max),
        );
        two.dequantize_row(j, &mut row);
        let e = row
            .iter()
            .zip(want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        // Half a step of plane 2, whose range is half a step of plane 1.
        assert!(e <= amax / 127.0 / 254.0 * 1.01 + 1e-9, "row {j}: {e}");
        e2 = e2.max(e);
    }
    assert!(e2 * 100.0 < e1, "two planes {e2}, one {e1}");

    let x = randn(&[rows, k], 1.0, &mut rng);
    let xv = vals(&x);
    let _g = no_grad();
    let head = QuantizedLinear::table(two).unwrap();
    let got = vals(&head.forward(&x).unwrap());
    let plane1 = vals(
        &QuantizedLinear::new(one, None)
            .unwrap()
            .forward(&x)
            .unwrap(),
    );
    let mut plane1_differs = 0;
    for i in 0..rows {
        let xr = &xv[i * k..(i + 1) * k];
        let exact: Vec<f64> = (0..n).map(|j| dot_q(xr, head.weight(), j, None)).collect();
        let g: Vec<f64> = got[i * n..(i + 1) * n].iter().map(|&v| v as f64).collect();
        let best = argmax(&exact);
        assert_eq!(argmax(&g), best, "row {i}");
        assert!(
            (g[best] - exact[best]).abs() <= 1e-5 * exact[best].abs().max(1.0),
            "row {i}: {} vs {}",
            g[best],
            exact[best]
        );
        let p1: Vec<f64> = plane1[i * n..(i + 1) * n]
            .iter()
            .map(|&v| v as f64)
            .collect();
        plane1_differs += usize::from(argmax(&p1) != best);
    }
    assert!(
        plane1_differs > 0,
        "the rows are not near-ties for one plane"
    );
}

/// A Linear named in `two_planes` gets a second int8 plane and runs a GEMM per plane: with
/// two activation terms (input error ~1/255 of one term's) its output error against f32 is
/// ≥ 20× below the one-plane layer's, within the bound its two planes and terms imply; it
/// round-trips through export/import bit for bit, with a GELU epilogue applied after the sum.
#[test]
fn a_linear_with_two_planes_runs_near_f32_weights() {
    let mut rng = Rng::new(12);
    let (rows, k, n) = (5, 96, 40);
    let make = || Linear::new(k, n, true, &mut Rng::new(13)).unwrap();
    let x = randn(&[rows, k], 1.0, &mut rng);
    let _g = no_grad();
    let f32_lin = make();
    let want = vals(&f32_lin.forward(&x).unwrap());
    let want_gelu = vals(&f32_lin.forward(&x).unwrap().gelu().unwrap());
    let run = |planes: Vec<String>| {
        let lin = make();
        let options = quant::QuantizeOptions {
            two_planes: planes,
            ..Default::default()
        };
        let report = quant::quantize_with(&lin, &options, &mut |_| Ok(())).unwrap();
        quant::set_act_terms(&lin, quant::ActTerms::Two);
        (lin, report)
    };
    let (one, r1) = run(vec![]);
    let (two, r2) = run(vec!["weight".into()]);
    assert!(
        r1.two_planes.is_empty() && r2.two_planes == ["weight"],
        "{r2:?}"
    );
    assert_eq!(r2.int8_bytes, 2 * r1.int8_bytes);
    let err = |got: &[f32], want: &[f32]| -> f64 {
        got.iter()
            .zip(want)
            .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
            .sum()
    };
    let (g1, g2) = (
        vals(&one.forward(&x).unwrap()),
        vals(&two.forward(&x).unwrap()),
    );
    let (e1, e2) = (err(&g1, &want), err(&g2, &want));
    assert!(e2 * 400.0 < e1, "two planes {e2}, one {e1}");
    let (xv, wv) = (vals(&x), vals(&f32_lin.weight));
    let dxs = row_half_steps(&xv, k);
    let wq = Int8Weight::from_f32(&f32_lin.weight).unwrap();
    for i in 0..rows {
        for j in 0..n {
            let (xr, wr) = (&xv[i * k..(i + 1) * k], &wv[j * k..(j + 1) * k]);
            let bound = dot_bound(xr, wr, dxs[i] / 250.0, wq.scales()[j] as f64 / 2.0 / 250.0);
            let e = (g2[i * n + j] - want[i * n + j]).abs() as f64;
            assert!(e <= bound, "({i}, {j}): {e} above {bound}");
        }
    }
    // The epilogue's activation comes after both planes' sum.
    let q: &QuantizedLinear = &QuantizedLinear::clone(
        quant::layers(&two)[0]
            .1
            .slot
            .int8()
            .unwrap()
            .as_any()
            .downcast_ref()
            .unwrap(),
    );
    let gelu = vals(&q.forward_with(&x, Activation::GeluTanh).unwrap());
    let gelu_of_sum = vals(
        &Tensor::from_vec(g2.clone(), &[rows, n], Device::Cpu)
            .unwrap()
            .gelu()
            .unwrap(),
    );
    for (a, b) in gelu.iter().zip(&gelu_of_sum) {
        assert!(
            (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
            "GELU after the sum: {a} vs {b}"
        );
    }
    assert!(err(&gelu, &want_gelu) < e1);
    // Export/import: `.q2` and `.scale2`, the same outputs.
    let state: HashMap<String, StateTensor> = export(&two).unwrap().into_iter().collect();
    assert!(
        state.contains_key("weight.q2") && state.contains_key("weight.scale2"),
        "{:?}",
        state.keys()
    );
    let back = make();
    import(&back, &state).unwrap();
    quant::set_act_terms(&back, quant::ActTerms::Two);
    assert_eq!(vals(&back.forward(&x).unwrap()), g2);
}
