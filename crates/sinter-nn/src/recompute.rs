//! Activation checkpointing ("recompute"): trade compute for memory per Transformer block.
//!
//! A checkpointed function runs its forward pass under `no_grad`, so none of its
//! intermediate activations are kept; the graph records one custom op that holds only the
//! function's input. Its backward pass re-runs the function with gradients enabled on a
//! detached copy of the input, back-propagates the incoming gradient through that fresh
//! graph (parameter gradients accumulate in the parameters as usual) and returns the input's
//! gradient. Dropout inside the function sees the same random numbers both times: the shared
//! generator's state is saved before the forward pass and replayed for the recomputation.
//!
//! `Recompute::Attn` checkpoints only the attention sub-layer (LN1 + attention); with flash
//! attention that sub-layer is already O(t·d), so `Block` (the whole block; only the block's
//! input survives) is the mode that saves most.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use sinter_core::{is_grad_enabled, no_grad, with_custom_backward, Error, Result, Rng, Tensor};

use crate::module::SharedRng;
use crate::transformer::TransformerBlock;

/// What each Transformer block recomputes in the backward pass instead of keeping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Recompute {
    /// Keep every activation (fastest, most memory).
    #[default]
    None,
    /// Recompute LN1 + attention; keep the MLP half's activations.
    Attn,
    /// Recompute the whole block; keep only its input.
    Block,
}

impl Recompute {
    pub const NAMES: [&'static str; 3] = ["none", "attn", "block"];
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Attn => "attn",
            Recompute::Block => "block",
        }
    }
}

impl fmt::Display for Recompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Recompute {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "none" => Ok(Recompute::None),
            "attn" => Ok(Recompute::Attn),
            "block" => Ok(Recompute::Block),
            other => Err(Error::Msg(format!(
                "unknown recompute mode '{other}'; valid: {}",
                Recompute::NAMES.join(", ")
            ))),
        }
    }
}

fn lock(rng: &SharedRng) -> std::sync::MutexGuard<'_, Rng> {
    rng.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs `f` with gradient recording on. Backward passes run under `no_grad`, and the flag is
/// per thread, so when it is off the work moves to a scoped thread (where recording is on
/// by default) and the caller waits for it.
pub(crate) fn with_grad<T: Send>(f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    if is_grad_enabled() {
        return f();
    }
    std::thread::scope(|s| s.spawn(f).join())
        .map_err(|_| Error::Msg("recompute: the recomputation panicked".into()))?
}

/// `f(x)`, checkpointed: nothing inside `f` is kept for backward except `x` itself (see the
/// module docs). `rng` is the generator any dropout inside `f` draws from (None: `f` draws
/// nothing). Without gradient recording (evaluation) this is just `f(x)`.
pub fn checkpoint<F>(x: &Tensor, rng: Option<&SharedRng>, f: F) -> Result<Tensor>
where
    F: Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
{
    if !is_grad_enabled() {
        return f(x);
    }
    let rng_state = rng.map(|r| lock(r).state());
    // The recomputation runs in the forward's autocast region (the backward runs outside any,
    // maybe on another thread), so that it computes the same values in the same dtypes.
    let autocast = sinter_core::amp::autocast_dtype();
    let xd = x.detach();
    let y = {
        let _g = no_grad();
        f(&xd)?
    };
    // The recorded op needs an input that reaches the graph; a constant input (no gradient)
    // still has parameters inside `f`, so it becomes a private leaf whose gradient is dropped.
    let input = if x.tracks_grad() {
        x.clone()
    } else {
        xd.to_var()?
    };
    let rng = rng.cloned();
    let backward = move |g: &Tensor, _: &Tensor| -> Result<Vec<Option<Tensor>>> {
        let run = || -> Result<Tensor> {
            let _ac = autocast.map(sinter_core::amp::autocast);
            let xv = xd.to_var()?;
            // Replay the generator from where the forward pass found it, then put it back.
            let now = rng
                .as_ref()
                .zip(rng_state)
                .map(|(r, s)| std::mem::replace(&mut *lock(r), Rng::from_state(s)));
            let y = f(&xv);
            if let (Some(r), Some(now)) = (&rng, now) {
                *lock(r) = now;
            }
            let y = y?;
            if !y.tracks_grad() {
                return xv.zeros_like();
            }
            y.backward_with_grad(g, |_, _| Ok(()))?;
            match xv.grad() {
                Some(dx) => Ok(dx),
                None => xv.zeros_like(),
            }
        };
        Ok(vec![Some(with_grad(run)?)])
    };
    Ok(with_custom_backward(&y, "checkpoint", &[&input], backward))
}

/// One Transformer block's forward pass with the given recompute mode. `rng` is the dropout
/// generator the block's Dropout layers share (needed only when dropout is on).
pub fn block_forward(
    block: &Arc<TransformerBlock>,
    x: &Tensor,
    mode: Recompute,
    rng: Option<&SharedRng>,
) -> Result<Tensor> {
    match mode {
        Recompute::None => block.forward_fused(x),
        Recompute::Block => {
            let blk = block.clone();
            checkpoint(x, rng, move |x| blk.forward_fused(x))
        }
        Recompute::Attn => {
            let blk = block.clone();
            let a = checkpoint(x, rng, move |x| blk.forward_attn(x))?;
            block.forward_after_attn(x, &a)
        }
    }
}
