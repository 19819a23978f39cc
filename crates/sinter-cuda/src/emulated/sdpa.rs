//! The emulated device's cuDNN fused attention: the [`SdpaGraph`] a real device would hand to
//! cuDNN, executed on the host. Every operand is read through the graph's own dims and strides
//! (so a wrong stride in the description gives wrong values here too), the math is fp32, o and
//! the gradients are rounded once to the dtype, and the stats are fp32 log-sum-exps of the
//! scaled, masked scores:
//!
//! ```text
//! forward:  s = scale · q kᵀ, masked by the band; stats = logsumexp_j s; o = softmax(s) v
//! backward: p = exp(s − stats); D_i = Σ_e dO ∘ o; dv = pᵀ dO; dS = p ∘ (dO vᵀ − D);
//!           dq = scale · dS k; dk = scale · dSᵀ q
//! ```
//!
//! It also says which cuDNN release the emulated device reports ([`cudnn_version`]). A
//! reference, written for clarity, not speed.

use std::sync::{Arc, Mutex, OnceLock};

use super::blas::{load, store};
use super::cost::{Call, OpClass, Traffic};
use crate::cudnn::sdpa::composite::{Binding, CTensor, CompositeGraph, OpKind, Pw};
use crate::cudnn::sdpa::graph::{
    Elem, Role, Scalar, SdpaGraph, SdpaLayout, SdpaPass, SdpaProblem, Version,
};
use crate::dtype::DType;
use crate::error::{CudaError, Result};

/// The start of every cuDNN attention call's cost key (the GPU model prices them by it).
pub const KEY_PREFIX: &str = "cudnn sdpa";

/// The cuDNN release emulated devices report unless told otherwise: 9.14.0, what the one real
/// GPU lent to this project (an H200) had, so the cost model prices what that machine would
/// run: the unified SDPA_FWD for a non-causal forward, the composite graph for the rest (see
/// `cudnn::sdpa::choose`).
pub const DEFAULT_VERSION: Version = (9, 14, 0);

fn version_slot() -> &'static Mutex<Option<Version>> {
    static SLOT: OnceLock<Mutex<Option<Version>>> = OnceLock::new();
    SLOT.get_or_init(|| {
        let env = std::env::var("SINTER_CUDA_EMU_CUDNN").ok();
        Mutex::new(match env.as_deref() {
            None | Some("") => Some(DEFAULT_VERSION),
            Some("none") => None,
            Some(v) => Some(parse_version(v).unwrap_or_else(|| {
                eprintln!(
                    "sinter: SINTER_CUDA_EMU_CUDNN={v:?} is not a version like 9.13.0 or `none`; \
                     emulating cuDNN {}.{}.{}",
                    DEFAULT_VERSION.0, DEFAULT_VERSION.1, DEFAULT_VERSION.2
                );
                DEFAULT_VERSION
            })),
        })
    })
}

/// "9.13.0" (or "9.13") → (9, 13, 0).
pub fn parse_version(s: &str) -> Option<Version> {
    let mut parts = s.trim().split('.').map(|p| p.parse::<u32>().ok());
    let major = parts.next()??;
    let minor = parts.next()??;
    let patch = parts.next().unwrap_or(Some(0))?;
    parts.next().is_none().then_some((major, minor, patch))
}

/// The cuDNN release emulated devices report for fused attention: [`DEFAULT_VERSION`], or
/// `SINTER_CUDA_EMU_CUDNN` (e.g. `9.12.0` to emulate a cuDNN without SDPA, `none` for no
/// cuDNN), or what [`set_cudnn_version`] set last.
pub fn cudnn_version() -> Option<Version> {
    *version_slot().lock().unwrap_or_else(|p| p.into_inner())
}

/// Emulate cuDNN release `v` (None: no cuDNN) from now on, process-wide.
pub fn set_cudnn_version(v: Option<Version>) {
    *version_slot().lock().unwrap_or_else(|p| p.into_inner()) = v;
}

