//! A layer's int8 weight: symmetric per-output-channel quantization of an f32 weight whose
//! first dimension is the output channel (Linear [out, in], Conv2d [out, in, kh, kw],
//! Embedding [rows, dim]), packed once for the kernels; a table or Linear weight may carry a
//! second plane with the first's rounding error ([`ResidualPlane`]).

use std::sync::{Arc, Mutex};

use sinter_core::kernels::qmatmul::QWeight;
use sinter_core::{bail, Device, Result, Tensor};
use sinter_cpu::int8::{quantize_weights, PackedWeights};

use super::gptq::{quantize_weights_gptq, Gram};
use super::host::{check_scales, int8_err};
use super::residual::ResidualPlane;

/// w[j, …] ≈ scales[j] · q[j, …], q ∈ [-127, 127].
pub struct Int8Weight {
    pub(crate) packed: Arc<PackedWeights>,
    pub(crate) scales: Arc<[f32]>,
    /// The f32 weight's shape (the file keeps it).
    pub(crate) shape: Vec<usize>,
    /// w ≈ s₁·q₁ + s₂·q₂ with this second plane (tables and Linears, never a Conv2d).
    pub(crate) residual: Option<ResidualPlane>,
    /// The weight as the qmatmul kernel takes it, by device and planes, made on first use.
    forms: Mutex<Vec<(Device, usize, QWeight)>>,
}

impl Int8Weight {
    /// Quantizes an f32 weight (on the CPU).
    pub fn from_f32(w: &Tensor) -> Result<Int8Weight> {
        let (n, k) = rows_cols(w.shape())?;
        let (q, scales) = quantize_weights(&host_weight(w)?, n, k).map_err(int8_err)?;
        Int8Weight::from_int8(&q, w.shape(), scales)
    }

    /// Quantizes an f32 weight (on the CPU) with GPTQ's error feedback from the Gram matrix of
    /// the layer's calibration inputs (`gptq`): the scales of [`Int8Weight::from_f32`], the
    /// values chosen to minimise the output error on those inputs.
    pub fn from_f32_with_feedback(w: &Tensor, gram: &Gram) -> Result<Int8Weight> {
        let (n, k) = rows_cols(w.shape())?;
        if gram.k != k {
            bail!(
                "calibration inputs have {} values per row; the weight {:?} takes {k}",
                gram.k,
                w.shape()
            );
        }
        let values = host_weight(w)?;
        // Round to nearest first: it checks the values (NaN, infinities) and names the row.
        quantize_weights(&values, n, k).map_err(int8_err)?;
        let (q, scales) = quantize_weights_gptq(&values, n, k, &gram.inverse_factor());
        Int8Weight::from_int8(&q, w.shape(), scales)
    }

    /// From int8 values and per-channel scales (a quantized checkpoint).
    pub fn from_int8(q: &[i8], shape: &[usize], scales: Vec<f32>) -> Result<Int8Weight> {
        let (n, k) = rows_cols(shape)?;
        if scales.len() != n {
            bail!("{} weight scales for {n} output channels", scales.len());
        }
        if let Err(e) = check_scales(q, k, &scales) {
            bail!("weight {e}");
        }
        let packed = PackedWeights::pack(q, n, k).map_err(int8_err)?;
        Ok(Int8Weight {
            packed: Arc::new(packed),
            scales: scales.into(),
            shape: shape.to_vec(),
            residual: None,
            forms: Mutex::default(),
        })
    }

    /// This weight with a second plane carrying what the first leaves of the f32 weight `w`
    /// (the one it was quantized from).
    pub fn with_residual_of(self, w: &Tensor) -> Result<Int8Weight> {
        if w.shape() != self.shape.as_slice() {
            bail!(
                "second int8 plane: f32 weight {:?} for an int8 weight {:?}",
                w.shape(),
                self.shape
            );
        }
        let plane =
            ResidualPlane::from_error(&host_weight(w)?, &self.values(), &self.scales, self.k())?;
        Ok(self.with_residual(plane))
    }

