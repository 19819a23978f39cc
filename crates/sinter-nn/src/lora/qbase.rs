//! QLoRA's frozen base: a projection kept int8 (per output channel, `quant::Int8Weight`) that
//! still passes gradients to its input. The forward is the int8 GEMM; the backward gives
//! dX = dY · W with W dequantized a tile of rows at a time (never the whole f32 matrix at
//! once), and no dW: the base is frozen. Installed in a `Linear`'s quant slot, so the
//! layer's LoRA adapter adds its product on top as usual.

use std::any::Any;
use std::sync::Arc;

use sinter_core::{bail, no_grad, with_custom_backward, Device, Result, Tensor};

use crate::quant::slot::{Activation, Int8Layer};
use crate::quant::{Int8Weight, QuantizedLinear};

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
    let (n, k) = (w.n(), w.k());
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
            w.dequantize_row(j0 + j, row);
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
