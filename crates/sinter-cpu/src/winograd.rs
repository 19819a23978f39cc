//! 3×3 stride-1 convolution by Winograd's minimal filtering F(2×2, 3×3): forward (with an
//! optional bias + ReLU epilogue), input gradient and weight gradient, over NCHW slices.
//!
//! **What it computes.** x [n, c, h, w] ∗ w [o, c, 3, 3] with zero padding (ph, pw) ≤ 2 gives
//! y [n, o, h + 2ph − 2, w + 2pw − 2]. The output is cut into 2×2 tiles (partial tiles at odd
//! edges are computed whole and clipped); each reads a 4×4 input window. With the standard
//! matrices of the points 0, 1, −1, ∞ (Lavin & Gray 2015),
//! y_tile = Aᵀ [ Σ_c (G g Gᵀ) ⊙ (Bᵀ d B) ] A, so one tile of one (in, out) channel pair costs
//! 16 multiplies instead of 36. The input gradient is the same convolution of dy with the
//! 180°-rotated, channel-transposed weight and padding 2 − p; the weight gradient is
//! dw = Gᵀ [ Σ_tiles (A dY Aᵀ) ⊙ (Bᵀ d B) ] G.
//!
//! **Why it is fast.** The multiplies of all tiles and channels are 16 GEMMs (one per
//! Winograd point ξ): M[ξ] (o × tiles) = U[ξ] (o × c) · V[ξ] (c × tiles), run through
//! [`crate::gemm`]. The tiles are cut into blocks of whole tile rows, sized so that a block's
//! V and M stay in L2; blocks run one per rayon thread with single-threaded GEMMs. The input
//! and output transforms are vectorised across the tiles of a tile row: each input row is
//! split into its even and odd columns once, after which every 4×4 window of the row is two
//! aligned runs of it (columns 2t, 2t+1, 2t+2, 2t+3 are even[t], odd[t], even[t+1], odd[t+1]).
//! The weight-gradient partials of fixed groups of blocks are added in group order, so the
//! result does not depend on the thread count.
//!
//! **Accuracy.** B and A hold only 0 and ±1 (exact); G's halves are applied in f64 to the
//! weight (and to the weight gradient), rounded once. Each output is then a signed sum of the
//! products of its tile's 4×4 input window with the 3×3 weight, so its error is bounded by a
//! few ε times the sum of their magnitudes (rather than of the 9 products of the direct sum).

use std::cell::RefCell;
use std::ops::Range;

use rayon::prelude::*;

use crate::gemm::{Batch, Gemm, MatMut, MatRef};
use crate::im2col::copy_short;
use crate::simd::{load_lanes, store_lanes, Simd};
use crate::{with_isa, Isa};

/// The Winograd points of F(2×2, 3×3): a 4×4 tile.
const POINTS: usize = 16;

/// Bytes of a block's transformed input and GEMM output (16 points × channels × tiles × 4):
/// about a 512 KiB L2. Measured on the conv bench's 64×32×16×16 ∗ 64×32×3×3 (2 threads,
/// Zen 1): 128 KiB to 1 MiB within 10 % of each other, 512 KiB as fast as any for all three
/// passes.
const BLOCK_BYTES: usize = 512 << 10;

/// At most this many groups of blocks keep weight-gradient partials (16·o·c values each),
/// and fewer when they would hold more than [`DW_PARTIAL_VALUES`] in all (but at least 2);
/// the count depends on the shape only, so the summation order is the same on any number of
/// threads.
const DW_GROUPS: usize = 16;
const DW_PARTIAL_VALUES: usize = 8 << 20;

/// A bad argument: what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WinogradError(pub String);

impl std::fmt::Display for WinogradError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "winograd conv: {}", self.0)
    }
}

impl std::error::Error for WinogradError {}

macro_rules! bail {
    ($($t:tt)*) => { return Err(WinogradError(format!($($t)*))) };
}

/// The shape of a 3×3, stride-1, dilation-1, ungrouped convolution: input [n, c, h, w],
/// weight [o, c, 3, 3], zero padding (rows, columns), each at most 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv3x3 {
    pub n: usize,
    pub c: usize,
    pub o: usize,
    pub h: usize,
    pub w: usize,
    pub padding: (usize, usize),
}

impl Conv3x3 {
    /// Output height: h + 2·ph − 2 (0 when the kernel does not fit).
    pub fn oh(&self) -> usize {
        (self.h + 2 * self.padding.0).saturating_sub(2)
    }
    /// Output width: w + 2·pw − 2 (0 when the kernel does not fit).
    pub fn ow(&self) -> usize {
        (self.w + 2 * self.padding.1).saturating_sub(2)
    }
    pub fn input_len(&self) -> usize {
        self.n * self.c * self.h * self.w
    }
    pub fn weight_len(&self) -> usize {
        self.o * self.c * 9
    }
    pub fn output_len(&self) -> usize {
        self.n * self.o * self.oh() * self.ow()
    }

