//! Tensor parallelism (Megatron-LM style) for the GPT: GPT-2's block and the Llama family's.
//!
//! Each rank of a tensor-parallel group runs the one [`TransformerBlock`], built with its
//! share of the heads and MLP columns ([`TpBlock`]), and holds a slice of every large matrix:
//!
//! * attention: `qkv` is column-parallel by heads (rank `r` holds the q rows of query heads
//!   `r·h/tp .. (r+1)·h/tp` and the k and v rows of kv heads `r·kv/tp ..`, which are exactly
//!   the kv heads its query heads share under grouped-query attention); rotary positions and
//!   QK-norm act per head, so each rank applies them to its own; `proj` is row-parallel (the
//!   matching input columns);
//! * MLP: `fc` is column-parallel (output rows; SwiGLU's gate and up halves split alike, so a
//!   rank's gate and up columns pair up), `proj` row-parallel (input columns);
//! * the token embedding `wte` and the output head (tied: `wte`; untied: `lm_head`) are
//!   vocabulary-parallel (rank `r` holds rows `r·V/tp .. (r+1)·V/tp`), and the cross-entropy
//!   is computed without ever gathering the full logits ([`vocab_parallel_cross_entropy`]).
//!
//! Norms, position embeddings and the biases of row-parallel layers are replicated; their
//! gradients come out identical on every rank, so replicas never drift apart. (QK-norm's
//! weights are replicated but each rank sees only its heads: the group sums their gradient.)
//!
//! Communication goes through Megatron's two conjugate operators, differentiable through
//! [`with_custom_backward`]: `f` ([`copy_to_tp_region`]: identity forward, all-reduce of the
//! gradient backward) before each column-parallel layer and `g` ([`reduce_from_tp_region`]:
//! all-reduce forward, identity backward) after each row-parallel layer. That is one all-reduce per
//! sub-layer in forward and one in backward.
//!
//! [`TpGpt`] is built by slicing a full [`Decoder`] (or its named weights), and
//! [`TpGpt::gather_weights`] / [`TpGpt::gather_grads`] put the shards back together under the
//! standard names (`blocks.0.attn.qkv.weight`, …), so checkpoints do not depend on the layout.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use sinter_core::{bail, with_custom_backward, DType, Device, Error, Result, Tensor};
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::{join, shared_rng, NamedTensor, TensorKind};
use sinter_nn::{BlockConfig, Embedding, Linear, Module, Norm, NormKind, TransformerBlock};

use crate::comm::{Communicator, ReduceOp};
use crate::error::DistError;

/// The ignore index of the trainer's cross-entropy (PyTorch's default).
pub const IGNORE_INDEX: i64 = -100;

/// A communicator shared with the backward closures of the collectives in the graph.
pub type SharedComm = Arc<Mutex<Box<dyn Communicator>>>;

/// Wraps a communicator so that differentiable collectives can hold it.
pub fn shared_comm(comm: Box<dyn Communicator>) -> SharedComm {
    Arc::new(Mutex::new(comm))
}

pub(crate) fn lock(c: &SharedComm) -> MutexGuard<'_, Box<dyn Communicator>> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// A communication failure as a tensor-layer error (keeps the op/rank/peer message).
pub(crate) fn comm_err(e: DistError) -> Error {
    Error::Msg(e.to_string())
}

/// A fresh f32 variable (own storage) holding `data`.
pub(crate) fn new_var(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(data, shape, Device::Cpu)?.to_var()
}

pub(crate) fn f32_tensor(data: Vec<f32>, shape: &[usize]) -> Result<Tensor> {
    Tensor::from_vec(data, shape, Device::Cpu)
}

// ---------------------------------------------------------------------------------------------
// Parameter layout of the GPT
// ---------------------------------------------------------------------------------------------

/// Names and shapes of the GPT's parameters, in the order `Decoder::parameters()` lists them
/// (`DecoderConfig::param_specs`, the model's own list).
pub fn gpt_param_specs(cfg: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
    cfg.param_specs()
}

/// Names and shapes of block `i`'s parameters, in `TransformerBlock::collect`'s order.
pub(crate) fn block_param_specs(cfg: &DecoderConfig, i: usize) -> Vec<(String, Vec<usize>)> {
    cfg.block_param_specs(i)
}

/// Looks up named weights, checking that every expected name is present with its shape.
pub(crate) struct WeightSource<'a> {
    map: HashMap<&'a str, &'a Tensor>,
}

