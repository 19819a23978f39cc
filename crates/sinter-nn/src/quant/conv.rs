//! `QuantizedConv2d`: a convolution with int8 weights (symmetric, per output channel) and a
//! static, calibrated u8 mapping of its input (one scale and zero point for the whole tensor —
//! the CNN case, where calibration fixes the range once). Runs as im2col on the u8 input (the
//! padding is the zero point, i.e. the real value 0) + the int8 GEMM, whose epilogue writes the
//! NCHW output planes directly; images are spread over the cores.

use std::any::Any;

use rayon::prelude::*;
use sinter_core::backend::ConvGeom;
use sinter_core::{bail, Conv2dParams, Device, Result, Tensor};
use sinter_cpu::int8::{
    gemm, quantize_rows_static, ActQuant, Activation, Activations, Epilogue, Int8Path, Output,
    QParams,
};

use super::slot::Int8Layer;
use super::weight::Int8Weight;
use super::{cpu_input, host_vec};
use crate::module::{param, Module, NamedTensor};

pub struct QuantizedConv2d {
    weight: Int8Weight,
    bias: Option<Vec<f32>>,
    bias_tensor: Option<Tensor>,
    params: Conv2dParams,
    input: QParams,
}

/// One convolution's sizes.
#[derive(Clone, Copy)]
struct Geom {
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    oh: usize,
    ow: usize,
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
        if params.groups != 1 {
            bail!(
                "QuantizedConv2d: grouped convolutions ({} groups) are not supported",
                params.groups
            );
        }
        if params.stride.any_zero() || params.dilation.any_zero() {
            bail!("QuantizedConv2d: stride and dilation must be at least 1");
        }
        if !(input.scale.is_finite() && input.scale > 0.0 && (0..=255).contains(&input.zero_point))
        {
            bail!("QuantizedConv2d: input mapping {input:?} needs a positive scale and a zero point in 0..=255");
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
                Some(host_vec(b)?)
            }
            None => None,
        };
        Ok(QuantizedConv2d {
            weight,
            bias: bias_values,
            bias_tensor: bias.cloned(),
            params,
            input,
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
        QuantizedConv2d::new(w, Some(bias), self.params, self.input)
    }

    pub fn weight(&self) -> &Int8Weight {
        &self.weight
    }
    pub fn params(&self) -> Conv2dParams {
        self.params
    }
    /// The calibrated u8 mapping of the input.
    pub fn input_quant(&self) -> QParams {
        self.input
    }

    fn geometry(&self, x: &Tensor) -> Result<(usize, Geom)> {
        let s = self.weight.shape();
        let (c, kh, kw) = (s[1], s[2], s[3]);
        let [n, xc, h, w] = x.shape() else {
            bail!(
                "QuantizedConv2d: expected input [n, {c}, h, w], got {:?}",
                x.shape()
            );
        };
        if *xc != c {
            bail!(
                "QuantizedConv2d: expected input [n, {c}, h, w], got {:?}",
                x.shape()
            );
        }
        let p = self.params;
        match ConvGeom::out_hw(*h, *w, kh, kw, &p) {
            Some((oh, ow)) => Ok((
                *n,
                Geom {
                    c,
                    h: *h,
                    w: *w,
                    kh,
                    kw,
                    oh,
                    ow,
                },
            )),
            None => bail!(
                "QuantizedConv2d: a {kh}×{kw} kernel with dilation {} does not fit a {h}×{w} \
                 input with padding {}",
                p.dilation,
                p.padding
            ),
        }
    }

    /// activation(conv(x) + b), x [n, c, h, w] on the CPU, no gradient.
    pub fn forward_with(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let (n, g) = self.geometry(x)?;
        let xs = cpu_input(x, "QuantizedConv2d")?;
        let img = g.c * g.h * g.w;
        let mut xq = vec![0u8; xs.len()];
        xs.par_chunks(img.max(1))
            .zip(xq.par_chunks_mut(img.max(1)))
            .for_each(|(src, dst)| {
                quantize_rows_static(src, 1, src.len(), src.len(), self.input, dst, dst.len())
            });
        let (o, l) = (self.weight.n(), g.oh * g.ow);
        let kp = self.weight.packed.k_padded();
        let epilogue = Epilogue {
            weight_scales: &self.weight.scales,
            bias: self.bias.as_deref(),
            activation,
        };
        let mut y = vec![0f32; n * o * l];
        y.par_chunks_mut((o * l).max(1))
            .zip(xq.par_chunks(img.max(1)))
            .for_each(|(out, src)| {
                let mut col = vec![self.input.zero_point as u8; l * kp];
                im2col(src, &g, self.params, kp, &mut col);
                gemm(
                    Int8Path::get(),
                    &Activations {
                        data: &col,
                        rows: l,
                        stride: kp,
                        quant: ActQuant::PerTensor(self.input),
                    },
                    &self.weight.packed,
                    &epilogue,
                    Output::F32ChannelMajor {
                        data: out,
                        stride: l,
                    },
                );
            });
        Tensor::from_vec(y, &[n, o, g.oh, g.ow], Device::Cpu)
    }
}

/// Row (oy·ow + ox) of `col` = the input patch under output position (oy, ox), in the weight's
/// (c, ky, kx) order; positions in the padding keep the zero point `col` was filled with.
fn im2col(img: &[u8], g: &Geom, p: Conv2dParams, kp: usize, col: &mut [u8]) {
    let (s, pad, d) = (p.stride, p.padding, p.dilation);
    for oy in 0..g.oh {
        for ox in 0..g.ow {
            let row = &mut col[(oy * g.ow + ox) * kp..][..g.c * g.kh * g.kw];
            let mut t = 0;
            for c in 0..g.c {
                let plane = &img[c * g.h * g.w..(c + 1) * g.h * g.w];
                for ky in 0..g.kh {
                    let iy = (oy * s.h + ky * d.h) as isize - pad.h as isize;
                    let inside_y = iy >= 0 && (iy as usize) < g.h;
                    for kx in 0..g.kw {
                        let ix = (ox * s.w + kx * d.w) as isize - pad.w as isize;
                        if inside_y && ix >= 0 && (ix as usize) < g.w {
                            row[t] = plane[iy as usize * g.w + ix as usize];
                        }
                        t += 1;
                    }
                }
            }
        }
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
