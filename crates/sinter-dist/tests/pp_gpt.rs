//! Pipeline parallelism of the GPT, on threads: 2 and 4 stages with GPipe and 1F1B match the
//! unpipelined model over 5 AdamW steps, report the bubble (p − 1)/(m + p − 1) in schedule
//! steps, 1F1B holds at most p micro-batches of activations per stage while GPipe holds m,
//! DP × PP (2 × 2) matches serial training, and bad configurations are clear errors.

mod gpt_common;
use gpt_common::{assert_losses_close, Named};

use std::time::Duration;

use sinter_core::{Rng, Tensor};
use sinter_dist::pipeline::{
    partition_layers, schedule_actions, simulate_schedule, theoretical_bubble, train_gpt_parallel,
    Action, ParallelSpec, PipelineGpt, PipelineStats, Schedule,
};
use sinter_dist::tensor_parallel::{snapshot_parameters, IGNORE_INDEX};
use sinter_dist::{run_on_threads, ThreadGroup};
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
const BATCH: usize = 8;

fn config() -> DecoderConfig {
    DecoderConfig {
        n_layer: 4,
        n_head: 4,
        n_embd: 32,
        block_size: 16,
        vocab_size: 64,
        dropout: 0.0,
        ..Default::default()
    }
}

fn setup(cfg: &DecoderConfig, b: usize, n: usize) -> (Named, Vec<(Tensor, Tensor)>) {
    gpt_common::setup_with(cfg, b, n, 11, 5)
}

struct Serial {
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
    let (mut grads0, mut losses) = (Vec::new(), Vec::new());
    for (i, (ids, tg)) in batches.iter().enumerate() {
        opt.zero_grad();
        let n = ids.numel();
        let loss = gpt
            .forward(ids)
            .unwrap()
            .reshape(&[n, cfg.vocab_size])
            .unwrap()
            .cross_entropy(&tg.reshape(&[n]).unwrap(), IGNORE_INDEX)
            .unwrap();
        loss.backward().unwrap();
        if i == 0 {
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
        grads0,
        losses,
        weights: snapshot_parameters(&gpt).unwrap(),
    }
}

/// The key bias gets an exactly zero gradient (softmax ignores a constant added to a row of
/// scores), so what it receives is rounding noise, which AdamW normalises into small random
/// moves. Those elements are compared with an absolute bound instead of relative to the
/// tensor's scale.
const ZERO_GRAD_ATOL: f64 = 1e-5;

fn assert_named_close(got: &Named, want: &Named, tol: f64, what: &str) -> f64 {
    gpt_common::assert_named_close(got, want, tol, ZERO_GRAD_ATOL, what)
}

#[test]
fn pp_gpipe_and_1f1b_match_serial_with_the_expected_bubble_and_memory() {
    let cfg = config();
    let (init, batches) = setup(&cfg, BATCH, STEPS);
    let want = serial(&cfg, &init, &batches);
    for (p, m) in [(2usize, 4usize), (4, 8)] {
        for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
            let out = run_on_threads(p, T, |c| {
                let mut pipe =
                    PipelineGpt::from_named(&cfg, &init, Box::new(c), schedule, m).unwrap();
                let mut opt = AdamW::new(pipe.parameters(), LR, WD).unwrap();
                let (mut losses, mut stats, mut grads0) = (Vec::new(), Vec::new(), Vec::new());
                for (i, (ids, tg)) in batches.iter().enumerate() {
                    opt.zero_grad();
                    let st = pipe.forward_backward(ids, tg).unwrap();
                    if i == 0 {
                        grads0 = pipe.gather_grads().unwrap();
                    }
                    opt.step().unwrap();
                    losses.push(st.loss);
                    stats.push(st);
                }
                // The last stage's copy of the tied head stays equal to stage 0's embedding.
                let wte = pipe
                    .parameters()
                    .into_iter()
                    .find(|(n, _)| n == "wte.weight")
                    .map(|(_, t)| t.to_vec_f32().unwrap());
                (losses, stats, grads0, pipe.gather_weights().unwrap(), wte)
            });
            let what = format!("pp={p} m={m} {schedule}");
            let bubble = (p as f64 - 1.0) / (m as f64 + p as f64 - 1.0);
            let mut measured = Vec::new();
            for (s, (losses, stats, grads0, weights, _)) in out.iter().enumerate() {
                let w = format!("{what} stage {s}");
                assert_losses_close(losses, &want.losses, &w);
                let eg = assert_named_close(grads0, &want.grads0, 1e-5, &format!("{w} grads"));
                let e =
                    assert_named_close(weights, &want.weights, WEIGHT_TOL, &format!("{w} weights"));
                if s == 0 {
                    println!(
                        "{what}: grads rel err {eg:e}, weights after {STEPS} AdamW steps {e:e}"
                    );
                }
                let st: &PipelineStats = stats.last().unwrap();
                assert_eq!((st.stage, st.stages, st.micro_batches), (s, p, m));
                assert_eq!(st.theoretical_bubble, bubble);
                assert!(
                    (st.schedule_bubble - bubble).abs() < 1e-12,
                    "{w}: schedule bubble {}",
                    st.schedule_bubble
                );
                assert!((0.0..=1.0).contains(&st.measured_bubble));
                // Activations in flight: GPipe keeps all m, 1F1B at most p − s (≤ p).
                let want_in_flight = match schedule {
                    Schedule::GPipe => m,
                    Schedule::OneFOneB => (p - s).min(m),
                };
                assert_eq!(
                    st.max_in_flight, want_in_flight,
                    "{w}: activations in flight"
                );
                assert!(schedule == Schedule::GPipe || st.max_in_flight <= p);
                measured.push(format!("{:.2}", st.measured_bubble));
            }
            assert_eq!(out[0].4, out[p - 1].4, "{what}: tied wte copies diverged");
            println!(
                "{what}: bubble (p-1)/(m+p-1) = {bubble:.3}, in schedule steps {:.3}, measured idle per stage [{}]",
                out[0].1.last().unwrap().schedule_bubble,
                measured.join(", ")
            );
        }
    }
}