/// The composite fused-attention graph a real device would hand cuDNN, recognised as the one
/// pattern cuDNN's fused engines (and this emulation) run, and described for the host execution.
/// The problem is read back from the graph's own tensors (dims, dtypes, strides, the scale, the
/// mask's nodes), the canonical graph rebuilt from it and compared node by node and tensor by
/// tensor: anything else is declined, as cuDNN's heuristics would find no engine for it.
pub(crate) fn host_graph(c: &CompositeGraph) -> Result<SdpaGraph> {
    let op = "emulated cudnn composite attention";
    let unknown = |why: String| {
        CudaError::invalid(
            op,
            format!("not the fused-attention pattern cuDNN's engines run ({why})"),
        )
    };
    let dev = |r: Role| {
        c.tensors
            .iter()
            .find(|t| t.binding == Binding::Device(r))
            .ok_or_else(|| unknown(format!("no {r:?} operand")))
    };
    let rows = |t: &CTensor| [t.strides[0], t.strides[1], t.strides[2]].map(|s| s as usize);
    let cols = |t: &CTensor| [t.strides[0], t.strides[1], t.strides[3]].map(|s| s as usize);
    let (q, kt) = (dev(Role::Q)?, dev(Role::K)?);
    let [b, h, tq, d] = q.dims.map(|x| x.max(0) as usize);
    let dtype = match q.elem {
        Elem::Half => DType::F16,
        Elem::BFloat16 => DType::BF16,
        e => return Err(unknown(format!("q is {e:?}"))),
    };
    let scale = match c.tensors.iter().find(|t| t.name == "attn_scale") {
        Some(CTensor {
            binding: Binding::ByValue(Scalar::F32(s)),
            ..
        }) => *s,
        _ => return Err(unknown("no by-value fp32 attention scale".into())),
    };
    let causal = c.nodes.iter().any(|n| {
        matches!(
            n.kind,
            OpKind::Pointwise {
                mode: Pw::CmpGe,
                ..
            }
        )
    });
    let p = SdpaProblem {
        b,
        h,
        tq,
        tk: kt.dims[3].max(0) as usize,
        d,
        dtype,
        causal,
        scale,
    };
    let mut layout = SdpaLayout::dense(&p);
    layout.q = rows(q);
    layout.k = cols(kt);
    layout.o = rows(dev(Role::O)?);
    match c.pass {
        SdpaPass::Forward => layout.v = rows(dev(Role::V)?),
        SdpaPass::Backward => {
            layout.v = cols(dev(Role::V)?);
            layout.d_o = rows(dev(Role::DO)?);
            layout.dq = rows(dev(Role::DQ)?);
            layout.dk = rows(dev(Role::DK)?);
            layout.dv = rows(dev(Role::DV)?);
        }
    }
    let want = CompositeGraph::build(&p, &layout, c.pass)?;
    if want.nodes.len() != c.nodes.len() {
        return Err(unknown(format!(
            "{} nodes where the pattern has {}",
            c.nodes.len(),
            want.nodes.len()
        )));
    }
    if let Some((i, (got, w))) = c
        .nodes
        .iter()
        .zip(&want.nodes)
        .enumerate()
        .find(|(_, (g, w))| g != w)
    {
        return Err(unknown(format!(
            "node {i} is {got:?} where the pattern has {w:?}"
        )));
    }
    if c.tensors.len() != want.tensors.len() {
        return Err(unknown(format!(
            "{} tensors where the pattern has {}",
            c.tensors.len(),
            want.tensors.len()
        )));
    }
    if let Some((got, w)) = c.tensors.iter().zip(&want.tensors).find(|(g, w)| g != w) {
        return Err(unknown(format!(
            "tensor {got:?} where the pattern has {w:?}"
        )));
    }
    SdpaGraph::build(&p, &layout, c.pass)
}

/// A validated SDPA call with raw addresses, as the emulated device queues it.
#[derive(Clone, Debug)]
pub(crate) struct SdpaJob {
    graph: Arc<SdpaGraph>,
    /// (role, address of its element (0, 0, 0, 0)) for every device tensor of the graph.
    ptrs: Vec<(Role, u64)>,
}

/// Element offsets of one [b, h, t, d] tensor of the graph.
#[derive(Clone, Copy)]
struct View {
    base: u64,
    dtype: DType,
    strides: [usize; 4],
}

