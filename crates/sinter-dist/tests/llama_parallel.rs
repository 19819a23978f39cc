//! The Llama family under every strategy, on threads: `llama-tiny` (RMSNorm, SwiGLU, rotary
//! positions, 4 query heads sharing 2 key/value heads, untied head) trained for 5 AdamW steps
//! with data parallel 2, ZeRO 2 (stages 1 and 2), tensor parallel 2 and pipeline parallel 2
//! equals one rank; tensor parallel also shards QK-norm and a qkv bias (Qwen's block) alike,
//! and refuses key/value heads that do not split.

mod gpt_common;
use gpt_common::{assert_all_close, assert_losses_close, setup, train_pipeline, worst_elem, Named};

use std::sync::OnceLock;
use std::time::Duration;

use sinter_core::{Rng, Tensor};
use sinter_dist::data_parallel::shared;
use sinter_dist::tensor_parallel::{check_tp_config, snapshot_parameters, TpGpt, IGNORE_INDEX};
use sinter_dist::{
    run_on_threads, Communicator, DataParallel, ShardedAlgo, ThreadGroup, ZeroOptimizer,
    ZeroOptions,
};
use sinter_models::{Decoder, DecoderArch, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::{AdamW, Module, Optimizer, Sgd};

const T: Duration = Duration::from_secs(120);
const STEPS: usize = 5;
const BATCH: usize = 4;
const LR: f64 = 3e-3;
const WD: f64 = 0.1;
/// Large enough that 5 plain SGD steps move the weights by far more than rounding.
const SGD_LR: f64 = 0.3;
/// Gradients of the first step, relative to each tensor's largest magnitude (the GPT-2 tests'
/// bound: only the summation order differs).
const GRAD_TOL: f64 = 1e-5;
/// Weights after the AdamW steps. AdamW divides each gradient by its own running magnitude,
/// so a component whose gradient is near zero moves either way on rounding noise alone: a few
/// elements in 10^5 differ by up to 1.3e-3 of their tensor's scale under tensor parallel and
/// 1.8e-4 under DP, ZeRO and PP (which split the batch unlike one rank), beyond the GPT-2
/// tests' 1e-4. So each tensor is compared as a whole, its relative L2 error (measured at most
/// 2.6e-5; a wrong shard, sum or bias gives 1e-2 and more), and element-wise for gross errors.
const WEIGHT_L2_TOL: f64 = 1e-4;
const WEIGHT_TOL: f64 = 1e-2;

fn llama_tiny() -> DecoderConfig {
    DecoderConfig::preset("llama-tiny").expect("llama-tiny is a preset")
}

/// One rank's run: initial weights, batches, and what serial training gives.
struct Fixture {
    init: Named,
    batches: Vec<(Tensor, Tensor)>,
    logits0: Tensor,
    grads0: Named,
    losses: Vec<f32>,
    weights: Named,
}

fn loss_of(gpt: &Decoder, ids: &Tensor, tg: &Tensor) -> Tensor {
    let n = ids.numel();
    gpt.forward(ids)
        .unwrap()
        .reshape(&[n, gpt.config.vocab_size])
        .unwrap()
        .cross_entropy(&tg.reshape(&[n]).unwrap(), IGNORE_INDEX)
        .unwrap()
}

/// A GPT of `cfg` holding a private copy of `init`.
fn model_from(cfg: &DecoderConfig, init: &Named) -> Decoder {
    let gpt = Decoder::new(cfg.clone(), &mut Rng::new(0), &shared_rng(0)).unwrap();
    for ((n, p), (m, w)) in gpt.parameters().iter().zip(init) {
        assert_eq!(n, m);
        p.assign(w).unwrap();
    }
    gpt
}

/// The optimizer the runs of a test step with.
#[derive(Clone, Copy)]
enum Opt {
    AdamW,
    /// Plain SGD (no momentum, no decay): each update is linear in its gradient, so rounding
    /// differences stay rounding-sized, where AdamW turns a near-zero gradient's sign into a
    /// whole step (see [`WEIGHT_TOL`]).
    Sgd,
}

impl Opt {
    fn over(self, params: Vec<(String, Tensor)>) -> Box<dyn Optimizer> {
        match self {
            Opt::AdamW => Box::new(AdamW::new(params, LR, WD).unwrap()),
            Opt::Sgd => Box::new(Sgd::new(params, SGD_LR, 0.0, false, 0.0).unwrap()),
        }
    }
}

fn fixture_for(cfg: &DecoderConfig, opt: Opt) -> Fixture {
    let (init, batches) = setup(cfg, BATCH, STEPS);
    let gpt = model_from(cfg, &init);
    let mut opt = opt.over(gpt.parameters());
    let (mut logits0, mut grads0, mut losses) = (None, Vec::new(), Vec::new());
    for (i, (ids, tg)) in batches.iter().enumerate() {
        opt.zero_grad();
        let loss = loss_of(&gpt, ids, tg);
        loss.backward().unwrap();
        if i == 0 {
            logits0 = Some(gpt.forward(ids).unwrap().detach());
            grads0 = gpt
                .parameters()
                .into_iter()
                .map(|(n, p)| (n, p.grad().unwrap()))
                .collect();
        }
        losses.push(loss.to_scalar_f32().unwrap());
        opt.step().unwrap();
    }
    Fixture {
        init,
        batches,
        logits0: logits0.unwrap(),
        grads0,
        losses,
        weights: snapshot_parameters(&gpt).unwrap(),
    }
}

/// llama-tiny's serial run, shared by the tests of this file.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| fixture_for(&llama_tiny(), Opt::AdamW))
}

