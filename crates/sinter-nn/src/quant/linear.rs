//! `QuantizedLinear`: y = act(x Wᵀ + b) with int8 weights (symmetric, per output channel) and
//! activations quantized per row at run time (dynamic quantization: each token or example gets
//! its own u8 range, so no calibration is needed — the Transformer case). A call of a few rows
//! (a generation step) against a weight too large to stay in cache quantizes each row in two
//! u8 terms, the second carrying the first's rounding error, at little cost
//! (`sinter_cpu::int8::ActTerms::Auto`). Also serves an int8
//! embedding table: its rows are the output channels of a tied head, and lookups dequantize
//! the rows they read.

use std::any::Any;
use std::sync::{Arc, Mutex};

use sinter_core::kernels::qmatmul::qmatmul;
use sinter_core::{bail, DType, Device, Result, Tensor};
use sinter_cpu::int8::{ActTerms, Activation};

use super::host::{cpu_input, host_vec};
use super::slot::Int8Layer;
use super::weight::Int8Weight;
use crate::module::{param, Module, NamedTensor};

#[derive(Clone)]
pub struct QuantizedLinear {
    /// Shared by the copies that differ only in `act_terms`.
    weight: Arc<Int8Weight>,
    bias: Option<Vec<f32>>,
    /// The f32 bias as given (listed by `collect`, like Linear's).
    bias_tensor: Option<Tensor>,
    /// u8 terms per activation row (`ActTerms::Auto` unless set otherwise).
    act_terms: ActTerms,
    /// An embedding table (lookups; as a head, a second plane rescores the top outputs).
    table: bool,
    /// The bias as an f32 tensor per device it has run on.
    bias_forms: Arc<Mutex<Vec<Tensor>>>,
}

impl QuantizedLinear {
    /// Quantizes a Linear's f32 weight [out, in] and keeps its bias in f32.
    pub fn from_f32(weight: &Tensor, bias: Option<&Tensor>) -> Result<QuantizedLinear> {
        QuantizedLinear::new(Int8Weight::from_f32(weight)?, bias)
    }

    pub fn new(weight: Int8Weight, bias: Option<&Tensor>) -> Result<QuantizedLinear> {
        if weight.shape().len() != 2 {
            bail!(
                "QuantizedLinear: weight must be [out, in], got {:?}",
                weight.shape()
            );
        }
        let bias_values = match bias {
            Some(b) => {
                if b.shape() != [weight.n()] {
                    bail!(
                        "QuantizedLinear: bias {:?} does not fit {} outputs",
                        b.shape(),
                        weight.n()
                    );
                }
                Some(host_vec(b)?)
            }
            None => None,
        };
        Ok(QuantizedLinear {
            weight: Arc::new(weight),
            bias: bias_values,
            bias_tensor: bias.cloned(),
            act_terms: ActTerms::default(),
            table: false,
            bias_forms: Arc::default(),
        })
    }

    /// An int8 embedding table [rows, dim] (also a tied head: `forward` gives x·Wᵀ).
    pub fn table(weight: Int8Weight) -> Result<QuantizedLinear> {
        let mut t = QuantizedLinear::new(weight, None)?;
        t.table = true;
        Ok(t)
    }

    /// The same layer with each activation row quantized in `terms` u8 terms.
    pub fn with_act_terms(mut self, terms: ActTerms) -> QuantizedLinear {
        self.act_terms = terms;
        self
    }
    pub fn act_terms(&self) -> ActTerms {
        self.act_terms
    }

    pub fn weight(&self) -> &Int8Weight {
        &self.weight
    }
    pub fn in_features(&self) -> usize {
        self.weight.k()
    }
    pub fn out_features(&self) -> usize {
        self.weight.n()
    }

    /// activation(x Wᵀ + b) over the last dimension of `x` (a float tensor on any device with
    /// a qmatmul kernel, no gradient): the qmatmul kernel with the weight on x's device. A
    /// table's second plane rescores the head's top outputs on the CPU; on another device both
    /// planes go through the GEMM (every output ~16 bits precise, not only the top ones).
    pub fn forward_with(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let w = &*self.weight;
        let dev = x.device();
        let rescore = w.residual().filter(|_| self.table && dev == Device::Cpu);
        if self.table && w.residual().is_some() && activation != Activation::None {
            bail!("QuantizedLinear: an int8 table's head takes no activation");
        }
        let planes = if w.residual().is_some() && rescore.is_none() {
            2
        } else {
            1
        };
        let qw = w.qweight(dev, planes)?;
        let bias = self.bias_on(dev)?;
        let out = qmatmul(x, &qw, bias.as_ref(), activation, self.act_terms)
            .map_err(|e| sinter_core::Error::Msg(format!("QuantizedLinear: {e}")))?;
        if let Some(plane) = rescore {
            let k = self.in_features().max(1);
            let n = self.out_features().max(1);
            let xs = cpu_input(x, "QuantizedLinear")?;
            let Some(mut y) = out.y.host_f32_mut() else {
                bail!("QuantizedLinear: qmatmul's CPU output is not a contiguous f32 tensor");
            };
            for (xr, yr) in xs.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
                plane.rescore_row(
                    &w.packed,
                    &w.scales,
                    self.bias.as_deref(),
                    xr,
                    out.terms,
                    yr,
                )?;
            }
        }
        Ok(out.y)
    }

    /// The bias as an f32 tensor on `device` (made there once).
    fn bias_on(&self, device: Device) -> Result<Option<Tensor>> {
        let Some(b) = &self.bias else {
            return Ok(None);
        };
        let mut forms = self.bias_forms.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = forms.iter().find(|t| t.device() == device) {
            return Ok(Some(t.clone()));
        }
        let t = Tensor::from_vec(b.clone(), &[b.len()], Device::Cpu)?.to_device(device)?;
        forms.push(t.clone());
        Ok(Some(t))
    }
}

impl Int8Layer for QuantizedLinear {
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        self.forward_with(x, activation)
    }
    /// Rows of the [rows, dim] table for i64 ids, dequantized.
    fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.dtype() != DType::I64 {
            bail!("int8 embedding: ids must be i64, got {}", ids.dtype());
        }
        let (rows, dim) = (self.out_features(), self.in_features());
        let ids_v = ids.to_vec_i64()?;
        let mut out = vec![0f32; ids_v.len() * dim];
        for (pos, (&id, row)) in ids_v
            .iter()
            .zip(out.chunks_exact_mut(dim.max(1)))
            .enumerate()
        {
            if id < 0 || id as usize >= rows {
                bail!(
                    "int8 embedding: id {id} at position {pos} is outside the table of {rows} rows"
                );
            }
            self.weight.dequantize_row(id as usize, row);
        }
        let mut shape = ids.shape().to_vec();
        shape.push(dim);
        // Rows gathered on the host (the table's CPU form), then moved to the ids' device.
        Tensor::from_vec(out, &shape, Device::Cpu)?.to_device(ids.device())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Module for QuantizedLinear {
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
