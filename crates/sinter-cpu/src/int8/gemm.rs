//! The int8 GEMM driver: splits C = A·Wᵀ into blocks for the thread pool, walks each block in
//! tiles, has the path's micro-kernel fill each tile with exact i32 sums, and hands the tile to
//! the epilogue while it is still in L1.
//!
//! A is m rows of u8 (k_padded readable bytes each, `lda` apart); W is a [`PackedWeights`].
//! Blocks: up to 96 rows × a share of the panels, enough blocks for every thread when the
//! product is large (≥ 2²⁰ multiply-adds), one block on the calling thread otherwise. Inside a
//! block the panel loop is outside the row loop, so a tile's weights (64 channels × k bytes) are
//! read from L2 once per 96 rows while the rows stay in L1/L2.

use rayon::prelude::*;

use super::epilogue::{dequantize_row, requantize_row, ActQuant, Activation, Epilogue};
use super::kernel::{Kernel, Scalar, Tile, TileArgs, TILE_MR, TILE_NR};
use super::pack::{PackedWeights, PANEL};
use super::quant::QParams;
use super::Int8Path;

/// The quantized activations: `rows` rows of u8, `stride` apart, each with at least the
/// weight's k_padded bytes (the bytes past k are ignored).
#[derive(Clone, Copy, Debug)]
pub struct Activations<'a> {
    pub data: &'a [u8],
    pub rows: usize,
    pub stride: usize,
    pub quant: ActQuant<'a>,
}

