//! A real GPU through the CUDA driver (cudarc): the primary context, the compute stream, the
//! kernel modules compiled by NVRTC, copies, launches and stream capture.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{
    result as dr, sys as ds, CudaContext, CudaEvent, CudaFunction, CudaGraph, CudaModule,
    CudaStream, LaunchConfig, PushKernelArg,
};

use super::{
    foreign_event, Driver, DriverOps, Event, EventOps, GraphExec, GraphOps, Stream, StreamOps,
};
use crate::alloc::{RawAlloc, RawAllocError};
use crate::error::{guard, CudaError, DriverResultExt, Result};
use crate::launch::{Arg, Launch};
use crate::libs::libraries;
use crate::mode::DeviceInfo;
use crate::nvrtc::{KernelCache, KernelFile, Output};
use crate::user_kernel::{CompiledPtx, KernelSource};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The allocator's device calls on a real GPU.
struct DeviceRaw {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    ordinal: usize,
}

impl RawAlloc for DeviceRaw {
    fn malloc(&self, bytes: usize) -> std::result::Result<u64, RawAllocError> {
        self.ctx
            .bind_to_thread()
            .ctx("cuCtxSetCurrent")
            .map_err(RawAllocError::Other)?;
        // SAFETY: plain allocation; the memory is uninitialised, which DeviceBuffer documents.
        match unsafe { dr::malloc_sync(bytes) } {
            Ok(p) => Ok(p),
            Err(e) if e.0 == ds::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(RawAllocError::OutOfMemory)
            }
            Err(e) => Err(RawAllocError::Other(CudaError::Driver {
                op: "cuMemAlloc",
                msg: format!("{e:?}"),
            })),
        }
    }
    fn free(&self, ptr: u64) -> Result<()> {
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: `ptr` came from malloc_sync and the allocator frees it once, after synchronising.
        unsafe { dr::free_sync(ptr) }.ctx("cuMemFree")
    }
    fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().ctx("cuStreamSynchronize")
    }
    fn ordinal(&self) -> usize {
        self.ordinal
    }
}

/// A custom kernel source's module and the functions looked up in it so far.
type UserModule = (Arc<CudaModule>, HashMap<String, CudaFunction>);

/// One GPU's context, compute stream and loaded kernels.
pub(crate) struct RealDriver {
    ctx: Arc<CudaContext>,
    stream: Stream,
    cu: Arc<CudaStream>,
    arch: String,
    driver_version: (u32, u32),
    cache: KernelCache,
    output: Output,
    modules: Mutex<HashMap<KernelFile, Arc<CudaModule>>>,
    functions: Mutex<HashMap<KernelFile, HashMap<String, CudaFunction>>>,
    /// Custom kernels ([`crate::user_kernel`]) by source id, then kernel name (boxed: rarely
    /// used).
    user_functions: Box<Mutex<HashMap<u128, UserModule>>>,
}

impl RealDriver {
    /// The driver of the GPU `info` describes, and its raw allocator.
    pub(crate) fn new(info: &DeviceInfo) -> Result<(RealDriver, Box<dyn RawAlloc>)> {
        let libs = libraries();
        for (ok, lib, hint) in [
            (
                libs.driver,
                "libcuda.so.1",
                "install the NVIDIA driver or add it to LD_LIBRARY_PATH",
            ),
            (
                libs.nvrtc,
                "libnvrtc.so.13",
                "add the CUDA lib folder to LD_LIBRARY_PATH (see `sinter info`)",
            ),
            (
                libs.cublaslt,
                "libcublasLt.so.13",
                "add the CUDA lib folder to LD_LIBRARY_PATH (see `sinter info`)",
            ),
        ] {
            if !ok {
                return Err(CudaError::LibraryNotFound {
                    lib,
                    hint: hint.into(),
                });
            }
        }
        let (ctx, cu) = guard(|| {
            let ctx = CudaContext::new(info.ordinal).ctx("cuDevicePrimaryCtxRetain")?;
            // SAFETY: sinter never uses cudarc's CudaSlice; ordering is by our single stream.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().ctx("cuStreamCreate")?;
            Ok((ctx, stream))
        })?;
        let raw = DeviceRaw {
            ctx: ctx.clone(),
            stream: cu.clone(),
            ordinal: info.ordinal,
        };
        let output = match std::env::var("SINTER_KERNEL_FORMAT").as_deref() {
            Ok("ptx") => Output::Ptx,
            _ => Output::Cubin,
        };
        let driver = RealDriver {
            ctx,
            stream: Stream(Arc::new(RealStream(cu.clone()))),
            cu,
            arch: info.arch(),
            driver_version: info.driver_version.unwrap_or((0, 0)),
            cache: KernelCache::from_env(),
            output,
            modules: Mutex::default(),
            functions: Mutex::default(),
            user_functions: Box::default(),
        };
        Ok((driver, Box::new(raw)))
    }

