//! flash_attention.cu (FlashAttention-2 forward, row dot, dK/dV and dQ kernels) run through the CPU
//! emulator from its launch plans, against a dense f64 reference: softmax(scale·q·kᵀ + mask)·v,
//! its log-sum-exp, and the gradients dQ, dK, dV. Covers f16 and bf16, head dims 64 and 128,
//! causal (bottom-right aligned, with tq = tk, tq < tk and tq > tk where early query rows see no
//! key) and not, sequence lengths that are not multiples of the 64/32-row tiles, batch·heads > 1,
//! and q/k/v read in place as strided views of a packed [b, t, 3, h, d] projection, of a packed
//! [b, t, 2, h, d] key/value buffer with a padded q, or unaligned contiguous tensors (scalar tile
//! loads). Every launch runs in forward and reverse thread order and must give identical bits.
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

#[path = "emu/harness.rs"]
mod harness;

use harness::*;
use sinter_cuda::launch::Step;
use sinter_cuda::ops::flash_attention::{self, AttnShape, AttnView};
use sinter_cuda::{DType, DevSlice};

/// How q, k and v are laid out in memory.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// One [b, t, 3, h, d] buffer (a fused qkv projection); needs tq = tk.
    Packed3,
    /// q [b, tq, h, d + 8] (padding filled with junk), k and v in one [b, tk, 2, h, d] buffer.
    PackedKv,
    /// Three contiguous [b, h, t, d] tensors, each shifted by one element (unaligned rows).
    Unaligned,
}

struct Case {
    d: DType,
    b: usize,
    h: usize,
    tq: usize,
    tk: usize,
    hd: usize,
    causal: bool,
    layout: Layout,
}

/// An operand's place: which input buffer, first element, [batch, head, row] strides.
#[derive(Clone, Copy)]
struct Place {
    buf: usize,
    base: usize,
    strides: [usize; 3],
}

/// A contiguous [b, h, t, hd] view of the whole of `buf`.
fn dense(buf: &Buf, h: usize, t: usize, hd: usize) -> AttnView<'static> {
    AttnView {
        data: buf.slice(),
        strides: [h * t * hd, t * hd, hd],
    }
}

fn view(bufs: &[Buf], p: Place) -> AttnView<'static> {
    let b = &bufs[p.buf];
    // SAFETY: the view starts inside the buffer and ends with it; the buffer outlives the runs.
    let data = unsafe {
        DevSlice::from_raw(
            b.ptr() + (p.base * b.dtype.size()) as u64,
            b.len - p.base,
            b.dtype,
        )
    };
    AttnView {
        data,
        strides: p.strides,
    }
}

/// Logical [b, h, t, hd] values written through a place into a host image of its buffer.
fn put(img: &mut [f64], p: Place, vals: &[f64], b: usize, h: usize, t: usize, hd: usize) {
    for bi in 0..b {
        for hi in 0..h {
            for ti in 0..t {
                for c in 0..hd {
                    let at = p.base + bi * p.strides[0] + hi * p.strides[1] + ti * p.strides[2] + c;
                    img[at] = vals[((bi * h + hi) * t + ti) * hd + c];
                }
            }
        }
    }
}

/// Keys query row i may see (bottom-right aligned causal mask), as in the kernel header.
fn limit(i: usize, tq: usize, tk: usize, causal: bool) -> usize {
    if !causal {
        return tk;
    }
    (i as i64 + tk as i64 - tq as i64 + 1).clamp(0, tk as i64) as usize
}

struct Reference {
    o: Vec<f64>,
    lse: Vec<f64>,
    dq: Vec<f64>,
    dk: Vec<f64>,
    dv: Vec<f64>,
}

/// Dense attention and its gradients in f64, one (batch, head) at a time.
#[allow(clippy::too_many_arguments)]
fn reference(c: &Case, scale: f64, q: &[f64], k: &[f64], v: &[f64], dout: &[f64]) -> Reference {
    let (tq, tk, hd) = (c.tq, c.tk, c.hd);
    let bh = c.b * c.h;
    let mut r = Reference {
        o: vec![0.0; bh * tq * hd],
        lse: vec![f64::NEG_INFINITY; bh * tq],
        dq: vec![0.0; bh * tq * hd],
        dk: vec![0.0; bh * tk * hd],
        dv: vec![0.0; bh * tk * hd],
    };
    for g in 0..bh {
        let qg = &q[g * tq * hd..(g + 1) * tq * hd];
        let kg = &k[g * tk * hd..(g + 1) * tk * hd];
        let vg = &v[g * tk * hd..(g + 1) * tk * hd];
        let dog = &dout[g * tq * hd..(g + 1) * tq * hd];
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        for i in 0..tq {
            let lim = limit(i, tq, tk, c.causal);
            if lim == 0 {
                continue; // no visible key: o = 0, lse = -inf, no gradient
            }
            let qi = &qg[i * hd..(i + 1) * hd];
            let s: Vec<f64> = (0..lim)
                .map(|j| scale * dot(qi, &kg[j * hd..(j + 1) * hd]))
                .collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|x| (x - m).exp()).sum();
            let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / sum).collect();
            r.lse[g * tq + i] = m + sum.ln();
            let oi = &mut r.o[(g * tq + i) * hd..(g * tq + i + 1) * hd];
            for j in 0..lim {
                for cc in 0..hd {
                    oi[cc] += p[j] * vg[j * hd + cc];
                }
            }
            let doi = &dog[i * hd..(i + 1) * hd];
            let di = dot(doi, oi);
            for j in 0..lim {
                let dp = dot(doi, &vg[j * hd..(j + 1) * hd]);
                let ds = p[j] * (dp - di);
                for cc in 0..hd {
                    r.dq[(g * tq + i) * hd + cc] += scale * ds * kg[j * hd + cc];
                    r.dk[(g * tk + j) * hd + cc] += scale * ds * qi[cc];
                    r.dv[(g * tk + j) * hd + cc] += p[j] * doi[cc];
                }
            }
        }
    }
    r
}

