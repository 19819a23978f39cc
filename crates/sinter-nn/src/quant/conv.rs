//! `QuantizedConv2d`: a convolution with int8 weights (symmetric, per output channel) and a
//! static, calibrated u8 mapping of its input (one scale and zero point for the whole tensor —
//! the CNN case, where calibration fixes the range once). Runs as im2col + the int8 GEMM: the
//! f32 input is quantized while it is gathered into u8 columns (sinter-cpu's im2col rule, the
//! f32 convolution's; the padding is the zero point, i.e. the real value 0), images side by
//! side, and one GEMM per chunk of images covers them all, its epilogue adding the bias,
//! applying the activation and writing the NCHW output planes.

use std::any::Any;
use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use sinter_core::backend::ConvGeom;
use sinter_core::{bail, Conv2dParams, Device, Result, Tensor};
use sinter_cpu::im2col::{gather_u8_pixels, gather_u8_rows, Window};
use sinter_cpu::int8::{
    gemm, quantize_rows_static, ActQuant, Activation, Activations, Epilogue, Int8Path, Output,
    PackedWeights, QParams,
};

use super::host::{cpu_input, host_vec, int8_err};
use super::slot::Int8Layer;
use super::weight::Int8Weight;
use crate::module::{param, Module, NamedTensor};

pub struct QuantizedConv2d {
    weight: Int8Weight,
    /// The weight packed with k in (ky, kx, c) order, the order of the channels-last columns
    /// (`sinter_cpu::im2col::gather_u8_rows`); `weight` keeps PyTorch's (c, ky, kx).
    taps_major: PackedWeights,
    /// The last input size's tap table ([`Window::tap_table_by_pixel`]): a model sees one
    /// size, so it is built once instead of per forward.
    table: Mutex<Option<(Window, Arc<Vec<u32>>)>>,
    bias: Option<Vec<f32>>,
    bias_tensor: Option<Tensor>,
    params: Conv2dParams,
    input: QParams,
}

/// One convolution's sizes: input channels and each plane's window.
#[derive(Clone, Copy)]
pub(crate) struct Geom {
    pub c: usize,
    pub win: Window,
}

