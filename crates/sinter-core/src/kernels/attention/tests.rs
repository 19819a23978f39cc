//! The folder's kernels on the CPU against the f64 [`reference`] and the composites (the
//! conformance suite runs them on the emulated CUDA device too).

use super::*;
use crate::kernels::test_support::{assert_close, f64s, magnitude, values};

#[test]
fn causal_mask_from_aranges_matches_the_bottom_right_rule() {
    for (tq, tk) in [(1, 1), (4, 4), (3, 7), (7, 3), (1, 9), (5, 0)] {
        let g = AttnGeom {
            b: 1,
            h: 1,
            kv_h: 1,
            tq,
            tk,
            d: 1,
            causal: true,
            scale: 1.0,
        };
        let want: Vec<bool> = (0..tq * tk).map(|x| (x % tk) >= g.limit(x / tk)).collect();
        let got = causal_mask(tq, tk, Device::Cpu).unwrap();
        assert_eq!(got.shape(), &[tq, tk]);
        assert_eq!(got.dtype(), DType::Bool);
        assert_eq!(got.to_vec_bool().unwrap(), want, "tq {tq}, tk {tk}");
    }
}

/// Causal with more queries than keys: the first tq − tk rows see no key. The composite
/// (what CUDA runs for f32) must give them 0 like the kernel, with finite gradients, and
/// match the kernel everywhere else; with no keys at all everything is 0.
#[test]
fn composite_rows_without_keys_are_zero_like_the_kernel() {
    let mut rng = crate::Rng::new(7);
    for (tq, tk) in [(5usize, 3usize), (4, 0)] {
        let mut mk = |t: usize| {
            Tensor::randn(&[1, 2, t, 4], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)
                .unwrap()
                .to_var()
                .unwrap()
        };
        let (q, k, v) = (mk(tq), mk(tk), mk(tk));
        let run = |f: fn(&Tensor, &Tensor, &Tensor, bool, f32) -> Result<Tensor>| {
            let o = f(&q, &k, &v, true, 0.5).unwrap();
            o.sum_all().unwrap().backward().unwrap();
            let grads: Vec<Vec<f32>> = [&q, &k, &v]
                .iter()
                .map(|t| t.grad().unwrap().to_vec_f32().unwrap())
                .collect();
            for t in [&q, &k, &v] {
                t.zero_grad();
            }
            (o.to_vec_f32().unwrap(), grads)
        };
        let (o_ref, g_ref) = run(attention_reference);
        let (o_ker, g_ker) = run(attention);
        for head in o_ref.chunks(tq * 4) {
            // Each head's first tq − tk rows (of head dim 4).
            assert!(head[..(tq - tk) * 4].iter().all(|&x| x == 0.0), "{head:?}");
        }
        for (a, b) in o_ref
            .iter()
            .zip(&o_ker)
            .chain(g_ref.iter().flatten().zip(g_ker.iter().flatten()))
        {
            assert!(
                a.is_finite() && (a - b).abs() < 1e-5,
                "tq {tq} tk {tk}: {a} vs {b}"
            );
        }
    }
}

#[test]
fn kernel_or_composite() {
    assert!(cuda::flash_applies(DType::BF16, 64));
    assert!(cuda::flash_applies(DType::F16, 128));
    assert!(!cuda::flash_applies(DType::F32, 64), "f32: composite");
    assert!(
        !cuda::flash_applies(DType::BF16, 80),
        "head dim 80: composite"
    );
}

