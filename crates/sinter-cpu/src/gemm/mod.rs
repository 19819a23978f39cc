//! f32 matrix products over strided slices: C = α·A·B + β·C, batched, with a fused epilogue.
//!
//! **What it reads and writes.** [`Gemm::run`] reads A (m × k) and B (k × n) and writes C
//! (m × n); each is a slice with an offset and a row and a column stride ([`MatRef`],
//! [`MatMut`]), so a transposed or narrowed operand is read in place (swap the strides; no
//! copy). β = 0 overwrites C without reading it (NaN in the old C is ignored, as in BLAS);
//! NaN and inf in A or B propagate. Optional, per [`Gemm`]: a strided batch ([`Batch`]: a
//! stride of 0 broadcasts an operand), a bias per column of C (the same for every product)
//! and an [`Activation`] applied after it, with the pre-activation (α·A·B + β·C + bias)
//! also written to a second buffer addressed exactly like C ([`Gemm::run_pre`]) for the
//! backward pass. [`PackedB`] packs a right operand once for many products
//! ([`Gemm::run_packed`]).
//!
//! **Why it is fast.** The BLIS structure: operands are packed block by block into the
//! panel layout the micro-kernel streams (`pack.rs`; a broadcast operand whose k is
//! contiguous is read in place instead of by a transposing copy), blocks sized from the
//! CPU's caches (`blocking.rs`), and a register-tile micro-kernel (`kernel.rs`) does MV·NR independent
//! FMAs per k step (AVX-512: 32 × 12, AVX2: 16 × 6, scalar: 4 × 4). The epilogue runs on the
//! tile while it is in registers, so bias and activation cost no extra pass over C. A
//! row-major C is handled by computing Cᵀ = Bᵀ·Aᵀ (C's unit-stride dimension is always the
//! vector dimension). Products above [`PAR_MIN_FLOPS`] run on the rayon threads: with every
//! side ≥ 512 they share B's packed blocks and take C's row blocks as they go, otherwise C is
//! split into one block per thread (`driver.rs`); smaller ones run on the calling thread, and a batch of small products runs one
//! product per thread. One-column products take a matrix-vector path (`gemv.rs`).
//!
//! **Which kernels.** With [`Kernels::Auto`] (the default), plain products (no epilogue, B not
//! prepacked) at [`Isa::Avx512`] on one thread, or on several with every dimension ≥ 256, run
//! the `gemm` crate 0.19's AVX-512 kernels, measured 2–6 % faster than ours there
//! (`gemm_crate.rs`); everything else (skinny threaded products, where ours measured
//! 0.96–1.25× the crate, epilogues, prepacked B, every capped ISA) runs ours. [`Kernels::Own`] forces ours.
//!
//! **Instruction set.** [`Gemm::isa`] defaults to [`Isa::get`] (detected, capped by
//! `SINTER_CPU_ISA`); tests set it explicitly to run every path.

mod blocking;
mod driver;
#[cfg(target_arch = "x86_64")]
mod gemm_crate;
mod gemv;
mod kernel;
mod matrix;
pub(crate) mod pack;
mod prepacked;
mod problem;

pub use blocking::{Blocking, CacheSizes};
pub use kernel::kernel_shape;
use matrix::{check_view, reach};
pub use matrix::{GemmError, MatMut, MatRef};
pub use prepacked::PackedB;

pub use crate::math::activation::Activation;
use crate::Isa;
use problem::Problem;
use rayon::prelude::*;

/// Products with fewer flops (2·m·n·k) than this run on one thread: waking the rayon pool
/// and joining costs ~8 µs here, so on 2 cores splitting pays from about 128³ (4.2e6 flops:
/// 1.15× faster, 96³ is still 0.73×; `benches/gemm.rs -- threshold`, Zen 5, 2026-11-23).
pub const PAR_MIN_FLOPS: usize = 1 << 22;

macro_rules! bail {
    ($($t:tt)*) => { return Err(GemmError(format!($($t)*))) };
}

/// Strides between the consecutive products of a batch, in elements. A and B may repeat a
/// matrix (stride 0: broadcast); C's matrices must not overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    pub count: usize,
    pub a: isize,
    pub b: isize,
    pub c: isize,
}

impl Batch {
    pub const ONE: Batch = Batch {
        count: 1,
        a: 0,
        b: 0,
        c: 0,
    };
}

