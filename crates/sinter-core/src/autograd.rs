//! Reverse-mode autograd. Each op that sees a tracked input records a `Node`: its inputs and
//! a closure that maps the output's gradient to the inputs' gradients. `backward` walks the
//! graph in reverse topological order under no-grad, accumulates into each variable's `grad`,
//! and calls a hook the moment a variable's gradient is final (data parallel starts its
//! bucket all-reduce there, overlapping communication with the rest of backward).

use std::collections::HashMap;

use crate::graph::record;
pub use crate::graph::{is_grad_enabled, no_grad, NoGradGuard};
use crate::tensor::{Tensor, TensorId};
use crate::Result;

/// Tensors reachable from `root` through nodes, producers before consumers.
fn topological_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut seen: HashMap<TensorId, ()> = HashMap::new();
    // Iterative DFS: deep graphs (long sequences of small ops) must not overflow the stack.
    let mut stack: Vec<(Tensor, usize)> = vec![(root.clone(), 0)];
    seen.insert(root.id(), ());
    while let Some((t, child)) = stack.pop() {
        let inputs =
            t.0.node
                .as_ref()
                .map(|n| n.inputs.as_slice())
                .unwrap_or(&[]);
        if child < inputs.len() {
            let next = inputs[child].clone();
            stack.push((t, child + 1));
            if next.tracks_grad() && seen.insert(next.id(), ()).is_none() {
                stack.push((next, 0));
            }
        } else {
            order.push(t);
        }
    }
    order
}

/// Wraps an already computed `value` as the output of a custom differentiable op over
/// `inputs` (e.g. a collective: tensor parallelism's all-reduce, pipeline send/recv).
/// `backward(grad_of_output, output)` returns one gradient per input. (A whole op defined once,
/// with device kernels and a saved-tensor backward, is [`crate::custom_op`].)
pub fn with_custom_backward(
    value: &Tensor,
    name: &'static str,
    inputs: &[&Tensor],
    backward: impl Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Tensor {
    let node = record(name, inputs, backward);
    Tensor::from_parts(value.0.storage.clone(), value.layout().clone(), node)
}

impl Tensor {
    /// Computes gradients of this tensor (seeded with ones) for every variable it depends on,
    /// adding them to what the variables already hold.
    pub fn backward(&self) -> Result<()> {
        self.backward_with_hook(|_, _| Ok(()))
    }

    /// `backward`, calling `hook(variable, its accumulated gradient)` as soon as each
    /// variable's gradient from this pass is complete.
    pub fn backward_with_hook(
        &self,
        hook: impl FnMut(&Tensor, &Tensor) -> Result<()>,
    ) -> Result<()> {
        self.backward_from(None, hook)
    }

    /// Backward seeded with `grad` (this tensor's gradient, e.g. received from the next
    /// pipeline stage) instead of ones.
    pub fn backward_with_grad(
        &self,
        grad: &Tensor,
        hook: impl FnMut(&Tensor, &Tensor) -> Result<()>,
    ) -> Result<()> {
        if grad.shape() != self.shape() {
            return Err(crate::Error::ShapeMismatch {
                op: "backward_with_grad",
                lhs: self.shape().to_vec(),
                rhs: grad.shape().to_vec(),
            });
        }
        self.backward_from(Some(grad.clone()), hook)
    }

    fn backward_from(
        &self,
        seed: Option<Tensor>,
        mut hook: impl FnMut(&Tensor, &Tensor) -> Result<()>,
    ) -> Result<()> {
        if !self.tracks_grad() {
            crate::bail!("backward: this tensor does not depend on any variable (was it computed under no_grad, or detached?)");
        }
        let _guard = no_grad();
        let order = topological_order(self);
        // How many recorded uses of each tensor remain unprocessed.
        let mut pending: HashMap<TensorId, usize> = HashMap::new();
        for t in &order {
            if let Some(n) = &t.0.node {
                for i in &n.inputs {
                    if i.tracks_grad() {
                        *pending.entry(i.id()).or_default() += 1;
                    }
                }
            }
        }
        let mut grads: HashMap<TensorId, Tensor> = HashMap::new();
        let seed = match seed {
            Some(g) => g.detach(),
            None => self.ones_like()?,
        };
        grads.insert(self.id(), seed);

        let finish_variable = |v: &Tensor,
                               g: Tensor,
                               hook: &mut dyn FnMut(&Tensor, &Tensor) -> Result<()>|
         -> Result<()> {
            let g = if g.dtype() != v.dtype() {
                g.to_dtype(v.dtype())?
            } else {
                g
            };
            let total = match v.grad() {
                Some(prev) => prev.add(&g)?,
                // A gradient may share storage with another variable's (add hands the same
                // tensor to both operands) or with the caller's seed: give each variable its own,
                // so that an in-place update of one (an all-reduce) never touches another.
                None if std::sync::Arc::strong_count(&g.0.storage) > 1 => g.affine(1.0, 0.0)?,
                None => g.contiguous()?,
            };
            v.set_grad(Some(total.clone()));
            hook(v, &total)
        };
        if self.is_variable() {
            let g = grads.remove(&self.id()).expect("seeded");
            return finish_variable(self, g, &mut hook);
        }

        for t in order.iter().rev() {
            let Some(node) = &t.0.node else { continue };
            let Some(g) = grads.remove(&t.id()) else {
                continue;
            };
            let input_grads = (node.backward)(&g, t)
                .map_err(|e| crate::Error::Msg(format!("backward of {}: {e}", node.name)))?;
            debug_assert_eq!(input_grads.len(), node.inputs.len(), "{}", node.name);
            for (input, ig) in node.inputs.iter().zip(input_grads) {
                if !input.tracks_grad() {
                    continue;
                }
                if let Some(ig) = ig {
                    if ig.shape() != input.shape() {
                        crate::bail!(
                            "backward of {}: gradient shape {:?} does not match input shape {:?}",
                            node.name,
                            ig.shape(),
                            input.shape()
                        );
                    }
                    let acc = match grads.remove(&input.id()) {
                        Some(prev) => prev.add(&ig)?,
                        None => ig,
                    };
                    grads.insert(input.id(), acc);
                }
                let left = pending.get_mut(&input.id()).expect("counted");
                *left -= 1;
                if *left == 0 && input.is_variable() {
                    if let Some(g) = grads.remove(&input.id()) {
                        finish_variable(input, g, &mut hook)?;
                    }
                }
            }
        }
        Ok(())
    }
}