    fn check(&self) -> Result<(), WinogradError> {
        let (ph, pw) = self.padding;
        if ph > 2 || pw > 2 {
            bail!("padding ({ph}, {pw}): Winograd F(2×2, 3×3) takes at most 2");
        }
        if self.h + 2 * ph < 3 || self.w + 2 * pw < 3 {
            bail!(
                "the 3×3 kernel does not fit the {}×{} input padded by ({ph}, {pw})",
                self.h,
                self.w
            );
        }
        let sizes = [self.n, self.c, self.o, self.h, self.w];
        let total = sizes
            .iter()
            .try_fold(9usize, |a, &s| a.checked_mul(s.max(1)));
        if total.is_none_or(|t| t > isize::MAX as usize / 64) {
            bail!("the shape {self:?} is too large");
        }
        Ok(())
    }
}

fn check_len(what: &str, got: usize, want: usize) -> Result<(), WinogradError> {
    if got != want {
        bail!("{what} has {got} values, the shape needs {want}");
    }
    Ok(())
}

/// y = relu?(conv(x, w) + bias): x [n, c, h, w], w [o, c, 3, 3], bias [o], y [n, o, oh, ow]
/// (overwritten). Runs on the rayon pool with `isa`'s kernels.
pub fn forward(
    isa: Isa,
    g: &Conv3x3,
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    relu: bool,
    y: &mut [f32],
) -> Result<(), WinogradError> {
    g.check()?;
    check_len("the input", x.len(), g.input_len())?;
    check_len("the weight", w.len(), g.weight_len())?;
    check_len("the output", y.len(), g.output_len())?;
    if let Some(b) = bias {
        check_len("the bias", b.len(), g.o)?;
    }
    let u = filter_transform(w, g.o, g.c, false);
    let layer = Layer {
        n: g.n,
        cin: g.c,
        cout: g.o,
        h: g.h,
        w: g.w,
        pad: g.padding,
        oh: g.oh(),
        ow: g.ow(),
    };
    conv_tiles(isa, &layer, x, &u, Epilogue { bias, relu }, y);
    Ok(())
}

/// dx [n, c, h, w] (overwritten) from w [o, c, 3, 3] and dy [n, o, oh, ow]: the convolution
/// of dy with the rotated, transposed weight, padded by 2 − p.
pub fn backward_data(
    isa: Isa,
    g: &Conv3x3,
    w: &[f32],
    dy: &[f32],
    dx: &mut [f32],
) -> Result<(), WinogradError> {
    g.check()?;
    check_len("the weight", w.len(), g.weight_len())?;
    check_len("the output gradient", dy.len(), g.output_len())?;
    check_len("the input gradient", dx.len(), g.input_len())?;
    let u = filter_transform(w, g.o, g.c, true);
    let layer = Layer {
        n: g.n,
        cin: g.o,
        cout: g.c,
        h: g.oh(),
        w: g.ow(),
        pad: (2 - g.padding.0, 2 - g.padding.1),
        oh: g.h,
        ow: g.w,
    };
    conv_tiles(isa, &layer, dy, &u, Epilogue::default(), dx);
    Ok(())
}

/// dw [o, c, 3, 3] (overwritten) from x [n, c, h, w] and dy [n, o, oh, ow], summed over the
/// batch in a fixed order (the same bits on any number of threads).
pub fn backward_filter(
    isa: Isa,
    g: &Conv3x3,
    x: &[f32],
    dy: &[f32],
    dw: &mut [f32],
) -> Result<(), WinogradError> {
    g.check()?;
    check_len("the input", x.len(), g.input_len())?;
    check_len("the output gradient", dy.len(), g.output_len())?;
    check_len("the weight gradient", dw.len(), g.weight_len())?;
    let (o, c) = (g.o, g.c);
    let tiling = Tiling::new(g.n, g.oh(), g.ow(), c + o);
    let blocks = tiling.blocks();
    let plen = POINTS * o * c;
    let groups = blocks
        .min(DW_GROUPS)
        .min((DW_PARTIAL_VALUES / plen.max(1)).max(2));
    let mut partial = vec![0f32; groups * plen];
    let layer = Layer {
        n: g.n,
        cin: c,
        cout: o,
        h: g.h,
        w: g.w,
        pad: g.padding,
        oh: g.oh(),
        ow: g.ow(),
    };
    let group = |j: usize, du: &mut [f32]| {
        for b in j * blocks / groups..(j + 1) * blocks / groups {
            filter_grad_block(isa, &layer, &tiling, b, x, dy, du);
        }
    };
    if plen > 0 {
        if groups > 1 {
            partial
                .par_chunks_mut(plen)
                .enumerate()
                .for_each(|(j, p)| group(j, p));
        } else {
            partial
                .chunks_mut(plen)
                .enumerate()
                .for_each(|(j, p)| group(j, p));
        }
    }
    let mut du = vec![0f32; plen];
    for p in partial.chunks(plen.max(1)) {
        for (a, b) in du.iter_mut().zip(p) {
            *a += b;
        }
    }
    filter_grad_back_transform(&du, o, c, dw);
    Ok(())
}

