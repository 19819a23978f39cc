//! A LoRA adapter on one `Linear` (Hu et al., 2021; PEFT's `LoraLayer`): the base weight W
//! stays frozen and the layer computes `base(x) + scale · (drop(x) Aᵀ) Bᵀ` with A [r, in]
//! (Kaiming-uniform) and B [out, r] (zeros, so a fresh adapter changes nothing), scale = α/r.
//!
//! A packed layer (attention's [q; k; v] rows, SwiGLU's [gate; up]) carries one adapter per
//! named row segment, each with its own A and B, exactly as PEFT holds them on the separate
//! projections: the segments' A stack into one [n·r, in] GEMM, and their B are laid into one
//! block matrix [out, n·r] (zero outside each segment's rows and columns), so the whole delta
//! is two GEMMs in ordinary tensor ops and runs with autograd on every backend.
//!
//! This file depends on nothing else in the crate but the module helpers, so `Linear` can
//! hold a [`LoraSlot`] without an import circle.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use sinter_core::{bail, DType, Result, Rng, Tensor};

use crate::module::{join, param, NamedTensor, SharedRng};

/// Rank, scale and dropout of the adapters of one run (PEFT's `LoraConfig`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraConfig {
    pub rank: usize,
    pub alpha: f64,
    /// Dropout probability on the adapter's input while training.
    pub dropout: f32,
}

impl LoraConfig {
    /// α / r, the factor on the adapter's product.
    pub fn scale(&self) -> f32 {
        (self.alpha / self.rank as f64) as f32
    }
    pub fn check(&self) -> Result<()> {
        if self.rank == 0 {
            bail!("LoRA: the rank must be at least 1");
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            bail!("LoRA: alpha must be a positive number, got {}", self.alpha);
        }
        if !(0.0..1.0).contains(&self.dropout) {
            bail!("LoRA: dropout must be in [0, 1), got {}", self.dropout);
        }
        Ok(())
    }
}

/// One adapted projection: rows `rows` of the layer's output, named as PEFT names the
/// projection (`q_proj`, `o_proj`, …).
#[derive(Clone, Debug)]
pub struct Segment {
    pub name: String,
    pub rows: Range<usize>,
    /// [r, in]
    pub a: Tensor,
    /// [rows.len(), r]
    pub b: Tensor,
}

impl Segment {
    /// A fresh adapter as PEFT initialises one: A Kaiming-uniform (a = √5: U(±1/√in)), B zero.
    pub fn init(
        name: &str,
        rows: Range<usize>,
        inp: usize,
        rank: usize,
        rng: &mut Rng,
    ) -> Result<Self> {
        let bound = 1.0 / (inp as f64).sqrt();
        let a = Tensor::rand_uniform(
            &[rank, inp],
            -bound,
            bound,
            rng,
            DType::F32,
            sinter_core::Device::Cpu,
        )?
        .to_var()?;
        let b =
            Tensor::zeros(&[rows.len(), rank], DType::F32, sinter_core::Device::Cpu)?.to_var()?;
        Segment::new(name, rows, a, b)
    }
    /// A segment from given factors (an imported adapter), checked against each other.
    pub fn new(name: &str, rows: Range<usize>, a: Tensor, b: Tensor) -> Result<Self> {
        if a.rank() != 2
            || b.rank() != 2
            || b.shape()[1] != a.shape()[0]
            || b.shape()[0] != rows.len()
        {
            bail!(
                "LoRA {name}: lora_A {:?} and lora_B {:?} do not make a [{}, r]·[r, in] pair (expected lora_B with {} rows and as many columns as lora_A has rows)",
                a.shape(),
                b.shape(),
                rows.len(),
                rows.len()
            );
        }
        Ok(Segment {
            name: name.into(),
            rows,
            a,
            b,
        })
    }
    pub fn rank(&self) -> usize {
        self.a.shape()[0]
    }
}

/// The adapters of one layer.
pub struct LoraAdapter {
    pub segments: Vec<Segment>,
    pub scale: f32,
    pub dropout: f32,
    rng: SharedRng,
    training: AtomicBool,
}

impl LoraAdapter {
    pub fn new(segments: Vec<Segment>, scale: f32, dropout: f32, rng: SharedRng) -> Result<Self> {
        for (i, s) in segments.iter().enumerate() {
            if segments[..i]
                .iter()
                .any(|o| o.rows.start < s.rows.end && s.rows.start < o.rows.end)
            {
                bail!(
                    "LoRA: segment {} overlaps another segment of its layer",
                    s.name
                );
            }
            if s.a.shape()[1] != segments[0].a.shape()[1] {
                bail!(
                    "LoRA: segment {} reads {} inputs, {} reads {}",
                    s.name,
                    s.a.shape()[1],
                    segments[0].name,
                    segments[0].a.shape()[1]
                );
            }
        }
        if segments.is_empty() {
            bail!("LoRA: an adapter needs at least one segment");
        }
        Ok(LoraAdapter {
            segments,
            scale,
            dropout,
            rng,
            training: AtomicBool::new(true),
        })
    }

