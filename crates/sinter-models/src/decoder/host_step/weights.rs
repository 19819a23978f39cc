//! The host step's views of a model's layers: projections (f32 in place, packed, or int8),
//! embedding tables (also the tied head), the two norms, and the products they run.

use std::sync::Arc;

use sinter_core::{Device, HostF32, Result, StorageStamp, Tensor};
use sinter_cpu::gemm::{Gemm, MatMut, MatRef, PackedB};
use sinter_cpu::math::layer_norm::layer_norm_rows;
use sinter_cpu::math::rms_norm::rms_norm_rows;
use sinter_cpu::math::Activation;
use sinter_cpu::Isa;
use sinter_nn::quant::slot::Int8Layer;
use sinter_nn::quant::{GgmlLinear, QuantSlot, QuantState};
use sinter_nn::transformer::Norm;
use sinter_nn::{Embedding, Linear};

/// Which storage a packed weight was read from, how many times that storage had been
/// written then (`Tensor::storage_stamp`: every in-place change counts, so an optimizer step,
/// a loaded checkpoint or one edited value all show), and where in it the weight lies. When
/// one differs at a step, the packs are dropped.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Fingerprint {
    stamp: StorageStamp,
    at: usize,
    len: usize,
}

impl Fingerprint {
    pub(super) fn of(w: &[f32], stamp: StorageStamp) -> Fingerprint {
        Fingerprint {
            stamp,
            at: w.as_ptr() as usize,
            len: w.len(),
        }
    }
}

/// W [out, inp] row-major packed as the B operand (Wᵀ, inp × out) of x Wᵀ.
pub(super) fn pack(isa: Isa, w: &[f32], inp: usize, out: usize) -> Result<PackedB> {
    let wt = MatRef {
        data: w,
        offset: 0,
        rs: 1,
        cs: inp as isize,
    };
    PackedB::new_isa(isa, wt, inp, out)
        .map_err(|e| sinter_core::Error::Msg(format!("gpt: packing a weight: {e}")))
}

/// Host views of a tensor that must have one; None sends the step to the tensor path.
pub(super) fn host(t: &Tensor) -> Option<HostF32<'_>> {
    t.host_f32()
}

/// Whether a layer runs its f32 weights (Some(None)), an int8 form (Some(Some)), or is being
/// calibrated (None: its observer must see the inputs, so the tensor path runs).
fn int8_form(slot: &QuantSlot) -> Option<Option<Arc<dyn Int8Layer>>> {
    match slot.state() {
        QuantState::F32 => Some(None),
        QuantState::Int8(q) => Some(Some(q)),
        QuantState::Calibrating(_) => None,
    }
}

/// A Linear as the step runs it.
pub(super) enum Proj<'a> {
    /// Its f32 weight [out, in] and bias, read in place; the weight's stamp taken with its
    /// read lock held (packs made from it stay valid while it is unchanged).
    F32 {
        w: HostF32<'a>,
        b: Option<HostF32<'a>>,
        inp: usize,
        out: usize,
        stamp: StorageStamp,
    },
    /// Its int8 form (bias included).
    Int8(Arc<dyn Int8Layer>),
}

impl<'a> Proj<'a> {
    pub(super) fn of(l: &'a Linear) -> Option<Proj<'a>> {
        // A LoRA adapter left on the layer runs in the tensor path (Linear::forward).
        if l.lora.get().is_some() {
            return None;
        }
        if let Some(q) = int8_form(&l.quant)? {
            return Some(Proj::Int8(q));
        }
        let (out, inp) = (l.weight.shape()[0], l.weight.shape()[1]);
        let b = match &l.bias {
            Some(b) => Some(host(b)?),
            None => None,
        };
        let w = host(&l.weight)?;
        Some(Proj::F32 {
            stamp: l.weight.storage_stamp(),
            w,
            b,
            inp,
            out,
        })
    }

    /// Its f32 weight packed (None for an int8 layer).
    pub(super) fn pack(&self, isa: Isa) -> Result<Option<PackedB>> {
        match self {
            Proj::F32 { w, inp, out, .. } => Ok(Some(pack(isa, w, *inp, *out)?)),
            Proj::Int8(_) => Ok(None),
        }
    }

    /// The fingerprint of its f32 weight (None for an int8 layer).
    pub(super) fn print(&self) -> Option<Fingerprint> {
        match self {
            Proj::F32 { w, stamp, .. } => Some(Fingerprint::of(w, *stamp)),
            Proj::Int8(_) => None,
        }
    }

    /// y = act(x Wᵀ + b) for `rows` rows of x, or y += x Wᵀ + b with `accumulate` (the
    /// residual add); with W's packed form when given, on up to `threads` threads.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn apply(
        &self,
        isa: Isa,
        x: &[f32],
        rows: usize,
        y: &mut [f32],
        act: Activation,
        accumulate: bool,
        packed: Option<&PackedB>,
        threads: usize,
    ) -> Result<()> {
        match self {
            Proj::F32 { w, b, inp, out, .. } => {
                let geom = (rows, *inp, *out);
                let w = match packed {
                    Some(p) => Weight::Packed(p),
                    None => Weight::InPlace(w),
                };
                let run = Run {
                    act,
                    accumulate,
                    threads,
                };
                xwt(isa, x, w, b.as_deref(), geom, run, y)
            }
            Proj::Int8(q) => int8_apply(q.as_ref(), x, rows, act, accumulate, y),
        }
    }
}

