//! What each piece of device work costs: bytes read and written and FLOPs (CUDA-core or
//! tensor-core), per kernel launch and per library call, recorded by the emulated device when
//! asked ([`start_recording`]) and turned into a predicted GPU time by [`super::gpu_model`].
//!
//! Where the numbers come from, one place per kind of work:
//! - **kernels**: the [`Traffic`] the op's plan declares from its shapes
//!   (`Launch::traffic`); a plan that declares nothing gets `Launch::estimate`'s guess from its
//!   argument list (the table marks those rows "estimated");
//! - **cuBLASLt GEMMs**: `GemmDesc::cost`, from the descriptor (2·m·n·k FLOPs per matrix;
//!   A, B, C once each, C read too when β ≠ 0, bias and aux);
//! - **cuDNN convolutions**: `emulated::dnn::conv_cost`, from the problem;
//! - **memsets, device copies, host↔device copies**: their byte counts (here).
//!
//! This module names nothing else of the crate (a leaf), so the driver, plans and library
//! wrappers can all build its [`Call`]s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The memory traffic and arithmetic of one launch or library call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes read from device memory (each operand once: caches are not modelled).
    pub read: u64,
    /// Bytes written to device memory.
    pub written: u64,
    /// Floating-point operations on CUDA cores (a multiply-add counts 2).
    pub flops: u64,
    /// Floating-point operations on tensor cores (a multiply-add counts 2).
    pub tensor_flops: u64,
}

impl Traffic {
    /// `read` and `written` bytes, no arithmetic worth counting.
    pub fn bytes(read: usize, written: usize) -> Self {
        Traffic {
            read: read as u64,
            written: written as u64,
            ..Traffic::default()
        }
    }

    /// The same traffic with `flops` CUDA-core operations.
    pub fn with_flops(mut self, flops: usize) -> Self {
        self.flops = flops as u64;
        self
    }

    /// The same traffic with `flops` tensor-core operations.
    pub fn with_tensor_flops(mut self, flops: usize) -> Self {
        self.tensor_flops = flops as u64;
        self
    }
}

/// The kind of work, which decides the efficiency the GPU model applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpClass {
    /// Elementwise kernels: casts, arithmetic, activations, dropout, the optimizer.
    Elementwise,
    /// Row kernels: reductions, softmax, layer norm, cross-entropy, embedding.
    Row,
    /// cuBLASLt matmuls.
    Gemm,
    /// Fused attention kernels.
    Attention,
    /// cuDNN convolutions.
    Conv,
    /// Device-to-device copies (and strided copy kernels).
    Copy,
    /// Memsets.
    Memset,
    /// Host-to-device and device-to-host copies.
    HostCopy,
}

impl OpClass {
    pub fn name(self) -> &'static str {
        match self {
            OpClass::Elementwise => "elementwise",
            OpClass::Row => "row",
            OpClass::Gemm => "gemm",
            OpClass::Attention => "attention",
            OpClass::Conv => "conv",
            OpClass::Copy => "copy",
            OpClass::Memset => "memset",
            OpClass::HostCopy => "host copy",
        }
    }
}

/// The shape facts of a GEMM the GPU model's efficiency depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmDims {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub batch: usize,
    /// True when cuBLASLt can use its 16-byte-aligned kernels: m, n and k multiples of
    /// 16 bytes' worth of elements (see RESULTS.md: vocab 50257 ran 6.8x slower than 50264).
    pub aligned: bool,
    pub math: GemmMath,
}

/// Which units a GEMM's products run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmMath {
    /// FP32 on CUDA cores.
    Fp32,
    /// TF32 tensor cores.
    Tf32,
    /// bf16/fp16 tensor cores.
    Half,
}

/// One recorded piece of device work.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// Kernel name, or the library call with its shape (`gemm bf16 16384x2304x768`).
    pub key: String,
    pub class: OpClass,
    pub traffic: Traffic,
    /// False when [`estimate`] guessed the traffic (the plan declares none).
    pub declared: bool,
    /// Run as part of a CUDA graph replay (no per-launch host overhead).
    pub in_graph: bool,
    /// Set for GEMMs.
    pub gemm: Option<GemmDims>,
}

impl Call {
    pub fn new(key: String, class: OpClass, traffic: Traffic) -> Call {
        Call {
            key,
            class,
            traffic,
            declared: true,
            in_graph: false,
            gemm: None,
        }
    }
}

/// A memset of `bytes`.
pub fn memset_cost(bytes: usize) -> Call {
    Call::new("memset".into(), OpClass::Memset, Traffic::bytes(0, bytes))
}

/// A device-to-device copy of `bytes`.
pub fn copy_cost(bytes: usize) -> Call {
    Call::new(
        "memcpy DtoD".into(),
        OpClass::Copy,
        Traffic::bytes(bytes, bytes),
    )
}

/// A host-to-device (`to_device`) or device-to-host copy of `bytes`.
pub fn host_copy_cost(bytes: usize, to_device: bool) -> Call {
    let key = if to_device {
        "memcpy HtoD"
    } else {
        "memcpy DtoH"
    };
    Call::new(key.into(), OpClass::HostCopy, Traffic::bytes(bytes, bytes))
}

static RECORDING: AtomicBool = AtomicBool::new(false);
static CALLS: Mutex<Vec<(usize, Call)>> = Mutex::new(Vec::new());

fn calls() -> std::sync::MutexGuard<'static, Vec<(usize, Call)>> {
    CALLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Start recording the work every emulated device runs (dropping what was recorded before).
/// Recording is off by default: a long emulated run would otherwise keep every call.
pub fn start_recording() {
    calls().clear();
    RECORDING.store(true, Ordering::SeqCst);
}

/// Stop recording; returns what device `ordinal` ran since [`start_recording`], in order
/// (what other devices ran is dropped).
pub fn stop_recording(ordinal: usize) -> Vec<Call> {
    RECORDING.store(false, Ordering::SeqCst);
    take(ordinal)
}

/// What device `ordinal` ran since the last take (recording goes on).
pub fn take(ordinal: usize) -> Vec<Call> {
    let all = std::mem::take(&mut *calls());
    all.into_iter()
        .filter(|(o, _)| *o == ordinal)
        .map(|(_, c)| c)
        .collect()
}

pub(crate) fn recording() -> bool {
    RECORDING.load(Ordering::Relaxed)
}

/// Record `c` for device `ordinal` when recording is on.
pub(crate) fn record(ordinal: usize, c: impl FnOnce() -> Call) {
    if recording() {
        let c = c();
        calls().push((ordinal, c));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_and_memsets_cost_their_bytes_and_recording_is_opt_in() {
        let c = copy_cost(1000);
        assert_eq!(
            (c.traffic.read, c.traffic.written, c.class),
            (1000, 1000, OpClass::Copy)
        );
        let m = memset_cost(64);
        assert_eq!((m.traffic.read, m.traffic.written), (0, 64));
        let h = host_copy_cost(8, true);
        assert_eq!(
            (h.key.as_str(), h.class),
            ("memcpy HtoD", OpClass::HostCopy)
        );
        let t = Traffic::bytes(3, 4).with_flops(5).with_tensor_flops(6);
        assert_eq!((t.read, t.written, t.flops, t.tensor_flops), (3, 4, 5, 6));
    }
}
