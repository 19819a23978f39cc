//! Every GEMM path (each ISA, chosen explicitly) against a naive f64 reference: odd shapes,
//! transposed and strided operands, α/β, batches, epilogues, prepacked B, NaN propagation
//! and argument errors.

use sinter_cpu::gemm::{Activation, Batch, CacheSizes, Gemm, Kernels, MatMut, MatRef, PackedB};
use sinter_cpu::Isa;

/// A product on sinter-cpu's own kernels (Kernels::Auto may hand plain products to the gemm
/// crate; `auto_kernels_*` tests that path).
fn own(m: usize, n: usize, k: usize) -> Gemm<'static> {
    Gemm::new(m, n, k).kernels(Kernels::Own)
}

/// A small deterministic generator (values in [-1, 1)).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn at(v: &MatRef, i: usize, j: usize) -> f64 {
    v.data[(v.offset as isize + i as isize * v.rs + j as isize * v.cs) as usize] as f64
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_erf(x: f64) -> f64 {
    0.5 * x * libm_erfc(-x / std::f64::consts::SQRT_2)
}

/// erfc in f64 (Numerical Recipes' Chebyshev fit, 1.2e-7 relative: enough for a reference
/// against f32 results).
fn libm_erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807
                                + t * (-1.13520398
                                    + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

fn act_ref(act: Activation, x: f64) -> f64 {
    match act {
        Activation::None => x,
        Activation::Relu => x.max(0.0),
        Activation::GeluTanh => gelu_tanh(x),
        Activation::GeluErf => gelu_erf(x),
    }
}

/// Reference C (and pre-activation) for one product, as f64, row-major m × n.
#[allow(clippy::too_many_arguments)]
fn reference(
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &MatRef,
    b: &MatRef,
    beta: f32,
    c_old: &MatRef,
    bias: Option<&[f32]>,
    act: Activation,
) -> (Vec<f64>, Vec<f64>) {
    let mut pre = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| at(a, i, p) * at(b, p, j)).sum();
            let mut v = alpha as f64 * dot;
            if beta != 0.0 {
                v += beta as f64 * at(c_old, i, j);
            }
            if let Some(bias) = bias {
                v += bias[j] as f64;
            }
            pre[i * n + j] = v;
        }
    }
    let out = pre.iter().map(|&v| act_ref(act, v)).collect();
    (out, pre)
}

fn assert_close(what: &str, got: f32, want: f64, k: usize) {
    let tol = 1e-5 * (k as f64 + 1.0).sqrt() * (1.0 + want.abs()) * 4.0;
    assert!(
        (got as f64 - want).abs() <= tol || (got.is_nan() && want.is_nan()),
        "{what}: got {got}, want {want} (tol {tol})"
    );
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    RowMajor,
    ColMajor,
    /// Row-major inside a wider buffer (leading dimension + 5), offset 3.
    Padded,
}

