//! Deferred checks of device-resident indices (cross-entropy targets, index_select / embedding /
//! index_add ids).
//!
//! Why deferred: reading the indices back to validate them would add a host synchronisation to
//! every training step (the targets of a language model live on the GPU), and the kernels cannot
//! return an error themselves. So each op launches a one-block `index_check` kernel that writes
//! the first bad index (position, value, bound, which op) into a 4-element slot per device,
//! unless an earlier error is already recorded there; the ops stay memory-safe meanwhile (the
//! gathers clamp bad ids, cross-entropy gives NaN for that row). The slot is read at the next
//! point where the host waits for the device anyway — any read of device values (`to_vec_*`,
//! `to_device(Cpu)`, the loss's `item`) and `cuda::synchronize` — and the error is returned
//! from there, naming the op, the bad value and its position. Only when a check ran since the
//! last read (the device is "armed") does the read cost one extra 32-byte copy.
//!
//! Indices that come from host memory are still validated on the host before upload (an
//! immediate error at the op itself); this path is only for indices already on the device.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use sinter_cuda::ops::int::{self as ki, SLOT_LEN};
use sinter_cuda::{CudaDevice, DevSlice, DeviceBuffer, Pool};

use super::{device, op_err, OnOp};
use crate::backend::IndexUse;
use crate::{DType, Error, Result};

/// Wait until all queued work on device `ordinal` has finished (for timings).
/// Also returns the error of a bad device-resident index found since the last read (below).
pub fn synchronize(ordinal: usize) -> Result<()> {
    let dev = device(ordinal)?;
    dev.synchronize().map_err(op_err("synchronize"))?;
    take_error(&dev)
}

/// The error message for a recorded bad index.
pub(crate) fn describe(pos: usize, value: i64, bound: usize, tag: i64, ordinal: usize) -> String {
    let when = format!(
        "found on cuda:{ordinal} by a device-side check and reported at the next read of device values"
    );
    match IndexUse::from_code(tag) {
        Some(IndexUse::CrossEntropy) => format!(
            "cross_entropy: target {value} at position {pos} is not a class index in 0..{bound} (nor the ignore index) ({when}); fix the targets or the number of classes"
        ),
        Some(IndexUse::IndexSelect) => format!(
            "index_select: index {value} at position {pos} is outside 0..{bound} ({when})"
        ),
        Some(IndexUse::IndexAdd) => format!(
            "index_add: index {value} at position {pos} is outside 0..{bound} ({when})"
        ),
        None => format!("an index {value} at position {pos} is outside 0..{bound} ({when})"),
    }
}

struct DeviceSlot {
    slot: Arc<DeviceBuffer>,
    armed: AtomicBool,
}

fn slots() -> std::sync::MutexGuard<'static, HashMap<usize, Arc<DeviceSlot>>> {
    static SLOTS: OnceLock<Mutex<HashMap<usize, Arc<DeviceSlot>>>> = OnceLock::new();
    SLOTS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// The slot of `dev`, created (32 bytes, permanent pool) by the first check on it.
fn slot_of(dev: &CudaDevice) -> Result<Arc<DeviceSlot>> {
    let mut map = slots();
    if let Some(s) = map.get(&dev.ordinal()) {
        return Ok(s.clone());
    }
    // Permanent: it lives as long as the process and must not fragment the activation pool.
    let buf = dev
        .alloc_zeros(SLOT_LEN, DType::I64, Pool::Permanent)
        .on("index check")?;
    let s = Arc::new(DeviceSlot {
        slot: Arc::new(buf),
        armed: AtomicBool::new(false),
    });
    map.insert(dev.ordinal(), s.clone());
    Ok(s)
}

/// Queues the check of device indices `idx` against [0, bound) (`ignore` passes too).
pub(crate) fn check_indices(
    dev: &CudaDevice,
    idx: DevSlice<'_>,
    bound: usize,
    ignore: Option<i64>,
    what: IndexUse,
) -> Result<()> {
    if idx.is_empty() {
        return Ok(());
    }
    let s = slot_of(dev)?;
    ki::index_check(dev, idx, bound, ignore, what as i64, s.slot.as_slice()).on("index check")?;
    s.armed.store(true, Ordering::Release);
    Ok(())
}

/// Returns the error recorded on `dev` since the last call, if any (and clears it). Costs a
/// 32-byte read only when a check ran since then.
pub(crate) fn take_error(dev: &CudaDevice) -> Result<()> {
    // No check ever ran on this device: nothing to read (and nothing allocated).
    let Some(s) = slots().get(&dev.ordinal()).cloned() else {
        return Ok(());
    };
    if !s.armed.swap(false, Ordering::AcqRel) {
        return Ok(());
    }
    let v: Vec<i64> = dev.dtoh(s.slot.as_slice()).on("index check")?;
    if let Some((pos, value, bound, tag)) = ki::decode_slot(&v) {
        dev.zero(s.slot.as_slice()).on("index check")?;
        return Err(Error::Msg(describe(pos, value, bound, tag, dev.ordinal())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_op_value_and_position() {
        let m = describe(3, 17, 10, IndexUse::CrossEntropy as i64, 0);
        assert!(
            m.starts_with("cross_entropy: target 17 at position 3"),
            "{m}"
        );
        assert!(m.contains("0..10") && m.contains("cuda:0"), "{m}");
        let m = describe(0, -1, 5, IndexUse::IndexSelect as i64, 1);
        assert!(
            m.starts_with("index_select: index -1 at position 0 is outside 0..5"),
            "{m}"
        );
        let m = describe(2, 9, 4, IndexUse::IndexAdd as i64, 0);
        assert!(m.starts_with("index_add: index 9 at position 2"), "{m}");
        assert!(describe(1, 2, 3, 99, 0).contains("index 2 at position 1"));
    }
}
