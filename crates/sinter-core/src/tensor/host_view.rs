//! In-place host access to a CPU f32 tensor's elements, for code that runs its own kernels
//! over plain slices (sinter-cpu) instead of tensor ops: e.g. a model's decode step, which
//! reads its weights and appends to its KV cache in place without allocating a tensor per
//! op. A view holds the storage's lock for as long as it lives (read: shared with other
//! readers; write: exclusive), so hold it for one step, never across calls that may lock the
//! same storage for writing.
//!
//! Only contiguous f32 tensors on the CPU have such a view (`None` otherwise: the caller runs
//! its tensor-op path). Writes through a mutable view are not recorded by autograd:
//! `host_f32_mut` refuses tensors that track gradients.

use std::ops::{Deref, DerefMut, Range};
use std::sync::{RwLockReadGuard, RwLockWriteGuard};

use crate::cpu::CpuStorage;
use crate::storage::Storage;
use crate::Tensor;

/// The elements of a contiguous CPU f32 tensor, read in place (see the module comment).
pub struct HostF32<'a> {
    guard: RwLockReadGuard<'a, Storage>,
    range: Range<usize>,
}

/// The elements of a contiguous CPU f32 tensor, written in place (see the module comment).
pub struct HostF32Mut<'a> {
    guard: RwLockWriteGuard<'a, Storage>,
    range: Range<usize>,
}

/// The f32 elements `range` of a storage checked to hold CPU f32 data.
fn elements(s: &Storage, range: Range<usize>) -> &[f32] {
    match s {
        Storage::Cpu(CpuStorage::F32(v)) => &v[range],
        _ => unreachable!("checked when the view was made"),
    }
}

impl Deref for HostF32<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        elements(&self.guard, self.range.clone())
    }
}

impl Deref for HostF32Mut<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        elements(&self.guard, self.range.clone())
    }
}

impl DerefMut for HostF32Mut<'_> {
    fn deref_mut(&mut self) -> &mut [f32] {
        match &mut *self.guard {
            Storage::Cpu(CpuStorage::F32(v)) => &mut v[self.range.clone()],
            _ => unreachable!("checked when the view was made"),
        }
    }
}

/// A tensor's f32 elements on the host: in place when it is a contiguous CPU f32 tensor
/// ([`HostF32`]), else a contiguous f32 copy ([`Tensor::host_values`]).
pub enum HostValues<'a> {
    InPlace(HostF32<'a>),
    Copied(Vec<f32>),
}

impl Deref for HostValues<'_> {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        match self {
            HostValues::InPlace(v) => v,
            HostValues::Copied(v) => v,
        }
    }
}

/// The element range a contiguous view of `storage` covers, when it is CPU f32 data.
fn f32_range(t: &Tensor, storage: &Storage) -> Option<Range<usize>> {
    let l = t.layout();
    let on_host_f32 = matches!(storage, Storage::Cpu(CpuStorage::F32(_)));
    (on_host_f32 && l.is_contiguous()).then(|| l.offset()..l.offset() + l.numel())
}

impl Tensor {
    /// This tensor's elements in place, row-major, when it is a contiguous f32 tensor on the
    /// CPU; None otherwise. Holds the storage's read lock while the view lives.
    pub fn host_f32(&self) -> Option<HostF32<'_>> {
        let guard = self.storage();
        let range = f32_range(self, &guard)?;
        Some(HostF32 { guard, range })
    }

    /// This tensor's elements as f32 on the host: read in place when [`Tensor::host_f32`]
    /// can, else copied (another dtype, layout or device).
    pub fn host_values(&self) -> crate::Result<HostValues<'_>> {
        Ok(match self.host_f32() {
            Some(v) => HostValues::InPlace(v),
            None => HostValues::Copied(self.to_vec_f32()?),
        })
    }

    /// This tensor's elements for writing in place, row-major, when it is a contiguous f32
    /// tensor on the CPU that tracks no gradient; None otherwise. Holds the storage's write
    /// lock while the view lives (other views of the same storage wait).
    pub fn host_f32_mut(&self) -> Option<HostF32Mut<'_>> {
        if self.tracks_grad() {
            return None;
        }
        let guard = self.write_storage();
        let range = f32_range(self, &guard)?;
        Some(HostF32Mut { guard, range })
    }
}
