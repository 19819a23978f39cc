//! Loss functions as objects, PyTorch's `nn.CrossEntropyLoss` and `nn.MSELoss`: the options
//! are set once and each call applies them. The math is sinter-core's
//! (`Tensor::cross_entropy_with`, `Tensor::mse_loss`).
//!
//! ```
//! use sinter_core::{Device, Reduction, Tensor};
//! use sinter_nn::CrossEntropyLoss;
//! let logits = Tensor::from_slice(&[2.0f32, 0.5, -1.0, 0.1, 0.2, 3.0], &[2, 3], Device::Cpu).unwrap();
//! let targets = Tensor::from_slice(&[0i64, 2], &[2], Device::Cpu).unwrap();
//! let loss = CrossEntropyLoss::new()
//!     .label_smoothing(0.1)
//!     .unwrap()
//!     .reduction(Reduction::None);
//! assert_eq!(loss.forward(&logits, &targets).unwrap().shape(), [2]);
//! ```

use sinter_core::{bail, CrossEntropyOptions, Reduction, Result, Tensor};

/// `nn.CrossEntropyLoss`: logits [..., c] against i64 class indices [...].
#[derive(Clone, Debug, Default)]
pub struct CrossEntropyLoss {
    options: CrossEntropyOptions,
}

impl CrossEntropyLoss {
    /// PyTorch's defaults: mean reduction, no class weights, no label smoothing, ignore −100.
    pub fn new() -> CrossEntropyLoss {
        CrossEntropyLoss::default()
    }
    pub fn reduction(mut self, r: Reduction) -> CrossEntropyLoss {
        self.options.reduction = r;
        self
    }
    /// One weight per class ([c], float, on the logits' device).
    pub fn weight(mut self, w: Tensor) -> CrossEntropyLoss {
        self.options.weight = Some(w);
        self
    }
    /// ε in [0, 1] (an error otherwise).
    pub fn label_smoothing(mut self, eps: f64) -> Result<CrossEntropyLoss> {
        if !(0.0..=1.0).contains(&eps) {
            bail!("CrossEntropyLoss: label_smoothing must be in [0, 1], got {eps}");
        }
        self.options.label_smoothing = eps;
        Ok(self)
    }
    pub fn ignore_index(mut self, i: i64) -> CrossEntropyLoss {
        self.options.ignore_index = i;
        self
    }
    pub fn options(&self) -> &CrossEntropyOptions {
        &self.options
    }
    pub fn forward(&self, logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
        logits.cross_entropy_with(targets, &self.options)
    }
}

/// `nn.MSELoss` with its reduction.
#[derive(Clone, Copy, Debug, Default)]
pub struct MseLoss {
    pub reduction: Reduction,
}

impl MseLoss {
    pub fn forward(&self, input: &Tensor, target: &Tensor) -> Result<Tensor> {
        input.mse_loss_with(target, self.reduction)
    }
}
