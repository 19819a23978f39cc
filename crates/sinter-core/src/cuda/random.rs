//! Dropout on the device with the counter-based Philox generator: each call draws one seed from
//! the caller's `Rng` (so a run is reproducible and resumable from the saved `Rng` state), the
//! mask is a function of (seed, element index) only, and the backward regenerates the same mask
//! instead of storing it. The masks differ from the CPU backend's (which draws every element
//! from the `Rng`); their distribution is the same.

use sinter_cuda::ops::dropout as kd;

use super::{alloc, contig, contig_as, parts, storage_of, tensor_of, OnOp};
use crate::tensor::output;
use crate::{Result, Rng, Tensor};

/// Inverted dropout with probability `p` in (0, 1) (checked by the caller).
pub(crate) fn dropout(x: &Tensor, p: f32, rng: &mut Rng) -> Result<Tensor> {
    let (dev, _) = parts(x)?;
    let dtype = x.dtype();
    if !dtype.is_float() {
        crate::bail!("dropout: needs a float tensor, got {dtype}");
    }
    let seed = rng.next_u64();
    let xv = contig(x)?;
    let y = alloc(&dev, xv.len, dtype)?;
    kd::dropout(&dev, xv.slice(), y.as_slice(), p, seed, 0).on("dropout")?;
    Ok(output(
        storage_of(&dev, y, dtype),
        x.shape(),
        "dropout",
        &[x],
        move |g, _| {
            let gv = contig_as(g, dtype)?;
            let gx = alloc(&dev, gv.len, dtype)?;
            kd::dropout_backward(&dev, gv.slice(), gx.as_slice(), p, seed, 0).on("dropout")?;
            Ok(vec![Some(tensor_of(&dev, gx, dtype, g.shape()))])
        },
    ))
}
