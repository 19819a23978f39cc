//! Learning-rate schedules as pure functions of the step, so resuming needs only the step.

#[derive(Clone, Debug, PartialEq)]
pub enum LrSchedule {
    Constant,
    /// Multiply by `gamma` every `step_size` steps.
    Step {
        step_size: u64,
        gamma: f64,
    },
    /// Linear warm-up from 0 over `warmup` steps, then cosine decay to `min_factor`·lr at `total`.
    Cosine {
        warmup: u64,
        total: u64,
        min_factor: f64,
    },
}

impl LrSchedule {
    /// The learning rate for 0-based step `step`.
    pub fn lr_at(&self, base: f64, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant => base,
            LrSchedule::Step { step_size, gamma } => {
                base * gamma.powi((step / step_size.max(1)) as i32)
            }
            LrSchedule::Cosine {
                warmup,
                total,
                min_factor,
            } => {
                if step < warmup {
                    return base * (step + 1) as f64 / warmup as f64;
                }
                let span = total.saturating_sub(warmup).max(1);
                let progress = ((step - warmup) as f64 / span as f64).min(1.0);
                let cos = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
                base * (min_factor + (1.0 - min_factor) * cos)
            }
        }
    }
    pub fn parse(name: &str, total: u64) -> Option<LrSchedule> {
        match name {
            "constant" => Some(LrSchedule::Constant),
            "step" => Some(LrSchedule::Step {
                step_size: (total / 3).max(1),
                gamma: 0.1,
            }),
            "cosine" => Some(LrSchedule::Cosine {
                warmup: (total / 20).min(500),
                total,
                min_factor: 0.1,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn schedules_hit_their_landmarks() {
        let c = LrSchedule::Cosine {
            warmup: 10,
            total: 110,
            min_factor: 0.1,
        };
        assert!((c.lr_at(1.0, 0) - 0.1).abs() < 1e-12);
        assert!((c.lr_at(1.0, 9) - 1.0).abs() < 1e-12);
        assert!((c.lr_at(1.0, 60) - 0.55).abs() < 1e-12);
        assert!((c.lr_at(1.0, 110) - 0.1).abs() < 1e-12);
        let s = LrSchedule::Step {
            step_size: 5,
            gamma: 0.5,
        };
        assert_eq!(s.lr_at(1.0, 4), 1.0);
        assert_eq!(s.lr_at(1.0, 10), 0.25);
        assert_eq!(LrSchedule::Constant.lr_at(0.3, 1000), 0.3);
    }
}
