//! A LeNet-style CNN: two conv(3×3) + ReLU + max-pool(2) stages, then two linear layers.
//! Sized from the input, so it fits 8×8 digits and 28×28 MNIST alike.

use crate::model::{classifier_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{bail, Conv2dParams, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::{Conv2d, Linear, MaxPool2d, Module};

pub struct LeNet {
    pub conv1: Conv2d,
    pub conv2: Conv2d,
    pub fc1: Linear,
    pub fc2: Linear,
    pool: MaxPool2d,
}

impl LeNet {
    pub fn new(c: usize, h: usize, w: usize, classes: usize, rng: &mut Rng) -> Result<Self> {
        if h < 4 || w < 4 {
            bail!("cnn: images must be at least 4×4, got {h}×{w}");
        }
        let same = Conv2dParams {
            padding: 1,
            ..Default::default()
        };
        let (c1, c2) = (32, 64);
        let flat = c2 * (h / 4) * (w / 4);
        Ok(LeNet {
            conv1: Conv2d::new(c, c1, 3, same, true, rng)?,
            conv2: Conv2d::new(c1, c2, 3, same, true, rng)?,
            fc1: Linear::new(flat, 128, true, rng)?,
            fc2: Linear::new(128, classes, true, rng)?,
            pool: MaxPool2d::new(2, 2),
        })
    }
}

impl Module for LeNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.pool.forward(&self.conv1.forward(x)?.relu()?)?;
        let h = self.pool.forward(&self.conv2.forward(&h)?.relu()?)?;
        let h = self.fc1.forward(&h.flatten_from(1)?)?.relu()?;
        self.fc2.forward(&h)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(&join(prefix, "conv1"), out);
        self.conv2.collect(&join(prefix, "conv2"), out);
        self.fc1.collect(&join(prefix, "fc1"), out);
        self.fc2.collect(&join(prefix, "fc2"), out);
    }
}

impl Model for LeNet {
    fn task(&self) -> Task {
        Task::Classification
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        classifier_loss(self, inputs, targets)
    }
}
