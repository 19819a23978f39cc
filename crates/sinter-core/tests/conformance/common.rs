//! Shared helpers: seeded random tensors, a tiny f64 n-d array for references, closeness
//! assertions, and the central-finite-difference gradient checker.

use sinter_core::{no_grad, DType, Device, Result, Rng, Tensor};

pub const CPU: Device = Device::Cpu;

// ---- building inputs --------------------------------------------------------------------------

/// An f32 tensor holding `data` (rounded to f32).
pub fn tensor(data: &[f64], shape: &[usize]) -> Tensor {
    let v: Vec<f32> = data.iter().map(|&x| x as f32).collect();
    Tensor::from_vec(v, shape, CPU).unwrap()
}

pub fn ids(data: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_vec(data.to_vec(), shape, CPU).unwrap()
}

/// Uniform f32 values in [lo, hi).
pub fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64) -> Tensor {
    Tensor::rand_uniform(shape, lo, hi, rng, DType::F32, CPU).unwrap()
}

/// Standard-normal f32 values.
pub fn normal(rng: &mut Rng, shape: &[usize]) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, CPU).unwrap()
}

/// Values with |x| in [gap, hi) and random sign: keeps clear of kinks at 0 (relu, abs).
pub fn away_from_zero(rng: &mut Rng, shape: &[usize], gap: f64, hi: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            let m = rng.uniform(gap, hi);
            if rng.next_f64() < 0.5 {
                -m
            } else {
                m
            }
        })
        .collect();
    tensor(&v, shape)
}

/// Pairwise distinct values at least `spacing` apart (a shuffled grid plus small jitter),
/// centred on 0: keeps max/min/argmax/max-pool clear of ties.
pub fn distinct(rng: &mut Rng, shape: &[usize], spacing: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut v: Vec<f64> = (0..n)
        .map(|i| (i as f64 - n as f64 / 2.0) * spacing + rng.uniform(0.0, 0.2 * spacing))
        .collect();
    shuffle(rng, &mut v);
    tensor(&v, shape)
}

pub fn shuffle<T>(rng: &mut Rng, v: &mut [T]) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// A random shape of the given rank with every size in lo..=hi.
pub fn rand_shape(rng: &mut Rng, rank: usize, lo: usize, hi: usize) -> Vec<usize> {
    (0..rank)
        .map(|_| lo + rng.below((hi - lo + 1) as u64) as usize)
        .collect()
}

pub fn vals(t: &Tensor) -> Vec<f64> {
    t.to_vec_f64().unwrap()
}

// ---- f64 reference arrays ---------------------------------------------------------------------

/// Row-major strides.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f` with every multi-index of `shape`, in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        f(&idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// NumPy broadcasting, written independently of the crate's.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Vec<usize> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            assert!(da == db || da == 1 || db == 1, "test bug: {a:?} vs {b:?}");
            da.max(db)
        })
        .collect()
}

/// A plain f64 n-d array.
#[derive(Clone, Debug)]
pub struct Arr {
    pub shape: Vec<usize>,
    pub data: Vec<f64>,
}

impl Arr {
    pub fn new(shape: &[usize], data: Vec<f64>) -> Arr {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "test bug: Arr size"
        );
        Arr {
            shape: shape.to_vec(),
            data,
        }
    }
    pub fn of(t: &Tensor) -> Arr {
        Arr::new(t.shape(), vals(t))
    }
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Arr {
        let mut data = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |i| data.push(f(i)));
        Arr::new(shape, data)
    }
    pub fn get(&self, idx: &[usize]) -> f64 {
        assert_eq!(idx.len(), self.shape.len());
        let s = strides(&self.shape);
        self.data[idx.iter().zip(&s).map(|(i, s)| i * s).sum::<usize>()]
    }
    /// Reads at an index of a (possibly larger) broadcast shape: trailing dims align, size-1
    /// dims read position 0.
    pub fn get_bcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let own: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(k, &d)| if d == 1 { 0 } else { idx[lead + k] })
            .collect();
        self.get(&own)
    }
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Arr {
        Arr::new(&self.shape, self.data.iter().map(|&x| f(x)).collect())
    }
    /// Elementwise with broadcasting.
    pub fn zip(&self, other: &Arr, f: impl Fn(f64, f64) -> f64) -> Arr {
        let shape = broadcast_shape(&self.shape, &other.shape);
        Arr::from_fn(&shape, |i| f(self.get_bcast(i), other.get_bcast(i)))
    }
}

