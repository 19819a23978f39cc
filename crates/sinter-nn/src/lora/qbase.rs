//! QLoRA's frozen base: a projection kept quantized that still passes gradients to its
//! input. Two forms: int8 per output channel (`FrozenInt8`, `quant::Int8Weight`) and GGML
//! blocks (`FrozenGgml`: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K — a GGUF file's own blocks, or f32
//! weights quantized at load). The forward is the quantized GEMM; the backward gives
//! dX = dY · W with W dequantized a tile of rows at a time (never the whole f32 matrix at
//! once), and no dW: the base is frozen. Installed in a `Linear`'s (or a tied table's) quant
//! slot, so the layer's LoRA adapter adds its product on top as usual.

use std::any::Any;
use std::sync::Arc;

use sinter_core::{bail, no_grad, with_custom_backward, Device, Result, Tensor};

use sinter_cpu::ggml_quant::{quantize, GgmlType, QuantMatrix};

use crate::quant::slot::{Activation, Int8Layer};
use crate::quant::{GgmlLinear, Int8Weight, QuantSlot, QuantState, QuantizedLinear};

/// Output rows of W dequantized per backward tile.
const TILE: usize = 256;

pub struct FrozenInt8 {
    q: Arc<QuantizedLinear>,
}

impl FrozenInt8 {
    /// The int8 form of a Linear's f32 weight [out, in] (and bias).
    pub fn from_f32(weight: &Tensor, bias: Option<&Tensor>) -> Result<Self> {
        Ok(FrozenInt8 {
            q: Arc::new(QuantizedLinear::from_f32(&weight.detach(), bias)?),
        })
    }
    pub fn weight(&self) -> &Int8Weight {
        self.q.weight()
    }
}

/// dY [.., n] · W [n, k] → [.., k], W dequantized `TILE` rows at a time.
pub fn input_grad(w: &Int8Weight, g: &Tensor) -> Result<Tensor> {
    input_grad_rows(w.n(), w.k(), g, |j, row| {
        w.dequantize_row(j, row);
        Ok(())
    })
}

/// dY [.., n] · W [n, k] → [.., k] for any W that gives its rows dequantized.
fn input_grad_rows(
    n: usize,
    k: usize,
    g: &Tensor,
    dequantize_row: impl Fn(usize, &mut [f32]) -> Result<()>,
) -> Result<Tensor> {
    if g.shape().last() != Some(&n) {
        bail!(
            "QLoRA base: gradient {:?} does not end in the {n} outputs",
            g.shape()
        );
    }
    let rows = g.numel() / n.max(1);
    let g2 = g.reshape(&[rows, n])?;
    let mut dx: Option<Tensor> = None;
    for j0 in (0..n).step_by(TILE) {
        let len = TILE.min(n - j0);
        let mut buf = vec![0f32; len * k];
        for (j, row) in buf.chunks_exact_mut(k).enumerate() {
            dequantize_row(j0 + j, row)?;
        }
        let tile = Tensor::from_vec(buf, &[len, k], Device::Cpu)?;
        let part = g2.narrow(1, j0, len)?.matmul(&tile)?;
        dx = Some(match dx {
            Some(d) => d.add(&part)?,
            None => part,
        });
    }
    let mut shape = g.shape().to_vec();
    *shape.last_mut().expect("rank checked above") = k;
    dx.expect("at least one output").reshape(&shape)
}

impl Int8Layer for FrozenInt8 {
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let y = {
            let _g = no_grad();
            self.q.forward_with(&x.detach(), activation)?
        };
        if !x.tracks_grad() {
            return Ok(y);
        }
        if activation != Activation::None {
            bail!("QLoRA base: a fused activation has no backward here; call the layer's plain forward");
        }
        let q = self.q.clone();
        Ok(with_custom_backward(
            &y,
            "qlora_int8_base",
            &[x],
            move |g, _| Ok(vec![Some(input_grad(q.weight(), g)?)]),
        ))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn frozen_base(&self) -> bool {
        true
    }
}

/// A frozen base kept in GGML blocks: `GgmlLinear`'s kernels forward, dequantized rows
/// backward.
pub struct FrozenGgml {
    q: Arc<GgmlLinear>,
}

impl FrozenGgml {
    pub fn new(q: GgmlLinear) -> FrozenGgml {
        FrozenGgml { q: Arc::new(q) }
    }
    /// A Linear's f32 weight [out, in] (and bias) quantized to `ty`; `in` must be whole
    /// blocks of `ty` (32 values, 256 for the k-quants).
    pub fn from_f32(weight: &Tensor, bias: Option<&Tensor>, ty: GgmlType) -> Result<Self> {
        let (n, k) = match weight.shape() {
            &[n, k] => (n, k),
            s => bail!("QLoRA base: a weight of shape {s:?} is not a matrix"),
        };
        let failed = |e: sinter_cpu::ggml_quant::GgmlError| {
            sinter_core::Error::Msg(format!(
                "QLoRA base: cannot keep a [{n}, {k}] weight as {ty}: {e}"
            ))
        };
        let values = weight.to_dtype(sinter_core::DType::F32)?.to_vec_f32()?;
        let bytes = quantize::quantize(ty, &values, k).map_err(failed)?;
        let m = QuantMatrix::new(ty, n, k, bytes).map_err(failed)?;
        Ok(FrozenGgml::new(GgmlLinear::new(m, bias)?))
    }
    pub fn weight(&self) -> &QuantMatrix {
        self.q.weight()
    }
}

impl Int8Layer for FrozenGgml {
    fn forward(&self, x: &Tensor, activation: Activation) -> Result<Tensor> {
        let y = {
            let _g = no_grad();
            self.q.forward(&x.detach(), activation)?
        };
        if !x.tracks_grad() {
            return Ok(y);
        }
        if activation != Activation::None {
            bail!("QLoRA base: a fused activation has no backward here; call the layer's plain forward");
        }
        let q = self.q.clone();
        Ok(with_custom_backward(
            &y,
            "qlora_ggml_base",
            &[x],
            move |g, _| {
                let w = q.weight();
                let grad = input_grad_rows(w.n(), w.k(), g, |j, row| {
                    w.dequantize_row(j, row)
                        .map_err(|e| sinter_core::Error::Msg(format!("QLoRA base: {e}")))
                })?;
                Ok(vec![Some(grad)])
            },
        ))
    }
    fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        self.q.lookup(ids)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn frozen_base(&self) -> bool {
        true
    }
}

/// Turns a slot holding a `GgmlLinear` (a GGUF file's blocks, loaded for inference) into
/// the frozen base that passes gradients; true if it did.
pub fn freeze_ggml_slot(slot: &QuantSlot) -> bool {
    let Some(layer) = slot.int8() else {
        return false;
    };
    let Some(g) = layer.as_any().downcast_ref::<GgmlLinear>() else {
        return false;
    };
    slot.set(QuantState::Int8(Arc::new(FrozenGgml::new(g.clone()))));
    true
}
