//! Optimizers over named parameters. Their state is a list of named tensors
//! (`<param>.exp_avg`, `<param>.exp_avg_sq`, `<param>.momentum_buffer`) plus a step count,
//! so a checkpoint can hold it beside the weights.

use std::collections::HashMap;

use sinter_core::kernels::optimizer::{adamw_step_many, AdamWSlot};
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

/// Parameters with their own learning rate and weight decay (PyTorch's parameter groups).
/// A schedule's `set_lr` scales every group's rate by the same factor, as PyTorch's
/// schedulers do. A parameter belongs to one group only.
#[derive(Clone, Debug)]
pub struct ParamGroup {
    pub params: Vec<(String, Tensor)>,
    /// This group's learning rate (None: the optimizer's).
    pub lr: Option<f64>,
    /// This group's weight decay (None: the optimizer's).
    pub weight_decay: Option<f64>,
}

impl ParamGroup {
    pub fn new(params: Vec<(String, Tensor)>) -> ParamGroup {
        ParamGroup {
            params,
            lr: None,
            weight_decay: None,
        }
    }
    pub fn with_lr(mut self, lr: f64) -> ParamGroup {
        self.lr = Some(lr);
        self
    }
    pub fn with_weight_decay(mut self, weight_decay: f64) -> ParamGroup {
        self.weight_decay = Some(weight_decay);
        self
    }

    /// Every parameter of `groups` once, in order, with its settings: the learning-rate
    /// factor (group lr / `lr`) and the weight decay (the group's, else `weight_decay`).
    /// A parameter in two groups is an error (PyTorch refuses it too: it would be stepped
    /// twice).
    pub fn flatten(groups: Vec<ParamGroup>, lr: f64, weight_decay: f64) -> Result<GroupedParams> {
        let mut out = GroupedParams {
            params: Vec::new(),
            settings: Vec::new(),
        };
        let mut seen = std::collections::HashSet::new();
        for g in groups {
            let glr = g.lr.unwrap_or(lr);
            let wd = g.weight_decay.unwrap_or(weight_decay);
            if !(glr.is_finite() && glr >= 0.0 && wd.is_finite() && wd >= 0.0) {
                bail!(
                    "parameter group: lr {glr} and weight decay {wd} must be finite and at least 0"
                );
            }
            let lr_scale = if lr > 0.0 { glr / lr } else { 1.0 };
            for (name, p) in g.params {
                if !seen.insert(p.id()) {
                    bail!("parameter {name} is in more than one parameter group (or twice in one); give each parameter one group");
                }
                out.params.push((name, p));
                out.settings.push(ParamSettings {
                    lr_scale,
                    weight_decay: wd,
                });
            }
        }
        Ok(out)
    }
}

/// The default assignment, and the one place for the no-decay rule: matrices and embeddings
/// (rank ≥ 2) decay by `weight_decay`; biases and norm gains (rank < 2) do not, as GPT-2,
/// BERT and most recipes do. `AdamW::new`, `Sgd::new` and ZeRO's `new` apply it; their
/// `with_groups` take any assignment (one `ParamGroup::new(params)` decays everything, as
/// PyTorch's optimizers do without groups).
pub fn decay_groups(params: Vec<(String, Tensor)>, weight_decay: f64) -> Vec<ParamGroup> {
    let (decay, rest): (Vec<_>, Vec<_>) = params.into_iter().partition(|(_, p)| p.rank() >= 2);
    vec![
        ParamGroup::new(decay).with_weight_decay(weight_decay),
        ParamGroup::new(rest).with_weight_decay(0.0),
    ]
}

/// One parameter's settings from its group.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ParamSettings {
    /// Its learning rate over the optimizer's (a schedule moves the optimizer's rate).
    pub lr_scale: f64,
    pub weight_decay: f64,
}

/// Parameter groups flattened ([`ParamGroup::flatten`]): `settings[i]` is `params[i]`'s.
pub struct GroupedParams {
    pub params: Vec<(String, Tensor)>,
    pub settings: Vec<ParamSettings>,
}