/// The CPU flash kernels (values, log-sum-exp and the three gradients) against the f64
/// reference, causal with a KV cache (tq < tk) across a tile edge, and not causal.
#[test]
fn cpu_kernels_match_the_f64_reference() {
    let mut rng = crate::Rng::new(11);
    for (tq, tk, causal) in [(3usize, 70usize, true), (5, 5, false)] {
        let (b, h, d) = (1, 2, 8);
        let mut mk = |t: usize| {
            Tensor::randn(&[b, h, t, d], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu).unwrap()
        };
        let (q, k, v, w) = (
            mk(tq).to_var().unwrap(),
            mk(tk).to_var().unwrap(),
            mk(tk).to_var().unwrap(),
            mk(tq),
        );
        let g = geom::of_qkv(&q, &k, &v, causal, 0.4).unwrap();
        let (_, lse) = flash(&q, &k, &v, &g)
            .unwrap()
            .expect("the CPU has a kernel");
        let o = attention(&q, &k, &v, causal, 0.4).unwrap();
        o.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
        let z = reference::Dims {
            bh: b * h,
            tq,
            tk,
            d,
        };
        let (qv, kv, vv) = (f64s(&q), f64s(&k), f64s(&v));
        let (o_ref, lse_ref) = reference::forward(&qv, &kv, &vv, z, causal, 0.4);
        let (dq, dk, dv) = reference::backward(&qv, &kv, &vv, &f64s(&w), z, causal, 0.4);
        let lse_got = f64s(&Tensor::from_storage(lse, &[b * h * tq]));
        let pairs = [
            ("o", f64s(&o), o_ref),
            ("lse", lse_got, lse_ref),
            ("dq", f64s(&q.grad().unwrap()), dq),
            ("dk", f64s(&k.grad().unwrap()), dk),
            ("dv", f64s(&v.grad().unwrap()), dv),
        ];
        for (what, got, want) in pairs {
            let what = format!("{what} (tq {tq}, tk {tk})");
            assert_close(&what, &got, &want, (1e-4, 1e-4));
        }
    }
}

/// The CPU kernels on every instruction set this CPU has (`flash_tiles`' register tiles,
/// vector pairs and causal skipping differ by lane count) against the f64 reference: tiles
/// cut at the edges (t 70, 130), head dims that are not whole vectors (20, 40, 1), grouped
/// kv heads (dk, dv summed over a group), tq < tk (a KV cache), tq > tk (queries that see no
/// key: output 0, lse −inf), and not causal.
#[test]
fn cpu_tiles_match_the_f64_reference_on_every_isa() {
    let cases = [
        (1usize, 2usize, 1usize, 64usize, 64usize, 32usize, true),
        (2, 4, 2, 70, 70, 20, true),
        (1, 2, 2, 3, 130, 8, true),
        (1, 1, 1, 130, 67, 40, true),
        (1, 2, 1, 65, 33, 16, false),
        (1, 1, 1, 7, 7, 1, true),
    ];
    for isa in sinter_cpu::Isa::available() {
        for (i, c) in cases.into_iter().enumerate() {
            run_cpu_tiles(isa, c, 40 + i as u64);
        }
    }
}

