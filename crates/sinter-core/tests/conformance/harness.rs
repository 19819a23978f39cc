//! The runner: which devices are under test, one trial per (device, dtype, case), inputs made
//! on the target, and the one comparison every case uses — the op's output against the f64
//! reference, and every input's gradient against the reference's derivative (central
//! differences of the f64 reference, in f64).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use sinter_core::{DType, Device, Result, Rng, Tensor};
use sinter_cuda::testing::{self, TestDevice};

use crate::reference::{rounded, unit_roundoff, Arr};

pub const FLOATS: &[DType] = &[DType::F32, DType::BF16, DType::F16];
pub const F32: &[DType] = &[DType::F32];
pub const HALVES: &[DType] = &[DType::BF16, DType::F16];
pub const I64: &[DType] = &[DType::I64];
pub const ALL: &[DType] = &[DType::F32, DType::BF16, DType::F16, DType::I64];
pub const BOOL: &[DType] = &[DType::Bool];
/// Every dtype a tensor holds.
pub const TENSOR: &[DType] = &[DType::F32, DType::BF16, DType::F16, DType::I64, DType::Bool];

// ---- tolerances, stated once -----------------------------------------------------------------------

/// |got − ref| ≤ rel·|ref| + rms·RMS(ref) for every element (the RMS term keeps cancellation
/// near zero from counting as error).
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub rel: f64,
    pub rms: f64,
}

/// The tolerance of one op in `dtype`, for outputs and gradients alike.
/// - f32: 1e-5 (about 170 units of f32 roundoff: room for f32 accumulation over the suite's
///   reductions of up to ~5,000 terms and for the kernels' exp/tanh/erf approximations).
/// - f16 / bf16: 4 units of the dtype's roundoff u (2^-11, 2^-8) per rounding in sequence. One
///   op rounds its f32 result once (≤ u), but a backward rounds again what it reads: products
///   summed over a broadcast (2 roundings), and tanh/sigmoid/softmax gradients computed from
///   the rounded output, whose error 1 − y² amplifies near saturation. A case whose graph
///   rounds to the half dtype several times in sequence (a composite) says how many
///   (`Opts::roundings`).
///
/// An absolute floor of a tenth of the RMS term (times the reference's largest element) keeps
/// a reference that is exactly zero from demanding exact zero (f32 noise of 1e-8 in a gradient
/// that cancels).
pub fn tol(dtype: DType, roundings: f64) -> Tol {
    match dtype {
        DType::F32 => Tol {
            rel: 1e-5,
            rms: 1e-5,
        },
        DType::F16 | DType::BF16 => {
            let u = unit_roundoff(dtype) * 4.0 * roundings;
            Tol { rel: u, rms: u }
        }
        _ => Tol { rel: 0.0, rms: 0.0 },
    }
}

/// Asserts `got` matches `want` within `t`; names the worst element.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], t: Tol) {
    assert_close_scaled(what, got, want, want, t)
}

/// [`assert_close`] relative to `scale` (≥ |want| elementwise) instead of |want|: for a
/// gradient, Σ_k |w_k ∂y_k/∂x_j|, the size of the terms whose rounded sum it is.
pub fn assert_close_scaled(what: &str, got: &[f64], want: &[f64], scale: &[f64], t: Tol) {
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} values, expected {}",
        got.len(),
        want.len()
    );
    let finite: Vec<f64> = scale.iter().copied().filter(|v| v.is_finite()).collect();
    let rms = (finite.iter().map(|v| v * v).sum::<f64>() / finite.len().max(1) as f64).sqrt();
    let floor = 0.1 * t.rms * finite.iter().fold(1e-3f64, |m, v| m.max(v.abs()));
    let mut worst: Option<(usize, f64)> = None;
    for (i, ((&g, &w), &sc)) in got.iter().zip(want).zip(scale).enumerate() {
        if g == w || (g.is_nan() && w.is_nan()) {
            continue;
        }
        let allowed = t.rel * sc.abs().max(w.abs()) + t.rms * rms + floor;
        let ratio = if w.is_finite() && g.is_finite() {
            (g - w).abs() / allowed.max(f64::MIN_POSITIVE)
        } else {
            f64::INFINITY
        };
        if ratio > 1.0 && worst.is_none_or(|(_, r)| ratio > r) {
            worst = Some((i, ratio));
        }
    }
    if let Some((i, ratio)) = worst {
        let bad = got
            .iter()
            .zip(want)
            .zip(scale)
            .filter(|((g, w), sc)| {
                (*g - *w).abs() > t.rel * sc.abs().max(w.abs()) + t.rms * rms + floor
                    || g.is_nan() != w.is_nan()
            })
            .count();
        let error = (got[i] - want[i]).abs();
        let allowed = if t.rel == 0.0 && t.rms == 0.0 {
            "exact comparison".to_string()
        } else {
            format!(
                "{ratio:.2}× allowed; rel {:.1e}, rms {:.1e} × {rms:.3e}",
                t.rel, t.rms
            )
        };
        panic!(
            "{what}: {bad} of {} elements off; worst element {i}: got {}, want {} (error {error:.3e}, {allowed})",
            got.len(),
            got[i],
            want[i],
        );
    }
}