/// A forward-type pass: `cin` input planes of h×w padded by `pad` give `cout` planes of
/// oh×ow (the input gradient is one too, of dy).
struct Layer {
    n: usize,
    cin: usize,
    cout: usize,
    h: usize,
    w: usize,
    pad: (usize, usize),
    oh: usize,
    ow: usize,
}

/// What the forward pass adds to each output: a bias per output channel, then a ReLU.
#[derive(Clone, Copy, Default)]
struct Epilogue<'a> {
    bias: Option<&'a [f32]>,
    relu: bool,
}

/// The output's 2×2 tiles: th × tw per image, taken in "units" of one tile row of one
/// image (n·th units); a block is a run of consecutive units.
struct Tiling {
    th: usize,
    tw: usize,
    units: usize,
    per_block: usize,
}

impl Tiling {
    /// Blocks of about [`BLOCK_BYTES`] of transformed data for `channels` (in + out)
    /// channels, at least 4 blocks when there are that many units (so both cores of a
    /// small batch have work). Depends on the shape only: the same blocks on any thread count.
    fn new(n: usize, oh: usize, ow: usize, channels: usize) -> Tiling {
        let (th, tw) = (oh.div_ceil(2), ow.div_ceil(2));
        let units = n * th;
        let tiles = (BLOCK_BYTES / (POINTS * 4 * channels.max(1))).clamp(32, 1024);
        let per_block = (tiles / tw.max(1)).clamp(1, units.div_ceil(4).max(1));
        Tiling {
            th,
            tw,
            units,
            per_block,
        }
    }
    fn blocks(&self) -> usize {
        self.units.div_ceil(self.per_block)
    }
    fn range(&self, b: usize) -> Range<usize> {
        b * self.per_block..((b + 1) * self.per_block).min(self.units)
    }
}

/// U[ξ][a][b] = G g Gᵀ for each 3×3 filter: (a, b) = (o, c) of w [o, c, 3, 3], or with
/// `rotate` (the input gradient's filter) (c, o) of w rotated by 180°. In f64, rounded once.
fn filter_transform(w: &[f32], o: usize, c: usize, rotate: bool) -> Vec<f32> {
    let (rows, cols) = if rotate { (c, o) } else { (o, c) };
    let mut u = vec![0f32; POINTS * o * c];
    // G·v for a 3-vector: (v0, (v0 + v1 + v2)/2, (v0 − v1 + v2)/2, v2).
    let g3 = |v: [f64; 3]| {
        [
            v[0],
            (v[0] + v[1] + v[2]) * 0.5,
            (v[0] - v[1] + v[2]) * 0.5,
            v[2],
        ]
    };
    for oc in 0..o {
        for ic in 0..c {
            let f = &w[(oc * c + ic) * 9..][..9];
            let at = |ky: usize, kx: usize| {
                let k = if rotate {
                    8 - (ky * 3 + kx)
                } else {
                    ky * 3 + kx
                };
                f[k] as f64
            };
            // Columns first (G g), then rows ((G g) Gᵀ).
            let cols3: [[f64; 4]; 3] =
                std::array::from_fn(|kx| g3([at(0, kx), at(1, kx), at(2, kx)]));
            let (r, cl) = if rotate { (ic, oc) } else { (oc, ic) };
            for i in 0..4 {
                let row = g3([cols3[0][i], cols3[1][i], cols3[2][i]]);
                for (j, v) in row.iter().enumerate() {
                    u[((i * 4 + j) * rows + r) * cols + cl] = *v as f32;
                }
            }
        }
    }
    u
}

