//! One CUDA device: its driver (a real GPU, or an emulated device — see [`crate::driver`]), its
//! compute stream, its caching allocator and its GEMM engine. Everything sinter runs on a device
//! goes through one stream, in order.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::alloc::{CachingAllocator, DevSlice, DeviceBuffer, MemoryStats, Pool};
use crate::driver::real::RealDriver;
use crate::driver::{Driver, Stream};
use crate::dtype::{DType, DeviceScalar};
use crate::emulated::EmuDriver;
use crate::error::{CudaError, Result};
use crate::gemm::{GemmDesc, GemmEngine, WORKSPACE_BYTES};
use crate::launch::{Launch, LaunchTarget, Step};
use crate::runtime::{self, DeviceInfo};
use crate::user_kernel::{KernelSource, UserLaunch};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A CUDA device ready for sinter's kernels. Get the shared one with [`CudaDevice::get`].
pub struct CudaDevice {
    info: DeviceInfo,
    arch: String,
    target: LaunchTarget,
    // Dropped before the driver: the allocator's last frees wait for the driver's queue.
    gemm: Mutex<Option<GemmEngine>>,
    allocator: CachingAllocator,
    driver: Driver,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.info.ordinal)
            .field("name", &self.info.name)
            .field("arch", &self.arch)
            .field("emulated", &self.is_emulated())
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

    /// A new, independent handle on device `ordinal` (own stream, allocator and module cache):
    /// a real GPU, or an emulated device when the process serves those (see [`runtime::mode`]).
    pub fn new(ordinal: usize) -> Result<CudaDevice> {
        let info = runtime::device_info(ordinal)?;
        // The one place that picks the driver (both implement `DriverOps`).
        let (driver, raw) = if runtime::is_emulated() {
            let (d, raw) = EmuDriver::new(ordinal)?;
            (Driver::new(d), raw)
        } else {
            let (d, raw) = RealDriver::new(&info)?;
            (Driver::new(d), raw)
        };
        Ok(CudaDevice {
            arch: info.arch(),
            target: LaunchTarget {
                sm_count: info.multiprocessors,
            },
            info,
            gemm: Mutex::default(),
            allocator: CachingAllocator::new(raw),
            driver,
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
    /// True for an emulated device (the CPU kernel emulator; not a GPU).
    pub fn is_emulated(&self) -> bool {
        self.emulated().is_some()
    }
    /// The stream all of sinter's work on this device is ordered on.
    pub fn stream(&self) -> &Stream {
        self.driver.stream()
    }
    /// A new stream on this device (ordered against the compute stream with events).
    pub fn new_stream(&self) -> Result<Stream> {
        self.driver.new_stream()
    }
    pub fn allocator(&self) -> &CachingAllocator {
        &self.allocator
    }
    pub(crate) fn driver(&self) -> &Driver {
        &self.driver
    }
    /// The CUDA driver of a real GPU (None when emulated).
    pub(crate) fn real(&self) -> Option<&RealDriver> {
        RealDriver::of(&self.driver)
    }
    /// The driver of an emulated device (None on a real GPU).
    pub(crate) fn emulated(&self) -> Option<&EmuDriver> {
        EmuDriver::of(&self.driver)
    }

    /// Wait for all queued work.
    pub fn synchronize(&self) -> Result<()> {
        self.no_host_wait_in_capture("synchronize")?;
        self.driver.synchronize()
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
        self.driver.memset_zero(ptr, bytes)
    }

    fn copy_raw(&self, src: u64, dst: u64, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.driver.copy_dtod(src, dst, bytes)
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
        self.driver.copy_htod(as_bytes(data), dst.ptr())
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
        self.driver.copy_dtoh(src.ptr(), as_bytes_mut(&mut out))?;
        Ok(out)
    }

    // ----------------------------------------------------------------------------- kernels

    /// Compile (or load from the disk cache) every kernel file now instead of at first use.
    pub fn preload_kernels(&self) -> Result<()> {
        self.driver.preload_kernels()
    }

    /// Submit one planned kernel on the device stream.
    pub fn launch(&self, l: &Launch) -> Result<()> {
        l.validate()?;
        self.driver.launch(l)
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

    // ----------------------------------------------------------------------- custom kernels

    /// Queue one launch of a kernel of `src` on the device stream (compiling `src` for this
    /// device on first use). The launch is checked against the compiled kernel first (see
    /// [`KernelSource::check_launch`]); errors while it runs are reported by the next call that
    /// waits for the device, as for every kernel.
    pub fn launch_user(&self, src: &KernelSource, l: &UserLaunch) -> Result<()> {
        let plan = l.plan();
        plan.validate()?;
        if let Some(r) = self.real() {
            let compiled = src.ptx(self.arch())?;
            src.check_launch(&compiled, l)?;
            return r.launch_user(src, &compiled, &plan);
        }
        let e = self.emulated().ok_or_else(|| {
            CudaError::invalid(
                "custom kernel launch",
                "the device has no driver for custom kernels",
            )
        })?;
        // The NVRTC check keeps the emulated device honest about what a GPU would accept;
        // without NVRTC the emulator still checks names and argument sizes.
        if crate::nvrtc::nvrtc_present() {
            let compiled = src.ptx(self.arch())?;
            src.check_launch(&compiled, l)?;
        }
        e.launch_user(src, &plan, l.cost())
    }

    // ----------------------------------------------------------------------------- GEMM

    /// Row-major GEMM through cuBLASLt (see [`crate::gemm`]), or the emulated device's host GEMM.
    pub fn gemm(&self, desc: &GemmDesc<'_>) -> Result<()> {
        let mut g = lock(&self.gemm);
        if g.is_none() {
            let workspace = self.alloc(WORKSPACE_BYTES, DType::U8, Pool::Permanent)?;
            *g = Some(GemmEngine::new(self.driver(), workspace)?);
        }
        g.as_ref().expect("initialised").run(self.driver(), desc)
    }
}

/// The bytes of a slice of plain device scalars.
fn as_bytes<T: DeviceScalar>(v: &[T]) -> &[u8] {
    // SAFETY: DeviceScalar types (f32, f16, bf16, i64, i32, u8) are plain data without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), std::mem::size_of_val(v)) }
}

fn as_bytes_mut<T: DeviceScalar>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid value of these types.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast(), std::mem::size_of_val(v)) }
}
