//! Custom ops: an op defined once outside the engine — a CPU forward (a Rust closure over host
//! slices), a CUDA forward (CUDA C++ source compiled by NVRTC at its first launch and cached),
//! and one backward — that runs on every device through the backend seam and is
//! differentiable like a built-in op. PyTorch's `torch.autograd.Function` plus
//! `cpp_extension.load_inline`, in one Rust value.
//!
//! - The op declares how many inputs it takes, and its outputs' shapes and dtypes from its
//!   inputs' ([`OutputSpec`]); every backend's outputs are checked against them (a wrong
//!   number, shape or dtype is an error naming the op and the output). Outputs marked [`OutputSpec::saved`] are kept for the
//!   backward but not returned (intermediates such as activations).
//! - The forward runs where the inputs live, through one seam primitive
//!   (`Storage::custom_forward`; the CPU runs the closure, CUDA launches the kernel on the
//!   device's stream with its inputs, outputs and scalars). An op without a forward for that
//!   device is an error that says which devices it has one for. NVRTC errors carry the compiler
//!   log; a launch that does not fit the compiled kernel (its name, the number or kinds of its
//!   parameters, the launch limits) is refused before anything runs.
//! - The backward is one closure for every device ([`BackwardCtx`]: inputs, outputs, output
//!   gradients), written in tensor ops or in further custom ops; autograd records the op as one
//!   node above the seam. Its gradients are checked against the inputs' shapes, dtypes and
//!   devices.
//! - Dtypes: inputs may be f32, f16, bf16 or i64, as the op allows ([`CustomOpBuilder::dtypes`],
//!   default f32 only); outputs are any of those. The CPU closure reads each input through the
//!   typed accessor of its dtype; a kernel gets raw pointers and must use the matching C type
//!   (`float`, `__half`, `__nv_bfloat16`, `long long`).
//!
//! ```
//! use sinter_core::custom_op::{CudaKernel, CustomOp, HostOutput, KernelLaunch, OutputSpec};
//! use sinter_core::{DType, Device, Tensor};
//!
//! // y = x³, with its CPU loop, its CUDA kernel and one backward (3x²·dy) in tensor ops.
//! const CUBE: &str = r#"
//! extern "C" __global__ void cube(const float* x, float* y, i64 n) {
//!     i64 i = global_tid();
//!     if (i < n) y[i] = x[i] * x[i] * x[i];
//! }"#;
//! let cube = CustomOp::builder("cube")
//!     .inputs(1)
//!     .outputs(|x| Ok(vec![OutputSpec::new(&x[0].shape, DType::F32)]))
//!     .cpu(|x| {
//!         let v = x[0].f32()?.iter().map(|v| v * v * v).collect();
//!         Ok(vec![HostOutput::f32(v, x[0].shape())])
//!     })
//!     .cuda(CudaKernel::new("cube.cu", CUBE, "cube", |x| {
//!         Ok(KernelLaunch::linear(x[0].numel(), 256)?.arg(x[0].numel() as i64))
//!     })?)
//!     .backward(|ctx| {
//!         let x = ctx.input(0);
//!         Ok(vec![Some(x.sqr()?.mul_scalar(3.0)?.mul(ctx.grad(0))?)])
//!     })
//!     .build()?;
//!
//! let x = Tensor::from_vec(vec![1.0f32, -2.0, 0.5], &[3], Device::Cpu)?.to_var()?;
//! let y = &cube.apply(&[&x])?[0];
//! assert_eq!(y.to_vec_f32()?, [1.0, -8.0, 0.125]);
//! y.sum_all()?.backward()?;
//! assert_eq!(x.grad().unwrap().to_vec_f32()?, [3.0, 12.0, 0.75]);
//! # Ok::<(), sinter_core::Error>(())
//! ```

mod backward;
mod cpu;
mod cuda;
mod op;
pub(crate) mod seam;
mod spec;

pub use backward::BackwardCtx;
pub use cpu::{HostInput, HostOutput, HostSlice};
pub use cuda::{CudaKernel, KernelLaunch, OpClass, Scalar, Traffic};
pub use op::{CustomOp, CustomOpBuilder};
pub use spec::{OutputSpec, TensorMeta};
