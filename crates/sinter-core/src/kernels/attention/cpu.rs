//! Flash attention on the CPU (FlashAttention-2's algorithm): the kernels behind
//! `attention` and `attention_packed` (see `mod.rs` for what they read, write and why they are
//! fast).
//! Scores are produced one 64 × 64 tile at a time and folded into the output with an online
//! softmax; the backward recomputes each tile's probabilities from the saved log-sum-exp.
//! Causal masking is aligned bottom-right (`AttnGeom::limit`).

use rayon::prelude::*;
use sinter_cpu::gemm::{Gemm, MatMut, MatRef};
use sinter_cpu::math::flash_rows;
use sinter_cpu::Isa;

use super::geom::AttnGeom;
use crate::cpu::CpuStorage;
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

/// Writable rows of a [b, h, t, d] result inside one buffer, addressed like [`View`]. Tasks
/// write disjoint rows through the raw pointer (each (batch, head, row) belongs to one task).
#[derive(Clone, Copy)]
struct OutView {
    ptr: *mut f32,
    off: usize,
    sb: usize,
    sh: usize,
    st: usize,
}

// SAFETY: the tasks sharing an OutView write disjoint rows (see each use).
unsafe impl Send for OutView {}
unsafe impl Sync for OutView {}

impl OutView {
    /// Rows of `buf` for geometry (b, h, t, d) at the given strides.
    ///
    /// # Panics
    /// If the last row would end past `buf` (a caller bug).
    fn of(buf: &mut [f32], (b, h, t, d): (usize, usize, usize, usize), at: [usize; 4]) -> Self {
        let [off, sb, sh, st] = at;
        if b * h * t * d > 0 {
            let last = off + (b - 1) * sb + (h - 1) * sh + (t - 1) * st + d;
            assert!(last <= buf.len(), "attention: output view past its buffer");
        }
        OutView {
            ptr: buf.as_mut_ptr(),
            off,
            sb,
            sh,
            st,
        }
    }
    /// # Safety
    /// (b, h, i) must be a row of the geometry the view was made for.
    #[inline]
    unsafe fn row(&self, b: usize, h: usize, i: usize) -> *mut f32 {
        self.ptr
            .add(self.off + b * self.sb + h * self.sh + i * self.st)
    }
}

/// An operand's values: the storage itself when it can be read in place (f32 with a unit
/// last stride), else an f32 row-major copy.
enum Src<'a> {
    InPlace(&'a [f32], &'a Layout),
    Copied(Vec<f32>, Layout),
}

