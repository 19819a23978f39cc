//! `QuantizedConv2d`: a convolution with int8 weights (symmetric, per output channel) and a
//! static, calibrated u8 mapping of its input (one scale and zero point for the whole tensor —
//! the CNN case, where calibration fixes the range once). The layer keeps the weight as it is
//! exported and folded; the op that runs it, on the CPU or a CUDA device, is sinter-core's
//! `kernels::qmatmul::QConv2d` (im2col into u8 columns, then the int8 GEMM).

use std::any::Any;

use sinter_core::kernels::qmatmul::{ConvIn, ConvOut, Geom, QConv2d};
use sinter_core::{bail, Conv2dParams, Result, Tensor};
use sinter_cpu::int8::{Activation, QParams};

use super::slot::Int8Layer;
use super::weight::Int8Weight;
use crate::module::{param, Module, NamedTensor};

pub struct QuantizedConv2d {
    /// The int8 weight as exported and folded ([out, in, kh, kw], PyTorch's order).
    weight: Int8Weight,
    /// The op that runs it, on the CPU or a CUDA device (sinter-core's qmatmul folder).
    kernel: QConv2d,
    bias_tensor: Option<Tensor>,
}

impl QuantizedConv2d {
    /// Quantizes a Conv2d's f32 weight [out, in, kh, kw]; `input` is its calibrated input
    /// mapping.
    pub fn from_f32(
        weight: &Tensor,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        input: QParams,
    ) -> Result<QuantizedConv2d> {
        QuantizedConv2d::new(Int8Weight::from_f32(weight)?, bias, params, input)
    }

    pub fn new(
        weight: Int8Weight,
        bias: Option<&Tensor>,
        params: Conv2dParams,
        input: QParams,
    ) -> Result<QuantizedConv2d> {
        if weight.shape().len() != 4 {
            bail!(
                "QuantizedConv2d: weight must be [out, in, kh, kw], got {:?}",
                weight.shape()
            );
        }
        let bias_values = match bias {
            Some(b) => {
                if b.shape() != [weight.n()] {
                    bail!(
                        "QuantizedConv2d: bias {:?} does not fit {} outputs",
                        b.shape(),
                        weight.n()
                    );
                }
                Some(b.to_vec_f32()?)
            }
            None => None,
        };
        let s = weight.shape();
        let kernel = QConv2d::new(
            &weight.values(),
            [s[0], s[1], s[2], s[3]],
            weight.scales(),
            bias_values.as_deref(),
            params,
            input,
        )?;
        Ok(QuantizedConv2d {
            weight,
            kernel,
            bias_tensor: bias.cloned(),
        })
    }

    /// This convolution followed by a per-output-channel scale (BatchNorm's γ/√(σ²+ε)) and a new
    /// bias, as one int8 convolution: the int8 values stay (negated where the scale is
    /// negative, exact since they lie in [-127, 127]) and each channel's weight scale absorbs
    /// |scale|. The input mapping is unchanged: folding changes nothing before the layer.
    pub fn folded(&self, scale: &[f64], bias: &Tensor) -> Result<QuantizedConv2d> {
        let (n, k) = (self.weight.n(), self.weight.k());
        if scale.len() != n {
            bail!(
                "QuantizedConv2d: {} folding scales for {n} output channels",
                scale.len()
            );
        }
        let mut q = self.weight.values();
        let mut scales = Vec::with_capacity(n);
        for (j, row) in q.chunks_exact_mut(k.max(1)).enumerate().take(n) {
            if scale[j] < 0.0 {
                row.iter_mut().for_each(|v| *v = -*v);
            }
            scales.push((self.weight.scales()[j] as f64 * scale[j].abs()) as f32);
        }
        let w = Int8Weight::from_int8(&q, self.weight.shape(), scales)?;
        QuantizedConv2d::new(w, Some(bias), self.params(), self.input_quant())
    }

    pub fn weight(&self) -> &Int8Weight {
        &self.weight
    }
    pub fn params(&self) -> Conv2dParams {
        self.kernel.params()
    }
    /// The calibrated u8 mapping of the input.
    pub fn input_quant(&self) -> QParams {
        self.kernel.input_quant()
    }

    /// The window of an h×w input.
    pub(crate) fn geometry_of(&self, h: usize, w: usize) -> Result<Geom> {
        self.kernel.geometry_of(h, w)
    }

    /// activation(conv(x) + b), x [n, c, h, w] on the CPU or a CUDA device, no gradient.
    pub fn forward_with(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        self.kernel.forward(x, activation)
    }

    /// activation(conv(x) + b) on the host for `n` images of geometry `g` (the chains').
    pub(crate) fn run(
        &self,
        n: usize,
        g: Geom,
        input: ConvIn<'_>,
        activation: Activation,
        out: ConvOut<'_>,
    ) {
        self.kernel.run_host(n, g, input, activation, out)
    }
}

impl Int8Layer for QuantizedConv2d {
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        self.forward_with(x, activation)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Module for QuantizedConv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, Activation::None)
    }
    /// The f32 bias only: the int8 weight is not a tensor (see `quant::export`).
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        if let Some(b) = &self.bias_tensor {
            param(prefix, "bias", b, out);
        }
    }
}
