//! The allocator's pools, named here below both the allocator and the error type (which
//! reports a pool's figures).

/// Which pool a buffer belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pool {
    /// Weights, gradients, optimizer state: lives for the whole run.
    Permanent,
    /// Activations and workspaces: freed within a step.
    Temporary,
}

impl Pool {
    pub(crate) fn index(self) -> usize {
        match self {
            Pool::Permanent => 0,
            Pool::Temporary => 1,
        }
    }
}
