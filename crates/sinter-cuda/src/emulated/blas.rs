//! The emulated device's cuBLASLt: a plain reference GEMM on host memory that honours a
//! [`GemmDesc`] exactly as cuBLASLt does for sinter's calls.
//!
//! Per batch `b` and element (i, j) of the row-major problem:
//!
//! ```text
//! t = alpha * Σ_k op(A_b)[i, k] · op(B_b)[k, j]   (f32 accumulation, k in order)
//!   + beta * C_b[i, j]                             (C is not read when beta == 0)
//!   + bias[j]                                      (Bias, BiasGelu, BiasGeluAux)
//! aux[i, j] = t                                    (BiasGeluAux: the pre-activation)
//! C_b[i, j] = GELU_tanh(t) or t                    (rounded once to the storage dtype)
//! ```
//!
//! and for the gradient epilogues (α = 1, β = 0, one matrix: `GemmDesc::validate`):
//!
//! ```text
//! DGelu:      C[i, j] = t · GELU_tanh'(aux[i, j])   (aux read from its storage dtype)
//! DGeluBGrad: the same, and bias_grad[j] = Σ_i C[i, j] over the f32 values before rounding
//! BGradA:     C[i, j] = t, and bias_grad[i] = Σ_k op(A)[i, k]
//! ```
//!
//! (f32 sums in index order, each rounded once to the storage dtype.)
//!
//! with the leading dimensions, transposes and batch strides of [`GemmShape`] (the same
//! defaults as [`lt_params`](crate::gemm::lt_params)). f16/bf16 inputs are widened exactly to f32;
//! TF32 is computed as f32 (the emulation does not reproduce tensor-core rounding). The sum order
//! differs from cuBLASLt's, as cuBLASLt's own differs between algorithms.

use half::{bf16, f16};

use crate::dtype::DType;
use crate::error::Result;
use crate::gemm::{Epilogue, GemmDType, GemmDesc, GemmShape};

/// cuBLASLt's GELU: the tanh approximation.
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// d GELU_tanh / dx: what cuBLASLt's DGELU epilogues multiply the product by.
pub fn gelu_tanh_grad(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    let th = (C * (x + 0.044_715 * x * x * x)).tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * C * (1.0 + 3.0 * 0.044_715 * x * x)
}

/// What to apply after the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Post {
    None,
    Bias,
    BiasGelu,
    Gelu,
    BiasGeluAux,
    DGelu,
    DGeluBGrad,
    BGradA,
}

/// A validated GEMM with raw addresses: what the emulated device queues (it outlives the
/// borrowed [`GemmDesc`], like a cuBLASLt call enqueued on a stream).
#[derive(Clone, Copy, Debug)]
pub(crate) struct GemmJob {
    dtype: GemmDType,
    shape: GemmShape,
    a: u64,
    b: u64,
    c: u64,
    alpha: f32,
    beta: f32,
    post: Post,
    bias: u64,
    aux: u64,
}

impl GemmJob {
    /// Validate `g` as cuBLASLt would be called with it.
    pub(crate) fn new(g: &GemmDesc<'_>) -> Result<GemmJob> {
        g.validate()?;
        let (post, bias, aux) = match g.epilogue {
            Epilogue::None => (Post::None, 0, 0),
            Epilogue::Bias(b) => (Post::Bias, b.ptr(), 0),
            Epilogue::BiasGelu(b) => (Post::BiasGelu, b.ptr(), 0),
            Epilogue::Gelu => (Post::Gelu, 0, 0),
            Epilogue::BiasGeluAux { bias, aux } => (Post::BiasGeluAux, bias.ptr(), aux.ptr()),
            Epilogue::DGelu { aux } => (Post::DGelu, 0, aux.ptr()),
            Epilogue::DGeluBGrad { aux, bias_grad } => {
                (Post::DGeluBGrad, bias_grad.ptr(), aux.ptr())
            }
            Epilogue::BGradA(g) => (Post::BGradA, g.ptr(), 0),
        };
        Ok(GemmJob {
            dtype: g.dtype,
            shape: g.shape,
            a: g.a.ptr(),
            b: g.b.ptr(),
            c: g.c.ptr(),
            alpha: g.alpha,
            beta: g.beta,
            post,
            bias,
            aux,
        })
    }

