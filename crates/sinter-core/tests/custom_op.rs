//! The custom-op API (`sinter_core::custom_op`): values and gradients of a multi-output op with
//! a saved-only output on the CPU and on the CUDA device (the real GPU when present, else the
//! emulated CUDA device, required in CI by SINTER_REQUIRE_EMU=1), against the same math in
//! composite tensor ops; a backward written as another custom op; and every error the API
//! promises (no forward for the device, wrong outputs, wrong gradients, a compile error with
//! the compiler's log, a launch that does not fit its kernel).

use sinter_core::custom_op::{
    BackwardCtx, CudaKernel, CustomOp, HostOutput, KernelLaunch, OutputSpec, TensorMeta,
};
use sinter_core::{no_grad, DType, Device, Result, Tensor};

/// The CUDA device of this process, or None (the skip was printed).
fn cuda() -> Option<Device> {
    sinter_cuda::testing::gpu_tests(1).map(|_| Device::Cuda(0))
}

const KERNELS: &str = r#"
// (p, s) = (x * y, x + y), and the saved-only q = x * x.
extern "C" __global__ void prod_sum(const float* x, const float* y, float* p, float* s,
                                    float* q, i64 n) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        p[i] = x[i] * y[i];
        s[i] = x[i] + y[i];
        q[i] = x[i] * x[i];
    }
}
// The backward as its own kernel: dx = gp * y + gs, dy = gp * x + gs.
extern "C" __global__ void prod_sum_grad(const float* x, const float* y, const float* gp,
                                         const float* gs, float* dx, float* dy, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        dx[i] = gp[i] * y[i] + gs[i];
        dy[i] = gp[i] * x[i] + gs[i];
    }
}
"#;

fn same_shapes(m: &[TensorMeta]) -> Result<&[usize]> {
    if m[0].shape != m[1].shape {
        return Err(sinter_core::Error::Msg(format!(
            "x {:?} and y {:?} differ",
            m[0].shape, m[1].shape
        )));
    }
    Ok(&m[0].shape)
}

fn cpu_zip(
    x: &sinter_core::custom_op::HostInput<'_>,
    y: &sinter_core::custom_op::HostInput<'_>,
    f: impl Fn(f32, f32) -> f32,
) -> Result<Vec<f32>> {
    Ok(x.f32()?
        .iter()
        .zip(y.f32()?)
        .map(|(a, b)| f(*a, *b))
        .collect())
}

/// (x, y, gp, gs) -> (dx, dy), no backward of its own.
fn grad_op(kernel: &CudaKernel) -> CustomOp {
    CustomOp::builder("prod_sum_grad")
        .inputs(4)
        .outputs(|m| {
            let s = same_shapes(m)?;
            Ok(vec![
                OutputSpec::new(s, DType::F32),
                OutputSpec::new(s, DType::F32),
            ])
        })
        .cpu(|i| {
            let (x, y, gp, gs) = (i[0].f32()?, i[1].f32()?, i[2].f32()?, i[3].f32()?);
            let dx = (0..x.len()).map(|k| gp[k] * y[k] + gs[k]).collect();
            let dy = (0..x.len()).map(|k| gp[k] * x[k] + gs[k]).collect();
            Ok(vec![
                HostOutput::f32(dx, i[0].shape()),
                HostOutput::f32(dy, i[0].shape()),
            ])
        })
        .cuda(kernel.sibling("prod_sum_grad", |m| {
            let n = m[0].numel();
            Ok(KernelLaunch::linear(n, 64)?.arg(n as i32))
        }))
        .build()
        .unwrap()
}