// ---- devices and trials ---------------------------------------------------------------------------

/// A device of this run: `label` goes into every test name (`cpu`, `cuda`, or `cuda-emu` for
/// the emulated CUDA device), `None` device: listed but not runnable here (ignored).
#[derive(Clone, Copy, Debug)]
pub struct Dut {
    pub label: &'static str,
    pub device: Option<Device>,
    pub emulated: bool,
}

/// The devices under test: the CPU, and the CUDA device of `sinter_cuda::testing` — the real
/// GPU when present, else the emulated CUDA device (required in CI by `SINTER_REQUIRE_EMU=1`;
/// `SINTER_REQUIRE_GPU=1` fails without a real GPU).
pub fn devices() -> Vec<Dut> {
    let cuda = match testing::gpu_tests(1) {
        Some(TestDevice::Real) => Dut {
            label: "cuda",
            device: Some(Device::Cuda(0)),
            emulated: false,
        },
        Some(TestDevice::Emulated(_)) => Dut {
            label: "cuda-emu",
            device: Some(Device::Cuda(0)),
            emulated: true,
        },
        None => Dut {
            label: "cuda",
            device: None,
            emulated: false,
        },
    };
    vec![
        Dut {
            label: "cpu",
            device: Some(Device::Cpu),
            emulated: false,
        },
        cuda,
    ]
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    All,
    CpuOnly,
    CudaOnly,
}

/// One case: a backend-blind function run once per (device, dtype).
#[derive(Clone)]
pub struct Case {
    pub name: String,
    pub dtypes: &'static [DType],
    pub on: On,
    /// Runs alone on the CUDA device: it flips a process-wide setting (TF32, the conv
    /// backend) or leaves a device-side error for the next read of that device.
    pub exclusive: bool,
    /// `#[ignore]` on the devices whose label starts with `.0` (`cpu`, `cuda`): a finding whose
    /// owner is fixing it (`.1` names it).
    pub ignore: Option<(&'static str, &'static str)>,
    /// Needs a real GPU (the reason says why); ignored on the emulated device.
    pub real_gpu: Option<&'static str>,
    pub run: fn(&Target),
}

pub fn case(name: &str, dtypes: &'static [DType], run: fn(&Target)) -> Case {
    Case {
        name: name.to_string(),
        dtypes,
        on: On::All,
        exclusive: false,
        ignore: None,
        real_gpu: None,
        run,
    }
}

impl Case {
    pub fn cuda_only(mut self) -> Case {
        self.on = On::CudaOnly;
        self
    }
    pub fn cpu_only(mut self) -> Case {
        self.on = On::CpuOnly;
        self
    }
    pub fn exclusive(mut self) -> Case {
        self.exclusive = true;
        self
    }
    pub fn real_gpu(mut self, why: &'static str) -> Case {
        self.real_gpu = Some(why);
        self
    }
    /// Ignored on the devices whose label starts with `device` while a finding is fixed.
    #[allow(dead_code)] // no open finding today; the mechanism stays for the next one
    pub fn ignore_on(mut self, device: &'static str, finding: &'static str) -> Case {
        self.ignore = Some((device, finding));
        self
    }
    /// Prefixes the name with its group (`elementwise::…`).
    pub fn in_group(mut self, group: &str) -> Case {
        self.name = format!("{group}::{}", self.name);
        self
    }
}

