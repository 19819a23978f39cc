//! Kernel launch plans, computed without a device.
//!
//! Every op wrapper first builds a [`Launch`] (kernel name, grid, block, argument list) with pure
//! code, then [`CudaDevice::run`](crate::CudaDevice::run) submits it. Keeping the plan pure means
//! grids and argument lists are unit-tested on the CPU, and the NVRTC test checks every planned
//! kernel's name and argument types against the compiled PTX — the closest thing to running the
//! kernels that a machine without a GPU can do.

pub use crate::emulated::cost::Traffic;
use crate::emulated::cost::{Call, OpClass};
use crate::error::{CudaError, Result};
use crate::nvrtc::{KernelFile, PtxParam};

/// Threads per block for elementwise kernels.
pub const ELEMWISE_BLOCK: u32 = 256;
/// Maximum dims of a strided operand (must match `SINTER_MAX_DIMS` in common.cuh).
pub const MAX_DIMS: usize = 6;

/// The device facts a plan depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchTarget {
    pub sm_count: u32,
}

impl LaunchTarget {
    /// Grid cap for grid-stride kernels: four waves of full occupancy (2048 threads per SM).
    pub fn max_blocks(&self, block: u32) -> u32 {
        (self.sm_count.max(1) * (2048 / block.clamp(32, 1024)) * 4).max(1)
    }

    /// Blocks for `items` work items (one per thread) with `block` threads, capped for grid-stride.
    pub fn grid_for(&self, items: usize, block: u32) -> u32 {
        let need = items.div_ceil(block as usize).max(1);
        need.min(self.max_blocks(block) as usize) as u32
    }

    /// Grid for an elementwise kernel over `n` elements of `elem_size` bytes: each thread moves one
    /// 128-bit pack per iteration on the fast path.
    pub fn elementwise_grid(&self, n: usize, elem_size: usize) -> u32 {
        let per_thread = (16 / elem_size.max(1)).max(1);
        self.grid_for(n.div_ceil(per_thread), ELEMWISE_BLOCK)
    }
}

/// Row-group shape for a kernel that reduces rows of length `n`: `blockDim.x` threads per row
/// (a power of two from 32 to 1024, about 8 elements per thread) and `blockDim.y` rows per block,
/// with 256 threads per block unless a row needs more.
pub fn row_block(n: usize) -> (u32, u32) {
    let bx = (n.div_ceil(8)).next_power_of_two().clamp(32, 1024) as u32;
    let by = (256 / bx).max(1);
    (bx, by)
}

/// Grid for `rows` rows handled `by` rows per block (grid-stride beyond the cap).
pub fn rows_grid(t: &LaunchTarget, rows: usize, by: u32, block_threads: u32) -> u32 {
    let need = rows.div_ceil(by as usize).max(1);
    need.min(t.max_blocks(block_threads) as usize) as u32
}

/// Strided-operand description passed by value to the *_strided kernels. Layout must match
/// `struct StridedMeta` in kernels/common.cuh (200 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StridedMeta {
    pub shape: [i64; MAX_DIMS],
    pub strides: [[i64; MAX_DIMS]; 3],
    pub ndim: i32,
    pub pad: i32,
}
// SAFETY: plain-old-data, repr(C), matches the CUDA struct.
unsafe impl cudarc::driver::DeviceRepr for StridedMeta {}

