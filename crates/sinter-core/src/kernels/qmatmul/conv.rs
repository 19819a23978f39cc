//! The int8 convolution, on every device: y = act(conv(x, W) + b) with W int8 per output
//! channel and x quantized with one static, calibrated u8 mapping (the CNN case: calibration
//! fixes the range once). It runs as im2col into u8 columns (the padding is the zero point, the
//! real value 0) and the int8 GEMM of this folder, whose epilogue adds the bias and applies the
//! activation.
//!
//! - CPU: sinter-cpu's gather (channels-last columns, so the weight is packed taps-major to
//!   match) and int8 GEMM, images in chunks of about [`COL_BUDGET`] bytes of columns, writing
//!   NCHW planes directly; [`QConv2d::run_host`] also takes u8 channels-last input and writes
//!   u8 for the int8 chains of `sinter_nn::quant::chain`.
//! - CUDA: `qconv_im2col_u8` of `qmatmul.cu` (k in the weight's own (c, ky, kx) order), then
//!   qmatmul's dp4a GEMM with the one static mapping (`row_step` 0), then [n, l, o] → NCHW.
//!
//! The integer sums are exact on both and the epilogue is the same f32 arithmetic, so the
//! devices agree bit for bit (GELU within each device's tanh/erf).

use std::sync::{Arc, Mutex};

use rayon::prelude::*;
use sinter_cpu::im2col::{gather_u8_pixels, gather_u8_rows, Window};
use sinter_cpu::int8::{
    gemm, quantize_rows_static, ActQuant, Activation, Activations, Epilogue, Int8Path, Output,
    PackedWeights, QParams,
};

use super::{cuda, Plane, QWeight};
use crate::backend::ConvGeom;
use crate::custom_op::{CustomOp, OpClass, OutputSpec, Traffic};
use crate::kernels::{cached, OpCache};
use crate::{bail, is_grad_enabled, no_grad, Conv2dParams, DType, Device, Result, Tensor};

/// Bytes of CPU column matrix per GEMM: the images of a batch are cut into chunks about this
/// large (one chunk for a digits CNN's batch of 256), so memory does not grow with the batch.
pub const COL_BUDGET: usize = 4 << 20;

/// One convolution's sizes: input channels and each plane's window.
#[derive(Clone, Copy, Debug)]
pub struct Geom {
    pub c: usize,
    pub win: Window,
}

