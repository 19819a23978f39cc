//! f32 GEMM throughput: sinter-cpu's `Gemm` (`sinter`: Kernels::Auto, which hands plain
//! AVX-512 products to the gemm crate 0.19; `sinter-own`: our kernels only; `sinter-packed`:
//! our kernels with B packed ahead) beside the `gemm` crate (0.19 with its AVX-512 `x86-v4`
//! kernels, and 0.18, which sinter-core uses today), at square sizes and at the
//! shapes of a gpt-tiny training step, on 1 and 2 threads; plus this machine's measured FMA
//! peak, to say how close each gets.
//!
//!     chrt -f 1 cargo bench -p sinter-cpu --bench gemm
//!     SINTER_BENCH_ROUNDS=5 SINTER_BENCH_SECS=1 chrt -f 1 cargo bench -p sinter-cpu --bench gemm -- square
//!
//! Each case runs `SINTER_BENCH_ROUNDS` rounds, the engines interleaved inside each round;
//! the table shows the median over all repetitions. GFLOP/s = 2·m·n·k / time.

mod common;

use common::{budget, machine_line, median, rounds, selected, time};
use sinter_cpu::gemm::{Gemm, Kernels, MatMut, MatRef, PackedB};
use sinter_cpu::Isa;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 9) as f32 / (1 << 23) as f32
                - 0.5
        })
        .collect()
}

/// One case: C (m × n) = A (m × k) · B, with A and B row-major unless `at` (A given as Xᵀ of
/// a row-major X [k, m], as a weight gradient dYᵀ·X reads it) or `bt` (B given as Wᵀ of a
/// row-major W [n, k], as nn.Linear multiplies).
#[derive(Clone, Copy)]
struct Case {
    name: &'static str,
    m: usize,
    n: usize,
    k: usize,
    at: bool,
    bt: bool,
}

/// `SINTER_BENCH_SHAPES=MxNxK[:nn|nt|tn|tt],…`: cases instead of the built-in list (the
/// letters say which of A and B are transposed, as in [`Case`]).
fn shapes_from_env() -> Option<Vec<Case>> {
    let spec = std::env::var("SINTER_BENCH_SHAPES").ok()?;
    let parse = |s: &str| -> Case {
        let (dims, t) = s.split_once(':').unwrap_or((s, "nn"));
        let d: Vec<usize> = dims
            .split('x')
            .map(|v| v.parse().expect("SINTER_BENCH_SHAPES: MxNxK[:nn|nt|tn|tt]"))
            .collect();
        assert!(d.len() == 3, "SINTER_BENCH_SHAPES: '{s}' is not MxNxK");
        Case {
            name: Box::leak(s.to_string().into_boxed_str()),
            m: d[0],
            n: d[1],
            k: d[2],
            at: t.starts_with('t'),
            bt: t.ends_with('t'),
        }
    };
    Some(spec.split(',').map(parse).collect())
}

/// `SINTER_BENCH_ENGINES=a,b`: only these engines (default: all).
fn engine_wanted(name: &str) -> bool {
    std::env::var("SINTER_BENCH_ENGINES").map_or(true, |e| e.split(',').any(|x| x == name))
}

/// One thread, or sinter's own choice (single-threaded below `PAR_MIN_FLOPS`) with the pool.
fn gemm_for(m: usize, n: usize, k: usize, threads: usize) -> Gemm<'static> {
    let g = Gemm::new(m, n, k);
    if threads == 1 {
        g.threads(1)
    } else {
        g
    }
}