/// Bytes of column matrix per GEMM: the images of a batch are cut into chunks about this
/// large (one chunk for a digits CNN's batch of 256), so memory does not grow with the batch.
const COL_BUDGET: usize = 4 << 20;

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
        // scale · 255 must stay finite: every u8 input maps back to a finite f32.
        if !((input.scale * 255.0).is_finite()
            && input.scale > 0.0
            && (0..=255).contains(&input.zero_point))
        {
            bail!("QuantizedConv2d: input mapping {input:?} needs a positive scale (at most f32::MAX / 255) and a zero point in 0..=255");
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
                let v = host_vec(b)?;
                if let Some(j) = v.iter().position(|b| !b.is_finite()) {
                    bail!(
                        "QuantizedConv2d: bias[{j}] is {}; a bias must be finite",
                        v[j]
                    );
                }
                Some(v)
            }
            None => None,
        };
        let taps_major = pack_taps_major(&weight)?;
        Ok(QuantizedConv2d {
            weight,
            taps_major,
            table: Mutex::new(None),
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
        let c = self.weight.shape()[1];
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
        Ok((*n, self.geometry_of(*h, *w)?))
    }

    /// The window of an h×w input.
    pub(crate) fn geometry_of(&self, h: usize, w: usize) -> Result<Geom> {
        let s = self.weight.shape();
        let (c, kh, kw) = (s[1], s[2], s[3]);
        let p = self.params;
        match ConvGeom::out_hw(h, w, kh, kw, &p) {
            Some((oh, ow)) => Ok(Geom {
                c,
                win: Window {
                    h,
                    w,
                    kh,
                    kw,
                    oh,
                    ow,
                    stride: (p.stride.h, p.stride.w),
                    padding: (p.padding.h, p.padding.w),
                    dilation: (p.dilation.h, p.dilation.w),
                },
            }),
            None => bail!(
                "QuantizedConv2d: a {kh}×{kw} kernel with dilation {} does not fit a {h}×{w} \
                 input with padding {}",
                p.dilation,
                p.padding
            ),
        }
    }

    fn tap_table(&self, win: &Window) -> Arc<Vec<u32>> {
        let mut cached = self.table.lock().unwrap_or_else(|e| e.into_inner());
        match &*cached {
            Some((w, t)) if w == win => t.clone(),
            _ => {
                let t = Arc::new(win.tap_table_by_pixel());
                *cached = Some((*win, t.clone()));
                t
            }
        }
    }

    /// activation(conv(x) + b), x [n, c, h, w] on the CPU, no gradient.
    pub fn forward_with(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let (n, g) = self.geometry(x)?;
        let xs = cpu_input(x, "QuantizedConv2d")?;
        refuse_nan(&xs, "QuantizedConv2d")?;
        let (o, win) = (self.weight.n(), g.win);
        let mut y = vec![0f32; n * o * win.l()];
        self.run(
            n,
            g,
            ConvIn::F32Planes(&xs),
            activation,
            ConvOut::F32Planes(&mut y),
        );
        Tensor::from_vec(y, &[n, o, win.oh, win.ow], Device::Cpu)
    }

    /// activation(conv(x) + b) for `n` images of geometry `g`, from `input` into `out` (sized by
    /// the caller): im2col into u8 rows, images side by side, one GEMM per chunk of images.
    pub(crate) fn run(
        &self,
        n: usize,
        g: Geom,
        input: ConvIn<'_>,
        activation: Activation,
        mut out: ConvOut<'_>,
    ) {
        let win = g.win;
        let (img, l, o) = (g.c * win.h * win.w, win.l(), self.weight.n());
        let kp = self.taps_major.k_padded();
        let table = self.tap_table(&win);
        let epilogue = Epilogue {
            weight_scales: &self.weight.scales,
            bias: self.bias.as_deref(),
            activation,
        };
        let quantize = |src: &[f32], dst: &mut [u8]| {
            quantize_rows_static(src, 1, src.len(), src.len(), self.input, dst, dst.len())
        };
        let pad = self.input.quantize(0.0);
        let per = (COL_BUDGET / (l * kp).max(1)).clamp(1, n.max(1));
        let mut col = vec![0u8; per.min(n) * l * kp];
        // A few images per task: each task gathers into its own small buffers.
        let task = per.min(n).div_ceil(4 * rayon::current_num_threads()).max(1);
        for first in (0..n).step_by(per) {
            let imgs = per.min(n - first);
            let col = &mut col[..imgs * l * kp];
            let (rows, x) = (
                col.par_chunks_mut((task * l * kp).max(1)),
                first * img..(first + imgs) * img,
            );
            match input {
                ConvIn::F32Planes(xs) => {
                    rows.zip(xs[x].par_chunks((task * img).max(1)))
                        .for_each(|(rows, images)| {
                            gather_u8_rows(images, &win, g.c, &table, quantize, rows, kp)
                        })
                }
                ConvIn::U8Pixels(xs) => {
                    rows.zip(xs[x].par_chunks((task * img).max(1)))
                        .for_each(|(rows, images)| {
                            gather_u8_pixels(images, &win, g.c, &table, pad, rows, kp)
                        })
                }
            }
            let y = first * o * l..(first + imgs) * o * l;
            let sink = match &mut out {
                ConvOut::F32Planes(d) => Output::F32Planes {
                    data: &mut d[y],
                    plane: l,
                },
                ConvOut::F32Pixels(d) => Output::F32 {
                    data: &mut d[y],
                    stride: o,
                },
                ConvOut::U8Pixels(d, quant) => Output::U8 {
                    data: &mut d[y],
                    stride: o,
                    quant: *quant,
                },
            };
            gemm(
                Int8Path::get(),
                &Activations {
                    data: col,
                    rows: imgs * l,
                    stride: kp,
                    quant: ActQuant::PerTensor(self.input),
                },
                &self.taps_major,
                &epilogue,
                sink,
            );
        }
    }
}

/// A convolution's input: f32 NCHW planes (quantized with the layer's input mapping on the
/// way), or u8 channels-last pixels already in that mapping (a previous int8 layer's output).
#[derive(Clone, Copy)]
pub(crate) enum ConvIn<'a> {
    F32Planes(&'a [f32]),
    U8Pixels(&'a [u8]),
}

/// Where a convolution writes: f32 NCHW planes, f32 channels-last pixels, or u8 channels-last
/// pixels requantized with the given mapping (the next layer's input mapping).
pub(crate) enum ConvOut<'a> {
    F32Planes(&'a mut [f32]),
    F32Pixels(&'a mut [f32]),
    U8Pixels(&'a mut [u8], QParams),
}

/// An int8 layer cannot carry NaN (its u8 activations have none, and a static mapping would
/// turn it into an ordinary number): refused, where the f32 layer would propagate it.
/// Infinities saturate like any value outside the calibrated range.
pub(crate) fn refuse_nan(x: &[f32], layer: &str) -> Result<()> {
    let (lo, hi) = sinter_cpu::int8::quant::min_max(x);
    if lo.is_nan() || hi.is_nan() {
        let at = x.iter().position(|v| v.is_nan()).unwrap_or(0);
        bail!("{layer}: the input holds NaN (first at flat index {at}); int8 activations cannot represent NaN, so the quantized model refuses it. Check the input, or run the f32 model to see where NaN arises");
    }
    Ok(())
}

/// The [out, c, kh, kw] int8 weight packed as [out, kh, kw, c].
fn pack_taps_major(weight: &Int8Weight) -> Result<PackedWeights> {
    let s = weight.shape();
    let (o, c, kk) = (s[0], s[1], s[2] * s[3]);
    let v = weight.values();
    let mut r = vec![0i8; v.len()];
    for j in 0..o {
        for ch in 0..c {
            for t in 0..kk {
                r[(j * kk + t) * c + ch] = v[(j * c + ch) * kk + t];
            }
        }
    }
    PackedWeights::pack(&r, o, c * kk).map_err(int8_err)
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