/// A convolution's input on the host: f32 NCHW planes (quantized with the layer's input
/// mapping on the way), or u8 channels-last pixels already in that mapping (a previous int8
/// layer's output).
#[derive(Clone, Copy)]
pub enum ConvIn<'a> {
    F32Planes(&'a [f32]),
    U8Pixels(&'a [u8]),
}

/// Where a host convolution writes: f32 NCHW planes, f32 channels-last pixels, or u8
/// channels-last pixels requantized with the given mapping (the next layer's input mapping).
pub enum ConvOut<'a> {
    F32Planes(&'a mut [f32]),
    F32Pixels(&'a mut [f32]),
    U8Pixels(&'a mut [u8], QParams),
}

/// The weight and bias in a CUDA device's form, made on the first call there.
struct DeviceForm {
    device: Device,
    weight: QWeight,
    bias: Option<Tensor>,
    /// The static input mapping as the GEMM reads per-row mappings: f32 [1] and i64 [1].
    scale: Tensor,
    zero: Tensor,
}

/// An int8 convolution ready to run: the int8 weight [out, in, kh, kw] with its per-channel
/// scales, the f32 bias, the geometry parameters and the calibrated input mapping.
pub struct QConv2d {
    shape: [usize; 4],
    params: Conv2dParams,
    input: QParams,
    /// Row-major [out, in·kh·kw] in PyTorch's (c, ky, kx) order: what a device weight holds.
    values: Arc<[i8]>,
    scales: Arc<[f32]>,
    bias: Option<Vec<f32>>,
    /// The CPU's weight, packed with k in (ky, kx, c) order, the order of its channels-last
    /// columns (`sinter_cpu::im2col::gather_u8_rows`).
    taps_major: PackedWeights,
    /// The last input size's tap table ([`Window::tap_table_by_pixel`]): a model sees one
    /// size, so it is built once instead of per forward.
    table: Mutex<Option<(Window, Arc<Vec<u32>>)>>,
    device: Mutex<Option<Arc<DeviceForm>>>,
}

impl std::fmt::Debug for QConv2d {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QConv2d({:?}, {:?}, input {:?})",
            self.shape, self.params, self.input
        )
    }
}

impl QConv2d {
    /// An int8 convolution from its weight's values (row-major [out, in, kh, kw], each in
    /// [-127, 127]), one scale per output channel, a bias (finite, one per output channel)
    /// and the input's calibrated mapping.
    pub fn new(
        values: &[i8],
        shape: [usize; 4],
        scales: &[f32],
        bias: Option<&[f32]>,
        params: Conv2dParams,
        input: QParams,
    ) -> Result<QConv2d> {
        const WHAT: &str = "QuantizedConv2d";
        let [o, c, kh, kw] = shape;
        if values.len() != o * c * kh * kw || scales.len() != o {
            bail!(
                "{WHAT}: {} weight values and {} scales for a weight {shape:?}",
                values.len(),
                scales.len()
            );
        }
        if params.groups != 1 {
            bail!(
                "{WHAT}: grouped convolutions ({} groups) are not supported",
                params.groups
            );
        }
        if params.stride.any_zero() || params.dilation.any_zero() {
            bail!("{WHAT}: stride and dilation must be at least 1");
        }
        // scale · 255 must stay finite: every u8 input maps back to a finite f32.
        if !((input.scale * 255.0).is_finite()
            && input.scale > 0.0
            && (0..=255).contains(&input.zero_point))
        {
            bail!("{WHAT}: input mapping {input:?} needs a positive scale (at most f32::MAX / 255) and a zero point in 0..=255");
        }
        if let Some(b) = bias {
            if b.len() != o {
                bail!("{WHAT}: {} bias values for {o} outputs", b.len());
            }
            if let Some(j) = b.iter().position(|b| !b.is_finite()) {
                bail!("{WHAT}: bias[{j}] is {}; a bias must be finite", b[j]);
            }
        }
        Ok(QConv2d {
            shape,
            params,
            input,
            values: values.into(),
            scales: scales.into(),
            bias: bias.map(<[f32]>::to_vec),
            taps_major: pack_taps_major(values, shape)?,
            table: Mutex::new(None),
            device: Mutex::new(None),
        })
    }

    /// The weight's shape [out, in, kh, kw].
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }
    pub fn params(&self) -> Conv2dParams {
        self.params
    }
    /// The calibrated u8 mapping of the input.
    pub fn input_quant(&self) -> QParams {
        self.input
    }

    /// The window of an h×w input.
    pub fn geometry_of(&self, h: usize, w: usize) -> Result<Geom> {
        let [_, c, kh, kw] = self.shape;
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

    /// activation(conv(x) + b) for x [n, in, h, w], a float tensor on the CPU or a CUDA
    /// device (the result is f32 NCHW on the same device). No gradient; NaN is refused (a
    /// u8 activation cannot carry it).
    pub fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        const WHAT: &str = "QuantizedConv2d";
        let c = self.shape[1];
        let &[n, xc, h, w] = x.shape() else {
            bail!("{WHAT}: expected input [n, {c}, h, w], got {:?}", x.shape());
        };
        if xc != c {
            bail!("{WHAT}: expected input [n, {c}, h, w], got {:?}", x.shape());
        }
        if !x.dtype().is_float() {
            bail!("{WHAT}: expected a float input, got {}", x.dtype());
        }
        if is_grad_enabled() && x.tracks_grad() {
            bail!("{WHAT}: int8 layers are for inference and pass no gradient; run the model under no_grad (eval, predict and generate do)");
        }
        let g = self.geometry_of(h, w)?;
        let (o, win) = (self.shape[0], g.win);
        if x.device() != Device::Cpu {
            return self.forward_device(x, n, g, activation);
        }
        let xs = x.host_values()?;
        refuse_nan(&xs, WHAT)?;
        let mut y = vec![0f32; n * o * win.l()];
        self.run_host(
            n,
            g,
            ConvIn::F32Planes(&xs),
            activation,
            ConvOut::F32Planes(&mut y),
        );
        Tensor::from_vec(y, &[n, o, win.oh, win.ow], Device::Cpu)
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

    /// activation(conv(x) + b) on the host for `n` images of geometry `g`, from `input` into
    /// `out` (sized by the caller): im2col into u8 rows, images side by side, one GEMM per
    /// chunk of images.
    pub fn run_host(
        &self,
        n: usize,
        g: Geom,
        input: ConvIn<'_>,
        activation: Activation,
        mut out: ConvOut<'_>,
    ) {
        let win = g.win;
        let (img, l, o) = (g.c * win.h * win.w, win.l(), self.shape[0]);
        let kp = self.taps_major.k_padded();
        let table = self.tap_table(&win);
        let epilogue = Epilogue {
            weight_scales: &self.scales,
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

    /// The weight, bias and mapping on `device`, uploaded on the first call there.
    fn device_form(&self, device: Device) -> Result<Arc<DeviceForm>> {
        let mut slot = self.device.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = slot.as_ref().filter(|f| f.device == device) {
            return Ok(f.clone());
        }
        let [o, c, kh, kw] = self.shape;
        let weight = QWeight::int8(&self.values, o, c * kh * kw, &self.scales, device)?;
        let bias = match &self.bias {
            Some(b) => Some(Tensor::from_vec(b.clone(), &[o], Device::Cpu)?.to_device(device)?),
            None => None,
        };
        let form = Arc::new(DeviceForm {
            device,
            weight,
            bias,
            scale: Tensor::from_vec(vec![self.input.scale], &[1], Device::Cpu)?
                .to_device(device)?,
            zero: Tensor::from_vec(vec![self.input.zero_point as i64], &[1], Device::Cpu)?
                .to_device(device)?,
        });
        *slot = Some(form.clone());
        Ok(form)
    }

    /// The CUDA path: the gather kernel, the GEMM, the NCHW output.
    fn forward_device(&self, x: &Tensor, n: usize, g: Geom, act: Activation) -> Result<Tensor> {
        let _g = no_grad();
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        if x.ne(&x)?.any_all()?.to_dtype(DType::F32)?.to_vec_f32()?[0] != 0.0 {
            refuse_nan(&x.to_vec_f32()?, "QuantizedConv2d")?;
        }
        let form = self.device_form(x.device())?;
        let (o, win) = (self.shape[0], g.win);
        let (l, k) = (win.l(), g.c * win.kh * win.kw);
        if n * l == 0 {
            return Tensor::zeros(&[n, o, win.oh, win.ow], DType::F32, x.device());
        }
        let words = k.div_ceil(8);
        let cols = im2col_op(g, self.input)?.apply(&[&x])?.remove(0);
        debug_assert_eq!(cols.shape(), [n * l, words]);
        let Plane::Device {
            values,
            sums,
            scales,
        } = &form.weight.planes[0]
        else {
            bail!("QuantizedConv2d: internal error: a CPU plane in a device weight");
        };
        let plane = cuda::DevicePlane {
            values,
            sums,
            scales,
        };
        let y = cuda::gemm_static(
            &cols,
            &plane,
            &form.scale,
            &form.zero,
            form.bias.as_ref(),
            act,
        )?;
        y.reshape(&[n, l, o])?
            .permute(&[0, 2, 1])?
            .contiguous()?
            .reshape(&[n, o, win.oh, win.ow])
    }
}

/// The gather of `g`'s windows with the static mapping `q`: x f32 [n, c, h, w] → the u8
/// columns as i64 words [n·oh·ow, ⌈c·kh·kw/8⌉].
fn im2col_op(g: Geom, q: QParams) -> Result<CustomOp> {
    type Key = (usize, [usize; 10], u32, i32);
    static OPS: OpCache<Key> = std::sync::OnceLock::new();
    let w = g.win;
    let geo = [
        w.kh,
        w.kw,
        w.oh,
        w.ow,
        w.stride.0,
        w.stride.1,
        w.padding.0,
        w.padding.1,
        w.dilation.0,
        w.dilation.1,
    ];
    cached(&OPS, (g.c, geo, q.scale.to_bits(), q.zero_point), || {
        let k = g.c * w.kh * w.kw;
        let words = k.div_ceil(8);
        let (inv, zp) = (1.0 / q.scale, q.zero_point as f32);
        CustomOp::builder("qconv_im2col_u8")
            .inputs(1)
            .dtypes(&[DType::F32])
            .outputs(move |m| {
                let &[n, c, h, wd] = &m[0].shape[..] else {
                    bail!(
                        "qconv_im2col_u8: expected x [n, c, h, w], got {:?}",
                        m[0].shape
                    );
                };
                if (c, h, wd) != (g.c, w.h, w.w) {
                    bail!(
                        "qconv_im2col_u8: x {:?} is not [n, {}, {}, {}]",
                        m[0].shape,
                        g.c,
                        w.h,
                        w.w
                    );
                }
                Ok(vec![OutputSpec::new(&[n * w.oh * w.ow, words], DType::I64)])
            })
            .cuda(cuda::qkernel("qconv_im2col_u8", move |m| {
                let n = m[0].shape[0];
                let items = n * w.oh * w.ow * words;
                let t = Traffic::bytes(items * 8 * 4, items * 8).with_flops(3 * items * 8);
                Ok(cuda::strided(items)
                    .arg(n as i64)
                    .arg(g.c as i64)
                    .arg(w.h as i64)
                    .arg(w.w as i64)
                    .arg(w.kh as i64)
                    .arg(w.kw as i64)
                    .arg(w.oh as i64)
                    .arg(w.ow as i64)
                    .arg(w.stride.0 as i64)
                    .arg(w.stride.1 as i64)
                    .arg(w.padding.0 as i64)
                    .arg(w.padding.1 as i64)
                    .arg(w.dilation.0 as i64)
                    .arg(w.dilation.1 as i64)
                    .arg(words as i64)
                    .arg(inv)
                    .arg(zp)
                    .with_cost(OpClass::Copy, t))
            })?)
            .build()
    })
}

/// An int8 layer cannot carry NaN (its u8 activations have none, and a static mapping would
/// turn it into an ordinary number): refused, where the f32 layer would propagate it.
/// Infinities saturate like any value outside the calibrated range.
pub fn refuse_nan(x: &[f32], layer: &str) -> Result<()> {
    let (lo, hi) = sinter_cpu::int8::quant::min_max(x);
    if lo.is_nan() || hi.is_nan() {
        let at = x.iter().position(|v| v.is_nan()).unwrap_or(0);
        bail!("{layer}: the input holds NaN (first at flat index {at}); int8 activations cannot represent NaN, so the quantized model refuses it. Check the input, or run the f32 model to see where NaN arises");
    }
    Ok(())
}

/// The [out, c, kh, kw] int8 weight packed as [out, kh, kw, c].
fn pack_taps_major(v: &[i8], [o, c, kh, kw]: [usize; 4]) -> Result<PackedWeights> {
    let kk = kh * kw;
    let mut r = vec![0i8; v.len()];
    for j in 0..o {
        for ch in 0..c {
            for t in 0..kk {
                r[(j * kk + t) * c + ch] = v[(j * c + ch) * kk + t];
            }
        }
    }
    PackedWeights::pack(&r, o, c * kk)
        .map_err(|e| crate::Error::Msg(format!("QuantizedConv2d: int8: {e}")))
}

/// The op's arithmetic, exactly, on the host, for tests: each input value quantized with the
/// static mapping (a padding tap is the zero point), the integer window sums in i64, then
/// (Σ (q − z)·w)·(s·w_scale) + bias and the activation in f64. `x` f32 [n, c, h, w].
pub fn conv_reference(
    conv: &QConv2d,
    x: &[f32],
    [n, h, w]: [usize; 3],
    activation: Activation,
) -> Result<Vec<f64>> {
    let g = conv.geometry_of(h, w)?;
    let (win, c, o) = (g.win, g.c, conv.shape[0]);
    let q = conv.input;
    let mut y = vec![0f64; n * o * win.l()];
    for (i, yi) in y.chunks_exact_mut(o * win.l()).enumerate() {
        for (j, plane) in yi.chunks_exact_mut(win.l()).enumerate() {
            for (p, out) in plane.iter_mut().enumerate() {
                let (oy, ox) = (p / win.ow, p % win.ow);
                let mut acc = 0i64;
                for ch in 0..c {
                    for ky in 0..win.kh {
                        for kx in 0..win.kw {
                            let iy = (oy * win.stride.0 + ky * win.dilation.0) as isize
                                - win.padding.0 as isize;
                            let ix = (ox * win.stride.1 + kx * win.dilation.1) as isize
                                - win.padding.1 as isize;
                            let inside =
                                (0..h as isize).contains(&iy) && (0..w as isize).contains(&ix);
                            let v = if inside {
                                x[((i * c + ch) * h + iy as usize) * w + ix as usize]
                            } else {
                                0.0
                            };
                            let wv = conv.values[((j * c + ch) * win.kh + ky) * win.kw + kx];
                            acc += (q.quantize(v) as i64 - q.zero_point as i64) * wv as i64;
                        }
                    }
                }
                let v = acc as f64 * q.scale as f64 * conv.scales[j] as f64
                    + conv.bias.as_ref().map_or(0.0, |b| b[j] as f64);
                *out = super::activate_f64(v, activation);
            }
        }
    }
    Ok(y)
}