/// dw[o][c] = Gᵀ dU[o][c] G (3×3 from 4×4), in f64, rounded once.
fn filter_grad_back_transform(du: &[f32], o: usize, c: usize, dw: &mut [f32]) {
    // Gᵀ·v for a 4-vector: (v0 + (v1 + v2)/2, (v1 − v2)/2, (v1 + v2)/2 + v3).
    let gt = |v: [f64; 4]| {
        [
            v[0] + (v[1] + v[2]) * 0.5,
            (v[1] - v[2]) * 0.5,
            (v[1] + v[2]) * 0.5 + v[3],
        ]
    };
    let oc_len = o * c;
    for p in 0..oc_len {
        let d = |i: usize, j: usize| du[(i * 4 + j) * oc_len + p] as f64;
        let cols: [[f64; 3]; 4] = std::array::from_fn(|j| gt([d(0, j), d(1, j), d(2, j), d(3, j)]));
        for k in 0..3 {
            let row = gt([cols[0][k], cols[1][k], cols[2][k], cols[3][k]]);
            for (l, v) in row.iter().enumerate() {
                dw[p * 9 + k * 3 + l] = *v as f32;
            }
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on a per-thread buffer of `n` values (contents unspecified). Re-entrant: a nested
/// call gets a fresh buffer.
fn with_scratch<R>(n: usize, f: impl FnOnce(&mut [f32]) -> R) -> R {
    let mut buf = SCRATCH
        .with(|c| c.try_borrow_mut().map(|mut v| std::mem::take(&mut *v)))
        .unwrap_or_default();
    if buf.len() < n {
        buf.resize(n, 0.0);
    }
    let r = f(&mut buf[..n]);
    SCRATCH.with(|c| {
        if let Ok(mut v) = c.try_borrow_mut() {
            if v.capacity() < buf.capacity() {
                *v = buf;
            }
        }
    });
    r
}

/// The output pointer shared by the blocks, which write disjoint rows of it.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: each block writes only the output rows of its own tile rows (see conv_tiles).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

/// Values from one Winograd point's matrix (`channels` × `tiles`) to the next in a block's
/// transformed data: whole 64-byte lines, an odd number of them. The transforms write (and
/// the output transform reads) all 16 points of a tile at once; at a stride of a multiple of
/// 4 KiB (64 channels × 80 tiles: 20 KiB) those 16 streams fall in one L1 set and evict each
/// other, while an odd number of lines spreads them over 16 sets.
fn point_stride(channels: usize, tiles: usize) -> usize {
    const LINE: usize = 16;
    let lines = (channels * tiles).div_ceil(LINE);
    (lines | 1) * LINE
}

/// Values of a block's split input rows: the 2·units + 2 input rows of its tile rows, each
/// as (even, odd) × (tw + 1), then one padded row ([`pad_len`]).
fn split_rows_len(tiling: &Tiling) -> usize {
    (2 * tiling.per_block + 2) * 2 * (tiling.tw + 1) + pad_len(tiling.tw)
}

/// Values of the padded row [`split_rows`] unzips: 2·(tw + 1) rounded up to whole vectors.
fn pad_len(tw: usize) -> usize {
    2 * (tw + 1) + 32
}

/// The forward-type pass over every block: y = relu?(conv + bias), y overwritten.
fn conv_tiles(isa: Isa, l: &Layer, x: &[f32], u: &[f32], e: Epilogue, y: &mut [f32]) {
    if y.is_empty() {
        return;
    }
    let tiling = Tiling::new(l.n, l.oh, l.ow, l.cin + l.cout);
    let out = OutPtr(y.as_mut_ptr());
    let block = |b: usize| {
        let units = tiling.range(b);
        let t = units.len() * tiling.tw;
        let (vs, ms) = (point_stride(l.cin, t), point_stride(l.cout, t));
        let (vlen, mlen) = (POINTS * vs, POINTS * ms);
        with_scratch(vlen + mlen + split_rows_len(&tiling), |s| {
            let (v, rest) = s.split_at_mut(vlen);
            let (m, rows) = rest.split_at_mut(mlen);
            with_isa!(isa, S => input_transform::<S>(l, &tiling, units.clone(), x, v, rows));
            if l.cin == 0 {
                m.fill(0.0);
            } else {
                Gemm::new(l.cout, t, l.cin)
                    .isa(isa)
                    .threads(1)
                    .batch(Batch {
                        count: POINTS,
                        a: (l.cout * l.cin) as isize,
                        b: vs as isize,
                        c: ms as isize,
                    })
                    .run(
                        MatRef::row_major(u, l.cin),
                        MatRef::row_major(v, t),
                        MatMut::row_major(m, t),
                    )
                    .expect("internal error: Winograd GEMM views out of bounds");
            }
            // SAFETY: the block writes the output rows of its own units only.
            with_isa!(isa, S => output_transform::<S>(l, &tiling, units.clone(), m, e, out));
        })
    };
    let blocks = tiling.blocks();
    if blocks > 1 {
        (0..blocks).into_par_iter().for_each(block);
    } else {
        (0..blocks).for_each(block);
    }
}

/// One block's part of the weight gradient, added into du [16][o][c]: the input transform
/// of x and the output-gradient transform of dy, then du[ξ] += dY[ξ] · V[ξ]ᵀ.
fn filter_grad_block(
    isa: Isa,
    l: &Layer,
    tiling: &Tiling,
    b: usize,
    x: &[f32],
    dy: &[f32],
    du: &mut [f32],
) {
    let units = tiling.range(b);
    let t = units.len() * tiling.tw;
    let (vs, gs) = (point_stride(l.cin, t), point_stride(l.cout, t));
    let (vlen, glen) = (POINTS * vs, POINTS * gs);
    with_scratch(vlen + glen + split_rows_len(tiling), |s| {
        let (v, rest) = s.split_at_mut(vlen);
        let (gy, rows) = rest.split_at_mut(glen);
        with_isa!(isa, S => {
            input_transform::<S>(l, tiling, units.clone(), x, v, rows);
            grad_transform::<S>(l, tiling, units.clone(), dy, gy)
        });
        Gemm::new(l.cout, l.cin, t)
            .isa(isa)
            .threads(1)
            .beta(1.0)
            .batch(Batch {
                count: POINTS,
                a: gs as isize,
                b: vs as isize,
                c: (l.cout * l.cin) as isize,
            })
            .run(
                MatRef::row_major(gy, t),
                MatRef::row_major(v, t).t(),
                MatMut::row_major(du, l.cin),
            )
            .expect("internal error: Winograd GEMM views out of bounds");
    })
}

/// Splitting a run of 2·LANES values into its even and odd positions and back, per ISA (the
/// transforms work on even and odd columns; NCHW rows interleave them).
trait Interleave: Simd {
    /// (even, odd) positions of the 2·LANES values a (first) then b.
    unsafe fn unzip(a: Self::V, b: Self::V) -> (Self::V, Self::V);
    /// The lanes of even and odd alternating (even first), as two vectors.
    unsafe fn zip(even: Self::V, odd: Self::V) -> (Self::V, Self::V);
}

impl Interleave for crate::simd::Scalar {
    #[inline(always)]
    unsafe fn unzip(a: f32, b: f32) -> (f32, f32) {
        (a, b)
    }
    #[inline(always)]
    unsafe fn zip(even: f32, odd: f32) -> (f32, f32) {
        (even, odd)
    }
}

#[cfg(target_arch = "x86_64")]
impl Interleave for crate::simd::Avx2 {
    #[inline(always)]
    unsafe fn unzip(a: Self::V, b: Self::V) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        // Per 128-bit half: [a0 a2 b0 b2 | a4 a6 b4 b6]; then the 64-bit pairs reordered.
        let even = _mm256_shuffle_ps::<0b10_00_10_00>(a, b);
        let odd = _mm256_shuffle_ps::<0b11_01_11_01>(a, b);
        let order = |v: __m256| {
            _mm256_castpd_ps(_mm256_permute4x64_pd::<0b11_01_10_00>(_mm256_castps_pd(v)))
        };
        (order(even), order(odd))
    }
    #[inline(always)]
    unsafe fn zip(even: Self::V, odd: Self::V) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        let (lo, hi) = (_mm256_unpacklo_ps(even, odd), _mm256_unpackhi_ps(even, odd));
        (
            _mm256_permute2f128_ps::<0x20>(lo, hi),
            _mm256_permute2f128_ps::<0x31>(lo, hi),
        )
    }
}

#[cfg(target_arch = "x86_64")]
impl Interleave for crate::simd::Avx512 {
    #[inline(always)]
    unsafe fn unzip(a: Self::V, b: Self::V) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        // Lane i of the result takes value idx[i] of (a, b): 0..16 from a, 16..32 from b.
        let idx = |first: i32| -> __m512i {
            std::mem::transmute::<[i32; 16], __m512i>(std::array::from_fn(|i| first + 2 * i as i32))
        };
        (
            _mm512_permutex2var_ps(a, idx(0), b),
            _mm512_permutex2var_ps(a, idx(1), b),
        )
    }
    #[inline(always)]
    unsafe fn zip(even: Self::V, odd: Self::V) -> (Self::V, Self::V) {
        use std::arch::x86_64::*;
        let idx = |first: i32| -> __m512i {
            std::mem::transmute::<[i32; 16], __m512i>(std::array::from_fn(|i| {
                first + (i / 2) as i32 + if i % 2 == 1 { 16 } else { 0 }
            }))
        };
        (
            _mm512_permutex2var_ps(even, idx(0), odd),
            _mm512_permutex2var_ps(even, idx(8), odd),
        )
    }
}