    /// Compute it.
    ///
    /// # Safety
    /// The addresses must be host memory holding what the validated descriptor promised.
    pub(crate) unsafe fn run(&self) {
        let s = &self.shape;
        let (m, n, k) = (s.m, s.n, s.k);
        if m == 0 || n == 0 {
            return;
        }
        let d = self.dtype.storage();
        let ix = s.indexing();
        // SAFETY (all loads and stores below): offsets stay inside the extents that
        // `GemmDesc::validate` checked against the slices' lengths.
        // The gradient epilogues write the bias vector; the others read it.
        let reads_bias = matches!(self.post, Post::Bias | Post::BiasGelu | Post::BiasGeluAux);
        let mut bias_grad = vec![0f32; if reads_bias { 0 } else { m.max(n) }];
        let bias: Vec<f32> = if reads_bias {
            (0..n).map(|j| unsafe { load(d, self.bias, j) }).collect()
        } else {
            vec![0.0; n]
        };
        // Packed operands of one batch: A as [m][k], B as [k][n], both f32.
        let mut pa = vec![0f32; m * k];
        let mut pb = vec![0f32; k * n];
        let mut acc = vec![0f32; n];
        for bt in 0..s.batch {
            for i in 0..m {
                for kk in 0..k {
                    pa[i * k + kk] = unsafe { load(d, self.a, ix.a(bt, i, kk)) };
                }
                if self.post == Post::BGradA {
                    bias_grad[i] = pa[i * k..i * k + k].iter().sum();
                }
            }
            for kk in 0..k {
                for j in 0..n {
                    pb[kk * n + j] = unsafe { load(d, self.b, ix.b(bt, kk, j)) };
                }
            }
            for i in 0..m {
                acc.fill(0.0);
                for kk in 0..k {
                    let x = pa[i * k + kk];
                    for (a, &y) in acc.iter_mut().zip(&pb[kk * n..kk * n + n]) {
                        *a += x * y;
                    }
                }
                for j in 0..n {
                    let at = ix.c(bt, i, j);
                    let mut t = self.alpha * acc[j];
                    if self.beta != 0.0 {
                        t += self.beta * unsafe { load(d, self.c, at) };
                    }
                    t += bias[j];
                    let out = match self.post {
                        Post::None | Post::Bias => t,
                        Post::Gelu | Post::BiasGelu => gelu_tanh(t),
                        Post::BiasGeluAux => {
                            unsafe { store(d, self.aux, i * n + j, t) };
                            gelu_tanh(t)
                        }
                        Post::DGelu | Post::DGeluBGrad => {
                            t * gelu_tanh_grad(unsafe { load(d, self.aux, i * n + j) })
                        }
                        Post::BGradA => t,
                    };
                    if self.post == Post::DGeluBGrad {
                        bias_grad[j] += out;
                    }
                    unsafe { store(d, self.c, at, out) };
                }
            }
        }
        let grad_len = match self.post {
            Post::DGeluBGrad => n,
            Post::BGradA => m,
            _ => 0,
        };
        for (j, &g) in bias_grad.iter().take(grad_len).enumerate() {
            unsafe { store(d, self.bias, j, g) };
        }
    }
}