impl<'a> WeightSource<'a> {
    pub(crate) fn new(cfg: &DecoderConfig, weights: &'a [(String, Tensor)]) -> Result<Self> {
        let map: HashMap<&str, &Tensor> = weights.iter().map(|(n, t)| (n.as_str(), t)).collect();
        for (name, shape) in gpt_param_specs(cfg) {
            match map.get(name.as_str()) {
                None => bail!("GPT weights: {name} is missing"),
                Some(t) if t.shape() != shape.as_slice() => {
                    bail!(
                        "GPT weights: {name} has shape {:?}, the config needs {shape:?}",
                        t.shape()
                    )
                }
                Some(_) => {}
            }
        }
        Ok(WeightSource { map })
    }
    /// The values of `name` (f32, row-major).
    pub(crate) fn data(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>)> {
        let t = self
            .map
            .get(name)
            .ok_or_else(|| Error::Msg(format!("GPT weights: {name} is missing")))?;
        Ok((t.to_dtype(DType::F32)?.to_vec_f32()?, t.shape().to_vec()))
    }
    /// A private copy of `name` as a new variable.
    pub(crate) fn var(&self, name: &str) -> Result<Tensor> {
        let (d, s) = self.data(name)?;
        new_var(d, &s)
    }
    /// Rank `r`'s shard (of `tp`) of `name`, laid out as [`Shard::of`] says, as a new variable.
    pub(crate) fn shard(
        &self,
        cfg: &DecoderConfig,
        name: &str,
        tp: usize,
        r: usize,
    ) -> Result<Tensor> {
        let (full, shape) = self.data(name)?;
        let s = Shard::of(cfg, name);
        new_var(s.slice(&full, &shape, tp, r)?, &s.local_shape(&shape, tp))
    }
}

/// The parameters (name, tensor) of a full model, copied into fresh storage: a snapshot that
/// later in-place optimizer updates of the model do not change.
pub fn snapshot_parameters(model: &dyn Module) -> Result<Vec<(String, Tensor)>> {
    model
        .parameters()
        .into_iter()
        .map(|(n, t)| Ok((n, new_var(t.to_vec_f32()?, t.shape())?)))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Sharding of one tensor
// ---------------------------------------------------------------------------------------------

/// How a parameter is laid out across the tensor-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shard {
    /// Every rank holds the whole tensor (norms, `wpe`, row-parallel biases, QK-norm weights).
    Replicated,
    /// Split along dimension 0 (column-parallel weights and biases, the vocabulary of `wte`
    /// and of an untied `lm_head`).
    Rows,
    /// Split along dimension 1 (row-parallel weights: their input features).
    Cols,
    /// Rows packed from segments of these many rows (q | k | v, or SwiGLU's gate | up; 0:
    /// unused), each split along dimension 0 on its own: a rank holds whole q heads, their
    /// k and v heads (grouped-query: n_kv_head/tp of them), or matching gate and up columns.
    PackedRows([usize; 3]),
}

impl Shard {
    /// The layout of the GPT parameter `name` under tensor parallelism.
    pub fn of(cfg: &DecoderConfig, name: &str) -> Shard {
        let leaf = name
            .rsplit_once("blocks.")
            .map(|(_, r)| r.split_once('.').map_or(r, |(_, l)| l))
            .unwrap_or(name);
        let b = cfg.block_config();
        let (q, kv) = (b.n_head * b.head_dim, b.n_kv_head * b.head_dim);
        match leaf {
            "wte.weight" | "lm_head.weight" => Shard::Rows,
            "attn.qkv.weight" | "attn.qkv.bias" => Shard::PackedRows([q, kv, kv]),
            "attn.proj.weight" | "mlp.proj.weight" => Shard::Cols,
            "mlp.fc.weight" | "mlp.fc.bias" if b.mlp.gated() => {
                Shard::PackedRows([b.mlp_hidden, b.mlp_hidden, 0])
            }
            "mlp.fc.weight" | "mlp.fc.bias" => Shard::Rows,
            _ => Shard::Replicated,
        }
    }

    /// The full tensor (row-major) as consecutive segments, in elements, each of which every
    /// rank holds one `tp`-th of (rank `r` the `r`-th part of each); an error when the shape
    /// does not split.
    fn segments(self, shape: &[usize], tp: usize) -> Result<Vec<usize>> {
        let n: usize = shape.iter().product();
        let bad = || {
            Error::Msg(format!(
                "tensor parallel: shape {shape:?} does not split into {tp} parts ({self:?})"
            ))
        };
        let rows = shape.first().copied().unwrap_or(0);
        let segs = match self {
            // Nothing to split (slice and unslice answer it themselves).
            Shard::Replicated => return Ok(vec![n]),
            Shard::Rows => vec![n],
            Shard::Cols if shape.len() == 2 => vec![shape[1]; shape[0]],
            Shard::Cols => return Err(bad()),
            Shard::PackedRows(parts) => {
                if parts.iter().sum::<usize>() != rows {
                    return Err(bad());
                }
                let width = n.checked_div(rows).unwrap_or(0);
                parts
                    .iter()
                    .filter(|&&p| p > 0)
                    .map(|p| p * width)
                    .collect()
            }
        };
        if segs.iter().any(|s| !s.is_multiple_of(tp))
            || (self == Shard::Rows && !rows.is_multiple_of(tp))
        {
            return Err(bad());
        }
        Ok(segs)
    }

