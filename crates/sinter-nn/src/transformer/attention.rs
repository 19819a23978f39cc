//! Self-attention, configured: causal (decoders) or bidirectional with an optional padding
//! mask (encoders: BERT), optionally limited to a sliding window of recent keys (Mistral),
//! multi-head, grouped-query or multi-query (n_kv_head ≤ n_head), optional qkv bias, optional
//! per-head RMSNorm of queries and keys (Qwen3), and rotary or no positions (learned positions
//! are added outside: GPT-2, BERT).
//!
//! q, k and v come from one packed projection [q (h·d) | k (kv·d) | v (kv·d)], one GEMM.
//! `forward` takes the fast path: flash attention (`sinter_core::fused`, never building the
//! t×t matrix) reading the packed projection in place, after one rotation pass over it where
//! positions are rotary (everywhere for GPT-2's heads; for rotary or grouped heads where those
//! kernels run: f32 on the CPU, every float dtype on CUDA). `forward_composite` is the unfused
//! reference (explicit masked softmax). `forward_step` runs against a KV cache (generation),
//! which keeps the kv heads unshared: a grouped model caches n_head / n_kv_head times less.

use sinter_core::{bail, fused, DType, Device, Result, Rng, Tensor};

use super::config::BlockConfig;
use super::norm::RmsNorm;
use super::rope::Rope;
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
    /// Each position attends to itself and earlier ones only.
    pub causal: bool,
    /// Each query sees only the last `window` positions, itself included.
    pub window: Option<usize>,
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
            causal: cfg.causal,
            window: cfg.sliding_window,
            attn_dropout: Dropout::new(cfg.attention_dropout, drop_rng.clone()),
            resid_dropout: Dropout::new(cfg.dropout, drop_rng.clone()),
        })
    }

    /// Whether flash attention reads the heads from the packed projection in place: always
    /// for GPT-2's heads (no rotation, norm or sharing); with rotary positions or grouped heads
    /// where the packed rotation and grouped kernels run (f32 on the CPU, every float dtype on
    /// CUDA). QK-norm splits the heads.
    fn reads_packed(&self, x: &Tensor) -> bool {
        let gpt2 = self.rope.is_none() && self.n_kv_head == self.n_head;
        self.q_norm.is_none() && (gpt2 || super::fused::applies(x))
    }

    fn scale(&self) -> f32 {
        1.0 / (self.head_dim as f32).sqrt()
    }

    /// Whether the window hides some key from a query when `tk` keys are visible (flash
    /// attention has no window: such calls take the composite).
    fn window_bites(&self, tk: usize) -> bool {
        self.window.is_some_and(|w| w < tk)
    }

    /// True where query row r (position tk − tq + r: queries are the last tq of tk positions)
    /// must not see key c: later keys when causal, keys `window` or more positions back.
    /// None when nothing is hidden. Built on `device` (no host tensor in the step).
    fn key_mask(&self, tq: usize, tk: usize, device: Device) -> Result<Option<Tensor>> {
        let mut mask = if self.causal {
            Some(fused::causal_mask(tq, tk, device)?)
        } else {
            None
        };
        if let Some(w) = self.window.filter(|&w| w < tk) {
            let cols =
                Tensor::arange(0.0, tk as f64, 1.0, DType::I64, device)?.reshape(&[1, tk])?;
            // Key c is too old for the query at position p when c ≤ p − w.
            let last_hidden = (tk - tq) as f64 - w as f64;
            let rows = Tensor::arange(
                last_hidden,
                last_hidden + tq as f64,
                1.0,
                DType::I64,
                device,
            )?
            .reshape(&[tq, 1])?;
            let old = cols.le(&rows)?;
            mask = Some(match mask {
                Some(m) => m.logical_or(&old)?,
                None => old,
            });
        }
        Ok(mask)
    }
}

