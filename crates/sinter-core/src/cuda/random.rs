//! Dropout on the device with the counter-based Philox generator: each call draws one seed from
//! the caller's `Rng` (so a run is reproducible and resumable from the saved `Rng` state), the
//! mask is a function of (seed, element index) only, and the backward regenerates the same mask
//! instead of storing it. The masks differ from the CPU backend's (which draws every element
//! from the `Rng`); their distribution is the same.

use sinter_cuda::ops::dropout as kd;

use super::storage::CudaStorage;
use super::{alloc, OnOp};
use crate::backend::DropoutMask;
use crate::{bail, Error, Layout, Result, Rng};

/// Inverted dropout with probability `p` in (0, 1) (checked by the caller).
pub(crate) fn dropout(
    x: &CudaStorage,
    l: &Layout,
    p: f32,
    rng: &mut Rng,
) -> Result<(CudaStorage, DropoutMask<CudaStorage>)> {
    let (dev, dtype) = (x.device(), x.dtype());
    if !dtype.is_float() {
        return Err(Error::UnsupportedDType {
            op: "dropout",
            dtype,
            supported: "f32, f16 or bf16",
        });
    }
    let seed = rng.next_u64();
    let xv = x.window(l)?;
    let y = alloc(dev, xv.len, dtype)?;
    kd::dropout(dev, xv.slice(), y.as_slice(), p, seed, 0).on("dropout")?;
    Ok((x.sibling(y, dtype), DropoutMask::Seed(seed)))
}

/// grad_out times the mask regenerated from the forward's seed.
pub(crate) fn dropout_backward(
    g: &CudaStorage,
    l: &Layout,
    p: f32,
    mask: DropoutMask<&CudaStorage>,
) -> Result<CudaStorage> {
    let DropoutMask::Seed(seed) = mask else {
        bail!("dropout: internal error: a CUDA dropout saves its seed, not a mask");
    };
    let (dev, dtype) = (g.device(), g.dtype());
    let gv = g.window(l)?;
    let gx = alloc(dev, gv.len, dtype)?;
    kd::dropout_backward(dev, gv.slice(), gx.as_slice(), p, seed, 0).on("dropout")?;
    Ok(g.sibling(gx, dtype))
}
