//! The LLTM cell's pointwise part from composite tensor ops (the reference, and what the
//! benchmark compares the custom op with): thirteen elementwise ops, each a pass over memory with
//! its own autograd node.

use sinter_core::{Result, Tensor};

/// ELU with alpha 1: relu(z) + exp(−relu(−z)) − 1 (no device-side constants needed).
pub fn elu(z: &Tensor) -> Result<Tensor> {
    let below = z.neg()?.relu()?.neg()?.exp()?.add_scalar(-1.0)?;
    z.relu()?.add(&below)
}

/// (new_h, new_cell) from gates [B, 3S] and old_cell [B, S].
pub fn cell_composite(gates: &Tensor, old_cell: &Tensor) -> Result<(Tensor, Tensor)> {
    let g = gates.chunk(3, 1)?;
    let input_gate = g[0].sigmoid()?;
    let output_gate = g[1].sigmoid()?;
    let candidate = elu(&g[2])?;
    let new_cell = old_cell.add(&candidate.mul(&input_gate)?)?;
    let new_h = new_cell.tanh()?.mul(&output_gate)?;
    Ok((new_h, new_cell))
}