/// Places a rows × cols matrix in the given layout; returns (buffer, offset, rs, cs).
fn place(vals: &[f32], rows: usize, cols: usize, l: Layout) -> (Vec<f32>, usize, isize, isize) {
    match l {
        Layout::RowMajor => (vals.to_vec(), 0, cols as isize, 1),
        Layout::ColMajor => {
            let mut v = vec![0f32; rows * cols];
            for i in 0..rows {
                for j in 0..cols {
                    v[j * rows + i] = vals[i * cols + j];
                }
            }
            (v, 0, 1, rows as isize)
        }
        Layout::Padded => {
            let ld = cols + 5;
            let mut v = vec![f32::NAN; 3 + rows * ld];
            for i in 0..rows {
                v[3 + i * ld..3 + i * ld + cols].copy_from_slice(&vals[i * cols..(i + 1) * cols]);
            }
            (v, 3, ld as isize, 1)
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn check_case(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    la: Layout,
    lb: Layout,
    lc: Layout,
    alpha: f32,
    beta: f32,
    bias: bool,
    act: Activation,
    threads: usize,
    seed: u64,
) {
    let mut rng = Lcg(seed);
    let (av, bv, cv) = (rng.vec(m * k), rng.vec(k * n), rng.vec(m * n));
    let biasv = rng.vec(n);
    let (abuf, aoff, ars, acs) = place(&av, m, k, la);
    let (bbuf, boff, brs, bcs) = place(&bv, k, n, lb);
    let (mut cbuf, coff, crs, ccs) = place(&cv, m, n, lc);
    let c_old = cbuf.clone();
    let a = MatRef {
        data: &abuf,
        offset: aoff,
        rs: ars,
        cs: acs,
    };
    let b = MatRef {
        data: &bbuf,
        offset: boff,
        rs: brs,
        cs: bcs,
    };
    let cref = MatRef {
        data: &c_old,
        offset: coff,
        rs: crs,
        cs: ccs,
    };
    let (want, want_pre) = reference(
        m,
        n,
        k,
        alpha,
        &a,
        &b,
        beta,
        &cref,
        bias.then_some(&biasv[..]),
        act,
    );
    let mut g = own(m, n, k)
        .alpha(alpha)
        .beta(beta)
        .activation(act)
        .isa(isa)
        .threads(threads);
    if bias {
        g = g.bias(&biasv);
    }
    let mut pre = vec![f32::NAN; cbuf.len()];
    let c = MatMut {
        data: &mut cbuf,
        offset: coff,
        rs: crs,
        cs: ccs,
    };
    g.run_pre(a, b, c, &mut pre).unwrap();
    let what = format!("{isa:?} {m}x{n}x{k} A {la:?} B {lb:?} C {lc:?} α {alpha} β {beta} bias {bias} {act:?} threads {threads}");
    for i in 0..m {
        for j in 0..n {
            let idx = (coff as isize + i as isize * crs + j as isize * ccs) as usize;
            assert_close(&format!("{what} C[{i},{j}]"), cbuf[idx], want[i * n + j], k);
            assert_close(
                &format!("{what} pre[{i},{j}]"),
                pre[idx],
                want_pre[i * n + j],
                k,
            );
        }
    }
    // Elements of the padded buffer outside C stay untouched.
    if let Layout::Padded = lc {
        for (idx, (&now, &before)) in cbuf.iter().zip(&c_old).enumerate() {
            let inside = idx >= coff && (idx - coff) % (n + 5) < n && (idx - coff) / (n + 5) < m;
            if !inside {
                assert!(
                    now.is_nan() && before.is_nan(),
                    "{what}: wrote outside C at {idx}"
                );
            }
        }
    }
}

const SHAPES: [(usize, usize, usize); 11] = [
    (1, 300, 129),
    (70, 1, 45),
    (1, 1, 1),
    (7, 5, 3),
    (17, 13, 9),
    (33, 1, 17),
    (1, 40, 7),
    (63, 29, 70),
    (129, 31, 5),
    (40, 70, 0),
    (65, 130, 600),
];

#[test]
fn every_isa_matches_the_f64_reference_on_odd_shapes_and_layouts() {
    use Layout::*;
    for isa in Isa::available() {
        for (s, &(m, n, k)) in SHAPES.iter().enumerate() {
            for (la, lb, lc) in [
                (RowMajor, RowMajor, RowMajor),
                (ColMajor, RowMajor, Padded),
                (RowMajor, ColMajor, ColMajor),
                (Padded, ColMajor, RowMajor),
            ] {
                check_case(
                    isa,
                    m,
                    n,
                    k,
                    la,
                    lb,
                    lc,
                    1.0,
                    0.0,
                    false,
                    Activation::None,
                    1,
                    s as u64,
                );
            }
        }
    }
}

#[test]
fn alpha_beta_bias_and_every_activation_fuse_correctly() {
    use Layout::*;
    for isa in Isa::available() {
        for act in [
            Activation::None,
            Activation::Relu,
            Activation::GeluTanh,
            Activation::GeluErf,
        ] {
            for (i, &(m, n, k)) in [(17, 13, 9), (63, 29, 600), (5, 40, 3), (40, 3, 0)]
                .iter()
                .enumerate()
            {
                check_case(
                    isa,
                    m,
                    n,
                    k,
                    RowMajor,
                    ColMajor,
                    RowMajor,
                    0.5,
                    0.0,
                    true,
                    act,
                    1,
                    10 + i as u64,
                );
                check_case(
                    isa,
                    m,
                    n,
                    k,
                    ColMajor,
                    RowMajor,
                    ColMajor,
                    -1.5,
                    0.75,
                    true,
                    act,
                    1,
                    20 + i as u64,
                );
                check_case(
                    isa,
                    m,
                    n,
                    k,
                    RowMajor,
                    RowMajor,
                    Padded,
                    1.0,
                    1.0,
                    false,
                    act,
                    1,
                    30 + i as u64,
                );
            }
        }
    }
}

#[test]
fn threaded_products_match_the_single_threaded_ones_bit_for_bit() {
    use Layout::*;
    for isa in Isa::available() {
        for &(m, n, k) in &[(130, 70, 40), (30, 200, 64), (1, 100, 10)] {
            check_case(
                isa,
                m,
                n,
                k,
                RowMajor,
                RowMajor,
                RowMajor,
                1.0,
                0.5,
                true,
                Activation::GeluTanh,
                3,
                7,
            );
            let mut rng = Lcg(5);
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let run = |threads| {
                let mut c = vec![0f32; m * n];
                own(m, n, k)
                    .isa(isa)
                    .threads(threads)
                    .run(
                        MatRef::row_major(&a, k),
                        MatRef::row_major(&b, n),
                        MatMut::row_major(&mut c, n),
                    )
                    .unwrap();
                c
            };
            assert_eq!(run(1), run(3), "{isa:?} {m}x{n}x{k}");
        }
    }
}

/// Products with every side ≥ 512 run on threads that share B's packed blocks and take row
/// blocks as they go (driver.rs `run_shared`); B is read in place or packed by a transposing
/// copy (row-major A, as the caches decide) or packed (transposed A), k crosses several k
/// blocks and no side is a multiple of a tile.
#[test]
fn shared_threaded_products_match_one_thread_bit_for_bit_and_the_reference() {
    use Layout::*;
    let (m, n, k) = (515, 513, 600);
    let mut rng = Lcg(11);
    let (a, b, c0) = (rng.vec(m * k), rng.vec(k * n), rng.vec(m * n));
    let bias = rng.vec(n);
    for isa in Isa::available() {
        for a_transposed in [false, true] {
            let at: Vec<f32>;
            let am = if a_transposed {
                at = (0..m * k).map(|i| a[(i % m) * k + i / m]).collect();
                MatRef::row_major(&at, m).t()
            } else {
                MatRef::row_major(&a, k)
            };
            let run = |threads| {
                let mut c = c0.clone();
                own(m, n, k)
                    .isa(isa)
                    .threads(threads)
                    .beta(1.0)
                    .bias(&bias)
                    .activation(Activation::Relu)
                    .run(am, MatRef::row_major(&b, n), MatMut::row_major(&mut c, n))
                    .unwrap();
                c
            };
            let one = run(1);
            let many: &[usize] = if isa == Isa::Scalar { &[2] } else { &[2, 3] };
            for &threads in many {
                assert!(
                    one == run(threads),
                    "{isa:?} A transposed {a_transposed}: {threads} threads differ from 1"
                );
            }
        }
        if isa != Isa::Scalar {
            // A transposed: B's blocks are packed and shared.
            check_case(
                isa,
                m,
                n,
                k,
                ColMajor,
                RowMajor,
                RowMajor,
                1.0,
                1.0,
                true,
                Activation::None,
                2,
                13,
            );
        }
    }
}

/// A threaded product runs its kernels inside rayon tasks, which must re-enter the ISA
/// (`Simd::vectorize`) with the macro-kernel inlined: when a task called it through a
/// reference instead, the whole macro-kernel compiled without AVX2/FMA (each intrinsic a
/// call) and 2 threads took ~13× one thread's time (driver.rs `on_threads`). A clean build
/// takes at most about one thread's time, so one run of the pair under 3× passes: a loaded
/// machine (or the other tests, kept off by a private pool) can slow some runs, never make a
/// de-vectorised one fast. Covers the shared-B split (every side ≥ 512) and the static one.
#[test]
fn threaded_products_keep_their_simd_speed() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let mut rng = Lcg(17);
    for isa in Isa::available().into_iter().filter(|&i| i != Isa::Scalar) {
        for (m, n, k) in [(512, 512, 512), (384, 256, 384)] {
            let (a, b) = (rng.vec(m * k), rng.vec(k * n));
            let mut c = vec![0f32; m * n];
            let mut time = |threads: usize| {
                let t0 = std::time::Instant::now();
                own(m, n, k)
                    .isa(isa)
                    .threads(threads)
                    .run(
                        MatRef::row_major(&a, k),
                        MatRef::row_major(&b, n),
                        MatMut::row_major(&mut c, n),
                    )
                    .unwrap();
                t0.elapsed().as_secs_f64()
            };
            let (mut one, mut two) = (f64::MAX, f64::MAX);
            for _ in 0..20 {
                one = one.min(time(1));
                two = two.min(pool.install(|| time(2)));
                if two < 3.0 * one {
                    break;
                }
            }
            assert!(
                two < 3.0 * one,
                "{isa:?} {m}x{n}x{k}: 2 threads took {:.1} ms at best, 1 thread {:.1} ms",
                two * 1e3,
                one * 1e3
            );
        }
    }
}

#[test]
fn batches_with_broadcast_operands_match_separate_products() {
    let (m, n, k, count) = (9, 11, 13, 4);
    let mut rng = Lcg(3);
    let a = rng.vec(count * m * k);
    let b = rng.vec(k * n); // one B for all: batch stride 0
    for isa in Isa::available() {
        let mut c = vec![0f32; count * m * n];
        let batch = Batch {
            count,
            a: (m * k) as isize,
            b: 0,
            c: (m * n) as isize,
        };
        own(m, n, k)
            .isa(isa)
            .batch(batch)
            .run(
                MatRef::row_major(&a, k),
                MatRef::row_major(&b, n),
                MatMut::row_major(&mut c, n),
            )
            .unwrap();
        for bi in 0..count {
            let ab = MatRef {
                data: &a,
                offset: bi * m * k,
                rs: k as isize,
                cs: 1,
            };
            let bb = MatRef::row_major(&b, n);
            let zero = vec![0f32; m * n];
            let (want, _) = reference(
                m,
                n,
                k,
                1.0,
                &ab,
                &bb,
                0.0,
                &MatRef::row_major(&zero, n),
                None,
                Activation::None,
            );
            for i in 0..m * n {
                assert_close(
                    &format!("{isa:?} batch {bi} [{i}]"),
                    c[bi * m * n + i],
                    want[i],
                    k,
                );
            }
        }
    }
}

#[test]
fn prepacked_b_gives_the_same_products_as_plain_b() {
    for isa in Isa::available() {
        // 65 rows: 64 with k ≥ 512 take AVX-512's dot form with a plain B (gemv.rs).
        for &(m, n, k) in &[(1, 7, 5), (17, 45, 33), (65, 100, 700), (3, 129, 1)] {
            let mut rng = Lcg(11);
            let (a, w, bias) = (rng.vec(m * k), rng.vec(n * k), rng.vec(n));
            // y = x·Wᵀ with W [n, k] (nn.Linear's layout): B = Wᵀ, read in place.
            let b = MatRef::row_major(&w, k).t();
            let packed = PackedB::new_isa(isa, b, k, n).unwrap();
            for threads in [1, 2] {
                let g = own(m, n, k)
                    .isa(isa)
                    .bias(&bias)
                    .activation(Activation::GeluTanh)
                    .threads(threads);
                let mut c1 = vec![0f32; m * n];
                let mut c2 = vec![0f32; m * n];
                let mut pre = vec![0f32; m * n];
                g.run(MatRef::row_major(&a, k), b, MatMut::row_major(&mut c1, n))
                    .unwrap();
                g.run_packed(
                    MatRef::row_major(&a, k),
                    &packed,
                    MatMut::row_major(&mut c2, n),
                    Some(&mut pre),
                )
                .unwrap();
                // Same kernel, same summation order (one row takes the matrix-vector path,
                // whose order differs between a plain and a packed operand).
                if m > 1 {
                    assert_eq!(c1, c2, "{isa:?} {m}x{n}x{k} threads {threads}");
                }
                let zero = vec![0f32; m * n];
                let (want, want_pre) = reference(
                    m,
                    n,
                    k,
                    1.0,
                    &MatRef::row_major(&a, k),
                    &b,
                    0.0,
                    &MatRef::row_major(&zero, n),
                    Some(&bias),
                    Activation::GeluTanh,
                );
                for i in 0..m * n {
                    assert_close("plain", c1[i], want[i], k);
                    assert_close("packed", c2[i], want[i], k);
                    assert_close("packed pre", pre[i], want_pre[i], k);
                }
            }
        }
    }
}

#[test]
fn nan_and_inf_in_inputs_propagate_and_beta_zero_ignores_old_c() {
    for isa in Isa::available() {
        let (m, n, k) = (20, 19, 30);
        let mut a = vec![1f32; m * k];
        let b = vec![1f32; k * n];
        a[3 * k + 7] = f32::NAN; // row 3 of C becomes NaN
        a[5 * k] = f32::INFINITY; // row 5 becomes +inf
        let mut c = vec![f32::NAN; m * n]; // β = 0: never read
        own(m, n, k)
            .isa(isa)
            .run(
                MatRef::row_major(&a, k),
                MatRef::row_major(&b, n),
                MatMut::row_major(&mut c, n),
            )
            .unwrap();
        for i in 0..m {
            for j in 0..n {
                let v = c[i * n + j];
                match i {
                    3 => assert!(v.is_nan(), "{isa:?} ({i},{j}) = {v}"),
                    5 => assert_eq!(v, f32::INFINITY, "{isa:?} ({i},{j})"),
                    _ => assert_eq!(v, k as f32, "{isa:?} ({i},{j})"),
                }
            }
        }
    }
}

#[test]
fn bad_arguments_are_errors_that_name_the_operand() {
    let a = vec![0f32; 6];
    let b = vec![0f32; 6];
    let mut c = vec![0f32; 3];
    let e = own(2, 2, 3)
        .run(
            MatRef::row_major(&a, 3),
            MatRef::row_major(&b, 2),
            MatMut::row_major(&mut c, 2),
        )
        .unwrap_err();
    assert!(e.to_string().contains("C (2 × 2"), "{e}");
    let mut c = vec![0f32; 4];
    let e = own(2, 2, 4)
        .run(
            MatRef::row_major(&a, 4),
            MatRef::row_major(&b, 2),
            MatMut::row_major(&mut c, 2),
        )
        .unwrap_err();
    assert!(e.to_string().contains("A (2 × 4"), "{e}");
    let bias = [0f32; 3];
    let e = own(2, 2, 3)
        .bias(&bias)
        .run(
            MatRef::row_major(&a, 3),
            MatRef::row_major(&b, 2),
            MatMut::row_major(&mut c, 2),
        )
        .unwrap_err();
    assert!(e.to_string().contains("bias has 3 values"), "{e}");
    let e = own(2, 2, 3)
        .run(
            MatRef::row_major(&a, 3),
            MatRef::row_major(&b, 2),
            MatMut {
                data: &mut c,
                offset: 0,
                rs: 1,
                cs: 1,
            },
        )
        .unwrap_err();
    assert!(e.to_string().contains("overlap"), "{e}");
    let packed = PackedB::new_isa(Isa::Scalar, MatRef::row_major(&b, 2), 3, 2).unwrap();
    let a8 = vec![0f32; 8];
    let e = own(2, 2, 4)
        .run_packed(
            MatRef::row_major(&a8, 4),
            &packed,
            MatMut::row_major(&mut c, 2),
            None,
        )
        .unwrap_err();
    assert!(e.to_string().contains("packed B is 3 × 2"), "{e}");
}

#[test]
fn auto_kernels_match_the_reference_nan_and_beta_rules_included() {
    for isa in Isa::available() {
        for &(m, n, k) in &[(1, 300, 129), (63, 29, 70), (130, 70, 40)] {
            let mut rng = Lcg(77);
            let (mut a, b, c0) = (rng.vec(m * k), rng.vec(k * n), rng.vec(m * n));
            a[0] = f32::NAN; // row 0 of C is NaN
            for (beta, threads) in [(0.0, 1), (0.5, 2)] {
                let mut c = c0.clone();
                if beta == 0.0 {
                    c.iter_mut().for_each(|v| *v = f32::NAN); // never read
                }
                let g = Gemm::new(m, n, k)
                    .isa(isa)
                    .alpha(1.5)
                    .beta(beta)
                    .threads(threads);
                g.run(
                    MatRef::row_major(&a, k),
                    MatRef::row_major(&b, n),
                    MatMut::row_major(&mut c, n),
                )
                .unwrap();
                let (want, _) = reference(
                    m,
                    n,
                    k,
                    1.5,
                    &MatRef::row_major(&a, k),
                    &MatRef::row_major(&b, n),
                    beta,
                    &MatRef::row_major(&c0, n),
                    None,
                    Activation::None,
                );
                for i in 0..m * n {
                    assert_close(
                        &format!("auto {isa:?} {m}x{n}x{k} β {beta} [{i}]"),
                        c[i],
                        want[i],
                        k,
                    );
                }
            }
        }
    }
}

/// Every row count from 1 to 33 against a prepacked weight: AVX-512 takes its 4-row tile
/// for 2–4 rows, its 8-row tile for 5–8 and 13–16 and its 12-row tile elsewhere, so every
/// tile, their partial fills and their mixes run.
#[test]
fn every_row_count_against_a_prepacked_weight_matches_the_reference() {
    let (n, k) = (45, 37);
    let mut rng = Lcg(21);
    let (w, bias) = (rng.vec(n * k), rng.vec(n));
    let b = MatRef::row_major(&w, k).t();
    for isa in Isa::available() {
        let packed = PackedB::new_isa(isa, b, k, n).unwrap();
        for m in 1..=33 {
            let a = rng.vec(m * k);
            let old = rng.vec(m * n);
            let mut c = old.clone();
            own(m, n, k)
                .isa(isa)
                .beta(0.5)
                .bias(&bias)
                .activation(Activation::Relu)
                .threads(1 + m % 2)
                .run_packed(
                    MatRef::row_major(&a, k),
                    &packed,
                    MatMut::row_major(&mut c, n),
                    None,
                )
                .unwrap();
            let (want, _) = reference(
                m,
                n,
                k,
                1.0,
                &MatRef::row_major(&a, k),
                &b,
                0.5,
                &MatRef::row_major(&old, n),
                Some(&bias),
                Activation::Relu,
            );
            for i in 0..m * n {
                assert_close(&format!("{isa:?} {m} rows"), c[i], want[i], k);
            }
        }
    }
}

#[test]
fn thin_products_x_times_w_transposed_match_the_reference() {
    // A decode step of 2..16 sequences: x [m, k] · Wᵀ with W [n, k] read in place, the shape
    // that takes the matrix-vector path's dot form; 17 rows take the packed GEMM, except on
    // AVX-512 with k ≥ 512, where the dot form runs to 64 rows (gemv.rs `DOT_COLUMNS`). With
    // β, bias, activation and two threads; tile edges in both directions and a k tail.
    use Layout::*;
    for isa in Isa::available() {
        for (s, &(m, n, k)) in [
            (2, 40, 7),
            (4, 384, 128),
            (5, 33, 600),
            (8, 17, 16),
            (13, 65, 129),
            (16, 70, 45),
            (17, 20, 9),
            (17, 41, 512),
            (40, 9, 515),
            (64, 70, 600),
            (65, 12, 520),
        ]
        .iter()
        .enumerate()
        {
            for (beta, bias, act, threads) in [
                (0.0, false, Activation::None, 1),
                (0.5, true, Activation::GeluTanh, 2),
                (1.0, true, Activation::Relu, 1),
            ] {
                check_case(
                    isa,
                    m,
                    n,
                    k,
                    RowMajor,
                    ColMajor,
                    RowMajor,
                    1.25,
                    beta,
                    bias,
                    act,
                    threads,
                    100 + s as u64,
                );
            }
        }
    }
}

/// x·Wᵀ in the dot form: a row of x gives the same bits alone (one sequence decoding) as in
/// a batch of up to 16 rows, whatever the alignment of W in its buffer; larger batches (on
/// AVX-512 with k ≥ 512 the form runs to 64 rows, starting with a part vector that aligns W)
/// match the reference at every alignment and give the same bits on 1 and 3 threads.
#[test]
fn x_times_w_transposed_gives_a_row_the_same_bits_alone_and_in_a_few_row_batch() {
    let (n, k) = (37, 531);
    let mut rng = Lcg(7);
    let x = rng.vec(64 * k);
    let w = rng.vec(n * k);
    for isa in Isa::available() {
        for shift in [0, 1, 5, 13] {
            // W [n, k] row-major at `shift` floats into its buffer: B = Wᵀ.
            let mut wbuf = vec![f32::NAN; shift + n * k];
            wbuf[shift..].copy_from_slice(&w);
            let run = |m: usize, threads: usize| {
                let mut c = vec![0f32; m * n];
                own(m, n, k)
                    .isa(isa)
                    .threads(threads)
                    .run(
                        MatRef {
                            data: &x[..m * k],
                            offset: 0,
                            rs: k as isize,
                            cs: 1,
                        },
                        MatRef {
                            data: &wbuf,
                            offset: shift,
                            rs: 1,
                            cs: k as isize,
                        },
                        MatMut {
                            data: &mut c,
                            offset: 0,
                            rs: n as isize,
                            cs: 1,
                        },
                    )
                    .unwrap();
                c
            };
            let product = |m: usize| run(m, 1);
            let alone = product(1);
            for j in 0..n {
                let want: f64 = (0..k).map(|p| x[p] as f64 * w[j * k + p] as f64).sum();
                assert_close(
                    &format!("{isa:?} shift {shift} C[0,{j}]"),
                    alone[j],
                    want,
                    k,
                );
            }
            for m in [2, 5, 16, 17, 40, 64] {
                let batch = product(m);
                if m <= 16 {
                    assert_eq!(
                        batch[..n].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        alone.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{isa:?} shift {shift}: row 0 of a batch of {m} differs from the row alone"
                    );
                }
                // Threads share W's rows: the same bits on 1 and 3.
                assert!(
                    run(m, 3) == batch,
                    "{isa:?} shift {shift}: a batch of {m} differs between 1 and 3 threads"
                );
                let last = &batch[(m - 1) * n..];
                for j in 0..n {
                    let want: f64 = (0..k)
                        .map(|p| x[(m - 1) * k + p] as f64 * w[j * k + p] as f64)
                        .sum();
                    assert_close(
                        &format!("{isa:?} shift {shift} m {m} C[{},{j}]", m - 1),
                        last[j],
                        want,
                        k,
                    );
                }
            }
        }
    }
}

/// A row-major A (the driver's B with contiguous k) too large for L2 and swept by several
/// row blocks is packed by a transposing copy instead of read in place (driver.rs
/// `in_place_pays`; with L2 ≤ 2 MiB this shape's B block does not fit). Both its single-thread
/// path and the shared threaded one, over several k blocks, with β and an epilogue, against
/// the reference.
#[test]
fn large_row_major_a_packed_by_transposing_copy_matches_the_reference() {
    use Layout::*;
    let (m, n, k) = (700, 203, 400);
    for isa in Isa::available() {
        for threads in [1, 2] {
            check_case(
                isa,
                m,
                n,
                k,
                RowMajor,
                RowMajor,
                RowMajor,
                0.5,
                1.0,
                true,
                Activation::Relu,
                threads,
                17,
            );
        }
    }
}

#[test]
fn avx2_products_on_either_side_of_the_panel_order_switch_match_the_reference() {
    // AVX2 runs a block's row panels outermost while B's block (internal columns × kc) fits a
    // quarter of L2, and BLIS's column order past that (driver.rs `panel_first`): one product
    // on each side of the switch, B read in place (Wᵀ) and packed, with the whole epilogue,
    // on 1 and 2 threads. C is row-major, so the driver's B is the user's A and its columns
    // are C's rows.
    use Layout::*;
    if !Isa::available().contains(&Isa::Avx2) {
        return;
    }
    let k = 64;
    // Past the switch even when 2 threads split those columns between them.
    let past = 2 * (CacheSizes::get().l2 / 4) / (k * 4) + 7;
    for (m, n) in [(40, 300), (past, 37)] {
        // B in place (A row-major: the internal B's k is contiguous) and packed.
        for (la, lb) in [(RowMajor, ColMajor), (ColMajor, RowMajor)] {
            for threads in [1, 2] {
                check_case(
                    Isa::Avx2,
                    m,
                    n,
                    k,
                    la,
                    lb,
                    RowMajor,
                    0.5,
                    1.0,
                    true,
                    Activation::GeluTanh,
                    threads,
                    m as u64,
                );
            }
        }
    }
}
