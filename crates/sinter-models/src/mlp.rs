//! A multi-layer perceptron over flattened inputs.

use crate::model::{classifier_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::{Linear, Module};

pub struct Mlp {
    pub layers: Vec<Linear>,
}

impl Mlp {
    pub fn new(inputs: usize, hidden: &[usize], outputs: usize, rng: &mut Rng) -> Result<Self> {
        let mut dims = vec![inputs];
        dims.extend_from_slice(hidden);
        dims.push(outputs);
        let layers = dims
            .windows(2)
            .map(|w| Linear::new(w[0], w[1], true, rng))
            .collect::<Result<_>>()?;
        Ok(Mlp { layers })
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.flatten_from(1)?;
        for (i, l) in self.layers.iter().enumerate() {
            h = l.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.relu()?;
            }
        }
        Ok(h)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        for (i, l) in self.layers.iter().enumerate() {
            l.collect(&join(prefix, &format!("layers.{i}")), out);
        }
    }
}

impl Model for Mlp {
    fn task(&self) -> Task {
        Task::Classification
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        classifier_loss(self, inputs, targets)
    }
}
