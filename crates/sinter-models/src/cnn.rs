//! A LeNet-style CNN: two conv(3×3) + ReLU + max-pool(2) stages, then two linear layers.
//! Sized from the input, so it fits 8×8 digits and 28×28 MNIST alike. The `cnn-bn` variant
//! puts a BatchNorm after each convolution (whose bias it makes redundant). Quantized, the two
//! conv stages run as one int8 chain (`sinter_nn::quant::chain`).

use std::sync::Arc;

use crate::model::{classifier_loss, BatchLoss, Model};
use crate::Task;
use sinter_core::{bail, Conv2dParams, Result, Rng, Tensor};
use sinter_nn::module::{join, NamedTensor};
use sinter_nn::quant::{chain, slot::Int8Layer, Activation};
use sinter_nn::{BatchNorm2d, Conv2d, ConvBn, Linear, MaxPool2d, Module};

pub struct LeNet {
    pub conv1: ConvBn,
    pub conv2: ConvBn,
    pub fc1: Linear,
    pub fc2: Linear,
    pool: MaxPool2d,
}

impl LeNet {
    pub fn new(c: usize, h: usize, w: usize, classes: usize, rng: &mut Rng) -> Result<Self> {
        Self::with_options(c, h, w, classes, false, false, rng)
    }

    /// `batch_norm`: conv (no bias) → BatchNorm → ReLU in each stage (`bn1`, `bn2`);
    /// `fuse_conv_bn`: train those pairs with the fused op (needs `batch_norm`).
    pub fn with_options(
        c: usize,
        h: usize,
        w: usize,
        classes: usize,
        batch_norm: bool,
        fuse_conv_bn: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        if h < 4 || w < 4 {
            bail!("cnn: images must be at least 4×4, got {h}×{w}");
        }
        if fuse_conv_bn && !batch_norm {
            bail!("cnn: fusing conv and BatchNorm needs the BatchNorm variant (cnn-bn)");
        }
        let same = Conv2dParams {
            padding: 1.into(),
            ..Default::default()
        };
        let (c1, c2) = (32, 64);
        let flat = c2 * (h / 4) * (w / 4);
        let mut stage = |cin: usize, cout: usize, names: [&'static str; 2]| -> Result<ConvBn> {
            let conv = Conv2d::new(cin, cout, 3, same, !batch_norm, rng)?;
            let bn = batch_norm.then(|| BatchNorm2d::new(cout)).transpose()?;
            Ok(ConvBn::new(conv, bn)?
                .named(names[0], names[1])
                .fused_training(fuse_conv_bn))
        };
        Ok(LeNet {
            conv1: stage(c, c1, ["conv1", "bn1"])?,
            conv2: stage(c1, c2, ["conv2", "bn2"])?,
            fc1: Linear::new(flat, 128, true, rng)?,
            fc2: Linear::new(128, classes, true, rng)?,
            pool: MaxPool2d::new(2, 2),
        })
    }
}

impl LeNet {
    /// Both conv stages as one int8 chain (u8 activations between them, pooled in u8) when
    /// both convolutions are int8 (`sinter quantize`); None otherwise.
    fn int8_features(&self, x: &Tensor) -> Result<Option<Tensor>> {
        let (Some(c1), Some(c2)) = (int8_conv(&self.conv1), int8_conv(&self.conv2)) else {
            return Ok(None);
        };
        let stage = |conv| chain::Stage {
            conv,
            activation: Activation::Relu,
            pool: Some(self.pool.0),
        };
        chain::run(x, &[stage(c1), stage(c2)]).map(Some)
    }
}

/// The int8 convolution a stage runs in inference: its own, or the folded one's; None when
/// it runs in f32 or an unfolded BatchNorm sits between the convolution and the ReLU.
fn int8_conv(stage: &ConvBn) -> Option<Arc<dyn Int8Layer>> {
    match (stage.folded(), &stage.bn) {
        (Some(folded), _) => chain::int8_conv(&folded),
        (None, None) => chain::int8_conv(&stage.conv),
        (None, Some(_)) => None,
    }
}

impl Module for LeNet {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = match self.int8_features(x)? {
            Some(h) => h,
            None => {
                let h = self.pool.forward(&self.conv1.forward_relu(x)?)?;
                self.pool.forward(&self.conv2.forward_relu(&h)?)?
            }
        };
        let h = self.fc1.forward(&h.flatten_from(1)?)?.relu()?;
        self.fc2.forward(&h)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.conv1.collect(prefix, out);
        self.conv2.collect(prefix, out);
        self.fc1.collect(&join(prefix, "fc1"), out);
        self.fc2.collect(&join(prefix, "fc2"), out);
    }
    fn set_training(&self, t: bool) {
        self.conv1.set_training(t);
        self.conv2.set_training(t);
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        Ok(self.conv1.fold_batch_norm()? + self.conv2.fold_batch_norm()?)
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
