//! CUDA graphs of the whole training step (forward, backward, optimizer, loss accumulation,
//! scaler and schedule updates): captured once after warm-up steps, then replayed with each
//! step's inputs copied into the captured buffers. On by default wherever the step can be
//! captured (a CUDA device, one process, static shapes, no dropout): one replay instead of
//! hundreds of kernel launches a step. `--cuda-graph` insists (what cannot be captured is
//! refused with the reason), `--no-cuda-graph` runs every step eagerly.

use anyhow::{bail, Context, Result};
use sinter_core::cuda::runtime::{capture_step, StepGraph};
use sinter_core::{Device, Tensor};
use sinter_models::Task;

use crate::trainer::Console;

/// Whether a run captures its step as a CUDA graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum GraphMode {
    /// Where the step can be captured; elsewhere eager steps, quietly (the default).
    #[default]
    Auto,
    /// `--cuda-graph`: capture, refusing a run whose step cannot be captured.
    On,
    /// `--no-cuda-graph`: every step eager.
    Off,
}

impl GraphMode {
    /// From the `cuda_graph` key: unset is [`GraphMode::Auto`].
    pub fn from_key(key: Option<bool>) -> GraphMode {
        match key {
            None => GraphMode::Auto,
            Some(true) => GraphMode::On,
            Some(false) => GraphMode::Off,
        }
    }
}

/// The graph runner of a run (None: eager steps), with the note or refusal `--cuda-graph`
/// gets on this run.
pub fn plan(
    mode: GraphMode,
    device: Device,
    task: Task,
    data_parallel: bool,
    grad_accum: u64,
    start: u64,
    console: &Console,
) -> Result<Option<GraphRun>> {
    match cuda_graph_decision(mode, device, task, data_parallel, grad_accum) {
        Ok(GraphDecision::Off) => Ok(None),
        Ok(GraphDecision::IgnoredOnCpu) => {
            console.note("--cuda-graph ignored on the CPU: CUDA graphs need a CUDA device (training runs as usual)");
            Ok(None)
        }
        Ok(GraphDecision::Capture { warmup }) => {
            Ok(Some(GraphRun::new(start + warmup, mode == GraphMode::On)))
        }
        Err(why) => bail!("{why}"),
    }
}

/// What `--cuda-graph` does for a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GraphDecision {
    /// Not asked for, or (by default) not possible for this run.
    Off,
    /// Asked for on the CPU: ignored, with a note.
    IgnoredOnCpu,
    /// Capture after `warmup` eager steps (they warm the allocator's cache and load the
    /// kernels), then replay.
    Capture { warmup: u64 },
}

/// Eager steps before the capture.
pub const GRAPH_WARMUP_STEPS: u64 = 3;

/// Decides the CUDA graph from the run's setup. Asked for (`--cuda-graph`): Err (a message
/// for the user) when the step cannot be captured whole; by default such a run is simply
/// eager. Data-parallel steps all-reduce their gradients through the host between backward
/// kernels, so they are not captured. Dropout is checked after the first step
/// ([`dropout_refusal`]); a batch of another shape runs eagerly.
pub fn cuda_graph_decision(
    mode: GraphMode,
    device: Device,
    task: Task,
    data_parallel: bool,
    grad_accum: u64,
) -> std::result::Result<GraphDecision, String> {
    match (mode, device.is_cuda()) {
        (GraphMode::Off, _) | (GraphMode::Auto, false) => return Ok(GraphDecision::Off),
        (GraphMode::On, false) => return Ok(GraphDecision::IgnoredOnCpu),
        _ => {}
    }
    let capturable = task != Task::MaskedLm && !data_parallel && grad_accum > 0;
    if mode == GraphMode::Auto && !capturable {
        return Ok(GraphDecision::Off);
    }
    if task == Task::MaskedLm {
        return Err("--cuda-graph cannot capture a masked-LM step: each batch masks a different number of tokens, so the MLM head's shapes change every step; drop --cuda-graph".into());
    }
    if data_parallel {
        return Err("--cuda-graph cannot capture a data-parallel or ZeRO step: its gradient all-reduce runs on the host between backward kernels; run a single process or drop --cuda-graph".into());
    }
    if grad_accum == 0 {
        return Err("--cuda-graph needs --grad-accum of at least 1".into());
    }
    Ok(GraphDecision::Capture {
        warmup: GRAPH_WARMUP_STEPS,
    })
}

