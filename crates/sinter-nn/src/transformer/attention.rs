//! Causal self-attention, configured: multi-head, grouped-query or multi-query (n_kv_head ≤
//! n_head), optional qkv bias, optional per-head RMSNorm of queries and keys (Qwen3), and
//! rotary or no positions (learned positions are added outside, GPT-2).
//!
//! q, k and v come from one packed projection [q (h·d) | k (kv·d) | v (kv·d)], one GEMM.
//! `forward` takes the fast path: flash attention (`sinter_core::fused`, never building the
//! t×t matrix); when the heads need no rotation, norm or key sharing (GPT-2) it reads the
//! packed projection in place. `forward_composite` is the unfused reference (explicit masked
//! softmax). `forward_step` runs against a KV cache (generation), which keeps the kv heads
//! unshared: a grouped model caches n_head / n_kv_head times less.

use sinter_core::{bail, fused, DType, Device, Result, Rng, Tensor};

use super::norm::RmsNorm;
use super::rope::Rope;
use super::BlockConfig;
use crate::init;
use crate::layers::{Dropout, Linear};
use crate::module::{join, Module, NamedTensor, SharedRng};

/// A [out, inp] projection with N(0, std) weights and, if asked, a zero bias (GPT-2's init).
pub(super) fn init_linear(
    inp: usize,
    out: usize,
    std: f64,
    bias: bool,
    rng: &mut Rng,
) -> Result<Linear> {
    let b = if bias {
        Some(init::zeros(&[out])?)
    } else {
        None
    };
    Ok(Linear::from_weights(
        init::normal(&[out, inp], std, rng)?,
        b,
    ))
}

pub struct CausalSelfAttention {
    pub qkv: Linear,
    pub proj: Linear,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub q_norm: Option<RmsNorm>,
    pub k_norm: Option<RmsNorm>,
    pub rope: Option<Rope>,
    pub attn_dropout: Dropout,
    pub resid_dropout: Dropout,
}

impl CausalSelfAttention {
    pub fn new(cfg: &BlockConfig, rng: &mut Rng, drop_rng: &SharedRng) -> Result<Self> {
        cfg.check()?;
        let (q, kv) = (cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim);
        let qkv = init_linear(cfg.width, q + 2 * kv, 0.02, cfg.qkv_bias, rng)?;
        let proj = init_linear(q, cfg.width, cfg.resid_std(), cfg.out_bias, rng)?;
        Self::from_parts(cfg, qkv, proj, None, drop_rng)
    }

    /// The layer from its projections and (QK-norm models) the norms' weights.
    pub fn from_parts(
        cfg: &BlockConfig,
        qkv: Linear,
        proj: Linear,
        qk_norm: Option<(Tensor, Tensor)>,
        drop_rng: &SharedRng,
    ) -> Result<Self> {
        cfg.check()?;
        let (q_norm, k_norm) = match (cfg.qk_norm, qk_norm) {
            (false, None) => (None, None),
            (false, Some(_)) => {
                bail!("attention: q/k norm weights given to a model without QK-norm")
            }
            (true, None) => (
                Some(RmsNorm::new(cfg.head_dim, cfg.norm_eps)?),
                Some(RmsNorm::new(cfg.head_dim, cfg.norm_eps)?),
            ),
            (true, Some((q, k))) => (
                Some(RmsNorm {
                    weight: q,
                    eps: cfg.norm_eps,
                }),
                Some(RmsNorm {
                    weight: k,
                    eps: cfg.norm_eps,
                }),
            ),
        };
        let rope = match &cfg.rope {
            Some(r) => Some(Rope::new(r.clone(), cfg.head_dim)?),
            None => None,
        };
        Ok(CausalSelfAttention {
            qkv,
            proj,
            n_head: cfg.n_head,
            n_kv_head: cfg.n_kv_head,
            head_dim: cfg.head_dim,
            q_norm,
            k_norm,
            rope,
            attn_dropout: Dropout::new(cfg.dropout, drop_rng.clone()),
            resid_dropout: Dropout::new(cfg.dropout, drop_rng.clone()),
        })
    }

    /// GPT-2's case: the packed projection's thirds are the heads as they are, so flash
    /// attention reads them in place.
    fn packed_mha(&self) -> bool {
        self.rope.is_none() && self.q_norm.is_none() && self.n_kv_head == self.n_head
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }
}

/// The keys and values of one attention layer for the positions seen so far:
/// k and v are [batch, kv_heads, capacity, head_dim] buffers of which the first `len`
/// positions are filled (keys already rotated).
pub struct LayerKvCache {
    pub k: Tensor,
    pub v: Tensor,
    pub len: usize,
}

