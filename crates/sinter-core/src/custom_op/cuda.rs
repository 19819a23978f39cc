//! A custom op's CUDA forward: one kernel of CUDA C++ source ([`CudaKernel`]), compiled by NVRTC
//! at its first launch on a device and cached (in memory per process, on disk across runs), and
//! launched on the device's one stream through sinter-cuda like every built-in kernel — so it
//! also runs on the emulated CUDA device.
//!
//! The kernel's parameters, in order: one `const T*` per input (contiguous, row-major), one
//! `T*` per declared output (saved-only ones included; fresh and uninitialised: the kernel
//! writes every element), then the scalars of its [`KernelLaunch`].

use std::sync::Arc;

pub use sinter_cuda::emulated::cost::{OpClass, Traffic};
use sinter_cuda::launch::Arg;
use sinter_cuda::user_kernel::KernelSource;

use super::spec::TensorMeta;
use crate::{Error, Result};

/// Computes a launch's geometry and scalars from the inputs' shapes.
pub(crate) type LaunchFn = dyn Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync;

/// A kernel of CUDA C++ source and how to launch it.
#[derive(Clone)]
pub struct CudaKernel {
    pub(super) source: Arc<KernelSource>,
    pub(super) kernel: String,
    pub(super) launch: Arc<LaunchFn>,
}

impl std::fmt::Debug for CudaKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaKernel({} in {})", self.kernel, self.source.name())
    }
}

impl CudaKernel {
    /// Kernel `kernel` (an `extern "C" __global__` function) of `source`, a file named `file`
    /// in compiler errors (letters, digits, `_`, `-`, `.`), launched as `launch` computes from
    /// the inputs. Nothing is compiled until the first launch.
    pub fn new(
        file: &str,
        source: &str,
        kernel: &str,
        launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
    ) -> Result<CudaKernel> {
        let source = KernelSource::new(file, source).map_err(|e| Error::Msg(e.to_string()))?;
        Ok(CudaKernel {
            source: Arc::new(source),
            kernel: kernel.to_string(),
            launch: Arc::new(launch),
        })
    }

    /// Another kernel of the same source (compiled once for both).
    pub fn sibling(
        &self,
        kernel: &str,
        launch: impl Fn(&[TensorMeta]) -> Result<KernelLaunch> + Send + Sync + 'static,
    ) -> CudaKernel {
        CudaKernel {
            source: self.source.clone(),
            kernel: kernel.to_string(),
            launch: Arc::new(launch),
        }
    }
}

/// A scalar kernel argument (after the input and output pointers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    I32(i32),
    I64(i64),
    F32(f32),
}

impl From<i32> for Scalar {
    fn from(v: i32) -> Self {
        Scalar::I32(v)
    }
}
impl From<i64> for Scalar {
    fn from(v: i64) -> Self {
        Scalar::I64(v)
    }
}
impl From<f32> for Scalar {
    fn from(v: f32) -> Self {
        Scalar::F32(v)
    }
}

impl Scalar {
    pub(super) fn arg(self) -> Arg {
        match self {
            Scalar::I32(v) => Arg::I32(v),
            Scalar::I64(v) => Arg::I64(v),
            Scalar::F32(v) => Arg::F32(v),
        }
    }
}

/// The geometry of one launch and its scalar arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelLaunch {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory (`extern __shared__`), at most 48 KiB.
    pub shared_mem: u32,
    pub scalars: Vec<Scalar>,
    /// Bytes and FLOPs of the launch, and its kind, for the GPU cost model (`sinter bench
    /// gpu-model`); None: the model guesses from the arguments as for an elementwise kernel.
    pub cost: Option<(OpClass, Traffic)>,
}

impl KernelLaunch {
    /// A launch of `grid` blocks of `block` threads, without shared memory, scalars or declared
    /// cost (added with [`KernelLaunch::arg`] and [`KernelLaunch::with_cost`]).
    pub fn new(grid: (u32, u32, u32), block: (u32, u32, u32)) -> KernelLaunch {
        KernelLaunch {
            grid,
            block,
            shared_mem: 0,
            scalars: Vec::new(),
            cost: None,
        }
    }

    /// One thread per item, in 1-D blocks of `block` threads (at least one block).
    pub fn linear(items: usize, block: u32) -> Result<KernelLaunch> {
        let blocks = items.div_ceil(block.max(1) as usize).max(1);
        let grid = u32::try_from(blocks)
            .ok()
            .filter(|&g| g <= i32::MAX as u32)
            .ok_or_else(|| {
                Error::Msg(format!(
                    "KernelLaunch::linear: {items} items need {blocks} blocks of {block}, more than a grid holds; loop over the items in the kernel (grid-stride) instead"
                ))
            })?;
        Ok(KernelLaunch::new((grid, 1, 1), (block, 1, 1)))
    }
    /// The same launch with its traffic declared for the cost model.
    pub fn with_cost(mut self, class: OpClass, t: Traffic) -> KernelLaunch {
        self.cost = Some((class, t));
        self
    }
    /// The same launch with one more scalar argument.
    pub fn arg(mut self, s: impl Into<Scalar>) -> KernelLaunch {
        self.scalars.push(s.into());
        self
    }
}
