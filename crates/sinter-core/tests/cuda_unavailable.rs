//! Without CUDA, every request for a CUDA device is an error value that says why, never a
//! panic, and CPU tensors are untouched. This binary never selects the emulated device, so in
//! CI (no GPU) it sees CUDA unavailable; where CUDA is usable (a GPU, or `SINTER_CUDA_EMU` set
//! by hand) the same calls must succeed instead.

use sinter_core::{cuda, DType, Device, Error, Result, Rng, Tensor};

fn assert_unavailable<T: std::fmt::Debug>(what: &str, r: Result<T>) {
    match r {
        Err(Error::DeviceUnavailable(d, why)) => {
            assert!(d.is_cuda(), "{what}: {d}");
            assert!(!why.trim().is_empty(), "{what}: the error says why");
        }
        other => panic!("{what}: expected DeviceUnavailable, got {other:?}"),
    }
}

#[test]
fn cuda_requests_without_a_device_are_errors() {
    let d = Device::Cuda(0);
    if cuda::is_available() {
        assert!(Tensor::zeros(&[2], DType::F32, d).is_ok());
        assert!(Tensor::from_vec(vec![1f32, 2.], &[2], d).is_ok());
    } else {
        assert_unavailable("zeros", Tensor::zeros(&[2, 3], DType::F32, d));
        assert_unavailable("ones", Tensor::ones(&[2], DType::BF16, d));
        assert_unavailable("full", Tensor::full(1.0, &[2], DType::I64, d));
        assert_unavailable("from_vec", Tensor::from_vec(vec![1f32, 2.0], &[2], d));
        assert_unavailable("from_slice", Tensor::from_slice(&[1i64, 2], &[2], d));
        assert_unavailable("arange", Tensor::arange(0.0, 4.0, 1.0, DType::F32, d));
        assert_unavailable(
            "rand_uniform",
            Tensor::rand_uniform(&[3], 0.0, 1.0, &mut Rng::new(0), DType::F32, d),
        );
        assert_unavailable(
            "randn",
            Tensor::randn(&[3], 0.0, 1.0, &mut Rng::new(0), DType::F32, d),
        );
        let x = Tensor::from_vec(vec![1f32, 2.0, 3.0], &[3], Device::Cpu).unwrap();
        assert_unavailable("to_device", x.to_device(d));
        assert_unavailable("to_device of a variable", x.to_var().unwrap().to_device(d));
        assert_unavailable("memory_stats", cuda::memory_stats(0));
        let e = Tensor::zeros(&[1], DType::F32, d).unwrap_err().to_string();
        assert!(e.contains("cuda:0") || e.contains("Cuda(0)"), "{e}");
        assert_eq!(cuda::device_count(), 0);
        assert!(
            cuda::report().contains("libcuda") || cuda::report().contains("driver"),
            "{}",
            cuda::report()
        );
        // A parameter asked to move stays usable where it is.
        let w = x.to_var().unwrap();
        let holder = w.clone();
        let e = w.move_to_device_(d).unwrap_err();
        assert!(
            matches!(e, Error::DeviceUnavailable(Device::Cuda(0), _)),
            "{e}"
        );
        assert_eq!(holder.device(), Device::Cpu);
        holder.sqr().unwrap().sum_all().unwrap().backward().unwrap();
        assert_eq!(w.grad().unwrap().shape(), &[3]);
    }
    // A device that does not exist is an error everywhere.
    assert_unavailable("cuda:99", Tensor::zeros(&[1], DType::F32, Device::Cuda(99)));
    let x = Tensor::from_vec(vec![1f32, 2.0], &[2], Device::Cpu).unwrap();
    assert_eq!(
        x.to_device(Device::Cpu).unwrap().to_vec_f32().unwrap(),
        vec![1.0, 2.0]
    );
}