/// A named engine's timed call.
type Engine = (&'static str, Box<dyn FnMut()>);

fn engines(c: Case, threads: usize) -> Vec<Engine> {
    let (m, n, k) = (c.m, c.n, c.k);
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let (brs, bcs) = if c.bt {
        (1, k as isize)
    } else {
        (n as isize, 1)
    };
    let (ars, acs) = if c.at {
        (1, m as isize)
    } else {
        (k as isize, 1)
    };
    fn strided(data: &[f32], rs: isize, cs: isize) -> MatRef<'_> {
        MatRef {
            data,
            offset: 0,
            rs,
            cs,
        }
    }
    let mut out: Vec<Engine> = Vec::new();
    for (name, kernels) in [("sinter", Kernels::Auto), ("sinter-own", Kernels::Own)] {
        let (a, b) = (a.clone(), b.clone());
        let mut cbuf = vec![0f32; m * n];
        out.push((
            name,
            Box::new(move || {
                let bm = MatRef {
                    data: &b,
                    offset: 0,
                    rs: brs,
                    cs: bcs,
                };
                gemm_for(m, n, k, threads)
                    .kernels(kernels)
                    .run(strided(&a, ars, acs), bm, MatMut::row_major(&mut cbuf, n))
                    .unwrap();
            }),
        ));
    }
    if c.bt {
        let a = a.clone();
        let packed = PackedB::new(
            MatRef {
                data: &b,
                offset: 0,
                rs: brs,
                cs: bcs,
            },
            k,
            n,
        )
        .unwrap();
        let mut cbuf = vec![0f32; m * n];
        out.push((
            "sinter-packed",
            Box::new(move || {
                gemm_for(m, n, k, threads)
                    .run_packed(
                        strided(&a, ars, acs),
                        &packed,
                        MatMut::row_major(&mut cbuf, n),
                        None,
                    )
                    .unwrap();
            }),
        ));
    }
    macro_rules! gemm_crate {
        ($name:expr, $krate:ident) => {{
            let (a, b) = (a.clone(), b.clone());
            let mut cbuf = vec![0f32; m * n];
            let par = if threads > 1 {
                $krate::Parallelism::Rayon(threads)
            } else {
                $krate::Parallelism::None
            };
            out.push((
                $name,
                Box::new(move || unsafe {
                    $krate::gemm(
                        m,
                        n,
                        k,
                        cbuf.as_mut_ptr(),
                        1,
                        n as isize,
                        false,
                        a.as_ptr(),
                        acs,
                        ars,
                        b.as_ptr(),
                        bcs,
                        brs,
                        0.0,
                        1.0,
                        false,
                        false,
                        false,
                        par,
                    )
                }),
            ));
        }};
    }
    gemm_crate!("gemm-0.19", gemm19);
    gemm_crate!("gemm-0.18", gemm);
    out
}

/// FLOP/s of a loop of independent FMAs on `isa` (12 chains of 16 or 8 lanes: more than
/// latency × pipes), per thread.
fn fma_peak(isa: Isa) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::*;
        const ITERS: usize = 480_000_000;
        #[target_feature(enable = "avx512f")]
        unsafe fn avx512() -> f32 {
            let mut acc = [_mm512_set1_ps(0.0); 12];
            let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
            for _ in 0..ITERS / 12 {
                for a in acc.iter_mut() {
                    *a = _mm512_fmadd_ps(*a, x, y);
                }
            }
            acc.iter().map(|&a| _mm512_reduce_add_ps(a)).sum()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2() -> f32 {
            let mut acc = [_mm256_set1_ps(0.0); 12];
            let (x, y) = (_mm256_set1_ps(0.999_999), _mm256_set1_ps(1e-7));
            for _ in 0..ITERS / 12 {
                for a in acc.iter_mut() {
                    *a = _mm256_fmadd_ps(*a, x, y);
                }
            }
            let mut s = [0f32; 8];
            for a in acc {
                let mut t = [0f32; 8];
                _mm256_storeu_ps(t.as_mut_ptr(), a);
                s.iter_mut().zip(t).for_each(|(s, t)| *s += t);
            }
            s.iter().sum()
        }
        let (lanes, f): (f64, unsafe fn() -> f32) = match isa {
            Isa::Avx512 => (16.0, avx512),
            Isa::Avx2 => (8.0, avx2),
            Isa::Scalar => return f64::NAN,
        };
        let t0 = std::time::Instant::now();
        std::hint::black_box(unsafe { f() });
        let secs = t0.elapsed().as_secs_f64();
        (ITERS / 12 * 12) as f64 * lanes * 2.0 / secs
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        f64::NAN
    }
}