/// CUDA trials share the device; an exclusive one has it alone.
static DEVICE_LOCK: RwLock<()> = RwLock::new(());

pub enum DeviceGuard {
    None,
    Shared(#[allow(dead_code)] RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] RwLockWriteGuard<'static, ()>),
}

pub fn lock_device(dut: &Dut, exclusive: bool) -> DeviceGuard {
    if !matches!(dut.device, Some(Device::Cuda(_))) {
        return DeviceGuard::None;
    }
    if exclusive {
        DeviceGuard::Alone(DEVICE_LOCK.write().unwrap_or_else(|p| p.into_inner()))
    } else {
        DeviceGuard::Shared(DEVICE_LOCK.read().unwrap_or_else(|p| p.into_inner()))
    }
}

// ---- the target of one trial ------------------------------------------------------------------------

/// Where and in what dtype a case runs.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    pub dev: Device,
    pub dtype: DType,
    pub emulated: bool,
}

/// An input of a checked op.
#[derive(Clone, Debug)]
pub enum In {
    /// A float input in the target dtype that tracks gradients.
    Var(Arr),
    /// A float input in the target dtype (i64 when the target is), no gradient.
    Fixed(Arr),
    /// Integer ids (i64) on the target device.
    Ids(Arr),
    /// Integer ids (i64) left on the host.
    HostIds(Arr),
    /// An f32 input whatever the target dtype.
    F32(Arr),
    /// A bool input whatever the target dtype (masks, conditions): non-zero is true.
    Bool(Arr),
    /// An f32 variable whatever the target dtype (master weights under autocast).
    VarF32(Arr),
}

/// Rounds the intermediate results of a composite reference to the target dtype where the
/// graph under test stores them; the gradient reference treats rounding as the identity
/// (the device's backward passes gradients straight through a cast), so it stays smooth.
pub struct Rd {
    dtype: Option<DType>,
}

impl Rd {
    /// No rounding: the smooth reference of the gradients.
    pub fn smooth() -> Rd {
        Rd { dtype: None }
    }
    pub fn r(&self, a: Arr) -> Arr {
        match self.dtype {
            Some(d) if d.is_float() => rounded(&a, d),
            _ => a,
        }
    }
}

/// How a case compares.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    /// The op only moves or selects values: bit-exact in every dtype.
    pub exact: bool,
    /// Half-precision roundings in sequence that the graph under test performs (see [`tol`]).
    pub roundings: f64,
    /// The output dtype when it is not the target dtype.
    pub out: Option<DType>,
    /// An f32 tolerance other than [`tol`]'s, where the op's f32 path is not f32 arithmetic
    /// (TF32 products); the reason is stated at the case.
    pub f32_tol: Option<f64>,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            exact: false,
            roundings: 1.0,
            out: None,
            f32_tol: None,
        }
    }
}

pub const EXACT: Opts = Opts {
    exact: true,
    roundings: 1.0,
    out: None,
    f32_tol: None,
};

/// An op that returns bools (comparisons, logical ops, any / all): compared exactly.
pub const BOOL_OUT: Opts = Opts {
    out: Some(DType::Bool),
    ..EXACT
};

pub fn rounds(n: f64) -> Opts {
    Opts {
        roundings: n,
        ..Opts::default()
    }
}