/// The control block as a group with learning-rate factor `scale` reads it (the block's own
/// tensor when the factor is 1): kernels read the rate from the block, so a group's rate is
/// the block's rate times its factor, still without a host round trip.
fn scaled_ctl(ctl: &Tensor, scale: f64) -> Result<Tensor> {
    if scale == 1.0 {
        return Ok(ctl.clone());
    }
    let mut f = vec![1f32; ctl.numel()];
    f[sinter_core::step_ctl::ctl::LR] = scale as f32;
    let f = Tensor::from_vec(f, ctl.shape(), sinter_core::Device::Cpu)?.to_device(ctl.device())?;
    ctl.mul(&f)
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

/// SGD with momentum (optionally Nesterov) and weight decay added to the gradient, as
/// PyTorch's. `new` applies the default grouping ([`decay_groups`]); `with_groups` takes any.
pub struct Sgd {
    params: Vec<(String, Tensor)>,
    settings: Vec<ParamSettings>,
    lr: f64,
    momentum: f64,
    nesterov: bool,
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
        Sgd::with_groups(
            decay_groups(params, weight_decay),
            lr,
            momentum,
            nesterov,
            weight_decay,
        )
    }

    /// SGD over parameter groups (each with its own learning rate and weight decay;
    /// `weight_decay` is for groups that name none).
    pub fn with_groups(
        groups: Vec<ParamGroup>,
        lr: f64,
        momentum: f64,
        nesterov: bool,
        weight_decay: f64,
    ) -> Result<Self> {
        if nesterov && momentum <= 0.0 {
            bail!("SGD: Nesterov momentum needs momentum > 0");
        }
        if !(momentum.is_finite() && momentum >= 0.0) {
            bail!("SGD: momentum must be finite and at least 0, got {momentum}");
        }
        let g = ParamGroup::flatten(groups, lr, weight_decay)?;
        let bufs = if momentum > 0.0 {
            Some(zeros_like_all(&g.params)?)
        } else {
            None
        };
        Ok(Sgd {
            params: g.params,
            settings: g.settings,
            lr,
            momentum,
            nesterov,
            bufs,
            steps: 0,
        })
    }

    /// The hyper-parameters of parameter `i`.
    fn hyper_of(&self, i: usize) -> SgdParams {
        let s = self.settings[i];
        SgdParams {
            lr: (self.lr * s.lr_scale) as f32,
            momentum: self.momentum as f32,
            nesterov: self.nesterov,
            weight_decay: s.weight_decay as f32,
        }
    }
}