#[test]
fn pp_schedules_have_the_bubble_formula_in_steps() {
    for p in 1..=6usize {
        for m in 1..=12usize {
            for schedule in [Schedule::GPipe, Schedule::OneFOneB] {
                for (tf, tb) in [(1.0, 1.0), (1.0, 2.0)] {
                    let sim = simulate_schedule(schedule, p, m, tf, tb).unwrap();
                    let what = format!("{schedule} p={p} m={m} tf={tf} tb={tb}");
                    assert_eq!(sim.makespan, (m + p - 1) as f64 * (tf + tb), "{what}");
                    for s in 0..p {
                        assert!(
                            (sim.bubble[s] - theoretical_bubble(p, m)).abs() < 1e-12,
                            "{what}"
                        );
                        let peak = match schedule {
                            Schedule::GPipe => m,
                            Schedule::OneFOneB => (p - s).min(m),
                        };
                        assert_eq!(sim.max_in_flight[s], peak, "{what} stage {s}");
                    }
                }
            }
            // Every micro-batch runs forward and backward once on every stage.
            for s in 0..p {
                let a = schedule_actions(Schedule::OneFOneB, s, p, m);
                assert_eq!(
                    a.iter().filter(|x| matches!(x, Action::Forward(_))).count(),
                    m
                );
                assert_eq!(a.len(), 2 * m);
            }
        }
    }
    assert_eq!(theoretical_bubble(4, 8), 3.0 / 11.0);
    assert_eq!("1f1b".parse::<Schedule>().unwrap(), Schedule::OneFOneB);
    assert_eq!("GPipe".parse::<Schedule>().unwrap(), Schedule::GPipe);
    assert!("zero-bubble".parse::<Schedule>().is_err());
}

#[test]
fn dp_x_pp_2x2_matches_serial() {
    let cfg = config();
    let (init, batches) = setup(&cfg, BATCH, STEPS);
    let want = serial(&cfg, &init, &batches);
    let adamw = |p: Named| -> sinter_core::Result<Box<dyn Optimizer>> {
        Ok(Box::new(AdamW::new(p, LR, WD)?))
    };
    for (dp, pp, schedule) in [
        (2, 2, Schedule::OneFOneB),
        (2, 2, Schedule::GPipe),
        (4, 1, Schedule::OneFOneB),
    ] {
        let spec = ParallelSpec {
            dp,
            tp: 1,
            pp,
            micro_batches: 2,
            schedule,
        };
        let out = run_on_threads(4, T, |mut c| {
            train_gpt_parallel(&cfg, &init, &spec, &mut c, &adamw, &batches).unwrap()
        });
        for (r, rep) in out.iter().enumerate() {
            let what = format!("dp{dp}×pp{pp} {schedule} rank {r}");
            assert_losses_close(&rep.losses, &want.losses, &what);
            let e = assert_named_close(&rep.weights, &want.weights, WEIGHT_TOL, &what);
            let st = rep.pipeline.as_ref().unwrap();
            assert_eq!(st.stage, r % pp);
            if r == 0 {
                println!(
                    "{what}: weights after {STEPS} steps rel err {e:e}, schedule bubble {:.3}",
                    st.schedule_bubble
                );
            }
        }
    }
}

