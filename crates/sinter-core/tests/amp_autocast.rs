//! Autocast (mixed precision), dtype promotion, and moving tensors between devices in place.
//! All on the CPU, where f16 and bf16 are real storage types (values rounded to them, arithmetic
//! widened to f32).

use sinter_core::{amp, Conv2dParams, DType, Device, Error, Rng, Tensor};

fn randn(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = Rng::new(seed);
    Tensor::randn(shape, 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn matmul_under_autocast_runs_in_the_low_dtype_with_f32_master_gradients() {
    let x = randn(&[8, 16], 1);
    let w = randn(&[16, 4], 2).to_var().unwrap();
    for dt in [DType::BF16, DType::F16] {
        w.zero_grad();
        let y = {
            let _ac = amp::autocast(dt);
            x.matmul(&w).unwrap()
        };
        assert_eq!(y.dtype(), dt, "autocast {dt}");
        // Same values as f32 up to the rounding of the operands and the result.
        let exact = x.matmul(&w.detach()).unwrap();
        let tol = if dt == DType::BF16 { 0.15 } else { 0.02 };
        assert!(
            max_abs_diff(&y, &exact) < tol,
            "{dt}: {}",
            max_abs_diff(&y, &exact)
        );
        y.sum_all().unwrap().backward().unwrap();
        let g = w.grad().unwrap();
        assert_eq!(
            g.dtype(),
            DType::F32,
            "master-weight gradient dtype under {dt}"
        );
        // d(sum(xw))/dw = xᵀ·1: column sums of x, broadcast over the 4 outputs.
        let want = x
            .t()
            .unwrap()
            .matmul(&Tensor::ones(&[8, 4], DType::F32, Device::Cpu).unwrap())
            .unwrap();
        assert!(
            max_abs_diff(&g, &want) < 0.1,
            "{dt} grad: {}",
            max_abs_diff(&g, &want)
        );
    }
    // Outside the region nothing is cast.
    assert_eq!(x.matmul(&w).unwrap().dtype(), DType::F32);
}

#[test]
fn conv2d_under_autocast_casts_both_operands() {
    let x = randn(&[2, 3, 6, 6], 3);
    let w = randn(&[4, 3, 3, 3], 4).to_var().unwrap();
    let p = Conv2dParams {
        stride: 1,
        padding: 1,
        dilation: 1,
        groups: 1,
    };
    let y = {
        let _ac = amp::autocast(DType::BF16);
        x.conv2d(&w, p).unwrap()
    };
    assert_eq!(y.dtype(), DType::BF16);
    let exact = x.conv2d(&w.detach(), p).unwrap();
    assert!(
        max_abs_diff(&y, &exact) < 0.2,
        "{}",
        max_abs_diff(&y, &exact)
    );
    y.sum_all().unwrap().backward().unwrap();
    assert_eq!(w.grad().unwrap().dtype(), DType::F32);
}

#[test]
fn binary_ops_promote_float_dtypes_and_gradients_come_back_in_each_dtype() {
    let a = randn(&[3, 4], 5).to_var().unwrap();
    let b16 = randn(&[4], 6)
        .to_dtype(DType::BF16)
        .unwrap()
        .to_var()
        .unwrap();
    let h = randn(&[3, 4], 7).to_dtype(DType::F16).unwrap();
    let y = a.add(&b16).unwrap();
    assert_eq!(y.dtype(), DType::F32);
    assert_eq!(b16.mul(&a).unwrap().dtype(), DType::F32);
    // bf16 with f16: neither holds the other, so f32.
    assert_eq!(h.sub(&b16).unwrap().dtype(), DType::F32);
    assert_eq!(h.add(&h).unwrap().dtype(), DType::F16);
    y.mul(&y).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(a.grad().unwrap().dtype(), DType::F32);
    let gb = b16.grad().unwrap();
    assert_eq!(gb.dtype(), DType::BF16);
    assert_eq!(gb.shape(), &[4]);
    // Comparisons promote too (their result is in the promoted dtype).
    assert_eq!(h.lt(&a).unwrap().dtype(), DType::F32);
}

#[test]
fn ops_that_cannot_promote_still_error() {
    let a = randn(&[2, 3], 8);
    let i = Tensor::from_vec(vec![1i64, 2, 3, 4, 5, 6], &[2, 3], Device::Cpu).unwrap();
    assert!(matches!(a.add(&i), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(i.mul(&a), Err(Error::DTypeMismatch { .. })));
    let h = a.to_dtype(DType::F16).unwrap();
    assert!(Tensor::where_cond(&a, &h, &a).is_err());
    assert!(
        h.matmul(&a.t().unwrap()).is_err(),
        "matmul does not promote outside autocast"
    );
    {
        // Under autocast the same mixed product is fine: both go to the autocast dtype.
        let _ac = amp::autocast(DType::BF16);
        assert_eq!(h.matmul(&a.t().unwrap()).unwrap().dtype(), DType::BF16);
        // Integer operands are not cast: still an error.
        assert!(i.matmul(&i.t().unwrap()).is_err());
    }
}

#[test]
fn autocast_is_per_thread() {
    let _ac = amp::autocast(DType::F16);
    let other = std::thread::spawn(amp::autocast_dtype).join().unwrap();
    assert_eq!(other, None);
    assert_eq!(amp::autocast_dtype(), Some(DType::F16));
}

#[test]
fn move_to_device_in_place_on_the_cpu_and_unavailable_cuda() {
    let w = randn(&[3, 4], 9).to_var().unwrap();
    let holder = w.clone(); // what a module field would hold
    let view = w.t().unwrap();
    w.move_to_device_(Device::Cpu).unwrap(); // already there: nothing to do
    assert_eq!(holder.device(), Device::Cpu);
    if sinter_core::cuda::is_available() {
        // On a GPU machine: the parameter, its clones and its views all follow.
        let before = w.to_vec_f32().unwrap();
        w.set_grad(Some(w.ones_like().unwrap()));
        w.move_to_device_(Device::Cuda(0)).unwrap();
        assert_eq!(holder.device(), Device::Cuda(0));
        assert_eq!(view.device(), Device::Cuda(0));
        assert_eq!(w.grad().unwrap().device(), Device::Cuda(0));
        assert_eq!(holder.to_vec_f32().unwrap(), before);
        assert!(w.is_variable());
        // A view into part of a storage cannot be moved in place.
        assert!(w
            .narrow(0, 1, 2)
            .unwrap()
            .move_to_device_(Device::Cpu)
            .is_err());
        w.move_to_device_(Device::Cpu).unwrap();
        assert_eq!(holder.device(), Device::Cpu);
        assert_eq!(holder.to_vec_f32().unwrap(), before);
    } else {
        // No CUDA here: an error that says why, not a panic, and the tensor stays usable.
        let e = w.move_to_device_(Device::Cuda(0)).unwrap_err();
        assert!(
            matches!(e, Error::DeviceUnavailable(Device::Cuda(0), _)),
            "{e}"
        );
        assert_eq!(holder.device(), Device::Cpu);
        let loss = holder.sqr().unwrap().sum_all().unwrap();
        loss.backward().unwrap();
        assert_eq!(w.grad().unwrap().shape(), &[3, 4]);
    }
}

#[test]
fn autocast_on_cuda_matches_autocast_on_the_cpu() {
    if !sinter_core::cuda::is_available() {
        eprintln!("skipped: no CUDA device");
        return;
    }
    let gpu = Device::Cuda(0);
    let x = randn(&[64, 32], 11);
    let w1 = randn(&[32, 48], 12).mul_scalar(0.2).unwrap();
    let b1 = randn(&[48], 13);
    let w2 = randn(&[48, 10], 14).mul_scalar(0.2).unwrap();
    // tanh, not relu: a pre-activation within one rounding of zero would flip a relu mask
    // between the backends and move a gradient by a whole term.
    // Same operands rounded to the same dtype on both sides; only the f32 summation order and
    // the final rounding differ: a couple of units in the last place of the low dtype.
    for (dt, ulp) in [(DType::BF16, 2f32.powi(-8)), (DType::F16, 2f32.powi(-11))] {
        let run = |device: Device| {
            let (w1, b1, w2) = (
                w1.to_device(device).unwrap().to_var().unwrap(),
                b1.to_device(device).unwrap().to_var().unwrap(),
                w2.to_device(device).unwrap().to_var().unwrap(),
            );
            let x = x.to_device(device).unwrap();
            let y = {
                let _ac = amp::autocast(dt);
                x.matmul(&w1)
                    .unwrap()
                    .add(&b1)
                    .unwrap()
                    .tanh()
                    .unwrap()
                    .matmul(&w2)
                    .unwrap()
            };
            assert_eq!(y.dtype(), dt);
            y.to_dtype(DType::F32)
                .unwrap()
                .sqr()
                .unwrap()
                .mean_all()
                .unwrap()
                .backward()
                .unwrap();
            let grads: Vec<Tensor> = [&w1, &b1, &w2].iter().map(|p| p.grad().unwrap()).collect();
            for g in &grads {
                assert_eq!((g.dtype(), g.device()), (DType::F32, device));
            }
            (y, grads)
        };
        let (yc, gc) = run(Device::Cpu);
        let (yg, gg) = run(gpu);
        let close = |a: &Tensor, b: &Tensor, what: &str| {
            let scale = a
                .to_vec_f32()
                .unwrap()
                .iter()
                .fold(0f32, |m, v| m.max(v.abs()))
                .max(1e-6);
            let d = max_abs_diff(a, b);
            assert!(
                d <= 8.0 * ulp * scale,
                "{dt} {what}: max diff {d} (scale {scale})"
            );
        };
        close(&yc, &yg, "output");
        for (i, (a, b)) in gc.iter().zip(&gg).enumerate() {
            close(a, b, &format!("gradient {i}"));
        }
    }
}
