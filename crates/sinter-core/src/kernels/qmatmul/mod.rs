//! qmatmul (issue 26 item 2): y = act(x·Wᵀ + b) with a quantized weight W, for inference —
//! the one op every quantized layer calls, on every device.
//!
//! - `mod.rs` (here): the weight ([`QWeight`], in its device's form, moved with
//!   [`QWeight::to_device`]), the op ([`qmatmul`]) and [`reference`], the exact integer
//!   arithmetic both kernels must match.
//! - `cpu.rs`: the CPU's int8 GEMM (`sinter_cpu::int8`, packed panels, AVX2/VNNI paths).
//! - `cuda.rs` and `qmatmul.cu`: the CUDA kernels (dp4a GEMM, the per-row quantizer) as
//!   custom-op kernels, so they also run on the emulated device.
//! - `conv.rs`: the int8 convolution ([`QConv2d`]): im2col into u8 columns with a static
//!   input mapping, then this folder's int8 GEMM, on every device.
//!
//! The int8 kind ([`QFormat::Int8`]): weights symmetric int8 per output channel
//! (w[j, ·] ≈ scale[j]·q[j, ·]), activations quantized to u8 per row at run time (dynamic: each
//! row its own range), in one u8 term or two (the second carrying the first's rounding error,
//! [`ActTerms`]); exact i32 accumulation; then (acc − z·Σw)·(s·w_scale) + bias and the
//! activation in f32. A weight may have a second plane (w ≈ s₁·q₁ + s₂·q₂): one GEMM per plane,
//! the products summed before bias and activation. Both devices compute the same integers and
//! the same f32 operations in the same order, so they agree to the last bit except in GELU
//! (each device's tanh/erf, within a few ulps).
//!
//! The GGML kinds ([`QFormat::Ggml`], `ggml.rs`): the block formats of GGUF files (Q8_0, Q4_0,
//! Q4_1, Q4_K, Q5_K, Q6_K) kept as the file stores them, one plane of parts stacked by rows;
//! sinter-cpu's dot kernels on the CPU, dequantize-and-GEMM on CUDA. Another kind joins as
//! one more [`QFormat`] variant, its form in [`QWeight`]'s planes and its kernels here.
//!
//! No gradient: an input that tracks one is an error (quantized layers are for inference).

mod conv;
mod cpu;
mod cuda;
mod ggml;

use std::sync::Arc;

use sinter_cpu::ggml_quant::QuantMatrix;
use sinter_cpu::int8::PackedWeights;
pub use sinter_cpu::int8::{ActTerms, Activation};

use crate::op::UnaryOp;
use crate::{bail, is_grad_enabled, DType, Device, Result, Tensor};
pub use conv::{conv_reference, refuse_nan, ConvIn, ConvOut, Geom, QConv2d, COL_BUDGET};
pub use cuda::QMATMUL_CU;

/// The largest k: above it the i32 sums could overflow (255 · 127 · k < 2³¹).
pub const MAX_K: usize = sinter_cpu::int8::pack::MAX_K;

/// How a quantized weight's values are stored: the kinds of weight the op multiplies by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum QFormat {
    /// Symmetric int8 per output channel, u8 activations quantized per row at run time.
    Int8,
    /// GGML blocks (one type per part of rows), as a GGUF file stores them.
    Ggml,
}

/// One int8 plane of a weight, in its device's form.
#[derive(Clone)]
enum Plane {
    /// The CPU's: the CPU kernels' packed panels (channel sums inside) and the scales.
    Cpu {
        packed: Arc<PackedWeights>,
        scales: Arc<[f32]>,
    },
    /// A CUDA device's: the [n, k] values row-major, each row padded with zeros to `ld`
    /// (a multiple of 8) bytes and held as i64 words ([n, ld/8]: tensors hold no bytes);
    /// the channel sums Σ_k q[j, k] (i64 [n]); the scales (f32 [n]).
    Device {
        values: Tensor,
        sums: Tensor,
        scales: Tensor,
    },
    /// A GGML matrix on the CPU (sinter-cpu's form: rows grouped for its dot kernels).
    GgmlCpu(Arc<QuantMatrix>),
    /// A GGML matrix on a CUDA device: its parts' blocks row after row.
    GgmlDevice(Vec<ggml::DevicePart>),
}