impl View {
    fn at(&self, b: usize, h: usize, t: usize, e: usize) -> usize {
        b * self.strides[0] + h * self.strides[1] + t * self.strides[2] + e * self.strides[3]
    }
    /// Row t of head (b, h) as fp32.
    ///
    /// # Safety
    /// The view must address live host memory of the graph's extent.
    unsafe fn row(&self, b: usize, h: usize, t: usize, d: usize) -> Vec<f32> {
        // SAFETY: the caller's promise.
        (0..d)
            .map(|e| unsafe { load(self.dtype, self.base, self.at(b, h, t, e)) })
            .collect()
    }
    /// # Safety
    /// As for `row`.
    unsafe fn put(&self, b: usize, h: usize, t: usize, e: usize, v: f32) {
        // SAFETY: the caller's promise.
        unsafe { store(self.dtype, self.base, self.at(b, h, t, e), v) }
    }
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl SdpaJob {
    /// `ptrs` must name every device tensor of `graph` (checked by the caller against the
    /// buffers' sizes).
    pub(crate) fn new(graph: Arc<SdpaGraph>, ptrs: Vec<(Role, u64)>) -> SdpaJob {
        SdpaJob { graph, ptrs }
    }

    fn view(&self, role: Role) -> View {
        let t = self
            .graph
            .tensor(role)
            .expect("the graph has every role it binds");
        let base = self
            .ptrs
            .iter()
            .find(|(r, _)| *r == role)
            .map(|p| p.1)
            .expect("every device tensor is bound");
        View {
            base,
            dtype: if role == Role::Stats {
                DType::F32
            } else {
                self.graph.problem.dtype
            },
            strides: t.strides.map(|s| s as usize),
        }
    }

    /// Which keys query row i keeps, under the graph's mask.
    fn kept(&self, i: usize) -> impl Iterator<Item = usize> + '_ {
        let mask = self.graph.mask;
        (0..self.graph.problem.tk).filter(move |&j| mask.is_none_or(|m| m.keeps(i, j)))
    }

    /// Compute it.
    ///
    /// # Safety
    /// Every bound address must be host memory holding its tensor's extent (checked by the
    /// caller).
    pub(crate) unsafe fn run(&self) {
        let p = self.graph.problem;
        for b in 0..p.b {
            for h in 0..p.h {
                // SAFETY: forwarded.
                unsafe {
                    match self.graph.pass {
                        SdpaPass::Forward => self.forward_head(b, h),
                        SdpaPass::Backward => self.backward_head(b, h),
                    }
                }
            }
        }
    }

    /// # Safety
    /// As for `run`.
    unsafe fn forward_head(&self, b: usize, h: usize) {
        let p = self.graph.problem;
        let [q, k, v, o, stats] =
            [Role::Q, Role::K, Role::V, Role::O, Role::Stats].map(|r| self.view(r));
        // SAFETY (every load and store below): the caller's promise.
        let keys: Vec<Vec<f32>> = (0..p.tk).map(|j| unsafe { k.row(b, h, j, p.d) }).collect();
        let vals: Vec<Vec<f32>> = (0..p.tk).map(|j| unsafe { v.row(b, h, j, p.d) }).collect();
        for i in 0..p.tq {
            let qi = unsafe { q.row(b, h, i, p.d) };
            let s: Vec<(usize, f32)> = self
                .kept(i)
                .map(|j| (j, p.scale * dot(&qi, &keys[j])))
                .collect();
            let m = s.iter().map(|x| x.1).fold(f32::NEG_INFINITY, f32::max);
            let l: f32 = s.iter().map(|x| (x.1 - m).exp()).sum();
            let mut acc = vec![0f32; p.d];
            for &(j, sj) in &s {
                let w = (sj - m).exp() / l;
                acc.iter_mut().zip(&vals[j]).for_each(|(a, x)| *a += w * x);
            }
            for (e, a) in acc.into_iter().enumerate() {
                unsafe { o.put(b, h, i, e, if s.is_empty() { 0.0 } else { a }) };
            }
            let lse = if s.is_empty() {
                f32::NEG_INFINITY
            } else {
                m + l.ln()
            };
            unsafe { stats.put(b, h, i, 0, lse) };
        }
    }