fn run_cpu_tiles(
    isa: sinter_cpu::Isa,
    (b, h, kv, tq, tk, d, causal): (usize, usize, usize, usize, usize, usize, bool),
    seed: u64,
) {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut vals = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 2.0
            })
            .collect()
    };
    let (nq, nk) = (b * h * tq * d, b * kv * tk * d);
    let (q, k, v, dout) = (vals(nq), vals(nk), vals(nk), vals(nq));
    let g = geom::AttnGeom {
        b,
        h,
        kv_h: kv,
        tq,
        tk,
        d,
        causal,
        scale: 0.45,
    };
    let (ql, kl) = (
        crate::Layout::contiguous(&[b, h, tq, d]),
        crate::Layout::contiguous(&[b, kv, tk, d]),
    );
    use cpu::Src::InPlace;
    let (qs, ks, vs) = (InPlace(&q, &ql), InPlace(&k, &kl), InPlace(&v, &kl));
    let (o, lse) = cpu::forward(&g, isa, &qs, &ks, &vs);
    let (os, dos) = (InPlace(&o, &ql), InPlace(&dout, &ql));
    let (dq, dk, dv) = cpu::backward(&g, isa, (&qs, &ks, &vs), &os, &lse, &dos);
    // The reference reads one k and v per query head: repeat each kv head for its group.
    let grp = h / kv;
    let per_head = |x: &[f32]| -> Vec<f64> {
        let mut out = Vec::with_capacity(b * h * tk * d);
        for bi in 0..b {
            for hi in 0..h {
                let at = (bi * kv + hi / grp) * tk * d;
                out.extend(x[at..at + tk * d].iter().map(|&e| e as f64));
            }
        }
        out
    };
    let f = |x: &[f32]| x.iter().map(|&e| e as f64).collect::<Vec<f64>>();
    let z = reference::Dims {
        bh: b * h,
        tq,
        tk,
        d,
    };
    let (qf, kf, vf) = (f(&q), per_head(&k), per_head(&v));
    let (o_ref, lse_ref) = reference::forward(&qf, &kf, &vf, z, causal, 0.45);
    let (dq_ref, dk_h, dv_h) = reference::backward(&qf, &kf, &vf, &f(&dout), z, causal, 0.45);
    let group_sum = |x: &[f64]| -> Vec<f64> {
        let mut out = vec![0.0; nk];
        for bi in 0..b {
            for hi in 0..h {
                let (from, to) = ((bi * h + hi) * tk * d, (bi * kv + hi / grp) * tk * d);
                for e in 0..tk * d {
                    out[to + e] += x[from + e];
                }
            }
        }
        out
    };
    let what = format!("{isa:?}: b {b} h {h} kv {kv} tq {tq} tk {tk} d {d} causal {causal}");
    // Queries that see no key: lse −inf on both sides (assert_close compares finite values).
    for (i, (&got, &want)) in lse.iter().zip(&lse_ref).enumerate() {
        assert_eq!(
            got == f32::NEG_INFINITY,
            want == f64::NEG_INFINITY,
            "{what}: lse[{i}] {got} vs {want}"
        );
    }
    let finite = |x: &[f64]| {
        x.iter()
            .map(|&e| if e.is_finite() { e } else { 0.0 })
            .collect::<Vec<_>>()
    };
    let pairs = [
        ("o", f(&o), o_ref),
        ("lse", finite(&f(&lse)), finite(&lse_ref)),
        ("dq", f(&dq), dq_ref),
        ("dk", f(&dk), group_sum(&dk_h)),
        ("dv", f(&dv), group_sum(&dv_h)),
    ];
    for (name, got, want) in pairs {
        assert_close(&format!("{what}: {name}"), &got, &want, (1e-4, 1e-4));
    }
}

/// The packed kernels with grouped heads (qkv [b, t, (h + 2·kv)·d], Llama's projection) against
/// the f64 reference run on the kv heads repeated for their query heads: y, and dqkv with each
/// kv head's gradient the sum over the query heads that read it; and the composite against the
/// kernels. Across a tile edge, one kv head for all (multi-query) and none shared (h = kv).
#[test]
fn cpu_packed_gqa_matches_the_f64_reference() {
    let cases = [
        (2usize, 4usize, 2usize, 70usize, 8usize, true),
        (1, 6, 1, 9, 4, false),
        (1, 3, 3, 5, 4, true),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        run_packed_gqa(c, DType::F32, Device::Cpu, 5 + i as u64);
    }
}

/// The same on CUDA (the flash kernels, f16 and bf16, head dims 32, 64 and 128): kv groups of 1,
/// 2 and 4 (multi-query), sequence lengths off the 64/32-row tiles, causal and not. On the
/// GPU or the emulated device; skipped without either.
#[test]
fn cuda_packed_gqa_matches_the_f64_reference() {
    if sinter_cuda::testing::gpu_tests(1).is_none() {
        return;
    }
    let cases = [
        (
            (1usize, 4usize, 2usize, 70usize, 64usize, true),
            DType::BF16,
        ),
        ((2, 4, 1, 37, 64, false), DType::F16),
        ((1, 2, 2, 33, 128, true), DType::BF16),
        ((1, 4, 1, 40, 128, true), DType::F16),
        ((2, 4, 2, 65, 32, true), DType::BF16),
    ];
    for (i, (c, dtype)) in cases.into_iter().enumerate() {
        run_packed_gqa(c, dtype, Device::Cuda(0), 50 + i as u64);
    }
}

