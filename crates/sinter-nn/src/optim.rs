//! Optimizers over named parameters. Their state is a list of named tensors
//! (`<param>.exp_avg`, `<param>.exp_avg_sq`, `<param>.momentum_buffer`) plus a step count,
//! so a checkpoint can hold it beside the weights.

use std::collections::HashMap;

use sinter_core::{bail, no_grad, AdamWParams, Result, SgdParams, Tensor};

pub trait Optimizer: Send {
    /// Applies one update from the parameters' accumulated gradients (parameters without a
    /// gradient are left as they are).
    fn step(&mut self) -> Result<()>;
    fn lr(&self) -> f64;
    fn set_lr(&mut self, lr: f64);
    /// Updates taken so far.
    fn steps(&self) -> u64;
    /// State tensors by name (for checkpoints).
    fn state(&self) -> Vec<(String, Tensor)>;
    /// Restores state saved by `state` (names must match; missing buffers are an error).
    fn load_state(&mut self, steps: u64, tensors: &HashMap<String, Tensor>) -> Result<()>;
    fn params(&self) -> &[(String, Tensor)];
    /// One update driven by a step control block on the parameters' device (see
    /// `sinter_core::step_ctl` and `StepControl`): the learning rate, the step number, a
    /// gradient factor (clip / loss scale) and the skip-on-inf flag are read there, so the step
    /// reads nothing back to the host. `steps()` is not advanced here: the block counts the
    /// updates taken (read it back with `StepControl::read` and pass it to `set_steps`).
    fn step_ctl(&mut self, ctl: &Tensor) -> Result<()> {
        let _ = ctl;
        bail!("this optimizer cannot be driven by a device step control block; use step()")
    }
    /// Sets the count of updates taken (e.g. read back from a step control block).
    fn set_steps(&mut self, steps: u64) {
        let _ = steps;
    }
    fn zero_grad(&self) {
        for (_, p) in self.params() {
            p.zero_grad();
        }
    }
}

fn zeros_like_all(params: &[(String, Tensor)]) -> Result<Vec<Tensor>> {
    params.iter().map(|(_, p)| p.zeros_like()).collect()
}

fn restore(dst: &Tensor, name: &str, tensors: &HashMap<String, Tensor>) -> Result<()> {
    match tensors.get(name) {
        Some(t) if t.shape() == dst.shape() => dst.assign(t),
        Some(t) => bail!(
            "optimizer state {name} has shape {:?} but its parameter needs {:?}",
            t.shape(),
            dst.shape()
        ),
        None => bail!("optimizer state {name} is missing from the checkpoint"),
    }
}

pub struct Sgd {
    params: Vec<(String, Tensor)>,
    pub hyper: SgdParams,
    bufs: Option<Vec<Tensor>>,
    steps: u64,
}

impl Sgd {
    pub fn new(
        params: Vec<(String, Tensor)>,
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    ) -> Result<Self> {
        if nesterov && momentum <= 0.0 {
            bail!("SGD: Nesterov momentum needs momentum > 0");
        }
        let bufs = if momentum > 0.0 {
            Some(zeros_like_all(&params)?)
        } else {
            None
        };
        Ok(Sgd {
            params,
            hyper: SgdParams {
                lr: lr as f32,
                momentum: momentum as f32,
                nesterov,
                weight_decay: weight_decay as f32,
            },
            bufs,
            steps: 0,
        })
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            p.sgd_step(&g, self.bufs.as_ref().map(|b| &b[i]), self.hyper)?;
        }
        self.steps += 1;
        Ok(())
    }
    fn step_ctl(&mut self, ctl: &Tensor) -> Result<()> {
        let _g = no_grad();
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            p.sgd_step_ctl(&g, self.bufs.as_ref().map(|b| &b[i]), self.hyper, ctl)?;
        }
        Ok(())
    }
    fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }
    fn lr(&self) -> f64 {
        self.hyper.lr as f64
    }
    fn set_lr(&mut self, lr: f64) {
        self.hyper.lr = lr as f32;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn state(&self) -> Vec<(String, Tensor)> {
        match &self.bufs {
            Some(b) => self
                .params
                .iter()
                .zip(b)
                .map(|((n, _), t)| (format!("{n}.momentum_buffer"), t.clone()))
                .collect(),
            None => Vec::new(),
        }
    }
    fn load_state(&mut self, steps: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        if let Some(b) = &self.bufs {
            for ((n, _), t) in self.params.iter().zip(b) {
                restore(t, &format!("{n}.momentum_buffer"), tensors)?;
            }
        }
        self.steps = steps;
        Ok(())
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
}

/// AdamW with decoupled weight decay, applied to matrices and embeddings (rank ≥ 2) but not
/// to biases and norm gains, as GPT-2 and most recipes do.
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: u64,
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64) -> Result<Self> {
        let m = zeros_like_all(&params)?;
        let v = zeros_like_all(&params)?;
        Ok(AdamW {
            params,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay,
            m,
            v,
            steps: 0,
        })
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        self.steps += 1;
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let wd = if p.rank() >= 2 {
                self.weight_decay
            } else {
                0.0
            };
            let h = AdamWParams {
                lr: self.lr as f32,
                beta1: self.beta1 as f32,
                beta2: self.beta2 as f32,
                eps: self.eps as f32,
                weight_decay: wd as f32,
                step: self.steps,
            };
            p.adamw_step(&g, &self.m[i], &self.v[i], h)?;
        }
        Ok(())
    }
    fn step_ctl(&mut self, ctl: &Tensor) -> Result<()> {
        let _g = no_grad();
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let wd = if p.rank() >= 2 {
                self.weight_decay
            } else {
                0.0
            };
            // lr and the step number come from the block; these two are placeholders.
            let h = AdamWParams {
                lr: self.lr as f32,
                beta1: self.beta1 as f32,
                beta2: self.beta2 as f32,
                eps: self.eps as f32,
                weight_decay: wd as f32,
                step: 1,
            };
            p.adamw_step_ctl(&g, &self.m[i], &self.v[i], h, ctl)?;
        }
        Ok(())
    }
    fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }
    fn lr(&self) -> f64 {
        self.lr
    }
    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
    fn steps(&self) -> u64 {
        self.steps
    }
    fn state(&self) -> Vec<(String, Tensor)> {
        let mut out = Vec::new();
        for (i, (n, _)) in self.params.iter().enumerate() {
            out.push((format!("{n}.exp_avg"), self.m[i].clone()));
            out.push((format!("{n}.exp_avg_sq"), self.v[i].clone()));
        }
        out
    }
    fn load_state(&mut self, steps: u64, tensors: &HashMap<String, Tensor>) -> Result<()> {
        for (i, (n, _)) in self.params.iter().enumerate() {
            restore(&self.m[i], &format!("{n}.exp_avg"), tensors)?;
            restore(&self.v[i], &format!("{n}.exp_avg_sq"), tensors)?;
        }
        self.steps = steps;
        Ok(())
    }
    fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
}

