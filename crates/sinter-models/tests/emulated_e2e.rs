//! GPT, a Llama-family decoder and BERT end to end on the CUDA device — the real GPU when present, else the emulated
//! CUDA device (sinter's CUDA kernels on the CPU; required in CI by SINTER_REQUIRE_EMU=1) —
//! against the same model on the CPU: GPT training steps on the fast path and on the composite
//! path (whose causal mask must live on the device), with block recompute, with dropout, and
//! KV-cache generation; BERT's masked-LM loss with padding, without dropout (the trainer's
//! bert-tiny keeps BERT's dropout, whose masks differ between the backends by design). The
//! trainer-level runs (CNN, autocast, CUDA graph, data parallel) are in
//! `crates/sinter/tests/emulated_cli.rs`.
//!
//! Tolerances: f32 on both devices, only the summation order differs: 1e-4 relative on the loss
//! and on every gradient (relative to the largest element of its tensor) at each of three
//! AdamW steps. The parameters themselves are not compared: AdamW divides a gradient by its
//! own size, so a gradient that is zero in exact arithmetic (the key bias: softmax ignores a
//! constant added to every score) moves its weight by ±lr on the sign of rounding noise.

use sinter_core::{Device, Rng, Tensor};
use sinter_models::bert::IGNORE_INDEX;
use sinter_models::{Bert, BertConfig, Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::optim::{AdamW, Optimizer};
use sinter_nn::{Module, Recompute};

/// The CUDA device of this test process, or None (the skip was printed).
fn cuda() -> Option<Device> {
    sinter_cuda::testing::gpu_tests(1).map(|_| Device::Cuda(0))
}

fn config(dropout: f32) -> DecoderConfig {
    DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 16,
        vocab_size: 29,
        dropout,
        ..Default::default()
    }
}

fn batch(seed: u64) -> (Tensor, Tensor) {
    let mut r = Rng::new(seed);
    let mut ids = |n| (0..n).map(|_| r.below(29) as i64).collect::<Vec<_>>();
    let (b, t) = (2, 12);
    (
        Tensor::from_vec(ids(b * t), &[b, t], Device::Cpu).unwrap(),
        Tensor::from_vec(ids(b * t), &[b, t], Device::Cpu).unwrap(),
    )
}

/// The loss and the gradients (by parameter name) of each step of training.
type Steps = Vec<(f32, Vec<(String, Vec<f32>)>)>;

/// Three AdamW steps of `m` moved to `dev`, `loss(m, step, dev)` giving each step's loss.
fn train_steps<M: Module>(m: &M, dev: Device, loss: impl Fn(&M, u64, Device) -> Tensor) -> Steps {
    sinter_nn::move_module(m, dev).unwrap();
    let mut opt = AdamW::new(m.parameters(), 1e-3, 0.1).unwrap();
    let mut steps = Vec::new();
    for s in 0..3 {
        m.zero_grad();
        let l = loss(m, s, dev);
        assert_eq!(l.device(), dev);
        l.backward().unwrap();
        let grads = m
            .parameters()
            .into_iter()
            .map(|(n, p)| {
                (
                    n,
                    p.grad()
                        .expect("every parameter has a gradient")
                        .to_vec_f32()
                        .unwrap(),
                )
            })
            .collect();
        opt.step().unwrap();
        steps.push((l.to_scalar_f32().unwrap(), grads));
    }
    steps
}

/// GPT's next-token loss over three steps on `dev`.
fn train(dev: Device, dropout: f32, fast_path: bool, recompute: Recompute) -> Steps {
    train_config(dev, config(dropout), fast_path, recompute)
}

fn train_config(dev: Device, cfg: DecoderConfig, fast_path: bool, recompute: Recompute) -> Steps {
    let mut m = Decoder::new(cfg, &mut Rng::new(5), &shared_rng(6)).unwrap();
    m.set_fast_path(fast_path);
    m.set_recompute(recompute);
    train_steps(&m, dev, |m, s, dev| {
        let (x, y) = batch(s);
        m.forward(&x.to_device(dev).unwrap())
            .unwrap()
            .cross_entropy(&y.to_device(dev).unwrap(), -100)
            .unwrap()
    })
}

