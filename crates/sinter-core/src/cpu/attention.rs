//! Flash attention on the CPU (FlashAttention-2's algorithm): the kernels behind
//! `fused::attention` (see its module docs for what it reads, writes and why it is fast).
//! Scores are produced one 64 × 64 tile at a time and folded into the output with an online
//! softmax; the backward recomputes each tile's probabilities from the saved log-sum-exp.
//! Causal masking is aligned bottom-right (`AttnGeom::limit`).

use rayon::prelude::*;
use sinter_cpu::gemm::{Gemm, MatMut, MatRef};

use super::CpuStorage;
use crate::backend::AttnGeom;
use crate::Layout;

/// Query rows per tile.
const BR: usize = 64;
/// Keys per tile.
const BC: usize = 64;

/// Rows of one [b, h, t, d] operand: row (b, h, i) starts at off + b·sb + h·sh + i·st and its
/// d values are consecutive.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    off: usize,
    sb: usize,
    sh: usize,
    st: usize,
}

impl View<'_> {
    #[inline]
    fn ptr(&self, b: usize, h: usize, i: usize) -> *const f32 {
        let at = self.off + b * self.sb + h * self.sh + i * self.st;
        self.data[at..].as_ptr()
    }
}

/// An operand's values: the storage itself when it can be read in place (f32 with a unit
/// last stride), else an f32 row-major copy.
pub enum Src<'a> {
    InPlace(&'a [f32], &'a Layout),
    Copied(Vec<f32>, Layout),
}

impl<'a> Src<'a> {
    pub fn of(s: &'a CpuStorage, l: &'a Layout) -> Src<'a> {
        let last_unit = l.shape()[3] <= 1 || l.strides()[3] == 1;
        match s {
            CpuStorage::F32(v) if last_unit => Src::InPlace(v, l),
            _ => Src::Copied(
                s.f32_contiguous(l).into_owned(),
                Layout::contiguous(l.shape()),
            ),
        }
    }
    fn view(&self) -> View<'_> {
        let (data, l): (&[f32], &Layout) = match self {
            Src::InPlace(v, l) => (v, l),
            Src::Copied(v, l) => (v.as_slice(), l),
        };
        let s = l.strides();
        View {
            data,
            off: l.offset(),
            sb: s[0],
            sh: s[1],
            st: s[2],
        }
    }
}

/// dst[m×n] (row stride `dst_rs`, unit column stride) = (dst if `accumulate`, else 0) +
/// beta · a[m×k] · b[k×n], with a and b given by row and column strides.
///
/// # Safety
/// Every addressed element of `dst`, `a` and `b` must be in bounds, and `dst` must not
/// overlap `a` or `b`.
#[allow(clippy::too_many_arguments)]
#[inline]
unsafe fn mm(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_rs: usize,
    accumulate: bool,
    a: *const f32,
    a_rs: usize,
    a_cs: usize,
    b: *const f32,
    b_rs: usize,
    b_cs: usize,
    beta: f32,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                std::slice::from_raw_parts_mut(dst.add(r * dst_rs), n).fill(0.0);
            }
        }
        return;
    }
    // The slices reach exactly the last addressed element of each operand.
    let extent =
        |rows: usize, rs: usize, cols: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs + 1;
    let a = std::slice::from_raw_parts(a, extent(m, a_rs, k, a_cs));
    let b = std::slice::from_raw_parts(b, extent(k, b_rs, n, b_cs));
    let dst = std::slice::from_raw_parts_mut(dst, extent(m, dst_rs, n, 1));
    let view = |data, rs: usize, cs: usize| MatRef {
        data,
        offset: 0,
        rs: rs as isize,
        cs: cs as isize,
    };
    // One thread: the callers already run one tile per core.
    Gemm::new(m, n, k)
        .alpha(beta)
        .beta(if accumulate { 1.0 } else { 0.0 })
        .threads(1)
        .run(
            view(a, a_rs, a_cs),
            view(b, b_rs, b_cs),
            MatMut {
                data: dst,
                offset: 0,
                rs: dst_rs as isize,
                cs: 1,
            },
        )
        .expect("internal error: attention tile views out of bounds")
}

