//! Tensor / pipeline parallel checkpoints that do not depend on the layout, and gradient
//! clipping under TP/PP, on threads:
//! * weights and optimizer state gathered from TP = 2 or PP = 2 after two steps are the
//!   canonical full layout (standard names, full shapes); training resumed from them on one
//!   rank, on DP = 2, on PP = 2 and on TP = 2 matches the uninterrupted run; resuming without
//!   the optimizer state does not (so the state really is carried over);
//! * clipping to a global norm under TP = 2 and PP = 2 matches serial training with
//!   `clip_grad_norm`, the reported norm equals the serial one, and clipping was active.

mod gpt_common;
use gpt_common::{setup, Named};

use std::collections::HashMap;
use std::time::Duration;

use sinter_core::{Result, Rng, Tensor};
use sinter_dist::pipeline::{ParallelSpec, ParallelTrainer, Schedule};
use sinter_dist::run_on_threads;
use sinter_dist::tensor_parallel::{snapshot_parameters, IGNORE_INDEX};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::{AdamW, Module, Optimizer, Sgd};

const T: Duration = Duration::from_secs(60);
const LR: f64 = 3e-3;
/// See tests/tp_gpt.rs: AdamW amplifies f32 rounding differences of near-zero gradients.
const WEIGHT_TOL: f64 = 2e-4;

fn config() -> DecoderConfig {
    DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: 8,
        vocab_size: 64,
        dropout: 0.0,
        ..Default::default()
    }
}

fn adamw(p: Named) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(AdamW::new(p, LR, 0.1)?))
}

fn spec(dp: usize, tp: usize, pp: usize) -> ParallelSpec {
    ParallelSpec {
        dp,
        tp,
        pp,
        micro_batches: 2,
        schedule: Schedule::OneFOneB,
    }
}

/// What a run leaves: weights, canonical optimizer state, optimizer steps (rank 0's).
struct Ckpt {
    weights: Named,
    state: Named,
    steps: u64,
}

/// Trains under `sp` from `start` (weights and, if given, optimizer state) on `batches`.
fn run(
    cfg: &DecoderConfig,
    sp: &ParallelSpec,
    start: &Named,
    state: Option<(&Named, u64)>,
    batches: &[(Tensor, Tensor)],
) -> Ckpt {
    let mut out = run_on_threads(sp.world_size(), T, |mut c| {
        let mut tr = ParallelTrainer::new(cfg, start, sp, &mut c, &adamw).unwrap();
        if let Some((s, steps)) = state {
            let map: HashMap<String, Tensor> = s.iter().cloned().collect();
            tr.load_optimizer_state(steps, &map).unwrap();
        }
        for (ids, tg) in batches {
            tr.step(ids, tg).unwrap();
        }
        let weights = tr.gather_weights().unwrap();
        let state = tr.gather_optimizer_state().unwrap();
        Ckpt {
            weights,
            state,
            steps: tr.optimizer_mut().steps(),
        }
    });
    out.swap_remove(0)
}

/// max |a − b| / max |b| over the elements outside `skip`.
fn rel_err(a: &Tensor, b: &Tensor, skip: std::ops::Range<usize>) -> f64 {
    assert_eq!(a.shape(), b.shape());
    let (a, b) = (a.to_vec_f64().unwrap(), b.to_vec_f64().unwrap());
    let scale = b.iter().fold(1e-12f64, |m, x| m.max(x.abs()));
    a.iter()
        .zip(&b)
        .enumerate()
        .filter(|(i, _)| !skip.contains(i))
        .map(|(_, (x, y))| (x - y).abs())
        .fold(0.0, f64::max)
        / scale
}

/// The key bias gets an exactly zero gradient (softmax ignores a constant added to a row of
/// scores): what AdamW does with its rounding noise is compared with an absolute bound (see
/// tests/tp_gpt.rs); a real gradient would move it by ~lr a step, 30× above the bound.
const ZERO_GRAD_ATOL: f64 = 1e-4;

/// Largest relative error over the tensors (same names, same order), the key bias aside.
fn worst(got: &Named, want: &Named) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut e = 0f64;
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn);
        let skip = if gn.contains("attn.qkv.bias") {
            let c = g.numel() / 3;
            c..2 * c
        } else {
            0..0
        };
        let (a, b) = (g.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        for j in skip.clone() {
            let d = (a[j] - b[j]).abs();
            assert!(d <= ZERO_GRAD_ATOL, "{gn}[{j}] (key bias) differs by {d:e}");
        }
        let r = rel_err(g, w, skip);
        if r > e {
            e = r;
            println!("  worst so far: {gn} {r:e}");
        }
    }
    e
}