    /// This weight with a second plane read from a checkpoint ([n, k] values, n scales).
    pub fn with_residual_int8(self, values: Vec<i8>, scales: Vec<f32>) -> Result<Int8Weight> {
        let plane = ResidualPlane::from_int8(values, scales, &self.values(), &self.scales)?;
        Ok(self.with_residual(plane))
    }

    fn with_residual(mut self, plane: ResidualPlane) -> Int8Weight {
        self.residual = Some(plane);
        self.forms = Mutex::default();
        self
    }

    /// The weight as the qmatmul kernel takes it on `device`, with its first plane or both
    /// (`planes` 2 needs a second plane). The CPU's form shares the packed values; another
    /// device's is uploaded on first use and kept (a quantized layer follows its input's device,
    /// as the f32 parameters follow `move_module`).
    pub fn qweight(&self, device: Device, planes: usize) -> Result<QWeight> {
        let mut forms = self.forms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, w)) = forms.iter().find(|(d, p, _)| (*d, *p) == (device, planes)) {
            return Ok(w.clone());
        }
        let mut w = QWeight::int8_cpu(self.packed.clone(), self.scales.clone())?;
        match (planes, &self.residual) {
            (1, _) => {}
            (2, Some(r)) => w = w.with_second_plane(r.qweight()?)?,
            _ => bail!(
                "int8 weight {:?}: no plane set of {planes} (it has {})",
                self.shape,
                1 + self.residual.is_some() as usize
            ),
        }
        let w = w.to_device(device)?;
        forms.push((device, planes, w.clone()));
        Ok(w)
    }

    /// The second plane, if the weight has one.
    pub fn residual(&self) -> Option<&ResidualPlane> {
        self.residual.as_ref()
    }

    /// Output channels and inputs per channel.
    pub fn n(&self) -> usize {
        self.packed.n()
    }
    pub fn k(&self) -> usize {
        self.packed.k()
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }
    /// The int8 values, row-major in the weight's shape.
    pub fn values(&self) -> Vec<i8> {
        self.packed.unpack()
    }
    /// Channel j dequantized into `out` (k values; both planes when there are two).
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        self.dequantize_row_in(j, &mut vec![0i8; self.k()], out);
    }
    /// `dequantize_row` with `q` (k values) as scratch for each plane's int8 row.
    fn dequantize_row_in(&self, j: usize, q: &mut [i8], out: &mut [f32]) {
        self.packed.row_into(j, q);
        let s = self.scales[j];
        for (o, &v) in out.iter_mut().zip(q.iter()) {
            *o = s * v as f32;
        }
        if let Some(r) = &self.residual {
            r.add_row(j, q, out);
        }
    }
    /// The whole weight dequantized, as a CPU tensor of the weight's shape.
    pub fn dequantized(&self) -> Result<Tensor> {
        let k = self.k();
        let (mut w, mut q) = (vec![0f32; self.n() * k], vec![0i8; k]);
        for (j, row) in w.chunks_exact_mut(k.max(1)).enumerate().take(self.n()) {
            self.dequantize_row_in(j, &mut q, row);
        }
        Tensor::from_vec(w, &self.shape, Device::Cpu)
    }
    /// Bytes the weight takes in a checkpoint: one per value and four per channel scale, for
    /// each plane (in memory the packed copy also pads k to a multiple of 4 and n to one of 16).
    pub fn bytes(&self) -> usize {
        self.n() * self.k()
            + 4 * self.scales.len()
            + self.residual.as_ref().map_or(0, |r| r.bytes())
    }
}

fn host_weight(w: &Tensor) -> Result<Vec<f32>> {
    if w.device() != Device::Cpu {
        bail!(
            "int8 quantization reads weights on the CPU; this one is on {}",
            w.device()
        );
    }
    w.to_vec_f32()
}

fn rows_cols(shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [n, rest @ ..] if !rest.is_empty() => Ok((*n, rest.iter().product())),
        _ => bail!("an int8 weight needs [out, in, …] (at least two dimensions), got {shape:?}"),
    }
}