impl Optimizer for Sgd {
    fn step(&mut self) -> Result<()> {
        let _g = no_grad();
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            p.sgd_step(&g, self.bufs.as_ref().map(|b| &b[i]), self.hyper_of(i))?;
        }
        self.steps += 1;
        Ok(())
    }
    fn step_ctl(&mut self, ctl: &Tensor) -> Result<()> {
        let _g = no_grad();
        for (i, (_, p)) in self.params.iter().enumerate() {
            let Some(g) = p.grad() else { continue };
            let c = scaled_ctl(ctl, self.settings[i].lr_scale)?;
            p.sgd_step_ctl(&g, self.bufs.as_ref().map(|b| &b[i]), self.hyper_of(i), &c)?;
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

/// AdamW with decoupled weight decay. `new` applies the default grouping ([`decay_groups`]:
/// matrices and embeddings decay, biases and norm gains do not); `with_groups` takes any.
pub struct AdamW {
    params: Vec<(String, Tensor)>,
    settings: Vec<ParamSettings>,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    m: Vec<Tensor>,
    v: Vec<Tensor>,
    steps: u64,
}

impl AdamW {
    pub fn new(params: Vec<(String, Tensor)>, lr: f64, weight_decay: f64) -> Result<Self> {
        AdamW::with_groups(decay_groups(params, weight_decay), lr, weight_decay)
    }

    /// AdamW over parameter groups (each with its own learning rate and weight decay;
    /// `weight_decay` is for groups that name none).
    pub fn with_groups(groups: Vec<ParamGroup>, lr: f64, weight_decay: f64) -> Result<Self> {
        let g = ParamGroup::flatten(groups, lr, weight_decay)?;
        let m = zeros_like_all(&g.params)?;
        let v = zeros_like_all(&g.params)?;
        Ok(AdamW {
            params: g.params,
            settings: g.settings,
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            m,
            v,
            steps: 0,
        })
    }
}

impl AdamW {
    /// One step of every parameter with a gradient, in one multi-tensor update (on CUDA one
    /// launch per 32 parameters), driven by `ctl` when given.
    fn step_all(&self, ctl: Option<&Tensor>) -> Result<()> {
        let _g = no_grad();
        let grads: Vec<(usize, Tensor)> = self
            .params
            .iter()
            .enumerate()
            .filter_map(|(i, (_, p))| p.grad().map(|g| (i, g)))
            .collect();
        let slots: Vec<AdamWSlot<'_>> = grads
            .iter()
            .map(|(i, g)| AdamWSlot {
                param: &self.params[*i].1,
                grad: g,
                m: &self.m[*i],
                v: &self.v[*i],
                weight_decay: self.settings[*i].weight_decay,
                lr_scale: self.settings[*i].lr_scale,
            })
            .collect();
        // With a control block, lr and the step number come from it; these are placeholders.
        let h = AdamWParams {
            lr: self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: 0.0,
            step: if ctl.is_some() { 1 } else { self.steps },
        };
        adamw_step_many(&slots, h, ctl)
    }
}

impl Optimizer for AdamW {
    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        self.step_all(None)
    }
    fn step_ctl(&mut self, ctl: &Tensor) -> Result<()> {
        self.step_all(Some(ctl))
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
/// before clipping. A NaN or infinite norm is returned as is and nothing is scaled (PyTorch
/// would scale by NaN or 0 there); [`clip_grad_norm_with`] can refuse it instead.
///
/// The trainer (`sinter train`) clips in its device step control block with the same rule,
/// not through this function: with fp16 loss scaling a non-finite norm skips the step and
/// shrinks the scale; in f32 and bf16 the step runs unclipped, the weights and then the loss
/// turn NaN, and the NaN guard at the next log, eval or checkpoint step stops the run and
/// keeps the last good checkpoint.
pub fn clip_grad_norm(params: &[(String, Tensor)], max_norm: f64) -> Result<f64> {
    clip_grad_norm_with(params, max_norm, false)
}

/// [`clip_grad_norm`] with PyTorch's `error_if_nonfinite`: when true, a NaN or infinite
/// global norm is an error naming the first parameter whose gradient is not finite, and no
/// gradient is changed.
pub fn clip_grad_norm_with(
    params: &[(String, Tensor)],
    max_norm: f64,
    error_if_nonfinite: bool,
) -> Result<f64> {
    let _g = no_grad();
    // One deterministic pass over all gradients, on their device (no copy to the host).
    let grads: Vec<Tensor> = params.iter().filter_map(|(_, p)| p.grad()).collect();
    let norm = sinter_core::fused::global_grad_norm(&grads);
    if !norm.is_finite() && error_if_nonfinite {
        // Only on the failing path: one norm per parameter, to say where.
        let first = params.iter().find(|(_, p)| {
            p.grad()
                .is_some_and(|g| !sinter_core::fused::global_grad_norm(&[g]).is_finite())
        });
        let at = first.map_or(String::new(), |(n, _)| format!(" (first in '{n}')"));
        bail!(
            "clip_grad_norm: the total norm of the gradients is {norm}{at}, so they cannot be clipped; a NaN or inf reached the backward pass: lower the learning rate, check the inputs, or use fp16 loss scaling, which skips such steps (error_if_nonfinite = false returns the norm and leaves the gradients as they are)"
        );
    }
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
    fn parameter_groups_take_their_own_lr_and_weight_decay() {
        // Two 1-element matrices: group a at lr 0.1 without decay, group b at lr 0.01 with
        // decay 0.5; AdamW's first step moves each by its lr (plus decay).
        let a = param(vec![1.0]);
        let b = param(vec![1.0]);
        for p in [&a, &b] {
            p.1.set_grad(Some(
                Tensor::from_vec(vec![2.0f32], &[1, 1], Device::Cpu).unwrap(),
            ));
        }
        let groups = vec![
            ParamGroup::new(vec![a.clone()]).with_weight_decay(0.0),
            ParamGroup::new(vec![b.clone()])
                .with_lr(0.01)
                .with_weight_decay(0.5),
        ];
        let mut opt = AdamW::with_groups(groups.clone(), 0.1, 0.0).unwrap();
        opt.step().unwrap();
        let (va, vb) = (a.1.to_vec_f32().unwrap()[0], b.1.to_vec_f32().unwrap()[0]);
        assert!((va - 0.9).abs() < 1e-5, "{va}");
        assert!((vb - (1.0 - 0.01 * 0.5 - 0.01)).abs() < 1e-4, "{vb}");
        // A schedule halves every group's rate alike.
        opt.set_lr(0.05);
        opt.step().unwrap();
        let vb2 = b.1.to_vec_f32().unwrap()[0];
        assert!(
            (vb - vb2 - (0.005 * 0.5 * vb + 0.005)).abs() < 1e-4,
            "{vb} {vb2}"
        );
        // The same on the device step control block.
        let c = param(vec![1.0]);
        c.1.set_grad(Some(
            Tensor::from_vec(vec![2.0f32], &[1, 1], Device::Cpu).unwrap(),
        ));
        let ctl = crate::StepControl::new(Device::Cpu, &[0.1], 0, 0, None, None).unwrap();
        let mut o = AdamW::with_groups(
            vec![ParamGroup::new(vec![c.clone()])
                .with_lr(0.01)
                .with_weight_decay(0.0)],
            0.1,
            0.0,
        )
        .unwrap();
        ctl.prepare(o.params()).unwrap();
        o.step_ctl(ctl.tensor()).unwrap();
        assert!((c.1.to_vec_f32().unwrap()[0] - 0.99).abs() < 1e-5);
        // SGD takes groups too.
        let d = param(vec![1.0]);
        d.1.set_grad(Some(
            Tensor::from_vec(vec![0.0f32], &[1, 1], Device::Cpu).unwrap(),
        ));
        let mut s = Sgd::with_groups(
            vec![ParamGroup::new(vec![d.clone()]).with_weight_decay(0.0)],
            0.1,
            0.0,
            false,
            0.5,
        )
        .unwrap();
        s.step().unwrap();
        assert_eq!(d.1.to_vec_f32().unwrap()[0], 1.0);
        assert!(Sgd::new(vec![param(vec![1.0])], 0.1, f64::NAN, false, 0.0).is_err());
    }

    #[test]
    fn both_optimizers_leave_biases_and_norm_gains_undecayed_by_default() {
        // With a zero gradient only the decay moves a weight: the matrix shrinks, the bias
        // (rank 1) keeps its value, in SGD as in AdamW.
        let zero_grad = |p: &(String, Tensor)| {
            p.1.set_grad(Some(p.1.zeros_like().unwrap()));
        };
        type Make = dyn Fn(Vec<(String, Tensor)>) -> Box<dyn Optimizer>;
        let makers: [&Make; 2] = [
            &|ps| Box::new(Sgd::new(ps, 0.1, 0.9, false, 0.5).unwrap()),
            &|ps| Box::new(AdamW::new(ps, 0.1, 0.5).unwrap()),
        ];
        for make in makers {
            let matrix = param(vec![2.0]);
            let bias = (
                "b".to_string(),
                Tensor::from_vec(vec![2.0f32], &[1], Device::Cpu)
                    .unwrap()
                    .to_var()
                    .unwrap(),
            );
            zero_grad(&matrix);
            zero_grad(&bias);
            let mut opt = make(vec![matrix.clone(), bias.clone()]);
            opt.step().unwrap();
            assert_eq!(bias.1.to_vec_f32().unwrap(), [2.0]);
            assert!((matrix.1.to_vec_f32().unwrap()[0] - 1.9).abs() < 1e-6);
        }
    }

    #[test]
    fn a_parameter_in_two_groups_is_refused() {
        let p = param(vec![1.0]);
        let groups = vec![
            ParamGroup::new(vec![p.clone()]),
            ParamGroup::new(vec![p.clone()]).with_lr(0.5),
        ];
        let e = AdamW::with_groups(groups, 0.1, 0.0).err().unwrap();
        assert!(
            e.to_string().contains("more than one parameter group"),
            "{e}"
        );
    }

    /// PyTorch's `error_if_nonfinite`: an error naming the parameter, gradients untouched;
    /// without it the NaN norm comes back and the gradients stay as they were.
    #[test]
    fn clipping_a_nonfinite_norm_errors_only_when_asked() {
        let a = param(vec![1.0]);
        let b = param(vec![1.0, 2.0]);
        a.1.set_grad(Some(
            Tensor::from_vec(vec![30.0f32], &[1, 1], Device::Cpu).unwrap(),
        ));
        b.1.set_grad(Some(
            Tensor::from_vec(vec![1.0f32, f32::NAN], &[1, 2], Device::Cpu).unwrap(),
        ));
        let b = ("h.0.mlp.weight".to_string(), b.1);
        let ps = vec![a.clone(), b.clone()];
        let e = clip_grad_norm_with(&ps, 1.0, true).unwrap_err().to_string();
        assert!(e.contains("NaN") && e.contains("'h.0.mlp.weight'"), "{e}");
        assert_eq!(a.1.grad().unwrap().to_vec_f32().unwrap(), [30.0]);
        assert!(clip_grad_norm_with(&ps, 1.0, false).unwrap().is_nan());
        assert!(clip_grad_norm(&ps, 1.0).unwrap().is_nan());
        assert_eq!(a.1.grad().unwrap().to_vec_f32().unwrap(), [30.0]);
        // A finite norm is clipped whatever the flag.
        b.1.set_grad(Some(
            Tensor::from_vec(vec![0.0f32, 40.0], &[1, 2], Device::Cpu).unwrap(),
        ));
        let n = clip_grad_norm_with(&ps, 5.0, true).unwrap();
        assert!((n - 50.0).abs() < 1e-9, "{n}");
        let ga = a.1.grad().unwrap().to_vec_f32().unwrap()[0];
        assert!((ga - 3.0).abs() < 1e-5, "{ga}");
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