#[test]
fn tp_and_pp_checkpoints_resume_on_any_layout() {
    let cfg = config();
    let (init, batches) = setup(&cfg, 4, 4);
    let (first, second) = batches.split_at(2);
    let whole = run(&cfg, &spec(1, 2, 1), &init, None, &batches);
    let full_names: Vec<String> = init.iter().map(|(n, _)| n.clone()).collect();
    for (from_name, from) in [("tp2", spec(1, 2, 1)), ("pp2", spec(1, 1, 2))] {
        let half = run(&cfg, &from, &init, None, first);
        assert_eq!(half.steps, 2);
        // Canonical layout: full names and shapes, two AdamW moments per parameter.
        let shapes: HashMap<&str, &[usize]> =
            init.iter().map(|(n, t)| (n.as_str(), t.shape())).collect();
        assert_eq!(
            half.state.len(),
            2 * init.len(),
            "{from_name}: state tensors"
        );
        for (k, t) in &half.state {
            let (p, suffix) = k.rsplit_once('.').unwrap();
            assert!(["exp_avg", "exp_avg_sq"].contains(&suffix), "{k}");
            assert_eq!(t.shape(), shapes[p], "{from_name}: {k} has the full shape");
        }
        let wn: Vec<String> = half.weights.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(wn, full_names);
        for (to_name, to) in [
            ("1 rank", spec(1, 1, 1)),
            ("dp2", spec(2, 1, 1)),
            ("pp2", spec(1, 1, 2)),
            ("tp2", spec(1, 2, 1)),
        ] {
            let resumed = run(
                &cfg,
                &to,
                &half.weights,
                Some((&half.state, half.steps)),
                second,
            );
            assert_eq!(resumed.steps, 4);
            let e = worst(&resumed.weights, &whole.weights);
            println!("{from_name} -> {to_name}: weights rel err {e:e}");
            assert!(e <= WEIGHT_TOL, "{from_name} checkpoint resumed on {to_name}: weights differ from the uninterrupted run by {e:e}");
            let s = worst(&resumed.state, &whole.state);
            assert!(
                s <= WEIGHT_TOL,
                "{from_name} -> {to_name}: optimizer state differs by {s:e}"
            );
        }
        // Without the optimizer state the run goes elsewhere: the state matters.
        let fresh = run(&cfg, &spec(1, 1, 1), &half.weights, None, second);
        let e = worst(&fresh.weights, &whole.weights);
        assert!(
            e > 10.0 * WEIGHT_TOL,
            "{from_name}: resuming without optimizer state should differ, got {e:e}"
        );
    }
}

#[test]
fn missing_optimizer_state_is_a_clear_error() {
    let cfg = config();
    let (init, _) = setup(&cfg, 4, 0);
    let msg = run_on_threads(2, T, |mut c| {
        let mut tr = ParallelTrainer::new(&cfg, &init, &spec(1, 2, 1), &mut c, &adamw).unwrap();
        tr.load_optimizer_state(3, &HashMap::new())
            .unwrap_err()
            .to_string()
    });
    assert!(msg[0].contains("wte.weight.exp_avg"), "{}", msg[0]);
}

const CLIP: f64 = 0.05;
const SGD_LR: f64 = 0.5;

fn sgd(p: Named) -> Result<Box<dyn Optimizer>> {
    Ok(Box::new(Sgd::new(p, SGD_LR, 0.0, false, 0.0)?))
}

/// Serial SGD with `clip_grad_norm`; returns the weights and the norm of each step.
fn serial_clipped(
    cfg: &DecoderConfig,
    init: &Named,
    batches: &[(Tensor, Tensor)],
    m: usize,
    clip: Option<f64>,
) -> (Named, Vec<f64>) {
    let gpt = Decoder::new(cfg.clone(), &mut Rng::new(0), &shared_rng(0)).unwrap();
    for ((_, p), (_, w)) in gpt.parameters().iter().zip(init) {
        p.assign(w).unwrap();
    }
    let params = gpt.parameters();
    let mut opt = Sgd::new(params.clone(), SGD_LR, 0.0, false, 0.0).unwrap();
    let mut norms = Vec::new();
    for (ids, tg) in batches {
        opt.zero_grad();
        let b = ids.shape()[0] / m;
        for k in 0..m {
            let (x, y) = (
                ids.narrow(0, k * b, b).unwrap(),
                tg.narrow(0, k * b, b).unwrap(),
            );
            let n = x.numel();
            let loss = gpt
                .forward(&x.contiguous().unwrap())
                .unwrap()
                .reshape(&[n, cfg.vocab_size])
                .unwrap()
                .cross_entropy(
                    &y.contiguous().unwrap().reshape(&[n]).unwrap(),
                    IGNORE_INDEX,
                )
                .unwrap();
            loss.mul_scalar(1.0 / m as f32).unwrap().backward().unwrap();
        }
        if let Some(c) = clip {
            norms.push(sinter_nn::clip_grad_norm(&params, c).unwrap());
        }
        opt.step().unwrap();
    }
    (snapshot_parameters(&gpt).unwrap(), norms)
}

#[test]
fn clipping_under_tp_and_pp_matches_serial() {
    let cfg = config();
    let (init, batches) = setup(&cfg, 4, 3);
    let (want, norms) = serial_clipped(&cfg, &init, &batches, 2, Some(CLIP));
    let (unclipped, _) = serial_clipped(&cfg, &init, &batches, 2, None);
    assert!(
        norms.iter().all(|&n| n > 2.0 * CLIP),
        "clipping must be active: norms {norms:?}"
    );
    assert!(
        worst(&unclipped, &want) > 1e-3,
        "clipping must change the result"
    );
    for (name, sp) in [
        ("tp2", spec(1, 2, 1)),
        ("pp2", spec(1, 1, 2)),
        ("dp2×pp2", spec(2, 1, 2)),
    ] {
        let out = run_on_threads(sp.world_size(), T, |mut c| {
            let mut tr = ParallelTrainer::new(&cfg, &init, &sp, &mut c, &sgd).unwrap();
            tr.set_grad_clip(Some(CLIP));
            let mut got_norms = Vec::new();
            for (ids, tg) in &batches {
                tr.step(ids, tg).unwrap();
                got_norms.push(tr.last_grad_norm().unwrap());
            }
            (tr.gather_weights().unwrap(), got_norms)
        });
        for (r, (w, n)) in out.iter().enumerate() {
            for (g, s) in n.iter().zip(&norms) {
                assert!(
                    (g - s).abs() <= 1e-4 * s,
                    "{name} rank {r}: norm {g} vs serial {s}"
                );
            }
            let e = worst(w, &want);
            assert!(
                e <= 1e-4,
                "{name} rank {r}: clipped weights differ from serial by {e:e}"
            );
        }
    }
}
