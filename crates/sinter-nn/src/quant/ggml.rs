//! `GgmlLinear`: a Linear whose weight stays in a GGML block format (Q8_0, Q4_0, Q4_1, Q4_K,
//! Q6_K, as a GGUF file stores it), run by `sinter_cpu::ggml_quant::dot`'s kernels with the
//! activations quantized per block. It is installed in the Linear's [`QuantSlot`] like the
//! int8 forms (one quantized-layer type: [`Int8Layer`]), so the layer's forward and the
//! host step run it without knowing which format it holds.
//!
//! [`QuantSlot`]: super::QuantSlot

use std::any::Any;
use std::sync::Arc;

use sinter_core::{bail, DType, Device, Result, Tensor};
use sinter_cpu::ggml_quant::QuantMatrix;
use sinter_cpu::int8::Activation;
use sinter_cpu::math::bias_act::bias_act_rows;
use sinter_cpu::Isa;

use super::host::{cpu_input, host_vec};
use super::slot::Int8Layer;

#[derive(Clone)]
pub struct GgmlLinear {
    weight: Arc<QuantMatrix>,
    bias: Option<Vec<f32>>,
}

impl GgmlLinear {
    /// A Linear with quantized weight [out, in] and an optional f32 bias [out].
    pub fn new(weight: QuantMatrix, bias: Option<&Tensor>) -> Result<GgmlLinear> {
        let bias = match bias {
            Some(b) if b.shape() != [weight.n()] => bail!(
                "GgmlLinear: bias {:?} does not fit {} outputs",
                b.shape(),
                weight.n()
            ),
            Some(b) => Some(host_vec(b)?),
            None => None,
        };
        Ok(GgmlLinear {
            weight: Arc::new(weight),
            bias,
        })
    }

    pub fn weight(&self) -> &QuantMatrix {
        &self.weight
    }

    /// y [rows, out] = act(x Wᵀ + b) for x [rows, in] row-major.
    pub fn apply(&self, x: &[f32], rows: usize, act: Activation, y: &mut [f32]) -> Result<()> {
        let failed = |e| sinter_core::Error::Msg(format!("GgmlLinear: {e}"));
        self.weight.matmul(x, rows, y).map_err(failed)?;
        if self.bias.is_some() || act != Activation::None {
            let zeros;
            let bias = match &self.bias {
                Some(b) => b.as_slice(),
                None => {
                    zeros = vec![0f32; self.weight.n()];
                    &zeros
                }
            };
            let pre = y.to_vec();
            bias_act_rows(Isa::get(), &pre, bias, act, y);
        }
        Ok(())
    }
}

impl Int8Layer for GgmlLinear {
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let (k, n) = (self.weight.k(), self.weight.n());
        if x.rank() == 0 || x.shape().last() != Some(&k) {
            bail!(
                "GgmlLinear: expected inputs with last dimension {k}, got shape {:?}",
                x.shape()
            );
        }
        let xs = cpu_input(x, "GgmlLinear")?;
        let rows = xs.len() / k.max(1);
        let mut y = vec![0f32; rows * n];
        self.apply(&xs, rows, activation, &mut y)?;
        let mut shape = x.shape().to_vec();
        *shape.last_mut().expect("rank ≥ 1") = n;
        Tensor::from_vec(y, &shape, Device::Cpu)
    }

    /// The rows of ids (i64, any shape) dequantized: a token table kept quantized (its
    /// `forward` is then the tied head).
    fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        let (rows, k) = (self.weight.n(), self.weight.k());
        if ids.dtype() != DType::I64 {
            bail!("GgmlLinear: lookup ids must be i64, got {}", ids.dtype());
        }
        let ids_v = ids.to_vec_i64()?;
        let mut out = vec![0f32; ids_v.len() * k];
        for (&id, o) in ids_v.iter().zip(out.chunks_exact_mut(k)) {
            if id < 0 || id as usize >= rows {
                bail!("GgmlLinear: token id {id} is outside the table's {rows} rows");
            }
            self.weight
                .dequantize_row(id as usize, o)
                .map_err(|e| sinter_core::Error::Msg(format!("GgmlLinear: {e}")))?;
        }
        let mut shape = ids.shape().to_vec();
        shape.push(k);
        Tensor::from_vec(out, &shape, Device::Cpu)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