/// Merge dims that are contiguous with their inner neighbour in every operand and drop size-1
/// dims. Returns (shape, per-operand strides), outermost first. A 0-dim result is one element.
pub fn coalesce(shape: &[usize], strides: &[&[i64]]) -> (Vec<usize>, Vec<Vec<i64>>) {
    let k = strides.len();
    let mut out_shape: Vec<usize> = Vec::new();
    let mut out_strides: Vec<Vec<i64>> = vec![Vec::new(); k];
    for d in (0..shape.len()).rev() {
        let s = shape[d];
        if s == 1 {
            continue;
        }
        if let Some(&inner) = out_shape.last() {
            let mergeable = (0..k).all(|o| {
                strides[o][d] == out_strides[o].last().copied().unwrap_or(0) * inner as i64
            });
            if mergeable {
                *out_shape.last_mut().expect("nonempty") *= s;
                continue;
            }
        }
        out_shape.push(s);
        for o in 0..k {
            out_strides[o].push(strides[o][d]);
        }
    }
    out_shape.reverse();
    for s in &mut out_strides {
        s.reverse();
    }
    (out_shape, out_strides)
}

/// Row-major (contiguous) strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<i64> {
    let mut st = vec![0i64; shape.len()];
    let mut acc = 1i64;
    for d in (0..shape.len()).rev() {
        st[d] = acc;
        acc *= shape[d] as i64;
    }
    st
}

/// True when a coalesced operand is plain contiguous memory.
pub fn is_contiguous_coalesced(shape: &[usize], strides: &[i64]) -> bool {
    shape.is_empty() || (shape.len() == 1 && strides[0] == 1)
}

impl StridedMeta {
    /// Build from a coalesced problem (at most 6 dims, at most 3 operands).
    pub fn new(shape: &[usize], strides: &[Vec<i64>]) -> Result<Self> {
        if shape.len() > MAX_DIMS {
            return Err(CudaError::invalid(
                "strided",
                format!("{} dims remain after merging contiguous dims; at most {MAX_DIMS} are supported", shape.len()),
            ));
        }
        if strides.len() > 3 {
            return Err(CudaError::invalid("strided", "at most 3 strided operands"));
        }
        let mut m = StridedMeta {
            ndim: shape.len() as i32,
            ..Default::default()
        };
        for (d, &s) in shape.iter().enumerate() {
            m.shape[d] = s as i64;
            for (o, st) in strides.iter().enumerate() {
                m.strides[o][d] = st[d];
            }
        }
        Ok(m)
    }
}

/// Check that a strided view (`shape`, element `strides`, all >= 0) stays inside `len` elements.
pub fn check_strided_bounds(
    op: &'static str,
    what: &str,
    len: usize,
    shape: &[usize],
    strides: &[i64],
) -> Result<()> {
    if shape.len() != strides.len() {
        return Err(CudaError::invalid(
            op,
            format!("{what}: {} dims but {} strides", shape.len(), strides.len()),
        ));
    }
    if shape.contains(&0) {
        return Ok(());
    }
    let mut max_off: i64 = 0;
    for (&s, &st) in shape.iter().zip(strides) {
        if st < 0 {
            return Err(CudaError::invalid(
                op,
                format!("{what}: negative strides are not supported ({strides:?})"),
            ));
        }
        max_off += (s as i64 - 1) * st;
    }
    if max_off as u64 >= len as u64 {
        return Err(CudaError::invalid(
            op,
            format!("{what}: shape {shape:?} with strides {strides:?} reaches element {max_off} of {len}"),
        ));
    }
    Ok(())
}

/// One kernel argument, by value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    /// A device pointer (0 = null).
    Ptr(u64),
    I64(i64),
    U64(u64),
    I32(i32),
    F32(f32),
    Strided(StridedMeta),
    /// A C struct passed by value (`struct ConvMeta` of conv.cu, …): see [`ArgBytes`].
    Bytes(ArgBytes),
}

impl Arg {
    /// The argument that passes `v` by value, as the kernel's C struct of the same layout.
    pub fn bytes<T: KernelStruct>(v: &T) -> Arg {
        Arg::Bytes(ArgBytes::of(v))
    }
}

/// A `#[repr(C)]` struct a kernel takes by value, laid out as its C counterpart.
///
/// # Safety
/// The type must be plain data without padding bytes (every byte of a value initialised: fill
/// gaps with explicit `pad` fields) and at most [`ARG_BYTES_MAX`] bytes.
pub unsafe trait KernelStruct: Copy + 'static {}

