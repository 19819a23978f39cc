//! Where adapters go: Hugging Face's (and PEFT's) per-projection module names mapped onto the
//! decoder block's packed layers, adapters installed on the matching ones, and the rest of
//! the model frozen.

use std::ops::Range;

use sinter_core::{bail, Result, Rng};

use super::adapter::{LoraAdapter, LoraConfig, Segment};
use crate::layers::Linear;
use crate::module::{Module, SharedRng, TensorKind};
use crate::transformer::TransformerBlock;

/// PEFT's default targets for Llama-family models.
pub const DEFAULT_TARGETS: &str = "q_proj|v_proj";

/// One projection of a block as Hugging Face names it, and where it lives here.
pub struct Projection<'a> {
    /// `self_attn.q_proj`, …, `mlp.down_proj`.
    pub name: &'static str,
    pub layer: &'a Linear,
    /// Its rows in `layer`'s output (a packed layer holds several projections).
    pub rows: Range<usize>,
}

impl Projection<'_> {
    /// `q_proj`: PEFT's short name (an adapter's segment name and a `target_modules` entry).
    pub fn short(&self) -> &'static str {
        self.name.rsplit('.').next().unwrap_or(self.name)
    }
}

/// The projections of a block: q/k/v are thirds of the packed `attn.qkv` ([q; k; v] rows),
/// gate/up the halves of a gated MLP's `mlp.fc` ([gate; up]).
pub fn projections(block: &TransformerBlock) -> Vec<Projection<'_>> {
    let a = &block.attn;
    let (q, kv) = (a.n_head * a.head_dim, a.n_kv_head * a.head_dim);
    let rows = |l: &Linear| 0..l.weight.shape()[0];
    let mut v = vec![
        Projection {
            name: "self_attn.q_proj",
            layer: &a.qkv,
            rows: 0..q,
        },
        Projection {
            name: "self_attn.k_proj",
            layer: &a.qkv,
            rows: q..q + kv,
        },
        Projection {
            name: "self_attn.v_proj",
            layer: &a.qkv,
            rows: q + kv..q + 2 * kv,
        },
        Projection {
            name: "self_attn.o_proj",
            layer: &a.proj,
            rows: rows(&a.proj),
        },
    ];
    let fc = &block.mlp.fc;
    if block.mlp.kind.gated() {
        let h = fc.weight.shape()[0] / 2;
        v.push(Projection {
            name: "mlp.gate_proj",
            layer: fc,
            rows: 0..h,
        });
        v.push(Projection {
            name: "mlp.up_proj",
            layer: fc,
            rows: h..2 * h,
        });
    } else {
        v.push(Projection {
            name: "mlp.up_proj",
            layer: fc,
            rows: rows(fc),
        });
    }
    v.push(Projection {
        name: "mlp.down_proj",
        layer: &block.mlp.proj,
        rows: rows(&block.mlp.proj),
    });
    v
}

/// The Hugging Face module name of block `i`'s projection (`model.layers.3.self_attn.q_proj`).
pub fn module_name(i: usize, p: &Projection) -> String {
    format!("model.layers.{i}.{}", p.name)
}

/// Installs fresh adapters (`cfg`) on every projection of `blocks` whose Hugging Face module
/// name `wanted` accepts, drawing A from `rng` in block then projection order. Returns the
/// short names adapted (PEFT's `target_modules`); none matching is an error.
pub fn install(
    blocks: &[&TransformerBlock],
    wanted: &dyn Fn(&str) -> bool,
    cfg: &LoraConfig,
    rng: &mut Rng,
    drop_rng: &SharedRng,
) -> Result<Vec<String>> {
    cfg.check()?;
    let mut short: Vec<String> = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        // Segments grouped by the layer they sit on, in projection order.
        let mut per_layer: Vec<(&Linear, Vec<Segment>)> = Vec::new();
        for p in projections(b) {
            if !wanted(&module_name(i, &p)) {
                continue;
            }
            if !short.iter().any(|s| s == p.short()) {
                short.push(p.short().into());
            }
            let seg = Segment::init(
                p.short(),
                p.rows.clone(),
                p.layer.in_features(),
                cfg.rank,
                rng,
            )?;
            match per_layer
                .iter_mut()
                .find(|(l, _)| std::ptr::eq(*l, p.layer))
            {
                Some((_, segs)) => segs.push(seg),
                None => per_layer.push((p.layer, vec![seg])),
            }
        }
        for (layer, segs) in per_layer {
            attach(layer, segs, cfg, drop_rng)?;
        }
    }
    if short.is_empty() {
        bail!("LoRA: no projection matches the targets (the names are Hugging Face's: model.layers.N.self_attn.q_proj, k_proj, v_proj, o_proj, mlp.gate_proj, up_proj, down_proj)");
    }
    Ok(short)
}

/// Puts `segments` on `layer` (replacing an adapter already there).
pub fn attach(
    layer: &Linear,
    segments: Vec<Segment>,
    cfg: &LoraConfig,
    drop_rng: &SharedRng,
) -> Result<()> {
    if layer.lora.get().is_some() {
        bail!("LoRA: a layer already carries an adapter; install adapters once");
    }
    let adapter = LoraAdapter::new(segments, cfg.scale(), cfg.dropout, drop_rng.clone())?;
    layer.lora.set(Some(adapter));
    Ok(())
}

/// Whether a tensor name is an adapter factor (`….lora.<projection>.A` / `.B`).
pub fn is_adapter_name(name: &str) -> bool {
    name.split('.').any(|p| p == "lora")
}

/// Freezes every parameter of `model` but the adapters' (`Tensor::freeze`): the base then
/// keeps no gradients, is not in the optimizer, and lists as [`TensorKind::Frozen`].
/// Returns how many tensors were frozen.
pub fn freeze_base(model: &dyn Module) -> usize {
    let mut n = 0;
    for t in model.named_tensors() {
        if t.kind == TensorKind::Parameter && !is_adapter_name(&t.name) {
            t.tensor.freeze();
            n += 1;
        }
    }
    n
}
