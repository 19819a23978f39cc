//! The emulated CUDA device: sinter-cuda's real kernels and library calls on the CPU, under the
//! same [`CudaDevice`](crate::CudaDevice) API, so everything above the driver layer (allocator,
//! launch plans, sinter-core's CUDA storage, autograd, the trainer, NCCL data parallel) runs
//! unchanged. Selected explicitly (`SINTER_CUDA_EMU=1` or `=N`, or
//! [`enable_emulation`](crate::runtime::enable_emulation)); never a fall-back. Not a GPU.
//!
//! - **Memory** ([`memory`]): host allocations, 256-byte aligned, 0xFF-filled when fresh, under a
//!   fixed capacity (`SINTER_CUDA_EMU_MEMORY_GIB`, default 4); device pointers are host
//!   addresses, so copies and memsets are host `memcpy`/`memset`.
//! - **Work** ([`queue`]): one worker thread per device runs everything in submission order
//!   while the host goes on; events are positions in that order. `CUDA_LAUNCH_BLOCKING=1` makes
//!   every call wait for its work (errors then surface at the call that caused them).
//! - **Kernels**: each [`Launch`] plan runs in the kernel emulator ([`crate::emu`]: every file
//!   compiled once with the host C++ compiler and cached on disk, threads as fibers, barrier and
//!   warp checks), on a device of [`SM_COUNT`] SMs so grid-stride loops iterate. The plan is
//!   checked (kernel name, argument sizes, launch limits) when it is queued.
//!   `SINTER_CUDA_EMU_ORDER=reverse` runs the threads of every block in reverse order.
//! - **cuBLASLt** ([`blas`]) and **cuDNN** ([`dnn`]): host reference implementations of the same
//!   descriptors. **NCCL** ([`collective`]): collectives between ranks (threads or processes on
//!   one machine) over loopback TCP.
//! - **CUDA graphs**: capturing records the compute stream's work instead of running it (the
//!   allocator's capture mode is unchanged); a replay runs the recorded work again, reading the
//!   buffers' current contents.

pub(crate) mod blas;
pub(crate) mod collective;
pub(crate) mod dnn;
mod memory;
mod queue;

use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::alloc::RawAlloc;
use crate::cudnn::{ConvProblem, Pass};
use crate::driver::{Stream, StreamImpl};
use crate::emu::{Emulator, Order, ResolvedKernel};
use crate::error::{CudaError, Result};
use crate::gemm::GemmDesc;
use crate::launch::Launch;
use crate::nvrtc::KernelFile;
use crate::runtime::DeviceInfo;
use crate::user_kernel::KernelSource;

use blas::GemmJob;
use dnn::ConvJob;
use queue::{Job, Queue};