/// Forward over every (batch, head, query block); returns (o [b, h, tq, d], lse [b, h, tq]).
fn forward_views(g: &AttnGeom, q: View, k: View, v: View) -> (Vec<f32>, Vec<f32>) {
    let (tq, d) = (g.tq, g.d);
    let mut o = vec![0f32; g.b * g.h * tq * d];
    let mut lse = vec![f32::NEG_INFINITY; g.b * g.h * tq];
    if o.is_empty() {
        return (o, lse);
    }
    o.par_chunks_mut(tq * d)
        .zip(lse.par_chunks_mut(tq))
        .enumerate()
        .for_each(|(bh, (o, lse))| {
            let (bi, hi) = (bh / g.h, bh % g.h);
            o.par_chunks_mut(BR * d)
                .zip(lse.par_chunks_mut(BR))
                .enumerate()
                .for_each(|(qb, (o, lse))| {
                    forward_tile(g, q, k, v, bi, hi, qb * BR, o, lse);
                });
        });
    (o, lse)
}

/// One query block: rows i0..i0+nr of head (bi, hi); `o` (zeroed) doubles as the accumulator.
#[allow(clippy::too_many_arguments)]
fn forward_tile(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    bi: usize,
    hi: usize,
    i0: usize,
    o: &mut [f32],
    lse: &mut [f32],
) {
    let (d, nr) = (g.d, lse.len());
    let kend = g.limit(i0 + nr - 1);
    let mut m = vec![f32::NEG_INFINITY; nr];
    let mut l = vec![0f32; nr];
    let mut s = vec![0f32; nr * BC];
    let mut j0 = 0;
    while j0 < kend {
        let nc = BC.min(kend - j0);
        // S = scale · Q_i K_jᵀ
        // SAFETY: rows i0..i0+nr of q and j0..j0+nc of k exist (shapes checked); s holds nr×nc.
        unsafe {
            mm(
                nr,
                nc,
                d,
                s.as_mut_ptr(),
                nc,
                false,
                q.ptr(bi, hi, i0),
                q.st,
                1,
                k.ptr(bi, hi, j0),
                1,
                k.st,
                g.scale,
            )
        };
        for r in 0..nr {
            let row = &mut s[r * nc..(r + 1) * nc];
            let lim = g.limit(i0 + r).saturating_sub(j0).min(nc);
            if lim == 0 {
                row.fill(0.0);
                continue;
            }
            let mx = row[..lim].iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let m_new = m[r].max(mx);
            let alpha = (m[r] - m_new).exp();
            let mut sum = 0f32;
            for x in &mut row[..lim] {
                *x = (*x - m_new).exp();
                sum += *x;
            }
            row[lim..].fill(0.0);
            l[r] = l[r] * alpha + sum;
            if alpha != 1.0 {
                o[r * d..(r + 1) * d].iter_mut().for_each(|x| *x *= alpha);
            }
            m[r] = m_new;
        }
        // O_i += P V_j
        // SAFETY: s is nr×nc, rows j0..j0+nc of v exist, o holds nr×d.
        unsafe {
            mm(
                nr,
                d,
                nc,
                o.as_mut_ptr(),
                d,
                true,
                s.as_ptr(),
                nc,
                1,
                v.ptr(bi, hi, j0),
                v.st,
                1,
                1.0,
            )
        };
        j0 += BC;
    }
    for r in 0..nr {
        let row = &mut o[r * d..(r + 1) * d];
        if l[r] > 0.0 {
            let inv = 1.0 / l[r];
            row.iter_mut().for_each(|x| *x *= inv);
            lse[r] = m[r] + l[r].ln();
        } else {
            // A row that sees no key (only when causal with tq > tk): output 0.
            row.fill(0.0);
            lse[r] = f32::NEG_INFINITY;
        }
    }
}

/// Backward over every (batch, head); o, lse and dout are contiguous. Returns (dq, dk, dv),
/// contiguous [b, h, t, d].
#[allow(clippy::too_many_arguments)]
fn backward_views(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    o: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (tq, tk, d) = (g.tq, g.tk, g.d);
    let mut dq = vec![0f32; g.b * g.h * tq * d];
    let mut dk = vec![0f32; g.b * g.h * tk * d];
    let mut dv = vec![0f32; g.b * g.h * tk * d];
    if dq.is_empty() || dk.is_empty() {
        return (dq, dk, dv);
    }
    dq.par_chunks_mut(tq * d)
        .zip(dk.par_chunks_mut(tk * d))
        .zip(dv.par_chunks_mut(tk * d))
        .enumerate()
        .for_each(|(bh, ((dq, dk), dv))| {
            let rows = bh * tq..(bh + 1) * tq;
            let (o, lse, dout) = (
                &o[rows.start * d..rows.end * d],
                &lse[rows.clone()],
                &dout[rows.start * d..rows.end * d],
            );
            backward_head(g, q, k, v, bh / g.h, bh % g.h, o, lse, dout, dq, dk, dv);
        });
    (dq, dk, dv)
}