/// A quantized [n, k] weight on one device: one int8 plane, or two (w ≈ s₁·q₁ + s₂·q₂, the
/// second carrying the first's rounding error). Cheap to clone.
#[derive(Clone)]
pub struct QWeight {
    format: QFormat,
    n: usize,
    k: usize,
    device: Device,
    planes: Vec<Plane>,
}

impl std::fmt::Debug for QWeight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QWeight({:?} [{}, {}], {} plane(s) on {})",
            self.format,
            self.n,
            self.k,
            self.planes.len(),
            self.device
        )
    }
}

/// Bytes a device row of k int8 values takes: k rounded up to whole i64 words.
fn row_bytes(k: usize) -> usize {
    k.div_ceil(8) * 8
}

impl QWeight {
    /// An int8 weight on the CPU from its packed form (what the CPU kernels read) and its n
    /// per-channel scales.
    pub fn int8_cpu(packed: Arc<PackedWeights>, scales: Arc<[f32]>) -> Result<QWeight> {
        let (n, k) = (packed.n(), packed.k());
        if scales.len() != n {
            bail!(
                "qmatmul: {} weight scales for {n} output channels",
                scales.len()
            );
        }
        Ok(QWeight {
            format: QFormat::Int8,
            n,
            k,
            device: Device::Cpu,
            planes: vec![Plane::Cpu { packed, scales }],
        })
    }

    /// An int8 weight from its row-major [n, k] values (in [-127, 127]) and n scales, on
    /// `device`.
    pub fn int8(
        values: &[i8],
        n: usize,
        k: usize,
        scales: &[f32],
        device: Device,
    ) -> Result<QWeight> {
        let packed = PackedWeights::pack(values, n, k)
            .map_err(|e| crate::Error::Msg(format!("qmatmul: {e}")))?;
        QWeight::int8_cpu(Arc::new(packed), scales.into())?.to_device(device)
    }

    /// A GGML weight on the CPU ([n, k]: its rows are the output channels).
    pub fn ggml(matrix: Arc<QuantMatrix>) -> QWeight {
        QWeight {
            format: QFormat::Ggml,
            n: matrix.n(),
            k: matrix.k(),
            device: Device::Cpu,
            planes: vec![Plane::GgmlCpu(matrix)],
        }
    }

    /// The CPU matrix of a GGML weight on the CPU (the CPU decode step reads it directly).
    pub fn ggml_matrix(&self) -> Option<&Arc<QuantMatrix>> {
        match self.planes.first() {
            Some(Plane::GgmlCpu(m)) => Some(m),
            _ => None,
        }
    }

