//! Tensor parallelism (Megatron style) of the GPT, on threads: TP with 2 and 4 ranks matches
//! the unsharded model (logits, loss, gathered gradients, 5 AdamW steps), the vocabulary-
//! parallel embedding and cross-entropy match their dense forms, DP × TP (2 × 2) matches
//! serial training, and bad configurations are clear errors.

mod gpt_common;
use gpt_common::{assert_losses_close, setup, worst_elem, Named};

use std::time::Duration;

use sinter_core::{Device, Result, Rng, Tensor};
use sinter_dist::pipeline::{train_gpt_parallel, ParallelSpec, Schedule};
use sinter_dist::tensor_parallel::{
    shared_comm, snapshot_parameters, vocab_parallel_cross_entropy, vocab_parallel_embedding,
    TpGpt, IGNORE_INDEX,
};
use sinter_dist::{run_on_threads, Communicator, ThreadGroup};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::{AdamW, Module, Optimizer};

const T: Duration = Duration::from_secs(60);
const STEPS: usize = 5;
const LR: f64 = 3e-3;
const WD: f64 = 0.1;
/// Weights after the AdamW steps, relative to each tensor's largest magnitude. Gradients agree
/// to ~5e-7; AdamW divides each gradient by its own running magnitude, which amplifies the
/// f32 rounding differences of components whose gradient is close to zero (the same 2–3e-5
/// shows up between serial and plain data-parallel training, which only reorders sums).
const WEIGHT_TOL: f64 = 1e-4;

fn config() -> DecoderConfig {
    DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: 16,
        vocab_size: 64,
        dropout: 0.0,
        ..Default::default()
    }
}

fn adamw(p: Named) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(AdamW::new(p, LR, WD)?))
}

/// Serial reference: a full GPT from `init`, one AdamW step per batch.
struct Serial {
    logits0: Tensor,
    grads0: Named,
    losses: Vec<f32>,
    weights: Named,
}

fn serial(cfg: &DecoderConfig, init: &Named, batches: &[(Tensor, Tensor)]) -> Serial {
    let gpt = Decoder::new(cfg.clone(), &mut Rng::new(0), &shared_rng(0)).unwrap();
    for ((n, p), (m, w)) in gpt.parameters().iter().zip(init) {
        assert_eq!(n, m);
        p.assign(w).unwrap();
    }
    let mut opt = AdamW::new(gpt.parameters(), LR, WD).unwrap();
    let (mut logits0, mut grads0, mut losses) = (None, Vec::new(), Vec::new());
    for (i, (ids, tg)) in batches.iter().enumerate() {
        opt.zero_grad();
        let logits = gpt.forward(ids).unwrap();
        let v = cfg.vocab_size;
        let n = ids.numel();
        let loss = logits
            .reshape(&[n, v])
            .unwrap()
            .cross_entropy(&tg.reshape(&[n]).unwrap(), IGNORE_INDEX)
            .unwrap();
        loss.backward().unwrap();
        if i == 0 {
            logits0 = Some(logits.detach());
            grads0 = gpt
                .parameters()
                .into_iter()
                .map(|(n, p)| (n, p.grad().unwrap()))
                .collect();
        }
        losses.push(loss.to_scalar_f32().unwrap());
        opt.step().unwrap();
    }
    Serial {
        logits0: logits0.unwrap(),
        grads0,
        losses,
        weights: snapshot_parameters(&gpt).unwrap(),
    }
}

/// max |a − b| / max |b|: the error relative to the tensor's scale.
fn rel_err(a: &Tensor, b: &Tensor) -> f64 {
    worst_elem(a, b, None).0
}

/// The key bias gets an exactly zero gradient (softmax ignores a constant added to a row of
/// scores), so what it receives is rounding noise, which AdamW normalises into small random
/// moves. Those elements are compared with an absolute bound instead of relative to the
/// tensor's scale. Fused (flash) attention rounds differently per rank layout, so after five
/// steps the noise moves reach ~1.3e-5; a real gradient there would move it by ~lr = 3e-3 a
/// step, 30× above this bound.
const ZERO_GRAD_ATOL: f64 = 1e-4;

fn assert_named_close(got: &Named, want: &Named, tol: f64, what: &str) -> f64 {
    gpt_common::assert_named_close(got, want, tol, ZERO_GRAD_ATOL, what)
}