/// Splits rows y0..y0 + nrows of `plane` (h × w, zero outside) into even and odd columns of
/// the padded row (column X of the padded row is input column X − pw), tw + 1 of each:
/// `rows[(2r + parity)·(tw + 1) + k]` is padded column 2k + parity of row y0 + r.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn split_rows<S: Interleave>(
    plane: &[f32],
    (h, w): (usize, usize),
    y0: isize,
    pw: usize,
    tw: usize,
    nrows: usize,
    rows: &mut [f32],
    pad: &mut [f32],
) {
    let stride = tw + 1;
    // The padded row as the unzip reads it: whole pairs of vectors.
    let padded = 2 * stride.next_multiple_of(S::LANES);
    let pad = &mut pad[..padded];
    // Only columns pw..pw + n change from row to row: the zeros around them are stored once.
    // (A memmove and two memset calls per row of 16 values cost more than its unzip: ~10 %
    // of the conv bench's forward + backward.)
    let n = w.min(padded - pw);
    zero::<S>(pad);
    for r in 0..nrows {
        let (even, odd) = rows[2 * r * stride..(2 * r + 2) * stride].split_at_mut(stride);
        let y = y0 + r as isize;
        if y < 0 || y >= h as isize {
            zero::<S>(even);
            zero::<S>(odd);
            continue;
        }
        let src = &plane[y as usize * w..][..w];
        copy_short(&mut pad[pw..pw + n], &src[..n]);
        let mut k = 0;
        while k < stride {
            let lanes = S::LANES.min(stride - k);
            let p = pad.as_ptr().add(2 * k);
            let (e, o) = S::unzip(S::load(p), S::load(p.add(S::LANES)));
            store_lanes::<S>(even.as_mut_ptr().add(k), e, lanes);
            store_lanes::<S>(odd.as_mut_ptr().add(k), o, lanes);
            k += lanes;
        }
    }
}

