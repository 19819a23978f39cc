//! A custom op's one backward, recorded once above the seam.
//!
//! The graph's nodes have one output each; a custom op may have several. So the op records one
//! node (over its inputs, holding the user's backward) on a hidden empty "anchor" tensor, and each
//! returned output records a node over the anchor that only hands its gradient to the anchor's
//! slot. The graph runs every output's node before the anchor's (the anchor is their input),
//! so when the anchor's backward runs the slot holds the gradient of every output that got one
//! (zeros stand in for the others), and the user's backward sees them all at once.

use std::sync::{Arc, Mutex};

use crate::graph;
use crate::storage::Storage;
use crate::tensor::output;
use crate::{bail, DType, Layout, Result, Tensor};

/// The closure of a backward.
pub(crate) type BackwardFn = dyn Fn(&BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>> + Send + Sync;

/// What a backward sees: the forward's inputs and outputs (saved-only ones included) and the
/// gradient of each returned output. It returns one gradient per input (None where none
/// flows), of the input's shape, dtype and device. It runs without recording gradients, so it
/// may use any tensor op or other custom op.
pub struct BackwardCtx<'a> {
    inputs: &'a [Tensor],
    needs: &'a [bool],
    outputs: &'a [Tensor],
    grads: &'a [Tensor],
}

impl BackwardCtx<'_> {
    /// The forward's inputs, in order.
    pub fn inputs(&self) -> &[Tensor] {
        self.inputs
    }
    pub fn input(&self, i: usize) -> &Tensor {
        &self.inputs[i]
    }
    /// Whether input `i` wants a gradient (a None for it is fine either way).
    pub fn needs_grad(&self, i: usize) -> bool {
        self.needs[i]
    }
    /// Every output the forward made, in declared order (the returned ones first).
    pub fn outputs(&self) -> &[Tensor] {
        self.outputs
    }
    pub fn output(&self, k: usize) -> &Tensor {
        &self.outputs[k]
    }
    /// One gradient per returned output (`grads()[k]` belongs to `outputs()[k]`); zeros for
    /// an output no gradient reached.
    pub fn grads(&self) -> &[Tensor] {
        self.grads
    }
    pub fn grad(&self, k: usize) -> &Tensor {
        &self.grads[k]
    }
}

/// The returned outputs of a forward whose every output is in `outputs`, with the op's node
/// recorded when an input tracks gradients.
pub(crate) fn record(
    name: &'static str,
    backward: Option<Arc<BackwardFn>>,
    inputs: &[&Tensor],
    outputs: Vec<Tensor>,
    returned: usize,
) -> Result<Vec<Tensor>> {
    let tracked = inputs.iter().position(|t| t.tracks_grad());
    let (Some(first), true) = (tracked, graph::is_grad_enabled()) else {
        return Ok(outputs.into_iter().take(returned).collect());
    };
    let Some(backward) = backward else {
        bail!(
            "custom op `{name}` has no backward, but its input {first} needs a gradient: define one with CustomOpBuilder::backward, or call the op under no_grad or on detached inputs"
        );
    };
    let device = outputs[0].device();
    let slot: Arc<Mutex<Vec<Option<Tensor>>>> = Arc::new(Mutex::new(vec![None; returned]));
    let anchor = {
        let slot = slot.clone();
        let ins: Vec<Tensor> = inputs.iter().map(|t| t.detach()).collect();
        let needs: Vec<bool> = inputs.iter().map(|t| t.tracks_grad()).collect();
        let outs = outputs.clone();
        output(
            Storage::alloc(device, 0, DType::F32)?,
            &[0],
            name,
            inputs,
            move |_, _| {
                // Emptied (not shrunk) for the next backward pass over the same graph.
                let taken: Vec<Option<Tensor>> = slot
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .iter_mut()
                    .map(Option::take)
                    .collect();
                let grads = taken
                    .into_iter()
                    .zip(&outs[..returned])
                    .map(|(g, o)| g.map_or_else(|| o.zeros_like(), Ok))
                    .collect::<Result<Vec<_>>>()?;
                let ctx = BackwardCtx {
                    inputs: &ins,
                    needs: &needs,
                    outputs: &outs,
                    grads: &grads,
                };
                checked_grads(name, &ins, &needs, backward(&ctx)?)
            },
        )
    };
    Ok(outputs
        .into_iter()
        .take(returned)
        .enumerate()
        .map(|(k, o)| {
            let slot = slot.clone();
            let node = graph::record(name, &[&anchor], move |g, _| {
                slot.lock().unwrap_or_else(|p| p.into_inner())[k] = Some(g.clone());
                Ok(vec![Some(Tensor::zeros(&[0], DType::F32, device)?)])
            });
            Tensor::from_parts(o.0.storage.clone(), Layout::contiguous(o.shape()), node)
        })
        .collect())
}

/// The backward's gradients, checked: one per input, each of its input's shape, dtype and
/// device (those of inputs that need none are dropped).
fn checked_grads(
    op: &str,
    inputs: &[Tensor],
    needs: &[bool],
    grads: Vec<Option<Tensor>>,
) -> Result<Vec<Option<Tensor>>> {
    if grads.len() != inputs.len() {
        bail!(
            "custom op `{op}`: the backward returned {} gradients for {} inputs (one per input, None where none flows)",
            grads.len(),
            inputs.len()
        );
    }
    let mut out = Vec::with_capacity(grads.len());
    for (i, (g, x)) in grads.into_iter().zip(inputs).enumerate() {
        let g = g.filter(|_| needs[i]);
        if let Some(g) = &g {
            let what = if g.shape() != x.shape() {
                format!("has shape {:?}, the input {:?}", g.shape(), x.shape())
            } else if g.dtype() != x.dtype() {
                format!("is {}, the input {}", g.dtype(), x.dtype())
            } else if g.device() != x.device() {
                format!("is on {}, the input on {}", g.device(), x.device())
            } else {
                String::new()
            };
            if !what.is_empty() {
                bail!("custom op `{op}`: the gradient of input {i} {what}");
            }
        }
        out.push(g);
    }
    Ok(out)
}