/// One case of the grouped packed op on `dev` in `dtype` against the f64 reference and the
/// composite (see the tests above); on CUDA in half precision the flash kernels must apply.
fn run_packed_gqa(
    (b, h, kv, t, d, causal): (usize, usize, usize, usize, usize, bool),
    dtype: DType,
    dev: Device,
    seed: u64,
) {
    let mut rng = crate::Rng::new(seed);
    let (w, g, scale) = ((h + 2 * kv) * d, h / kv, 0.3f32);
    let mut mk = |shape: &[usize]| {
        Tensor::randn(shape, 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap()
            .to_device(dev)
            .unwrap()
    };
    let (qkv, dy) = (mk(&[b, t, w]).to_var().unwrap(), mk(&[b, t, h * d]));
    if dev != Device::Cpu && dtype != DType::F32 {
        let geom = geom::of_packed(&qkv, h, kv, causal, scale).unwrap();
        assert!(packed(&qkv, &geom).unwrap().is_some(), "the kernels apply");
    }
    let y = attention_packed_gqa(&qkv, h, kv, causal, scale).unwrap();
    y.mul(&dy).unwrap().sum_all().unwrap().backward().unwrap();
    let (x, dyv) = (f64s(&qkv), f64s(&dy));
    // Every (batch, query head, time, element) with its index in [b, h, t, d], in qkv's
    // row for q, k and v, and in y's row.
    let each = || {
        (0..b).flat_map(move |bi| {
            (0..h).flat_map(move |hi| {
                (0..t).flat_map(move |ti| {
                    (0..d).map(move |e| {
                        let row = (bi * t + ti) * w;
                        let cols = [hi * d + e, (h + hi / g) * d + e, (h + kv + hi / g) * d + e];
                        let i = ((bi * h + hi) * t + ti) * d + e;
                        (i, cols.map(|c| row + c), (bi * t + ti) * h * d + hi * d + e)
                    })
                })
            })
        })
    };
    let n = b * h * t * d;
    let (mut q, mut k, mut v, mut dout) = (vec![0.0; n], vec![0.0; n], vec![0.0; n], vec![0.0; n]);
    for (i, [cq, ck, cv], yi) in each() {
        (q[i], k[i], v[i], dout[i]) = (x[cq], x[ck], x[cv], dyv[yi]);
    }
    let z = reference::Dims {
        bh: b * h,
        tq: t,
        tk: t,
        d,
    };
    let (o, _) = reference::forward(&q, &k, &v, z, causal, scale as f64);
    let (dq, dk, dv) = reference::backward(&q, &k, &v, &dout, z, causal, scale as f64);
    let (mut y_want, mut dx_want) = (vec![0.0; b * t * h * d], vec![0.0; b * t * w]);
    for (i, [cq, ck, cv], yi) in each() {
        y_want[yi] = o[i];
        dx_want[cq] = dq[i];
        dx_want[ck] += dk[i];
        dx_want[cv] += dv[i];
    }
    let what = format!("{dtype} on {dev}: b {b} h {h} kv {kv} t {t} d {d} causal {causal}");
    let close = |name: &str, got: &[f64], want: &[f64], tol: f64| {
        if dtype != DType::F32 {
            return check_flash(&format!("{what}: {name}"), dtype, got, want);
        }
        assert_close(&format!("{what}: {name}"), got, want, (tol, tol));
    };
    let dx = f64s(&qkv.grad().unwrap());
    close("y", &f64s(&y), &y_want, 1e-4);
    close("dqkv", &dx, &dx_want, 1e-4);
    qkv.zero_grad();
    let yc = attention_packed_gqa_reference(&qkv, h, kv, causal, scale).unwrap();
    yc.mul(&dy).unwrap().sum_all().unwrap().backward().unwrap();
    close("composite y", &f64s(&yc), &f64s(&y), 1e-5);
    close("composite dqkv", &f64s(&qkv.grad().unwrap()), &dx, 1e-5);
}

/// Grouped heads that do not divide, or a width that is not whole heads, are refused by name.
#[test]
fn packed_gqa_refuses_heads_that_do_not_fit() {
    let x = Tensor::zeros(&[1, 2, 40], DType::F32, Device::Cpu).unwrap();
    for (h, kv, says) in [
        (4, 3, "cannot share"),
        (3, 0, "cannot share"),
        (0, 1, "cannot share"),
        (4, 4, "packed qkv"),
    ] {
        let err = attention_packed_gqa(&x, h, kv, true, 1.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "h {h} kv {kv}: {err}");
    }
    // 40 columns = (4 + 2·3)·4: fine.
    assert!(attention_packed_gqa(&x, 6, 2, true, 1.0).is_ok());
}

// ---- the CUDA flash kernels (flash_attention.cu) against the f64 reference -----------------
// On the real GPU when present, else on the emulated device (the kernel emulator runs the
// kernels); skipped without either. f16 and bf16, head dims 32, 64 and 128, causal (with tq = tk,
// tq < tk and tq > tk, where early query rows see no key) and not, sequence lengths that are
// not multiples of the 64/32-row tiles, batch·heads > 1, and q, k, v read in place as views of
// packed buffers or as unaligned tensors.

/// Where q, k and v live.
#[derive(Clone, Copy, Debug)]
enum Packing {
    /// One projection [b, t, 3·h·d] through [`attention_packed`] (the kernels read its thirds
    /// and write y with the heads merged); needs tq = tk.
    Qkv,
    /// q: the heads of [b, tq, h, d + 8] (the padding holds junk the kernels must not read);
    /// k and v: the two halves of one [b, tk, 2·h, d] buffer.
    Kv,
    /// Three [b, h, t, d] tensors, each one element into its buffer (unaligned rows).
    Unaligned,
}

/// Whether element i of a base (head dim hd) is padding.
type Pad = fn(usize, usize) -> bool;
fn no_pad(_: usize, _: usize) -> bool {
    false
}
fn row_tail(i: usize, hd: usize) -> bool {
    i % (hd + 8) >= hd
}
fn first(i: usize, _: usize) -> bool {
    i == 0
}

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    hd: usize,
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    causal: bool,
    packing: Packing,
}