fn main() {
    let isa = Isa::get();
    println!("## f32 GEMM, GFLOP/s (median), sinter-cpu vs the gemm crate");
    println!();
    println!("{}", machine_line());
    let pool = rayon::current_num_threads();
    let peak1 = {
        let runs: Vec<f64> = (0..5).map(|_| fma_peak(isa)).collect();
        runs.iter().cloned().fold(0.0, f64::max)
    };
    let peak_all = {
        use rayon::prelude::*;
        let per: Vec<f64> = (0..pool).into_par_iter().map(|_| fma_peak(isa)).collect();
        per.iter().sum::<f64>()
    };
    println!(
        "measured {} FMA peak: {:.1} GFLOP/s on 1 thread, {:.1} on {pool} threads",
        isa.name(),
        peak1 / 1e9,
        peak_all / 1e9
    );
    println!(
        "{} round(s) × {:.2} s per engine and case, engines interleaved",
        rounds(),
        budget().as_secs_f64()
    );
    println!();
    let cases = [
        Case {
            name: "square 256",
            m: 256,
            n: 256,
            k: 256,
            at: false,
            bt: false,
        },
        Case {
            name: "square 1024",
            m: 1024,
            n: 1024,
            k: 1024,
            at: false,
            bt: false,
        },
        Case {
            name: "square 2048",
            m: 2048,
            n: 2048,
            k: 2048,
            at: false,
            bt: false,
        },
        // gpt-tiny, batch 12 × context 64 = 768 rows, width 128, MLP 512, 3·128 qkv.
        Case {
            name: "gpt-tiny fc1 x·Wᵀ 768x512x128",
            m: 768,
            n: 512,
            k: 128,
            at: false,
            bt: true,
        },
        Case {
            name: "gpt-tiny fc2 x·Wᵀ 768x128x512",
            m: 768,
            n: 128,
            k: 512,
            at: false,
            bt: true,
        },
        Case {
            name: "gpt-tiny qkv x·Wᵀ 768x384x128",
            m: 768,
            n: 384,
            k: 128,
            at: false,
            bt: true,
        },
        Case {
            name: "gpt-tiny head x·Wᵀ 768x256x128",
            m: 768,
            n: 256,
            k: 128,
            at: false,
            bt: true,
        },
        Case {
            name: "gpt-tiny fc1 dW dyᵀ·x 512x128x768",
            m: 512,
            n: 128,
            k: 768,
            at: false,
            bt: false,
        },
        Case {
            name: "decode 1x512x128",
            m: 1,
            n: 512,
            k: 128,
            at: false,
            bt: true,
        },
    ];
    let cases = shapes_from_env().unwrap_or(cases.to_vec());
    if selected("threshold") {
        threshold();
    }
    println!("| case | threads | engine | GFLOP/s | vs gemm-0.19 | % of peak |");
    println!("|---|---:|---|---:|---:|---:|");
    for c in cases {
        if !selected(c.name) {
            continue;
        }
        for threads in [1, pool.max(2).min(pool)] {
            let mut eng = engines(c, threads);
            eng.retain(|(name, _)| engine_wanted(name));
            let mut times: Vec<Vec<f64>> = vec![Vec::new(); eng.len()];
            for _ in 0..rounds() {
                for (i, (_, f)) in eng.iter_mut().enumerate() {
                    times[i].extend(time(budget(), f));
                }
            }
            let flops = 2.0 * (c.m * c.n * c.k) as f64;
            let gf: Vec<f64> = times.iter().map(|t| flops / median(t) / 1e9).collect();
            let base = eng
                .iter()
                .position(|(n, _)| *n == "gemm-0.19")
                .map(|i| gf[i]);
            let peak = if threads == 1 { peak1 } else { peak_all } / 1e9;
            for (i, (name, _)) in eng.iter().enumerate() {
                let ratio = base.map_or("–".into(), |b| format!("{:.2}×", gf[i] / b));
                println!(
                    "| {} | {threads} | {name} | {:.1} | {ratio} | {:.0} % |",
                    c.name,
                    gf[i],
                    100.0 * gf[i] / peak
                );
            }
            if threads == pool {
                break;
            }
        }
    }
}

/// Where splitting one product over the pool starts to pay: n³ products on 1 thread and on
/// every thread, side by side (`PAR_MIN_FLOPS` is set from this).
fn threshold() {
    let pool = rayon::current_num_threads();
    println!("| n³ (flops) | 1 thread µs | {pool} threads µs | speed-up |");
    println!("|---|---:|---:|---:|");
    for n in [32usize, 48, 64, 80, 96, 128, 160] {
        let (a, b) = (values(n * n, 1), values(n * n, 2));
        let mut c = vec![0f32; n * n];
        let (mut one, mut all) = (Vec::new(), Vec::new());
        for _ in 0..rounds() {
            for (threads, t) in [(1, &mut one), (pool, &mut all)] {
                t.extend(time(budget(), || {
                    Gemm::new(n, n, n)
                        .kernels(Kernels::Own)
                        .threads(threads)
                        .run(
                            MatRef::row_major(&a, n),
                            MatRef::row_major(&b, n),
                            MatMut::row_major(&mut c, n),
                        )
                        .unwrap()
                }));
            }
        }
        let (t1, tp) = (median(&one) * 1e6, median(&all) * 1e6);
        println!(
            "| {n}³ ({:.1e}) | {t1:.1} | {tp:.1} | {:.2}× |",
            2.0 * (n * n * n) as f64,
            t1 / tp
        );
    }
    println!();
}