/// Largest by-value struct argument (CUDA takes 4 KiB of parameters in all).
pub const ARG_BYTES_MAX: usize = 256;

/// The bytes of a by-value struct argument: what the drivers pass and the emulator reads, so
/// the launch layer needs no type of the ops that define the structs.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, align(16))]
pub struct ArgBytes {
    bytes: [u8; ARG_BYTES_MAX],
    len: usize,
}

impl ArgBytes {
    /// The bytes of `v`.
    pub fn of<T: KernelStruct>(v: &T) -> ArgBytes {
        let len = std::mem::size_of::<T>();
        assert!(
            len <= ARG_BYTES_MAX,
            "a kernel struct argument of {len} bytes exceeds {ARG_BYTES_MAX}"
        );
        let mut bytes = [0u8; ARG_BYTES_MAX];
        // SAFETY: `T: KernelStruct` is plain data without padding, so its `len` bytes are
        // initialised; `bytes` holds at least `len`.
        unsafe {
            std::ptr::copy_nonoverlapping(v as *const T as *const u8, bytes.as_mut_ptr(), len)
        };
        ArgBytes { bytes, len }
    }

    /// `len` zero bytes: a struct's size without its values (the plan samples the NVRTC test
    /// compares with the compiled kernels' parameters).
    pub fn zeroed(len: usize) -> ArgBytes {
        assert!(
            len <= ARG_BYTES_MAX,
            "a kernel struct argument of {len} bytes exceeds {ARG_BYTES_MAX}"
        );
        ArgBytes {
            bytes: [0; ARG_BYTES_MAX],
            len,
        }
    }

    /// The struct's bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl std::fmt::Debug for ArgBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "struct of {} bytes", self.len)
    }
}

// SAFETY: repr(C) with the bytes first: the parameter pointer cudarc passes is the struct's.
unsafe impl cudarc::driver::DeviceRepr for ArgBytes {}
// SAFETY: repr(C), 200 bytes of i64/i32 fields without gaps (see its definition).
unsafe impl KernelStruct for StridedMeta {}

/// The ABI class of an argument, comparable with a parsed PTX parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamKind {
    B64,
    B32,
    F32,
    Bytes(usize),
}

impl Arg {
    pub fn kind(&self) -> ParamKind {
        match self {
            Arg::Ptr(_) | Arg::I64(_) | Arg::U64(_) => ParamKind::B64,
            Arg::I32(_) => ParamKind::B32,
            Arg::F32(_) => ParamKind::F32,
            Arg::Strided(_) => ParamKind::Bytes(std::mem::size_of::<StridedMeta>()),
            Arg::Bytes(b) => ParamKind::Bytes(b.len),
        }
    }
}

impl ParamKind {
    /// Does a PTX parameter have this ABI class?
    pub fn matches(&self, p: &PtxParam) -> bool {
        matches!(
            (self, p),
            (ParamKind::B64, PtxParam::B64)
                | (ParamKind::B32, PtxParam::B32)
                | (ParamKind::F32, PtxParam::F32)
        ) || matches!((self, p), (ParamKind::Bytes(a), PtxParam::Bytes(b)) if a == b)
    }
}

/// A planned kernel launch.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    /// The built-in kernel file of the kernel; None for a kernel of a source handed over with
    /// the launch ([`CudaDevice::launch_user`](crate::CudaDevice::launch_user)).
    pub file: Option<KernelFile>,
    pub name: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_mem: u32,
    pub args: Vec<Arg>,
    /// What the launch moves and computes, as the plan knows it from its shapes: declared
    /// once per op where the plan is built (a future table of plans carries it as a column).
    /// None: [`Launch::estimate`] guesses it.
    pub traffic: Option<Traffic>,
}

