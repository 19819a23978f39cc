//! One CUDA device: its context, its compute stream, its caching allocator, its loaded kernels and
//! its cuBLASLt engine. Everything sinter runs on a device goes through one stream, in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::driver::{
    result as dr, sys as ds, CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig,
    PushKernelArg,
};

use crate::alloc::{
    CachingAllocator, DevSlice, DeviceBuffer, MemoryStats, Pool, RawAlloc, RawAllocError,
};
use crate::dtype::{DType, DeviceScalar};
use crate::error::{guard, CudaError, DriverResultExt, Result};
use crate::gemm::{GemmDesc, GemmEngine};
use crate::launch::{Arg, Launch, LaunchTarget, Step};
use crate::nvrtc::{KernelCache, KernelFile, Output};
use crate::runtime::{self, DeviceInfo};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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

/// A CUDA device ready for sinter's kernels. Get the shared one with [`CudaDevice::get`].
pub struct CudaDevice {
    info: DeviceInfo,
    arch: String,
    target: LaunchTarget,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    allocator: CachingAllocator,
    cache: KernelCache,
    output: Output,
    modules: Mutex<HashMap<KernelFile, Arc<CudaModule>>>,
    functions: Mutex<HashMap<KernelFile, HashMap<String, CudaFunction>>>,
    gemm: Mutex<Option<GemmEngine>>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.info.ordinal)
            .field("name", &self.info.name)
            .field("arch", &self.arch)
            .finish()
    }
}

impl CudaDevice {
    /// The process-wide device for `ordinal` (created on first use).
    pub fn get(ordinal: usize) -> Result<Arc<CudaDevice>> {
        static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<CudaDevice>>>> = OnceLock::new();
        let mut map = lock(DEVICES.get_or_init(Default::default));
        if let Some(d) = map.get(&ordinal) {
            return Ok(d.clone());
        }
        let d = Arc::new(Self::new(ordinal)?);
        map.insert(ordinal, d.clone());
        Ok(d)
    }