/// With `--cuda-graph`, a step that drew from the dropout generator means the model uses
/// dropout: its masks are seeded on the host at each forward, so a replayed graph would repeat
/// one mask forever. Returns the message refusing the run.
pub fn dropout_refusal(before: [u64; 4], after: [u64; 4]) -> Option<String> {
    (before != after).then(|| {
        "--cuda-graph cannot be used with this model: it applies dropout (p > 0), whose random masks are drawn on the host at every forward pass, so a replayed CUDA graph would reuse one mask; train without --cuda-graph".to_string()
    })
}

/// Shapes of a step's (inputs, targets) per micro-batch: a replay needs the captured ones.
fn batch_shapes(b: &[(Tensor, Tensor)]) -> Vec<(Vec<usize>, Vec<usize>)> {
    b.iter()
        .map(|(x, y)| (x.shape().to_vec(), y.shape().to_vec()))
        .collect()
}

/// The captured step: the graph and the fixed device buffers its inputs are copied into.
struct Captured {
    graph: StepGraph,
    inputs: Vec<(Tensor, Tensor)>,
    shapes: Vec<(Vec<usize>, Vec<usize>)>,
}

/// `--cuda-graph` over a run: eager warm-up steps, one capture of the whole step (forward,
/// backward, optimizer, loss accumulation, scaler and schedule updates), then replays.
pub struct GraphRun {
    capture_at: u64,
    /// `--cuda-graph` was given (notes name the flag; dropout is refused, not worked around).
    pub asked: bool,
    captured: Option<Captured>,
    /// Capture failed: the rest of the run is eager.
    off: bool,
}

impl GraphRun {
    pub fn new(capture_at: u64, asked: bool) -> GraphRun {
        GraphRun {
            capture_at,
            asked,
            captured: None,
            off: false,
        }
    }

    /// Runs `step` through the graph when it can (capturing it first at the capture step);
    /// false: run it eagerly (warm-up, capture failed, or a batch of another shape).
    pub fn run(
        &mut self,
        step: u64,
        batches: &[(Tensor, Tensor)],
        device: Device,
        params: &[(String, Tensor)],
        console: &Console,
        body: impl FnOnce(&[(Tensor, Tensor)]) -> Result<()>,
    ) -> Result<bool> {
        if self.off || step < self.capture_at {
            return Ok(false);
        }
        if let Some(c) = &self.captured {
            if batch_shapes(batches) != c.shapes {
                return Ok(false);
            }
            // Inputs go into the buffers the graph reads; the graph does the rest.
            for ((fx, fy), (x, y)) in c.inputs.iter().zip(batches) {
                fx.assign(&x.to_device(device)?)?;
                fy.assign(&y.to_device(device)?)?;
            }
            c.graph
                .replay()
                .context("replaying the captured training step")?;
            return Ok(true);
        }
        if !device.is_cuda() {
            return Ok(false);
        }
        // Fixed input buffers, allocated before the capture (they outlive it).
        let inputs = batches
            .iter()
            .map(|(x, y)| Ok((x.to_device(device)?, y.to_device(device)?)))
            .collect::<Result<Vec<_>>>()?;
        let captured = capture_step(device, || body(&inputs));
        match captured {
            Ok(graph) => {
                // Capturing records the step without running it: run it now.
                graph
                    .replay()
                    .context("running the captured training step")?;
                console.note(format!(
                    "{}: captured the training step at step {}; replaying it from now on{}",
                    self.flag(),
                    step + 1,
                    if self.asked {
                        ""
                    } else {
                        " (--no-cuda-graph runs every step eagerly)"
                    }
                ));
                self.captured = Some(Captured {
                    graph,
                    shapes: batch_shapes(batches),
                    inputs,
                });
                Ok(true)
            }
            Err(e) => {
                // Nothing of the failed capture ran; its gradients were never written.
                for (_, p) in params {
                    p.zero_grad();
                }
                self.off = true;
                console.note(format!("{}: the training step could not be captured ({e:#}); continuing without CUDA graphs", self.flag()));
                Ok(false)
            }
        }
    }