impl Launch {
    /// A 1-D launch (of a built-in kernel file, or None: of a source given beside).
    pub fn new(
        file: impl Into<Option<KernelFile>>,
        name: impl Into<String>,
        grid: u32,
        block: u32,
        args: Vec<Arg>,
    ) -> Self {
        Launch {
            file: file.into(),
            name: name.into(),
            grid: (grid, 1, 1),
            block: (block, 1, 1),
            shared_mem: 0,
            args,
            traffic: None,
        }
    }

    /// The built-in kernel file; an error for a kernel of a given source (which is launched
    /// with its source, [`CudaDevice::launch_user`](crate::CudaDevice::launch_user)).
    pub fn built_in_file(&self) -> Result<KernelFile> {
        self.file.ok_or_else(|| {
            CudaError::invalid(
                "launch",
                format!(
                    "kernel `{}` is not in a built-in kernel file: launch it with its source (launch_user)",
                    self.name
                ),
            )
        })
    }

    /// The same launch with its memory traffic and arithmetic declared.
    pub fn with_traffic(mut self, t: Traffic) -> Self {
        self.traffic = Some(t);
        self
    }

    /// The class of work a kernel of `file` does, for the GPU cost model (one rule for every
    /// launch plan).
    pub fn class(&self) -> OpClass {
        let Some(file) = self.file else {
            // A kernel of a given source declares its class with its traffic; the estimate is
            // an elementwise kernel's.
            return OpClass::Elementwise;
        };
        match file {
            KernelFile::Copy => OpClass::Copy,
            KernelFile::Reduce | KernelFile::Embedding => OpClass::Row,
            KernelFile::Unary
            | KernelFile::Binary
            | KernelFile::Conv
            | KernelFile::Dropout
            | KernelFile::Int
            | KernelFile::Bool => OpClass::Elementwise,
        }
    }

    /// The fall-back for a plan that declares no traffic: `n` elements (the plan's first i64
    /// argument, else one per launched thread) of the name's dtype, read through every
    /// pointer argument but the last and written through the last. Right for plain
    /// elementwise kernels, rough for anything else: declare the traffic in the plan instead.
    pub fn estimate(&self) -> Traffic {
        let ptrs = self
            .args
            .iter()
            .filter(|a| matches!(a, Arg::Ptr(p) if *p != 0))
            .count() as u64;
        let threads = self.grid.0 as u64
            * self.grid.1 as u64
            * self.grid.2 as u64
            * self.threads_per_block() as u64;
        let n = self
            .args
            .iter()
            .find_map(|a| match a {
                Arg::I64(v) if *v > 0 => Some(*v as u64),
                _ => None,
            })
            .unwrap_or(threads);
        let elem = match self.name.rsplit('_').next().unwrap_or("") {
            "f16" | "bf16" => 2,
            "i64" | "f64" => 8,
            "u8" | "bool" | "i8" => 1,
            _ => 4,
        };
        let bytes = n * elem;
        Traffic {
            read: bytes * ptrs.saturating_sub(1),
            written: bytes * ptrs.min(1),
            flops: n,
            tensor_flops: 0,
        }
    }

    /// What the cost model records for this launch: the declared traffic, else the estimate.
    pub fn cost(&self) -> Call {
        let (traffic, declared) = match self.traffic {
            Some(t) => (t, true),
            None => (self.estimate(), false),
        };
        Call {
            declared,
            ..Call::new(self.name.clone(), self.class(), traffic)
        }
    }

    pub fn threads_per_block(&self) -> u32 {
        self.block.0 * self.block.1 * self.block.2
    }
    /// Sanity limits of the hardware (every NVIDIA GPU since sm_35).
    pub fn validate(&self) -> Result<()> {
        let (gx, gy, gz) = self.grid;
        let ok = gx >= 1
            && gy >= 1
            && gz >= 1
            && gx <= i32::MAX as u32
            && gy <= 65535
            && gz <= 65535
            && self.threads_per_block() >= 1
            && self.threads_per_block() <= 1024;
        if ok {
            Ok(())
        } else {
            Err(CudaError::invalid(
                "launch",
                format!(
                    "{}: grid {:?} block {:?} out of limits",
                    self.name, self.grid, self.block
                ),
            ))
        }
    }
}