/// (x, y) -> (x·y, x + y), saving x² (unused by the backward, checked to be there).
fn prod_sum() -> CustomOp {
    let kernel = CudaKernel::new("prod_sum.cu", KERNELS, "prod_sum", |m| {
        let n = m[0].numel();
        // Two blocks of 32 whatever n is: the kernel strides over the rest.
        Ok(KernelLaunch {
            grid: (2, 1, 1),
            block: (32, 1, 1),
            shared_mem: 0,
            scalars: vec![(n as i64).into()],
            cost: None,
        })
    })
    .unwrap();
    let grad = grad_op(&kernel);
    CustomOp::builder("prod_sum")
        .inputs(2)
        .outputs(|m| {
            let s = same_shapes(m)?;
            Ok(vec![
                OutputSpec::new(s, DType::F32),
                OutputSpec::new(s, DType::F32),
                OutputSpec::new(s, DType::F32).saved(),
            ])
        })
        .cpu(|i| {
            let s = i[0].shape();
            Ok(vec![
                HostOutput::f32(cpu_zip(&i[0], &i[1], |a, b| a * b)?, s),
                HostOutput::f32(cpu_zip(&i[0], &i[1], |a, b| a + b)?, s),
                HostOutput::f32(cpu_zip(&i[0], &i[1], |a, _| a * a)?, s),
            ])
        })
        .cuda(kernel)
        .backward(move |ctx: &BackwardCtx<'_>| {
            let (x, y) = (ctx.input(0), ctx.input(1));
            assert_eq!(ctx.outputs().len(), 3, "the saved-only output is kept");
            let d = grad.apply(&[x, y, ctx.grad(0), ctx.grad(1)])?;
            Ok(vec![Some(d[0].clone()), Some(d[1].clone())])
        })
        .build()
        .unwrap()
}

fn inputs(dev: Device) -> (Tensor, Tensor) {
    let x: Vec<f32> = (0..77).map(|i| (i as f32 * 0.37).sin()).collect();
    let y: Vec<f32> = (0..77).map(|i| (i as f32 * 0.11).cos() - 0.3).collect();
    let y = Tensor::from_vec(y, &[11, 7], dev)
        .unwrap()
        .to_var()
        .unwrap();
    let x = Tensor::from_vec(x, &[7, 11], dev)
        .unwrap()
        .to_var()
        .unwrap();
    (x, y)
}

/// loss = Σ p·w + Σ s² (both outputs used), or Σ p·w alone.
fn loss(p: &Tensor, s: &Tensor, both: bool) -> Tensor {
    let w = Tensor::arange(0.0, 77.0, 1.0, DType::F32, p.device())
        .unwrap()
        .reshape(&[7, 11])
        .unwrap()
        .mul_scalar(0.01)
        .unwrap();
    let l = p.mul(&w).unwrap().sum_all().unwrap();
    if both {
        l.add(&s.sqr().unwrap().sum_all().unwrap()).unwrap()
    } else {
        l
    }
}

/// Values of (p, s) and the gradients of x and y, through the custom op or the composite.
fn run(dev: Device, custom: bool, both: bool) -> Vec<Vec<f32>> {
    let (x, yv) = inputs(dev);
    // The op sees y as a transposed (non-contiguous) view: its forwards get it contiguous.
    let y = yv.t().unwrap();
    let (p, s) = if custom {
        let out = prod_sum().apply(&[&x, &y]).unwrap();
        assert_eq!(out.len(), 2, "the saved-only output is not returned");
        (out[0].clone(), out[1].clone())
    } else {
        (x.mul(&y).unwrap(), x.add(&y).unwrap())
    };
    assert_eq!(p.device(), dev);
    loss(&p, &s, both).backward().unwrap();
    [p, s, x.grad().unwrap(), yv.grad().unwrap()]
        .iter()
        .map(|t| t.to_vec_f32().unwrap())
        .collect()
}

fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
    for (k, (u, v)) in a.iter().zip(b).enumerate() {
        for (i, (p, q)) in u.iter().zip(v).enumerate() {
            assert!(
                (p - q).abs() <= 1e-6 * (1.0 + q.abs()),
                "{what}: tensor {k} element {i}: {p} vs {q}"
            );
        }
    }
}

#[test]
fn values_and_gradients_match_the_composite_on_every_device() {
    let mut devices = vec![Device::Cpu];
    devices.extend(cuda());
    for dev in devices {
        for both in [true, false] {
            // One output unused: its gradient is zeros in the backward.
            let want = run(Device::Cpu, false, both);
            assert_close(
                &run(dev, true, both),
                &want,
                &format!("{dev:?} both={both}"),
            );
        }
    }
}

