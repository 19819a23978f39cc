//! The recorded graph, independent of what it records: a node holds an op's inputs and the
//! closure that maps its output's gradient to theirs, and the thread's grad mode decides
//! whether ops record at all. Generic over the value type so that it sits below `tensor`
//! (which records `Node<Tensor>`) without importing it; `autograd` walks the graph.

use std::cell::Cell;

use crate::Result;

/// (grad of output, output) -> one gradient per input (None: nothing flows there).
pub(crate) type BackwardFn<T> = Box<dyn Fn(&T, &T) -> Result<Vec<Option<T>>> + Send + Sync>;

pub(crate) struct Node<T> {
    pub(crate) name: &'static str,
    pub(crate) inputs: Vec<T>,
    pub(crate) backward: BackwardFn<T>,
}

/// A value that may lie on a path to a variable.
pub(crate) trait Tracked: Clone {
    fn tracks_grad(&self) -> bool;
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
}

pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// While alive, ops record nothing (evaluation, optimizer updates). Restores on drop.
pub struct NoGradGuard {
    prev: bool,
}

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.prev));
    }
}

pub fn no_grad() -> NoGradGuard {
    let prev = GRAD_ENABLED.with(|g| g.replace(false));
    NoGradGuard { prev }
}

/// A node for an op over `inputs`, or None when no input needs gradients (or grad mode is off).
pub(crate) fn record<T: Tracked>(
    name: &'static str,
    inputs: &[&T],
    backward: impl Fn(&T, &T) -> Result<Vec<Option<T>>> + Send + Sync + 'static,
) -> Option<Node<T>> {
    if !is_grad_enabled() || !inputs.iter().any(|t| t.tracks_grad()) {
        return None;
    }
    Some(Node {
        name,
        inputs: inputs.iter().map(|t| (*t).clone()).collect(),
        backward: Box::new(backward),
    })
}