/// One product (or batch of products) and its options; see the module docs.
#[derive(Clone, Copy, Debug)]
pub struct Gemm<'b> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub alpha: f32,
    pub beta: f32,
    pub batch: Batch,
    /// One value per column of C, added before the activation.
    pub bias: Option<&'b [f32]>,
    pub act: Activation,
    pub isa: Isa,
    /// None: the rayon pool for products above [`PAR_MIN_FLOPS`], else this thread.
    pub threads: Option<usize>,
    pub kernels: Kernels,
}

/// Which implementation runs a product.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Kernels {
    /// The fastest measured: the `gemm` crate's AVX-512 kernels for plain products when the
    /// product runs at [`Isa::Avx512`] (see `gemm_crate.rs`), sinter-cpu's kernels for
    /// everything else.
    #[default]
    Auto,
    /// Always sinter-cpu's own kernels (tests; comparing the two).
    Own,
}

/// The right operand of a product.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    Mat(MatRef<'a>),
    Packed(&'a PackedB),
}

impl<'b> Gemm<'b> {
    /// C = A·B for A m × k and B k × n (α = 1, β = 0, no batch, no epilogue).
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        Gemm {
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
            batch: Batch::ONE,
            bias: None,
            act: Activation::None,
            isa: Isa::get(),
            threads: None,
            kernels: Kernels::Auto,
        }
    }
    pub fn kernels(self, kernels: Kernels) -> Self {
        Gemm { kernels, ..self }
    }
    pub fn alpha(self, alpha: f32) -> Self {
        Gemm { alpha, ..self }
    }
    pub fn beta(self, beta: f32) -> Self {
        Gemm { beta, ..self }
    }
    pub fn batch(self, batch: Batch) -> Self {
        Gemm { batch, ..self }
    }
    pub fn bias(self, bias: &'b [f32]) -> Self {
        Gemm {
            bias: Some(bias),
            ..self
        }
    }
    pub fn activation(self, act: Activation) -> Self {
        Gemm { act, ..self }
    }
    pub fn isa(self, isa: Isa) -> Self {
        Gemm { isa, ..self }
    }
    pub fn threads(self, threads: usize) -> Self {
        Gemm {
            threads: Some(threads.max(1)),
            ..self
        }
    }

    /// C = α·A·B + β·C (+ bias, activation), for every product of the batch.
    pub fn run(&self, a: MatRef, b: MatRef, c: MatMut) -> Result<(), GemmError> {
        self.execute(a, Rhs::Mat(b), c, None)
    }

    /// [`Gemm::run`] that also writes the pre-activation into `pre`, at C's offsets.
    pub fn run_pre(
        &self,
        a: MatRef,
        b: MatRef,
        c: MatMut,
        pre: &mut [f32],
    ) -> Result<(), GemmError> {
        self.execute(a, Rhs::Mat(b), c, Some(pre))
    }

    /// [`Gemm::run`] (or [`Gemm::run_pre`]) with B packed ahead (the same B for the batch).
    pub fn run_packed(
        &self,
        a: MatRef,
        b: &PackedB,
        c: MatMut,
        pre: Option<&mut [f32]>,
    ) -> Result<(), GemmError> {
        self.execute(a, Rhs::Packed(b), c, pre)
    }

    fn validate(
        &self,
        a: &MatRef,
        b: &Rhs,
        c: &MatMut,
        pre: Option<&[f32]>,
    ) -> Result<(), GemmError> {
        let (m, n, k, bt) = (self.m, self.n, self.k, self.batch);
        if let Some(bias) = self.bias {
            if bias.len() != n {
                bail!("the bias has {} values, C has {n} columns", bias.len());
            }
        }
        if bt.count == 0 {
            return Ok(());
        }
        let last = (bt.count - 1) as isize;
        let shifted = |off: usize, stride: isize, what: &str| -> Result<[usize; 2], GemmError> {
            let end = off as isize + last * stride;
            if end < 0 {
                bail!("the batch stride {stride} of {what} runs before its first value");
            }
            Ok([off, end as usize])
        };
        for off in shifted(a.offset, bt.a, "A")? {
            check_view("A", a.data.len(), off, m, k, a.rs, a.cs)?;
        }
        match b {
            Rhs::Mat(b) => {
                for off in shifted(b.offset, bt.b, "B")? {
                    check_view("B", b.data.len(), off, k, n, b.rs, b.cs)?;
                }
            }
            Rhs::Packed(p) => {
                if (p.k, p.n) != (k, n) {
                    bail!(
                        "the packed B is {} × {}, the product needs {k} × {n}",
                        p.k,
                        p.n
                    );
                }
                if p.isa != self.isa {
                    bail!("B was packed for {} kernels, the product runs {}: pack it with the same Isa", p.isa.name(), self.isa.name());
                }
            }
        }
        let cs = shifted(c.offset, bt.c, "C")?;
        for off in cs {
            check_view("C", c.data.len(), off, m, n, c.rs, c.cs)?;
            if let Some(pre) = pre {
                check_view(
                    "the pre-activation output",
                    pre.len(),
                    off,
                    m,
                    n,
                    c.rs,
                    c.cs,
                )?;
            }
        }
        // C's elements must be distinct: within one matrix, and between the batch's matrices.
        if m > 1 && n > 1 {
            let (small, big) = if c.rs.unsigned_abs() <= c.cs.unsigned_abs() {
                ((c.rs, m), (c.cs, n))
            } else {
                ((c.cs, n), (c.rs, m))
            };
            let _ = big;
            if small.0 == 0 || small.0.unsigned_abs() * (small.1 - 1) >= big.0.unsigned_abs() {
                bail!(
                    "C's strides ({}, {}) make distinct elements overlap",
                    c.rs,
                    c.cs
                );
            }
        } else if (m > 1 && c.rs == 0) || (n > 1 && c.cs == 0) {
            bail!(
                "C's strides ({}, {}) make distinct elements overlap",
                c.rs,
                c.cs
            );
        }
        if bt.count > 1 && m > 0 && n > 0 {
            let (lo, hi) = reach(m, n, c.rs, c.cs);
            if bt.c.unsigned_abs() as isize <= hi - lo {
                bail!(
                    "C's batch stride {} is smaller than one C matrix ({} values apart)",
                    bt.c,
                    hi - lo + 1
                );
            }
        }
        Ok(())
    }

    fn execute(
        &self,
        a: MatRef,
        b: Rhs,
        c: MatMut,
        pre: Option<&mut [f32]>,
    ) -> Result<(), GemmError> {
        self.validate(&a, &b, &c, pre.as_deref())?;
        let (m, n, k) = (self.m, self.n, self.k);
        if m == 0 || n == 0 || self.batch.count == 0 {
            return Ok(());
        }
        let flops = 2 * m * n * k.max(1);
        let pool = rayon::current_num_threads();
        let threads = self
            .threads
            .unwrap_or(if flops >= PAR_MIN_FLOPS { pool } else { 1 });
        let pre_ptr = pre.map_or(std::ptr::null_mut(), |p| p.as_mut_ptr());
        let problem = |i: usize| -> Problem {
            let bt = self.batch;
            let i = i as isize;
            // SAFETY (pointer offsets): validate() checked every batch's views in bounds.
            unsafe {
                let (bp, rsb, csb, packed, kc) = match b {
                    Rhs::Mat(b) => (
                        b.data.as_ptr().add(b.offset).offset(i * bt.b),
                        b.rs,
                        b.cs,
                        std::ptr::null(),
                        0,
                    ),
                    Rhs::Packed(p) => (std::ptr::null(), 0, 0, p.data.as_ptr(), p.kc),
                };
                let coff = c.offset as isize + i * bt.c;
                self.orient(
                    a.data.as_ptr().add(a.offset).offset(i * bt.a),
                    (a.rs, a.cs),
                    bp,
                    (rsb, csb),
                    (c.data.as_ptr() as *mut f32).offset(coff),
                    (c.rs, c.cs),
                    if pre_ptr.is_null() {
                        pre_ptr
                    } else {
                        pre_ptr.offset(coff)
                    },
                    packed,
                    kc,
                )
            }
        };
        let problems: Vec<Problem> = (0..self.batch.count).map(problem).collect();
        if problems.len() > 1 && threads > 1 && self.threads.is_none() && flops < PAR_MIN_FLOPS * 4
        {
            // Many small products: one product per task, each on one thread.
            problems.par_iter().for_each(|p| {
                // SAFETY: products write disjoint C matrices (validated).
                unsafe { dispatch(self.isa, self.kernels, p, 1) }
            });
        } else {
            for p in &problems {
                // SAFETY: validated above.
                unsafe { dispatch(self.isa, self.kernels, p, threads) }
            }
        }
        Ok(())
    }

    /// The internal problem: transposed when C is row-major (or B is prepacked), so that C's
    /// unit-stride dimension is the micro-kernel's vector dimension.
    #[allow(clippy::too_many_arguments)]
    fn orient(
        &self,
        a: *const f32,
        (rsa, csa): (isize, isize),
        b: *const f32,
        (rsb, csb): (isize, isize),
        c: *mut f32,
        (rsc, csc): (isize, isize),
        pre: *mut f32,
        packed: *const f32,
        packed_kc: usize,
    ) -> Problem {
        let transpose = !packed.is_null() || (csc == 1 && rsc != 1);
        let base = Problem {
            m: self.m,
            n: self.n,
            k: self.k,
            alpha: self.alpha,
            beta: self.beta,
            a,
            rsa,
            csa,
            b,
            rsb,
            csb,
            c,
            rsc,
            csc,
            pre,
            bias: self.bias.map_or(std::ptr::null(), |b| b.as_ptr()),
            bias_along_rows: false,
            act: self.act,
            packed_a: packed,
            packed_kc,
        };
        if !transpose {
            return base;
        }
        Problem {
            m: self.n,
            n: self.m,
            a: b,
            rsa: csb,
            csa: rsb,
            b: a,
            rsb: csa,
            csb: rsa,
            rsc: csc,
            csc: rsc,
            bias_along_rows: true,
            ..base
        }
    }
}