/// The fill for hidden scores: the most negative finite value, so a row with every key hidden
/// (a fully padded sequence) softmaxes to uniform rather than NaN.
fn hidden_score(dtype: DType) -> f32 {
    if dtype == DType::F32 {
        f32::MIN
    } else {
        -65504.0
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
    /// With `composite`, QK-norm and the rotation in tensor ops (the reference path).
    fn heads(&self, x: &Tensor, start: usize, composite: bool) -> Result<(Tensor, Tensor, Tensor)> {
        let (b, t) = self.check_input(x)?;
        let (h, kv, d) = (self.n_head, self.n_kv_head, self.head_dim);
        let qkv = self.qkv.forward(x)?;
        let part = |from: usize, heads: usize| -> Result<Tensor> {
            qkv.narrow(2, from * d, heads * d)?
                .reshape(&[b, t, heads, d])
        };
        let (mut q, mut k, v) = (part(0, h)?, part(h, kv)?, part(h + kv, kv)?);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            // The fused kernel (its TP discrepancy under AdamW was AdamW's amplification of
            // rounding-level gradients, not the kernel: tests/llama_parallel.rs).
            if composite {
                q = qn.forward_composite(&q)?;
                k = kn.forward_composite(&k)?;
            } else {
                q = qn.forward(&q)?;
                k = kn.forward(&k)?;
            }
        }
        let (mut q, mut k, v) = (q.transpose(1, 2)?, k.transpose(1, 2)?, v.transpose(1, 2)?);
        if let Some(rope) = &self.rope {
            q = rope.apply_with(&q, start, composite)?;
            k = rope.apply_with(&k, start, composite)?;
        }
        Ok((q, k, v))
    }

    /// [b, h, t, d] heads back to [b, t, h·d], then the output projection and its dropout.
    fn merge_and_project(&self, y: &Tensor) -> Result<Tensor> {
        let (b, h, t, d) = (y.shape()[0], y.shape()[1], y.shape()[2], y.shape()[3]);
        let y = y.transpose(1, 2)?.reshape(&[b, t, h * d])?;
        self.resid_dropout.forward(&self.proj.forward(&y)?)
    }

    /// Flash attention: the t×t scores are never materialised. Dropout on the attention
    /// probabilities is not supported here (`forward` falls back to the composite when it is
    /// configured), nor a window shorter than the sequence (the composite runs).
    pub fn forward_fused(&self, x: &Tensor) -> Result<Tensor> {
        let (_, t) = self.check_input(x)?;
        if self.window_bites(t) {
            return self.forward_composite(x);
        }
        if self.reads_packed(x) {
            let (h, kv) = (self.n_head, self.n_kv_head);
            let mut qkv = self.qkv.forward(x)?;
            if let Some(rope) = &self.rope {
                qkv = rope.apply_packed(&qkv, 0, h + kv)?;
            }
            let y = fused::attention_packed_gqa(&qkv, h, kv, self.causal, self.scale())?;
            return self.resid_dropout.forward(&self.proj.forward(&y)?);
        }
        let (q, k, v) = self.heads(x, 0, false)?;
        let g = self.n_head / self.n_kv_head;
        let y = fused::attention(
            &q,
            &repeat_kv(&k, g)?,
            &repeat_kv(&v, g)?,
            self.causal,
            self.scale(),
        )?;
        self.merge_and_project(&y)
    }

    /// The unfused reference: explicit [t, t] scores, masked softmax, dropout, product.
    pub fn forward_composite(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_masked(x, None)
    }

    /// The composite with `pad` [b, 1, 1, t] (non-zero at keys no query may see: padding),
    /// on top of the causal and window masks.
    pub fn forward_masked(&self, x: &Tensor, pad: Option<&Tensor>) -> Result<Tensor> {
        let (q, k, v) = self.heads(x, 0, true)?;
        let t = q.shape()[2];
        let y = self.attend_composite(&q, &k, &v, t, pad)?;
        self.merge_and_project(&y)
    }

    /// Explicit scores of q [b, h, tq, d] against k, v [b, kv, tk, d], masked, softmaxed,
    /// dropped out, times v.
    fn attend_composite(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        tk: usize,
        pad: Option<&Tensor>,
    ) -> Result<Tensor> {
        let g = self.n_head / self.n_kv_head;
        let (k, v) = (repeat_kv(k, g)?, repeat_kv(v, g)?);
        let mut scores = q.matmul(&k.t()?)?.mul_scalar(self.scale())?; // [b, h, tq, tk]
        let fill = hidden_score(scores.dtype());
        if let Some(mask) = self.key_mask(q.shape()[2], tk, scores.device())? {
            scores = scores.masked_fill(&mask, fill)?;
        }
        if let Some(pad) = pad {
            scores = scores.masked_fill(pad, fill)?;
        }
        let att = self.attn_dropout.forward(&scores.softmax(-1)?)?;
        att.matmul(&v)
    }

    /// Attention for `x` [b, s, c] at positions cache.len..cache.len + s: appends this
    /// step's keys and values to `cache` and attends over everything cached (causally).
    /// Equal to rows cache.len.. of a full forward over all positions. Inference only: no
    /// attention dropout.
    pub fn forward_step(&self, x: &Tensor, cache: &mut LayerKvCache) -> Result<Tensor> {
        if !self.causal {
            bail!("attention: a bidirectional (encoder) layer has no KV-cache step");
        }
        let (start, s) = (cache.len, x.shape().get(1).copied().unwrap_or(0));
        let end = start + s;
        if end > cache.capacity() {
            bail!(
                "attention: KV cache holds {} positions, {end} needed",
                cache.capacity()
            );
        }
        let (q, k, v) = self.heads(x, start, false)?;
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
        if self.window_bites(end) {
            let (ks, vs) = (cache.k.narrow(2, 0, end)?, cache.v.narrow(2, 0, end)?);
            let y = self.attend_composite(&q, &ks, &vs, end, None)?;
            return self.merge_and_project(&y);
        }
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
        self.qkv.set_training(training);
        self.proj.set_training(training);
        self.attn_dropout.set_training(training);
        self.resid_dropout.set_training(training);
    }
}