/// Where the epilogue writes.
pub enum Output<'a> {
    /// f32 rows `stride` apart.
    F32 { data: &'a mut [f32], stride: usize },
    /// f32 transposed: element (i, j) at `data[j·stride + i]` (a convolution's NCHW planes,
    /// where the GEMM's rows are an image's output positions).
    F32ChannelMajor { data: &'a mut [f32], stride: usize },
    /// f32 NCHW planes of several images: the rows are `plane` output positions of each image
    /// in turn, element (i, j) at `data[((i / plane)·n + j)·plane + i % plane]` (a batch of
    /// images' convolution in one GEMM).
    F32Planes { data: &'a mut [f32], plane: usize },
    /// u8 rows `stride` apart, requantized with `quant` (the next layer's input mapping).
    U8 {
        data: &'a mut [u8],
        stride: usize,
        quant: QParams,
    },
}

/// Multiply-adds below which a GEMM runs on the calling thread.
const PARALLEL_MIN: usize = 1 << 20;
/// Rows per block (a multiple of every kernel's MR).
const BLOCK_ROWS: usize = 96;

/// acc[i, j] = Σ_k a[i, k]·w[j, k] for i < m, j < n: the raw accumulators, written to `out`
/// (rows `ldo` apart). Every path gives the same values.
///
/// Panics when `path` is not supported by this CPU or a slice is too short for its shape.
pub fn gemm_i32(
    path: Int8Path,
    a: &[u8],
    m: usize,
    lda: usize,
    w: &PackedWeights,
    out: &mut [i32],
    ldo: usize,
) {
    check_a(a, m, lda, w);
    check_out(out.len(), m, ldo, w.n());
    let sink = Sink::I32 {
        ptr: out.as_mut_ptr(),
        ld: ldo,
    };
    run(path, &Job::new(a, m, lda, w, sink));
}

/// C = epilogue(A·Wᵀ): dequantized, biased, activated, as f32 or requantized u8.
///
/// Panics when `path` is not supported by this CPU or a slice is too short for its shape.
pub fn gemm(
    path: Int8Path,
    a: &Activations<'_>,
    w: &PackedWeights,
    epilogue: &Epilogue<'_>,
    out: Output<'_>,
) {
    let (m, n) = (a.rows, w.n());
    check_a(a.data, m, a.stride, w);
    if let ActQuant::PerRow(p) = a.quant {
        assert!(p.len() >= m, "{} row mappings for {m} rows", p.len());
    }
    assert!(
        epilogue.weight_scales.len() >= n,
        "weight scales: {} for {n} channels",
        epilogue.weight_scales.len()
    );
    let zeros;
    let bias = match epilogue.bias {
        Some(b) => {
            assert!(b.len() >= n, "bias: {} for {n} channels", b.len());
            b
        }
        None => {
            zeros = vec![0f32; n];
            &zeros
        }
    };
    let dq = Dequant {
        act: a.quant,
        scales: epilogue.weight_scales,
        bias,
        activation: epilogue.activation,
    };
    let sink = match out {
        Output::F32 { data, stride } => {
            check_out(data.len(), m, stride, n);
            Sink::F32 {
                ptr: data.as_mut_ptr(),
                ld: stride,
                dq,
            }
        }
        Output::F32ChannelMajor { data, stride } => {
            check_out(data.len(), n, stride, m);
            Sink::F32Transposed {
                ptr: data.as_mut_ptr(),
                plane: m.max(1),
                image: 0,
                channel: stride,
                dq,
            }
        }
        Output::F32Planes { data, plane } => {
            assert!(
                plane > 0 && m.is_multiple_of(plane),
                "{m} rows are not whole planes of {plane}"
            );
            assert!(
                data.len() >= m * n,
                "output too short: {} for {m}×{n}",
                data.len()
            );
            Sink::F32Transposed {
                ptr: data.as_mut_ptr(),
                plane,
                image: n * plane,
                channel: plane,
                dq,
            }
        }
        Output::U8 {
            data,
            stride,
            quant,
        } => {
            check_out(data.len(), m, stride, n);
            Sink::U8 {
                ptr: data.as_mut_ptr(),
                ld: stride,
                dq,
                quant,
            }
        }
    };
    run(path, &Job::new(a.data, m, a.stride, w, sink));
}

fn check_a(a: &[u8], m: usize, lda: usize, w: &PackedWeights) {
    let kp = w.k_padded();
    assert!(lda >= kp, "activation stride {lda} below k_padded {kp}");
    if m > 0 {
        assert!(
            a.len() >= (m - 1) * lda + kp,
            "activations too short: {} bytes for {m} rows of {kp}",
            a.len()
        );
    }
}

fn check_out(len: usize, m: usize, ld: usize, n: usize) {
    assert!(ld >= n, "output stride {ld} below n = {n}");
    if m > 0 {
        assert!(
            len >= (m - 1) * ld + n,
            "output too short: {len} for {m} rows of {n}"
        );
    }
}

#[derive(Clone, Copy)]
struct Dequant<'a> {
    act: ActQuant<'a>,
    scales: &'a [f32],
    bias: &'a [f32],
    activation: Activation,
}

/// The output of a job; threads write disjoint tiles through the pointers.
enum Sink<'a> {
    I32 {
        ptr: *mut i32,
        ld: usize,
    },
    F32 {
        ptr: *mut f32,
        ld: usize,
        dq: Dequant<'a>,
    },
    /// Element (i, j) at `(i / plane)·image + j·channel + i % plane`.
    F32Transposed {
        ptr: *mut f32,
        plane: usize,
        image: usize,
        channel: usize,
        dq: Dequant<'a>,
    },
    U8 {
        ptr: *mut u8,
        ld: usize,
        dq: Dequant<'a>,
        quant: QParams,
    },
}

struct Job<'a> {
    a: *const u8,
    m: usize,
    lda: usize,
    w: &'a PackedWeights,
    sink: Sink<'a>,
}

// SAFETY: the pointers address caller-owned buffers that outlive the job; each block writes
// only its own rows × channels of the output, so concurrent blocks never touch the same byte.
unsafe impl Send for Job<'_> {}
unsafe impl Sync for Job<'_> {}

impl<'a> Job<'a> {
    fn new(a: &'a [u8], m: usize, lda: usize, w: &'a PackedWeights, sink: Sink<'a>) -> Self {
        Job {
            a: a.as_ptr(),
            m,
            lda,
            w,
            sink,
        }
    }