#[test]
fn a_second_backward_over_the_same_graph_adds_the_same_gradients() {
    let (x, yv) = inputs(Device::Cpu);
    let out = prod_sum().apply(&[&x, &yv.t().unwrap()]).unwrap();
    let l = loss(&out[0], &out[1], true);
    l.backward().unwrap();
    let once = x.grad().unwrap().to_vec_f32().unwrap();
    l.backward().unwrap();
    let twice = x.grad().unwrap().to_vec_f32().unwrap();
    for (a, b) in once.iter().zip(&twice) {
        assert_eq!(2.0 * a, *b);
    }
}

#[test]
fn under_no_grad_nothing_is_recorded_and_no_backward_is_needed() {
    let op = CustomOp::builder("double")
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
        .cpu(|i| {
            let v = i[0].f32()?.iter().map(|v| 2.0 * v).collect();
            Ok(vec![HostOutput::f32(v, i[0].shape())])
        })
        .build()
        .unwrap();
    let x = Tensor::ones(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .to_var()
        .unwrap();
    let e = op.apply(&[&x]).unwrap_err().to_string();
    assert!(
        e.contains("`double` has no backward") && e.contains("no_grad"),
        "{e}"
    );
    let y = {
        let _g = no_grad();
        op.apply(&[&x]).unwrap().remove(0)
    };
    assert!(!y.tracks_grad());
    assert_eq!(y.to_vec_f32().unwrap(), [2.0; 3]);
}

/// An op whose CPU forward returns what `make` gives, declared as one f32 [2] output.
fn returning(make: fn() -> Vec<HostOutput>) -> CustomOp {
    CustomOp::builder("liar")
        .outputs(|_| Ok(vec![OutputSpec::new(&[2], DType::F32)]))
        .cpu(move |_| Ok(make()))
        .backward(|_| Ok(vec![None]))
        .build()
        .unwrap()
}

#[test]
fn wrong_outputs_inputs_and_gradients_are_errors_that_say_what() {
    let x = Tensor::ones(&[2], DType::F32, Device::Cpu).unwrap();
    let err = |op: CustomOp, x: &Tensor| op.apply(&[x]).unwrap_err().to_string();
    let e = err(returning(Vec::new), &x);
    assert!(
        e.contains("returned 0 outputs") && e.contains("declares 1"),
        "{e}"
    );
    let e = err(returning(|| vec![HostOutput::f32(vec![0.0; 3], &[3])]), &x);
    assert!(e.contains("shape [3]") && e.contains("[2]"), "{e}");
    let e = err(
        returning(|| {
            vec![HostOutput::new(
                sinter_core::cpu::CpuStorage::I64(vec![0; 2]),
                &[2],
            )]
        }),
        &x,
    );
    assert!(e.contains("is i64") && e.contains("declares f32"), "{e}");
    let e = err(returning(|| vec![HostOutput::f32(vec![0.0; 5], &[2])]), &x);
    assert!(e.contains("holds 5 elements"), "{e}");
    let bf = x.to_dtype(DType::BF16).unwrap();
    let e = err(returning(Vec::new), &bf);
    assert!(e.contains("input 0 is bf16"), "{e}");

    // A declared dtype the closure reads as another.
    let reads_f32 = CustomOp::builder("reads_f32")
        .dtypes(&[DType::F32, DType::BF16])
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
        .cpu(|i| Ok(vec![HostOutput::f32(i[0].f32()?.to_vec(), i[0].shape())]))
        .build()
        .unwrap();
    let e = err(reads_f32, &bf);
    assert!(e.contains("reads input 0 as f32, but it is bf16"), "{e}");

    // The backward's gradients: count, shape, dtype.
    let bad_grads = |f: fn(&BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>>| {
        let op = CustomOp::builder("bad_grad")
            .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
            .cpu(|i| Ok(vec![HostOutput::f32(i[0].f32()?.to_vec(), i[0].shape())]))
            .backward(f)
            .build()
            .unwrap();
        let v = x.to_var().unwrap();
        let y = op.apply(&[&v]).unwrap().remove(0);
        y.sum_all().unwrap().backward().unwrap_err().to_string()
    };
    let e = bad_grads(|_| Ok(vec![]));
    assert!(e.contains("returned 0 gradients for 1 inputs"), "{e}");
    let e = bad_grads(|c| Ok(vec![Some(c.grad(0).reshape(&[1, 2])?)]));
    assert!(
        e.contains("gradient of input 0 has shape [1, 2], the input [2]"),
        "{e}"
    );
    let e = bad_grads(|c| Ok(vec![Some(c.grad(0).to_dtype(DType::BF16)?)]));
    assert!(e.contains("gradient of input 0 is bf16"), "{e}");

    // Declaring nothing to return, or saved-only outputs first.
    let e = CustomOp::builder("all_saved")
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32).saved()]))
        .cpu(|_| Ok(vec![]))
        .build()
        .unwrap()
        .apply(&[&x])
        .unwrap_err()
        .to_string();
    assert!(e.contains("at least one returned output"), "{e}");
    assert!(CustomOp::builder("no_forward")
        .outputs(|_| Ok(vec![]))
        .build()
        .is_err());
}

