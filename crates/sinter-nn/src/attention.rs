//! Causal multi-head self-attention and the pre-norm Transformer block (GPT-2's layout).
//!
//! `forward` takes the fast path: flash attention (`sinter_core::fused::attention`, never
//! building the t×t matrix), residual add + LayerNorm fused, and bias + GELU fused. The
//! unfused composite (masked softmax over explicit scores) stays available as
//! `forward_composite` on each module, for tests and as the reference. `forward_step` runs
//! the attention against a KV cache (generation).

use sinter_core::{bail, fused, DType, Device, Result, Rng, Tensor};

use crate::init;
use crate::layers::{Dropout, LayerNorm, Linear};
use crate::module::{join, Module, NamedTensor, SharedRng};

/// Weights of a projection that feeds the residual stream get std 0.02/√(2·layers) (GPT-2).
fn gpt_linear(inp: usize, out: usize, std: f64, rng: &mut Rng) -> Result<Linear> {
    Ok(Linear::from_weights(
        init::normal(&[out, inp], std, rng)?,
        Some(init::zeros(&[out])?),
    ))
}

pub struct CausalSelfAttention {
    pub qkv: Linear,
    pub proj: Linear,
    pub n_head: usize,
    pub attn_dropout: Dropout,
    pub resid_dropout: Dropout,
}

impl CausalSelfAttention {
    pub fn new(
        width: usize,
        n_head: usize,
        n_layer: usize,
        dropout: f32,
        rng: &mut Rng,
        drop_rng: &SharedRng,
    ) -> Result<Self> {
        if n_head == 0 || !width.is_multiple_of(n_head) {
            bail!("attention: width {width} does not split into {n_head} heads");
        }
        let resid_std = 0.02 / (2.0 * n_layer as f64).sqrt();
        Ok(CausalSelfAttention {
            qkv: gpt_linear(width, 3 * width, 0.02, rng)?,
            proj: gpt_linear(width, width, resid_std, rng)?,
            n_head,
            attn_dropout: Dropout::new(dropout, drop_rng.clone()),
            resid_dropout: Dropout::new(dropout, drop_rng.clone()),
        })
    }
}

/// The keys and values of one attention layer for the positions seen so far:
/// k and v are [batch, heads, capacity, head_dim] buffers of which the first `len`
/// positions are filled.
pub struct LayerKvCache {
    pub k: Tensor,
    pub v: Tensor,
    pub len: usize,
}

impl LayerKvCache {
    pub fn new(
        batch: usize,
        n_head: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: Device,
    ) -> Result<Self> {
        let shape = [batch, n_head, capacity, head_dim];
        Ok(LayerKvCache {
            k: Tensor::zeros(&shape, dtype, device)?,
            v: Tensor::zeros(&shape, dtype, device)?,
            len: 0,
        })
    }
    pub fn capacity(&self) -> usize {
        self.k.shape()[2]
    }
}

impl CausalSelfAttention {
    fn check_input(&self, x: &Tensor) -> Result<(usize, usize, usize, usize)> {
        if x.rank() != 3 {
            bail!(
                "attention: expected [batch, time, width], got {:?}",
                x.shape()
            );
        }
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        if c % self.n_head != 0 {
            bail!(
                "attention: width {c} does not split into {} heads",
                self.n_head
            );
        }
        Ok((b, t, c, c / self.n_head))
    }

    /// q, k, v as [b, h, t, hd] views of one qkv projection (no copies: the projection is
    /// viewed as [b, t, 3, h, hd] and each third selected, so the head dimension stays
    /// contiguous and flash attention reads it in place).
    fn qkv_heads(&self, x: &Tensor) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t, _, hd) = self.check_input(x)?;
        let qkv = self.qkv.forward(x)?.reshape(&[b, t, 3, self.n_head, hd])?;
        let head =
            |i: usize| -> Result<Tensor> { qkv.narrow(2, i, 1)?.squeeze(2)?.transpose(1, 2) };
        Ok((head(0)?, head(1)?, head(2)?))
    }

    /// [b, h, t, hd] heads back to [b, t, c], then the output projection and its dropout.
    fn merge_and_project(&self, y: &Tensor) -> Result<Tensor> {
        let (b, h, t, hd) = (y.shape()[0], y.shape()[1], y.shape()[2], y.shape()[3]);
        let y = y.transpose(1, 2)?.reshape(&[b, t, h * hd])?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
    }

    /// Flash attention (causal) straight from the packed qkv projection: the t×t scores are
    /// never materialised and the heads are split and merged in place. Dropout on the
    /// attention probabilities is not supported here (`forward` falls back to the composite
    /// when it is configured).
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let (_, _, _, hd) = self.check_input(x)?;
        let qkv = self.qkv.forward(x)?;
        let y = fused::attention_packed(&qkv, self.n_head, true, 1.0 / (hd as f32).sqrt())?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
    }

    /// The unfused reference: explicit [t, t] scores, masked softmax, dropout, product.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let (b, t, c, hd) = self.check_input(x)?;
        let qkv = self.qkv.forward(x)?; // [b, t, 3c]
        let heads = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * c, c)?
                .reshape(&[b, t, self.n_head, hd])?
                .transpose(1, 2) // [b, h, t, hd]
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (hd as f32).sqrt())?; // [b, h, t, t]
                                                                               // 1 above the diagonal: the positions a token may not attend to, built on the scores'
                                                                               // device (no host tensor in the step).
        let mask = fused::causal_mask(t, t, scores.device())?;
        let att = scores.masked_fill(&mask, f32::NEG_INFINITY)?.softmax(-1)?;
        let att = self.attn_dropout.forward(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape(&[b, t, c])?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
    }

    /// Attention for `x` [b, s, c] at positions cache.len..cache.len + s: appends this
    /// step's keys and values to `cache` and attends over everything cached (causally).
    /// Equal to rows cache.len.. of a full forward over all positions. Inference only: no
    /// attention dropout.
    pub fn forward_step(&self, x: &Tensor, cache: &mut LayerKvCache) -> Result<Tensor> {
        let (q, k, v) = self.qkv_heads(x)?;
        let (s, hd) = (q.shape()[2], q.shape()[3]);
        let (start, end) = (cache.len, cache.len + s);
        if end > cache.capacity() {
            bail!(
                "attention: KV cache holds {} positions, {end} needed",
                cache.capacity()
            );
        }
        if cache.k.shape()[..2] != q.shape()[..2] || cache.k.shape()[3] != hd {
            bail!(
                "attention: KV cache {:?} does not fit heads {:?}",
                cache.k.shape(),
                q.shape()
            );
        }
        cache.k.narrow(2, start, s)?.assign(&k)?;
        cache.v.narrow(2, start, s)?.assign(&v)?;
        cache.len = end;
        let (ks, vs) = (cache.k.narrow(2, 0, end)?, cache.v.narrow(2, 0, end)?);
        let y = fused::attention(&q, &ks, &vs, true, 1.0 / (hd as f32).sqrt())?;
        self.merge_and_project(&y)
    }
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if self.attn_dropout.p > 0.0 {
            self.forward_composite(x)
        } else {
            self.forward_fused(x)
        }
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.qkv.collect(&join(prefix, "qkv"), out);
        self.proj.collect(&join(prefix, "proj"), out);
    }
    fn set_training(&self, training: bool) {
        self.attn_dropout.set_training(training);
        self.resid_dropout.set_training(training);
    }
}