    /// Writes rows i0..i0+rows × channels j0..j0+cols of a tile (valid channels only).
    #[inline(always)]
    unsafe fn write(&self, i0: usize, rows: usize, j0: usize, cols: usize, acc: &Tile) {
        let sums = &self.w.sums()[j0..];
        if let Sink::F32Transposed {
            ptr,
            plane,
            image,
            channel,
            dq,
        } = &self.sink
        {
            // SAFETY: forwarded (the same elements as the row-wise sinks).
            return unsafe {
                write_transposed(
                    *ptr,
                    (*plane, *image, *channel),
                    dq,
                    sums,
                    i0,
                    rows,
                    j0,
                    cols,
                    acc,
                )
            };
        }
        for r in 0..rows {
            let acc_r = &acc[r * TILE_NR..r * TILE_NR + cols];
            let i = i0 + r;
            // SAFETY: (i, j0..j0+cols) lies in the output checked at entry, and in this block.
            unsafe {
                match &self.sink {
                    Sink::I32 { ptr, ld } => {
                        std::slice::from_raw_parts_mut(ptr.add(i * ld + j0), cols)
                            .copy_from_slice(acc_r)
                    }
                    Sink::F32 { ptr, ld, dq } => {
                        let out = std::slice::from_raw_parts_mut(ptr.add(i * ld + j0), cols);
                        dequantize_row(
                            acc_r,
                            dq.act.row(i),
                            sums,
                            &dq.scales[j0..],
                            &dq.bias[j0..],
                            dq.activation,
                            out,
                        );
                    }
                    Sink::F32Transposed { .. } => unreachable!("written by write_transposed"),
                    Sink::U8 { ptr, ld, dq, quant } => {
                        let mut y = [0f32; TILE_NR];
                        let y = &mut y[..cols];
                        dequantize_row(
                            acc_r,
                            dq.act.row(i),
                            sums,
                            &dq.scales[j0..],
                            &dq.bias[j0..],
                            dq.activation,
                            y,
                        );
                        let out = std::slice::from_raw_parts_mut(ptr.add(i * ld + j0), cols);
                        requantize_row(y, *quant, out);
                    }
                }
            }
        }
    }
}

/// [`Job::write`] for the transposed f32 sink: the tile's rows dequantized into a local tile,
/// then each channel's run of consecutive rows (positions of one image) stored contiguously —
/// one element at a time per row would be a scatter, which is slow.
///
/// # Safety
/// Rows i0..i0+rows × channels j0..j0+cols lie in the output checked at entry.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn write_transposed(
    ptr: *mut f32,
    (plane, image, channel): (usize, usize, usize),
    dq: &Dequant<'_>,
    sums: &[i32],
    i0: usize,
    rows: usize,
    j0: usize,
    cols: usize,
    acc: &Tile,
) {
    let mut y = [0f32; TILE_MR * TILE_NR];
    for r in 0..rows {
        dequantize_row(
            &acc[r * TILE_NR..r * TILE_NR + cols],
            dq.act.row(i0 + r),
            sums,
            &dq.scales[j0..],
            &dq.bias[j0..],
            dq.activation,
            &mut y[r * TILE_NR..r * TILE_NR + cols],
        );
    }
    let mut r = 0;
    while r < rows {
        let i = i0 + r;
        let run = (plane - i % plane).min(rows - r);
        let at = (i / plane) * image + i % plane + j0 * channel;
        for c in 0..cols {
            // SAFETY: (i..i+run, j0+c) is in the checked output.
            let dst = unsafe { std::slice::from_raw_parts_mut(ptr.add(at + c * channel), run) };
            for (k, d) in dst.iter_mut().enumerate() {
                *d = y[(r + k) * TILE_NR + c];
            }
        }
        r += run;
    }
}

/// A block: rows × panels.
#[derive(Clone, Copy)]
struct Block {
    rows: (usize, usize),
    panels: (usize, usize),
}