/// Every step's loss and gradients agree (see the tolerances above).
fn assert_same_steps(what: &str, on_dev: &Steps, on_cpu: &Steps) {
    for (s, ((lg, gg), (lc, gc))) in on_dev.iter().zip(on_cpu).enumerate() {
        assert_close(&format!("{what}: step {s} loss"), &[*lg], &[*lc], 1e-4);
        for ((n, a), (_, b)) in gg.iter().zip(gc) {
            assert_close(&format!("{what}: step {s} gradient of {n}"), a, b, 1e-4);
        }
    }
}

fn assert_close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{what}");
    let scale = b.iter().fold(1e-3f32, |m, x| m.max(x.abs()));
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * scale,
            "{what}[{i}]: cuda {x} vs cpu {y} (scale {scale})"
        );
    }
}

fn same_training(dropout: f32, fast_path: bool, recompute: Recompute) {
    let Some(dev) = cuda() else { return };
    let what = format!("fast path {fast_path}, recompute {recompute:?}");
    let on_dev = train(dev, dropout, fast_path, recompute);
    assert_same_steps(
        &what,
        &on_dev,
        &train(Device::Cpu, dropout, fast_path, recompute),
    );
}

/// A Llama-family block with every option the CPU tests cover: grouped (here one) kv head,
/// qkv bias, QK-norm, rotary positions, a sliding window shorter than the sequence, an
/// untied head.
fn llama_config() -> DecoderConfig {
    DecoderConfig {
        n_head: 4,
        arch: sinter_models::DecoderArch {
            n_kv_head: Some(1),
            mlp_hidden: Some(48),
            qkv_bias: true,
            qk_norm: true,
            sliding_window: Some(8),
            ..sinter_models::DecoderArch::llama(10_000.0)
        },
        ..config(0.0)
    }
}

#[test]
fn a_llama_block_trains_like_the_cpu() {
    let Some(dev) = cuda() else { return };
    for fast_path in [true, false] {
        let run = |d| train_config(d, llama_config(), fast_path, Recompute::None);
        assert_same_steps(
            &format!("llama, fast path {fast_path}"),
            &run(dev),
            &run(Device::Cpu),
        );
    }
}

#[test]
fn fast_path_trains_like_the_cpu() {
    same_training(0.0, true, Recompute::None);
}

#[test]
fn composite_path_trains_like_the_cpu() {
    same_training(0.0, false, Recompute::None);
}

#[test]
fn block_recompute_trains_like_the_cpu() {
    same_training(0.0, true, Recompute::Block);
}

/// With dropout (the composite attention path, its causal mask built on the device) the masks
/// differ by design between the backends (a Philox stream on CUDA): the run must go through,
/// stay finite and start where the CPU starts (at initialisation the loss is ≈ ln 29 with or
/// without a mask; 2 % covers the masks' effect on three steps of this size).
#[test]
fn dropout_trains_on_the_device() {
    let Some(dev) = cuda() else { return };
    let lg: Vec<f32> = train(dev, 0.1, true, Recompute::None)
        .iter()
        .map(|s| s.0)
        .collect();
    let lc: Vec<f32> = train(Device::Cpu, 0.1, true, Recompute::None)
        .iter()
        .map(|s| s.0)
        .collect();
    assert!(lg.iter().all(|l| l.is_finite()), "{lg:?}");
    for (a, b) in lg.iter().zip(&lc) {
        assert!(
            (a - b).abs() <= 0.02 * b,
            "dropout losses: cuda {lg:?} vs cpu {lc:?}"
        );
    }
}

/// Greedy generation with the KV cache kept on the device picks the CPU model's tokens, and
/// so does the uncached path.
#[test]
fn kv_cache_generation_matches_the_cpu_tokens() {
    let Some(dev) = cuda() else { return };
    let make = || {
        let m = Decoder::new(config(0.0), &mut Rng::new(11), &shared_rng(11)).unwrap();
        m.set_training(false);
        m
    };
    let (cpu, gpu) = (make(), make());
    sinter_nn::move_module(&gpu, dev).unwrap();
    let cache = gpu.kv_cache(1).unwrap();
    assert_eq!(cache.layers[0].k.device(), dev);
    let prompt = [3i64, 1, 4, 1, 5];
    let want = cpu.generate(&prompt, 20, 0.0, 0, &mut Rng::new(0)).unwrap();
    let cached = gpu.generate(&prompt, 20, 0.0, 0, &mut Rng::new(0)).unwrap();
    let uncached = gpu
        .generate_uncached(&prompt, 20, 0.0, 0, &mut Rng::new(0))
        .unwrap();
    assert_eq!(cached, want, "cached tokens on the device vs the CPU");
    assert_eq!(uncached, want, "uncached tokens on the device vs the CPU");
}

