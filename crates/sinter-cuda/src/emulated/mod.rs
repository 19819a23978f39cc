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
//! - **cuBLASLt** ([`blas`]) and **cuDNN** ([`dnn`], fused attention in [`sdpa`]): host
//!   reference implementations of the same descriptors. **NCCL** ([`collective`]): collectives between ranks (threads or processes on
//!   one machine) over loopback TCP.
//! - **CUDA graphs**: capturing records the compute stream's work instead of running it (the
//!   allocator's capture mode is unchanged); a replay runs the recorded work again, reading the
//!   buffers' current contents.
//! - **Cost** ([`cost`], [`gpu_model`]): when recording, every launch and library call is
//!   recorded with its bytes and FLOPs, which a named GPU's model turns into a predicted
//!   time; in **trace-only mode** ([`trace`]) nothing runs and memory is virtual, so a full
//!   GPT-2 step is recorded in seconds (`sinter bench gpu-model`).

pub(crate) mod blas;
pub(crate) mod collective;
pub mod cost;
pub(crate) mod dnn;
pub mod gpu_model;
mod memory;
mod queue;
pub mod sdpa;
pub mod trace;

use std::any::Any;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::alloc::RawAlloc;
use crate::cudnn::{ConvProblem, Pass};
use crate::driver::{foreign_event, Driver, DriverOps, Event, EventOps, GraphExec, GraphOps};
use crate::driver::{Stream, StreamOps};
use crate::emu::{Emulator, Order, ResolvedKernel};
use crate::error::{CudaError, Result};
use crate::gemm::GemmDesc;
use crate::launch::Launch;
use crate::mode::DeviceInfo;
use crate::nvrtc::KernelFile;
use crate::user_kernel::KernelSource;

use blas::GemmJob;
use cost::Call;
use dnn::ConvJob;
use queue::{Job, Queue};
use sdpa::SdpaJob;
pub use trace::trace_gpu;

/// Make every emulated device of this process a trace-only device shaped like `gpu` (its
/// name, memory, SM count and compute capability; see [`trace`]), and select emulated
/// devices. Must come before the first use of CUDA; asking again for the same GPU is fine.
pub fn enable_trace(gpu: gpu_model::GpuSpec) -> Result<()> {
    trace::set_gpu(gpu)?;
    crate::mode::select_emulation(1)?;
    ready()
}

/// Whether emulated devices can be served here: always in trace-only mode (nothing runs),
/// else when the kernel emulator can run (a C++ compiler is present).
pub(crate) fn ready() -> Result<()> {
    if trace_gpu().is_some() {
        return Ok(());
    }
    emulator().map(|_| ())
}

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
    match std::env::var(crate::mode::EMU_VAR) {
        Ok(v) if !v.is_empty() && v != "0" => format!("{}={v}", crate::mode::EMU_VAR),
        _ => "enable_emulation".into(),
    }
}

/// Bytes of device memory per emulated device (the traced GPU's in trace-only mode).
pub fn memory_capacity() -> usize {
    if let Some(g) = trace_gpu() {
        return g.memory;
    }
    let gib = std::env::var("SINTER_CUDA_EMU_MEMORY_GIB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&g| g > 0)
        .unwrap_or(DEFAULT_MEMORY_GIB);
    gib << 30
}

/// What an emulated device reports about itself.
pub(crate) fn device_info(ordinal: usize) -> DeviceInfo {
    let (name, cc, sms) = match trace_gpu() {
        Some(g) => (
            format!("trace-only emulated {} (nothing runs; not a GPU)", g.name),
            g.compute_capability,
            g.sm_count,
        ),
        None => (DEVICE_NAME.into(), COMPUTE_CAPABILITY, SM_COUNT),
    };
    DeviceInfo {
        ordinal,
        name,
        total_memory: memory_capacity(),
        compute_capability: cc,
        multiprocessors: sms,
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
                "  cuDNN    served by a host reference convolution (SINTER_CONV=im2col runs im2col + GEMM instead) and fused attention (SINTER_CUDA_EMU_CUDNN sets the version it reports)"
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
                crate::mode::EMU_VAR
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
    /// A launch of a trace-only device (never run).
    Traced,
    Zero {
        ptr: u64,
        bytes: usize,
    },
    Copy {
        src: u64,
        dst: u64,
        bytes: usize,
    },
    Gemm(GemmJob),
    Conv(ConvJob),
    Sdpa(SdpaJob),
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
                Recorded::Traced => Ok(()),
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
                Recorded::Sdpa(a) => {
                    a.run();
                    Ok(())
                }
                Recorded::Graph(ops) => ops.iter().try_for_each(|op| op.run(order)),
            }
        }
    }
}

/// State shared by a device's driver and its stream handles.
struct Shared {
    ordinal: usize,
    queue: Arc<Queue>,
    /// The compute stream's recording while a graph is being captured, with each piece's cost.
    capture: Mutex<Option<(Vec<Recorded>, Vec<Call>)>>,
    order: Order,
    blocking: bool,
    /// Trace-only: record, run nothing.
    trace: bool,
}