/// Seeds from a case name: the same inputs on every device and dtype.
pub fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl Target {
    pub fn tol(&self) -> Tol {
        tol(self.dtype, 1.0)
    }
    /// The same seeded generator on every target.
    pub fn rng(&self, seed: u64) -> Rng {
        Rng::new(seed)
    }
    /// `a` rounded to the target dtype.
    pub fn round(&self, a: &Arr) -> Arr {
        rounded(a, self.dtype)
    }
    /// A tensor of `a`'s values (rounded) in the target dtype on the target device.
    pub fn tensor(&self, a: &Arr) -> Tensor {
        self.tensor_as(a, self.dtype)
    }
    pub fn tensor_as(&self, a: &Arr, dtype: DType) -> Tensor {
        make(a, dtype, self.dev)
    }
    pub fn ids(&self, v: &[i64], shape: &[usize]) -> Tensor {
        Tensor::from_vec(v.to_vec(), shape, self.dev).unwrap()
    }
    /// A tensor of zeros of `dtype` on the device.
    pub fn zeros(&self, shape: &[usize], dtype: DType) -> Tensor {
        Tensor::zeros(shape, dtype, self.dev).unwrap()
    }

    /// Checks `f` on the target against the reference `r`, outputs and gradients.
    pub fn check(
        &self,
        what: &str,
        inputs: &[In],
        f: impl Fn(&[Tensor]) -> Result<Tensor>,
        r: impl Fn(&[Arr], &Rd) -> Arr,
    ) {
        self.check_with(what, Opts::default(), inputs, f, r)
    }

    pub fn check_with(
        &self,
        what: &str,
        o: Opts,
        inputs: &[In],
        f: impl Fn(&[Tensor]) -> Result<Tensor>,
        r: impl Fn(&[Arr], &Rd) -> Arr,
    ) {
        self.check_impl(what, o, inputs, &f, &r, None)
    }

    /// As [`Target::check_with`], with the reference's vector-Jacobian product written out
    /// (`vjp(inputs, w)` = the gradient of Σ w ∘ r(inputs) for every input) where central
    /// differences would cost too much.
    pub fn check_vjp(
        &self,
        what: &str,
        o: Opts,
        inputs: &[In],
        f: impl Fn(&[Tensor]) -> Result<Tensor>,
        r: impl Fn(&[Arr], &Rd) -> Arr,
        vjp: impl Fn(&[Arr], &Arr) -> Vec<Arr>,
    ) {
        self.check_impl(what, o, inputs, &f, &r, Some(&vjp))
    }

    fn check_impl(
        &self,
        what: &str,
        o: Opts,
        inputs: &[In],
        f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
        r: &dyn Fn(&[Arr], &Rd) -> Arr,
        vjp: Option<&dyn Fn(&[Arr], &Arr) -> Vec<Arr>>,
    ) {
        let what = format!("{what} [{} {}]", self.dev, self.dtype);
        let (xs, refs) = self.inputs(inputs);
        let y = f(&xs).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            y.device(),
            self.dev,
            "{what}: the output lives on the inputs' device"
        );
        let out_dtype = o.out.unwrap_or(self.dtype);
        assert_eq!(y.dtype(), out_dtype, "{what}: output dtype");
        let want = r(
            &refs,
            &Rd {
                dtype: Some(out_dtype),
            },
        );
        assert_eq!(y.shape(), &want.shape[..], "{what}: output shape");
        let got = y
            .to_vec_f64()
            .unwrap_or_else(|e| panic!("{what}: reading the output: {e}"));
        let t = self.tol_for(o);
        if o.exact || !out_dtype.is_float() {
            let want = rounded(&want, out_dtype);
            assert_close(
                &format!("{what} output (exact)"),
                &got,
                &want.data,
                Tol { rel: 0.0, rms: 0.0 },
            );
        } else {
            assert_close(&format!("{what} output"), &got, &want.data, t);
        }
        let vars: Vec<usize> = (0..inputs.len())
            .filter(|&i| matches!(inputs[i], In::Var(_) | In::VarF32(_)))
            .collect();
        if vars.is_empty() {
            return;
        }
        assert!(
            y.tracks_grad(),
            "{what}: the output does not track gradients"
        );
        // loss = Σ w ∘ y with fixed weights in the output dtype (each element its own gradient).
        let mut wr = Rng::new(seed_of(&what) ^ 0x5eed);
        let w = rounded(
            &Arr::from_fn(&want.shape, |_| wr.uniform(-1.0, 1.0)),
            out_dtype,
        );
        y.mul(&make(&w, out_dtype, self.dev))
            .and_then(|l| l.sum_all())
            .and_then(|l| l.backward())
            .unwrap_or_else(|e| panic!("{what}: backward: {e}"));
        let smooth = Rd { dtype: None };
        let analytic = vjp.map(|g| g(&refs, &w));
        for &i in &vars {
            let g = xs[i]
                .grad()
                .unwrap_or_else(|| panic!("{what}: no gradient reached input {i}"));
            assert_eq!(
                g.device(),
                self.dev,
                "{what}: gradient of input {i} lives on the device"
            );
            assert_eq!(
                g.dtype(),
                xs[i].dtype(),
                "{what}: gradient dtype of input {i}"
            );
            assert_eq!(
                g.shape(),
                xs[i].shape(),
                "{what}: gradient shape of input {i}"
            );
            let gv = g.to_vec_f64().unwrap();
            let picks = if analytic.is_some() {
                (0..gv.len()).collect()
            } else {
                pick(refs[i].numel(), &mut wr)
            };
            let (want, scale): (Vec<f64>, Vec<f64>) = match &analytic {
                // The size of an analytic gradient's terms is not known: a hundredth of the
                // largest gradient element of any input stands in where an element cancels.
                Some(gs) => {
                    let gmax = gs
                        .iter()
                        .flat_map(|g| &g.data)
                        .fold(0f64, |m, v| m.max(v.abs()));
                    picks
                        .iter()
                        .map(|&j| (gs[i].data[j], gs[i].data[j].abs().max(0.01 * gmax)))
                        .unzip()
                }
                None => picks
                    .iter()
                    .map(|&j| fd_grad(&refs, i, j, &w, &|x| r(x, &smooth)))
                    .unzip(),
            };
            let got: Vec<f64> = picks.iter().map(|&j| gv[j]).collect();
            assert_close_scaled(
                &format!("{what} gradient of input {i}"),
                &got,
                &want,
                &scale,
                self.grad_tol(o),
            );
        }
    }

    /// Gradients in half precision: as [`tol`], with twice its RMS term — a backward computed
    /// from a rounded output (tanh, sigmoid, softmax) is off by up to |dy|·u·|y| per element,
    /// several units of the gradient's RMS where the function saturates.
    fn grad_tol(&self, o: Opts) -> Tol {
        let t = self.tol_for(o);
        match self.dtype {
            DType::F16 | DType::BF16 => Tol {
                rel: t.rel,
                rms: 2.0 * t.rms,
            },
            _ => t,
        }
    }

    fn tol_for(&self, o: Opts) -> Tol {
        match (self.dtype, o.f32_tol) {
            (DType::F32, Some(x)) => Tol { rel: x, rms: x },
            _ => tol(
                if self.dtype == DType::I64 {
                    DType::F32
                } else {
                    self.dtype
                },
                o.roundings,
            ),
        }
    }

    /// Device tensors and the (rounded) values the reference sees.
    fn inputs(&self, inputs: &[In]) -> (Vec<Tensor>, Vec<Arr>) {
        inputs
            .iter()
            .map(|i| match i {
                In::Var(a) => {
                    assert!(
                        self.dtype.is_float(),
                        "test bug: a variable needs a float dtype"
                    );
                    let a = self.round(a);
                    (make(&a, self.dtype, self.dev).to_var().unwrap(), a)
                }
                In::Fixed(a) => {
                    let a = self.round(a);
                    (make(&a, self.dtype, self.dev), a)
                }
                In::Ids(a) => (make(a, DType::I64, self.dev), a.clone()),
                In::HostIds(a) => (make(a, DType::I64, Device::Cpu), a.clone()),
                In::F32(a) => {
                    let a = rounded(a, DType::F32);
                    (make(&a, DType::F32, self.dev), a)
                }
                In::Bool(a) => {
                    let a = rounded(a, DType::Bool);
                    (make(&a, DType::Bool, self.dev), a)
                }
                In::VarF32(a) => {
                    let a = rounded(a, DType::F32);
                    (make(&a, DType::F32, self.dev).to_var().unwrap(), a)
                }
            })
            .unzip()
    }
}