impl<'a> Src<'a> {
    fn of(s: &'a CpuStorage, l: &'a Layout) -> Src<'a> {
        let last = l.rank() - 1;
        let last_unit = l.shape()[last] <= 1 || l.strides()[last] == 1;
        match s {
            CpuStorage::F32(v) if last_unit => Src::InPlace(v, l),
            _ => Src::Copied(
                s.f32_contiguous(l).into_owned(),
                Layout::contiguous(l.shape()),
            ),
        }
    }
    fn parts(&self) -> (&[f32], &Layout) {
        match self {
            Src::InPlace(v, l) => (v, l),
            Src::Copied(v, l) => (v.as_slice(), l),
        }
    }
    /// The rows of a [b, h, t, d] operand.
    fn view(&self) -> View<'_> {
        let (data, l) = self.parts();
        let s = l.strides();
        View {
            data,
            off: l.offset(),
            sb: s[0],
            sh: s[1],
            st: s[2],
        }
    }
    /// Head rows of a [b, t, n] operand whose columns col0..col0 + h·d hold h heads of d
    /// values (one third of a packed qkv projection, or a merged attention output).
    fn heads(&self, col0: usize, d: usize) -> View<'_> {
        let (data, l) = self.parts();
        let s = l.strides();
        View {
            data,
            off: l.offset() + col0 * s[2],
            sb: s[0],
            sh: d * s[2],
            st: s[1],
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

/// Forward over every (batch, head, query block): writes o's rows and lse [b, h, tq]
/// (contiguous).
fn forward_views(g: &AttnGeom, q: View, k: View, v: View, o: OutView, lse: &mut [f32]) {
    lse.par_chunks_mut(g.tq).enumerate().for_each(|(bh, lse)| {
        let (bi, hi) = (bh / g.h, bh % g.h);
        lse.par_chunks_mut(BR).enumerate().for_each(|(qb, lse)| {
            // SAFETY: this task alone writes rows qb·BR.. (lse.len() of them) of head (bi, hi).
            unsafe { forward_tile(g, q, k, v, o, bi, hi, qb * BR, lse) };
        });
    });
}

/// One query block: rows i0..i0+nr of head (bi, hi); o's rows double as the accumulator.
///
/// # Safety
/// The rows i0..i0 + lse.len() of head (bi, hi) exist in `o` and no other task touches them.
#[allow(clippy::too_many_arguments)]
unsafe fn forward_tile(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    o: OutView,
    bi: usize,
    hi: usize,
    i0: usize,
    lse: &mut [f32],
) {
    let (d, nr, isa) = (g.d, lse.len(), Isa::get());
    let hk = hi / g.group();
    let orow = |r: usize| std::slice::from_raw_parts_mut(o.row(bi, hi, i0 + r), d);
    let kend = g.limit(i0 + nr - 1);
    let mut m = vec![f32::NEG_INFINITY; nr];
    let mut l = vec![0f32; nr];
    let mut alpha = vec![0f32; nr];
    let mut live = vec![0usize; nr];
    let mut s = vec![0f32; nr * BC];
    let mut j0 = 0;
    while j0 < kend {
        let nc = BC.min(kend - j0);
        // S = scale · Q_i K_jᵀ
        // SAFETY: rows i0..i0+nr of q and j0..j0+nc of k exist (shapes checked); s holds nr×nc.
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
            k.ptr(bi, hk, j0),
            1,
            k.st,
            g.scale,
        );
        for (r, n) in live.iter_mut().enumerate() {
            *n = g.limit(i0 + r).saturating_sub(j0).min(nc);
        }
        let tile = &mut s[..nr * nc];
        flash_rows::online_softmax_tile(isa, tile, nc, &live, &mut m, &mut l, &mut alpha);
        // The first key block writes O_i (nothing to rescale or add to yet).
        let first = j0 == 0;
        for (r, &a) in alpha.iter().enumerate() {
            if !first && a != 1.0 {
                orow(r).iter_mut().for_each(|x| *x *= a);
            }
        }
        // O_i (+)= P V_j
        // SAFETY: s is nr×nc, rows j0..j0+nc of v exist, o's rows i0..i0+nr are this task's.
        mm(
            nr,
            d,
            nc,
            o.row(bi, hi, i0),
            o.st,
            !first,
            s.as_ptr(),
            nc,
            1,
            v.ptr(bi, hk, j0),
            v.st,
            1,
            1.0,
        );
        j0 += BC;
    }
    for r in 0..nr {
        let row = orow(r);
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

/// The gradients' destinations: rows of dq [b, h, tq, d], dk and dv [b, kv_h, tk, d], all 0
/// on entry (the kernels accumulate into them).
#[derive(Clone, Copy)]
struct Grads {
    dq: OutView,
    dk: OutView,
    dv: OutView,
}

/// Backward over every (batch, key/value head), the query heads sharing it one after another
/// (each adds its share of dk and dv): writes every row of dq, dk and dv, which must be 0 on
/// entry; lse is contiguous.
#[allow(clippy::too_many_arguments)]
fn backward_views(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    o: View,
    lse: &[f32],
    dout: View,
    grads: Grads,
) {
    (0..g.b * g.kv_h).into_par_iter().for_each(|bk| {
        let (bi, hk) = (bk / g.kv_h, bk % g.kv_h);
        for hi in hk * g.group()..(hk + 1) * g.group() {
            let bh = bi * g.h + hi;
            let lse = &lse[bh * g.tq..(bh + 1) * g.tq];
            // SAFETY: this task alone writes kv head (bi, hk)'s rows of dk and dv and the rows
            // of dq of the query heads that read it.
            unsafe { backward_head(g, q, k, v, bi, hi, o, lse, dout, grads) };
        }
    });
}

/// Adds query head (bi, hi)'s gradients into dq and into dk, dv of the kv head it reads.
///
/// # Safety
/// Those rows exist and no other task touches them meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn backward_head(
    g: &AttnGeom,
    q: View,
    k: View,
    v: View,
    bi: usize,
    hi: usize,
    o: View,
    lse: &[f32],
    dout: View,
    Grads { dq, dk, dv }: Grads,
) {
    let (tq, tk, d, isa) = (g.tq, g.tk, g.d, Isa::get());
    let hk = hi / g.group();
    // D_i = rowsum(dO_i ∘ O_i)
    let rows = |x: &View| std::slice::from_raw_parts(x.ptr(bi, hi, 0), (tq - 1) * x.st + d);
    let mut dsum = vec![0f32; tq];
    flash_rows::strided_row_dots(isa, (rows(&o), o.st), (rows(&dout), dout.st), d, &mut dsum);
    let mut p = vec![0f32; BR * BC];
    let mut ds = vec![0f32; BR * BC];
    let mut live = vec![0usize; BR];
    let mut j0 = 0;
    while j0 < tk {
        let nc = BC.min(tk - j0);
        let mut i0 = g.first_row_seeing(j0);
        while i0 < tq {
            let nr = BR.min(tq - i0);
            // P = exp(scale · Q_i K_jᵀ − lse_i), zero where masked.
            // SAFETY (all mm calls below): the addressed rows exist by the shape checks, the
            // tile buffers hold nr×nc, and dq/dk/dv rows i0..i0+nr / j0..j0+nc are this task's.
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
                k.ptr(bi, hk, j0),
                1,
                k.st,
                g.scale,
            );
            for (r, n) in live[..nr].iter_mut().enumerate() {
                *n = g.limit(i0 + r).saturating_sub(j0).min(nc);
            }
            let (lse_i, live_i) = (&lse[i0..i0 + nr], &live[..nr]);
            flash_rows::probabilities_tile(isa, &mut p[..nr * nc], nc, live_i, lse_i);
            // dV_j += Pᵀ dO_i
            mm(
                nc,
                d,
                nr,
                dv.row(bi, hk, j0),
                dv.st,
                true,
                p.as_ptr(),
                1,
                nc,
                dout.ptr(bi, hi, i0),
                dout.st,
                1,
                1.0,
            );
            // dP = dO_i V_jᵀ
            mm(
                nr,
                nc,
                d,
                ds.as_mut_ptr(),
                nc,
                false,
                dout.ptr(bi, hi, i0),
                dout.st,
                1,
                v.ptr(bi, hk, j0),
                1,
                v.st,
                1.0,
            );
            // dS = P ∘ (dP − D_i)
            let (dp, p_i) = (&mut ds[..nr * nc], &p[..nr * nc]);
            flash_rows::softmax_grad_tile(isa, dp, p_i, nc, &dsum[i0..i0 + nr]);
            // dQ_i += scale · dS K_j
            mm(
                nr,
                d,
                nc,
                dq.row(bi, hi, i0),
                dq.st,
                true,
                ds.as_ptr(),
                nc,
                1,
                k.ptr(bi, hk, j0),
                k.st,
                1,
                g.scale,
            );
            // dK_j += scale · dSᵀ Q_i
            mm(
                nc,
                d,
                nr,
                dk.row(bi, hk, j0),
                dk.st,
                true,
                ds.as_ptr(),
                1,
                nc,
                q.ptr(bi, hi, i0),
                q.st,
                1,
                g.scale,
            );
            i0 += BR;
        }
        j0 += BC;
    }
}