    /// Make the device's context current on this thread (cuBLASLt and cuDNN calls need it).
    pub(crate) fn bind(&self) -> Result<()> {
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")
    }

    /// The raw compute stream (for cuBLASLt and cuDNN).
    pub(crate) fn cu_stream(&self) -> ds::CUstream {
        self.cu.cu_stream()
    }

    /// The real GPU's driver of `d` (None when it is another kind).
    pub(crate) fn of(d: &Driver) -> Option<&RealDriver> {
        d.as_any().downcast_ref()
    }

    fn module(&self, file: KernelFile) -> Result<Arc<CudaModule>> {
        let mut mods = lock(&self.modules);
        if let Some(m) = mods.get(&file) {
            return Ok(m.clone());
        }
        let (bytes, _hit) = crate::nvrtc::load_or_compile(
            &self.cache,
            file,
            &self.arch,
            self.output,
            self.driver_version,
        )?;
        let ptx = match self.output {
            Output::Cubin => cudarc::nvrtc::Ptx::from_binary(bytes),
            Output::Ptx => {
                cudarc::nvrtc::Ptx::from_src(String::from_utf8_lossy(&bytes).into_owned())
            }
        };
        let m = guard(|| self.ctx.load_module(ptx).ctx("cuModuleLoadData"))?;
        mods.insert(file, m.clone());
        Ok(m)
    }

    fn function(&self, file: KernelFile, name: &str) -> Result<CudaFunction> {
        // Hot path (every launch): a lookup by &str, no allocation.
        if let Some(f) = lock(&self.functions).get(&file).and_then(|m| m.get(name)) {
            return Ok(f.clone());
        }
        let m = self.module(file)?;
        let f = guard(|| {
            m.load_function(name)
                .map_err(|e| CudaError::KernelNotFound {
                    file: file.file_name(),
                    name: name.to_string(),
                    msg: format!("{e:?}"),
                })
        })?;
        lock(&self.functions)
            .entry(file)
            .or_default()
            .insert(name.to_string(), f.clone());
        Ok(f)
    }

    /// Launch `l`'s kernel from a custom source (`compiled` is its PTX for this device, already
    /// checked against `l`); the module is loaded once per source.
    pub(crate) fn launch_user(
        &self,
        src: &KernelSource,
        compiled: &CompiledPtx,
        l: &Launch,
    ) -> Result<()> {
        let func = {
            let mut users = lock(&self.user_functions);
            let (module, funcs) = match users.entry(src.id()) {
                std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    let ptx = cudarc::nvrtc::Ptx::from_src(compiled.ptx.clone());
                    let m = guard(|| self.ctx.load_module(ptx).ctx("cuModuleLoadData"))?;
                    v.insert((m, HashMap::new()))
                }
            };
            match funcs.get(&l.name) {
                Some(f) => f.clone(),
                None => {
                    let f = guard(|| module.load_function(&l.name).ctx("cuModuleGetFunction"))?;
                    funcs.insert(l.name.clone(), f.clone());
                    f
                }
            }
        };
        self.launch_function(&func, l)
    }

    fn launch_function(&self, func: &CudaFunction, l: &Launch) -> Result<()> {
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_mem,
        };
        let mut b = self.cu.launch_builder(func);
        for a in &l.args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I64(v) => b.arg(v),
                Arg::U64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::Strided(m) => b.arg(m),
                Arg::Bytes(m) => b.arg(m),
            };
        }
        // SAFETY: the argument list was built by the op's plan and checked (by the NVRTC test)
        // against the kernel's compiled signature; buffer sizes were validated by the plan.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| CudaError::Driver {
                op: "cuLaunchKernel",
                msg: format!("{}: {e:?}", l.name),
            })
    }
}

impl DriverOps for RealDriver {
    fn stream(&self) -> &Stream {
        &self.stream
    }

    fn new_stream(&self) -> Result<Stream> {
        self.bind()?;
        let s = self.ctx.new_stream().ctx("cuStreamCreate")?;
        Ok(Stream(Arc::new(RealStream(s))))
    }

    fn memset_zero(&self, ptr: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: the range lies in a live allocation (DevSlice invariant); stream-ordered.
        unsafe { dr::memset_d8_async(ptr, 0, bytes, self.cu.cu_stream()) }.ctx("cuMemsetD8Async")
    }