/// SMs of an emulated device: few, so grid-stride loops run more than one sweep.
pub const SM_COUNT: u32 = 2;
/// Compute capability an emulated device reports (bf16 and WMMA are emulated).
pub const COMPUTE_CAPABILITY: (u32, u32) = (8, 0);
/// The name every emulated device reports.
pub const DEVICE_NAME: &str = "emulated CUDA device (CPU kernel emulator); not a GPU";
/// Device memory of an emulated device unless `SINTER_CUDA_EMU_MEMORY_GIB` says otherwise.
pub const DEFAULT_MEMORY_GIB: usize = 4;
/// The most dynamic shared memory a launch may ask for without the per-function opt-in
/// (`cudaFuncAttributeMaxDynamicSharedMemorySize`), which sinter does not set.
pub const MAX_DEFAULT_DYNAMIC_SHARED: u32 = 48 << 10;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's kernel emulator, or why there is none (no C++ compiler).
pub(crate) fn emulator() -> Result<Arc<Emulator>> {
    static EMU: OnceLock<std::result::Result<Arc<Emulator>, String>> = OnceLock::new();
    EMU.get_or_init(|| {
        Emulator::new(crate::emu::default_cache_dir())
            .map(Arc::new)
            .map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|e| CudaError::Emulator {
        op: "setup",
        msg: format!(
            "the emulated CUDA device was selected ({}), but it cannot run here: {e}",
            selection()
        ),
    })
}

/// How the emulated device was selected, for messages.
fn selection() -> String {
    match std::env::var(crate::runtime::EMU_VAR) {
        Ok(v) if !v.is_empty() && v != "0" => format!("{}={v}", crate::runtime::EMU_VAR),
        _ => "enable_emulation".into(),
    }
}

/// Bytes of device memory per emulated device.
pub fn memory_capacity() -> usize {
    let gib = std::env::var("SINTER_CUDA_EMU_MEMORY_GIB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&g| g > 0)
        .unwrap_or(DEFAULT_MEMORY_GIB);
    gib << 30
}

/// What an emulated device reports about itself.
pub(crate) fn device_info(ordinal: usize) -> DeviceInfo {
    DeviceInfo {
        ordinal,
        name: DEVICE_NAME.into(),
        total_memory: memory_capacity(),
        compute_capability: COMPUTE_CAPABILITY,
        multiprocessors: SM_COUNT,
        driver_version: None,
        cuda_runtime_version: None,
        nvrtc_version: None,
        cublas_version: None,
        cudnn_version: None,
        nccl_version: None,
    }
}

/// `sinter info`'s CUDA section when the devices are emulated.
pub(crate) fn report(devices: usize) -> String {
    let mut out = String::from("sinter CUDA report\n");
    let _ = writeln!(
        out,
        "  mode     {DEVICE_NAME}: {devices} device(s), selected by {}",
        selection()
    );
    match emulator() {
        Ok(e) => {
            let _ = writeln!(
                out,
                "  kernels  the real kernels/*.cu, built by {} for the CPU kernel emulator (cache: {})",
                e.compiler().display(),
                crate::emu::default_cache_dir().display()
            );
            let _ = writeln!(out, "  cuBLASLt served by a host reference GEMM");
            let _ = writeln!(
                out,
                "  cuDNN    served by a host reference convolution (SINTER_CONV=im2col runs im2col + GEMM instead)"
            );
            let _ = writeln!(
                out,
                "  NCCL     served by host collectives over loopback TCP (ranks on this machine)"
            );
            let _ = writeln!(out, "  devices: {devices}");
            for i in 0..devices {
                let d = device_info(i);
                let _ = writeln!(
                    out,
                    "    [{i}] {}  {:.1} GiB of host memory  {}  {} SMs",
                    d.name,
                    d.total_memory as f64 / (1u64 << 30) as f64,
                    d.arch(),
                    d.multiprocessors
                );
            }
            let _ = writeln!(
                out,
                "  status: CUDA available, EMULATED on the CPU: not a GPU (no real timing, concurrency or vendor-library numerics)"
            );
        }
        Err(e) => {
            let _ = writeln!(out, "  status: CUDA NOT available: {e}");
            let _ = writeln!(
                out,
                "to fix:\n  - install g++ (or set SINTER_EMU_CXX to a C++20 compiler), or unset {}",
                crate::runtime::EMU_VAR
            );
        }
    }
    out
}

/// A launch asking for more dynamic shared memory than a GPU grants without the per-function
/// opt-in fails there; it fails here too.
fn check_shared_mem(l: &Launch) -> Result<()> {
    if l.shared_mem > MAX_DEFAULT_DYNAMIC_SHARED {
        return Err(CudaError::Driver {
            op: "cuLaunchKernel",
            msg: format!(
                "{}: {} bytes of dynamic shared memory need the function's MaxDynamicSharedMemorySize attribute raised first (CUDA_ERROR_INVALID_VALUE)",
                l.name, l.shared_mem
            ),
        });
    }
    Ok(())
}

/// One piece of device work that a graph can record and replay.
#[derive(Clone)]
pub(crate) enum Recorded {
    Kernel(Arc<(Launch, ResolvedKernel)>),
    Zero { ptr: u64, bytes: usize },
    Copy { src: u64, dst: u64, bytes: usize },
    Gemm(GemmJob),
    Conv(ConvJob),
    Graph(Arc<[Recorded]>),
}

impl Recorded {
    /// Run it on host memory.
    ///
    /// # Safety
    /// Every address must be live memory of the device, as the stream order guarantees for
    /// work that was valid when it was queued.
    unsafe fn run(&self, order: Order) -> std::result::Result<(), String> {
        // SAFETY: forwarded to the caller.
        unsafe {
            match self {
                Recorded::Kernel(k) => k.1.run(&k.0, order).map_err(|e| e.to_string()),
                Recorded::Zero { ptr, bytes } => {
                    std::ptr::write_bytes(*ptr as *mut u8, 0, *bytes);
                    Ok(())
                }
                Recorded::Copy { src, dst, bytes } => {
                    std::ptr::copy(*src as *const u8, *dst as *mut u8, *bytes);
                    Ok(())
                }
                Recorded::Gemm(g) => {
                    g.run();
                    Ok(())
                }
                Recorded::Conv(c) => c.run().map_err(|e| e.to_string()),
                Recorded::Graph(ops) => ops.iter().try_for_each(|op| op.run(order)),
            }
        }
    }
}

/// State shared by a device's driver and its stream handles.
struct Shared {
    ordinal: usize,
    queue: Arc<Queue>,
    /// The compute stream's recording while a graph is being captured.
    capture: Mutex<Option<Vec<Recorded>>>,
    order: Order,
    blocking: bool,
}

impl Shared {
    fn capturing(&self) -> bool {
        lock(&self.capture).is_some()
    }

    /// Queue `r` on the compute stream, or record it when a capture is in progress.
    fn enqueue(&self, r: Recorded) -> Result<()> {
        {
            let mut cap = lock(&self.capture);
            if let Some(list) = cap.as_mut() {
                list.push(r);
                return Ok(());
            }
            let order = self.order;
            // SAFETY: the work was valid when queued; stream order keeps its memory live.
            self.queue
                .submit(Box::new(move || unsafe { r.run(order) }))?;
        }
        self.after_submit()
    }

    fn after_submit(&self) -> Result<()> {
        if self.blocking {
            self.queue.synchronize()
        } else {
            Ok(())
        }
    }

    fn not_in_capture(&self, op: &str) -> Result<()> {
        if self.capturing() {
            return Err(CudaError::Emulator {
                op: "capture",
                msg: format!(
                    "{op} on the compute stream of emulated device {} while it is being captured into a CUDA graph: only kernels, device copies, memsets, GEMMs and convolutions can be captured here",
                    self.ordinal
                ),
            });
        }
        Ok(())
    }
}

/// A stream of an emulated device. Every stream feeds the device's one queue (see [`queue`]);
/// only the compute stream is captured into graphs.
#[derive(Clone)]
pub(crate) struct EmuStream {
    shared: Arc<Shared>,
    compute: bool,
}

impl EmuStream {
    pub(crate) fn ordinal(&self) -> usize {
        self.shared.ordinal
    }

    pub(crate) fn record_event(&self) -> Result<EmuEvent> {
        if self.compute {
            self.shared.not_in_capture("an event record")?;
        }
        Ok(EmuEvent {
            queue: self.shared.queue.clone(),
            ordinal: self.shared.ordinal,
            seq: self.shared.queue.last_submitted(),
        })
    }

    /// Nothing to do (one queue orders everything), but the event must be this device's.
    pub(crate) fn wait(&self, e: &EmuEvent) -> Result<()> {
        if self.compute {
            self.shared.not_in_capture("an event wait")?;
        }
        if e.ordinal != self.shared.ordinal {
            return Err(CudaError::invalid(
                "stream wait",
                format!(
                    "an event of emulated device {} cannot order a stream of emulated device {}",
                    e.ordinal, self.shared.ordinal
                ),
            ));
        }
        Ok(())
    }

    pub(crate) fn synchronize(&self) -> Result<()> {
        self.shared.queue.synchronize()
    }

    /// Queue host work on this stream (the emulated collectives).
    pub(crate) fn submit(&self, job: Job) -> Result<()> {
        if self.compute {
            self.shared.not_in_capture("a collective")?;
        }
        self.shared.queue.submit(job)?;
        self.shared.after_submit()
    }
}

/// A position in an emulated device's queue.
pub(crate) struct EmuEvent {
    queue: Arc<Queue>,
    ordinal: usize,
    seq: u64,
}

impl EmuEvent {
    pub(crate) fn query(&self) -> Result<bool> {
        self.queue.is_complete(self.seq)
    }
}

/// A captured graph of an emulated device.
pub(crate) struct EmuGraph {
    shared: Arc<Shared>,
    ops: Arc<[Recorded]>,
}

impl EmuGraph {
    pub(crate) fn launch(&self) -> Result<()> {
        self.shared.enqueue(Recorded::Graph(self.ops.clone()))
    }
}

/// The driver of one emulated device.
pub(crate) struct EmuDriver {
    shared: Arc<Shared>,
    stream: Stream,
    emulator: Arc<Emulator>,
}

impl Drop for EmuDriver {
    fn drop(&mut self) {
        self.shared.queue.close();
    }
}

impl EmuDriver {
    /// Emulated device `ordinal` and its raw allocator.
    pub(crate) fn new(ordinal: usize) -> Result<(EmuDriver, Box<dyn RawAlloc>)> {
        let emulator = emulator()?;
        let queue = Queue::start(ordinal)?;
        let order = match std::env::var("SINTER_CUDA_EMU_ORDER").as_deref() {
            Ok("reverse") => Order::Reverse,
            _ => Order::Forward,
        };
        let shared = Arc::new(Shared {
            ordinal,
            queue: queue.clone(),
            capture: Mutex::default(),
            order,
            blocking: std::env::var("CUDA_LAUNCH_BLOCKING").as_deref() == Ok("1"),
        });
        let raw = memory::HostMemory::new(ordinal, memory_capacity(), queue);
        let stream = Stream(StreamImpl::Emulated(EmuStream {
            shared: shared.clone(),
            compute: true,
        }));
        Ok((
            EmuDriver {
                shared,
                stream,
                emulator,
            },
            Box::new(raw),
        ))
    }

    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    pub(crate) fn new_stream(&self) -> Stream {
        Stream(StreamImpl::Emulated(EmuStream {
            shared: self.shared.clone(),
            compute: false,
        }))
    }

    pub(crate) fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<()> {
        self.shared.enqueue(Recorded::Zero { ptr, bytes })
    }

    pub(crate) fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.shared.enqueue(Recorded::Copy { src, dst, bytes })
    }

    /// Like a copy from pageable memory: the bytes are staged now, written in stream order.
    pub(crate) fn copy_htod(&self, src: &[u8], dst: u64) -> Result<()> {
        self.shared.not_in_capture("a host-to-device copy")?;
        let staged = src.to_vec();
        self.shared.queue.submit(Box::new(move || {
            // SAFETY: `dst` addresses `staged.len()` bytes of a live buffer (checked by the
            // caller); stream order keeps it live until this runs.
            unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, staged.len()) };
            Ok(())
        }))?;
        self.shared.after_submit()
    }

    pub(crate) fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.shared.queue.synchronize()?;
        // SAFETY: `src` addresses `dst.len()` bytes of a live buffer (checked by the caller),
        // and every queued write to it has run.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    pub(crate) fn launch(&self, l: &Launch) -> Result<()> {
        check_shared_mem(l)?;
        let k = self.emulator.resolve(l)?;
        self.shared
            .enqueue(Recorded::Kernel(Arc::new((l.clone(), k))))
    }

    /// Launch `l`'s kernel from a custom source (built for the emulator once per text).
    pub(crate) fn launch_user(&self, src: &KernelSource, l: &Launch) -> Result<()> {
        check_shared_mem(l)?;
        let lib = self
            .emulator
            .library_from_source(&src.emu_stem(), src.program_source())?;
        let k = Emulator::resolve_in(&lib, l)?;
        self.shared
            .enqueue(Recorded::Kernel(Arc::new((l.clone(), k))))
    }

    pub(crate) fn preload_kernels(&self) -> Result<()> {
        for f in KernelFile::ALL {
            self.emulator.library(f)?;
        }
        Ok(())
    }

    /// cuBLASLt's matmul, served on the host.
    pub(crate) fn gemm(&self, g: &GemmDesc<'_>) -> Result<()> {
        let job = GemmJob::new(g)?;
        self.shared.enqueue(Recorded::Gemm(job))
    }

    /// A cuDNN convolution pass, served on the host (operands checked by the caller).
    pub(crate) fn conv(&self, p: &ConvProblem, pass: Pass, a: u64, b: u64, out: u64) -> Result<()> {
        self.shared
            .enqueue(Recorded::Conv(ConvJob::new(p, pass, a, b, out)))
    }

    pub(crate) fn begin_capture(&self) -> Result<()> {
        let mut cap = lock(&self.shared.capture);
        if cap.is_some() {
            return Err(CudaError::invalid(
                "cuStreamBeginCapture",
                "the stream is already being captured",
            ));
        }
        *cap = Some(Vec::new());
        Ok(())
    }

    /// The recorded graph, or None when nothing was recorded (or no capture was running).
    pub(crate) fn end_capture(&self) -> Option<EmuGraph> {
        let ops = lock(&self.shared.capture).take()?;
        (!ops.is_empty()).then(|| EmuGraph {
            shared: self.shared.clone(),
            ops: ops.into(),
        })
    }
}