    /// Rows `ids` (i64, any shape, each < n) of a GGML weight dequantized: f32 [ids.., k]
    /// on the weight's device (token tables kept quantized).
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype() != DType::I64 {
            bail!("qmatmul: lookup ids must be i64, got {}", ids.dtype());
        }
        if ids.device() != self.device {
            bail!(
                "qmatmul: lookup ids on {} for a weight on {}; move one of them",
                ids.device(),
                self.device
            );
        }
        let host = ids.to_vec_i64()?;
        if let Some(&bad) = host.iter().find(|&&i| i < 0 || i as usize >= self.n) {
            bail!(
                "qmatmul: token id {bad} is outside the table's {} rows",
                self.n
            );
        }
        let mut shape = ids.shape().to_vec();
        shape.push(self.k);
        match &self.planes[..] {
            [Plane::GgmlCpu(m)] => {
                Tensor::from_vec(ggml::lookup_cpu(m, &host)?, &shape, Device::Cpu)
            }
            [Plane::GgmlDevice(parts)] => ggml::lookup_device(parts, self.k, ids),
            _ => bail!("qmatmul: lookup of rows is for GGML weights; an int8 table has its own"),
        }
    }

    /// This weight with `second` (same shape, format and device) as its second plane.
    pub fn with_second_plane(mut self, second: QWeight) -> Result<QWeight> {
        if self.format != QFormat::Int8 {
            bail!(
                "qmatmul: only int8 weights take a second plane, not {:?}",
                self.format
            );
        }
        let same = (second.format, second.n, second.k, second.device)
            == (self.format, self.n, self.k, self.device);
        if !same || self.planes.len() != 1 || second.planes.len() != 1 {
            bail!("qmatmul: a second plane must be one plane like the first ({self:?}), got {second:?}");
        }
        self.planes.extend(second.planes);
        Ok(self)
    }

    pub fn format(&self) -> QFormat {
        self.format
    }
    /// Output channels.
    pub fn n(&self) -> usize {
        self.n
    }
    /// Inputs per channel.
    pub fn k(&self) -> usize {
        self.k
    }
    pub fn device(&self) -> Device {
        self.device
    }
    pub fn planes(&self) -> usize {
        self.planes.len()
    }

    /// Plane p's row-major [n, k] values and scales, on the host.
    pub fn plane_values(&self, p: usize) -> Result<(Vec<i8>, Vec<f32>)> {
        let Some(plane) = self.planes.get(p) else {
            bail!("qmatmul: plane {p} of a weight with {}", self.planes.len());
        };
        Ok(match plane {
            Plane::Cpu { packed, scales } => (packed.unpack(), scales.to_vec()),
            Plane::GgmlCpu(_) | Plane::GgmlDevice(_) => {
                bail!("qmatmul: a GGML weight has blocks, not int8 planes")
            }
            Plane::Device { values, scales, .. } => {
                let ld = row_bytes(self.k);
                let words = values.to_vec_i64()?;
                let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
                let q = bytes
                    .chunks_exact(ld.max(1))
                    .take(self.n)
                    .flat_map(|row| row[..self.k].iter().map(|&b| b as i8))
                    .collect();
                (q, scales.to_vec_f32()?)
            }
        })
    }

    /// The same weight on `device` (this one when it is already there).
    pub fn to_device(&self, device: Device) -> Result<QWeight> {
        if device == self.device {
            return Ok(self.clone());
        }
        let planes = (0..self.planes.len())
            .map(|p| self.plane_on(p, device))
            .collect::<Result<_>>()?;
        Ok(QWeight {
            device,
            planes,
            ..self.clone()
        })
    }

    fn plane_on(&self, p: usize, device: Device) -> Result<Plane> {
        match (&self.planes[p], device) {
            (Plane::GgmlCpu(m), Device::Cpu) => return Ok(Plane::GgmlCpu(m.clone())),
            (Plane::GgmlCpu(m), dev) => return Ok(Plane::GgmlDevice(ggml::upload(m, dev)?)),
            (Plane::GgmlDevice(parts), Device::Cpu) => {
                return Ok(Plane::GgmlCpu(Arc::new(ggml::download(parts, self.k)?)))
            }
            (Plane::GgmlDevice(parts), dev) => {
                let moved = (parts.iter())
                    .map(|d| {
                        Ok(ggml::DevicePart {
                            blocks: d.blocks.to_device(dev)?,
                            ..d.clone()
                        })
                    })
                    .collect::<Result<_>>()?;
                return Ok(Plane::GgmlDevice(moved));
            }
            _ => {}
        }
        if let (
            Plane::Device {
                values,
                sums,
                scales,
            },
            Device::Cuda(_),
        ) = (&self.planes[p], device)
        {
            return Ok(Plane::Device {
                values: values.to_device(device)?,
                sums: sums.to_device(device)?,
                scales: scales.to_device(device)?,
            });
        }
        let (q, scales) = self.plane_values(p)?;
        if device == Device::Cpu {
            let packed = PackedWeights::pack(&q, self.n, self.k)
                .map_err(|e| crate::Error::Msg(format!("qmatmul: {e}")))?;
            return Ok(Plane::Cpu {
                packed: Arc::new(packed),
                scales: scales.into(),
            });
        }
        let ld = row_bytes(self.k);
        let mut bytes = vec![0u8; self.n * ld];
        for (row, src) in bytes
            .chunks_exact_mut(ld.max(1))
            .zip(q.chunks_exact(self.k.max(1)))
        {
            for (b, &v) in row.iter_mut().zip(src) {
                *b = v as u8;
            }
        }
        let words: Vec<i64> = bytes
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        let values = Tensor::from_vec(words, &[self.n, ld / 8], Device::Cpu)?.to_device(device)?;
        let sums = cuda::weight_sums(&values)?;
        let scales = Tensor::from_vec(scales, &[self.n], Device::Cpu)?.to_device(device)?;
        Ok(Plane::Device {
            values,
            sums,
            scales,
        })
    }
}

