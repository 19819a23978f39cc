//! A right-hand operand packed once and multiplied many times (inference weights, a weight
//! used by several products in a step).
//!
//! With a row-major C (the usual case) the driver computes Cᵀ = Bᵀ·Aᵀ so that C's rows are
//! its vector dimension; the user's B is then the micro-kernel's "A" operand. [`PackedB`]
//! holds it in exactly that packed form (panels of MR columns of B, k blocks of kc), so a
//! product with it only packs the (usually small) left operand.

use super::blocking::{Blocking, CacheSizes};
use super::kernel::kernel_shape;
use super::matrix::{GemmError, MatRef};
use super::pack::{pack_panels, Src};
use crate::Isa;

/// B (k × n) packed for the micro-kernels of one instruction set.
#[derive(Clone, Debug)]
pub struct PackedB {
    pub(crate) data: Vec<f32>,
    pub(crate) k: usize,
    pub(crate) n: usize,
    pub(crate) kc: usize,
    pub(crate) isa: Isa,
}

impl PackedB {
    /// Packs B (k × n, element (p, j) at `b.offset + p·b.rs + j·b.cs`) for `isa`'s kernels.
    pub fn new_isa(isa: Isa, b: MatRef, k: usize, n: usize) -> Result<PackedB, GemmError> {
        b.check("B", k, n)?;
        let (mr, nr) = kernel_shape(isa);
        let kc = Blocking::for_kernel(mr, nr, CacheSizes::get()).kc;
        let padded = n.div_ceil(mr) * mr;
        let mut data = vec![0f32; padded * k];
        let mut pc = 0;
        while pc < k {
            let kcb = kc.min(k - pc);
            let src = Src {
                // SAFETY (the reads in pack_panels): b.check proved every (p, j) in bounds.
                ptr: unsafe { b.data.as_ptr().add(b.offset).offset(pc as isize * b.rs) },
                fs: b.cs,
                ks: b.rs,
            };
            // SAFETY: as above; the destination block holds padded · kcb values.
            unsafe {
                pack_panels(
                    src,
                    n,
                    kcb,
                    mr,
                    &mut data[pc * padded..(pc + kcb) * padded],
                    isa != Isa::Scalar,
                )
            };
            pc += kcb;
        }
        Ok(PackedB {
            data,
            k,
            n,
            kc,
            isa,
        })
    }

    /// Packs B for [`Isa::get`]'s kernels.
    pub fn new(b: MatRef, k: usize, n: usize) -> Result<PackedB, GemmError> {
        Self::new_isa(Isa::get(), b, k, n)
    }

    pub fn k(&self) -> usize {
        self.k
    }
    pub fn n(&self) -> usize {
        self.n
    }
    pub fn isa(&self) -> Isa {
        self.isa
    }
}