/// Scales all gradients so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping (a NaN or infinite norm is returned as is and nothing is scaled).
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> Result<f64> {
    let _g = no_grad();
    // One deterministic pass over all gradients, on their device (no copy to the host).
    let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
    let norm = sinter_core::fused::global_grad_norm(&grads);
    if norm.is_finite() && norm > max_norm {
        let scale = (max_norm / (norm + 1e-6)) as f32;
        for (_, p) in params {
            if let Some(g) = p.grad() {
                p.set_grad(Some(g.mul_scalar(scale)?));
            }
        }
    }
    Ok(norm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::{Device, Tensor};

    fn param(v: Vec<f32>) -> (String, Tensor) {
        let n = v.len();
        (
            "w".into(),
            Tensor::from_vec(v, &[1, n], Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap(),
        )
    }

    #[test]
    fn adamw_first_step_moves_each_weight_by_lr() {
        // With bias correction the first Adam step is lr · sign(g) (up to eps).
        let p = param(vec![1.0, -2.0, 3.0]);
        p.1.set_grad(Some(
            Tensor::from_vec(vec![0.5f32, -4.0, 1e-3], &[1, 3], Device::Cpu).unwrap(),
        ));
        let mut opt = AdamW::new(vec![p.clone()], 0.1, 0.0).unwrap();
        opt.step().unwrap();
        let v = p.1.to_vec_f32().unwrap();
        assert!(
            (v[0] - 0.9).abs() < 1e-5 && (v[1] + 1.9).abs() < 1e-5 && (v[2] - 2.9).abs() < 1e-4,
            "{v:?}"
        );
        // Decoupled decay shrinks by lr·wd·p even with zero gradient.
        let q = param(vec![2.0]);
        q.1.set_grad(Some(
            Tensor::zeros(&[1, 1], sinter_core::DType::F32, Device::Cpu).unwrap(),
        ));
        let mut opt = AdamW::new(vec![q.clone()], 0.1, 0.5).unwrap();
        opt.step().unwrap();
        assert!((q.1.to_vec_f32().unwrap()[0] - (2.0 - 0.1 * 0.5 * 2.0)).abs() < 1e-6);
    }

    #[test]
    fn sgd_momentum_and_nesterov_follow_pytorch() {
        for nesterov in [false, true] {
            let p = param(vec![1.0]);
            let mut opt = Sgd::new(vec![p.clone()], 0.1, 0.9, nesterov, 0.0).unwrap();
            let mut expect = 1.0f32;
            let mut buf = 0.0f32;
            for _ in 0..3 {
                p.1.set_grad(Some(
                    Tensor::from_vec(vec![2.0f32], &[1, 1], Device::Cpu).unwrap(),
                ));
                opt.step().unwrap();
                buf = 0.9 * buf + 2.0;
                expect -= 0.1 * if nesterov { 2.0 + 0.9 * buf } else { buf };
            }
            assert!((p.1.to_vec_f32().unwrap()[0] - expect).abs() < 1e-5);
        }
    }

    #[test]
    fn clipping_bounds_the_global_norm() {
        let a = param(vec![3.0]);
        let b = param(vec![4.0]);
        a.1.set_grad(Some(
            Tensor::from_vec(vec![3.0f32], &[1, 1], Device::Cpu).unwrap(),
        ));
        b.1.set_grad(Some(
            Tensor::from_vec(vec![4.0f32], &[1, 1], Device::Cpu).unwrap(),
        ));
        let ps = vec![a.clone(), b.clone()];
        let n = clip_grad_norm(&ps, 1.0).unwrap();
        assert!((n - 5.0).abs() < 1e-9);
        let ga = a.1.grad().unwrap().to_vec_f32().unwrap()[0];
        let gb = b.1.grad().unwrap().to_vec_f32().unwrap()[0];
        assert!(((ga * ga + gb * gb).sqrt() - 1.0).abs() < 1e-5);
    }
}