/// What [`qmatmul`] returns.
#[derive(Debug)]
pub struct QOutput {
    /// act(x·Wᵀ + b): x's shape with its last dimension n, f32, on x's device.
    pub y: Tensor,
    /// The activation terms used (`ActTerms::Auto` decided: `One` or `Two`).
    pub terms: ActTerms,
}

/// y = act(x·Wᵀ + bias) over the last dimension of `x` (a float tensor on `w`'s device, its
/// rows quantized in `terms` u8 terms), `bias` f32 [n] on the same device or none.
pub fn qmatmul(
    x: &Tensor,
    w: &QWeight,
    bias: Option<&Tensor>,
    activation: Activation,
    terms: ActTerms,
) -> Result<QOutput> {
    let (n, k) = (w.n, w.k);
    if x.rank() == 0 || x.shape().last() != Some(&k) {
        bail!(
            "qmatmul: a weight [{n}, {k}] takes inputs with last dimension {k}, got shape {:?}",
            x.shape()
        );
    }
    if !x.dtype().is_float() {
        bail!("qmatmul: expected a float input, got {}", x.dtype());
    }
    if is_grad_enabled() && x.tracks_grad() {
        bail!("qmatmul: quantized layers are for inference and pass no gradient; run the model under no_grad (eval, predict and generate do)");
    }
    if x.device() != w.device {
        bail!(
            "qmatmul: the input is on {} and the quantized weight on {}; move the weight with QWeight::to_device",
            x.device(),
            w.device
        );
    }
    if let Some(b) = bias {
        if b.shape() != [n] || b.dtype() != DType::F32 || b.device() != w.device {
            bail!(
                "qmatmul: the bias must be f32 [{n}] on {}, got {} {:?} on {}",
                w.device,
                b.dtype(),
                b.shape(),
                b.device()
            );
        }
    }
    let rows = x.numel() / k.max(1);
    if w.format == QFormat::Ggml {
        return ggml_forward(x, w, bias, activation, rows);
    }
    // The rule both devices follow (the CPU's GEMM decides the same way inside).
    let terms = terms.for_weight(rows, k.div_ceil(4) * 4 * n);
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank ≥ 1") = n;
    let y = match w.device {
        Device::Cpu => {
            let planes: Vec<_> = w
                .planes
                .iter()
                .map(|p| match p {
                    Plane::Cpu { packed, scales } => Ok((&**packed, &**scales)),
                    _ => bail!("qmatmul: a device or GGML plane in a CPU int8 weight"),
                })
                .collect::<Result<_>>()?;
            let y = cpu::forward(x, &planes, bias, activation, terms)?;
            Tensor::from_vec(y, &shape, Device::Cpu)?
        }
        _ => {
            let planes: Vec<_> = w
                .planes
                .iter()
                .map(|p| match p {
                    Plane::Device {
                        values,
                        sums,
                        scales,
                    } => Ok(cuda::DevicePlane {
                        values,
                        sums,
                        scales,
                    }),
                    _ => bail!("qmatmul: a CPU or GGML plane in a device int8 weight"),
                })
                .collect::<Result<_>>()?;
            let x2 = x.to_dtype(DType::F32)?.contiguous()?.reshape(&[rows, k])?;
            cuda::forward(&x2, &planes, bias, activation, terms)?.reshape(&shape)?
        }
    };
    Ok(QOutput { y, terms })
}