// ---- closeness -------------------------------------------------------------------------------

/// Asserts shape equality and |got - want| <= atol + rtol * |want| for every element.
pub fn assert_close(got: &Tensor, want: &Arr, rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.shape(), &want.shape[..], "{what}: shape");
    let g = vals(got);
    assert_close_vec(&g, &want.data, rtol, atol, what);
}

pub fn assert_close_vec(got: &[f64], want: &[f64], rtol: f64, atol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let ok = if w.is_infinite() || w.is_nan() {
            g == w || (g.is_nan() && w.is_nan())
        } else {
            (g - w).abs() <= atol + rtol * w.abs()
        };
        assert!(
            ok,
            "{what}: element {i}: got {g}, want {w} (rtol {rtol}, atol {atol})"
        );
    }
}

/// f32 forward tolerance.
pub const RTOL: f64 = 1e-5;
pub const ATOL: f64 = 1e-5;

pub fn check_f32(got: &Tensor, want: &Arr, what: &str) {
    assert_eq!(got.dtype(), DType::F32, "{what}: dtype");
    assert_close(got, want, RTOL, ATOL, what);
}

/// Error message of a failing op (panics when it succeeded).
pub fn err_msg<T: std::fmt::Debug>(r: Result<T>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.to_string(),
    }
}

/// Asserts the op failed with a message that names `op`.
pub fn expect_err<T: std::fmt::Debug>(r: Result<T>, op: &str) {
    let m = err_msg(r);
    assert!(
        m.contains(op),
        "error message {m:?} does not name the op {op:?}"
    );
}

// ---- gradient checking -----------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub struct Check {
    /// Finite-difference step (applied to f32 inputs of magnitude ~1).
    pub h: f64,
    pub rtol: f64,
    pub atol: f64,
    /// At most this many elements per input are perturbed (a seeded random subset).
    pub max_elems: usize,
}

impl Default for Check {
    fn default() -> Self {
        Check {
            h: 1e-2,
            rtol: 2e-2,
            atol: 2e-3,
            max_elems: 48,
        }
    }
}

/// Elementwise comparison of analytic and finite-difference gradients. Returns the first
/// offending element as an error. Also rejects a finite-difference gradient that is all
/// (near) zero, which would make the check vacuous.
pub fn compare_grads(
    an: &[(usize, f64)],
    fd: &[(usize, f64)],
    c: &Check,
) -> std::result::Result<(), String> {
    let mut largest = 0f64;
    for (&(j, a), &(j2, f)) in an.iter().zip(fd) {
        assert_eq!(j, j2);
        largest = largest.max(f.abs());
        let err = (a - f).abs();
        if err.is_nan() || err > c.atol + c.rtol * a.abs().max(f.abs()) {
            return Err(format!("element {j}: analytic {a}, finite difference {f}"));
        }
    }
    if largest < 1e-3 {
        return Err(format!(
            "finite-difference gradient is vacuous (max |fd| = {largest})"
        ));
    }
    Ok(())
}

fn pick(n: usize, max: usize, rng: &mut Rng) -> Vec<usize> {
    let mut all: Vec<usize> = (0..n).collect();
    if n > max {
        shuffle(rng, &mut all);
        all.truncate(max);
        all.sort_unstable();
    }
    all
}