#[test]
fn an_op_without_a_forward_for_the_device_says_so() {
    let cpu_only = CustomOp::builder("cpu_only")
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
        .cpu(|i| Ok(vec![HostOutput::f32(i[0].f32()?.to_vec(), i[0].shape())]))
        .build()
        .unwrap();
    let cuda_only = CustomOp::builder("cuda_only")
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
        .cuda(CudaKernel::new("k.cu", "", "k", |_| KernelLaunch::linear(1, 1)).unwrap())
        .build()
        .unwrap();
    let x = Tensor::ones(&[2], DType::F32, Device::Cpu).unwrap();
    let e = cuda_only.apply(&[&x]).unwrap_err().to_string();
    assert!(
        e.contains("`cuda_only` has no forward for cpu (it has one for cuda)"),
        "{e}"
    );
    // The wrong number of inputs.
    let e = prod_sum().apply(&[&x]).unwrap_err().to_string();
    assert!(e.contains("takes 2 inputs, got 1"), "{e}");
    let Some(dev) = cuda() else { return };
    let e = cpu_only
        .apply(&[&x.to_device(dev).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("`cpu_only` has no forward for cuda:0 (it has one for cpu)"),
        "{e}"
    );
    // Inputs on two devices.
    let e = prod_sum()
        .apply(&[&x, &x.to_device(dev).unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("different devices"), "{e}");
}

/// A one-input CUDA-only op running `kernel` of `src` with `block` threads.
fn cuda_op(src: &str, kernel: &str, block: u32) -> CustomOp {
    CustomOp::builder("k")
        .outputs(|m| Ok(vec![OutputSpec::new(&m[0].shape, DType::F32)]))
        .cuda(
            CudaKernel::new("user_k.cu", src, kernel, move |m| {
                KernelLaunch::linear(m[0].numel(), block)
            })
            .unwrap(),
        )
        .build()
        .unwrap()
}

#[test]
fn compile_and_launch_errors_name_the_op_and_carry_the_log() {
    let Some(dev) = cuda() else { return };
    let x = Tensor::ones(&[4], DType::F32, dev).unwrap();
    let copy = "extern \"C\" __global__ void copy(const float* x, float* y) {\n  y[threadIdx.x] = x[threadIdx.x];\n}\n";
    let e = cuda_op(
        "extern \"C\" __global__ void copy(const float* x, float* y) {\n  y[0] = x[0] + not_declared;\n}\n",
        "copy",
        4,
    )
    .apply(&[&x])
    .unwrap_err()
    .to_string();
    assert!(e.contains("custom op `k` on cuda:0"), "{e}");
    assert!(e.contains("user_k") && e.contains("not_declared"), "{e}");
    let e = cuda_op(copy, "copy", 2048)
        .apply(&[&x])
        .unwrap_err()
        .to_string();
    assert!(e.contains("out of limits"), "{e}");
    let e = cuda_op(copy, "kopy", 4)
        .apply(&[&x])
        .unwrap_err()
        .to_string();
    assert!(e.contains("kopy"), "{e}");
    let y = cuda_op(copy, "copy", 4).apply(&[&x]).unwrap().remove(0);
    assert_eq!(y.to_vec_f32().unwrap(), [1.0; 4]);
}
