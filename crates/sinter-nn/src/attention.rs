//! Causal multi-head self-attention and the pre-norm Transformer block (GPT-2's layout).

use sinter_core::{bail, DType, Device, Result, Rng, Tensor};

use crate::init;
use crate::layers::{Dropout, LayerNorm, Linear};
use crate::module::{join, Module, NamedTensor, SharedRng};

/// Weights of a projection that feeds the residual stream get std 0.02/√(2·layers) (GPT-2).
fn gpt_linear(inp: usize, out: usize, std: f64, rng: &mut Rng) -> Result<Linear> {
    Ok(Linear::from_weights(init::normal(&[out, inp], std, rng)?, Some(init::zeros(&[out])?)))
}

pub struct CausalSelfAttention {
    pub qkv: Linear,
    pub proj: Linear,
    pub n_head: usize,
    pub attn_dropout: Dropout,
    pub resid_dropout: Dropout,
}

impl CausalSelfAttention {
    pub fn new(width: usize, n_head: usize, n_layer: usize, dropout: f32, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        if n_head == 0 || width % n_head != 0 {
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

/// 1 above the diagonal of a [t, t] matrix: the positions a token may not attend to.
pub fn causal_mask(t: usize, dtype: DType) -> Result<Tensor> {
    let v: Vec<f32> = (0..t * t).map(|i| ((i % t) > (i / t)) as u8 as f32).collect();
    Tensor::from_vec(v, &[t, t], Device::Cpu)?.to_dtype(dtype)
}

impl Module for CausalSelfAttention {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            bail!("attention: expected [batch, time, width], got {:?}", x.shape());
        }
        let (b, t, c) = (x.shape()[0], x.shape()[1], x.shape()[2]);
        let hd = c / self.n_head;
        let qkv = self.qkv.forward(x)?; // [b, t, 3c]
        let heads = |i: usize| -> Result<Tensor> {
            qkv.narrow(2, i * c, c)?.reshape(&[b, t, self.n_head, hd])?.transpose(1, 2) // [b, h, t, hd]
        };
        let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
        let scores = q.matmul(&k.t()?)?.mul_scalar(1.0 / (hd as f32).sqrt())?; // [b, h, t, t]
        let mask = causal_mask(t, scores.dtype())?;
        let att = scores.masked_fill(&mask, f32::NEG_INFINITY)?.softmax(-1)?;
        let att = self.attn_dropout.forward(&att)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape(&[b, t, c])?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
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

impl Module for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.dropout.forward(&self.proj.forward(&self.fc.forward(x)?.gelu()?)?)
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
    pub fn new(width: usize, n_head: usize, n_layer: usize, dropout: f32, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        let resid_std = 0.02 / (2.0 * n_layer as f64).sqrt();
        Ok(TransformerBlock {
            ln1: LayerNorm::new(width)?,
            attn: CausalSelfAttention::new(width, n_head, n_layer, dropout, rng, drop_rng)?,
            ln2: LayerNorm::new(width)?,
            mlp: Mlp { fc: gpt_linear(width, 4 * width, 0.02, rng)?, proj: gpt_linear(4 * width, width, resid_std, rng)?, dropout: Dropout::new(dropout, drop_rng.clone()) },
        })
    }
}

impl Module for TransformerBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let x = x.add(&self.attn.forward(&self.ln1.forward(x)?)?)?;
        x.add(&self.mlp.forward(&self.ln2.forward(&x)?)?)
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