#[test]
fn tp_matches_serial_logits_loss_grads_and_adamw_trajectory() {
    let cfg = config();
    let (init, batches) = setup(&cfg, 4, STEPS);
    let want = serial(&cfg, &init, &batches);
    for tp in [2, 4] {
        let out = run_on_threads(tp, T, |c| {
            let model = TpGpt::from_named(&cfg, &init, Box::new(c)).unwrap();
            assert_eq!(model.wte.weight.shape(), [64 / tp, 32]);
            // Slicing then gathering gives back the exact full weights.
            let round = model.gather_weights().unwrap();
            for ((n, a), (_, b)) in round.iter().zip(&init) {
                assert_eq!(a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap(), "{n}");
            }
            let logits = model
                .gather_logits(&model.logits_shard(&batches[0].0).unwrap())
                .unwrap();
            let mut opt = AdamW::new(model.parameters(), LR, WD).unwrap();
            let (mut losses, mut grads0) = (Vec::new(), Vec::new());
            for (i, (ids, tg)) in batches.iter().enumerate() {
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
        });
        for (r, (logits, losses, grads0, weights)) in out.iter().enumerate() {
            let what = format!("tp={tp} rank {r}");
            let e = rel_err(logits, &want.logits0);
            assert!(e <= 1e-5, "{what}: logits differ by {e:e}");
            assert_losses_close(losses, &want.losses, &what);
            let eg = assert_named_close(grads0, &want.grads0, 1e-5, &format!("{what} grads"));
            let ew = assert_named_close(
                weights,
                &want.weights,
                WEIGHT_TOL,
                &format!("{what} weights"),
            );
            if r == 0 {
                println!("tp={tp}: logits rel err {e:e}, grads {eg:e}, weights after {STEPS} AdamW steps {ew:e}");
            }
        }
    }
}

#[test]
fn tp_vocab_parallel_embedding_and_cross_entropy_match_dense() {
    let (n, v, c) = (24usize, 64usize, 8usize);
    let mut rng = Rng::new(3);
    let logits: Vec<f32> = (0..n * v).map(|_| rng.normal() as f32 * 3.0).collect();
    let table: Vec<f32> = (0..v * c).map(|_| rng.normal() as f32).collect();
    let mut targets: Vec<i64> = (0..n).map(|_| rng.below(v as u64) as i64).collect();
    targets[5] = IGNORE_INDEX;
    targets[17] = IGNORE_INDEX;
    let ids: Vec<i64> = (0..n).map(|_| rng.below(v as u64) as i64).collect();
    let cot: Vec<f32> = (0..n * c).map(|_| rng.normal() as f32).collect();

    // Dense reference.
    let l = Tensor::from_vec(logits.clone(), &[n, v], Device::Cpu)
        .unwrap()
        .to_var()
        .unwrap();
    let tg = Tensor::from_vec(targets.clone(), &[n], Device::Cpu).unwrap();
    let loss = l.cross_entropy(&tg, IGNORE_INDEX).unwrap();
    loss.backward().unwrap();
    let (want_loss, want_dl) = (loss.to_scalar_f32().unwrap(), l.grad().unwrap());
    let tb = Tensor::from_vec(table.clone(), &[v, c], Device::Cpu)
        .unwrap()
        .to_var()
        .unwrap();
    let idt = Tensor::from_vec(ids.clone(), &[4, 6], Device::Cpu).unwrap();
    let emb = tb.embedding(&idt).unwrap();
    let cot_t = Tensor::from_vec(cot.clone(), &[4, 6, c], Device::Cpu).unwrap();
    emb.backward_with_grad(&cot_t, |_, _| Ok(())).unwrap();
    let (want_emb, want_dt) = (emb.detach(), tb.grad().unwrap());

    for tp in [2, 4] {
        let vl = v / tp;
        let out = run_on_threads(tp, T, |c0| {
            let r = c0.rank();
            let comm = shared_comm(Box::new(c0));
            let cols: Vec<f32> = (0..n)
                .flat_map(|i| logits[i * v + r * vl..i * v + (r + 1) * vl].to_vec())
                .collect();
            let ls = Tensor::from_vec(cols, &[n, vl], Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap();
            let loss =
                vocab_parallel_cross_entropy(&ls, r * vl, v, &tg, IGNORE_INDEX, &comm).unwrap();
            loss.backward().unwrap();
            let rows = table[r * vl * c..(r + 1) * vl * c].to_vec();
            let ts = Tensor::from_vec(rows, &[vl, c], Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap();
            let e = vocab_parallel_embedding(&ts, r * vl, v, &idt, &comm).unwrap();
            e.backward_with_grad(&cot_t, |_, _| Ok(())).unwrap();
            // An id outside the vocabulary is an error on every rank, not a silent zero.
            let bad = Tensor::from_vec(vec![v as i64], &[1, 1], Device::Cpu).unwrap();
            assert!(vocab_parallel_embedding(&ts, r * vl, v, &bad, &comm).is_err());
            (
                loss.to_scalar_f32().unwrap(),
                ls.grad().unwrap(),
                e.detach(),
                ts.grad().unwrap(),
            )
        });
        for (r, (loss, dl, e, dt)) in out.iter().enumerate() {
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "tp={tp}: {loss} vs {want_loss}"
            );
            let want_cols = want_dl.narrow(1, r * vl, vl).unwrap().contiguous().unwrap();
            assert!(
                rel_err(dl, &want_cols) <= 1e-5,
                "tp={tp} rank {r}: logits gradient"
            );
            assert!(rel_err(e, &want_emb) <= 1e-6, "tp={tp} rank {r}: embedding");
            let want_rows = want_dt.narrow(0, r * vl, vl).unwrap().contiguous().unwrap();
            assert!(
                rel_err(dt, &want_rows) <= 1e-6,
                "tp={tp} rank {r}: table gradient"
            );
        }
    }
}

#[test]
fn dp_x_tp_2x2_matches_serial() {
    let cfg = config();
    let (init, batches) = setup(&cfg, 4, STEPS);
    let want = serial(&cfg, &init, &batches);
    for micro_batches in [1, 2] {
        let spec = ParallelSpec {
            dp: 2,
            tp: 2,
            pp: 1,
            micro_batches,
            schedule: Schedule::OneFOneB,
        };
        let out = run_on_threads(4, T, |mut c| {
            train_gpt_parallel(&cfg, &init, &spec, &mut c, &adamw, &batches).unwrap()
        });
        for (r, rep) in out.iter().enumerate() {
            let what = format!("dp2×tp2 m={micro_batches} rank {r}");
            assert_losses_close(&rep.losses, &want.losses, &what);
            let e = assert_named_close(&rep.weights, &want.weights, WEIGHT_TOL, &what);
            if r == 0 {
                println!("{what}: weights after {STEPS} steps rel err {e:e}");
            }
        }
    }
}

#[test]
fn tp_bad_configs_are_errors() {
    let comm = |n: usize| -> Box<dyn Communicator> {
        Box::new(ThreadGroup::with_timeout(n, Duration::from_secs(2)).swap_remove(0))
    };
    let base = config();
    let (init, _) = setup(&base, 1, 0);
    let err = |cfg: &DecoderConfig, w: &Named, n: usize| -> String {
        match TpGpt::from_named(cfg, w, comm(n)) {
            Ok(_) => panic!("tp={n} with {cfg:?} should be rejected"),
            Err(e) => e.to_string(),
        }
    };
    // 4 heads over 3 ranks.
    let e = err(&base, &init, 3);
    assert!(e.contains("heads") && e.contains("3"), "{e}");
    // Heads divide but the vocabulary does not.
    let cfg = DecoderConfig {
        vocab_size: 66,
        ..base.clone()
    };
    let gpt = Decoder::new(cfg.clone(), &mut Rng::new(1), &shared_rng(1)).unwrap();
    let e = err(&cfg, &gpt.parameters(), 4);
    assert!(e.contains("vocabulary"), "{e}");
    // Dropout would need synchronised generators.
    let cfg = DecoderConfig {
        dropout: 0.1,
        ..base.clone()
    };
    assert!(err(&cfg, &init, 2).contains("dropout"));
    // Weights that do not belong to the config.
    let e = err(&base, &init[1..].to_vec(), 2);
    assert!(e.contains("wte.weight") && e.contains("missing"), "{e}");
    let cfg = DecoderConfig {
        n_layer: 3,
        ..base.clone()
    };
    assert!(err(&cfg, &init, 2).contains("blocks.2"));
    // Mesh specs.
    let spec = ParallelSpec {
        dp: 1,
        tp: 2,
        pp: 2,
        micro_batches: 1,
        schedule: Schedule::GPipe,
    };
    let e = spec.validate(&base, 4).unwrap_err().to_string();
    assert!(e.contains("not supported"), "{e}");
    let spec = ParallelSpec {
        dp: 2,
        tp: 2,
        pp: 1,
        micro_batches: 1,
        schedule: Schedule::GPipe,
    };
    let e = spec.validate(&base, 3).unwrap_err().to_string();
    assert!(e.contains("world has 3"), "{e}");
}