#[test]
fn pp_bad_configs_are_errors_not_hangs() {
    let cfg = config();
    let (init, batches) = setup(&cfg, BATCH, 1);
    let comm = |n: usize, r: usize| {
        Box::new(ThreadGroup::with_timeout(n, Duration::from_secs(2)).swap_remove(r))
    };
    // Fewer layers than stages.
    let small = DecoderConfig {
        n_layer: 2,
        ..cfg.clone()
    };
    let gpt = Decoder::new(small.clone(), &mut Rng::new(1), &shared_rng(1)).unwrap();
    for r in 0..4 {
        let e = PipelineGpt::from_gpt(&gpt, comm(4, r), Schedule::OneFOneB, 4)
            .err()
            .expect("2 layers on 4 stages");
        assert!(
            e.to_string().contains("2 layers cannot fill 4 stages"),
            "{e}"
        );
    }
    assert!(partition_layers(3, 0).is_err());
    assert_eq!(
        partition_layers(4, 4).unwrap(),
        vec![0..1, 1..2, 2..3, 3..4]
    );
    // No micro-batches; a batch that does not split into them.
    assert!(PipelineGpt::from_named(&cfg, &init, comm(1, 0), Schedule::GPipe, 0).is_err());
    let mut pipe = PipelineGpt::from_named(&cfg, &init, comm(1, 0), Schedule::GPipe, 3).unwrap();
    let (ids, tg) = &batches[0];
    let e = pipe.forward_backward(ids, tg).unwrap_err().to_string();
    assert!(e.contains("does not split into 3 micro-batches"), "{e}");
    // Mesh specs: layers < stages, world size, batch vs dp × micro-batches.
    let spec = ParallelSpec {
        dp: 1,
        tp: 1,
        pp: 8,
        micro_batches: 1,
        schedule: Schedule::GPipe,
    };
    assert!(spec
        .validate(&cfg, 8)
        .unwrap_err()
        .to_string()
        .contains("cannot fill"));
    let spec = ParallelSpec {
        dp: 2,
        tp: 1,
        pp: 2,
        micro_batches: 0,
        schedule: Schedule::GPipe,
    };
    assert!(spec.validate(&cfg, 4).is_err());
    let spec = ParallelSpec {
        dp: 2,
        tp: 1,
        pp: 2,
        micro_batches: 3,
        schedule: Schedule::GPipe,
    };
    let adamw = |p: Named| -> sinter_core::Result<Box<dyn Optimizer>> {
        Ok(Box::new(AdamW::new(p, LR, WD)?))
    };
    let errs = run_on_threads(4, Duration::from_secs(5), |mut c| {
        train_gpt_parallel(&cfg, &init, &spec, &mut c, &adamw, &batches)
            .err()
            .map(|e| e.to_string())
    });
    for e in errs {
        assert!(e.unwrap().contains("2 replicas × 3 micro-batches"));
    }
}

/// The Llama block (RMSNorm, SwiGLU, rotary positions, grouped-query attention, untied head)
/// through the same pipeline stages: 2 stages, 1F1B, equal to the unpipelined model over 5
/// AdamW steps (tensor parallel: tests/llama_parallel.rs).
#[test]
fn pp_runs_the_llama_block_like_one_rank() {
    let cfg = DecoderConfig {
        arch: sinter_models::DecoderArch {
            n_kv_head: Some(2),
            mlp_hidden: Some(48),
            ..sinter_models::DecoderArch::llama(10_000.0)
        },
        ..config()
    };
    let (init, batches) = setup(&cfg, BATCH, STEPS);
    assert!(init.iter().any(|(n, _)| n == "lm_head.weight"));
    assert!(!init.iter().any(|(n, _)| n == "wpe.weight"));
    let want = serial(&cfg, &init, &batches);
    let out = gpt_common::train_pipeline(&cfg, &init, &batches, (2, 4), (LR, WD), T);
    for (s, (losses, grads0, weights)) in out.iter().enumerate() {
        let w = format!("llama pp=2 stage {s}");
        assert_losses_close(losses, &want.losses, &w);
        assert_named_close(grads0, &want.grads0, 1e-5, &format!("{w} grads"));
        assert_named_close(weights, &want.weights, WEIGHT_TOL, &format!("{w} weights"));
    }
}