/// Zeroes `buf` with vector stores (inline: no memset call for a few dozen values).
#[inline(always)]
unsafe fn zero<S: Simd>(buf: &mut [f32]) {
    let mut i = 0;
    while i < buf.len() {
        let lanes = S::LANES.min(buf.len() - i);
        store_lanes::<S>(buf.as_mut_ptr().add(i), S::zero(), lanes);
        i += lanes;
    }
}

/// V[ξ][ch][tile] = Bᵀ d B for every input channel and tile of the block's units
/// (v: [16][cin][t], t = the block's tiles, the points [`point_stride`] apart).
///
/// # Safety
/// The CPU has `S`'s ISA.
#[inline(always)]
unsafe fn input_transform<S: Interleave>(
    l: &Layer,
    tiling: &Tiling,
    units: Range<usize>,
    x: &[f32],
    v: &mut [f32],
    rows: &mut [f32],
) {
    let (tw, th) = (tiling.tw, tiling.th);
    let t = units.len() * tw;
    let plane_len = l.h * l.w;
    let stride = tw + 1;
    let (rows, pad) = rows.split_at_mut(rows.len() - pad_len(tw));
    // The block's tile rows of one image at a time: each input row is split once, though
    // consecutive tile rows share two of their four rows.
    let mut unit = units.start;
    while unit < units.end {
        let (img, ty0) = (unit / th, unit % th);
        let count = (th - ty0).min(units.end - unit);
        let ui0 = unit - units.start;
        let y0 = (2 * ty0) as isize - l.pad.0 as isize;
        for ch in 0..l.cin {
            let plane = &x[(img * l.cin + ch) * plane_len..][..plane_len];
            split_rows::<S>(plane, (l.h, l.w), y0, l.pad.1, tw, 2 * count + 2, rows, pad);
            for i in 0..count {
                input_tile_row::<S>(
                    rows.as_ptr().add(4 * i * stride),
                    tw,
                    v.as_mut_ptr().add(ch * t + (ui0 + i) * tw),
                    point_stride(l.cin, t),
                );
            }
        }
        unit += count;
    }
}

