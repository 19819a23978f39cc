//! The network of PyTorch's tutorial "Fusing Convolution and Batch Norm using Custom
//! Function" (MNIST-shaped input): two 3×3 conv → BatchNorm → ReLU stages, 1→32→64 channels,
//! no padding, no conv bias; max-pool 2, ReLU, Linear 9216→128, dropout 0.5, ReLU,
//! Linear 128→10, cross-entropy. `fused` trains the conv → BatchNorm pairs with the fused op.
//! (The tutorial's BatchNorm has no affine parameters nor running statistics; ours has both,
//! which adds 4 vectors of 32 or 64 values.)

use super::counting_alloc::{live, peak_since, reset_peak};
use sinter_core::{Conv2dParams, DType, Device, Rng, Tensor};
use sinter_nn::module::shared_rng;
use sinter_nn::{BatchNorm2d, Conv2d, ConvBn, Dropout, Linear, MaxPool2d, Module};

pub struct TutorialNet {
    convbn1: ConvBn,
    convbn2: ConvBn,
    fc1: Linear,
    fc2: Linear,
    dropout: Dropout,
    pool: MaxPool2d,
}

impl TutorialNet {
    pub fn new(fused: bool) -> Self {
        let mut rng = Rng::new(123456);
        let mut stage = |cin, cout| {
            let conv = Conv2d::new(cin, cout, 3, Conv2dParams::default(), false, &mut rng).unwrap();
            ConvBn::new(conv, Some(BatchNorm2d::new(cout).unwrap()))
                .unwrap()
                .fused_training(fused)
        };
        let (convbn1, convbn2) = (stage(1, 32), stage(32, 64));
        TutorialNet {
            convbn1,
            convbn2,
            fc1: Linear::new(9216, 128, true, &mut rng).unwrap(),
            fc2: Linear::new(128, 10, true, &mut rng).unwrap(),
            dropout: Dropout::new(0.5, shared_rng(1)),
            pool: MaxPool2d::new(2, 2),
        }
    }

    pub fn loss(&self, x: &Tensor, y: &Tensor) -> Tensor {
        let h = self.convbn1.forward_relu(x).unwrap();
        let h = self.convbn2.forward_relu(&h).unwrap();
        let h = self.pool.forward(&h).unwrap().relu().unwrap();
        let h = self.fc1.forward(&h.flatten_from(1).unwrap()).unwrap();
        let h = self.dropout.forward(&h).unwrap().relu().unwrap();
        self.fc2
            .forward(&h)
            .unwrap()
            .cross_entropy(y, -100)
            .unwrap()
    }

    pub fn zero_grad(&self) {
        for m in [
            &self.convbn1 as &dyn Module,
            &self.convbn2,
            &self.fc1,
            &self.fc2,
        ] {
            m.zero_grad();
        }
    }
}

/// A random MNIST-shaped batch: images [n, 1, 28, 28] and labels.
pub fn mnist_batch(n: usize) -> (Tensor, Tensor) {
    let mut rng = Rng::new(7);
    let x = Tensor::randn(&[n, 1, 28, 28], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap();
    let y: Vec<i64> = (0..n).map(|_| rng.below(10) as i64).collect();
    (x, Tensor::from_vec(y, &[n], Device::Cpu).unwrap())
}

/// Heap bytes of one training step beyond those alive before it (parameters, gradients of
/// an earlier step, the batch).
pub struct StepMemory {
    /// Alive before the step (parameters, gradients, the batch, the process's own).
    pub base: usize,
    /// Alive after the forward pass: what the graph keeps for backward, and the loss.
    pub after_forward: usize,
    /// Highest during the forward pass.
    pub forward_peak: usize,
    /// Highest during forward and backward (recomputation, gradients included).
    pub step_peak: usize,
    pub loss: f32,
}

/// Measures one step, after an unmeasured warm-up step (thread pools, gradient buffers).
pub fn measure(net: &TutorialNet, x: &Tensor, y: &Tensor) -> StepMemory {
    net.loss(x, y).backward().unwrap();
    net.zero_grad();
    let base = reset_peak();
    let loss = net.loss(x, y);
    let after_forward = live().saturating_sub(base);
    let forward_peak = peak_since(base);
    loss.backward().unwrap();
    StepMemory {
        base,
        after_forward,
        forward_peak,
        step_peak: peak_since(base),
        loss: loss.to_scalar_f32().unwrap(),
    }
}
