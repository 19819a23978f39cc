//! Plain products on AVX-512 through the `gemm` crate (0.19, feature `x86-v4`): on this
//! workplace's Zen 5 its AVX-512 kernels run square products 2–6 % faster than ours
//! (256³–2048³, 1 and 2 threads, `benches/gemm.rs`, 2026-11-23), so
//! [`super::Kernels::Auto`] hands it the products where it measured faster and that use none
//! of what only ours has (fused epilogue, prepacked B, an ISA cap below the CPU's: the crate
//! picks its kernels by CPU detection alone).

use super::problem::Problem;

/// Whether the crate runs `p` on `threads`: a plain product (no epilogue, B not prepacked,
/// k > 0) on one thread, or on several when every dimension is at least 256, unless it takes
/// our dot form with 2 or more columns (`gemv.rs`: 2.8× faster to `gemv::FEW_COLUMNS`
/// columns, 1.4× at 64 × 3072 × 768; one column stays with the crate, measured as fast as
/// ours). Split across
/// threads, the skinny products of a small Transformer (gpt-tiny: 768×512×128, 768×128×512,
/// 768×384×128) ran 0.96–1.25× as fast on our kernels as on the crate's (its threaded speed
/// on them varied between runs; 768×128×512 was 1.18–1.25× on ours in every run).
pub(crate) fn applies(p: &Problem, threads: usize) -> bool {
    (threads == 1 || p.m.min(p.n).min(p.k) >= 256)
        // 16 lanes: the crate only ever runs on AVX-512 (`dispatch`).
        && !(p.n > 1 && super::gemv::applies(p, 16))
        && p.bias.is_null()
        && p.pre.is_null()
        && p.act == super::Activation::None
        && p.packed_a.is_null()
        && p.k > 0
}

/// C = α·A·B + β·C through the crate, on `threads` rayon threads.
///
/// # Safety
/// `p` is valid (see [`Problem`]) and [`applies`].
pub(crate) unsafe fn run(p: &Problem, threads: usize) {
    let par = if threads > 1 {
        gemm19::Parallelism::Rayon(threads)
    } else {
        gemm19::Parallelism::None
    };
    // The crate computes dst = α_dst·dst + β_prod·(lhs·rhs), reading dst only if asked: with
    // β = 0 the old C (NaN included) is never read, as in BLAS.
    gemm19::gemm(
        p.m,
        p.n,
        p.k,
        p.c,
        p.csc,
        p.rsc,
        p.beta != 0.0,
        p.a,
        p.csa,
        p.rsa,
        p.b,
        p.csb,
        p.rsb,
        p.beta,
        p.alpha,
        false,
        false,
        false,
        par,
    )
}