/// Element-wise check with an absolute floor relative to the tensor's largest magnitude: the
/// kernels round P and dS to the input type before the second matmul, so errors scale with the
/// operands, not with each (possibly cancelling) result.
fn check(what: &str, d: DType, got: &[f64], want: &[f64]) {
    let (rtol, afrac) = match d {
        DType::F16 => (5e-3, 2e-3),
        _ => (2e-2, 1.2e-2),
    };
    let big = want
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f64, |a, &x| a.max(x.abs()));
    let worst = got
        .iter()
        .zip(want)
        .filter(|(_, w)| w.is_finite())
        .fold(0.0f64, |a, (g, w)| a.max((g - w).abs() / big.max(1e-3)));
    eprintln!("{what}: largest error {worst:.2e} of the largest magnitude {big:.3}");
    assert_close(what, got, want, (rtol, afrac * big.max(1e-3)));
}

fn run_case(c: &Case, seed: u64) {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(seed);
    let (b, h, tq, tk, hd, d) = (c.b, c.h, c.tq, c.tk, c.hd, c.d);
    // A scale above 1/sqrt(d) makes the softmax peaked, so a misplaced mask or a wrong row
    // rescaling moves the results well beyond the tolerances.
    let scale = 2.0 / (hd as f64).sqrt();
    let gen = |rng: &mut Rng, n: usize| -> Vec<f64> {
        rng.vec(n, -1.5, 1.5).into_iter().map(|x| q(d, x)).collect()
    };
    let qv = gen(&mut rng, b * h * tq * hd);
    let kv = gen(&mut rng, b * h * tk * hd);
    let vv = gen(&mut rng, b * h * tk * hd);
    let dov = gen(&mut rng, b * h * tq * hd);

    // Input buffer images (junk where no operand lives) and the operands' places in them.
    let (sizes, shift, pq, pk, pv): (Vec<usize>, usize, Place, Place, Place) = match c.layout {
        Layout::Packed3 => {
            assert_eq!(tq, tk, "a packed qkv projection has one sequence length");
            let st = [tq * 3 * h * hd, hd, 3 * h * hd];
            let p = |w: usize| Place {
                buf: 0,
                base: w * h * hd,
                strides: st,
            };
            (vec![b * tq * 3 * h * hd], 0, p(0), p(1), p(2))
        }
        Layout::PackedKv => {
            let w = hd + 8;
            let pq = Place {
                buf: 0,
                base: 0,
                strides: [tq * h * w, w, h * w],
            };
            let st = [tk * 2 * h * hd, hd, 2 * h * hd];
            let pk = Place {
                buf: 1,
                base: 0,
                strides: st,
            };
            let pv = Place {
                buf: 1,
                base: h * hd,
                strides: st,
            };
            (vec![b * tq * h * w, b * tk * 2 * h * hd], 0, pq, pk, pv)
        }
        Layout::Unaligned => {
            let p = |buf: usize, t: usize| Place {
                buf,
                base: 0,
                strides: [h * t * hd, t * hd, hd],
            };
            let sizes = vec![b * h * tq * hd, b * h * tk * hd, b * h * tk * hd];
            (sizes, 1, p(0, tq), p(1, tk), p(2, tk))
        }
    };
    let mut imgs: Vec<Vec<f64>> = sizes
        .iter()
        .map(|&n| {
            rng.vec(n, 50.0, 60.0)
                .into_iter()
                .map(|x| q(d, x))
                .collect()
        })
        .collect();
    put(&mut imgs[pq.buf], pq, &qv, b, h, tq, hd);
    put(&mut imgs[pk.buf], pk, &kv, b, h, tk, hd);
    put(&mut imgs[pv.buf], pv, &vv, b, h, tk, hd);
    let mut ins: Vec<Buf> = imgs.iter().map(|v| Buf::from_f64(d, v, shift)).collect();

    let shape = AttnShape {
        b,
        h,
        tq,
        tk,
        d: hd,
        causal: c.causal,
        scale: scale as f32,
    };
    let name = format!(
        "flash {d} d{hd} b{b} h{h} tq{tq} tk{tk} causal={} {:?}",
        c.causal, c.layout
    );
    let want = reference(c, scale as f32 as f64, &qv, &kv, &vv, &dov);

    // Forward.
    let rows = b * h * tq;
    let mut o = Buf::zeros(d, rows * hd, 0);
    let mut lse = Buf::zeros(DType::F32, rows, 0);
    let l = flash_attention::plan_flash_forward(
        &T1,
        &shape,
        view(&ins, pq),
        view(&ins, pk),
        view(&ins, pv),
        dense(&o, h, tq, hd),
        lse.slice(),
    )
    .unwrap()
    .expect("a non-empty forward launches");
    {
        let mut all: Vec<&mut Buf> = ins.iter_mut().collect();
        all.push(&mut o);
        all.push(&mut lse);
        exec_both(e, &[Step::Kernel(l)], &mut all);
    }
    check(&format!("{name}: o"), d, &o.get(), &want.o);
    assert_close(&format!("{name}: lse"), &lse.get(), &want.lse, (1e-4, 1e-4));

    // Backward, from the kernel's own o and lse (as autograd runs it).
    let mut dout = Buf::from_f64(d, &dov, 0);
    let mut dvec = Buf::zeros(DType::F32, rows, 0);
    let mut dq = Buf::zeros(d, rows * hd, 0);
    let mut dk = Buf::zeros(d, b * h * tk * hd, 0);
    let mut dv = Buf::zeros(d, b * h * tk * hd, 0);
    let steps = flash_attention::plan_flash_backward(
        &T1,
        &shape,
        view(&ins, pq),
        view(&ins, pk),
        view(&ins, pv),
        dense(&o, h, tq, hd),
        dense(&dout, h, tq, hd),
        lse.slice(),
        dvec.slice(),
        dense(&dq, h, tq, hd),
        dense(&dk, h, tk, hd),
        dense(&dv, h, tk, hd),
    )
    .unwrap();
    {
        let mut all: Vec<&mut Buf> = ins.iter_mut().collect();
        for x in [
            &mut o, &mut lse, &mut dout, &mut dvec, &mut dq, &mut dk, &mut dv,
        ] {
            all.push(x);
        }
        exec_both(e, &steps, &mut all);
    }
    // dvec = rowsum(dout ∘ o) of the stored o.
    let og = o.get();
    let dvec_want: Vec<f64> = (0..rows)
        .map(|r| (0..hd).map(|c| og[r * hd + c] * dov[r * hd + c]).sum())
        .collect();
    // (No keys: o is 0, so dvec is 0 too.)
    assert_close(
        &format!("{name}: dvec"),
        &dvec.get(),
        &dvec_want,
        (1e-5, 1e-4),
    );
    check(&format!("{name}: dq"), d, &dq.get(), &want.dq);
    check(&format!("{name}: dk"), d, &dk.get(), &want.dk);
    check(&format!("{name}: dv"), d, &dv.get(), &want.dv);
}