    /// The shape of one rank's shard.
    pub fn local_shape(self, shape: &[usize], tp: usize) -> Vec<usize> {
        let mut s = shape.to_vec();
        match self {
            Shard::Replicated => {}
            Shard::Rows | Shard::PackedRows(_) => s[0] /= tp,
            Shard::Cols => s[1] /= tp,
        }
        s
    }

    /// Rank `r`'s shard of the full values `full` of shape `shape`.
    pub fn slice(self, full: &[f32], shape: &[usize], tp: usize, r: usize) -> Result<Vec<f32>> {
        if self == Shard::Replicated {
            return Ok(full.to_vec());
        }
        let mut out = Vec::with_capacity(full.len() / tp);
        let mut off = 0;
        for len in self.segments(shape, tp)? {
            let part = len / tp;
            out.extend_from_slice(&full[off + r * part..off + (r + 1) * part]);
            off += len;
        }
        Ok(out)
    }

    /// The full values from the rank-major concatenation of all shards (an all-gather).
    pub fn unslice(self, gathered: &[f32], shape: &[usize], tp: usize) -> Result<Vec<f32>> {
        let local = gathered.len() / tp;
        if self == Shard::Replicated {
            return Ok(gathered[..local].to_vec());
        }
        let segs = self.segments(shape, tp)?;
        let mut out = vec![0f32; gathered.len()];
        for r in 0..tp {
            let (mut off, mut loff) = (0, r * local);
            for len in &segs {
                let part = len / tp;
                out[off + r * part..off + (r + 1) * part]
                    .copy_from_slice(&gathered[loff..loff + part]);
                off += len;
                loff += part;
            }
        }
        Ok(out)
    }
}

// ---------------------------------------------------------------------------------------------
// Differentiable collectives
// ---------------------------------------------------------------------------------------------

fn all_reduce_tensor(t: &Tensor, comm: &SharedComm) -> Result<Tensor> {
    let mut v = t.to_vec_f32()?;
    lock(comm)
        .all_reduce(&mut v, ReduceOp::Sum)
        .map_err(comm_err)?;
    f32_tensor(v, t.shape())
}

/// Megatron's `f`: identity in forward, all-reduce (sum) of the gradient in backward. Put it
/// in front of a column-parallel layer whose input is replicated.
pub fn copy_to_tp_region(x: &Tensor, comm: &SharedComm) -> Result<Tensor> {
    if lock(comm).world_size() == 1 {
        return Ok(x.clone());
    }
    let c = comm.clone();
    Ok(with_custom_backward(
        x,
        "tp_copy_to_region",
        &[x],
        move |g, _| Ok(vec![Some(all_reduce_tensor(g, &c)?)]),
    ))
}

/// Megatron's `g`: all-reduce (sum) in forward, identity in backward. Put it after a
/// row-parallel layer to sum the partial products of all ranks.
pub fn reduce_from_tp_region(x: &Tensor, comm: &SharedComm) -> Result<Tensor> {
    if lock(comm).world_size() == 1 {
        return Ok(x.clone());
    }
    let y = all_reduce_tensor(x, comm)?;
    Ok(with_custom_backward(
        &y,
        "tp_reduce_from_region",
        &[x],
        |g, _| Ok(vec![Some(g.clone())]),
    ))
}

/// Looks up `ids` (i64, any shape, values in `0..vocab_size`) in a vocabulary-parallel table:
/// `table` holds rows `vocab_start .. vocab_start + table.rows` of the full table. Ids owned
/// by other ranks give zeros here; an all-reduce sums the parts. Returns `[..ids, dim]`,
/// identical on all ranks.
pub fn vocab_parallel_embedding(
    table: &Tensor,
    vocab_start: usize,
    vocab_size: usize,
    ids: &Tensor,
    comm: &SharedComm,
) -> Result<Tensor> {
    if table.rank() != 2 {
        bail!(
            "vocab_parallel_embedding: table must be [rows, dim], got {:?}",
            table.shape()
        );
    }
    let rows = table.shape()[0];
    let idv = ids.to_vec_i64()?;
    let mut local = Vec::with_capacity(idv.len());
    let mut mask = Vec::with_capacity(idv.len());
    for (i, &id) in idv.iter().enumerate() {
        if id < 0 || id as usize >= vocab_size {
            bail!("vocab_parallel_embedding: id {id} at position {i} is outside 0..{vocab_size}");
        }
        let u = id as usize;
        if (vocab_start..vocab_start + rows).contains(&u) {
            local.push((u - vocab_start) as i64);
            mask.push(1f32);
        } else {
            local.push(0);
            mask.push(0f32);
        }
    }
    let part = table.embedding(&Tensor::from_vec(local, ids.shape(), Device::Cpu)?)?;
    let mut mshape = ids.shape().to_vec();
    mshape.push(1);
    let part = part.mul(&f32_tensor(mask, &mshape)?)?;
    reduce_from_tp_region(&part, comm)
}