/// Bᵀ d B for the tw tiles of one tile row, vectorised across the tiles: `rows` as
/// [`split_rows`] writes them; point ξ of tile k goes to `v + ξ·xs + k`.
///
/// Bᵀ combines the rows (r0 − r2, r1 + r2, r2 − r1, r1 − r3); B the columns in the same way.
///
/// # Safety
/// `rows` holds 8·(tw + 1) values; `v + ξ·xs + k` is writable for ξ < 16, k < tw.
#[inline(always)]
unsafe fn input_tile_row<S: Simd>(rows: *const f32, tw: usize, v: *mut f32, xs: usize) {
    let stride = tw + 1;
    let mut k = 0;
    while k < tw {
        let lanes = S::LANES.min(tw - k);
        // Columns 2k, 2k+1, 2k+2, 2k+3 of each row, after the row transform.
        let mut cols = [[S::zero(); 4]; 4];
        for (c, col) in cols.iter_mut().enumerate() {
            let (parity, shift) = (c % 2, c / 2);
            let ld = |r: usize| load_lanes::<S>(rows, (2 * r + parity) * stride + k + shift, lanes);
            let (r0, r1, r2, r3) = (ld(0), ld(1), ld(2), ld(3));
            *col = [
                S::sub(r0, r2),
                S::add(r1, r2),
                S::sub(r2, r1),
                S::sub(r1, r3),
            ];
        }
        let [c0, c1, c2, c3] = cols;
        for (i, (((x0, x1), x2), x3)) in c0.into_iter().zip(c1).zip(c2).zip(c3).enumerate() {
            let out = [
                S::sub(x0, x2),
                S::add(x1, x2),
                S::sub(x2, x1),
                S::sub(x1, x3),
            ];
            for (j, val) in out.into_iter().enumerate() {
                store_lanes::<S>(v.add((4 * i + j) * xs + k), val, lanes);
            }
        }
        k += lanes;
    }
}

/// A dY Aᵀ for every output-gradient channel and tile of the block's units (gy: [16][cout][t],
/// the points [`point_stride`] apart); tiles past the output's edge read zeros.
///
/// # Safety
/// The CPU has `S`'s ISA.
#[inline(always)]
unsafe fn grad_transform<S: Interleave>(
    l: &Layer,
    tiling: &Tiling,
    units: Range<usize>,
    dy: &[f32],
    gy: &mut [f32],
) {
    let (tw, th) = (tiling.tw, tiling.th);
    let t = units.len() * tw;
    let plane_len = l.oh * l.ow;
    let xs = point_stride(l.cout, t);
    for (ui, unit) in units.enumerate() {
        let (img, ty) = (unit / th, unit % th);
        let second = 2 * ty + 1 < l.oh;
        for oc in 0..l.cout {
            let plane = &dy[(img * l.cout + oc) * plane_len..][..plane_len];
            let row0 = &plane[2 * ty * l.ow..][..l.ow];
            let row1 = if second {
                &plane[(2 * ty + 1) * l.ow..][..l.ow]
            } else {
                &[][..]
            };
            let out = gy.as_mut_ptr().add(oc * t + ui * tw);
            grad_tile_row::<S>(row0, row1, tw, out, xs);
        }
    }
}

/// Columns 2k, 2k + 2, … and 2k + 1, 2k + 3, … of `row` (`lanes` of each; zero past its
/// end, all zero for an empty row), read straight from the row where two whole vectors fit
/// in it, else through a copy.
///
/// # Safety
/// The CPU has `S`'s ISA.
#[inline(always)]
unsafe fn unzip_at<S: Interleave>(row: &[f32], k: usize, lanes: usize) -> (S::V, S::V) {
    let at = 2 * k;
    if at + 2 * S::LANES <= row.len() {
        let p = row.as_ptr().add(at);
        return S::unzip(S::load(p), S::load(p.add(S::LANES)));
    }
    if at >= row.len() {
        return (S::zero(), S::zero());
    }
    // The row's last values, zero after them: 2·lanes ≤ 2·LANES ≤ 32.
    let mut buf = [0f32; 32];
    let n = (row.len() - at).min(2 * lanes);
    copy_short(&mut buf[..n], &row[at..at + n]);
    S::unzip(S::load(buf.as_ptr()), S::load(buf.as_ptr().add(S::LANES)))
}