/// The width of AVX-512's register tile for a product whose kernel has n columns (after
/// `orient`: the rows of x in x·Wᵀ, a decode step's sequences). A tile costs the same for
/// any number of valid columns, so thin products take the narrowest tile that wastes least:
/// up to 4 columns a 4-wide tile (2 × 4 accumulators: still the 8 independent FMA chains
/// that two pipes of 4-cycle FMAs need), up to 16 an 8-wide one where it fits fewer slots
/// than the 12-wide one (5–8 and 13–16: 8 rows take one 8-wide tile instead of two thirds
/// of a 12-wide one, 16 rows two 8-wide tiles instead of two 12-wide ones; gpt-tiny's
/// 16-sequence decode step with packed weights 0.165 → 0.120 ms). Wider products keep the
/// 12-wide tile (more FMAs per load of A).
fn avx512_tile_width(n: usize) -> usize {
    if n <= 4 {
        4
    } else if n <= 16 && n.div_ceil(8) * 8 < n.div_ceil(12) * 12 {
        8
    } else {
        12
    }
}

/// Runs one internal problem on `isa`'s kernels (or the gemm crate's, see [`Kernels`]).
///
/// # Safety
/// `p` is valid and the CPU has `isa`.
unsafe fn dispatch(isa: Isa, kernels: Kernels, p: &Problem, threads: usize) {
    use crate::simd::{Scalar, Simd};
    #[cfg(target_arch = "x86_64")]
    if kernels == Kernels::Auto && isa == Isa::Avx512 && gemm_crate::applies(p, threads) {
        return gemm_crate::run(p, threads);
    }
    let _ = kernels;
    let base_nr = kernel_shape(isa).1;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => {
            use crate::simd::Avx512;
            match avx512_tile_width(p.n) {
                4 => Avx512::vectorize(
                    #[inline(always)]
                    || driver::run::<Avx512, 2, 4>(p, threads, base_nr),
                ),
                8 => Avx512::vectorize(
                    #[inline(always)]
                    || driver::run::<Avx512, 2, 8>(p, threads, base_nr),
                ),
                _ => Avx512::vectorize(
                    #[inline(always)]
                    || driver::run::<Avx512, 2, 12>(p, threads, base_nr),
                ),
            }
        }
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => {
            use crate::simd::Avx2;
            Avx2::vectorize(
                #[inline(always)]
                || driver::run::<Avx2, 2, 6>(p, threads, base_nr),
            )
        }
        _ => Scalar::vectorize(
            #[inline(always)]
            || driver::run::<Scalar, 4, 4>(p, threads, base_nr),
        ),
    }
}
