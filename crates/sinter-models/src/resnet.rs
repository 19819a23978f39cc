//! ResNet-18, CIFAR variant (He et al. 2016): a 3×3 stem with no max-pool, four stages of
//! two basic blocks (64, 128, 256, 512 channels), global average pooling, one linear layer.

use crate::model::{classifier_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{Conv2dParams, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::{BatchNorm2d, Conv2d, Linear, Module};

fn conv3(cin: usize, cout: usize, stride: usize, rng: &mut Rng) -> Result<Conv2d> {
    Conv2d::new(
        cin,
        cout,
        3,
        Conv2dParams {
            stride,
            padding: 1,
            ..Default::default()
        },
        false,
        rng,
    )
}

pub struct BasicBlock {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    conv2: Conv2d,
    bn2: BatchNorm2d,
    /// 1×1 projection when the shape changes.
    shortcut: Option<(Conv2d, BatchNorm2d)>,
}

impl BasicBlock {
    fn new(cin: usize, cout: usize, stride: usize, rng: &mut Rng) -> Result<Self> {
        let shortcut = if stride != 1 || cin != cout {
            Some((
                Conv2d::new(
                    cin,
                    cout,
                    1,
                    Conv2dParams {
                        stride,
                        ..Default::default()
                    },
                    false,
                    rng,
                )?,
                BatchNorm2d::new(cout)?,
            ))
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: conv3(cin, cout, stride, rng)?,
            bn1: BatchNorm2d::new(cout)?,
            conv2: conv3(cout, cout, 1, rng)?,
            bn2: BatchNorm2d::new(cout)?,
            shortcut,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        let h = self.bn2.forward(&self.conv2.forward(&h)?)?;
        let s = match &self.shortcut {
            Some((c, b)) => b.forward(&c.forward(x)?)?,
            None => x.clone(),
        };
        h.add(&s)?.relu()
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(&join(prefix, "conv1"), out);
        self.bn1.collect(&join(prefix, "bn1"), out);
        self.conv2.collect(&join(prefix, "conv2"), out);
        self.bn2.collect(&join(prefix, "bn2"), out);
        if let Some((c, b)) = &self.shortcut {
            c.collect(&join(prefix, "shortcut.0"), out);
            b.collect(&join(prefix, "shortcut.1"), out);
        }
    }
    fn set_training(&self, t: bool) {
        self.bn1.set_training(t);
        self.bn2.set_training(t);
        if let Some((_, b)) = &self.shortcut {
            b.set_training(t);
        }
    }
}

pub struct ResNet18 {
    conv1: Conv2d,
    bn1: BatchNorm2d,
    layers: Vec<Vec<BasicBlock>>,
    fc: Linear,
}

impl ResNet18 {
    pub fn new(channels: usize, classes: usize, rng: &mut Rng) -> Result<Self> {
        let mut layers = Vec::new();
        let mut cin = 64;
        for (i, &c) in [64, 128, 256, 512].iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            layers.push(vec![
                BasicBlock::new(cin, c, stride, rng)?,
                BasicBlock::new(c, c, 1, rng)?,
            ]);
            cin = c;
        }
        Ok(ResNet18 {
            conv1: conv3(channels, 64, 1, rng)?,
            bn1: BatchNorm2d::new(64)?,
            layers,
            fc: Linear::new(512, classes, true, rng)?,
        })
    }
}

impl Module for ResNet18 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        for stage in &self.layers {
            for b in stage {
                h = b.forward(&h)?;
            }
        }
        self.fc.forward(&h.mean(&[2, 3], false)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(&join(prefix, "conv1"), out);
        self.bn1.collect(&join(prefix, "bn1"), out);
        for (i, stage) in self.layers.iter().enumerate() {
            for (j, b) in stage.iter().enumerate() {
                b.collect(&join(prefix, &format!("layer{}.{j}", i + 1)), out);
            }
        }
        self.fc.collect(&join(prefix, "fc"), out);
    }
    fn set_training(&self, t: bool) {
        self.bn1.set_training(t);
        self.layers.iter().flatten().for_each(|b| b.set_training(t));
    }
}

impl Model for ResNet18 {
    fn task(&self) -> Task {
        Task::Classification
    }
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
        classifier_loss(self, inputs, targets)
    }
}