    /// # Safety
    /// As for `run`.
    unsafe fn backward_head(&self, b: usize, h: usize) {
        let p = self.graph.problem;
        let [q, k, v, o, d_o, stats] =
            [Role::Q, Role::K, Role::V, Role::O, Role::DO, Role::Stats].map(|r| self.view(r));
        let [dq, dk, dv] = [Role::DQ, Role::DK, Role::DV].map(|r| self.view(r));
        // SAFETY (every load and store below): the caller's promise.
        let keys: Vec<Vec<f32>> = (0..p.tk).map(|j| unsafe { k.row(b, h, j, p.d) }).collect();
        let vals: Vec<Vec<f32>> = (0..p.tk).map(|j| unsafe { v.row(b, h, j, p.d) }).collect();
        let mut dk_acc = vec![vec![0f32; p.d]; p.tk];
        let mut dv_acc = vec![vec![0f32; p.d]; p.tk];
        for i in 0..p.tq {
            let qi = unsafe { q.row(b, h, i, p.d) };
            let doi = unsafe { d_o.row(b, h, i, p.d) };
            let oi = unsafe { o.row(b, h, i, p.d) };
            let lse = unsafe { load(DType::F32, stats.base, stats.at(b, h, i, 0)) };
            let di = dot(&doi, &oi);
            let mut dqi = vec![0f32; p.d];
            for j in self.kept(i) {
                let pij = (p.scale * dot(&qi, &keys[j]) - lse).exp();
                let ds = pij * (dot(&doi, &vals[j]) - di);
                for e in 0..p.d {
                    dqi[e] += p.scale * ds * keys[j][e];
                    dk_acc[j][e] += p.scale * ds * qi[e];
                    dv_acc[j][e] += pij * doi[e];
                }
            }
            for (e, x) in dqi.into_iter().enumerate() {
                unsafe { dq.put(b, h, i, e, x) };
            }
        }
        for j in 0..p.tk {
            for e in 0..p.d {
                unsafe {
                    dk.put(b, h, j, e, dk_acc[j][e]);
                    dv.put(b, h, j, e, dv_acc[j][e]);
                }
            }
        }
    }
}