/// A weight up to this size stays in the core's cache between chunks of a step (`xwt`).
const CACHED_WEIGHT_BYTES: usize = 1 << 20;

/// The W of a product x Wᵀ: [out, inp] row-major read in place, or packed ahead (any number
/// of rows: the micro-kernels' 8- or 12-row tiles, one row the matrix × vector form).
#[derive(Clone, Copy)]
enum Weight<'w> {
    InPlace(&'w [f32]),
    Packed(&'w PackedB),
}

/// How a product runs: its epilogue's activation, whether it adds into y (the residual
/// add, β = 1), and the most threads it may take.
#[derive(Clone, Copy)]
struct Run {
    act: Activation,
    accumulate: bool,
    threads: usize,
}

/// y = act(x Wᵀ + b) (or y += x Wᵀ + b with `accumulate`) for x [rows, inp].
fn xwt(
    isa: Isa,
    x: &[f32],
    w: Weight,
    b: Option<&[f32]>,
    (rows, inp, out): (usize, usize, usize),
    Run {
        act,
        accumulate,
        threads,
    }: Run,
    y: &mut [f32],
) -> Result<()> {
    // A weight that fits the core's cache: one thread, since forking each product of a step
    // costs more than it saves (a 64-position prefill of gpt-tiny: 1,695 vs 1,575 tokens/s
    // threaded); `step` splits rows instead. A larger one is streamed from memory, which
    // every core's share of the rows (or columns) reads faster.
    let threads = if out * inp * 4 > CACHED_WEIGHT_BYTES {
        threads
    } else {
        1
    };
    let mut g = (Gemm::new(rows, out, inp).isa(isa))
        .activation(act)
        .threads(threads);
    if accumulate {
        g = g.beta(1.0);
    }
    if let Some(b) = b {
        g = g.bias(b);
    }
    let failed = |e| sinter_core::Error::Msg(format!("gpt step: {e}"));
    let w = match w {
        Weight::Packed(p) => {
            let xs = MatRef::row_major(&x[..rows * inp], inp);
            let ys = MatMut::row_major(&mut y[..rows * out], out);
            return g.run_packed(xs, p, ys, None).map_err(failed);
        }
        Weight::InPlace(w) => w,
    };
    let wt = MatRef {
        data: w,
        offset: 0,
        rs: 1,
        cs: inp as isize,
    };
    // Up to 16 rows take sinter-cpu's few-column dot form (no packing). Larger steps of a
    // cached weight run in such chunks too: re-reading W from cache per chunk measured
    // cheaper here than packing it for one product (gpt-tiny, 32 rows per part: prefill of a
    // 64-token window ~1,510 vs ~1,320 tokens/s, serving 64 streams 30.8–48.0k vs
    // 24.9–26.1k tokens/s; noisy, load 11–13). A weight beyond the cache runs as one product.
    let chunk = if rows <= 64 && out * inp * 4 <= CACHED_WEIGHT_BYTES {
        16
    } else {
        rows
    };
    let mut r0 = 0;
    while r0 < rows {
        let n = chunk.min(rows - r0);
        let xs = MatRef::row_major(&x[r0 * inp..(r0 + n) * inp], inp);
        let g = Gemm { m: n, ..g };
        g.run(
            xs,
            wt,
            MatMut::row_major(&mut y[r0 * out..(r0 + n) * out], out),
        )
        .map_err(failed)?;
        r0 += n;
    }
    Ok(())
}

/// An int8 layer's act(x Wᵀ + b) on `rows` rows of x, stored into (or added to) y.
fn int8_apply(
    q: &dyn Int8Layer,
    x: &[f32],
    rows: usize,
    act: Activation,
    accumulate: bool,
    y: &mut [f32],
) -> Result<()> {
    // A GGUF weight kept in its blocks runs on the slices directly (no tensor round trip).
    if let Some(g) = q.as_any().downcast_ref::<GgmlLinear>() {
        let (k, n) = (g.weight().k(), g.weight().n());
        let x = &x[..rows * k];
        if !accumulate {
            return g.apply(x, rows, act, &mut y[..rows * n]);
        }
        let mut t = vec![0f32; rows * n];
        g.apply(x, rows, act, &mut t)?;
        y.iter_mut().zip(&t).for_each(|(y, t)| *y += t);
        return Ok(());
    }
    let inp = x.len() / rows.max(1);
    let xt = Tensor::from_slice(&x[..rows * inp], &[rows, inp], Device::Cpu)?;
    store(&q.forward(&xt, act)?, accumulate, y)
}

/// A tensor's elements stored into (or added to) the front of y.
fn store(t: &Tensor, accumulate: bool, y: &mut [f32]) -> Result<()> {
    let v = t.to_vec_f32()?;
    let y = &mut y[..v.len()];
    if accumulate {
        y.iter_mut().zip(&v).for_each(|(y, v)| *y += v);
    } else {
        y.copy_from_slice(&v);
    }
    Ok(())
}

/// An embedding table as the step reads it: its f32 rows in place, or its int8 form (which
/// also serves the tied head).
pub(super) enum Table<'a> {
    /// The rows in place and their stamp (as `Proj::F32`'s).
    F32(HostF32<'a>, StorageStamp),
    Int8(Arc<dyn Int8Layer>),
}

impl<'a> Table<'a> {
    pub(super) fn of(e: &'a Embedding) -> Option<Table<'a>> {
        Some(match int8_form(&e.quant)? {
            Some(q) => Table::Int8(q),
            None => {
                let w = host(&e.weight)?;
                Table::F32(w, e.weight.storage_stamp())
            }
        })
    }

    /// x[i] (+)= the table's row ids[i], c values each.
    pub(super) fn rows(
        &self,
        ids: &[usize],
        c: usize,
        accumulate: bool,
        x: &mut [f32],
    ) -> Result<()> {
        match self {
            Table::F32(w, _) => {
                for (&id, xr) in ids.iter().zip(x.chunks_exact_mut(c)) {
                    let row = &w[id * c..(id + 1) * c];
                    if accumulate {
                        xr.iter_mut().zip(row).for_each(|(x, r)| *x += r);
                    } else {
                        xr.copy_from_slice(row);
                    }
                }
                Ok(())
            }
            Table::Int8(q) => {
                let ids: Vec<i64> = ids.iter().map(|&i| i as i64).collect();
                let t = Tensor::from_vec(ids, &[x.len() / c], Device::Cpu)?;
                store(&q.lookup(&t)?, accumulate, x)
            }
        }
    }

    /// The f32 table packed as a head's weight [vocab, c] (None for an int8 table).
    pub(super) fn pack(&self, isa: Isa, c: usize, vocab: usize) -> Result<Option<PackedB>> {
        match self {
            Table::F32(w, _) => Ok(Some(pack(isa, w, c, vocab)?)),
            Table::Int8(_) => Ok(None),
        }
    }

    pub(super) fn print(&self) -> Option<Fingerprint> {
        match self {
            Table::F32(w, stamp) => Some(Fingerprint::of(w, *stamp)),
            Table::Int8(_) => None,
        }
    }

    /// The tied head: logits [rows, vocab] = h Tᵀ (with T's packed form when given).
    pub(super) fn head(
        &self,
        isa: Isa,
        h: &[f32],
        (rows, c, vocab): (usize, usize, usize),
        packed: Option<&PackedB>,
        threads: usize,
        logits: &mut [f32],
    ) -> Result<()> {
        let h = &h[..rows * c];
        match self {
            Table::F32(w, _) => {
                let w = packed.map_or(Weight::InPlace(w), Weight::Packed);
                let (geom, act) = ((rows, c, vocab), Activation::None);
                let run = Run {
                    act,
                    accumulate: false,
                    threads,
                };
                xwt(isa, h, w, None, geom, run, logits)
            }
            Table::Int8(q) => int8_apply(q.as_ref(), h, rows, Activation::None, false, logits),
        }
    }
}

/// A block's norm, its weights read in place: LayerNorm (GPT-2) or RMSNorm (Llama).
pub(super) enum HostNorm<'a> {
    Layer {
        g: HostF32<'a>,
        b: HostF32<'a>,
        eps: f32,
    },
    Rms {
        g: HostF32<'a>,
        eps: f32,
    },
}

/// The per-row statistics LayerNorm writes (not needed after the step).
pub(super) struct Stats<'s> {
    pub mean: &'s mut [f32],
    pub rstd: &'s mut [f32],
}

impl<'a> HostNorm<'a> {
    pub(super) fn of(n: &'a Norm) -> Option<HostNorm<'a>> {
        Some(match n {
            Norm::Layer(ln) => HostNorm::Layer {
                g: host(&ln.weight)?,
                b: host(&ln.bias)?,
                eps: ln.eps,
            },
            Norm::Rms(r) => HostNorm::Rms {
                g: host(&r.weight)?,
                eps: r.eps,
            },
        })
    }

    /// y = norm(x) over `rows` rows.
    pub(super) fn apply(&self, isa: Isa, x: &[f32], rows: usize, y: &mut [f32], s: &mut Stats) {
        match self {
            HostNorm::Layer { g, b, eps } => {
                let c = g.len();
                let (mean, rstd) = (&mut s.mean[..rows], &mut s.rstd[..rows]);
                let (x, y) = (&x[..rows * c], &mut y[..rows * c]);
                layer_norm_rows(isa, x, g, b, *eps, y, mean, rstd);
            }
            HostNorm::Rms { g, eps } => {
                let c = g.len();
                rms_norm_rows(isa, &x[..rows * c], g, *eps, &mut y[..rows * c]);
            }
        }
    }
}