fn case(
    d: DType,
    hd: usize,
    (b, h): (usize, usize),
    (tq, tk): (usize, usize),
    causal: bool,
    layout: Layout,
) -> Case {
    Case {
        d,
        b,
        h,
        tq,
        tk,
        hd,
        causal,
        layout,
    }
}

#[test]
fn flash_attention_head_dim_64() {
    let cases = [
        case(DType::F16, 64, (1, 2), (37, 37), false, Layout::Packed3),
        case(DType::BF16, 64, (2, 1), (100, 100), true, Layout::Packed3),
        case(DType::F16, 64, (1, 2), (100, 37), true, Layout::PackedKv),
        case(DType::BF16, 64, (1, 1), (33, 100), false, Layout::Unaligned),
        case(DType::F16, 64, (2, 1), (20, 70), true, Layout::Unaligned),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_case(c, 100 + i as u64);
    }
}

#[test]
fn flash_attention_head_dim_128() {
    let cases = [
        case(DType::BF16, 128, (1, 2), (37, 100), true, Layout::PackedKv),
        case(DType::F16, 128, (2, 1), (64, 64), true, Layout::Packed3),
        case(DType::BF16, 128, (1, 1), (70, 33), false, Layout::Unaligned),
        case(DType::F16, 128, (1, 2), (70, 40), true, Layout::PackedKv),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_case(c, 200 + i as u64);
    }
}

#[test]
fn flash_attention_single_rows() {
    // One query decoding against a cache (causal: it sees every key), one key, three heads, and
    // an empty key sequence.
    let cases = [
        case(DType::F16, 64, (1, 3), (1, 37), true, Layout::PackedKv),
        case(DType::BF16, 128, (2, 1), (1, 1), true, Layout::Packed3),
        case(DType::BF16, 64, (1, 3), (5, 1), false, Layout::Unaligned),
        case(DType::F16, 64, (1, 1), (5, 1), true, Layout::PackedKv),
        // No keys at all: o = 0, lse = -inf, dq = 0.
        case(DType::F16, 64, (1, 2), (3, 0), false, Layout::Unaligned),
    ];
    for (i, c) in cases.iter().enumerate() {
        run_case(c, 300 + i as u64);
    }
}