/// qmatmul of a GGML weight (activation terms do not apply: its kernels quantize per block).
fn ggml_forward(
    x: &Tensor,
    w: &QWeight,
    bias: Option<&Tensor>,
    activation: Activation,
    rows: usize,
) -> Result<QOutput> {
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank ≥ 1") = w.n;
    let y = match &w.planes[..] {
        [Plane::GgmlCpu(m)] => Tensor::from_vec(
            ggml::forward_cpu(x, m, bias, activation)?,
            &shape,
            Device::Cpu,
        )?,
        [Plane::GgmlDevice(parts)] => {
            let x2 = x
                .to_dtype(DType::F32)?
                .contiguous()?
                .reshape(&[rows, w.k])?;
            ggml::forward_device(&x2, parts, w.k, bias, activation)?.reshape(&shape)?
        }
        _ => bail!("qmatmul: a GGML weight without its one plane of blocks"),
    };
    Ok(QOutput {
        y,
        terms: ActTerms::One,
    })
}

/// The op's arithmetic, exactly, on the host: each row of `x` ([m, k]) quantized as the CPU
/// quantizer does (`sinter_cpu::int8::quantize_rows_terms`, the one rule), the integer sums in
/// i64, then (acc − z·Σw)·(s·w_scale), summed over terms and planes, plus bias, activated —
/// in f64, so a kernel's f32 result is within f32 rounding of it. `planes`: (values [n, k]
/// row-major, scales [n]).
pub fn reference(
    x: &[f32],
    k: usize,
    planes: &[(&[i8], &[f32])],
    bias: Option<&[f32]>,
    activation: Activation,
    terms: ActTerms,
) -> Result<Vec<f64>> {
    let m = x.len() / k.max(1);
    let n = planes.first().map_or(0, |p| p.1.len());
    let terms = terms.for_weight(m, k.div_ceil(4) * 4 * n);
    let t = terms.count(m);
    let mut q = vec![0u8; t * m * k];
    let params = sinter_cpu::int8::dynamic::quantize_rows_terms(x, m, k, k, terms, &mut q, k)
        .map_err(|e| crate::Error::Msg(format!("qmatmul reference: {e}")))?;
    let mut y = vec![0f64; m * n];
    for (i, yr) in y.chunks_exact_mut(n.max(1)).enumerate().take(m) {
        for (j, o) in yr.iter_mut().enumerate() {
            for (values, scales) in planes {
                for term in 0..t {
                    let (row, p) = (term * m + i, params[term * m + i]);
                    let acc: i64 = (0..k)
                        .map(|c| {
                            (q[row * k + c] as i64 - p.zero_point as i64) * values[j * k + c] as i64
                        })
                        .sum();
                    *o += acc as f64 * p.scale as f64 * scales[j] as f64;
                }
            }
            *o += bias.map_or(0.0, |b| b[j] as f64);
            *o = activate_f64(*o, activation);
        }
    }
    Ok(y)
}

/// The epilogue's activation in f64 (the references').
fn activate_f64(v: f64, activation: Activation) -> f64 {
    match activation {
        Activation::None => v,
        Activation::Relu => v.max(0.0),
        Activation::GeluTanh => UnaryOp::GeluTanh.apply_f64(v),
        Activation::GeluErf => UnaryOp::GeluErf.apply_f64(v),
    }
}

#[cfg(test)]
mod tests;
