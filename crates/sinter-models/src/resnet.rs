//! ResNet-18, CIFAR variant (He et al. 2016): a 3×3 stem with no max-pool, four stages of
//! two basic blocks (64, 128, 256, 512 channels), global average pooling, one linear layer.

use crate::model::{classifier_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{Conv2dParams, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::{BatchNorm2d, Conv2d, ConvBn, Linear, Module};

fn conv3(cin: usize, cout: usize, stride: usize, rng: &mut Rng) -> Result<Conv2d> {
    Conv2d::new(
        cin,
        cout,
        3,
        Conv2dParams {
            stride: stride.into(),
            padding: 1.into(),
            ..Default::default()
        },
        false,
        rng,
    )
}

/// conv → BatchNorm, trained unfused or with the fused (recompute) op.
fn conv_bn(conv: Conv2d, fuse: bool, names: [&'static str; 2]) -> Result<ConvBn> {
    let bn = BatchNorm2d::new(conv.weight.shape()[0])?;
    Ok(ConvBn::new(conv, Some(bn))?
        .named(names[0], names[1])
        .fused_training(fuse))
}

pub struct BasicBlock {
    conv1: ConvBn,
    conv2: ConvBn,
    /// 1×1 projection when the shape changes (`shortcut.0`, `shortcut.1`).
    shortcut: Option<ConvBn>,
}

impl BasicBlock {
    fn new(cin: usize, cout: usize, stride: usize, fuse: bool, rng: &mut Rng) -> Result<Self> {
        let shortcut = if stride != 1 || cin != cout {
            let conv = Conv2d::new(
                cin,
                cout,
                1,
                Conv2dParams {
                    stride: stride.into(),
                    ..Default::default()
                },
                false,
                rng,
            )?;
            Some(conv_bn(conv, fuse, ["0", "1"])?)
        } else {
            None
        };
        Ok(BasicBlock {
            conv1: conv_bn(conv3(cin, cout, stride, rng)?, fuse, ["conv1", "bn1"])?,
            conv2: conv_bn(conv3(cout, cout, 1, rng)?, fuse, ["conv2", "bn2"])?,
            shortcut,
        })
    }
}

impl Module for BasicBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.conv1.forward_relu(x)?;
        let h = self.conv2.forward(&h)?;
        let s = match &self.shortcut {
            Some(c) => c.forward(x)?,
            None => x.clone(),
        };
        h.add(&s)?.relu()
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(prefix, out);
        self.conv2.collect(prefix, out);
        if let Some(c) = &self.shortcut {
            c.collect(&join(prefix, "shortcut"), out);
        }
    }
    fn set_training(&self, t: bool) {
        self.conv1.set_training(t);
        self.conv2.set_training(t);
        if let Some(c) = &self.shortcut {
            c.set_training(t);
        }
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        let s = match &self.shortcut {
            Some(c) => c.fold_batch_norm()?,
            None => 0,
        };
        Ok(self.conv1.fold_batch_norm()? + self.conv2.fold_batch_norm()? + s)
    }
}

pub struct ResNet18 {
    conv1: ConvBn,
    layers: Vec<Vec<BasicBlock>>,
    fc: Linear,
}

impl ResNet18 {
    pub fn new(channels: usize, classes: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_options(channels, classes, false, rng)
    }

    /// `fuse_conv_bn`: train every conv → BatchNorm pair as one fused op that recomputes the
    /// convolution in backward (less activation memory, same values; `sinter_nn::conv_bn`).
    pub fn with_options(
        channels: usize,
        classes: usize,
        fuse_conv_bn: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        let mut layers = Vec::new();
        let mut cin = 64;
        for (i, &c) in [64, 128, 256, 512].iter().enumerate() {
            let stride = if i == 0 { 1 } else { 2 };
            layers.push(vec![
                BasicBlock::new(cin, c, stride, fuse_conv_bn, rng)?,
                BasicBlock::new(c, c, 1, fuse_conv_bn, rng)?,
            ]);
            cin = c;
        }
        Ok(ResNet18 {
            conv1: conv_bn(conv3(channels, 64, 1, rng)?, fuse_conv_bn, ["conv1", "bn1"])?,
            layers,
            fc: Linear::new(512, classes, true, rng)?,
        })
    }
}

impl Module for ResNet18 {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = self.conv1.forward_relu(x)?;
        for stage in &self.layers {
            for b in stage {
                h = b.forward(&h)?;
            }
        }
        self.fc.forward(&h.mean(&[2, 3], false)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(prefix, out);
        for (i, stage) in self.layers.iter().enumerate() {
            for (j, b) in stage.iter().enumerate() {
                b.collect(&join(prefix, &format!("layer{}.{j}", i + 1)), out);
            }
        }
        self.fc.collect(&join(prefix, "fc"), out);
    }
    fn set_training(&self, t: bool) {
        self.conv1.set_training(t);
        self.layers.iter().flatten().for_each(|b| b.set_training(t));
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        let mut n = self.conv1.fold_batch_norm()?;
        for b in self.layers.iter().flatten() {
            n += b.fold_batch_norm()?;
        }
        Ok(n)
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