/// BERT's masked-LM loss (only the masked positions go through the head, gathered on the
/// device) with the second sequence padded (the padding mask built on the device), no dropout.
#[test]
fn bert_masked_lm_trains_like_the_cpu() {
    let Some(dev) = cuda() else { return };
    let config = BertConfig {
        vocab_size: 40,
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
    let (b, t) = (2usize, 10usize);
    let run = |dev: Device| {
        let m = Bert::new(config.clone(), &mut Rng::new(7), &shared_rng(8)).unwrap();
        train_steps(&m, dev, |m, s, dev| {
            let mut r = Rng::new(100 + s);
            let ids: Vec<i64> = (0..b * t).map(|_| r.below(40) as i64).collect();
            // Every third position is masked (its label the token), the rest ignored.
            let labels: Vec<i64> = ids
                .iter()
                .enumerate()
                .map(|(i, &id)| {
                    if i % 3 == s as usize {
                        id
                    } else {
                        IGNORE_INDEX
                    }
                })
                .collect();
            let real: Vec<f32> = (0..b * t).map(|i| (i < t + 6) as u8 as f32).collect();
            let on = |v: Tensor| v.to_device(dev).unwrap();
            m.mlm_loss(
                &on(Tensor::from_vec(ids, &[b, t], Device::Cpu).unwrap()),
                &on(Tensor::from_vec(labels, &[b, t], Device::Cpu).unwrap()),
                None,
                Some(&on(Tensor::from_vec(real, &[b, t], Device::Cpu).unwrap())),
            )
            .unwrap()
        })
    };
    assert_same_steps("bert masked LM", &run(dev), &run(Device::Cpu));
}

/// The trainer's loss (`Model::loss`): on the CUDA device the head runs over the vocabulary
/// padded to a multiple of 128 (29 → 128 here) into the fused classifier, on the CPU into the
/// unfused cross-entropy; GPT (tied head) and the Llama block (untied head) train alike.
#[test]
fn the_fused_classifier_loss_trains_like_the_cpu() {
    use sinter_models::Model;
    let Some(dev) = cuda() else { return };
    for (name, cfg) in [("gpt", config(0.0)), ("llama", llama_config())] {
        let run = |d| {
            let m = Decoder::new(cfg.clone(), &mut Rng::new(5), &shared_rng(6)).unwrap();
            train_steps(&m, d, |m, s, dev| {
                let (x, y) = batch(s);
                let (x, y) = (x.to_device(dev).unwrap(), y.to_device(dev).unwrap());
                m.loss(&x, &y).unwrap().loss
            })
        };
        assert_same_steps(&format!("{name} Model::loss"), &run(dev), &run(Device::Cpu));
    }
}

/// A GPT step under bf16 autocast (head dim 64, so both cuDNN and sinter's flash kernel take
/// the attention) with cuDNN's fused attention selected equals the same step with the flash
/// kernel, loss and gradients, within bf16's rounding; and cuDNN did run (on the emulated
/// device: the host execution of the SDPA graph a GPU would build).
#[test]
fn gpt_step_with_cudnn_attention_matches_flash() {
    use sinter_core::kernels::attention::{with_attention_backend, AttentionBackend};
    let Some(dev) = cuda() else { return };
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 128,
        block_size: 16,
        vocab_size: 29,
        dropout: 0.0,
        ..Default::default()
    };
    let run = |backend| {
        with_attention_backend(backend, || {
            let m = Decoder::new(cfg.clone(), &mut Rng::new(5), &shared_rng(6)).unwrap();
            train_steps(&m, dev, |m, s, dev| {
                let (x, y) = batch(s);
                let _amp = sinter_core::amp::autocast(sinter_core::DType::BF16);
                m.forward(&x.to_device(dev).unwrap())
                    .unwrap()
                    .to_dtype(sinter_core::DType::F32)
                    .unwrap()
                    .cross_entropy(&y.to_device(dev).unwrap(), -100)
                    .unwrap()
            })
        })
    };
    let recorded = sinter_cuda::runtime::is_emulated();
    if recorded {
        sinter_cuda::emulated::cost::start_recording();
    }
    let with_cudnn = run(AttentionBackend::Cudnn);
    if recorded {
        let calls = sinter_cuda::emulated::cost::stop_recording(0);
        let sdpa = calls
            .iter()
            .filter(|c| c.key.starts_with("cudnn sdpa fwd"))
            .count();
        // Two layers, three steps: one forward each.
        assert!(sdpa >= 6, "cuDNN attention forwards: {sdpa}");
    }
    let with_flash = run(AttentionBackend::Flash);
    // Step 0 (the same weights on both sides): every gradient element within bf16's
    // rounding. Later steps start from weights already apart by one or two updates, which the
    // bf16 residual stream carries on, so they are held to the gradients' relative L2 error.
    for (s, ((lc, gc), (lf, gf))) in with_cudnn.iter().zip(&with_flash).enumerate() {
        assert_close(&format!("step {s} loss"), &[*lc], &[*lf], 2e-2);
        for ((n, a), (_, b)) in gc.iter().zip(gf) {
            let what = format!("step {s} gradient of {n}");
            if s == 0 {
                assert_close(&what, a, b, 5e-2);
            } else {
                assert_close_l2(&what, a, b, 5e-2);
            }
        }
    }
}

