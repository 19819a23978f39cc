//! Flash attention on the CPU (FlashAttention-2's algorithm): the kernels behind
//! `attention` and `attention_packed` (see `mod.rs` for what they read, write and why they are
//! fast).
//! Scores are produced one 64 × 64 tile at a time and folded into the output with an online
//! softmax; the backward recomputes each tile's probabilities from the saved log-sum-exp.
//! Causal masking is aligned bottom-right (`AttnGeom::limit`).

use rayon::prelude::*;
use sinter_cpu::math::flash_tiles::{self, Rows, RowsMut, Side};
use sinter_cpu::math::output_vec;
use sinter_cpu::Isa;

use super::geom::AttnGeom;
use crate::cpu::CpuStorage;
use crate::Layout;

/// Query rows per tile.
const BR: usize = flash_tiles::MAX_QUERIES;
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
    /// Sets rows 0..t of (b, h) to 0 (d values each).
    ///
    /// # Safety
    /// As [`Self::row`] for each of those rows, which no other thread touches meanwhile.
    unsafe fn zero_rows(&self, b: usize, h: usize, t: usize, d: usize) {
        for i in 0..t {
            std::slice::from_raw_parts_mut(self.row(b, h, i), d).fill(0.0);
        }
    }
}

/// An operand's values: the storage itself when it can be read in place (f32 with a unit
/// last stride), else an f32 row-major copy.
pub(super) enum Src<'a> {
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

impl View<'_> {
    /// Rows i.. of head (b, h) as flash tiles read them.
    #[inline]
    fn rows(&self, b: usize, h: usize, i: usize) -> Rows {
        Rows {
            ptr: self.ptr(b, h, i),
            stride: self.st,
        }
    }
}

impl OutView {
    /// # Safety
    /// As [`OutView::row`].
    #[inline]
    unsafe fn rows(&self, b: usize, h: usize, i: usize) -> RowsMut {
        RowsMut {
            ptr: self.row(b, h, i),
            stride: self.st,
        }
    }
}

/// How many of the keys j0..j0 + nc each query i0.. sees (the causal rule, bottom-right), 0
/// for a query with no key at all (lse = −inf).
fn live_counts(
    g: &AttnGeom,
    (i0, j0, nc): (usize, usize, usize),
    lse: Option<&[f32]>,
    live: &mut [usize],
) {
    for (r, n) in live.iter_mut().enumerate() {
        let sees_none = lse.is_some_and(|l| l[r] == f32::NEG_INFINITY);
        *n = if sees_none {
            0
        } else {
            g.limit(i0 + r).saturating_sub(j0).min(nc)
        };
    }
}

/// Forward over every (batch, head, query block): writes o's rows and lse [b, h, tq]
/// (contiguous).
fn forward_views(
    g: &AttnGeom,
    isa: Isa,
    (q, k, v): (View, View, View),
    o: OutView,
    lse: &mut [f32],
) {
    lse.par_chunks_mut(g.tq).enumerate().for_each(|(bh, lse)| {
        let (bi, hi) = (bh / g.h, bh % g.h);
        lse.par_chunks_mut(BR).enumerate().for_each(|(qb, lse)| {
            // SAFETY: this task alone writes rows qb·BR.. (lse.len() of them) of head (bi, hi).
            unsafe { forward_tile(g, isa, (q, k, v), o, (bi, hi, qb * BR), lse) };
        });
    });
}