impl LayerKvCache {
    pub fn new(
        batch: usize,
        n_kv_head: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: Device,
    ) -> Result<Self> {
        let shape = [batch, n_kv_head, capacity, head_dim];
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

/// [b, kv, t, d] → [b, kv·g, t, d]: each kv head serves g consecutive query heads.
fn repeat_kv(x: &Tensor, groups: usize) -> Result<Tensor> {
    if groups == 1 {
        return Ok(x.clone());
    }
    let s = x.shape().to_vec();
    x.unsqueeze(2)?
        .broadcast_as(&[s[0], s[1], groups, s[2], s[3]])?
        .contiguous()?
        .reshape(&[s[0], s[1] * groups, s[2], s[3]])
}

impl CausalSelfAttention {
    fn check_input(&self, x: &Tensor) -> Result<(usize, usize)> {
        let w = self.qkv.in_features();
        if x.rank() != 3 || x.shape()[2] != w {
            bail!(
                "attention: expected [batch, time, {w}], got {:?}",
                x.shape()
            );
        }
        Ok((x.shape()[0], x.shape()[1]))
    }

    /// q [b, h, t, d], k and v [b, kv, t, d] for positions start..start + t: views of the
    /// packed projection, then QK-norm and rotation where configured.
    fn heads(&self, x: &Tensor, start: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t) = self.check_input(x)?;
        let (h, kv, d) = (self.n_head, self.n_kv_head, self.head_dim);
        let qkv = self.qkv.forward(x)?;
        let part = |from: usize, heads: usize| -> Result<Tensor> {
            qkv.narrow(2, from * d, heads * d)?
                .reshape(&[b, t, heads, d])
        };
        let (mut q, mut k, v) = (part(0, h)?, part(h, kv)?, part(h + kv, kv)?);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            q = qn.forward(&q)?;
            k = kn.forward(&k)?;
        }
        let (mut q, mut k, v) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
        if let Some(rope) = &self.rope {
            q = rope.apply(&q, start)?;
            k = rope.apply(&k, start)?;
        }
        Ok((q, k, v))
    }

    /// [b, h, t, d] heads back to [b, t, h·d], then the output projection and its dropout.
    fn merge_and_project(&self, y: &Tensor) -> Result<Tensor> {
        let (b, h, t, d) = (y.shape()[0], y.shape()[1], y.shape()[2], y.shape()[3]);
        let y = y.transpose(1, 2)?.reshape(&[b, t, h * d])?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
    }

    /// Flash attention (causal): the t×t scores are never materialised. Dropout on the
    /// attention probabilities is not supported here (`forward` falls back to the composite
    /// when it is configured).
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        self.check_input(x)?;
        if self.packed_mha() {
            let qkv = self.qkv.forward(x)?;
            let y = fused::attention_packed(&qkv, self.n_head, true, self.scale())?;
            return self.resid_dropout.forward(&self.proj.forward(&y)?);
        }
        let (q, k, v) = self.heads(x, 0)?;
        let g = self.n_head / self.n_kv_head;
        let y = fused::attention(
            &q,
            &repeat_kv(&k, g)?,
            &repeat_kv(&v, g)?,
            true,
            self.scale(),
        )?;
        self.merge_and_project(&y)
    }

    /// The unfused reference: explicit [t, t] scores, masked softmax, dropout, product.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        let (q, k, v) = self.heads(x, 0)?;
        let g = self.n_head / self.n_kv_head;
        let (k, v) = (repeat_kv(&k, g)?, repeat_kv(&v, g)?);
        let t = q.shape()[2];
        let scores = q.matmul(&k.t()?)?.mul_scalar(self.scale())?; // [b, h, t, t]
                                                                   // 1 above the diagonal: the positions a token may not attend to, built on the
                                                                   // scores' device (no host tensor in the step).
        let mask = fused::causal_mask(t, t, scores.device())?;
        let att = scores.masked_fill(&mask, f32::NEG_INFINITY)?.softmax(-1)?;
        let att = self.attn_dropout.forward(&att)?;
        self.merge_and_project(&att.matmul(&v)?)
    }

    /// Attention for `x` [b, s, c] at positions cache.len..cache.len + s: appends this
    /// step's keys and values to `cache` and attends over everything cached (causally).
    /// Equal to rows cache.len.. of a full forward over all positions. Inference only: no
    /// attention dropout.
    pub fn forward_step(&self, x: &Tensor, cache: &mut LayerKvCache) -> Result<Tensor> {
        let (start, s) = (cache.len, x.shape().get(1).copied().unwrap_or(0));
        let end = start + s;
        if end > cache.capacity() {
            bail!(
                "attention: KV cache holds {} positions, {end} needed",
                cache.capacity()
            );
        }
        let (q, k, v) = self.heads(x, start)?;
        if cache.k.shape()[..2] != k.shape()[..2] || cache.k.shape()[3] != self.head_dim {
            bail!(
                "attention: KV cache {:?} does not fit heads {:?}",
                cache.k.shape(),
                k.shape()
            );
        }
        cache.k.narrow(2, start, s)?.assign(&k)?;
        cache.v.narrow(2, start, s)?.assign(&v)?;
        cache.len = end;
        let g = self.n_head / self.n_kv_head;
        let ks = repeat_kv(&cache.k.narrow(2, 0, end)?, g)?;
        let vs = repeat_kv(&cache.v.narrow(2, 0, end)?, g)?;
        let y = fused::attention(&q, &ks, &vs, true, self.scale())?;
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
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            qn.collect(&join(prefix, "q_norm"), out);
            kn.collect(&join(prefix, "k_norm"), out);
        }
        self.proj.collect(&join(prefix, "proj"), out);
    }
    fn set_training(&self, training: bool) {
        self.attn_dropout.set_training(training);
        self.resid_dropout.set_training(training);
    }
}