/// Contiguous [b, heads, t, d] rows in a buffer of that size.
fn contiguous_out(buf: &mut [f32], g: &AttnGeom, heads: usize, t: usize) -> OutView {
    let d = g.d;
    OutView::of(buf, (g.b, heads, t, d), [0, heads * t * d, t * d, d])
}

/// Forward over every (batch, head, query block): (o [b, h, tq, d], lse [b, h, tq]).
fn forward(g: &AttnGeom, q: &Src, k: &Src, v: &Src) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0f32; g.b * g.h * g.tq * g.d];
    let mut lse = vec![f32::NEG_INFINITY; g.b * g.h * g.tq];
    if !o.is_empty() {
        let ov = contiguous_out(&mut o, g, g.h, g.tq);
        forward_views(g, q.view(), k.view(), v.view(), ov, &mut lse);
    }
    (o, lse)
}

/// (dq, dk, dv), contiguous [b, h, tq, d] and [b, kv_h, tk, d], from the operands, the
/// forward's output `o`, its log-sum-exp `lse` (contiguous) and the output gradient `dout`.
fn backward(
    g: &AttnGeom,
    (q, k, v): (&Src, &Src, &Src),
    o: &Src,
    lse: &[f32],
    dout: &Src,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let mut dq = vec![0f32; g.b * g.h * g.tq * g.d];
    let mut dk = vec![0f32; g.b * g.kv_h * g.tk * g.d];
    let mut dv = vec![0f32; g.b * g.kv_h * g.tk * g.d];
    if !dq.is_empty() && !dk.is_empty() {
        let grads = Grads {
            dq: contiguous_out(&mut dq, g, g.h, g.tq),
            dk: contiguous_out(&mut dk, g, g.kv_h, g.tk),
            dv: contiguous_out(&mut dv, g, g.kv_h, g.tk),
        };
        let (q, k, v) = (q.view(), k.view(), v.view());
        backward_views(g, q, k, v, o.view(), lse, dout.view(), grads);
    }
    (dq, dk, dv)
}

/// The first columns of q, k and v in a packed row [q (h·d) | k (kv_h·d) | v (kv_h·d)], and
/// the row's width.
fn packed_columns(g: &AttnGeom) -> ([usize; 3], usize) {
    let (cq, ckv) = (g.h * g.d, g.kv_h * g.d);
    ([0, cq, cq + ckv], cq + 2 * ckv)
}