fn run(path: Int8Path, job: &Job<'_>) {
    assert!(
        path.supported(),
        "int8 path {path} is not supported by this CPU"
    );
    let (m, panels) = (job.m, job.w.panels());
    if m == 0 || panels == 0 {
        return;
    }
    let threads = rayon::current_num_threads();
    let work = m * job.w.n() * job.w.k().max(1);
    if threads == 1 || work < PARALLEL_MIN {
        // SAFETY: the path is supported (checked above); the block covers the checked shape.
        unsafe {
            run_block(
                path,
                job,
                Block {
                    rows: (0, m),
                    panels: (0, panels),
                },
            )
        };
        return;
    }
    let row_blocks = m.div_ceil(BLOCK_ROWS);
    let want = 4 * threads;
    let col_blocks = want.div_ceil(row_blocks).clamp(1, panels);
    // Whole groups of four panels where possible, so the widest kernel runs full tiles.
    let mut per = panels.div_ceil(col_blocks);
    if per > 4 {
        per = per.div_ceil(4) * 4;
    }
    let col_blocks = panels.div_ceil(per);
    (0..row_blocks * col_blocks).into_par_iter().for_each(|b| {
        let (rb, cb) = (b / col_blocks, b % col_blocks);
        let block = Block {
            rows: (rb * BLOCK_ROWS, ((rb + 1) * BLOCK_ROWS).min(m)),
            panels: (cb * per, ((cb + 1) * per).min(panels)),
        };
        // SAFETY: as above; blocks are disjoint.
        unsafe { run_block(path, job, block) };
    });
}

/// # Safety
/// `path` is supported by this CPU; the job's shapes were checked.
unsafe fn run_block(path: Int8Path, job: &Job<'_>, b: Block) {
    // SAFETY: forwarded.
    unsafe {
        match path {
            Int8Path::Scalar => block_with::<Scalar>(job, b),
            #[cfg(target_arch = "x86_64")]
            Int8Path::Avx2 => block_avx2(job, b),
            #[cfg(target_arch = "x86_64")]
            Int8Path::AvxVnni => block_avxvnni(job, b),
            #[cfg(target_arch = "x86_64")]
            Int8Path::Avx512Vnni => block_avx512vnni(job, b),
            #[cfg(not(target_arch = "x86_64"))]
            _ => unreachable!("only the scalar path is supported off x86-64"),
        }
    }
}

// Each path's block loop is compiled with its instruction set, so the epilogue inlined into it
// is vectorised with the same registers.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn block_avx2(job: &Job<'_>, b: Block) {
    unsafe { block_with::<super::kernel_avx256::Avx2>(job, b) }
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn block_avxvnni(job: &Job<'_>, b: Block) {
    unsafe { block_with::<super::kernel_avx256::AvxVnni>(job, b) }
}
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn block_avx512vnni(job: &Job<'_>, b: Block) {
    unsafe { block_with::<super::kernel_avx512::Avx512Vnni>(job, b) }
}

#[inline(always)]
unsafe fn block_with<K: Kernel>(job: &Job<'_>, b: Block) {
    debug_assert!(K::MR <= TILE_MR && K::NP * PANEL <= TILE_NR);
    let w = job.w;
    let (n, groups) = (w.n(), w.groups());
    let mut acc: Tile = [0; TILE_MR * TILE_NR];
    let mut p = b.panels.0;
    while p < b.panels.1 {
        let np = (b.panels.1 - p).min(K::NP);
        let (j0, cols) = (p * PANEL, (n - p * PANEL).min(np * PANEL));
        let mut i = b.rows.0;
        while i < b.rows.1 {
            let rows = (b.rows.1 - i).min(K::MR);
            let t = TileArgs {
                rows,
                // SAFETY: row i < m of the checked activation buffer.
                a: unsafe { job.a.add(i * job.lda) },
                lda: job.lda,
                w: w.panel_blocks(p),
                groups,
                sums: &w.sums()[j0..],
            };
            // SAFETY: the caller guarantees the instruction set; shapes were checked.
            unsafe {
                K::tile(t, np, &mut acc);
                job.write(i, rows, j0, cols, &acc);
            }
            i += rows;
        }
        p += np;
    }
}
