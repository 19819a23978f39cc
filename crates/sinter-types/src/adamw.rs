//! AdamW's hyper-parameters and the f32 factors of one step, PyTorch's arithmetic
//! (`torch.optim.AdamW`, decoupled weight decay), shared by the CPU and CUDA kernels.
//!
//! Per element: p ← p·(1 − lr·wd); m ← m + (1 − β1)(g − m); v ← β2·v + (1 − β2)·g²;
//! p ← p − (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + eps).
//! PyTorch computes the scalar factors (1 − β, the bias corrections and their square root,
//! the step size) from Python floats, in f64, and rounds each to f32 once; so do we. In f32,
//! 1 − β2 for β2 = 0.999 is 1.3e-5 off, and the moment `v` with it (issue 14).

/// The hyper-parameters of one AdamW step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
    /// 1-based step count, for the bias corrections.
    pub step: u64,
}

/// The f32 factors of one step, each computed in f64 and rounded once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamWFactors {
    pub decay: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub step_size: f32,
    pub bc2_sqrt: f32,
    pub eps: f32,
}

impl AdamW {
    pub fn factors(&self) -> AdamWFactors {
        // β^t as Python's `beta ** step` (a float step): pow of two f64s, as the CUDA kernel.
        let t = self.step as f64;
        AdamWFactors {
            decay: (1.0 - self.lr * self.weight_decay) as f32,
            one_minus_beta1: (1.0 - self.beta1) as f32,
            beta2: self.beta2 as f32,
            one_minus_beta2: (1.0 - self.beta2) as f32,
            step_size: (self.lr / (1.0 - self.beta1.powf(t))) as f32,
            bc2_sqrt: (1.0 - self.beta2.powf(t)).sqrt() as f32,
            eps: self.eps as f32,
        }
    }
}

impl AdamWFactors {
    /// One element's update, (p, g, m, v) → (p, m, v), with the kernels' fused multiply-adds
    /// (the reference the vectorised CPU kernel and the CUDA kernel match bit for bit).
    #[inline]
    pub fn update(&self, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let p = p * self.decay;
        // lerp(m, g, 1 − β1) for 1 − β1 < 0.5, as PyTorch: m + w·(g − m).
        let m = self.one_minus_beta1.mul_add(g - m, m);
        let v = self.one_minus_beta2.mul_add(g * g, v * self.beta2);
        let denom = v.sqrt() / self.bc2_sqrt + self.eps;
        let p = (-self.step_size).mul_add(m / denom, p);
        (p, m, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(step: u64) -> AdamW {
        AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            step,
        }
    }

    /// The factors are f64 arithmetic rounded once: 1 − β2 in f32 would be 1.3e-5 off.
    /// (PyTorch's values for whole steps are in crates/sinter-core/tests/semantics.rs.)
    #[test]
    fn factors_are_computed_in_f64() {
        let f = h(1).factors();
        assert_eq!(f.one_minus_beta2, 1e-3f32);
        assert_ne!(1.0 - 0.999f32, 1e-3f32);
        assert_eq!(f.one_minus_beta1, 0.1f32);
        let f = h(3).factors();
        assert_eq!(f.step_size, (1e-3 / (1.0 - 0.9f64.powi(3))) as f32);
        assert_eq!(f.bc2_sqrt, (1.0 - 0.999f64.powi(3)).sqrt() as f32);
        assert_eq!(f.decay, (1.0 - 1e-5f64) as f32);
    }

    /// One element's update against the formula in f64, within f32 rounding.
    #[test]
    fn update_is_adamw() {
        let hp = h(2);
        let (p, g, m, v) = (0.75f32, -0.3f32, 0.02f32, 1e-4f32);
        let (p1, m1, v1) = hp.factors().update(p, g, m, v);
        let (p, g, m, v) = (p as f64, g as f64, m as f64, v as f64);
        let wm = 0.9 * m + 0.1 * g;
        let wv = 0.999 * v + 0.001 * g * g;
        let (bc1, bc2) = (1.0 - 0.9f64.powi(2), 1.0 - 0.999f64.powi(2));
        let wp = p * (1.0 - 1e-5) - 1e-3 * (wm / bc1) / ((wv / bc2).sqrt() + 1e-8);
        for (name, got, want) in [("p", p1, wp), ("m", m1, wm), ("v", v1, wv)] {
            let err = (got as f64 - want).abs() / want.abs();
            assert!(err < 5e-7, "{name}: {got} vs {want} ({err:e})");
        }
    }
}