    fn copy_dtod(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: both ranges lie in live allocations; stream-ordered.
        unsafe { dr::memcpy_dtod_async(dst, src, bytes, self.cu.cu_stream()) }
            .ctx("cuMemcpyDtoDAsync")
    }

    fn copy_htod(&self, src: &[u8], dst: u64) -> Result<()> {
        self.bind()?;
        let pinned = is_page_locked(src.as_ptr() as u64);
        // SAFETY: the caller checked the sizes. From pageable memory the driver stages `src`
        // before the call returns, so it may be reused at once (and the host need not wait for
        // the device's queue: a training step's batch upload does not stall it); page-locked
        // memory is read later by the copy engine, so then we synchronise before returning.
        unsafe { dr::memcpy_htod_async(dst, src, self.cu.cu_stream()) }.ctx("cuMemcpyHtoDAsync")?;
        if pinned {
            self.cu.synchronize().ctx("cuStreamSynchronize")?;
        }
        Ok(())
    }

    fn copy_dtoh(&self, src: u64, dst: &mut [u8]) -> Result<()> {
        self.bind()?;
        // SAFETY: the caller checked the sizes; synchronised before `dst` is used.
        unsafe { dr::memcpy_dtoh_async(dst, src, self.cu.cu_stream()) }.ctx("cuMemcpyDtoHAsync")?;
        self.cu.synchronize().ctx("cuStreamSynchronize")
    }

    fn launch(&self, l: &Launch) -> Result<()> {
        let func = self.function(l.built_in_file()?, &l.name)?;
        self.launch_function(&func, l)
    }

    fn preload_kernels(&self) -> Result<()> {
        for f in KernelFile::ALL {
            self.module(f)?;
        }
        Ok(())
    }

    fn begin_capture(&self) -> Result<()> {
        // Thread-local mode: calls that are unsafe during capture (cuMemAlloc, synchronising
        // ones) fail on this thread, the one that enqueues the step; other threads are unaffected.
        self.cu
            .begin_capture(ds::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .ctx("cuStreamBeginCapture")
    }

    fn end_capture(&self) -> Result<Option<GraphExec>> {
        self.cu
            .end_capture(ds::CUgraphInstantiate_flags(0))
            .ctx("cuStreamEndCapture / cuGraphInstantiate")
            .map(|g| g.map(|g| GraphExec(Box::new(RealGraph(g)))))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stream of a real GPU.
pub(crate) struct RealStream(pub(crate) Arc<CudaStream>);

impl RealStream {
    /// The CUDA stream of `s` (None when it is an emulated device's).
    pub(crate) fn of(s: &Stream) -> Option<&RealStream> {
        s.0.as_any().downcast_ref()
    }
}

impl StreamOps for RealStream {
    fn record_event(&self) -> Result<Event> {
        let e = self.0.record_event(None).ctx("cuEventRecord")?;
        Ok(Event(Box::new(RealEvent(e))))
    }

    fn wait(&self, event: &Event) -> Result<()> {
        let e = event.0.as_any().downcast_ref::<RealEvent>();
        let e = e.ok_or_else(foreign_event)?;
        self.0.wait(&e.0).ctx("cuStreamWaitEvent")
    }

    fn synchronize(&self) -> Result<()> {
        self.0.synchronize().ctx("cuStreamSynchronize")
    }

    fn describe(&self) -> String {
        "CUDA".into()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An event of a real GPU's stream.
struct RealEvent(CudaEvent);

impl EventOps for RealEvent {
    fn query(&self) -> Result<bool> {
        self.0.try_is_complete().ctx("cuEventQuery")
    }

    fn describe(&self) -> &'static str {
        "CUDA"
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A graph instantiated on a real GPU.
struct RealGraph(CudaGraph);

impl GraphOps for RealGraph {
    fn launch(&self) -> Result<()> {
        self.0.launch().ctx("cuGraphLaunch")
    }
}

/// Whether host address `ptr` is page-locked (registered or allocated by CUDA); ordinary
/// (pageable) memory is unknown to the driver, which answers with an error.
fn is_page_locked(ptr: u64) -> bool {
    let mut ty: u32 = 0;
    // SAFETY: the attribute is a CUmemorytype (u32) written into `ty`.
    let r = unsafe {
        ds::cuPointerGetAttribute(
            (&mut ty as *mut u32).cast(),
            ds::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    r == ds::CUresult::CUDA_SUCCESS && ty == ds::CUmemorytype::CU_MEMORYTYPE_HOST as u32
}
