//! The step control ops on CUDA against the CPU: the same sequence of steps (with an injected
//! inf and clipping) gives the same parameters, moments and control block. Without a usable
//! CUDA device the test prints `skipped: no GPU` and passes.

use sinter_core::step_ctl::{ctl, grad_sum_squares, ScalerCfg};
use sinter_core::{AdamWParams, DType, Device, Rng, SgdParams, Tensor};

fn close(what: &str, a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= tol * x.abs().max(1.0),
            "{what}[{i}]: {x} vs {y}"
        );
    }
}

#[test]
fn step_control_on_cuda_matches_the_cpu() {
    if !sinter_core::cuda::is_available() {
        eprintln!("skipped: no GPU");
        return;
    }
    let cuda = Device::Cuda(0);
    let mut rng = Rng::new(7);
    let p0 = Tensor::randn(&[64, 33], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
    let lrs = Tensor::from_vec(vec![0.1f32, 0.05, 0.02, 0.01, 0.005], &[5], Device::Cpu).unwrap();
    let scaler = Some(ScalerCfg {
        growth: 2.0,
        backoff: 0.5,
        interval: 2,
    });
    let mut c0 = vec![0f32; ctl::LEN];
    c0[ctl::SCALE] = 256.0;
    c0[ctl::LR] = 0.1;
    c0[ctl::GRAD_FACTOR] = 1.0;
    let run = |dev: Device| {
        let p = p0.to_device(dev).unwrap();
        let q = p0.to_device(dev).unwrap();
        let (m, v, b) = (
            p.zeros_like().unwrap(),
            p.zeros_like().unwrap(),
            q.zeros_like().unwrap(),
        );
        let c = Tensor::from_vec(c0.clone(), &[ctl::LEN], Device::Cpu)
            .unwrap()
            .to_device(dev)
            .unwrap();
        let table = lrs.to_device(dev).unwrap();
        let mut r = Rng::new(11);
        for step in 0..5 {
            let mut g = Tensor::randn(&[64, 33], 0.0, 300.0, &mut r, DType::F32, Device::Cpu)
                .unwrap()
                .to_vec_f32()
                .unwrap();
            if step == 2 {
                g[5] = f32::NAN;
            }
            let g = Tensor::from_vec(g, &[64, 33], dev).unwrap();
            let s = grad_sum_squares(std::slice::from_ref(&g), dev).unwrap();
            c.step_prepare(&s, 5.0, true).unwrap();
            let h = AdamWParams {
                lr: 0.0,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.01,
                step: 1,
            };
            p.adamw_step_ctl(&g, &m, &v, h, &c).unwrap();
            let hs = SgdParams {
                lr: 0.0,
                momentum: 0.9,
                nesterov: true,
                weight_decay: 0.0,
            };
            q.sgd_step_ctl(&g, Some(&b), hs, &c).unwrap();
            c.step_finish(&table, scaler).unwrap();
        }
        [p, m, v, q, b, c].map(|t| t.to_vec_f32().unwrap())
    };
    let (cpu, gpu) = (run(Device::Cpu), run(cuda));
    let names = ["p", "m", "v", "sgd p", "sgd buf", "ctl"];
    for i in 0..6 {
        close(names[i], &cpu[i], &gpu[i], 1e-4);
    }
    assert_eq!(cpu[5][ctl::SKIPPED], 1.0);
    assert_eq!(cpu[5][ctl::STEPS], 4.0);
}
