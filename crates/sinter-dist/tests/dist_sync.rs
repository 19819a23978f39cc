//! Cross-rank agreement on the thread backend:
//! * fp16 loss scaling under ZeRO (stages 1 and 2): an inf injected into one rank's local
//!   gradient, in a chunk *another* rank owns, makes every rank skip the step together; a
//!   finite step unscales exactly (the update equals plain SGD on the averaged unscaled
//!   gradient, identical on all ranks).
//! * BatchNorm running statistics: `average_tensors` leaves every rank with the mean of the
//!   ranks' buffers (integer counters untouched).

use std::time::Duration;

use sinter_core::{DType, Device, Tensor};
use sinter_dist::data_parallel::{average_tensors, shared};
use sinter_dist::{run_on_threads, Communicator, ShardedAlgo, ZeroOptimizer, ZeroOptions};
use sinter_nn::Optimizer;

const T: Duration = Duration::from_secs(30);
const LR: f32 = 0.5;
const SCALE: f64 = 1024.0;

fn var(v: Vec<f32>, shape: &[usize]) -> Tensor {
    Tensor::from_vec(v, shape, Device::Cpu)
        .unwrap()
        .to_var()
        .unwrap()
}

#[test]
fn zero_fp16_overflow_on_one_rank_skips_the_step_on_every_rank() {
    for stage in [1u8, 2] {
        let out = run_on_threads(2, T, |c| {
            let r = c.rank();
            let w = var((0..8).map(|i| i as f32 * 0.1).collect(), &[8]);
            let b = var(vec![1.0, -1.0], &[2]);
            let params = vec![("w".to_string(), w.clone()), ("b".to_string(), b.clone())];
            let mut z = ZeroOptimizer::new(
                shared(c),
                params,
                LR as f64,
                ShardedAlgo::Sgd {
                    momentum: 0.0,
                    nesterov: false,
                    weight_decay: 0.0,
                },
                ZeroOptions {
                    stage,
                    // One bucket of 10 values: rank 0 owns w[0..5], rank 1 the rest.
                    bucket_bytes: 1 << 20,
                    grad_clip: None,
                },
            )
            .unwrap();
            let grad = |rank: usize| -> (Vec<f32>, Vec<f32>) {
                let gw: Vec<f32> = (0..8)
                    .map(|i| (i as f32 + 1.0 + rank as f32) * SCALE as f32)
                    .collect();
                (gw, vec![2.0 * SCALE as f32, (rank as f32) * SCALE as f32])
            };
            // Step 1: rank 1 overflows in w[1], which rank 0 owns after the reduce-scatter.
            let (mut gw, gb) = grad(r);
            if r == 1 {
                gw[1] = f32::INFINITY;
            }
            w.set_grad(Some(Tensor::from_vec(gw, &[8], Device::Cpu).unwrap()));
            b.set_grad(Some(Tensor::from_vec(gb, &[2], Device::Cpu).unwrap()));
            let first = z.unscale_and_check(SCALE).unwrap();
            z.zero_grad();
            let before = w.to_vec_f32().unwrap();
            // Step 2: finite everywhere.
            let (gw, gb) = grad(r);
            w.set_grad(Some(Tensor::from_vec(gw, &[8], Device::Cpu).unwrap()));
            b.set_grad(Some(Tensor::from_vec(gb, &[2], Device::Cpu).unwrap()));
            let second = z.unscale_and_check(SCALE).unwrap();
            if second {
                z.step().unwrap();
            }
            z.zero_grad();
            (
                first,
                second,
                before,
                w.to_vec_f32().unwrap(),
                b.to_vec_f32().unwrap(),
            )
        });
        for (r, (first, second, before, w, b)) in out.iter().enumerate() {
            assert!(
                !first,
                "stage {stage} rank {r}: the overflow on rank 1 must skip the step here too"
            );
            assert!(*second, "stage {stage} rank {r}: a finite step is taken");
            let w0: Vec<f32> = (0..8).map(|i| i as f32 * 0.1).collect();
            assert_eq!(
                before, &w0,
                "stage {stage} rank {r}: the skipped step changed nothing"
            );
            for i in 0..8 {
                // Average over ranks of (i + 1 + rank), unscaled.
                let g = i as f32 + 1.5;
                let want = w0[i] - LR * g;
                assert!(
                    (w[i] - want).abs() < 1e-5,
                    "stage {stage} rank {r}: w[{i}] = {} vs {want}",
                    w[i]
                );
            }
            let want_b = [1.0 - LR * 2.0, -1.0 - LR * 0.5];
            for i in 0..2 {
                assert!(
                    (b[i] - want_b[i]).abs() < 1e-5,
                    "stage {stage} rank {r}: b[{i}] = {} vs {}",
                    b[i],
                    want_b[i]
                );
            }
        }
    }
}

#[test]
fn batchnorm_statistics_are_averaged_across_ranks() {
    let out = run_on_threads(3, T, |c| {
        let r = c.rank() as f32;
        let comm = shared(c);
        let mean = Tensor::from_vec(vec![r, 2.0 * r], &[2], Device::Cpu).unwrap();
        let var = Tensor::from_vec(vec![1.0 + r, 1.0], &[2], Device::Cpu).unwrap();
        let count = Tensor::from_vec(vec![5i64 + r as i64], &[1], Device::Cpu).unwrap();
        assert_eq!(count.dtype(), DType::I64);
        average_tensors(&comm, &[mean.clone(), var.clone(), count.clone()]).unwrap();
        (
            mean.to_vec_f32().unwrap(),
            var.to_vec_f32().unwrap(),
            count.to_vec_f32().unwrap(),
        )
    });
    for (r, (m, v, c)) in out.iter().enumerate() {
        assert_eq!(m, &vec![1.0, 2.0], "rank {r}");
        assert_eq!(v, &vec![2.0, 1.0], "rank {r}");
        assert_eq!(c, &vec![5.0 + r as f32], "rank {r}: counters stay per rank");
    }
}