/// One step of an op: a kernel, zero-filling device memory, or a device-to-device copy.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Kernel(Launch),
    Zero { ptr: u64, bytes: usize },
    Copy { src: u64, dst: u64, bytes: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids() {
        let t = LaunchTarget { sm_count: 132 };
        assert_eq!(t.max_blocks(256), 132 * 8 * 4);
        assert_eq!(t.grid_for(0, 256), 1);
        assert_eq!(t.grid_for(256, 256), 1);
        assert_eq!(t.grid_for(257, 256), 2);
        assert_eq!(t.grid_for(1 << 40, 256), 132 * 8 * 4);
        // f32: 4 per thread; bf16: 8 per thread.
        assert_eq!(t.elementwise_grid(1024, 4), 1);
        assert_eq!(t.elementwise_grid(1025, 4), 2);
        assert_eq!(t.elementwise_grid(2048, 2), 1);
        assert_eq!(t.elementwise_grid(8 * 256 * 10, 2), 10);
    }

    #[test]
    fn row_blocks() {
        assert_eq!(row_block(1), (32, 8));
        assert_eq!(row_block(10), (32, 8));
        assert_eq!(row_block(256), (32, 8));
        assert_eq!(row_block(257), (64, 4));
        assert_eq!(row_block(768), (128, 2));
        assert_eq!(row_block(4096), (512, 1));
        assert_eq!(row_block(50257), (1024, 1));
        for n in [1usize, 33, 100, 1000, 5000, 100000] {
            let (bx, by) = row_block(n);
            assert!(bx % 32 == 0 && bx * by <= 1024 && (bx * by) / 32 <= 32);
        }
        let t = LaunchTarget { sm_count: 100 };
        assert_eq!(rows_grid(&t, 10, 8, 256), 2);
        assert_eq!(rows_grid(&t, 16, 8, 256), 2);
        assert_eq!(rows_grid(&t, 1 << 30, 1, 1024), t.max_blocks(1024));
    }

    #[test]
    fn coalescing() {
        // Contiguous [2,3,4] -> one dim.
        let c = contiguous_strides(&[2, 3, 4]);
        assert_eq!(c, vec![12, 4, 1]);
        let (s, st) = coalesce(&[2, 3, 4], &[&c, &c]);
        assert_eq!(s, vec![24]);
        assert_eq!(st, vec![vec![1], vec![1]]);
        assert!(is_contiguous_coalesced(&s, &st[0]));
        // Bias broadcast over rows: a [4, 8] + b [8] (strides [0, 1]).
        let (s, st) = coalesce(&[4, 8], &[&[8, 1], &[0, 1]]);
        assert_eq!(s, vec![4, 8]);
        assert_eq!(st, vec![vec![8, 1], vec![0, 1]]);
        // Size-1 dims vanish; [2,1,3] contiguous.
        let (s, st) = coalesce(&[2, 1, 3], &[&[3, 3, 1]]);
        assert_eq!((s, st), (vec![6], vec![vec![1]]));
        // Transposed last two dims of [5, 3, 4]: strides [12, 1, 3] — cannot merge the last two.
        let (s, st) = coalesce(&[5, 3, 4], &[&[12, 1, 3], &[12, 4, 1]]);
        assert_eq!(s, vec![5, 3, 4]);
        assert_eq!(st[0], vec![12, 1, 3]);
        // All ones -> zero dims (a single element).
        let (s, st) = coalesce(&[1, 1], &[&[5, 7]]);
        assert!(s.is_empty() && st[0].is_empty());
        // A slice of a wider row: [4, 8] view with row stride 10 -> stays 2-D.
        let (s, _) = coalesce(&[4, 8], &[&[10, 1]]);
        assert_eq!(s, vec![4, 8]);
    }

    #[test]
    fn strided_meta_and_bounds() {
        let m = StridedMeta::new(&[4, 8], &[vec![8, 1], vec![0, 1]]).unwrap();
        assert_eq!(m.ndim, 2);
        assert_eq!(m.shape[..2], [4, 8]);
        assert_eq!(m.strides[1][..2], [0, 1]);
        assert_eq!(std::mem::size_of::<StridedMeta>(), 200);
        assert!(StridedMeta::new(&[2; 7], &[vec![1; 7]]).is_err());
        assert!(check_strided_bounds("t", "a", 32, &[4, 8], &[8, 1]).is_ok());
        assert!(check_strided_bounds("t", "a", 31, &[4, 8], &[8, 1]).is_err());
        assert!(check_strided_bounds("t", "a", 8, &[4, 8], &[0, 1]).is_ok());
        assert!(check_strided_bounds("t", "a", 100, &[4, 8], &[-8, 1]).is_err());
        assert!(check_strided_bounds("t", "a", 0, &[0, 8], &[8, 1]).is_ok());
    }

    #[test]
    fn launch_limits() {
        let l = Launch::new(KernelFile::Unary, "neg_f32", 10, 256, vec![]);
        assert!(l.validate().is_ok());
        let mut bad = l.clone();
        bad.block = (64, 32, 1);
        assert!(bad.validate().is_err());
        let mut bad = l;
        bad.grid = (1, 70000, 1);
        assert!(bad.validate().is_err());
    }

    #[test]
    fn arg_kinds_match_ptx() {
        assert!(Arg::Ptr(0).kind().matches(&PtxParam::B64));
        assert!(Arg::I32(0).kind().matches(&PtxParam::B32));
        assert!(!Arg::I32(0).kind().matches(&PtxParam::B64));
        assert!(Arg::F32(0.0).kind().matches(&PtxParam::F32));
        assert!(Arg::Strided(StridedMeta::default())
            .kind()
            .matches(&PtxParam::Bytes(200)));
        assert!(!Arg::Strided(StridedMeta::default())
            .kind()
            .matches(&PtxParam::Bytes(192)));
    }

    #[test]
    fn the_estimate_reads_every_pointer_but_the_last_and_writes_the_last() {
        let l = Launch::new(
            KernelFile::Binary,
            "add_bf16",
            4,
            256,
            vec![Arg::Ptr(256), Arg::Ptr(512), Arg::Ptr(768), Arg::I64(1000)],
        );
        let t = l.estimate();
        assert_eq!((t.read, t.written), (2 * 2 * 1000, 2 * 1000));
        // Null pointers (absent optional operands) move nothing.
        let l = Launch::new(
            KernelFile::Unary,
            "neg_f32",
            2,
            128,
            vec![Arg::Ptr(256), Arg::Ptr(0), Arg::Ptr(512)],
        );
        let t = l.estimate();
        assert_eq!((t.read, t.written), (4 * 256, 4 * 256), "n = threads");
        assert!(!l.cost().declared);
        let d = l.with_traffic(Traffic::bytes(7, 9));
        let c = d.cost();
        assert!(c.declared);
        assert_eq!((c.traffic.read, c.traffic.written), (7, 9));
        assert_eq!(c.class, crate::emulated::cost::OpClass::Elementwise);
    }

    #[test]
    fn plans_declare_the_traffic_their_shapes_imply() {
        use crate::dtype::DType;
        use crate::ops::binary::{plan_binary_strided, BinaryOp, StridedIn};
        use crate::ops::fake_slice;
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
        let c = l.cost();
        assert!(c.declared);
        assert_eq!(c.traffic.read, (64 * 48 + 48) * 2);
        assert_eq!(c.traffic.written, 64 * 48 * 2);
    }
}
