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

/// What to apply after the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Post {
    None,
    Bias,
    BiasGelu,
    Gelu,
    BiasGeluAux,
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
        let (ar, ac) = if s.trans_a { (k, m) } else { (m, k) };
        let (br, bc) = if s.trans_b { (n, k) } else { (k, n) };
        let lda = s.lda.unwrap_or(ac.max(1));
        let ldb = s.ldb.unwrap_or(bc.max(1));
        let ldc = s.ldc.unwrap_or(n.max(1));
        let sa = s.stride_a.unwrap_or(ar * lda);
        let sb = s.stride_b.unwrap_or(br * ldb);
        let sc = s.stride_c.unwrap_or(m * ldc);
        // SAFETY (all loads and stores below): offsets stay inside the extents that
        // `GemmDesc::validate` checked against the slices' lengths.
        let bias: Vec<f32> = if self.bias != 0 {
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
                    let off = if s.trans_a {
                        kk * lda + i
                    } else {
                        i * lda + kk
                    };
                    pa[i * k + kk] = unsafe { load(d, self.a, bt * sa + off) };
                }
            }
            for kk in 0..k {
                for j in 0..n {
                    let off = if s.trans_b {
                        j * ldb + kk
                    } else {
                        kk * ldb + j
                    };
                    pb[kk * n + j] = unsafe { load(d, self.b, bt * sb + off) };
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
                    let at = bt * sc + i * ldc + j;
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
                    };
                    unsafe { store(d, self.c, at, out) };
                }
            }
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