impl Case {
    /// The buffers q, k and v are views of: (shape, whether element i is padding).
    fn bases(&self) -> Vec<(Vec<usize>, Pad)> {
        let (b, h, hd) = (self.b, self.h, self.hd);
        match self.packing {
            Packing::Qkv => vec![(vec![b, self.tq, 3 * h, hd], no_pad as Pad)],
            Packing::Kv => vec![
                (vec![b, self.tq, h, hd + 8], row_tail as Pad),
                (vec![b, self.tk, 2 * h, hd], no_pad as Pad),
            ],
            Packing::Unaligned => [self.tq, self.tk, self.tk]
                .map(|t| (vec![b * h * t * hd + 1], first as Pad))
                .to_vec(),
        }
    }

    /// q, k and v ([b, h, t, d]) as views of the bases (or of their gradients).
    fn views(&self, bases: &[Tensor]) -> [Tensor; 3] {
        let (b, h, hd) = (self.b, self.h, self.hd);
        let heads = |x: &Tensor, at: usize| x.narrow(2, at, h).unwrap().transpose(1, 2).unwrap();
        match self.packing {
            Packing::Qkv => [0, h, 2 * h].map(|at| heads(&bases[0], at)),
            Packing::Kv => [
                bases[0].narrow(3, 0, hd).unwrap().transpose(1, 2).unwrap(),
                heads(&bases[1], 0),
                heads(&bases[1], h),
            ],
            Packing::Unaligned => {
                let ts = [self.tq, self.tk, self.tk];
                std::array::from_fn(|i| {
                    let n = b * h * ts[i] * hd;
                    bases[i]
                        .narrow(0, 1, n)
                        .unwrap()
                        .reshape(&[b, h, ts[i], hd])
                        .unwrap()
                })
            }
        }
    }
}

