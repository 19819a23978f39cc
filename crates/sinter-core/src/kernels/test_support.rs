//! What the kernel folders' tests share: the devices to run on, deterministic inputs, and the
//! one closeness rule the folders check their results against the f64 references with (each
//! test keeps its own tolerances).

use crate::{DType, Device, Tensor};

/// The CPU, and the CUDA device when present (the real GPU, else the emulated one).
pub(crate) fn devices() -> Vec<Device> {
    let mut v = vec![Device::Cpu];
    v.extend(sinter_cuda::testing::gpu_tests(1).map(|_| Device::Cuda(0)));
    v
}

/// Deterministic values in [lo, hi).
pub(crate) fn values(seed: u64, len: usize, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

/// Whether NVRTC and the CUDA headers are here for the folders' compile tests: false (with a
/// note) when they are not, unless SINTER_REQUIRE_NVRTC=1 (CI), where that fails the test.
pub(crate) fn nvrtc_available() -> bool {
    use sinter_cuda::nvrtc;
    if nvrtc::nvrtc_present() && nvrtc::find_cuda_include().is_ok() {
        return true;
    }
    let required = std::env::var("SINTER_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "SINTER_REQUIRE_NVRTC=1 but NVRTC or the CUDA headers are missing"
    );
    eprintln!("skipped: NVRTC not found (run .ci/nvrtc-setup)");
    false
}

/// A variable of `d` on `dev` holding `v` rounded to `d`, and the rounded values: the reference
/// sees exactly the inputs the kernels do.
pub(crate) fn var(v: Vec<f32>, shape: &[usize], d: DType, dev: Device) -> (Tensor, Vec<f64>) {
    let t = Tensor::from_vec(v, shape, Device::Cpu)
        .unwrap()
        .to_dtype(d)
        .unwrap();
    let f = f64s(&t);
    (t.to_device(dev).unwrap().to_var().unwrap(), f)
}

/// A tensor's values, widened to f64 for comparing with a reference.
pub(crate) fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_vec_f32().unwrap().into_iter().map(f64::from).collect()
}

/// (relative, absolute) tolerance of a value stored in each float dtype.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tol {
    pub f32: (f64, f64),
    pub bf16: (f64, f64),
    pub f16: (f64, f64),
}

impl Tol {
    pub(crate) fn of(&self, d: DType) -> (f64, f64) {
        match d {
            DType::F32 => self.f32,
            DType::BF16 => self.bf16,
            DType::F16 => self.f16,
            other => panic!("no tolerance for {other}: the kernel tests compare float dtypes"),
        }
    }
}

/// Every `got[i]` within `rel·|want[i]| + abs` of `want[i]` (a NaN never is); an infinite
/// `want` (a row with nothing to attend to, say) must be matched exactly.
pub(crate) fn assert_close<G, W>(what: &str, got: &[G], want: &[W], (rel, abs): (f64, f64))
where
    G: Copy + Into<f64>,
    W: Copy + Into<f64>,
{
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (g, w): (f64, f64) = (g.into(), w.into());
        let ok = if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= rel * w.abs() + abs
        };
        assert!(ok, "{what}[{i}]: got {g}, want {w}");
    }
}

/// Runs the backward from sum(y · gy), `gy` held constant: each variable under `y` then holds
/// its gradient for the upstream gradient `gy`.
pub(crate) fn backward_with(y: &Tensor, gy: &Tensor) {
    y.mul(&gy.detach())
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
}

/// The gradient the backward left on the variable `v` within `tol` of `want` (as
/// [`assert_close`]).
pub(crate) fn assert_grad_close(what: &str, v: &Tensor, want: &[f64], tol: (f64, f64)) {
    let g = v.grad().unwrap_or_else(|| panic!("{what}: no gradient"));
    assert_close(what, &f64s(&g), want, tol);
}

/// The largest finite magnitude in `want`, at least 1e-3: the scale of an absolute tolerance
/// for results whose error follows the operands, not each (possibly cancelling) result.
pub(crate) fn magnitude(want: &[f64]) -> f64 {
    want.iter()
        .filter(|w| w.is_finite())
        .fold(1e-3, |a, w| a.max(w.abs()))
}

/// The rule itself: what it lets through and what it stops, so a folder's test can fail.
mod tests {
    use super::assert_close;

    #[test]
    fn values_within_the_tolerance_pass() {
        assert_close("x", &[1.0f32, -2.0], &[1.0 + 1e-7, -2.0], (1e-6, 0.0));
        assert_close("x", &[1e-9f64], &[0.0], (0.0, 1e-8));
        assert_close("x", &[f64::NEG_INFINITY], &[f64::NEG_INFINITY], (0.0, 0.0));
    }

    #[test]
    #[should_panic(expected = "x[1]: got 2.1, want 2")]
    fn a_value_past_the_tolerance_fails_and_says_where() {
        assert_close("x", &[1.0, 2.1], &[1.0, 2.0], (1e-2, 1e-3));
    }

    #[test]
    #[should_panic(expected = "x[0]: got NaN")]
    fn nan_is_never_close() {
        assert_close("x", &[f64::NAN], &[0.0], (1.0, 1.0));
    }

    #[test]
    #[should_panic(expected = "want -inf")]
    fn an_infinite_reference_must_be_matched_exactly() {
        assert_close("x", &[-1e30], &[f64::NEG_INFINITY], (1.0, 1.0));
    }

    #[test]
    #[should_panic(expected = "x: lengths")]
    fn lengths_must_agree() {
        assert_close("x", &[1.0, 2.0], &[1.0], (1.0, 1.0));
    }
}