/// Mean cross-entropy over rows of vocabulary-parallel logits: `logits` is `[n, V/tp]`,
/// this rank's columns `vocab_start ..`, `targets` `[n]` i64 class indices in `0..vocab_size`
/// (or `ignore_index`). The global row maximum and sum of exponentials come from collectives
/// (an all-gather of `n` maxima, one all-reduce of `2n` values, which also carries the target
/// logit from its owning rank); the backward needs no communication and never forms the full
/// logits. Returns the same scalar on every rank.
pub fn vocab_parallel_cross_entropy(
    logits: &Tensor,
    vocab_start: usize,
    vocab_size: usize,
    targets: &Tensor,
    ignore_index: i64,
    comm: &SharedComm,
) -> Result<Tensor> {
    if logits.rank() != 2 {
        bail!(
            "vocab_parallel_cross_entropy: logits must be [rows, vocab shard], got {:?}",
            logits.shape()
        );
    }
    let (n, vl) = (logits.shape()[0], logits.shape()[1]);
    if targets.dtype() != DType::I64 || targets.shape() != [n] {
        bail!(
            "vocab_parallel_cross_entropy: targets must be i64 [{n}], got {:?} {}",
            targets.shape(),
            targets.dtype()
        );
    }
    let tv = targets.to_vec_i64()?;
    for (i, &t) in tv.iter().enumerate() {
        if t != ignore_index && (t < 0 || t as usize >= vocab_size) {
            bail!("vocab_parallel_cross_entropy: target {t} at position {i} is not a class index in 0..{vocab_size} (nor the ignore index {ignore_index})");
        }
    }
    let lv = logits.to_dtype(DType::F32)?.to_vec_f32()?;
    let row = |r: usize| &lv[r * vl..(r + 1) * vl];
    let local_max: Vec<f32> = (0..n)
        .map(|r| row(r).iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    let tp = lock(comm).world_size();
    let max: Vec<f32> = if tp == 1 {
        local_max
    } else {
        let mut all = vec![0f32; n * tp];
        lock(comm)
            .all_gather(&local_max, &mut all)
            .map_err(comm_err)?;
        (0..n)
            .map(|r| {
                (0..tp)
                    .map(|k| all[k * n + r])
                    .fold(f32::NEG_INFINITY, f32::max)
            })
            .collect()
    };
    // [sum of exp(l - max) over this shard ; target logit if owned here]
    let owned =
        move |t: i64| t != ignore_index && (vocab_start..vocab_start + vl).contains(&(t as usize));
    let mut buf = vec![0f32; 2 * n];
    for r in 0..n {
        buf[r] = row(r).iter().map(|&v| (v - max[r]).exp()).sum();
        if owned(tv[r]) {
            buf[n + r] = row(r)[tv[r] as usize - vocab_start];
        }
    }
    if tp > 1 {
        lock(comm)
            .all_reduce(&mut buf, ReduceOp::Sum)
            .map_err(comm_err)?;
    }
    let lse: Vec<f32> = (0..n).map(|r| max[r] + buf[r].ln()).collect();
    let mut total = 0f64;
    let mut count = 0usize;
    for r in 0..n {
        if tv[r] != ignore_index {
            total += (lse[r] - buf[n + r]) as f64;
            count += 1;
        }
    }
    let loss = if count == 0 {
        0.0
    } else {
        (total / count as f64) as f32
    };
    let dtype = logits.dtype();
    let shape = logits.shape().to_vec();
    Ok(with_custom_backward(
        &Tensor::scalar(loss),
        "vocab_parallel_cross_entropy",
        &[logits],
        move |g, _| {
            let scale = g.to_scalar_f32()? / count.max(1) as f32;
            let mut d = vec![0f32; n * vl];
            for r in 0..n {
                let t = tv[r];
                if t == ignore_index {
                    continue;
                }
                let o = &mut d[r * vl..(r + 1) * vl];
                for (j, x) in o.iter_mut().enumerate() {
                    *x = (lv[r * vl + j] - lse[r]).exp() * scale;
                }
                if owned(t) {
                    o[t as usize - vocab_start] -= scale;
                }
            }
            Ok(vec![Some(f32_tensor(d, &shape)?.to_dtype(dtype)?)])
        },
    ))
}

// ---------------------------------------------------------------------------------------------
// The tensor-parallel GPT
// ---------------------------------------------------------------------------------------------

/// Checks that `cfg` can be split over `tp` ranks: whole query and key/value heads, MLP
/// columns and vocabulary rows per rank, no dropout. Every block shape (GPT-2's and the
/// Llama family's) is sharded.
pub fn check_tp_config(cfg: &DecoderConfig, tp: usize) -> Result<()> {
    if tp == 0 {
        bail!("tensor parallel: the group size must be at least 1");
    }
    cfg.check()?;
    let b = cfg.block_config();
    if !b.n_head.is_multiple_of(tp) {
        bail!("tensor parallel: {} attention heads do not split over {tp} ranks (n_head must be a multiple of tp)", b.n_head);
    }
    if !b.n_kv_head.is_multiple_of(tp) {
        bail!("tensor parallel: {} key/value heads do not split over {tp} ranks (each rank needs whole kv heads: n_kv_head must be a multiple of tp; use a tp that divides {}, or data, ZeRO or pipeline parallel)", b.n_kv_head, b.n_kv_head);
    }
    if !b.mlp_hidden.is_multiple_of(tp) {
        bail!("tensor parallel: the MLP's {} hidden units do not split over {tp} ranks (mlp_hidden must be a multiple of tp)", b.mlp_hidden);
    }
    if !cfg.vocab_size.is_multiple_of(tp) {
        bail!("tensor parallel: vocabulary of {} tokens does not split over {tp} ranks (pad vocab_size to a multiple of tp)", cfg.vocab_size);
    }
    if cfg.dropout != 0.0 {
        bail!("tensor parallel: dropout {} is not supported (replicated dropout needs RNGs synchronised across the group); use dropout 0", cfg.dropout);
    }
    Ok(())
}

/// The configuration of one rank's shard of block `layer`: its share of the query heads,
/// key/value heads and MLP columns; everything else as in the full block.
fn local_block_config(cfg: &DecoderConfig, layer: usize, tp: usize) -> BlockConfig {
    let mut b = cfg.layer_config(layer);
    b.n_head /= tp;
    b.n_kv_head /= tp;
    b.mlp_hidden /= tp;
    b
}

/// One rank's share of a decoder block: the one [`TransformerBlock`], built with this rank's
/// heads and MLP columns, with Megatron's `f` before each sub-layer and `g` after it (so each
/// rank runs its own heads: rotary positions, QK-norm and grouped kv heads stay local).
/// The row-parallel projections' biases are taken out of the block and added once, after the
/// all-reduce.
pub struct TpBlock {
    pub block: TransformerBlock,
    /// `attn.proj.bias` (replicated), where the block has one.
    pub attn_proj_bias: Option<Tensor>,
    /// `mlp.proj.bias` (replicated), where the block has one.
    pub mlp_proj_bias: Option<Tensor>,
    /// The QK-norm weights (replicated variables). The block holds them behind `f`: each rank
    /// sees only its heads, so the group sums their gradient.
    qk_norm: Option<(Tensor, Tensor)>,
    comm: SharedComm,
}

impl TpBlock {
    /// Block `i` of `cfg` for this rank, from the full weights in `src`.
    fn from_source(
        cfg: &DecoderConfig,
        i: usize,
        src: &WeightSource,
        comm: &SharedComm,
    ) -> Result<Self> {
        let (rank, tp) = {
            let c = lock(comm);
            (c.rank(), c.world_size())
        };
        let mut get = |name: &str| src.shard(cfg, name, tp, rank);
        let local = local_block_config(cfg, i, tp);
        let mut block =
            TransformerBlock::from_named(&local, &format!("blocks.{i}"), &mut get, &shared_rng(0))?;
        let attn_proj_bias = block.attn.proj.bias.take();
        let mlp_proj_bias = block.mlp.proj.bias.take();
        let qk_norm = match (&mut block.attn.q_norm, &mut block.attn.k_norm) {
            (Some(q), Some(k)) => {
                // A recorded node only exists while gradients are on; built without it, the
                // norms would silently stop training.
                if !sinter_core::is_grad_enabled() {
                    bail!("tensor parallel: build a QK-norm model outside no_grad (its norm weights' gradient is summed over the group through the recorded graph)");
                }
                let leaves = (q.weight.clone(), k.weight.clone());
                q.weight = copy_to_tp_region(&leaves.0, comm)?;
                k.weight = copy_to_tp_region(&leaves.1, comm)?;
                Some(leaves)
            }
            _ => None,
        };
        Ok(TpBlock {
            block,
            attn_proj_bias,
            mlp_proj_bias,
            qk_norm,
            comm: comm.clone(),
        })
    }

    /// `g` after a row-parallel projection, then its replicated bias.
    fn reduce(&self, part: &Tensor, bias: &Option<Tensor>) -> Result<Tensor> {
        let y = reduce_from_tp_region(part, &self.comm)?;
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

impl Module for TpBlock {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if x.rank() != 3 {
            bail!(
                "tensor-parallel block: expected [batch, time, width], got {:?}",
                x.shape()
            );
        }
        let b = &self.block;
        let h = copy_to_tp_region(&b.ln1.forward(x)?, &self.comm)?;
        let x = x.add(&self.reduce(&b.attn.forward(&h)?, &self.attn_proj_bias)?)?;
        let h = copy_to_tp_region(&b.ln2.forward(&x)?, &self.comm)?;
        x.add(&self.reduce(&b.mlp.forward(&h)?, &self.mlp_proj_bias)?)
    }
    /// The block's parameters under the standard names: the QK-norm variables in place of
    /// their wrapped form, each row-parallel bias right after its weight.
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        let mut inner = Vec::new();
        self.block.collect(prefix, &mut inner);
        let param = |name: String, tensor: &Tensor| NamedTensor {
            name,
            tensor: tensor.clone(),
            kind: TensorKind::Parameter,
            layer: None,
        };
        for mut nt in inner {
            let leaf = nt.name[prefix.len()..].trim_start_matches('.').to_string();
            if let Some((q, k)) = &self.qk_norm {
                match leaf.as_str() {
                    "attn.q_norm.weight" => nt.tensor = q.clone(),
                    "attn.k_norm.weight" => nt.tensor = k.clone(),
                    _ => {}
                }
            }
            out.push(nt);
            let bias = match leaf.as_str() {
                "attn.proj.weight" => &self.attn_proj_bias,
                "mlp.proj.weight" => &self.mlp_proj_bias,
                _ => &None,
            };
            if let Some(b) = bias {
                out.push(param(join(prefix, &leaf.replace("weight", "bias")), b));
            }
        }
    }
}

/// The GPT split across a tensor-parallel group. Its parameters carry the standard names
/// with this rank's shard as value ([`Shard::of`] gives each one's layout), so an optimizer
/// over [`Module::parameters`] updates the shards and its state is sharded alike.
pub struct TpGpt {
    pub config: DecoderConfig,
    /// This rank's token-embedding rows (also the tied output head's rows).
    pub wte: Embedding,
    /// The learned position table (replicated); None with rotary positions.
    pub wpe: Option<Embedding>,
    pub blocks: Vec<TpBlock>,
    pub ln_f: Norm,
    /// This rank's rows of an untied output head (vocabulary-parallel, like `wte`).
    pub lm_head: Option<Linear>,
    tp_rank: usize,
    tp_size: usize,
    comm: SharedComm,
}

impl TpGpt {
    /// Slices a full model for this rank of the tensor-parallel group `comm`.
    pub fn from_gpt(gpt: &Decoder, comm: Box<dyn Communicator>) -> Result<Self> {
        let weights = gpt.parameters();
        Self::from_named(&gpt.config, &weights, comm)
    }

    /// Slices the full, standard-named weights of a GPT with config `cfg` (the weights are
    /// copied; they may be shared by the threads of all ranks).
    pub fn from_named(
        cfg: &DecoderConfig,
        weights: &[(String, Tensor)],
        comm: Box<dyn Communicator>,
    ) -> Result<Self> {
        let (tp_rank, tp_size) = (comm.rank(), comm.world_size());
        check_tp_config(cfg, tp_size)?;
        let src = WeightSource::new(cfg, weights)?;
        let shard = |name: &str| src.shard(cfg, name, tp_size, tp_rank);
        let comm = shared_comm(comm);
        let blocks = (0..cfg.n_layer)
            .map(|i| TpBlock::from_source(cfg, i, &src, &comm))
            .collect::<Result<_>>()?;
        let ln_f_bias = match cfg.arch.norm {
            NormKind::LayerNorm => Some(src.var("ln_f.bias")?),
            NormKind::RmsNorm => None,
        };
        Ok(TpGpt {
            config: cfg.clone(),
            wte: Embedding::from_weights(shard("wte.weight")?),
            wpe: match cfg.arch.rope {
                None => Some(Embedding::from_weights(src.var("wpe.weight")?)),
                Some(_) => None,
            },
            blocks,
            ln_f: Norm::from_weights(
                cfg.arch.norm,
                src.var("ln_f.weight")?,
                ln_f_bias,
                cfg.arch.norm_eps,
            )?,
            lm_head: match cfg.arch.tie_head {
                true => None,
                false => Some(Linear::from_weights(shard("lm_head.weight")?, None)),
            },
            tp_rank,
            tp_size,
            comm,
        })
    }

    /// This rank's index in the tensor-parallel group.
    pub fn tp_rank(&self) -> usize {
        self.tp_rank
    }
    /// Size of the tensor-parallel group.
    pub fn tp_size(&self) -> usize {
        self.tp_size
    }
    /// The tensor-parallel communicator (shared with the graph's collectives).
    pub fn comm(&self) -> &SharedComm {
        &self.comm
    }
    /// The token ids whose embedding rows and logits live on this rank.
    pub fn vocab_range(&self) -> Range<usize> {
        let n = self.config.vocab_size / self.tp_size;
        self.tp_rank * n..(self.tp_rank + 1) * n
    }

    /// The final hidden states after `ln_f`: `[b, t, c]`, replicated.
    fn hidden(&self, ids: &Tensor) -> Result<Tensor> {
        if ids.rank() != 2 || ids.dtype() != DType::I64 {
            bail!(
                "gpt: expected i64 token ids [batch, time], got {:?} {}",
                ids.shape(),
                ids.dtype()
            );
        }
        let t = ids.shape()[1];
        if t > self.config.block_size {
            bail!(
                "gpt: sequence of {t} tokens is longer than the context of {}",
                self.config.block_size
            );
        }
        let pos = Tensor::arange(0.0, t as f64, 1.0, DType::I64, Device::Cpu)?;
        let tok = vocab_parallel_embedding(
            &self.wte.weight,
            self.vocab_range().start,
            self.config.vocab_size,
            ids,
            &self.comm,
        )?;
        let mut x = match &self.wpe {
            Some(wpe) => tok.add(&wpe.forward(&pos)?)?,
            None => tok,
        };
        for b in &self.blocks {
            x = b.forward(&x)?;
        }
        self.ln_f.forward(&x)
    }

    /// This rank's slice of the logits, `[b·t, V/tp]`.
    fn logits_rows(&self, ids: &Tensor) -> Result<Tensor> {
        let h = self.hidden(ids)?;
        let (b, t, c) = (h.shape()[0], h.shape()[1], h.shape()[2]);
        let h = copy_to_tp_region(&h.reshape(&[b * t, c])?, &self.comm)?;
        let head = self
            .lm_head
            .as_ref()
            .map_or(&self.wte.weight, |l| &l.weight);
        h.matmul(&head.t()?)
    }

    /// This rank's vocabulary slice of the logits: `[b, t, V/tp]` (columns [`Self::vocab_range`]).
    pub fn logits_shard(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        self.logits_rows(ids)?
            .reshape(&[b, t, self.config.vocab_size / self.tp_size])
    }

    /// Mean next-token cross-entropy of `ids` against `targets` (both `[b, t]`, targets equal
    /// to [`IGNORE_INDEX`] count for nothing), computed vocabulary-parallel. Same value on every
    /// rank; `backward()` on every rank leaves each shard's gradient.
    pub fn loss(&self, ids: &Tensor, targets: &Tensor) -> Result<Tensor> {
        if targets.shape() != ids.shape() {
            bail!(
                "gpt loss: targets {:?} do not match ids {:?}",
                targets.shape(),
                ids.shape()
            );
        }
        let logits = self.logits_rows(ids)?;
        let tg = targets.reshape(&[targets.numel()])?;
        vocab_parallel_cross_entropy(
            &logits,
            self.vocab_range().start,
            self.config.vocab_size,
            &tg,
            IGNORE_INDEX,
            &self.comm,
        )
    }

    /// The full logits `[b, t, V]` from every rank's [`Self::logits_shard`] (an all-gather; for
    /// evaluation and tests, not needed for training).
    pub fn gather_logits(&self, shard: &Tensor) -> Result<Tensor> {
        let (b, t, vl) = (shard.shape()[0], shard.shape()[1], shard.shape()[2]);
        let tp = self.tp_size;
        let local = shard.to_vec_f32()?;
        let mut all = vec![0f32; local.len() * tp];
        lock(&self.comm)
            .all_gather(&local, &mut all)
            .map_err(comm_err)?;
        let full = Shard::Cols.unslice(&all, &[b * t, vl * tp], tp)?;
        f32_tensor(full, &[b, t, vl * tp])
    }

    fn gather(&self, grads: bool) -> Result<Vec<(String, Tensor)>> {
        self.gather_with(&|_, t| {
            if grads {
                match t.grad() {
                    Some(g) => g.to_vec_f32(),
                    None => Ok(vec![0f32; t.numel()]),
                }
            } else {
                t.to_vec_f32()
            }
        })
    }

    /// Full tensors assembled from per-parameter shards: `local(name, param)` gives this
    /// rank's shard values of something laid out like parameter `name` (its weight, gradient
    /// or optimizer state). Collective over the group; standard names and full shapes.
    pub fn gather_with(
        &self,
        local: &dyn Fn(&str, &Tensor) -> Result<Vec<f32>>,
    ) -> Result<Vec<(String, Tensor)>> {
        let tp = self.tp_size;
        let specs: HashMap<String, Vec<usize>> =
            gpt_param_specs(&self.config).into_iter().collect();
        let mut out = Vec::new();
        for (name, t) in self.parameters() {
            let local = local(&name, &t)?;
            let shape = &specs[&name];
            let s = Shard::of(&self.config, &name);
            let full = if s == Shard::Replicated || tp == 1 {
                local
            } else {
                let mut all = vec![0f32; local.len() * tp];
                lock(&self.comm)
                    .all_gather(&local, &mut all)
                    .map_err(comm_err)?;
                s.unslice(&all, shape, tp)?
            };
            out.push((name, f32_tensor(full, shape)?));
        }
        Ok(out)
    }

    /// This rank's shard of the full values `full` of something laid out like parameter
    /// `name` (the inverse of [`Self::gather_with`], without communication).
    pub fn shard_of_full(&self, name: &str, full: &[f32]) -> Result<Vec<f32>> {
        let specs: HashMap<String, Vec<usize>> =
            gpt_param_specs(&self.config).into_iter().collect();
        let shape = specs
            .get(name)
            .ok_or_else(|| Error::Msg(format!("tensor parallel: no parameter named {name}")))?;
        if full.len() != shape.iter().product::<usize>() {
            return Err(Error::Msg(format!(
                "tensor parallel: {name} has {} values, expected shape {shape:?}",
                full.len()
            )));
        }
        Shard::of(&self.config, name).slice(full, shape, self.tp_size, self.tp_rank)
    }

    /// The full weights under the standard names, in `Decoder::parameters()` order (collective:
    /// every rank of the group calls it and gets the same result).
    pub fn gather_weights(&self) -> Result<Vec<(String, Tensor)>> {
        self.gather(false)
    }

    /// The full gradients under the standard names (zeros where a shard has none); collective.
    pub fn gather_grads(&self) -> Result<Vec<(String, Tensor)>> {
        self.gather(true)
    }
}

impl Module for TpGpt {
    /// ids `[b, t]` → this rank's logits slice `[b, t, V/tp]`.
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits_shard(ids)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        self.wte.collect(&join(prefix, "wte"), out);
        if let Some(wpe) = &self.wpe {
            wpe.collect(&join(prefix, "wpe"), out);
        }
        for (i, b) in self.blocks.iter().enumerate() {
            b.collect(&join(prefix, &format!("blocks.{i}")), out);
        }
        self.ln_f.collect(&join(prefix, "ln_f"), out);
        if let Some(head) = &self.lm_head {
            head.collect(&join(prefix, "lm_head"), out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_slices_round_trip() {
        for (shard, shape) in [
            (Shard::Rows, vec![8, 3]),
            (Shard::Cols, vec![3, 8]),
            (Shard::PackedRows([4, 4, 4]), vec![12, 2]),
            (Shard::PackedRows([4, 4, 4]), vec![12]),
            (Shard::PackedRows([8, 2, 2]), vec![12, 3]),
            (Shard::PackedRows([6, 6, 0]), vec![12, 2]),
        ] {
            let n: usize = shape.iter().product();
            let full: Vec<f32> = (0..n).map(|i| i as f32).collect();
            let tp = 2;
            let mut gathered = Vec::new();
            for r in 0..tp {
                gathered.extend(shard.slice(&full, &shape, tp, r).unwrap());
            }
            assert_eq!(
                shard.unslice(&gathered, &shape, tp).unwrap(),
                full,
                "{shard:?}"
            );
        }
        // q rows 0..4, k 4..8, v 8..12: rank 1 of 2 holds rows 2,3 / 6,7 / 10,11.
        let full: Vec<f32> = (0..12).map(|i| i as f32).collect();
        assert_eq!(
            Shard::PackedRows([4, 4, 4])
                .slice(&full, &[12], 2, 1)
                .unwrap(),
            vec![2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
        );
        // Grouped-query: 8 q rows, 2 k, 2 v; rank 1 holds q 4..8, k 9, v 11.
        assert_eq!(
            Shard::PackedRows([8, 2, 2])
                .slice(&full, &[12], 2, 1)
                .unwrap(),
            vec![4.0, 5.0, 6.0, 7.0, 9.0, 11.0]
        );
        // kv rows that do not split are an error, not a misaligned slice.
        assert!(Shard::PackedRows([8, 1, 1])
            .slice(&full[..10], &[10], 2, 0)
            .is_err());
        assert_eq!(
            Shard::Cols.slice(&full, &[3, 4], 2, 1).unwrap(),
            vec![2.0, 3.0, 6.0, 7.0, 10.0, 11.0]
        );
        let gpt2 = DecoderConfig::default();
        let c = gpt2.n_embd;
        assert_eq!(
            Shard::of(&gpt2, "blocks.3.attn.qkv.bias"),
            Shard::PackedRows([c, c, c])
        );
        assert_eq!(
            Shard::of(&gpt2, "blocks.0.attn.proj.bias"),
            Shard::Replicated
        );
        assert_eq!(Shard::of(&gpt2, "blocks.10.mlp.proj.weight"), Shard::Cols);
        assert_eq!(Shard::of(&gpt2, "blocks.1.mlp.fc.weight"), Shard::Rows);
        assert_eq!(Shard::of(&gpt2, "wte.weight"), Shard::Rows);
        assert_eq!(Shard::of(&gpt2, "wpe.weight"), Shard::Replicated);
        let llama = DecoderConfig::preset("llama-tiny").unwrap();
        // 4 heads of 32, 2 kv heads; SwiGLU's gate and up of 344 each.
        assert_eq!(
            Shard::of(&llama, "blocks.0.attn.qkv.weight"),
            Shard::PackedRows([128, 64, 64])
        );
        assert_eq!(
            Shard::of(&llama, "blocks.2.mlp.fc.weight"),
            Shard::PackedRows([344, 344, 0])
        );
        assert_eq!(Shard::of(&llama, "lm_head.weight"), Shard::Rows);
        assert_eq!(Shard::of(&llama, "blocks.0.ln1.weight"), Shard::Replicated);
    }
}