/// A dY Aᵀ for the tw tiles of one tile row, from its two output-gradient rows (the second
/// empty past the bottom edge; columns past the right edge read zeros): each 2×2 tile
/// [[a, b], [c, d]] (a, b: row 0's even and odd columns, c, d: row 1's), point ξ of tile k
/// to `gy + ξ·xs + k`. A combines the rows into (r0, r0 + r1, r0 − r1, −r1), and the
/// columns the same way. The rows are unzipped where they lie (no copy per row).
///
/// # Safety
/// The CPU has `S`'s ISA; `gy + ξ·xs + k` is writable for ξ < 16, k < tw.
#[inline(always)]
unsafe fn grad_tile_row<S: Interleave>(
    row0: &[f32],
    row1: &[f32],
    tw: usize,
    gy: *mut f32,
    xs: usize,
) {
    let mut k = 0;
    while k < tw {
        let lanes = S::LANES.min(tw - k);
        let (a, b) = unzip_at::<S>(row0, k, lanes);
        let (c, d) = unzip_at::<S>(row1, k, lanes);
        let (nc, nd) = (S::sub(S::zero(), c), S::sub(S::zero(), d));
        let row_pairs = [
            (a, b),
            (S::add(a, c), S::add(b, d)),
            (S::sub(a, c), S::sub(b, d)),
            (nc, nd),
        ];
        for (i, (p, q)) in row_pairs.into_iter().enumerate() {
            let out = [p, S::add(p, q), S::sub(p, q), S::sub(S::zero(), q)];
            for (j, val) in out.into_iter().enumerate() {
                store_lanes::<S>(gy.add((4 * i + j) * xs + k), val, lanes);
            }
        }
        k += lanes;
    }
}

/// y = relu?(Aᵀ M A + bias) for every output channel and tile of the block's units, written
/// to the output rows of those units (clipped at the output's edge).
///
/// # Safety
/// The CPU has `S`'s ISA; `out` is the whole [n, cout, oh, ow] output and no other thread
/// writes the rows of these units.
#[inline(always)]
unsafe fn output_transform<S: Interleave>(
    l: &Layer,
    tiling: &Tiling,
    units: Range<usize>,
    m: &[f32],
    e: Epilogue,
    out: OutPtr,
) {
    let (tw, th) = (tiling.tw, tiling.th);
    let t = units.len() * tw;
    let plane_len = l.oh * l.ow;
    for (ui, unit) in units.enumerate() {
        let (img, ty) = (unit / th, unit % th);
        for oc in 0..l.cout {
            let row0 = out.0.add((img * l.cout + oc) * plane_len + 2 * ty * l.ow);
            let rows = (row0, (2 * ty + 1 < l.oh).then(|| row0.add(l.ow)));
            let bias = e.bias.map(|b| b[oc]);
            let m = m.as_ptr().add(oc * t + ui * tw);
            output_tile_row::<S>(m, point_stride(l.cout, t), (tw, l.ow), rows, bias, e.relu);
        }
    }
}

/// relu?(Aᵀ M A + bias) for the tw tiles of one tile row, vectorised across the tiles: point
/// ξ of tile k at `m + ξ·xs + k`; the two output rows (the second None past the output's
/// bottom edge) get columns 0..ow. Aᵀ combines the rows into (m0 + m1 + m2, m1 − m2 − m3),
/// and the columns the same way; PyTorch's ReLU keeps −0 and NaN.
///
/// # Safety
/// `m + ξ·xs + k` is readable for ξ < 16, k < tw; each row is writable for ow values.
#[inline(always)]
unsafe fn output_tile_row<S: Interleave>(
    m: *const f32,
    xs: usize,
    (tw, ow): (usize, usize),
    rows: (*mut f32, Option<*mut f32>),
    bias: Option<f32>,
    relu: bool,
) {
    let finish = |v: S::V| {
        let v = match bias {
            Some(b) => S::add(v, S::splat(b)),
            None => v,
        };
        if relu {
            S::select(S::lt(v, S::zero()), S::zero(), v)
        } else {
            v
        }
    };
    let mut k = 0;
    while k < tw {
        let lanes = S::LANES.min(tw - k);
        let ld = |xi: usize| load_lanes::<S>(m, xi * xs + k, lanes);
        let p: [S::V; POINTS] = std::array::from_fn(ld);
        let sums: [[S::V; 4]; 2] = [
            std::array::from_fn(|j| S::add(S::add(p[j], p[4 + j]), p[8 + j])),
            std::array::from_fn(|j| S::sub(S::sub(p[4 + j], p[8 + j]), p[12 + j])),
        ];
        // Output columns 2k.. of this chunk: 2·lanes, clipped at the right edge.
        let cols = (ow - 2 * k).min(2 * lanes);
        for (r, row) in sums.iter().zip([Some(rows.0), rows.1]) {
            let Some(row) = row else { break };
            let even = finish(S::add(S::add(r[0], r[1]), r[2]));
            let odd = finish(S::sub(S::sub(r[1], r[2]), r[3]));
            let (first, second) = S::zip(even, odd);
            store_lanes::<S>(row.add(2 * k), first, cols.min(S::LANES));
            if cols > S::LANES {
                store_lanes::<S>(row.add(2 * k + S::LANES), second, cols - S::LANES);
            }
        }
        k += lanes;
    }
}