/// ‖a − b‖₂ ≤ tol · ‖b‖₂ (b's norm at least 1e-6).
fn assert_close_l2(what: &str, a: &[f32], b: &[f32], tol: f64) {
    assert_eq!(a.len(), b.len(), "{what}");
    let norm = |v: &mut dyn Iterator<Item = f64>| v.map(|x| x * x).sum::<f64>().sqrt();
    let diff = norm(&mut a.iter().zip(b).map(|(x, y)| (x - y) as f64));
    let base = norm(&mut b.iter().map(|&y| y as f64)).max(1e-6);
    assert!(
        diff <= tol * base,
        "{what}: relative L2 error {} > {tol}",
        diff / base
    );
}

/// A GGUF model whose projections stay in their GGML blocks (the tiny Llama fixture written
/// as Q8_0 and as Q4_K by `quantize_gguf`) runs on the device through the same layers: each
/// product dequantizes its blocks on the device (the CPU's values exactly) and multiplies in
/// f32, so its logits equal the same file dequantized to f32 on the CPU up to f32 summation
/// order (the CPU's run of the blocks differs by its 8-bit activations).
#[test]
fn a_gguf_model_kept_quantized_runs_on_the_device() {
    use sinter_cpu::ggml_quant::GgmlType;
    use sinter_models::gguf::{quantize_gguf, GgufFile};
    use sinter_models::{load_pretrained, load_pretrained_as, GgufWeights};
    let Some(dev) = cuda() else { return };
    let _no_grad = sinter_core::no_grad();
    let src = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/gguf/llama-tiny.gguf"
    );
    let dir = tempfile::tempdir().unwrap();
    let ids = Tensor::from_slice(&[1i64, 5, 9, 3, 17, 22, 30, 2], &[1, 8], Device::Cpu).unwrap();
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K] {
        let path = dir.path().join(format!("llama-tiny-{ty}.gguf"));
        quantize_gguf(&GgufFile::open(src).unwrap(), ty, &path).unwrap();
        let dense = load_pretrained(&path).unwrap();
        let kept = load_pretrained_as(&path, GgufWeights::Quantized).unwrap();
        let blocks = sinter_nn::quant::layers(&kept)
            .into_iter()
            .filter(|(_, h)| h.slot.int8().is_some())
            .count();
        assert!(blocks > 0, "{ty}: no projection kept in blocks");
        let want = dense.forward(&ids).unwrap().to_vec_f32().unwrap();
        sinter_nn::move_module(&kept, dev).unwrap();
        let got = kept.forward(&ids.to_device(dev).unwrap()).unwrap();
        assert_eq!(got.device(), dev);
        let what = format!("{ty} GGUF logits on the device");
        assert_close(&what, &got.to_vec_f32().unwrap(), &want, 1e-4);
    }
}