    /// How notes name the graph: the flag when it was given.
    fn flag(&self) -> &'static str {
        if self.asked {
            "--cuda-graph"
        } else {
            "CUDA graph"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::{DType, Rng};

    #[test]
    fn cuda_graph_decisions() {
        let cuda = Device::Cuda(0);
        let (on, auto, off) = (GraphMode::On, GraphMode::Auto, GraphMode::Off);
        assert_eq!(
            cuda_graph_decision(off, cuda, Task::Classification, false, 1),
            Ok(GraphDecision::Off)
        );
        // By default: captured where it can be, quietly eager where it cannot.
        assert_eq!(
            cuda_graph_decision(auto, cuda, Task::LanguageModel, false, 1),
            Ok(GraphDecision::Capture {
                warmup: GRAPH_WARMUP_STEPS
            })
        );
        for (task, dp, accum) in [
            (Task::MaskedLm, false, 1),
            (Task::Classification, true, 1),
            (Task::Classification, false, 0),
        ] {
            assert_eq!(
                cuda_graph_decision(auto, cuda, task, dp, accum),
                Ok(GraphDecision::Off)
            );
        }
        assert_eq!(
            cuda_graph_decision(auto, Device::Cpu, Task::Classification, false, 1),
            Ok(GraphDecision::Off)
        );
        assert_eq!(GraphMode::from_key(None), auto);
        assert_eq!(GraphMode::from_key(Some(true)), on);
        assert_eq!(GraphMode::from_key(Some(false)), off);
        assert_eq!(
            cuda_graph_decision(on, Device::Cpu, Task::Classification, false, 1),
            Ok(GraphDecision::IgnoredOnCpu)
        );
        // The CPU note wins over what would be refused on CUDA: nothing is captured there.
        assert_eq!(
            cuda_graph_decision(on, Device::Cpu, Task::Classification, true, 1),
            Ok(GraphDecision::IgnoredOnCpu)
        );
        let e = cuda_graph_decision(on, cuda, Task::MaskedLm, false, 1).unwrap_err();
        assert!(e.contains("masked-LM"), "{e}");
        let e = cuda_graph_decision(on, cuda, Task::Classification, true, 1).unwrap_err();
        assert!(
            e.contains("--cuda-graph") && e.contains("data-parallel"),
            "{e}"
        );
        assert_eq!(
            cuda_graph_decision(on, cuda, Task::Classification, false, 4),
            Ok(GraphDecision::Capture {
                warmup: GRAPH_WARMUP_STEPS
            })
        );
        const {
            assert!(
                GRAPH_WARMUP_STEPS >= 1,
                "the pool must be warmed before capturing"
            )
        };
    }

    #[test]
    fn dropout_is_refused_and_shapes_must_match() {
        let a = Rng::new(1).state();
        let mut r = Rng::new(1);
        assert_eq!(dropout_refusal(a, r.state()), None);
        r.next_u64();
        let e = dropout_refusal(a, r.state()).unwrap();
        assert!(e.contains("dropout") && e.contains("--cuda-graph"), "{e}");
        let t = |s: &[usize]| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap();
        let full = vec![(t(&[8, 4]), t(&[8]))];
        let partial = vec![(t(&[3, 4]), t(&[3]))];
        assert_eq!(batch_shapes(&full), batch_shapes(&full.clone()));
        assert_ne!(batch_shapes(&full), batch_shapes(&partial));
    }

    #[test]
    fn graph_run_waits_for_warm_up_and_stays_eager_on_the_cpu() {
        let mut g = GraphRun::new(3, true);
        let t = |s: &[usize]| Tensor::zeros(s, DType::F32, Device::Cpu).unwrap();
        let b = vec![(t(&[2, 2]), t(&[2]))];
        let console = Console::new(true);
        let mut calls = 0;
        for step in 0..5 {
            let ran = g
                .run(step, &b, Device::Cpu, &[], &console, |_| {
                    calls += 1;
                    Ok(())
                })
                .unwrap();
            assert!(!ran, "step {step}: nothing is captured on the CPU");
        }
        assert_eq!(calls, 0, "the step body runs only under a capture");
    }
}
