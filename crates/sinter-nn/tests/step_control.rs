//! The device-side step control (`StepControl`, run here on the CPU, where the same arithmetic
//! runs on host memory) against the host-side reference: `LossScaler` for fp16 dynamic loss
//! scaling and `clip_grad_norm` for clipping.

use sinter_core::{DType, Device, Tensor};
use sinter_nn::{clip_grad_norm, AdamW, LossScaler, Optimizer, Sgd, StepControl};

fn params(seed: f32) -> Vec<(String, Tensor)> {
    let mk = |n: &str, v: Vec<f32>, shape: &[usize]| {
        (
            n.to_string(),
            Tensor::from_vec(v, shape, Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap(),
        )
    };
    vec![
        mk(
            "w",
            (0..6).map(|i| seed + i as f32 * 0.25).collect(),
            &[2, 3],
        ),
        mk("b", vec![seed, -seed], &[2]),
    ]
}

fn set_grads(ps: &[(String, Tensor)], step: usize, scale: f32, inf: bool) {
    for (k, (_, p)) in ps.iter().enumerate() {
        let n = p.numel();
        let mut g: Vec<f32> = (0..n)
            .map(|i| ((i + 3 * step + k) as f32 * 0.37).sin() * 0.01 * scale)
            .collect();
        // The overflow is in the last parameter only: the skip must still cover all of them.
        if inf && k + 1 == ps.len() {
            g[0] = f32::INFINITY;
        }
        p.set_grad(Some(Tensor::from_vec(g, p.shape(), Device::Cpu).unwrap()));
    }
}

fn values(ps: &[(String, Tensor)]) -> Vec<Vec<u32>> {
    ps.iter()
        .map(|(_, p)| {
            p.to_vec_f32()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

#[test]
fn device_loss_scaling_matches_the_host_scaler_bit_for_bit() {
    let steps = 12;
    let lrs: Vec<f64> = (0..steps).map(|i| 0.01 / (1.0 + i as f64)).collect();
    // Overflow at steps 1 and 6; growth after 3 good steps in a row.
    let overflow = |i: usize| i == 1 || i == 6;
    let mut host_scaler = LossScaler::new(1024.0);
    host_scaler.growth_interval = 3;
    let (a, b) = (params(0.5), params(0.5));
    let mut host = AdamW::new(a.clone(), lrs[0], 0.1).unwrap();
    let mut dev = AdamW::new(b.clone(), lrs[0], 0.1).unwrap();
    let control = StepControl::new(Device::Cpu, &lrs, 0, 0, None, Some(&host_scaler)).unwrap();
    assert!(control.scaling());
    for (i, &lr) in lrs.iter().enumerate() {
        // The host path: the scale it applies is the one the device block holds.
        let scale = host_scaler.scale as f32;
        assert_eq!(
            control.read().unwrap().loss_scale,
            host_scaler.scale,
            "step {i}"
        );
        set_grads(&a, i, scale, overflow(i));
        set_grads(&b, i, scale, overflow(i));
        host.set_lr(lr);
        let ok = host_scaler.unscale_and_check(&a).unwrap();
        if ok {
            host.step().unwrap();
        }
        host_scaler.update(!ok);
        let before = values(&b);
        control.prepare(&b).unwrap();
        dev.step_ctl(control.tensor()).unwrap();
        control.finish().unwrap();
        if overflow(i) {
            assert_eq!(
                values(&b),
                before,
                "step {i}: a skipped step changes no parameter"
            );
        }
        assert_eq!(values(&a), values(&b), "step {i}: parameters differ");
        let st = control.read().unwrap();
        assert_eq!(st.loss_scale, host_scaler.scale, "step {i}");
        assert_eq!(st.good_steps, host_scaler.good_steps(), "step {i}");
        assert_eq!(
            st.optimizer_steps,
            host.steps(),
            "step {i}: skipped steps do not count"
        );
        assert_eq!(st.skipped_steps, host_scaler.skipped_steps(), "step {i}");
        assert_eq!(st.iter, i as u64 + 1);
        assert_eq!(st.lr, lrs[(i + 1).min(steps - 1)] as f32 as f64);
    }
    // 1024 → 512 (overflow at step 1) → 1024 (3 good: steps 2-4) → 512 (step 6) → 1024 (7-9).
    assert_eq!(host_scaler.scale, 1024.0);
    assert_eq!(control.read().unwrap().skipped_steps, 2);
    // The moments of the two optimizers match too (the state a checkpoint saves).
    for ((na, ta), (nb, tb)) in host.state().iter().zip(dev.state().iter()) {
        assert_eq!(na, nb);
        assert_eq!(ta.to_vec_f32().unwrap(), tb.to_vec_f32().unwrap(), "{na}");
    }
}

#[test]
fn device_clipping_matches_clip_grad_norm() {
    for (max, big) in [(1e-3, true), (10.0, false)] {
        let (a, b) = (params(1.0), params(1.0));
        let mut host = Sgd::new(a.clone(), 0.1, 0.9, false, 0.0).unwrap();
        let mut dev = Sgd::new(b.clone(), 0.1, 0.9, false, 0.0).unwrap();
        let control = StepControl::new(Device::Cpu, &[0.1; 4], 0, 0, Some(max), None).unwrap();
        for i in 0..4 {
            set_grads(&a, i, 1.0, false);
            set_grads(&b, i, 1.0, false);
            let norm = clip_grad_norm(&a, max).unwrap();
            assert_eq!(norm > max, big);
            host.step().unwrap();
            control.prepare(&b).unwrap();
            dev.step_ctl(control.tensor()).unwrap();
            control.finish().unwrap();
            let st = control.read().unwrap();
            assert!(
                (st.grad_norm - norm).abs() <= 1e-6 * norm,
                "{} vs {norm}",
                st.grad_norm
            );
            for ((_, pa), (_, pb)) in a.iter().zip(&b) {
                let (va, vb) = (pa.to_vec_f32().unwrap(), pb.to_vec_f32().unwrap());
                for (x, y) in va.iter().zip(&vb) {
                    if big {
                        assert!((x - y).abs() <= 1e-6 * x.abs().max(1.0), "{x} vs {y}");
                    } else {
                        // Below the limit nothing is scaled: bit for bit.
                        assert_eq!(x.to_bits(), y.to_bits());
                    }
                }
            }
        }
    }
}

#[test]
fn schedule_and_resume_state_come_from_the_block() {
    // SGD without momentum: p moves by exactly lr · g, so each step shows the lr it used.
    let lrs = [0.5, 0.25, 0.125];
    let p = params(0.0);
    let mut opt = Sgd::new(p.clone(), 99.0, 0.0, false, 0.0).unwrap();
    // Resume at step 1 with 1 update taken: the first lr used is lrs[1].
    let mut sc = LossScaler::new(256.0);
    sc.update(false);
    let control = StepControl::new(Device::Cpu, &lrs, 1, 1, None, Some(&sc)).unwrap();
    let st = control.read().unwrap();
    assert_eq!(
        (st.iter, st.optimizer_steps, st.loss_scale, st.good_steps),
        (1, 1, 256.0, 1)
    );
    for (k, &lr) in lrs[1..].iter().enumerate() {
        let before = p[1].1.to_vec_f32().unwrap();
        let g = vec![2.0f32 * 256.0, 4.0 * 256.0];
        p[1].1
            .set_grad(Some(Tensor::from_vec(g, &[2], Device::Cpu).unwrap()));
        p[0].1.set_grad(None);
        control.prepare(&p).unwrap();
        opt.step_ctl(control.tensor()).unwrap();
        control.finish().unwrap();
        let after = p[1].1.to_vec_f32().unwrap();
        assert_eq!(before[0] - after[0], (lr * 2.0) as f32, "step {k}");
        assert_eq!(before[1] - after[1], (lr * 4.0) as f32, "step {k}");
    }
    // Past the end of the table the last lr stays.
    assert_eq!(control.read().unwrap().lr, 0.125);
    assert_eq!(control.read().unwrap().optimizer_steps, 3);
    // Bad settings are refused with a clear message.
    let e = StepControl::new(Device::Cpu, &[], 0, 0, None, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("schedule"), "{e}");
    assert!(StepControl::new(Device::Cpu, &[0.1], 0, 0, Some(-1.0), None).is_err());
    let bad_ctl = Tensor::zeros(&[3], DType::F32, Device::Cpu).unwrap();
    assert!(opt.step_ctl(&bad_ctl).is_err());
}