/// The cost of one call: FLOPs on tensor cores, 4·d per kept (query, key) pair forward (q kᵀ
/// and p v) and 2.5× that backward (the usual count: s recomputed, dv, dp, dq, dk), each
/// operand read or written once.
pub(crate) fn sdpa_cost(g: &SdpaGraph) -> Call {
    let p = &g.problem;
    let pairs: usize = match g.mask {
        Some(m) => (0..p.tq)
            .map(|i| (m.shift + i as i64).clamp(0, p.tk as i64) as usize)
            .sum(),
        None => p.tq * p.tk,
    };
    let fwd_flops = 4 * p.b * p.h * p.d * pairs;
    let elem = p.dtype.size();
    let (q, kv) = (p.b * p.h * p.tq * p.d, p.b * p.h * p.tk * p.d);
    let stats = p.b * p.h * p.tq * 4;
    let (read, written, flops) = match g.pass {
        SdpaPass::Forward => ((q + 2 * kv) * elem, q * elem + stats, fwd_flops),
        SdpaPass::Backward => (
            (3 * q + 2 * kv) * elem + stats,
            (q + 2 * kv) * elem,
            fwd_flops * 5 / 2,
        ),
    };
    let key = format!(
        "{KEY_PREFIX} {} {} b{} h{} t{}x{} d{}{}",
        g.pass.name(),
        p.dtype,
        p.b,
        p.h,
        p.tq,
        p.tk,
        p.d,
        if g.mask.is_some() { " causal" } else { "" }
    );
    Call::new(
        key,
        OpClass::Attention,
        Traffic::bytes(read, written).with_tensor_flops(flops),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cudnn::sdpa::graph::{SdpaLayout, SdpaProblem};

    /// f64 attention of head-major [bh][t][d] rows: (o, lse, dq, dk, dv) for output grad `g`.
    #[allow(clippy::type_complexity)]
    fn reference(
        q: &[Vec<f64>],
        k: &[Vec<f64>],
        v: &[Vec<f64>],
        g: &[Vec<f64>],
        keep: impl Fn(usize, usize) -> bool,
        scale: f64,
    ) -> [Vec<Vec<f64>>; 5] {
        let d = q[0].len();
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let (mut o, mut lse) = (vec![vec![0.0; d]; q.len()], vec![vec![0.0]; q.len()]);
        let (mut dq, mut dk, mut dv) = (
            vec![vec![0.0; d]; q.len()],
            vec![vec![0.0; d]; k.len()],
            vec![vec![0.0; d]; k.len()],
        );
        for i in 0..q.len() {
            let js: Vec<usize> = (0..k.len()).filter(|&j| keep(i, j)).collect();
            let s: Vec<f64> = js.iter().map(|&j| scale * dot(&q[i], &k[j])).collect();
            let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let l = m + s.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            lse[i][0] = l;
            let p: Vec<f64> = s.iter().map(|x| (x - l).exp()).collect();
            for (&j, pj) in js.iter().zip(&p) {
                (0..d).for_each(|e| o[i][e] += pj * v[j][e]);
            }
            let di = dot(&g[i], &o[i]);
            for (&j, pj) in js.iter().zip(&p) {
                let ds = pj * (dot(&g[i], &v[j]) - di);
                for e in 0..d {
                    dq[i][e] += scale * ds * k[j][e];
                    dk[j][e] += scale * ds * q[i][e];
                    dv[j][e] += pj * g[i][e];
                }
            }
        }
        [o, lse, dq, dk, dv]
    }

    /// The job reads q, k, v out of a packed [b, t, 3, h, d] projection and writes o [b, t, h, d]
    /// and dq, dk, dv into a packed gradient, forward and backward, causal or not, bf16 and
    /// f16, head dims 64 and 128 with t not a multiple of any tile: against the f64 reference.
    #[test]
    fn packed_forward_and_backward_match_the_f64_reference() {
        for (dtype, d, causal, t) in [
            (DType::BF16, 64, true, 13),
            (DType::F16, 128, false, 7),
            (DType::F16, 64, true, 9),
            (DType::BF16, 128, false, 5),
        ] {
            let (b, h) = (2, 3);
            let p = SdpaProblem {
                b,
                h,
                tq: t,
                tk: t,
                d,
                dtype,
                causal,
                scale: 0.3,
            };
            let layout = SdpaLayout::packed(t, h, d);
            let c = h * d;
            let mut rng = 0x9e3779b97f4a7c15u64;
            let mut rand = || {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                (rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            };
            let n_qkv = b * t * 3 * c;
            let mut qkv = vec![0u8; n_qkv * dtype.size()];
            let mut g = vec![0u8; b * t * c * dtype.size()];
            let mut o = vec![0u8; b * t * c * dtype.size()];
            let mut dqkv = vec![0u8; n_qkv * dtype.size()];
            let mut stats = vec![0u8; b * h * t * 4];
            for i in 0..n_qkv {
                // SAFETY: in bounds of the host buffers.
                unsafe { store(dtype, qkv.as_mut_ptr() as u64, i, rand() as f32) };
            }
            for i in 0..b * t * c {
                unsafe { store(dtype, g.as_mut_ptr() as u64, i, rand() as f32) };
            }
            let (qb, gb) = (qkv.as_ptr() as u64, g.as_ptr() as u64);
            let esz = dtype.size() as u64;
            let (ob, sb, db) = (
                o.as_mut_ptr() as u64,
                stats.as_mut_ptr() as u64,
                dqkv.as_mut_ptr() as u64,
            );
            let fwd = Arc::new(SdpaGraph::build(&p, &layout, SdpaPass::Forward).unwrap());
            let bound = vec![
                (Role::Q, qb),
                (Role::K, qb + c as u64 * esz),
                (Role::V, qb + 2 * c as u64 * esz),
                (Role::O, ob),
                (Role::Stats, sb),
            ];
            // SAFETY: host buffers of the graph's extents.
            unsafe { SdpaJob::new(fwd, bound.clone()).run() };
            let bwd = Arc::new(SdpaGraph::build(&p, &layout, SdpaPass::Backward).unwrap());
            let mut bound_b = bound;
            bound_b.extend([
                (Role::DO, gb),
                (Role::DQ, db),
                (Role::DK, db + c as u64 * esz),
                (Role::DV, db + 2 * c as u64 * esz),
            ]);
            unsafe { SdpaJob::new(bwd, bound_b).run() };
            let rd = |base: u64, i: usize| unsafe { load(dtype, base, i) } as f64;
            let shift = p.causal_shift();
            for bi in 0..b {
                for hi in 0..h {
                    // Rows of head (bi, hi) in the packed layouts.
                    let rows = |base: u64, third: usize, width: usize| -> Vec<Vec<f64>> {
                        (0..t)
                            .map(|r| {
                                (0..d)
                                    .map(|e| {
                                        rd(base, (bi * t + r) * width + third * c + hi * d + e)
                                    })
                                    .collect()
                            })
                            .collect()
                    };
                    let (q, k, v) = (rows(qb, 0, 3 * c), rows(qb, 1, 3 * c), rows(qb, 2, 3 * c));
                    let gr = rows(gb, 0, c);
                    let keep = |i: usize, j: usize| !causal || (j as i64) < i as i64 + shift;
                    let [wo, wl, wdq, wdk, wdv] = reference(&q, &k, &v, &gr, keep, 0.3);
                    let got_l: Vec<Vec<f64>> = (0..t)
                        .map(
                            |r| vec![unsafe { load(DType::F32, sb, (bi * h + hi) * t + r) } as f64],
                        )
                        .collect();
                    let tol = if dtype == DType::BF16 { 3e-2 } else { 4e-3 };
                    for (what, got, want) in [
                        ("o", rows(ob, 0, c), wo),
                        ("stats", got_l, wl),
                        ("dq", rows(db, 0, 3 * c), wdq),
                        ("dk", rows(db, 1, 3 * c), wdk),
                        ("dv", rows(db, 2, 3 * c), wdv),
                    ] {
                        for (gr, wr) in got.iter().zip(&want) {
                            for (x, y) in gr.iter().zip(wr) {
                                assert!(
                                    (x - y).abs() <= tol * (1.0 + y.abs()),
                                    "{what} {dtype} d{d} causal {causal}: {x} vs {y}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// The composite graph is recognised back into the problem it was built from (packed and
    /// dense, both passes, causal or not); a graph off the pattern is declined with a reason.
    #[test]
    fn composite_graphs_are_recognised_and_others_declined() {
        use crate::cudnn::sdpa::composite::{CompositeGraph, OpKind, Red};
        for (causal, tq, tk, packed) in [
            (true, 128, 128, true),
            (false, 37, 100, false),
            (true, 5, 9, false),
        ] {
            let p = SdpaProblem {
                b: 2,
                h: 3,
                tq,
                tk,
                d: 64,
                dtype: DType::F16,
                causal,
                scale: 0.3,
            };
            let l = if packed {
                SdpaLayout::packed(tq, 3, 64)
            } else {
                SdpaLayout::dense(&p)
            };
            for pass in [SdpaPass::Forward, SdpaPass::Backward] {
                let c = CompositeGraph::build(&p, &l, pass).unwrap();
                // The same problem, operand views and mask (a forward's unused gradient
                // strides are not in its graph).
                let host = host_graph(&c).unwrap();
                let want = SdpaGraph::build(&p, &l, pass).unwrap();
                assert_eq!(
                    (host.problem, host.tensors, host.mask),
                    (want.problem, want.tensors, want.mask)
                );
            }
        }
        let p = SdpaProblem {
            b: 1,
            h: 2,
            tq: 64,
            tk: 64,
            d: 64,
            dtype: DType::BF16,
            causal: true,
            scale: 0.125,
        };
        let l = SdpaLayout::dense(&p);
        let good = CompositeGraph::build(&p, &l, SdpaPass::Forward).unwrap();
        let mut c = good.clone();
        let i = c.nodes.iter().position(|n| n.name == "row_max").unwrap();
        c.nodes[i].kind = OpKind::Reduction(Red::Add);
        let e = host_graph(&c).unwrap_err().to_string();
        assert!(
            e.contains("not the fused-attention pattern") && e.contains("node 6"),
            "{e}"
        );
        let mut c = good.clone();
        c.nodes.pop();
        assert!(host_graph(&c).unwrap_err().to_string().contains("13 nodes"));
        let mut c = good.clone();
        let t = c.tensors.iter_mut().find(|t| t.name == "p").unwrap();
        t.elem = Elem::Float;
        assert!(host_graph(&c).unwrap_err().to_string().contains("pattern"));
        let mut c = good;
        c.tensors.retain(|t| t.name != "attn_scale");
        assert!(host_graph(&c).unwrap_err().to_string().contains("scale"));
    }

    #[test]
    fn versions_parse_and_costs_count_the_kept_pairs() {
        assert_eq!(parse_version("9.13.0"), Some((9, 13, 0)));
        assert_eq!(parse_version("9.21"), Some((9, 21, 0)));
        assert_eq!(parse_version("9.x"), None);
        assert_eq!(parse_version("9.1.2.3"), None);
        let p = SdpaProblem {
            b: 2,
            h: 3,
            tq: 4,
            tk: 4,
            d: 64,
            dtype: DType::BF16,
            causal: true,
            scale: 0.125,
        };
        let g = SdpaGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Forward).unwrap();
        let c = sdpa_cost(&g);
        // Causal 4×4 keeps 1 + 2 + 3 + 4 = 10 pairs.
        assert_eq!(c.traffic.tensor_flops, 4 * 2 * 3 * 64 * 10);
        assert_eq!(c.traffic.read, (2 * 3 * 4 * 64 * 3 * 2) as u64);
        assert_eq!(
            c.traffic.written,
            (2 * 3 * 4 * 64 * 2 + 2 * 3 * 4 * 4) as u64
        );
        assert!(c.key.starts_with("cudnn sdpa fwd bf16") && c.key.ends_with("causal"));
        let g = SdpaGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Backward).unwrap();
        assert_eq!(
            sdpa_cost(&g).traffic.tensor_flops,
            4 * 2 * 3 * 64 * 10 * 5 / 2
        );
    }
}
