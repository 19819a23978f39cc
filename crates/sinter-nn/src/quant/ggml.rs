//! `GgmlLinear`: a Linear whose weight stays in a GGML block format (Q8_0, Q4_0, Q4_1, Q4_K,
//! Q6_K, as a GGUF file stores it). Its forward and lookups are the seam's qmatmul op with a
//! GGML weight (`sinter_core::kernels::qmatmul`, [`QWeight::ggml`]) on the input's device:
//! sinter-cpu's dot kernels on the CPU, dequantize-and-GEMM on CUDA, the weight uploaded on
//! first use. The CPU decode step reads the blocks directly ([`GgmlLinear::apply`]). It is
//! installed in the Linear's [`QuantSlot`] like the int8 forms (one quantized-layer type:
//! [`Int8Layer`]), so the layer's forward and the host step run it without knowing which
//! format it holds.
//!
//! [`QuantSlot`]: super::QuantSlot

use std::any::Any;
use std::sync::{Arc, Mutex};

use sinter_core::kernels::qmatmul::{qmatmul, ActTerms, QWeight};
use sinter_core::{bail, Device, Result, Tensor};
use sinter_cpu::ggml_quant::QuantMatrix;
use sinter_cpu::int8::Activation;
use sinter_cpu::math::bias_act::bias_act_rows;
use sinter_cpu::Isa;

use super::host::host_vec;
use super::slot::Int8Layer;

/// The weight and bias on the last device a forward ran on (other than the CPU's).
type DeviceForm = Option<(Device, QWeight, Option<Tensor>)>;

#[derive(Clone)]
pub struct GgmlLinear {
    weight: Arc<QuantMatrix>,
    bias: Option<Vec<f32>>,
    /// The CPU's qmatmul weight and bias (sharing `weight`).
    on_cpu: (QWeight, Option<Tensor>),
    on_device: Arc<Mutex<DeviceForm>>,
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
        let weight = Arc::new(weight);
        let bias_cpu = match &bias {
            Some(b) => Some(Tensor::from_vec(b.clone(), &[b.len()], Device::Cpu)?),
            None => None,
        };
        Ok(GgmlLinear {
            on_cpu: (QWeight::ggml(weight.clone()), bias_cpu),
            weight,
            bias,
            on_device: Arc::new(Mutex::new(None)),
        })
    }

    /// The qmatmul weight and bias on `device` (uploaded on the first call there).
    fn on(&self, device: Device) -> Result<(QWeight, Option<Tensor>)> {
        if device == Device::Cpu {
            return Ok(self.on_cpu.clone());
        }
        let mut slot = self.on_device.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((d, w, b)) = slot.as_ref() {
            if *d == device {
                return Ok((w.clone(), b.clone()));
            }
        }
        let w = self.on_cpu.0.to_device(device)?;
        let b = match &self.on_cpu.1 {
            Some(b) => Some(b.to_device(device)?),
            None => None,
        };
        *slot = Some((device, w.clone(), b.clone()));
        Ok((w, b))
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
        let (w, b) = self.on(x.device())?;
        let out = qmatmul(x, &w, b.as_ref(), activation, ActTerms::One)
            .map_err(|e| sinter_core::Error::Msg(format!("GgmlLinear: {e}")))?;
        Ok(out.y)
    }

    /// The rows of ids (i64, any shape) dequantized: a token table kept quantized (its
    /// `forward` is then the tied head).
    fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        let (w, _) = self.on(ids.device())?;
        w.lookup(ids)
            .map_err(|e| sinter_core::Error::Msg(format!("GgmlLinear: {e}")))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