pub struct Mlp {
    pub fc: Linear,
    pub proj: Linear,
    pub dropout: Dropout,
}

impl Mlp {
    /// fc, bias and GELU fused (one GEMM with a GELU epilogue on CUDA at f16/bf16; the matmul
    /// then the fused bias + GELU elsewhere), then the projection.
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.fc.forward_gelu(x)?;
        self.dropout.forward(&self.proj.forward(&h)?)
    }
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout
            .forward(&self.proj.forward(&self.fc.forward(x)?.gelu()?)?)
    }
}

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.fc.collect(&join(prefix, "fc"), out);
        self.proj.collect(&join(prefix, "proj"), out);
    }
    fn set_training(&self, training: bool) {
        self.dropout.set_training(training);
    }
}

/// x + attn(ln1(x)), then + mlp(ln2(x)).
pub struct TransformerBlock {
    pub ln1: LayerNorm,
    pub attn: CausalSelfAttention,
    pub ln2: LayerNorm,
    pub mlp: Mlp,
}

impl TransformerBlock {
    pub fn new(
        width: usize,
        n_head: usize,
        n_layer: usize,
        dropout: f32,
        rng: &mut Rng,
        drop_rng: &SharedRng,
    ) -> Result<Self> {
        let resid_std = 0.02 / (2.0 * n_layer as f64).sqrt();
        Ok(TransformerBlock {
            ln1: LayerNorm::new(width)?,
            attn: CausalSelfAttention::new(width, n_head, n_layer, dropout, rng, drop_rng)?,
            ln2: LayerNorm::new(width)?,
            mlp: Mlp {
                fc: gpt_linear(width, 4 * width, 0.02, rng)?,
                proj: gpt_linear(4 * width, width, resid_std, rng)?,
                dropout: Dropout::new(dropout, drop_rng.clone()),
            },
        })
    }
}

impl TransformerBlock {
    /// The second half of the block given its input `x` and the attention sub-layer's output
    /// `a` = attn(ln1(x)): (x + a, LN2(x + a)) in one fused pass, then + mlp.
    pub fn forward_after_attn(&self, x: &Tensor, a: &Tensor) -> Result<Tensor> {
        let (x1, h) =
            fused::residual_layer_norm(x, a, &self.ln2.weight, &self.ln2.bias, self.ln2.eps)?;
        x1.add(&self.mlp.forward_fused(&h)?)
    }
    /// The fast path (also `forward`): flash attention, fused residual + LN2, fused bias + GELU.
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let a = self.attn.forward(&self.ln1.forward(x)?)?;
        self.forward_after_attn(x, &a)
    }
    /// The unfused reference.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward_composite(&self.ln1.forward(x)?)?)?;
        x.add(&self.mlp.forward_composite(&self.ln2.forward(&x)?)?)
    }
    /// The block for `x` [b, s, c] at positions cache.len.. of a sequence whose earlier keys
    /// and values are in `cache` (which this appends to). Inference only.
    pub fn forward_step(&self, x: &Tensor, cache: &mut LayerKvCache) -> Result<Tensor> {
        let a = self.attn.forward_step(&self.ln1.forward(x)?, cache)?;
        self.forward_after_attn(x, &a)
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_fused(x)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.ln1.collect(&join(prefix, "ln1"), out);
        self.attn.collect(&join(prefix, "attn"), out);
        self.ln2.collect(&join(prefix, "ln2"), out);
        self.mlp.collect(&join(prefix, "mlp"), out);
    }
    fn set_training(&self, training: bool) {
        self.attn.set_training(training);
        self.mlp.set_training(training);
    }
}