/// Element-wise check with an absolute floor relative to the largest magnitude: the kernels
/// round P and dS to the input type before the second product, so errors scale with the
/// operands, not with each (possibly cancelling) result. -inf (a row without keys) must match.
fn check_flash(what: &str, d: DType, got: &[f64], want: &[f64]) {
    let (rtol, afrac) = if d == DType::F16 {
        (5e-3, 2e-3)
    } else {
        (2e-2, 1.2e-2)
    };
    assert_close(what, got, want, (rtol, afrac * magnitude(want)));
}

fn run_flash_case(c: &Case, seed: u64, dev: Device) {
    let (b, h, tq, tk, hd, d) = (c.b, c.h, c.tq, c.tk, c.hd, c.dtype);
    // A scale above 1/sqrt(d) makes the softmax peaked, so a misplaced mask or a wrong row
    // rescaling moves the results well beyond the tolerances.
    let scale = 2.0 / (hd as f32).sqrt();
    let bases: Vec<Tensor> = c
        .bases()
        .into_iter()
        .enumerate()
        .map(|(i, (shape, pad))| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = values(seed * 8 + i as u64, n, -1.5, 1.5)
                .into_iter()
                .enumerate()
                .map(|(j, x)| if pad(j, hd) { 50.0 + x } else { x })
                .collect();
            let t = Tensor::from_vec(v, &shape, Device::Cpu).unwrap();
            t.to_dtype(d)
                .unwrap()
                .to_device(dev)
                .unwrap()
                .to_var()
                .unwrap()
        })
        .collect();
    let [q, k, v] = c.views(&bases);
    let w = Tensor::from_vec(
        values(seed * 8 + 7, b * h * tq * hd, -1.5, 1.5),
        &[b, h, tq, hd],
        Device::Cpu,
    )
    .unwrap()
    .to_dtype(d)
    .unwrap()
    .to_device(dev)
    .unwrap();
    let z = reference::Dims {
        bh: b * h,
        tq,
        tk,
        d: hd,
    };
    let (qv, kv, vv, wv) = (f64s(&q), f64s(&k), f64s(&v), f64s(&w));
    let (o_ref, lse_ref) = reference::forward(&qv, &kv, &vv, z, c.causal, scale as f64);
    let (dq_ref, dk_ref, dv_ref) =
        reference::backward(&qv, &kv, &vv, &wv, z, c.causal, scale as f64);

    let (o, lse) = match c.packing {
        Packing::Qkv => {
            let qkv = bases[0].reshape(&[b, tq, 3 * h * hd]).unwrap();
            let g = geom::of_packed(&qkv, h, h, c.causal, scale).unwrap();
            let (_, lse) = packed(&qkv, &g).unwrap().expect("the kernels apply");
            let y = attention_packed(&qkv, h, c.causal, scale).unwrap();
            let o = y.reshape(&[b, tq, h, hd]).unwrap().transpose(1, 2).unwrap();
            (o, lse)
        }
        _ => {
            let g = geom::of_qkv(&q, &k, &v, c.causal, scale).unwrap();
            let (_, lse) = flash(&q, &k, &v, &g).unwrap().expect("the kernels apply");
            (attention(&q, &k, &v, c.causal, scale).unwrap(), lse)
        }
    };
    let what = format!("flash on {dev}: {c:?}");
    check_flash(&format!("{what}: o"), d, &f64s(&o), &o_ref);
    let lse = Tensor::from_storage(lse, &[b * h * tq]);
    assert_close(&format!("{what}: lse"), &f64s(&lse), &lse_ref, (1e-4, 1e-4));

    o.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
    let grads: Vec<Tensor> = bases
        .iter()
        .map(|x| x.grad().expect("a gradient"))
        .collect();
    let [dq, dk, dv] = c.views(&grads);
    check_flash(&format!("{what}: dq"), d, &f64s(&dq), &dq_ref);
    check_flash(&format!("{what}: dk"), d, &f64s(&dk), &dk_ref);
    check_flash(&format!("{what}: dv"), d, &f64s(&dv), &dv_ref);
}

fn run_flash_cases(cases: &[Case], seed: u64) {
    run_cases(cases, seed, AttentionBackend::Flash);
}