    /// B of every segment as one [out, Σr] matrix: segment i's B in its rows and its columns,
    /// zeros elsewhere (built from the trainable B's, so their gradients flow back).
    fn b_blocks(&self, out: usize) -> Result<Tensor> {
        let seg0 = &self.segments[0];
        if self.segments.len() == 1 && seg0.rows == (0..out) {
            return Ok(seg0.b.clone());
        }
        let mut cols = Vec::with_capacity(self.segments.len());
        for s in &self.segments {
            let (r, dt, dev) = (s.rank(), s.b.dtype(), s.b.device());
            let mut parts = Vec::with_capacity(3);
            if s.rows.start > 0 {
                parts.push(Tensor::zeros(&[s.rows.start, r], dt, dev)?);
            }
            parts.push(s.b.clone());
            if s.rows.end < out {
                parts.push(Tensor::zeros(&[out - s.rows.end, r], dt, dev)?);
            }
            cols.push(Tensor::cat(&parts, 0)?);
        }
        Tensor::cat(&cols, 1)
    }

    fn a_stacked(&self) -> Result<Tensor> {
        if self.segments.len() == 1 {
            return Ok(self.segments[0].a.clone());
        }
        Tensor::cat(
            &self
                .segments
                .iter()
                .map(|s| s.a.clone())
                .collect::<Vec<_>>(),
            0,
        )
    }

    /// scale · (drop(x) Aᵀ) Bᵀ over the layer's `out` rows, in x's dtype.
    pub fn delta(&self, x: &Tensor, out: usize) -> Result<Tensor> {
        if let Some(s) = self.segments.iter().find(|s| s.rows.end > out) {
            bail!(
                "LoRA {}: rows {:?} lie outside the layer's {out} outputs",
                s.name,
                s.rows
            );
        }
        let xd = if self.training.load(Ordering::Relaxed) && self.dropout > 0.0 {
            let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
            x.dropout(self.dropout, &mut rng)?
        } else {
            x.clone()
        };
        let a = self.a_stacked()?.to_dtype(x.dtype())?;
        let b = self.b_blocks(out)?.to_dtype(x.dtype())?;
        let h = sinter_core::fused::linear(&xd, &a, None)?;
        sinter_core::fused::linear(&h, &b, None)?.mul_scalar(self.scale)
    }

    /// W + scale · B A over each segment's rows: the base weight with the adapter folded in
    /// (`sinter merge`). Not recorded for autograd.
    pub fn merged(&self, w: &Tensor) -> Result<Tensor> {
        let _g = sinter_core::no_grad();
        let out = w.shape()[0];
        let a = self.a_stacked()?;
        let b = self.b_blocks(out)?;
        let d = b.matmul(&a)?.mul_scalar(self.scale)?;
        w.to_dtype(DType::F32)?.add(&d)?.to_dtype(w.dtype())
    }

    pub fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }

    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        for s in &self.segments {
            let p = join(prefix, &format!("lora.{}", s.name));
            param(&p, "A", &s.a, out);
            param(&p, "B", &s.b, out);
        }
    }
}

/// The adapter a `Linear` adds to its output, if one is installed; shared by the layer and
/// whoever installs it (through the model's fields, so no rebuild is needed).
#[derive(Clone, Default)]
pub struct LoraSlot(Arc<RwLock<Option<Arc<LoraAdapter>>>>);

impl LoraSlot {
    pub fn get(&self) -> Option<Arc<LoraAdapter>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
    pub fn set(&self, adapter: Option<LoraAdapter>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = adapter.map(Arc::new);
    }
    /// y + the adapter's delta for input x (y unchanged without one).
    pub fn apply(&self, x: &Tensor, y: Tensor) -> Result<Tensor> {
        match self.get() {
            Some(a) => {
                let out = *y.shape().last().unwrap_or(&0);
                y.add(&a.delta(x, out)?)
            }
            None => Ok(y),
        }
    }
    pub fn set_training(&self, training: bool) {
        if let Some(a) = self.get() {
            a.set_training(training);
        }
    }
    /// The adapter's factors, `prefix.lora.<projection>.A` / `.B`.
    pub fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        if let Some(a) = self.get() {
            a.collect(prefix, out);
        }
    }
}

impl std::fmt::Debug for LoraSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.get() {
            Some(a) => write!(f, "LoraSlot({} segments)", a.segments.len()),
            None => write!(f, "LoraSlot(none)"),
        }
    }
}