impl Shared {
    fn capturing(&self) -> bool {
        lock(&self.capture).is_some()
    }

    /// Queue `r` on the compute stream, or record it when a capture is in progress; `cost`
    /// says what it moves and computes (see [`cost`]).
    fn enqueue(&self, r: Recorded, cost: impl FnOnce() -> Call) -> Result<()> {
        let mut cap = lock(&self.capture);
        if let Some((list, costs)) = cap.as_mut() {
            list.push(r);
            costs.push(cost());
            return Ok(());
        }
        cost::record(self.ordinal, cost);
        self.submit_unrecorded(r, cap)
    }

    /// Queue `r` (already recorded) unless trace-only.
    fn submit_unrecorded(
        &self,
        r: Recorded,
        cap: MutexGuard<'_, Option<(Vec<Recorded>, Vec<Call>)>>,
    ) -> Result<()> {
        if self.trace {
            return Ok(());
        }
        {
            let _held = cap;
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
                    "{op} on the compute stream of emulated device {} while it is being captured into a CUDA graph: only kernels, device copies, memsets, GEMMs, convolutions and cuDNN attention can be captured here",
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
    /// The emulated stream of `s` (None when it is a real GPU's).
    pub(crate) fn of(s: &Stream) -> Option<&EmuStream> {
        s.0.as_any().downcast_ref()
    }

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
        if self.shared.trace {
            return Err(CudaError::Emulator {
                op: "trace",
                msg: "collectives are not traced: a trace-only device records one device's work"
                    .into(),
            });
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
    costs: Arc<[Call]>,
}

impl EmuGraph {
    pub(crate) fn launch(&self) -> Result<()> {
        let s = &self.shared;
        let mut cap = lock(&s.capture);
        if let Some((list, costs)) = cap.as_mut() {
            // Launched inside another capture: the outer graph replays this one, and records
            // its work each time.
            list.push(Recorded::Graph(self.ops.clone()));
            costs.extend(self.costs.iter().cloned());
            return Ok(());
        }
        for c in self.costs.iter() {
            cost::record(s.ordinal, || Call {
                in_graph: true,
                ..c.clone()
            });
        }
        s.submit_unrecorded(Recorded::Graph(self.ops.clone()), cap)
    }
}

impl StreamOps for EmuStream {
    fn record_event(&self) -> Result<Event> {
        Ok(Event(Box::new(EmuStream::record_event(self)?)))
    }

    fn wait(&self, event: &Event) -> Result<()> {
        let e = event.0.as_any().downcast_ref::<EmuEvent>();
        EmuStream::wait(self, e.ok_or_else(foreign_event)?)
    }

    fn synchronize(&self) -> Result<()> {
        EmuStream::synchronize(self)
    }

    fn describe(&self) -> String {
        format!("emulated device {}", self.ordinal())
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl EventOps for EmuEvent {
    fn query(&self) -> Result<bool> {
        EmuEvent::query(self)
    }

    fn describe(&self) -> &'static str {
        "emulated"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl GraphOps for EmuGraph {
    fn launch(&self) -> Result<()> {
        EmuGraph::launch(self)
    }
}

/// The driver of one emulated device.
pub(crate) struct EmuDriver {
    shared: Arc<Shared>,
    stream: Stream,
    /// None in trace-only mode (no kernel runs, no compiler needed).
    emulator: Option<Arc<Emulator>>,
}

impl Drop for EmuDriver {
    fn drop(&mut self) {
        self.shared.queue.close();
    }
}

impl EmuDriver {
    /// The emulated device's driver of `d` (None when it is a real GPU's).
    pub(crate) fn of(d: &Driver) -> Option<&EmuDriver> {
        d.as_any().downcast_ref()
    }

    /// Emulated device `ordinal` and its raw allocator.
    pub(crate) fn new(ordinal: usize) -> Result<(EmuDriver, Box<dyn RawAlloc>)> {
        let trace = trace_gpu().is_some();
        let emulator = if trace { None } else { Some(emulator()?) };
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
            trace,
        });
        let raw: Box<dyn RawAlloc> = if trace {
            Box::new(trace::VirtualMemory::new(ordinal, memory_capacity()))
        } else {
            Box::new(memory::HostMemory::new(ordinal, memory_capacity(), queue))
        };
        let stream = Stream(Arc::new(EmuStream {
            shared: shared.clone(),
            compute: true,
        }));
        Ok((
            EmuDriver {
                shared,
                stream,
                emulator,
            },
            raw,
        ))
    }

    /// The kernel emulator, or an error in trace-only mode (which runs nothing).
    fn emulator(&self) -> Result<&Arc<Emulator>> {
        self.emulator.as_ref().ok_or_else(|| CudaError::Emulator {
            op: "trace",
            msg: "a trace-only emulated device runs no kernels".into(),
        })
    }

    /// Launch `l`'s kernel from a custom source (built for the emulator once per text).
    pub(crate) fn launch_user(&self, src: &KernelSource, l: &Launch, cost: Call) -> Result<()> {
        check_shared_mem(l)?;
        let cost = || cost;
        if self.shared.trace {
            return self.shared.enqueue(Recorded::Traced, cost);
        }
        let lib = self
            .emulator()?
            .library_from_source(&src.emu_stem(), src.program_source())?;
        let k = Emulator::resolve_in(&lib, l)?;
        self.shared
            .enqueue(Recorded::Kernel(Arc::new((l.clone(), k))), cost)
    }

    /// cuBLASLt's matmul, served on the host.
    pub(crate) fn gemm(&self, g: &GemmDesc<'_>) -> Result<()> {
        let job = GemmJob::new(g)?;
        self.shared.enqueue(Recorded::Gemm(job), || g.cost())
    }

    /// A cuDNN convolution pass, served on the host (operands checked by the caller).
    pub(crate) fn conv(&self, p: &ConvProblem, pass: Pass, a: u64, b: u64, out: u64) -> Result<()> {
        self.shared
            .enqueue(Recorded::Conv(ConvJob::new(p, pass, a, b, out)), || {
                dnn::conv_cost(p, pass)
            })
    }

    /// A cuDNN fused attention call, served on the host (operands checked by the caller).
    pub(crate) fn sdpa(
        &self,
        graph: Arc<crate::cudnn::sdpa::graph::SdpaGraph>,
        ptrs: Vec<(crate::cudnn::sdpa::graph::Role, u64)>,
    ) -> Result<()> {
        let cost = sdpa::sdpa_cost(&graph);
        self.shared
            .enqueue(Recorded::Sdpa(SdpaJob::new(graph, ptrs)), || cost)
    }
}

impl DriverOps for EmuDriver {
    fn stream(&self) -> &Stream {
        &self.stream
    }

    fn new_stream(&self) -> Result<Stream> {
        Ok(Stream(Arc::new(EmuStream {
            shared: self.shared.clone(),
            compute: false,
        })))
    }

    fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<()> {
        self.shared
            .enqueue(Recorded::Zero { ptr, bytes }, || cost::memset_cost(bytes))
    }

    fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.shared.enqueue(Recorded::Copy { src, dst, bytes }, || {
            cost::copy_cost(bytes)
        })
    }

    /// Like a copy from pageable memory: the bytes are staged now, written in stream order.
    fn copy_htod(&self, src: &[u8], dst: u64) -> Result<()> {
        self.shared.not_in_capture("a host-to-device copy")?;
        cost::record(self.shared.ordinal, || {
            cost::host_copy_cost(src.len(), true)
        });
        if self.shared.trace {
            return Ok(());
        }
        let staged = src.to_vec();
        self.shared.queue.submit(Box::new(move || {
            // SAFETY: `dst` addresses `staged.len()` bytes of a live buffer (checked by the
            // caller); stream order keeps it live until this runs.
            unsafe { std::ptr::copy_nonoverlapping(staged.as_ptr(), dst as *mut u8, staged.len()) };
            Ok(())
        }))?;
        self.shared.after_submit()
    }

    fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        cost::record(self.shared.ordinal, || {
            cost::host_copy_cost(dst.len(), false)
        });
        if self.shared.trace {
            // Nothing ran: the value is meaningless, zeros say so least surprisingly.
            dst.fill(0);
            return Ok(());
        }
        self.shared.queue.synchronize()?;
        // SAFETY: `src` addresses `dst.len()` bytes of a live buffer (checked by the caller),
        // and every queued write to it has run.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn launch(&self, l: &Launch) -> Result<()> {
        check_shared_mem(l)?;
        let cost = || l.cost();
        if self.shared.trace {
            return self.shared.enqueue(Recorded::Traced, cost);
        }
        let k = self.emulator()?.resolve(l)?;
        self.shared
            .enqueue(Recorded::Kernel(Arc::new((l.clone(), k))), cost)
    }

    fn preload_kernels(&self) -> Result<()> {
        let Some(e) = &self.emulator else {
            return Ok(());
        };
        for f in KernelFile::ALL {
            e.library(f)?;
        }
        Ok(())
    }

    fn begin_capture(&self) -> Result<()> {
        let mut cap = lock(&self.shared.capture);
        if cap.is_some() {
            return Err(CudaError::invalid(
                "cuStreamBeginCapture",
                "the stream is already being captured",
            ));
        }
        *cap = Some((Vec::new(), Vec::new()));
        Ok(())
    }

    /// The recorded graph, or None when nothing was recorded (or no capture was running).
    fn end_capture(&self) -> Result<Option<GraphExec>> {
        let Some((ops, costs)) = lock(&self.shared.capture).take() else {
            return Ok(None);
        };
        if ops.is_empty() {
            return Ok(None);
        }
        let graph = EmuGraph {
            shared: self.shared.clone(),
            ops: ops.into(),
            costs: costs.into(),
        };
        Ok(Some(GraphExec(Box::new(graph))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