/// `assert_all_close(.., WEIGHT_TOL, ..)` and each tensor's ‖got − want‖ / ‖want‖ within
/// [`WEIGHT_L2_TOL`]; returns the worst relative L2 error.
fn assert_weights_close(got: &Named, want: &Named, what: &str) -> f64 {
    assert_all_close(got, want, WEIGHT_TOL, what);
    let mut worst = 0f64;
    for ((n, g), (_, w)) in got.iter().zip(want) {
        let (g, w) = (g.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        let d2: f64 = g.iter().zip(&w).map(|(a, b)| (a - b) * (a - b)).sum();
        let w2: f64 = w.iter().map(|b| b * b).sum();
        let e = (d2 / w2.max(1e-30)).sqrt();
        assert!(
            e <= WEIGHT_L2_TOL,
            "{what}: {n} differs by {e:e} (relative L2)"
        );
        worst = worst.max(e);
    }
    worst
}

/// Per-step mean of the ranks' losses over their halves of the batch: the global mean.
fn mean_losses(per_rank: &[Vec<f32>]) -> Vec<f32> {
    (0..STEPS)
        .map(|s| per_rank.iter().map(|l| l[s]).sum::<f32>() / per_rank.len() as f32)
        .collect()
}

fn half(t: &Tensor, r: usize) -> Tensor {
    let rows = t.shape()[0] / 2;
    t.narrow(0, r * rows, rows).unwrap().contiguous().unwrap()
}

#[test]
fn llama_tiny_data_parallel_2_equals_one_rank() {
    let f = fixture();
    let cfg = llama_tiny();
    let out = run_on_threads(2, T, |c| {
        let r = c.rank();
        let gpt = model_from(&cfg, &f.init);
        let mut dp = DataParallel::new(shared(c), gpt.parameters(), 1 << 16).unwrap();
        let mut opt = AdamW::new(gpt.parameters(), LR, WD).unwrap();
        let (mut losses, mut grads0) = (Vec::new(), Vec::new());
        for (i, (ids, tg)) in f.batches.iter().enumerate() {
            let l = loss_of(&gpt, &half(ids, r), &half(tg, r));
            dp.backward(&l).unwrap();
            if i == 0 {
                grads0 = gpt
                    .parameters()
                    .into_iter()
                    .map(|(n, p)| (n, p.grad().unwrap()))
                    .collect();
            }
            losses.push(l.to_scalar_f32().unwrap());
            opt.step().unwrap();
            opt.zero_grad();
        }
        (losses, grads0, snapshot_parameters(&gpt).unwrap())
    });
    let losses: Vec<_> = out.iter().map(|o| o.0.clone()).collect();
    assert_losses_close(&mean_losses(&losses), &f.losses, "llama dp=2");
    for (r, (_, grads0, weights)) in out.iter().enumerate() {
        let what = format!("llama dp=2 rank {r}");
        assert_all_close(grads0, &f.grads0, GRAD_TOL, &format!("{what} grads"));
        let e = assert_weights_close(weights, &f.weights, &format!("{what} weights"));
        println!("{what}: weights after {STEPS} AdamW steps rel L2 err {e:e}");
    }
}

#[test]
fn llama_tiny_zero_2_stages_1_and_2_equal_one_rank() {
    let f = fixture();
    let cfg = llama_tiny();
    for stage in [1u8, 2] {
        let out = run_on_threads(2, T, |c| {
            let r = c.rank();
            let gpt = model_from(&cfg, &f.init);
            let opts = ZeroOptions {
                stage,
                bucket_bytes: 1 << 16,
                grad_clip: None,
            };
            let mut z = ZeroOptimizer::new(
                shared(c),
                gpt.parameters(),
                LR,
                ShardedAlgo::adamw(WD),
                opts,
            )
            .unwrap();
            let mut losses = Vec::new();
            for (ids, tg) in &f.batches {
                let l = loss_of(&gpt, &half(ids, r), &half(tg, r));
                z.backward(&l).unwrap();
                losses.push(l.to_scalar_f32().unwrap());
                z.step().unwrap();
                z.zero_grad();
            }
            (losses, snapshot_parameters(&gpt).unwrap())
        });
        let losses: Vec<_> = out.iter().map(|o| o.0.clone()).collect();
        let what = format!("llama zero-{stage} ×2");
        assert_losses_close(&mean_losses(&losses), &f.losses, &what);
        for (r, (_, weights)) in out.iter().enumerate() {
            let e = assert_weights_close(weights, &f.weights, &format!("{what} rank {r} weights"));
            println!("{what} rank {r}: weights after {STEPS} AdamW steps rel L2 err {e:e}");
        }
    }
}

/// Tensor parallel over 2 ranks from `f.init`: (gathered logits of the first batch, losses,
/// first step's gathered gradients, gathered weights after the steps) per rank.
fn tp2(cfg: &DecoderConfig, f: &Fixture, opt: Opt) -> Vec<(Tensor, Vec<f32>, Named, Named)> {
    run_on_threads(2, T, |c| {
        let model = TpGpt::from_named(cfg, &f.init, Box::new(c)).unwrap();
        // Slicing then gathering gives back the exact full weights.
        for ((n, a), (_, b)) in model.gather_weights().unwrap().iter().zip(&f.init) {
            assert_eq!(a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap(), "{n}");
        }
        let logits = model
            .gather_logits(&model.logits_shard(&f.batches[0].0).unwrap())
            .unwrap();
        let mut opt = opt.over(model.parameters());
        let (mut losses, mut grads0) = (Vec::new(), Vec::new());
        for (i, (ids, tg)) in f.batches.iter().enumerate() {
            opt.zero_grad();
            let loss = model.loss(ids, tg).unwrap();
            loss.backward().unwrap();
            if i == 0 {
                grads0 = model.gather_grads().unwrap();
            }
            losses.push(loss.to_scalar_f32().unwrap());
            opt.step().unwrap();
        }
        (logits, losses, grads0, model.gather_weights().unwrap())
    })
}

fn assert_tp_matches(out: &[(Tensor, Vec<f32>, Named, Named)], f: &Fixture, what: &str) {
    for (r, (logits, losses, grads0, weights)) in out.iter().enumerate() {
        let what = format!("{what} rank {r}");
        let (e, _) = worst_elem(logits, &f.logits0, None);
        assert!(e <= 1e-5, "{what}: logits differ by {e:e}");
        assert_losses_close(losses, &f.losses, &what);
        let eg = assert_all_close(grads0, &f.grads0, GRAD_TOL, &format!("{what} grads"));
        let ew = assert_weights_close(weights, &f.weights, &format!("{what} weights"));
        println!(
            "{what}: logits rel err {e:e}, grads {eg:e}, weights after {STEPS} steps rel L2 {ew:e}"
        );
    }
}

#[test]
fn llama_tiny_tensor_parallel_2_equals_one_rank() {
    let f = fixture();
    let cfg = llama_tiny();
    // Each rank runs the one block with half the heads: 2 query heads, 1 kv head, 172 of the
    // SwiGLU's 344 columns, and half the untied head's vocabulary.
    let shapes = run_on_threads(2, T, |c| {
        let m = TpGpt::from_named(&cfg, &f.init, Box::new(c)).unwrap();
        let a = &m.blocks[0].block.attn;
        (
            (a.n_head, a.n_kv_head),
            a.qkv.weight.shape().to_vec(),
            m.blocks[0].block.mlp.fc.weight.shape().to_vec(),
            m.lm_head.as_ref().unwrap().weight.shape().to_vec(),
        )
    });
    for s in shapes {
        assert_eq!(s, ((2, 1), vec![128, 128], vec![344, 128], vec![128, 128]));
    }
    assert_tp_matches(&tp2(&cfg, f, Opt::AdamW), f, "llama tp=2");
}

#[test]
fn tensor_parallel_shards_qk_norm_and_qkv_bias() {
    // Qwen3's QK-norm (replicated weights seen by each rank's heads only) and Qwen2's qkv
    // bias (sharded with the heads) on llama-tiny's grouped-query block.
    let cfg = DecoderConfig {
        n_layer: 2,
        block_size: 16,
        arch: DecoderArch {
            qk_norm: true,
            qkv_bias: true,
            ..llama_tiny().arch
        },
        ..llama_tiny()
    };
    // Plain SGD: the QK-norm's fused kernel rounds otherwise than the composite, and AdamW
    // after 5 steps turned that into a wte relative L2 of 8.4e-4 (one element 3.6e-2 of its
    // scale); under SGD the same runs agree to 1.2e-6, as with the composite.
    let f = fixture_for(&cfg, Opt::Sgd);
    assert!(f
        .init
        .iter()
        .any(|(n, _)| n == "blocks.0.attn.q_norm.weight"));
    assert!(f.init.iter().any(|(n, _)| n == "blocks.0.attn.qkv.bias"));
    assert_tp_matches(&tp2(&cfg, &f, Opt::Sgd), &f, "qk-norm tp=2");
}

#[test]
fn llama_tiny_pipeline_parallel_2_equals_one_rank() {
    let f = fixture();
    let cfg = llama_tiny();
    let out = train_pipeline(&cfg, &f.init, &f.batches, (2, 2), (LR, WD), T);
    for (s, (losses, grads0, weights)) in out.iter().enumerate() {
        let what = format!("llama pp=2 stage {s}");
        assert_losses_close(losses, &f.losses, &what);
        assert_all_close(grads0, &f.grads0, GRAD_TOL, &format!("{what} grads"));
        let e = assert_weights_close(weights, &f.weights, &format!("{what} weights"));
        println!("{what}: weights after {STEPS} AdamW steps rel L2 err {e:e}");
    }
}

#[test]
fn tensor_parallel_refuses_kv_heads_that_do_not_split() {
    let comm = |n: usize| -> Box<dyn Communicator> {
        Box::new(ThreadGroup::with_timeout(n, Duration::from_secs(2)).swap_remove(0))
    };
    // Multi-query: 4 query heads share 1 kv head, which 2 ranks cannot split.
    let mqa = DecoderConfig {
        arch: DecoderArch {
            n_kv_head: Some(1),
            ..llama_tiny().arch
        },
        ..llama_tiny()
    };
    let (init, _) = setup(&mqa, 1, 0);
    let e = match TpGpt::from_named(&mqa, &init, comm(2)) {
        Ok(_) => panic!("tp=2 with 1 kv head should be refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("1 key/value heads do not split over 2 ranks") && e.contains("n_kv_head"),
        "{e}"
    );
    // llama-tiny's 2 kv heads split over 2 ranks but not over 4 (its 4 query heads would).
    assert!(check_tp_config(&llama_tiny(), 2).is_ok());
    let e = check_tp_config(&llama_tiny(), 4).unwrap_err().to_string();
    assert!(
        e.contains("2 key/value heads do not split over 4 ranks"),
        "{e}"
    );
}