/// Self-attention over a packed projection qkv [b, t, (h + 2·kv_h)·d] (q, k and v side by
/// side): (y [b, t, h·d] with the heads merged, lse [b, h, t]). tq = tk = t.
fn forward_packed(g: &AttnGeom, qkv: &Src) -> (Vec<f32>, Vec<f32>) {
    let (t, c) = (g.tq, g.h * g.d);
    let mut y = vec![0f32; g.b * t * c];
    let mut lse = vec![f32::NEG_INFINITY; g.b * g.h * t];
    if !y.is_empty() {
        let yv = OutView::of(&mut y, (g.b, g.h, t, g.d), [0, t * c, g.d, c]);
        let [q, k, v] = packed_columns(g).0.map(|col| qkv.heads(col, g.d));
        forward_views(g, q, k, v, yv, &mut lse);
    }
    (y, lse)
}

/// dqkv [b, t, (h + 2·kv_h)·d] of [`forward_packed`] from qkv, its output y [b, t, h·d] and
/// lse, and the output gradient dy [b, t, h·d].
fn backward_packed(g: &AttnGeom, qkv: &Src, y: &Src, lse: &[f32], dy: &Src) -> Vec<f32> {
    let t = g.tq;
    let ([cq, ck, cv], w) = packed_columns(g);
    let mut dqkv = vec![0f32; g.b * t * w];
    if !dqkv.is_empty() {
        // One pointer for the three: dv's view (the furthest columns) is bounds-checked.
        let dv = OutView::of(&mut dqkv, (g.b, g.kv_h, t, g.d), [cv, t * w, g.d, w]);
        let grads = Grads {
            dq: OutView { off: cq, ..dv },
            dk: OutView { off: ck, ..dv },
            dv,
        };
        let [q, k, v] = [cq, ck, cv].map(|col| qkv.heads(col, g.d));
        backward_views(g, q, k, v, y.heads(0, g.d), lse, dy.heads(0, g.d), grads);
    }
    dqkv
}

/// The forward on CPU storages: (o [b, h, tq, d] in q's dtype, lse f32).
pub(super) fn attention(
    q: (&CpuStorage, &Layout),
    k: (&CpuStorage, &Layout),
    v: (&CpuStorage, &Layout),
    g: &AttnGeom,
) -> (CpuStorage, CpuStorage) {
    let (o, lse) = forward(
        g,
        &Src::of(q.0, q.1),
        &Src::of(k.0, k.1),
        &Src::of(v.0, v.1),
    );
    (CpuStorage::from_f32(o, q.0.dtype()), CpuStorage::F32(lse))
}

/// (dq, dk, dv) on CPU storages, each in its operand's dtype.
pub(super) fn attention_backward(
    [q, k, v]: [(&CpuStorage, &Layout); 3],
    o: (&CpuStorage, &Layout),
    grad: (&CpuStorage, &Layout),
    lse: &CpuStorage,
    g: &AttnGeom,
) -> [CpuStorage; 3] {
    let lse = lse.f32_contiguous(&Layout::contiguous(&[lse.len()]));
    let (dq, dk, dv) = backward(
        g,
        (&Src::of(q.0, q.1), &Src::of(k.0, k.1), &Src::of(v.0, v.1)),
        &Src::of(o.0, o.1),
        &lse,
        &Src::of(grad.0, grad.1),
    );
    [(dq, q.0), (dk, k.0), (dv, v.0)].map(|(d, like)| CpuStorage::from_f32(d, like.dtype()))
}

/// The packed forward on a CPU qkv: (y [b, t, h·d] in qkv's dtype, lse f32).
pub(super) fn packed(qkv: (&CpuStorage, &Layout), g: &AttnGeom) -> (CpuStorage, CpuStorage) {
    let (y, lse) = forward_packed(g, &Src::of(qkv.0, qkv.1));
    (CpuStorage::from_f32(y, qkv.0.dtype()), CpuStorage::F32(lse))
}

/// dqkv of [`packed`] on CPU storages, in qkv's dtype.
pub(super) fn packed_backward(
    qkv: (&CpuStorage, &Layout),
    y: (&CpuStorage, &Layout),
    grad: (&CpuStorage, &Layout),
    lse: &CpuStorage,
    g: &AttnGeom,
) -> CpuStorage {
    let lse = lse.f32_contiguous(&Layout::contiguous(&[lse.len()]));
    let dqkv = backward_packed(
        g,
        &Src::of(qkv.0, qkv.1),
        &Src::of(y.0, y.1),
        &lse,
        &Src::of(grad.0, grad.1),
    );
    CpuStorage::from_f32(dqkv, qkv.0.dtype())
}