/// The cases with `backend` selected on this thread (forward and backward).
fn run_cases(cases: &[Case], seed: u64, backend: AttentionBackend) {
    if sinter_cuda::testing::gpu_tests(1).is_none() {
        return;
    }
    for (i, c) in cases.iter().enumerate() {
        with_attention_backend(backend, || {
            run_flash_case(c, seed + i as u64, Device::Cuda(0))
        });
    }
}

fn case(
    dtype: DType,
    hd: usize,
    (b, h): (usize, usize),
    (tq, tk): (usize, usize),
    causal: bool,
    packing: Packing,
) -> Case {
    Case {
        dtype,
        hd,
        b,
        h,
        tq,
        tk,
        causal,
        packing,
    }
}

#[test]
fn cuda_flash_kernels_head_dim_64() {
    let cases = [
        case(DType::F16, 64, (1, 2), (37, 37), false, Packing::Qkv),
        case(DType::BF16, 64, (2, 1), (100, 100), true, Packing::Qkv),
        case(DType::F16, 64, (1, 2), (100, 37), true, Packing::Kv),
        case(
            DType::BF16,
            64,
            (1, 1),
            (33, 100),
            false,
            Packing::Unaligned,
        ),
        case(DType::F16, 64, (2, 1), (20, 70), true, Packing::Unaligned),
    ];
    run_flash_cases(&cases, 100);
}

/// Head dim 32 (llama-tiny's heads).
#[test]
fn cuda_flash_kernels_head_dim_32() {
    let cases = [
        case(DType::BF16, 32, (2, 2), (70, 70), true, Packing::Qkv),
        case(DType::F16, 32, (1, 2), (37, 100), true, Packing::Kv),
        case(DType::BF16, 32, (1, 1), (33, 40), false, Packing::Unaligned),
    ];
    run_flash_cases(&cases, 250);
}

#[test]
fn cuda_flash_kernels_head_dim_128() {
    let cases = [
        case(DType::BF16, 128, (1, 2), (37, 100), true, Packing::Kv),
        case(DType::F16, 128, (2, 1), (64, 64), true, Packing::Qkv),
        case(
            DType::BF16,
            128,
            (1, 1),
            (70, 33),
            false,
            Packing::Unaligned,
        ),
        case(DType::F16, 128, (1, 2), (70, 40), true, Packing::Kv),
    ];
    run_flash_cases(&cases, 200);
}

/// One query decoding against a cache (causal: it sees every key), one key, three heads, and
/// an empty key sequence (o = 0, lse = -inf, dq = 0).
#[test]
fn cuda_flash_kernels_single_rows() {
    let cases = [
        case(DType::F16, 64, (1, 3), (1, 37), true, Packing::Kv),
        case(DType::BF16, 128, (2, 1), (1, 1), true, Packing::Qkv),
        case(DType::BF16, 64, (1, 3), (5, 1), false, Packing::Unaligned),
        case(DType::F16, 64, (1, 1), (5, 1), true, Packing::Kv),
        case(DType::F16, 64, (1, 2), (3, 0), false, Packing::Unaligned),
    ];
    run_flash_cases(&cases, 300);
}

// ---- cuDNN's fused attention (cudnn.rs) through the same cases ------------------------------
// On the emulated device cuDNN is the host execution of the graph the real device would build
// (emulated::sdpa in sinter-cuda: the unified SDPA operation, or the composite fused-attention
// graph, checked against the pattern cuDNN's engines run); on a GPU it is cuDNN itself. Which
// pass cuDNN takes follows the loaded release (the emulated device reports 9.14.0, the H200's:
// unified non-causal forward, composite causal forward and composite backward where the key
// count is a multiple of 128); the rest runs the flash kernels on cuDNN's stats.