/// Gradients of `sum(f(inputs) * w)` for fixed random weights `w`: returns per input the
/// analytic gradient (from backward on variables) and the central finite difference, on a
/// subset of elements.
#[allow(clippy::type_complexity)]
pub fn grads(
    name: &str,
    inputs: &[Tensor],
    c: &Check,
    f: &dyn Fn(&[Tensor]) -> Result<Tensor>,
) -> Vec<(Vec<(usize, f64)>, Vec<(usize, f64)>)> {
    let vars: Vec<Tensor> = inputs.iter().map(|t| t.to_var().unwrap()).collect();
    let y = f(&vars).unwrap_or_else(|e| panic!("{name}: forward failed: {e}"));
    assert!(y.tracks_grad(), "{name}: output does not track gradients");
    let mut rng = Rng::new(name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    }));
    let w = normal(&mut rng, y.shape());
    let wv = vals(&w);
    y.mul(&w)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap_or_else(|e| panic!("{name}: backward failed: {e}"));

    let plain: Vec<Tensor> = inputs.iter().map(|t| tensor(&vals(t), t.shape())).collect();
    let _ng = no_grad();
    let mut out = Vec::new();
    for (i, v) in vars.iter().enumerate() {
        let g = v
            .grad()
            .unwrap_or_else(|| panic!("{name}: no gradient reached input {i}"));
        assert_eq!(
            g.shape(),
            inputs[i].shape(),
            "{name}: gradient shape of input {i}"
        );
        assert_eq!(
            g.dtype(),
            inputs[i].dtype(),
            "{name}: gradient dtype of input {i}"
        );
        let gv = vals(&g);
        let base = vals(&plain[i]);
        let mut an = Vec::new();
        let mut fd = Vec::new();
        for j in pick(base.len(), c.max_elems, &mut rng) {
            let eval = |delta: f64| -> (Vec<f64>, f64) {
                let mut xs = base.clone();
                let xv = (xs[j] + delta) as f32 as f64;
                xs[j] = xv;
                let mut args = plain.clone();
                args[i] = tensor(&xs, inputs[i].shape());
                let y = f(&args).unwrap();
                (vals(&y), xv)
            };
            let (yp, xp) = eval(c.h);
            let (ym, xm) = eval(-c.h);
            let d: f64 = wv
                .iter()
                .zip(yp.iter().zip(&ym))
                .map(|(w, (p, m))| w * (p - m))
                .sum();
            an.push((j, gv[j]));
            fd.push((j, d / (xp - xm)));
        }
        out.push((an, fd));
    }
    out
}

/// Checks every input's gradient of `f` against central finite differences.
/// `inputs` is an array or slice of tensors (owned arrays keep call sites short).
pub fn grad_check_with(
    name: &str,
    inputs: impl AsRef<[Tensor]>,
    c: Check,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    let inputs = inputs.as_ref();
    for (i, (an, fd)) in grads(name, inputs, &c, &f).iter().enumerate() {
        if let Err(e) = compare_grads(an, fd, &c) {
            panic!(
                "{name}: gradient of input {i} (shape {:?}): {e}",
                inputs[i].shape()
            );
        }
    }
}

pub fn grad_check(
    name: &str,
    inputs: impl AsRef<[Tensor]>,
    f: impl Fn(&[Tensor]) -> Result<Tensor>,
) {
    grad_check_with(name, inputs, Check::default(), f)
}

/// Values 0.5·k + offset + U(0, 0.1) with k in -4..4: two tensors drawn with offsets 0 and
/// 0.25 differ by at least 0.15 everywhere, so maximum/minimum never see near-ties.
pub fn offset_grid(rng: &mut Rng, shape: &[usize], offset: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| 0.5 * (rng.below(9) as f64 - 4.0) + offset + rng.uniform(0.0, 0.1))
        .collect();
    tensor(&v, shape)
}

/// A random shape (rank 1..=4, sizes 1..=5) and a shape that broadcasts against it: some
/// dimensions set to 1, some leading dimensions dropped.
pub fn broadcast_pair(rng: &mut Rng) -> (Vec<usize>, Vec<usize>) {
    let rank = 1 + rng.below(4) as usize;
    let a = rand_shape(rng, rank, 1, 5);
    let drop = rng.below(rank as u64) as usize;
    let b: Vec<usize> = a[drop..]
        .iter()
        .map(|&d| if rng.below(2) == 0 { 1 } else { d })
        .collect();
    // Ones on the left side too, where the right side has the full size.
    let a: Vec<usize> = a
        .iter()
        .enumerate()
        .map(|(i, &d)| {
            if i >= drop && b[i - drop] == d && rng.below(3) == 0 {
                1
            } else {
                d
            }
        })
        .collect();
    (a, b)
}
