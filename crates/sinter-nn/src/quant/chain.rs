//! Chains of int8 convolutions that pass u8 activations from one to the next.
//!
//! Layer by layer, each int8 convolution writes f32 (dequantized, biased, activated), a max
//! pooling runs in f32, and the next convolution quantizes that f32 again with its calibrated
//! static mapping. A chain skips the f32 round trip: each convolution's epilogue requantizes
//! straight into the next one's input mapping (the same arithmetic as the static quantizer),
//! the activations stay u8 and channels last (the GEMM's output rows, which the next gather
//! reads as they are), and max pooling runs on the bytes (it commutes with the monotone
//! requantization; `sinter_cpu::int8::pool`). The result equals the layer-by-layer one bit for
//! bit; the last stage writes f32 NCHW for the f32 layers after it.

use std::sync::Arc;

use sinter_core::{bail, DType, Device, Pool2dParams, Result, Tensor};
use sinter_cpu::im2col::Window;
use sinter_cpu::int8::pool::{max_pool_f32_to_planes, max_pool_u8};
use sinter_cpu::int8::{quantize_rows_static, Activation, QParams};

use sinter_core::kernels::qmatmul::{refuse_nan, ConvIn, ConvOut};

use super::conv::QuantizedConv2d;
use super::host::cpu_input;
use super::slot::Int8Layer;
use crate::layers::Conv2d;

/// One stage of a chain: an int8 convolution, its activation, and a max pooling after it.
#[derive(Clone)]
pub struct Stage {
    pub conv: Arc<dyn Int8Layer>,
    pub activation: Activation,
    pub pool: Option<Pool2dParams>,
}

/// The int8 convolution installed in `conv`, if it has one (after `quant::quantize`).
pub fn int8_conv(conv: &Conv2d) -> Option<Arc<dyn Int8Layer>> {
    conv.quant
        .int8()
        .filter(|q| q.as_any().is::<QuantizedConv2d>())
}

/// Runs `stages` on x [n, c, h, w] (a float tensor, no gradient): the last stage's output
/// as f32 [n, c', h', w'], equal bit for bit to running each stage's convolution
/// (`forward_with` and the activation) and `Tensor::max_pool2d` in turn. NaN in `x` is refused
/// (int8 activations cannot carry it). On a CUDA device the stages run in turn (the chained
/// u8 form is the CPU's).
pub fn run(x: &Tensor, stages: &[Stage]) -> Result<Tensor> {
    const WHAT: &str = "int8 convolution chain";
    let convs = stages
        .iter()
        .map(|s| {
            s.conv
                .as_any()
                .downcast_ref::<QuantizedConv2d>()
                .ok_or_else(|| {
                    sinter_core::Error::Msg(format!("{WHAT}: a stage is not an int8 convolution"))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let Some(first) = convs.first() else {
        bail!("{WHAT}: no stages");
    };
    let &[n, c, h, w] = x.shape() else {
        bail!("{WHAT}: expected input [n, c, h, w], got {:?}", x.shape());
    };
    if x.device() != Device::Cpu {
        return stage_by_stage(x, stages, &convs);
    }
    let xs = cpu_input(x, WHAT)?;
    refuse_nan(&xs, WHAT)?;
    let mut act = channels_last_u8(&xs, c, h * w, first.input_quant());
    drop(xs);
    let (mut c, mut h, mut w) = (c, h, w);
    for (i, (stage, conv)) in stages.iter().zip(&convs).enumerate() {
        let g = conv.geometry_of(h, w)?;
        if g.c != c {
            bail!(
                "{WHAT}: stage {i} expects {} input channels, got {c} (input {:?})",
                g.c,
                x.shape()
            );
        }
        let (o, l) = (conv.weight().n(), g.win.l());
        (c, h, w) = (o, g.win.oh, g.win.ow);
        let input = ConvIn::U8Pixels(&act);
        let Some(next) = convs.get(i + 1) else {
            // The last stage: f32, NCHW.
            let Some(p) = stage.pool else {
                let mut y = vec![0f32; n * o * l];
                conv.run(n, g, input, stage.activation, ConvOut::F32Planes(&mut y));
                return Tensor::from_vec(y, &[n, c, h, w], Device::Cpu);
            };
            let mut y = vec![0f32; n * l * o];
            conv.run(n, g, input, stage.activation, ConvOut::F32Pixels(&mut y));
            let win = pool_window(p, c, h, w)?;
            let mut z = vec![0f32; n * c * win.l()];
            max_pool_f32_to_planes(&y, &win, c, &mut z);
            return Tensor::from_vec(z, &[n, c, win.oh, win.ow], Device::Cpu);
        };
        let mut y = vec![0u8; n * l * o];
        let out = ConvOut::U8Pixels(&mut y, next.input_quant());
        conv.run(n, g, input, stage.activation, out);
        act = y;
        if let Some(p) = stage.pool {
            let win = pool_window(p, c, h, w)?;
            let mut z = vec![0u8; n * win.l() * c];
            max_pool_u8(&act, &win, c, &mut z);
            (act, h, w) = (z, win.oh, win.ow);
        }
    }
    unreachable!("the last stage returns")
}

/// The stages one after the other through the layers' own forward (each convolution with its
/// activation, then its pooling): the chain's result where its u8 form does not run.
fn stage_by_stage(x: &Tensor, stages: &[Stage], convs: &[&QuantizedConv2d]) -> Result<Tensor> {
    let mut y = x.clone();
    for (stage, conv) in stages.iter().zip(convs) {
        y = conv.forward_with(&y, stage.activation)?;
        if let Some(p) = stage.pool {
            y = y.max_pool2d(p)?;
        }
    }
    Ok(y)
}

/// x's NCHW f32 images quantized with `q`, channels last: pixel p of image i at (i·hw + p)·c.
fn channels_last_u8(x: &[f32], c: usize, hw: usize, q: QParams) -> Vec<u8> {
    let mut planes = vec![0u8; x.len()];
    quantize_rows_static(x, 1, x.len(), x.len(), q, &mut planes, x.len());
    if c == 1 {
        return planes;
    }
    let mut pixels = vec![0u8; x.len()];
    for (src, dst) in planes
        .chunks_exact(c * hw)
        .zip(pixels.chunks_exact_mut(c * hw))
    {
        for (ch, plane) in src.chunks_exact(hw).enumerate() {
            for (p, &v) in plane.iter().enumerate() {
                dst[p * c + ch] = v;
            }
        }
    }
    pixels
}

/// The pooling window over c×h×w images. Its checks and output size are sinter-core's own
/// (`Tensor::max_pool2d` of an empty batch of such images), so they cannot drift apart.
fn pool_window(p: Pool2dParams, c: usize, h: usize, w: usize) -> Result<Window> {
    let probe = Tensor::zeros(&[0, c, h, w], DType::F32, Device::Cpu)?.max_pool2d(p)?;
    let &[_, _, oh, ow] = probe.shape() else {
        unreachable!("max_pool2d keeps the rank");
    };
    Ok(Window {
        h,
        w,
        kh: p.kernel.h,
        kw: p.kernel.w,
        oh,
        ow,
        stride: (p.stride.h, p.stride.w),
        padding: (p.padding.h, p.padding.w),
        dilation: (p.dilation.h, p.dilation.w),
    })
}
