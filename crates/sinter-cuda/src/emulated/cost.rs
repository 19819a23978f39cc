//! What each piece of device work costs: bytes read and written and FLOPs (CUDA-core or
//! tensor-core), per kernel launch and per library call, recorded by the emulated device when
//! asked ([`start_recording`]) and turned into a predicted GPU time by [`super::gpu_model`].
//!
//! Where the numbers come from, one place per kind of work:
//! - **kernels**: the [`Traffic`] the op's plan declares from its shapes ([`Launch::traffic`]);
//!   a plan that declares nothing gets [`estimate`]'s guess from its argument list (the
//!   table's `declared` column says which);
//! - **cuBLASLt GEMMs**: [`gemm_cost`], from the descriptor (2·m·n·k tensor-core FLOPs per
//!   matrix; A, B, C read once, C read again when β ≠ 0, bias and aux);
//! - **cuDNN convolutions**: [`conv_cost`], from the problem;
//! - **memsets, device copies, host↔device copies**: their byte counts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::cudnn::{ConvProblem, Pass};
use crate::gemm::{Epilogue, GemmDType, GemmDesc};
use crate::launch::{Arg, Launch, Traffic};
use crate::nvrtc::KernelFile;

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

    /// The class of a kernel of `file` (one rule for every launch plan).
    pub fn of_kernel(file: KernelFile) -> OpClass {
        match file {
            KernelFile::FlashAttention => OpClass::Attention,
            KernelFile::Copy => OpClass::Copy,
            KernelFile::Reduce
            | KernelFile::Softmax
            | KernelFile::LayerNorm
            | KernelFile::CrossEntropy
            | KernelFile::Embedding
            | KernelFile::ResidualLayerNorm => OpClass::Row,
            KernelFile::Int8Gemm => OpClass::Gemm,
            KernelFile::Unary
            | KernelFile::Binary
            | KernelFile::Conv
            | KernelFile::Dropout
            | KernelFile::AdamW
            | KernelFile::Int
            | KernelFile::Bool => OpClass::Elementwise,
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
    pub dtype: GemmDType,
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
    fn new(key: String, class: OpClass, traffic: Traffic) -> Call {
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

/// The cost of a kernel launch: what its plan declares, else [`estimate`].
pub fn launch_cost(l: &Launch) -> Call {
    let (traffic, declared) = match l.traffic {
        Some(t) => (t, true),
        None => (estimate(l), false),
    };
    Call {
        declared,
        ..Call::new(l.name.clone(), OpClass::of_kernel(l.file), traffic)
    }
}

/// Element size implied by a kernel name's dtype suffix (4 when it names none).
fn elem_size_of_name(name: &str) -> u64 {
    let last = name.rsplit('_').next().unwrap_or("");
    match last {
        "f16" | "bf16" => 2,
        "i64" | "f64" => 8,
        "u8" | "bool" | "i8" => 1,
        _ => 4,
    }
}

/// The fall-back for a plan that declares no traffic: `n` elements (the plan's first i64
/// argument, else one per launched thread) of the name's dtype, read through every pointer
/// argument but the last and written through the last. Right for plain elementwise kernels,
/// rough for anything else: declare the traffic in the plan instead.
pub fn estimate(l: &Launch) -> Traffic {
    let ptrs = l
        .args
        .iter()
        .filter(|a| matches!(a, Arg::Ptr(p) if *p != 0))
        .count() as u64;
    let threads =
        l.grid.0 as u64 * l.grid.1 as u64 * l.grid.2 as u64 * l.threads_per_block() as u64;
    let n = l
        .args
        .iter()
        .find_map(|a| match a {
            Arg::I64(v) if *v > 0 => Some(*v as u64),
            _ => None,
        })
        .unwrap_or(threads);
    let bytes = n * elem_size_of_name(&l.name);
    Traffic {
        read: bytes * ptrs.saturating_sub(1),
        written: bytes * ptrs.min(1),
        flops: n,
        tensor_flops: 0,
    }
}

/// A 16-byte-aligned dimension for cuBLASLt's fast kernels.
fn gemm_dim_aligned(v: usize, elem: usize) -> bool {
    (v * elem).is_multiple_of(16)
}

/// The cost of a cuBLASLt call: 2·m·n·k FLOPs per matrix (tensor cores unless FP32 math);
/// A, B and C once each, C read too when β ≠ 0, the bias read, the aux written.
pub fn gemm_cost(g: &GemmDesc<'_>) -> Call {
    let s = &g.shape;
    let elem = g.dtype.storage().size();
    let b = s.batch.max(1);
    let mn = s.m * s.n * b;
    let read = (s.m * s.k + s.k * s.n) * b + if g.beta != 0.0 { mn } else { 0 };
    let (bias, aux) = match g.epilogue {
        Epilogue::None | Epilogue::Gelu => (0, 0),
        Epilogue::Bias(_) | Epilogue::BiasGelu(_) => (s.n, 0),
        Epilogue::BiasGeluAux { .. } => (s.n, mn),
    };
    let flops = 2 * s.m * s.n * s.k * b;
    let traffic = Traffic::bytes((read + bias) * elem, (mn + aux) * elem);
    let traffic = if g.dtype == GemmDType::F32 {
        traffic.with_flops(flops)
    } else {
        traffic.with_tensor_flops(flops)
    };
    let epi = match g.epilogue {
        Epilogue::None => "",
        Epilogue::Bias(_) => " +bias",
        Epilogue::BiasGelu(_) => " +bias+gelu",
        Epilogue::Gelu => " +gelu",
        Epilogue::BiasGeluAux { .. } => " +bias+gelu+aux",
    };
    let batch = if b > 1 {
        format!(" x{b}")
    } else {
        String::new()
    };
    let key = format!(
        "gemm {} {}x{}x{}{batch}{}{epi}",
        g.dtype.storage(),
        s.m,
        s.n,
        s.k,
        match (s.trans_a, s.trans_b) {
            (false, false) => "",
            (true, false) => " Aᵀ",
            (false, true) => " Bᵀ",
            (true, true) => " AᵀBᵀ",
        }
    );
    Call {
        gemm: Some(GemmDims {
            m: s.m,
            n: s.n,
            k: s.k,
            batch: b,
            aligned: [s.m, s.n, s.k].iter().all(|&v| gemm_dim_aligned(v, elem)),
            dtype: g.dtype,
        }),
        ..Call::new(key, OpClass::Gemm, traffic)
    }
}

/// The cost of a cuDNN convolution pass: 2·N·O·(C/groups)·kh·kw·oh·ow FLOPs (tensor cores for
/// half types and TF32), every operand once.
pub(crate) fn conv_cost(p: &ConvProblem, pass: Pass) -> Call {
    let (oh, ow) = p.out_hw().unwrap_or((0, 0));
    let elem = p.dtype.size();
    let x = p.n * p.c * p.h * p.w;
    let w = p.o * (p.c / p.groups.max(1)) * p.kh * p.kw;
    let y = p.n * p.o * oh * ow;
    let flops = 2 * y * (p.c / p.groups.max(1)) * p.kh * p.kw;
    let (read, written, name) = match pass {
        Pass::Forward => (x + w, y, "fwd"),
        Pass::BackwardData => (y + w, x, "bwd-data"),
        Pass::BackwardFilter => (y + x, w, "bwd-filter"),
    };
    let t = Traffic::bytes(read * elem, written * elem);
    let tensor = p.dtype != crate::dtype::DType::F32 || p.allow_tf32;
    let t = if tensor {
        t.with_tensor_flops(flops)
    } else {
        t.with_flops(flops)
    };
    let key = format!(
        "conv {name} {} {}x{}x{}x{} k{}x{} o{}",
        p.dtype, p.n, p.c, p.h, p.w, p.kh, p.kw, p.o
    );
    Call::new(key, OpClass::Conv, t)
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
    fn the_estimate_reads_every_pointer_but_the_last_and_writes_the_last() {
        let l = Launch::new(
            KernelFile::Binary,
            "add_bf16",
            4,
            256,
            vec![Arg::Ptr(256), Arg::Ptr(512), Arg::Ptr(768), Arg::I64(1000)],
        );
        let t = estimate(&l);
        assert_eq!((t.read, t.written), (2 * 2 * 1000, 2 * 1000));
        // Null pointers (absent optional operands) move nothing.
        let l = Launch::new(
            KernelFile::Unary,
            "neg_f32",
            2,
            128,
            vec![Arg::Ptr(256), Arg::Ptr(0), Arg::Ptr(512)],
        );
        let t = estimate(&l);
        assert_eq!((t.read, t.written), (4 * 256, 4 * 256), "n = threads");
        assert!(!launch_cost(&l).declared);
        let d = l.with_traffic(Traffic::bytes(7, 9));
        let c = launch_cost(&d);
        assert!(c.declared);
        assert_eq!((c.traffic.read, c.traffic.written), (7, 9));
        assert_eq!(c.class, OpClass::Elementwise);
    }

    #[test]
    fn plans_declare_the_traffic_their_shapes_imply() {
        use crate::dtype::DType;
        use crate::launch::LaunchTarget;
        use crate::ops::binary::{plan_binary_strided, BinaryOp, StridedIn};
        use crate::ops::fake_slice;
        use crate::ops::flash_attention::{plan_flash_forward, AttnShape, AttnView};
        let t = LaunchTarget { sm_count: 132 };
        // A bias broadcast over rows: x [64, 48] + b [48], bf16. The bias is read once.
        let (x, bias, out) = (
            fake_slice(DType::BF16, 64 * 48),
            fake_slice(DType::BF16, 48),
            fake_slice(DType::BF16, 64 * 48),
        );
        let l = plan_binary_strided(
            &t,
            BinaryOp::Add,
            StridedIn {
                data: x,
                strides: &[48, 1],
            },
            StridedIn {
                data: bias,
                strides: &[0, 1],
            },
            out,
            &[64, 48],
        )
        .unwrap()
        .unwrap();
        let c = launch_cost(&l);
        assert!(c.declared);
        assert_eq!(c.traffic.read, (64 * 48 + 48) * 2);
        assert_eq!(c.traffic.written, 64 * 48 * 2);
        // Causal flash attention forward, b 2, h 3, T 128, d 64: 4·b·h·T²·d / 2 tensor FLOPs;
        // q, k, v read and o written once (bf16), plus the f32 log-sum-exp.
        let s = AttnShape {
            b: 2,
            h: 3,
            tq: 128,
            tk: 128,
            d: 64,
            causal: true,
            scale: 0.125,
        };
        let elems = 2 * 3 * 128 * 64;
        let view = || AttnView {
            data: fake_slice(DType::BF16, elems),
            strides: [3 * 128 * 64, 128 * 64, 64],
        };
        let lse = fake_slice(DType::F32, 2 * 3 * 128);
        let l = plan_flash_forward(&t, &s, view(), view(), view(), view(), lse)
            .unwrap()
            .unwrap();
        let c = launch_cost(&l);
        assert_eq!(c.class, OpClass::Attention);
        assert_eq!(
            c.traffic.tensor_flops,
            (4 * 2 * 3 * 128 * 128 * 64 / 2) as u64
        );
        assert_eq!(c.traffic.read, (3 * elems * 2) as u64);
        assert_eq!(c.traffic.written, (elems * 2 + 2 * 3 * 128 * 4) as u64);
    }
}