#[allow(clippy::too_many_arguments)]
fn backward_head(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    bi: usize,
    hi: usize,
    o: &[f32],
    lse: &[f32],
    dout: &[f32],
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (tq, tk, d) = (g.tq, g.tk, g.d);
    // D_i = rowsum(dO_i ∘ O_i)
    let dsum: Vec<f32> = (0..tq)
        .map(|i| {
            o[i * d..(i + 1) * d]
                .iter()
                .zip(&dout[i * d..(i + 1) * d])
                .map(|(a, b)| a * b)
                .sum()
        })
        .collect();
    let mut p = vec![0f32; BR * BC];
    let mut ds = vec![0f32; BR * BC];
    let mut j0 = 0;
    while j0 < tk {
        let nc = BC.min(tk - j0);
        let mut i0 = g.first_row_seeing(j0);
        while i0 < tq {
            let nr = BR.min(tq - i0);
            // P = exp(scale · Q_i K_jᵀ − lse_i), zero where masked.
            // SAFETY (all mm calls below): the addressed rows exist by the shape checks, the
            // tile buffers hold nr×nc, and dq/dk/dv rows i0..i0+nr / j0..j0+nc are in range.
            unsafe {
                mm(
                    nr,
                    nc,
                    d,
                    p.as_mut_ptr(),
                    nc,
                    false,
                    q.ptr(bi, hi, i0),
                    q.st,
                    1,
                    k.ptr(bi, hi, j0),
                    1,
                    k.st,
                    g.scale,
                )
            };
            for r in 0..nr {
                let row = &mut p[r * nc..(r + 1) * nc];
                let lim = g.limit(i0 + r).saturating_sub(j0).min(nc);
                let m = lse[i0 + r];
                if m == f32::NEG_INFINITY {
                    row.fill(0.0);
                    continue;
                }
                row[..lim].iter_mut().for_each(|x| *x = (*x - m).exp());
                row[lim..].fill(0.0);
            }
            // dV_j += Pᵀ dO_i
            unsafe {
                mm(
                    nc,
                    d,
                    nr,
                    dv[j0 * d..].as_mut_ptr(),
                    d,
                    true,
                    p.as_ptr(),
                    1,
                    nc,
                    dout[i0 * d..].as_ptr(),
                    d,
                    1,
                    1.0,
                )
            };
            // dP = dO_i V_jᵀ
            unsafe {
                mm(
                    nr,
                    nc,
                    d,
                    ds.as_mut_ptr(),
                    nc,
                    false,
                    dout[i0 * d..].as_ptr(),
                    d,
                    1,
                    v.ptr(bi, hi, j0),
                    1,
                    v.st,
                    1.0,
                )
            };
            // dS = P ∘ (dP − D_i)
            for r in 0..nr {
                let di = dsum[i0 + r];
                for (x, &pv) in ds[r * nc..(r + 1) * nc]
                    .iter_mut()
                    .zip(&p[r * nc..(r + 1) * nc])
                {
                    *x = pv * (*x - di);
                }
            }
            // dQ_i += scale · dS K_j
            unsafe {
                mm(
                    nr,
                    d,
                    nc,
                    dq[i0 * d..].as_mut_ptr(),
                    d,
                    true,
                    ds.as_ptr(),
                    nc,
                    1,
                    k.ptr(bi, hi, j0),
                    k.st,
                    1,
                    g.scale,
                )
            };
            // dK_j += scale · dSᵀ Q_i
            unsafe {
                mm(
                    nc,
                    d,
                    nr,
                    dk[j0 * d..].as_mut_ptr(),
                    d,
                    true,
                    ds.as_ptr(),
                    1,
                    nc,
                    q.ptr(bi, hi, i0),
                    q.st,
                    1,
                    g.scale,
                )
            };
            i0 += BR;
        }
        j0 += BC;
    }
}

/// Forward over every (batch, head, query block): (o [b, h, tq, d], lse [b, h, tq]).
pub fn forward(g: &AttnGeom, q: &Src, k: &Src, v: &Src) -> (Vec<f32>, Vec<f32>) {
    forward_views(g, q.view(), k.view(), v.view())
}

/// (dq, dk, dv), contiguous [b, h, t, d], from the operands, the forward's output `o` and
/// log-sum-exp `lse` (contiguous), and the output gradient `dout` (contiguous).
pub fn backward(
    g: &AttnGeom,
    q: &Src,
    k: &Src,
    v: &Src,
    o: &[f32],
    lse: &[f32],
    dout: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    backward_views(g, q.view(), k.view(), v.view(), o, lse, dout)
}