/// A tensor of `a` (exactly representable in `dtype`, or rounded by the cast) on `dev`.
pub fn make(a: &Arr, dtype: DType, dev: Device) -> Tensor {
    let t = if dtype == DType::I64 {
        let v: Vec<i64> = a.data.iter().map(|&x| x as i64).collect();
        Tensor::from_vec(v, &a.shape, Device::Cpu).unwrap()
    } else {
        let v: Vec<f32> = a.data.iter().map(|&x| x as f32).collect();
        Tensor::from_vec(v, &a.shape, Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
    };
    t.to_device(dev).unwrap()
}

/// Reads any tensor as an [`Arr`].
pub fn arr(t: &Tensor) -> Arr {
    Arr::new(t.shape(), t.to_vec_f64().unwrap())
}

/// Which gradient elements to compare: all of a small input, else a seeded sample of 48.
fn pick(n: usize, rng: &mut Rng) -> Vec<usize> {
    const ALL_UP_TO: usize = 64;
    if n <= ALL_UP_TO {
        return (0..n).collect();
    }
    let mut all: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    all.truncate(48);
    all.sort_unstable();
    all
}

/// d/dx_j of Σ w ∘ r(x) at input `i`, element `j`, by central differences in f64; and
/// Σ_k |w_k ∂y_k/∂x_j|, the size of the terms of that sum.
fn fd_grad(x: &[Arr], i: usize, j: usize, w: &Arr, r: &dyn Fn(&[Arr]) -> Arr) -> (f64, f64) {
    let h = 1e-6 * x[i].data[j].abs().max(1.0);
    let eval = |delta: f64| {
        let mut xs = x.to_vec();
        xs[i].data[j] += delta;
        r(&xs).data
    };
    let (p, m) = (eval(h), eval(-h));
    let terms = p
        .iter()
        .zip(&m)
        .zip(&w.data)
        .map(|((a, b), w)| w * (a - b) / (2.0 * h));
    terms.fold((0.0, 0.0), |(s, a), v| (s + v, a + v.abs()))
}

// ---- input generators -------------------------------------------------------------------------------

pub fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Arr {
    Arr::from_fn(shape, |_| rng.uniform(lo, hi))
}

/// |x| in [gap, hi) with random sign: clear of the kinks at 0 (relu, abs) and of poles.
pub fn away_from_zero(rng: &mut Rng, shape: &[usize], gap: f64, hi: f64) -> Arr {
    Arr::from_fn(shape, |_| {
        let m = rng.uniform(gap, hi);
        if rng.next_f64() < 0.5 {
            -m
        } else {
            m
        }
    })
}

/// Distinct values on a 1/8 grid (exact in every float dtype for |x| < 32), shuffled: no ties
/// for max/min/argmax/max-pool, and gaps far larger than the finite-difference step.
pub fn distinct(rng: &mut Rng, shape: &[usize]) -> Arr {
    let n: usize = shape.iter().product();
    assert!(n <= 512, "test bug: distinct() keeps |x| < 32");
    let mut v: Vec<f64> = (0..n).map(|i| (i as f64 - n as f64 / 2.0) / 8.0).collect();
    for i in (1..n).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
    Arr::new(shape, v)
}

/// Values in {-1, -0.5, 0, 0.5, 1}: comparisons see many equal pairs.
pub fn grid(rng: &mut Rng, shape: &[usize]) -> Arr {
    Arr::from_fn(shape, |_| rng.below(5) as f64 * 0.5 - 1.0)
}

pub fn rand_shape(rng: &mut Rng, rank: usize, lo: usize, hi: usize) -> Vec<usize> {
    (0..rank)
        .map(|_| lo + rng.below((hi - lo + 1) as u64) as usize)
        .collect()
}

/// The error message of a failing op (panics on success).
pub fn err_msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.to_string(),
    }
}

/// Asserts the op failed with a message naming `op`.
pub fn expect_err<T: std::fmt::Debug>(r: Result<T>, op: &str) {
    let m = err_msg(r);
    assert!(
        m.contains(op),
        "error message {m:?} does not name the op {op:?}"
    );
}