/// One query block: rows i0..i0+nr of head (bi, hi); o's rows double as the accumulator.
///
/// # Safety
/// The rows i0..i0 + lse.len() of head (bi, hi) exist in `o` and no other task touches them.
unsafe fn forward_tile(
    g: &AttnGeom,
    isa: Isa,
    (q, k, v): (View, View, View),
    o: OutView,
    (bi, hi, i0): (usize, usize, usize),
    lse: &mut [f32],
) {
    let (d, nr) = (g.d, lse.len());
    let hk = hi / g.group();
    let (ld, qs) = (
        flash_tiles::tile_stride(isa, nr),
        flash_tiles::packed_stride(isa, nr),
    );
    // One buffer for the block's state (Qᵀ, the score tile, and per query m, l, α and the
    // block maximum); every value is written before it is read (m and l are set below), so no
    // zero fill.
    let mut buf = output_vec(d * qs + BC * ld + 3 * nr + ld);
    let (qt, rest) = buf.split_at_mut(d * qs);
    let (tile, rest) = rest.split_at_mut(BC * ld);
    let (m, rest) = rest.split_at_mut(nr);
    let (l, rest) = rest.split_at_mut(nr);
    let (alpha, block_max) = rest.split_at_mut(nr);
    m.fill(f32::NEG_INFINITY);
    l.fill(0.0);
    // SAFETY (all calls below): rows i0..i0+nr of q and o and j0..j0+nc of k and v exist by
    // the shape checks; o's rows are this task's.
    flash_tiles::pack_transposed(isa, q.rows(bi, hi, i0), nr, d, qt, qs);
    let mut live = [0usize; BR];
    let live = &mut live[..nr];
    let kend = g.limit(i0 + nr - 1);
    let mut j0 = 0;
    while j0 < kend {
        let nc = BC.min(kend - j0);
        live_counts(g, (i0, j0, nc), None, live);
        let kr = k.rows(bi, hk, j0);
        flash_tiles::logits(
            isa,
            kr,
            nc,
            (qt, qs),
            d,
            g.scale,
            live,
            (tile, ld),
            block_max,
        );
        flash_tiles::online_softmax(isa, (tile, ld), live, block_max, m, l, alpha);
        // O_i = α·O_i + P V_j (α = 0 on a query's first keys: O is written, not read).
        let (vr, or) = (v.rows(bi, hk, j0), o.rows(bi, hi, i0));
        flash_tiles::tile_product(
            isa,
            Side::Queries,
            (tile, ld),
            live,
            nr,
            vr,
            d,
            or,
            Some(alpha),
            1.0,
        );
        j0 += BC;
    }
    for r in 0..nr {
        let row = std::slice::from_raw_parts_mut(o.row(bi, hi, i0 + r), d);
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

/// The gradients' destinations: rows of dq [b, h, tq, d], dk and dv [b, kv_h, tk, d], which
/// the kernels accumulate into after each task has zeroed its own rows.
#[derive(Clone, Copy)]
struct Grads {
    dq: OutView,
    dk: OutView,
    dv: OutView,
}

/// The backward's operands: q, k, v, the forward's output o and the output gradient dout.
#[derive(Clone, Copy)]
struct BackwardViews<'a> {
    q: View<'a>,
    k: View<'a>,
    v: View<'a>,
    o: View<'a>,
    dout: View<'a>,
}

/// Backward over every (batch, key/value head), the query heads sharing it one after another
/// (each adds its share of dk and dv): writes every row of dq, dk and dv (their prior values
/// are not read); lse is contiguous.
fn backward_views(g: &AttnGeom, isa: Isa, x: BackwardViews, lse: &[f32], grads: Grads) {
    (0..g.b * g.kv_h).into_par_iter().for_each(|bk| {
        let (bi, hk) = (bk / g.kv_h, bk % g.kv_h);
        let heads = hk * g.group()..(hk + 1) * g.group();
        // The rows the kernels accumulate into start at 0, zeroed here by the task that owns
        // them (in parallel, and warm in its cache) rather than by one memset of the buffers.
        // SAFETY: as below: these rows are this task's alone.
        unsafe {
            grads.dk.zero_rows(bi, hk, g.tk, g.d);
            grads.dv.zero_rows(bi, hk, g.tk, g.d);
            for hi in heads.clone() {
                grads.dq.zero_rows(bi, hi, g.tq, g.d);
            }
        }
        for hi in heads {
            let bh = bi * g.h + hi;
            let lse = &lse[bh * g.tq..(bh + 1) * g.tq];
            // SAFETY: this task alone writes kv head (bi, hk)'s rows of dk and dv and the rows
            // of dq of the query heads that read it.
            unsafe { backward_head(g, isa, x, (bi, hi), lse, grads) };
        }
    });
}

/// Adds query head (bi, hi)'s gradients into dq and into dk, dv of the kv head it reads.
///
/// # Safety
/// Those rows exist and no other task touches them meanwhile.
unsafe fn backward_head(
    g: &AttnGeom,
    isa: Isa,
    BackwardViews { q, k, v, o, dout }: BackwardViews,
    (bi, hi): (usize, usize),
    lse: &[f32],
    Grads { dq, dk, dv }: Grads,
) {
    let (tq, tk, d) = (g.tq, g.tk, g.d);
    let hk = hi / g.group();
    // D_i = rowsum(dO_i ∘ O_i)
    let rows = |x: &View| std::slice::from_raw_parts(x.ptr(bi, hi, 0), (tq - 1) * x.st + d);
    let (ld, qs) = (
        flash_tiles::tile_stride(isa, tq.min(BR)),
        flash_tiles::packed_stride(isa, tq),
    );
    // Qᵀ and dOᵀ of the whole head (every key block reads every query block), the
    // probability and dS tiles, and D; every value is written before it is read, so no zero
    // fill.
    let mut buf = output_vec(2 * d * qs + 2 * BC * ld + tq);
    let (qt, rest) = buf.split_at_mut(d * qs);
    let (dot, rest) = rest.split_at_mut(d * qs);
    let (p, rest) = rest.split_at_mut(BC * ld);
    let (ds, dsum) = rest.split_at_mut(BC * ld);
    flash_tiles::strided_row_dots(isa, (rows(&o), o.st), (rows(&dout), dout.st), d, dsum);
    // SAFETY (all calls below): the addressed rows exist by the shape checks and dq/dk/dv
    // rows i0..i0+nr / j0..j0+nc are this task's.
    flash_tiles::pack_transposed(isa, q.rows(bi, hi, 0), tq, d, qt, qs);
    flash_tiles::pack_transposed(isa, dout.rows(bi, hi, 0), tq, d, dot, qs);
    let mut live = [0usize; BR];
    let mut j0 = 0;
    while j0 < tk {
        let nc = BC.min(tk - j0);
        let (kr, vr) = (k.rows(bi, hk, j0), v.rows(bi, hk, j0));
        let (dkr, dvr) = (dk.rows(bi, hk, j0), dv.rows(bi, hk, j0));
        let mut i0 = g.first_row_seeing(j0);
        while i0 < tq {
            let nr = BR.min(tq - i0);
            let (lse_i, dsum_i) = (&lse[i0..i0 + nr], &dsum[i0..i0 + nr]);
            let live = &mut live[..nr];
            live_counts(g, (i0, j0, nc), Some(lse_i), live);
            let (qt_i, dot_i) = ((&qt[i0..], qs), (&dot[i0..], qs));
            let (qr, dor) = (q.rows(bi, hi, i0), dout.rows(bi, hi, i0));
            // P = exp(scale · Q_i K_jᵀ − lse_i), key-major, 0 where masked.
            flash_tiles::probabilities(isa, kr, nc, qt_i, d, g.scale, live, lse_i, (p, ld));
            // dV_j += Pᵀ dO_i
            flash_tiles::tile_product(isa, Side::Keys, (p, ld), live, nc, dor, d, dvr, None, 1.0);
            // dS = P ∘ (dO_i V_jᵀ − D_i)
            flash_tiles::softmax_grad(isa, vr, nc, dot_i, d, live, dsum_i, p, (ds, ld));
            // dQ_i += scale · dS K_j
            let dqr = dq.rows(bi, hi, i0);
            flash_tiles::tile_product(
                isa,
                Side::Queries,
                (ds, ld),
                live,
                nr,
                kr,
                d,
                dqr,
                None,
                g.scale,
            );
            // dK_j += scale · dSᵀ Q_i
            flash_tiles::tile_product(
                isa,
                Side::Keys,
                (ds, ld),
                live,
                nc,
                qr,
                d,
                dkr,
                None,
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
pub(super) fn forward(g: &AttnGeom, isa: Isa, q: &Src, k: &Src, v: &Src) -> (Vec<f32>, Vec<f32>) {
    let mut o = vec![0f32; g.b * g.h * g.tq * g.d];
    let mut lse = vec![f32::NEG_INFINITY; g.b * g.h * g.tq];
    if !o.is_empty() {
        let ov = contiguous_out(&mut o, g, g.h, g.tq);
        forward_views(g, isa, (q.view(), k.view(), v.view()), ov, &mut lse);
    }
    (o, lse)
}

/// (dq, dk, dv), contiguous [b, h, tq, d] and [b, kv_h, tk, d], from the operands, the
/// forward's output `o`, its log-sum-exp `lse` (contiguous) and the output gradient `dout`.
pub(super) fn backward(
    g: &AttnGeom,
    isa: Isa,
    (q, k, v): (&Src, &Src, &Src),
    o: &Src,
    lse: &[f32],
    dout: &Src,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let (nq, nk) = (g.b * g.h * g.tq * g.d, g.b * g.kv_h * g.tk * g.d);
    if nq == 0 || nk == 0 {
        // No queries or no keys: every gradient is 0.
        return (vec![0f32; nq], vec![0f32; nk], vec![0f32; nk]);
    }
    // Every value is written by `backward_views`.
    let (mut dq, mut dk, mut dv) = (output_vec(nq), output_vec(nk), output_vec(nk));
    {
        let grads = Grads {
            dq: contiguous_out(&mut dq, g, g.h, g.tq),
            dk: contiguous_out(&mut dk, g, g.kv_h, g.tk),
            dv: contiguous_out(&mut dv, g, g.kv_h, g.tk),
        };
        let x = BackwardViews {
            q: q.view(),
            k: k.view(),
            v: v.view(),
            o: o.view(),
            dout: dout.view(),
        };
        backward_views(g, isa, x, lse, grads);
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
        forward_views(g, Isa::get(), (q, k, v), yv, &mut lse);
    }
    (y, lse)
}

/// dqkv [b, t, (h + 2·kv_h)·d] of [`forward_packed`] from qkv, its output y [b, t, h·d] and
/// lse, and the output gradient dy [b, t, h·d].
fn backward_packed(g: &AttnGeom, qkv: &Src, y: &Src, lse: &[f32], dy: &Src) -> Vec<f32> {
    let t = g.tq;
    let ([cq, ck, cv], w) = packed_columns(g);
    if g.b * t * w == 0 {
        return Vec::new();
    }
    // Every value is written by `backward_views` (q, k and v's columns cover each row).
    let mut dqkv = output_vec(g.b * t * w);
    {
        // One pointer for the three: dv's view (the furthest columns) is bounds-checked.
        let dv = OutView::of(&mut dqkv, (g.b, g.kv_h, t, g.d), [cv, t * w, g.d, w]);
        let grads = Grads {
            dq: OutView { off: cq, ..dv },
            dk: OutView { off: ck, ..dv },
            dv,
        };
        let [q, k, v] = [cq, ck, cv].map(|col| qkv.heads(col, g.d));
        let x = BackwardViews {
            q,
            k,
            v,
            o: y.heads(0, g.d),
            dout: dy.heads(0, g.d),
        };
        backward_views(g, Isa::get(), x, lse, grads);
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
        Isa::get(),
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
        Isa::get(),
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