/// Element `i` of a `d` array at `base`, widened to f32.
///
/// # Safety
/// `base` must address at least `i + 1` elements of `d`.
pub(crate) unsafe fn load(d: DType, base: u64, i: usize) -> f32 {
    // SAFETY: the caller's promise; unaligned reads are fine for any address.
    unsafe {
        match d {
            DType::F32 => ((base as *const f32).add(i)).read_unaligned(),
            DType::F16 => f16::from_bits(((base as *const u16).add(i)).read_unaligned()).to_f32(),
            DType::BF16 => bf16::from_bits(((base as *const u16).add(i)).read_unaligned()).to_f32(),
            other => unreachable!("float storage only, got {other}"),
        }
    }
}

/// Store `v` rounded (to nearest even) to `d` as element `i` of the array at `base`.
///
/// # Safety
/// `base` must address at least `i + 1` writable elements of `d`.
pub(crate) unsafe fn store(d: DType, base: u64, i: usize, v: f32) {
    // SAFETY: the caller's promise.
    unsafe {
        match d {
            DType::F32 => ((base as *mut f32).add(i)).write_unaligned(v),
            DType::F16 => ((base as *mut u16).add(i)).write_unaligned(f16::from_f32(v).to_bits()),
            DType::BF16 => ((base as *mut u16).add(i)).write_unaligned(bf16::from_f32(v).to_bits()),
            other => unreachable!("float storage only, got {other}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::DevSlice;

    /// A host array standing in for device memory.
    struct Host {
        d: DType,
        bytes: Vec<u8>,
    }

    impl Host {
        fn new(d: DType, v: &[f64]) -> Host {
            let mut h = Host {
                d,
                bytes: vec![0u8; v.len() * d.size()],
            };
            for (i, &x) in v.iter().enumerate() {
                // SAFETY: `bytes` holds `v.len()` elements.
                unsafe { store(d, h.bytes.as_mut_ptr() as u64, i, x as f32) };
            }
            h
        }
        /// Every element NaN (what cuBLASLt must not read when beta == 0).
        fn nan(d: DType, n: usize) -> Host {
            Host::new(d, &vec![f64::NAN; n])
        }
        fn get(&self) -> Vec<f64> {
            let n = self.bytes.len() / self.d.size();
            // SAFETY: `bytes` holds `n` elements.
            (0..n)
                .map(|i| unsafe { load(self.d, self.bytes.as_ptr() as u64, i) } as f64)
                .collect()
        }
        fn slice(&self) -> DevSlice<'static> {
            // SAFETY: the slice is used only while `self` lives, in the test.
            unsafe {
                DevSlice::from_raw(
                    self.bytes.as_ptr() as u64,
                    self.bytes.len() / self.d.size(),
                    self.d,
                )
            }
        }
    }

    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        }
        fn vec(&mut self, n: usize, d: DType) -> Vec<f64> {
            // Values the storage type holds exactly, so the reference sees the kernel's inputs.
            (0..n)
                .map(|_| Host::new(d, &[self.next()]).get()[0])
                .collect()
        }
    }

    fn gelu64(x: f64) -> f64 {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
    }

    /// (what, tolerance relative to the magnitude of the terms) of each storage dtype.
    fn rtol(dt: GemmDType) -> f64 {
        match dt {
            GemmDType::F32 | GemmDType::Tf32 => 2e-6,
            GemmDType::F16 => 2e-3,
            GemmDType::BF16 => 1.6e-2,
        }
    }

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Epi {
        None,
        Bias,
        BiasGelu,
        Gelu,
        BiasGeluAux,
        DGelu,
        DGeluBGrad,
        BGradA,
    }

    fn gelu64_grad(x: f64) -> f64 {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        let th = (c * (x + 0.044715 * x.powi(3))).tanh();
        0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * c * (1.0 + 3.0 * 0.044715 * x * x)
    }

    /// Runs one problem through the host GEMM and checks every output (and the aux output)
    /// against an f64 evaluation of cuBLASLt's definition.
    #[allow(clippy::too_many_arguments)]
    fn check(dt: GemmDType, s: GemmShape, alpha: f32, beta: f32, epi: Epi, rng: &mut Lcg) {
        let d = dt.storage();
        let p = crate::gemm::lt_params(&s).unwrap();
        let av = rng.vec(p.need_a, d);
        let bv = rng.vec(p.need_b, d);
        let cv = rng.vec(p.need_c, d);
        let biasv = rng.vec(s.n, d);
        let (a, b) = (Host::new(d, &av), Host::new(d, &bv));
        let c = if beta == 0.0 {
            Host::nan(d, p.need_c)
        } else {
            Host::new(d, &cv)
        };
        let bias = Host::new(d, &biasv);
        // The backward epilogues read a pre-activation (scaled to reach GELU's curved part)
        // and write a bias gradient; the forward one writes the aux matrix.
        let reads_aux = matches!(epi, Epi::DGelu | Epi::DGeluBGrad);
        let auxv: Vec<f64> = rng.vec(s.m * s.n, d).iter().map(|v| v * 3.0).collect();
        let aux = if reads_aux {
            Host::new(d, &auxv)
        } else {
            Host::nan(d, s.m * s.n)
        };
        let auxv = aux.get();
        let bias_grad = Host::nan(d, if epi == Epi::BGradA { s.m } else { s.n });
        let mut g = GemmDesc::new(dt, s, a.slice(), b.slice(), c.slice());
        g.alpha = alpha;
        g.beta = beta;
        g.epilogue = match epi {
            Epi::None => Epilogue::None,
            Epi::Bias => Epilogue::Bias(bias.slice()),
            Epi::BiasGelu => Epilogue::BiasGelu(bias.slice()),
            Epi::Gelu => Epilogue::Gelu,
            Epi::BiasGeluAux => Epilogue::BiasGeluAux {
                bias: bias.slice(),
                aux: aux.slice(),
            },
            Epi::DGelu => Epilogue::DGelu { aux: aux.slice() },
            Epi::DGeluBGrad => Epilogue::DGeluBGrad {
                aux: aux.slice(),
                bias_grad: bias_grad.slice(),
            },
            Epi::BGradA => Epilogue::BGradA(bias_grad.slice()),
        };
        // SAFETY: every slice addresses a live host array of the validated size.
        unsafe { GemmJob::new(&g).unwrap().run() };
        let (got, got_aux, got_bg) = (c.get(), aux.get(), bias_grad.get());
        // Bias gradients: (sum, sum of magnitudes) per element, accumulated below.
        let mut bg = vec![(0.0f64, 0.0f64); got_bg.len()];
        let ix = s.indexing();
        let with_bias = matches!(epi, Epi::Bias | Epi::BiasGelu | Epi::BiasGeluAux);
        let gelu = matches!(epi, Epi::Gelu | Epi::BiasGelu | Epi::BiasGeluAux);
        for bt in 0..s.batch {
            for i in 0..s.m {
                for j in 0..s.n {
                    let (mut dot, mut mag) = (0.0f64, 0.0f64);
                    for kk in 0..s.k {
                        let (x, y) = (av[ix.a(bt, i, kk)], bv[ix.b(bt, kk, j)]);
                        dot += x * y;
                        mag += (x * y).abs();
                    }
                    let at = ix.c(bt, i, j);
                    let mut t = alpha as f64 * dot;
                    mag *= alpha.abs() as f64;
                    if beta != 0.0 {
                        t += beta as f64 * cv[at];
                        mag += (beta as f64 * cv[at]).abs();
                    }
                    if with_bias {
                        t += biasv[j];
                        mag += biasv[j].abs();
                    }
                    let mut want = if gelu { gelu64(t) } else { t };
                    if reads_aux {
                        let g = gelu64_grad(auxv[i * s.n + j]);
                        want *= g;
                        mag *= g.abs();
                        // Headroom for GELU' evaluated in f32.
                        mag += want.abs();
                    }
                    match epi {
                        Epi::DGeluBGrad => {
                            bg[j].0 += want;
                            bg[j].1 += mag + want.abs();
                        }
                        Epi::BGradA if bt == 0 && j == 0 => {
                            for kk in 0..s.k {
                                let x = av[ix.a(bt, i, kk)];
                                bg[i] = (bg[i].0 + x, bg[i].1 + x.abs());
                            }
                        }
                        _ => {}
                    }
                    let tol = rtol(dt) * (mag + want.abs() + 1e-3);
                    let what =
                        format!("{dt:?} {s:?} alpha {alpha} beta {beta} {epi:?} [{bt},{i},{j}]");
                    assert!(
                        (got[at] - want).abs() <= tol,
                        "{what}: got {}, want {want}",
                        got[at]
                    );
                    if epi == Epi::BiasGeluAux {
                        let a = got_aux[i * s.n + j];
                        assert!((a - t).abs() <= tol, "{what} aux: got {a}, want {t}");
                    }
                }
            }
        }
        if matches!(epi, Epi::DGeluBGrad | Epi::BGradA) {
            for (j, (&g, &(want, mag))) in got_bg.iter().zip(&bg).enumerate() {
                let tol = rtol(dt) * (mag + want.abs() + 1e-3);
                assert!(
                    (g - want).abs() <= tol,
                    "{dt:?} {s:?} {epi:?} bias gradient [{j}]: got {g}, want {want}"
                );
            }
        }
        // Outside the matrices (padding of ldc, gaps between batches) C is untouched.
        if beta != 0.0 {
            let (sc, ldc) = (ix.stride_c.max(1), ix.ldc);
            for (at, (&g, &w)) in got.iter().zip(&cv).enumerate() {
                let (bt, r) = (at / sc, at % sc);
                let inside = bt < s.batch && r / ldc < s.m && r % ldc < s.n;
                if !inside {
                    assert_eq!(g, w, "{dt:?} {s:?}: element {at} outside C was written");
                }
            }
        }
    }

    #[test]
    fn host_gemm_matches_f64_across_the_descriptor_space() {
        let mut rng = Lcg(11);
        let dts = [
            GemmDType::F32,
            GemmDType::Tf32,
            GemmDType::F16,
            GemmDType::BF16,
        ];
        let mut shapes = Vec::new();
        for (m, n, k) in [(1, 1, 1), (3, 5, 4), (17, 8, 9), (4, 16, 33)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                shapes.push(GemmShape::new(m, n, k).trans(ta, tb));
            }
        }
        // Leading dimensions wider than the rows.
        shapes.push(GemmShape {
            lda: Some(11),
            ldb: Some(13),
            ldc: Some(10),
            ..GemmShape::new(3, 8, 5).trans(true, false)
        });
        // Batched, with explicit strides, a shared B (stride 0) and gaps between C's batches.
        shapes.push(GemmShape::new(5, 8, 6).trans(false, true).batched(3));
        shapes.push(GemmShape {
            stride_b: Some(0),
            stride_c: Some(50),
            ldc: Some(9),
            ..GemmShape::new(4, 8, 3).batched(2)
        });
        shapes.push(GemmShape {
            stride_a: Some(40),
            lda: Some(7),
            ..GemmShape::new(5, 2, 6).batched(3)
        });
        // k = 0: the product is zero, only beta C + bias remain.
        shapes.push(GemmShape::new(2, 8, 0));
        for dt in dts {
            for s in &shapes {
                for (alpha, beta) in [(1.0, 0.0), (0.5, 0.75), (-2.0, 1.0)] {
                    check(dt, *s, alpha, beta, Epi::None, &mut rng);
                }
                for epi in [Epi::Bias, Epi::BiasGelu, Epi::Gelu] {
                    check(dt, *s, 1.0, 0.0, epi, &mut rng);
                }
                check(dt, *s, 0.5, 0.5, Epi::BiasGelu, &mut rng);
                if s.batch == 1 && s.n % 8 == 0 {
                    check(dt, *s, 1.0, 0.0, Epi::BiasGeluAux, &mut rng);
                    check(dt, *s, 0.5, 1.0, Epi::BiasGeluAux, &mut rng);
                }
                let half = matches!(dt, GemmDType::BF16 | GemmDType::F16);
                if half && s.batch == 1 {
                    check(dt, *s, 1.0, 0.0, Epi::BGradA, &mut rng);
                    if s.n % 8 == 0 {
                        check(dt, *s, 1.0, 0.0, Epi::DGelu, &mut rng);
                        check(dt, *s, 1.0, 0.0, Epi::DGeluBGrad, &mut rng);
                    }
                }
            }
        }
    }

    #[test]
    fn host_gemm_rounds_once_to_the_output_dtype() {
        // bf16: 256 + 1 + 1 accumulated in f32 is 258, exactly representable; rounding after
        // each step would stay at 256 (ties to even).
        let (a, b) = (
            Host::new(DType::BF16, &[256.0, 1.0, 1.0]),
            Host::new(DType::BF16, &[1.0, 1.0, 1.0]),
        );
        let c = Host::nan(DType::BF16, 1);
        let g = GemmDesc::new(
            GemmDType::BF16,
            GemmShape::new(1, 1, 3),
            a.slice(),
            b.slice(),
            c.slice(),
        );
        // SAFETY: live host arrays of the validated sizes.
        unsafe { GemmJob::new(&g).unwrap().run() };
        assert_eq!(c.get(), [258.0]);
        assert!((gelu_tanh(1.0) - gelu64(1.0) as f32).abs() < 1e-6);
        // Invalid descriptors are refused before anything runs.
        let g = GemmDesc::new(
            GemmDType::F32,
            GemmShape::new(1, 1, 3),
            a.slice(),
            b.slice(),
            c.slice(),
        );
        assert!(GemmJob::new(&g).is_err());
    }

    #[test]
    fn gradient_epilogues_refuse_what_they_do_not_define() {
        let d = DType::BF16;
        let (a, b, c) = (
            Host::new(d, &[1.0; 4 * 3]),
            Host::new(d, &[1.0; 3 * 8]),
            Host::nan(d, 4 * 8),
        );
        let (aux, bg) = (Host::new(d, &[0.5; 32]), Host::nan(d, 8));
        let s = GemmShape::new(4, 8, 3);
        let mut g = GemmDesc::new(GemmDType::BF16, s, a.slice(), b.slice(), c.slice());
        g.epilogue = Epilogue::DGeluBGrad {
            aux: aux.slice(),
            bias_grad: bg.slice(),
        };
        assert!(GemmJob::new(&g).is_ok());
        g.beta = 1.0;
        assert!(GemmJob::new(&g).is_err(), "beta must be 0");
        g.beta = 0.0;
        g.alpha = 2.0;
        assert!(GemmJob::new(&g).is_err(), "alpha must be 1");
        g.alpha = 1.0;
        g.epilogue = Epilogue::BGradA(bg.slice());
        assert!(
            GemmJob::new(&g).is_err(),
            "BGradA's vector has m = 4 elements"
        );
        g.epilogue = Epilogue::DGelu {
            aux: Host::new(d, &[0.5; 8]).slice(),
        };
        assert!(GemmJob::new(&g).is_err(), "aux must hold m x n");
        let f = |v: &[f64]| Host::new(DType::F32, v);
        let (af, bf, cf, auxf) = (f(&[1.0; 12]), f(&[1.0; 24]), f(&[0.0; 32]), f(&[0.5; 32]));
        let mut g = GemmDesc::new(GemmDType::F32, s, af.slice(), bf.slice(), cf.slice());
        g.epilogue = Epilogue::DGelu { aux: auxf.slice() };
        assert!(GemmJob::new(&g).is_err(), "f32 keeps its separate passes");
        assert!((gelu_tanh_grad(0.7) as f64 - gelu64_grad(0.7)).abs() < 1e-6);
    }
}