    /// A new, independent handle on device `ordinal` (own stream, allocator and module cache).
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let libs = runtime::libraries();
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
        let info = runtime::device_info(ordinal)?;
        let (ctx, stream) = guard(|| {
            let ctx = CudaContext::new(ordinal).ctx("cuDevicePrimaryCtxRetain")?;
            // SAFETY: sinter never uses cudarc's CudaSlice; ordering is by our single stream.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream().ctx("cuStreamCreate")?;
            Ok((ctx, stream))
        })?;
        let raw = DeviceRaw {
            ctx: ctx.clone(),
            stream: stream.clone(),
            ordinal,
        };
        let output = match std::env::var("SINTER_KERNEL_FORMAT").as_deref() {
            Ok("ptx") => Output::Ptx,
            _ => Output::Cubin,
        };
        Ok(CudaDevice {
            arch: info.arch(),
            target: LaunchTarget {
                sm_count: info.multiprocessors,
            },
            info,
            ctx,
            stream,
            allocator: CachingAllocator::new(Box::new(raw)),
            cache: KernelCache::from_env(),
            output,
            modules: Mutex::default(),
            functions: Mutex::default(),
            gemm: Mutex::default(),
        })
    }

    pub fn ordinal(&self) -> usize {
        self.info.ordinal
    }
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }
    /// `sm_XY` of this device: what kernels are compiled for.
    pub fn arch(&self) -> &str {
        &self.arch
    }
    pub fn target(&self) -> LaunchTarget {
        self.target
    }
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
    /// The stream all of sinter's work on this device is ordered on (NCCL should use it too).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }

    /// Wait for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.no_host_wait_in_capture("synchronize")?;
        self.stream.synchronize().ctx("cuStreamSynchronize")
    }

    /// A host wait inside a CUDA graph capture would invalidate it (and means the captured
    /// step reads device memory): refuse it with an error naming the call.
    fn no_host_wait_in_capture(&self, op: &'static str) -> Result<()> {
        if self.allocator.is_capturing() {
            return Err(CudaError::invalid(
                op,
                "the host waits for the device while a CUDA graph is being captured; a captured step must not read device memory or upload from the host (run it without --cuda-graph)",
            ));
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------- memory

    /// Uninitialised buffer.
    pub fn alloc(&self, len: usize, dtype: DType, pool: Pool) -> Result<DeviceBuffer> {
        self.allocator.alloc(len, dtype, pool)
    }

    /// Zero-filled buffer.
    pub fn alloc_zeros(&self, len: usize, dtype: DType, pool: Pool) -> Result<DeviceBuffer> {
        let b = self.alloc(len, dtype, pool)?;
        self.zero(b.as_slice())?;
        Ok(b)
    }

    pub fn memory_stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Return all cached blocks to the driver.
    pub fn empty_cache(&self) -> Result<()> {
        self.allocator.empty_cache()
    }

    /// Set every byte of `dst` to zero (stream-ordered).
    pub fn zero(&self, dst: DevSlice<'_>) -> Result<()> {
        self.zero_raw(dst.ptr(), dst.num_bytes())
    }

    fn zero_raw(&self, ptr: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: the range lies in a live allocation (DevSlice invariant); stream-ordered.
        unsafe { dr::memset_d8_async(ptr, 0, bytes, self.stream.cu_stream()) }
            .ctx("cuMemsetD8Async")
    }

    fn copy_raw(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: both ranges lie in live allocations; stream-ordered.
        unsafe { dr::memcpy_dtod_async(dst, src, bytes, self.stream.cu_stream()) }
            .ctx("cuMemcpyDtoDAsync")
    }

    /// dst = src (same dtype and length).
    pub fn copy(&self, src: DevSlice<'_>, dst: DevSlice<'_>) -> Result<()> {
        if src.dtype() != dst.dtype() || src.len() != dst.len() {
            return Err(CudaError::invalid(
                "copy",
                format!(
                    "{} x {} -> {} x {}",
                    src.len(),
                    src.dtype(),
                    dst.len(),
                    dst.dtype()
                ),
            ));
        }
        self.copy_raw(src.ptr(), dst.ptr(), src.num_bytes())
    }

    /// Upload `data` into a new buffer.
    pub fn htod<T: DeviceScalar>(&self, data: &[T], pool: Pool) -> Result<DeviceBuffer> {
        let b = self.alloc(data.len(), T::DTYPE, pool)?;
        self.copy_htod(data, b.as_slice())?;
        Ok(b)
    }

    /// Upload `data` into `dst`. Returns when `data` may be reused, without waiting for the
    /// device's queued work when `data` is ordinary (pageable) memory.
    pub fn copy_htod<T: DeviceScalar>(&self, data: &[T], dst: DevSlice<'_>) -> Result<()> {
        if dst.dtype() != T::DTYPE || dst.len() != data.len() {
            return Err(CudaError::invalid(
                "htod",
                format!(
                    "{} x {} into {} x {}",
                    data.len(),
                    T::DTYPE,
                    dst.len(),
                    dst.dtype()
                ),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        self.no_host_wait_in_capture("htod")?;
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        let pinned = self.is_page_locked(data.as_ptr() as u64);
        // SAFETY: sizes checked. From pageable memory the driver stages `data` before the call
        // returns, so it may be reused at once (and the host need not wait for the device's
        // queue: a training step's batch upload does not stall it); page-locked memory is read
        // later by the copy engine, so then we synchronise before `data` can be reused.
        unsafe { dr::memcpy_htod_async(dst.ptr(), data, self.stream.cu_stream()) }
            .ctx("cuMemcpyHtoDAsync")?;
        if pinned {
            self.synchronize()?;
        }
        Ok(())
    }

    /// Whether host address `ptr` is page-locked (registered or allocated by CUDA); ordinary
    /// (pageable) memory is unknown to the driver, which answers with an error.
    fn is_page_locked(&self, ptr: u64) -> bool {
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

    /// Download `src` (waits for the queued work that produces it).
    pub fn dtoh<T: DeviceScalar>(&self, src: DevSlice<'_>) -> Result<Vec<T>> {
        if src.dtype() != T::DTYPE {
            return Err(CudaError::invalid(
                "dtoh",
                format!("{} buffer read as {}", src.dtype(), T::DTYPE),
            ));
        }
        let mut out = vec![T::default(); src.len()];
        if out.is_empty() {
            return Ok(out);
        }
        self.no_host_wait_in_capture("dtoh")?;
        self.ctx.bind_to_thread().ctx("cuCtxSetCurrent")?;
        // SAFETY: sizes checked; synchronised before `out` is used.
        unsafe { dr::memcpy_dtoh_async(&mut out, src.ptr(), self.stream.cu_stream()) }
            .ctx("cuMemcpyDtoHAsync")?;
        self.synchronize()?;
        Ok(out)
    }

    // ----------------------------------------------------------------------------- kernels

    fn module(&self, file: KernelFile) -> Result<Arc<CudaModule>> {
        let mut mods = lock(&self.modules);
        if let Some(m) = mods.get(&file) {
            return Ok(m.clone());
        }
        let driver = self.info.driver_version.unwrap_or((0, 0));
        let (bytes, _hit) =
            crate::nvrtc::load_or_compile(&self.cache, file, &self.arch, self.output, driver)?;
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

    /// Compile (or load from the disk cache) every kernel file now instead of at first use.
    pub fn preload_kernels(&self) -> Result<()> {
        for f in KernelFile::ALL {
            self.module(f)?;
        }
        Ok(())
    }

    /// Submit one planned kernel on the device stream.
    pub fn launch(&self, l: &Launch) -> Result<()> {
        l.validate()?;
        let func = self.function(l.file, &l.name)?;
        let cfg = LaunchConfig {
            grid_dim: l.grid,
            block_dim: l.block,
            shared_mem_bytes: l.shared_mem,
        };
        let mut b = self.stream.launch_builder(&func);
        for a in &l.args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::I64(v) => b.arg(v),
                Arg::U64(v) => b.arg(v),
                Arg::I32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
                Arg::Strided(m) => b.arg(m),
                Arg::Conv(m) => b.arg(m),
                Arg::Pool(m) => b.arg(m),
                Arg::Adam(m) => b.arg(m),
                Arg::Sgd(m) => b.arg(m),
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

    /// Run an optional launch.
    pub fn run_opt(&self, l: Option<Launch>) -> Result<()> {
        l.map_or(Ok(()), |l| self.launch(&l))
    }

    /// Run steps in order.
    pub fn run_steps(&self, steps: impl Iterator<Item = Step>) -> Result<()> {
        for s in steps {
            match s {
                Step::Kernel(l) => self.launch(&l)?,
                Step::Zero { ptr, bytes } => self.zero_raw(ptr, bytes)?,
                Step::Copy { src, dst, bytes } => self.copy_raw(src, dst, bytes)?,
            }
        }
        Ok(())
    }

    // ----------------------------------------------------------------------------- GEMM

    /// Row-major GEMM through cuBLASLt (see [`crate::gemm`]).
    pub fn gemm(&self, desc: &GemmDesc<'_>) -> Result<()> {
        let mut g = lock(&self.gemm);
        if g.is_none() {
            *g = Some(GemmEngine::new(self)?);
        }
        g.as_ref().expect("initialised").run(self, desc)
    }
}