/// Whether cuDNN takes this case's forward and its backward here (f16/bf16, 16-byte aligned
/// views, causal rows that all see a key, a cuDNN that takes the pass through either graph).
fn cudnn_expected(c: &Case) -> [Option<sinter_cuda::cudnn::sdpa::Form>; 2] {
    use sinter_cuda::cudnn::sdpa::{self as sdpa, SdpaPass};
    let p = sdpa::SdpaProblem {
        b: c.b,
        h: c.h,
        tq: c.tq,
        tk: c.tk,
        d: c.hd,
        dtype: c.dtype,
        causal: c.causal,
        scale: 1.0,
    };
    let dev = crate::cuda::device(0).expect("the test device");
    let v = sdpa::loaded_version(&dev);
    [SdpaPass::Forward, SdpaPass::Backward].map(|pass| {
        (!matches!(c.packing, Packing::Unaligned))
            .then(|| sdpa::choose(v, &p, pass).ok())
            .flatten()
    })
}

/// Runs the cases through cuDNN and checks how many cuDNN calls each made; returns how many
/// passes took the composite graph.
fn run_cudnn_cases(cases: &[Case], seed: u64) -> usize {
    if sinter_cuda::testing::gpu_tests(1).is_none() {
        return 0;
    }
    let mut composite = 0;
    for (i, c) in cases.iter().enumerate() {
        let before = cudnn::calls_on_this_thread();
        run_cases(
            std::slice::from_ref(c),
            seed + i as u64,
            AttentionBackend::Cudnn,
        );
        let ran = cudnn::calls_on_this_thread() - before;
        let [fwd, bwd] = cudnn_expected(c);
        // The test's own extra forward for the stats and the op's forward, then the backward.
        let want = 2 * fwd.is_some() as usize + bwd.is_some() as usize;
        assert_eq!(ran, want, "cuDNN calls for {c:?} ({fwd:?}, {bwd:?})");
        composite += [fwd, bwd]
            .iter()
            .filter(|f| **f == Some(sinter_cuda::cudnn::sdpa::Form::Composite))
            .count();
    }
    composite
}

#[test]
fn cudnn_attention_head_dim_64() {
    let cases = [
        case(DType::F16, 64, (1, 2), (37, 37), false, Packing::Qkv),
        case(DType::BF16, 64, (2, 1), (100, 100), true, Packing::Qkv),
        case(DType::BF16, 64, (1, 2), (37, 100), true, Packing::Kv),
        case(DType::F16, 64, (1, 2), (70, 33), false, Packing::Kv),
        // Declined (rows one element off 16-byte alignment; causal rows without keys): flash.
        case(DType::F16, 64, (2, 1), (20, 70), true, Packing::Unaligned),
        case(DType::F16, 64, (1, 2), (100, 37), true, Packing::Kv),
    ];
    run_cudnn_cases(&cases, 400);
}

#[test]
fn cudnn_attention_head_dim_128() {
    let cases = [
        case(DType::F16, 128, (2, 1), (64, 64), true, Packing::Qkv),
        case(DType::BF16, 128, (1, 2), (33, 33), false, Packing::Qkv),
        case(DType::BF16, 128, (1, 2), (37, 100), true, Packing::Kv),
    ];
    run_cudnn_cases(&cases, 500);
}

/// Key counts that are multiples of 128 and causal forwards: cuDNN's composite fused-attention
/// graph (on the emulated device's default 9.14.0), forward and backward, causal and not, bf16
/// and f16, head dims 64 and 128, packed qkv and separate q/kv, against the reference.
#[test]
fn cudnn_composite_attention() {
    let cases = [
        case(DType::BF16, 64, (2, 2), (128, 128), true, Packing::Qkv),
        case(DType::F16, 64, (1, 2), (128, 128), false, Packing::Kv),
        case(DType::F16, 128, (1, 2), (128, 128), true, Packing::Kv),
        case(DType::BF16, 128, (2, 1), (128, 128), false, Packing::Qkv),
        case(DType::BF16, 64, (1, 1), (64, 256), true, Packing::Kv),
    ];
    let composite = run_cudnn_cases(&cases, 600);
    let emulated_default = sinter_cuda::testing::gpu_tests(1).is_some()
        && sinter_cuda::runtime::is_emulated()
        && std::env::var("SINTER_CUDA_EMU_CUDNN").is_err();
    if emulated_default {
        // Causal forwards (3) and every backward (5) through the composite graph.
        assert_eq!(composite, 8);
    }
}
