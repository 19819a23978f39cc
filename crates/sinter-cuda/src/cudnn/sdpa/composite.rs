//! Attention as cuDNN's *composite* fused-attention graph, as plain data: generic backend
//! operations (MATMUL, POINTWISE, REDUCTION, RESHAPE) that cuDNN's heuristics match to its fused
//! flash-attention engines. This is what runs where the loaded cuDNN is too old for the unified
//! SDPA_FWD / SDPA_BWD operations (`graph.rs`), and the only way to a causal backward (no
//! published release takes SDPA_BWD's mask subgraph). The node set and order follow the
//! composite lowering of NVIDIA's cudnn-frontend (`CompositeSDPANode` /
//! `CompositeSDPABackwardNode` in include/cudnn_frontend/node/scaled_dot_product_flash_attention.h,
//! the softmax of node/softmax.h, the causal band of node/diagonal_band_mask.h's composite form),
//! without dropout, bias, padding or alibi:
//!
//! ```text
//! forward:  S = Q·Kᵀ (fp32) → ×scale → [causal: row/col GEN_INDEX, row (+ tk−tq) ≥ col,
//!           BINARY_SELECT(S, −∞)] → M = max_j → E = exp(S − M) → L = Σ_j E →
//!           stats = M + log L (fp32, written) → P = E / L (io dtype) → O = P·V
//! backward: Σ = Σ_e dO∘O (×1, fp32 workspace) ; S = Q·Kᵀ ×scale − stats → [causal mask] →
//!           P = exp(S) ; dV = Pᵀ·dO ; dS = (dO·Vᵀ − Σ)∘P ×scale ; dK = dSᵀ·Q ;
//!           dQacc = dS·K (fp32 workspace) ; dQ = identity(dQacc)
//! ```
//!
//! K (and V in the backward) are bound as their transposes [b, h, d, t], as cuDNN's attention
//! matmuls take them: the same memory, dims and strides swapped. The backward's Σ and dQ
//! accumulator live in the workspace after the plan's own ([`CompositeGraph::workspace_bytes`]);
//! before cuDNN 9.6.0 the accumulator must be zeroed by the caller (the frontend memsets it).
//! Imports neither the backend nor the emulated device.

use super::graph::{Elem, Role, Scalar, SdpaLayout, SdpaPass, SdpaProblem, Version};
use crate::dtype::DType;
use crate::error::Result;

/// A pointwise operation's mode (cuDNN's CUDNN_POINTWISE_*).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pw {
    Mul,
    Add,
    Sub,
    Div,
    Exp,
    Log,
    /// The index along `axis` of each element of its input (2: row, 3: column).
    GenIndex(u8),
    CmpGe,
    /// y = t ? x : b (inputs x, b, t).
    BinarySelect,
    Identity,
}

/// A reduction's operator (cuDNN's CUDNN_REDUCE_TENSOR_*): over the dims the output lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Red {
    Max,
    Add,
}

/// What a node does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// Batched C = A·B over dims 0, 1; fp32 accumulation.
    Matmul,
    /// `compute` is the math precision (fp32, or int32 / boolean for the mask's index chain).
    Pointwise {
        mode: Pw,
        compute: Elem,
    },
    Reduction(Red),
    /// The same elements under other dims/strides (a transpose here).
    Reshape,
}

/// One operation: its inputs' and output's uids.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: &'static str,
    pub kind: OpKind,
    pub inputs: Vec<i64>,
    pub output: i64,
}

/// Where a tensor's data is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Binding {
    /// An operand the caller binds (q, k, v, o, stats, dO, dq, dk, dv).
    Device(Role),
    /// In the caller's workspace, at this byte offset past the plan's own workspace.
    Workspace(usize),
    /// Only inside the graph.
    Virtual,
    /// A scalar from host memory in the variant pack.
    ByValue(Scalar),
}

/// One tensor of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct CTensor {
    pub uid: i64,
    pub name: &'static str,
    pub elem: Elem,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    pub binding: Binding,
}

impl CTensor {
    pub fn is_virtual(&self) -> bool {
        self.binding == Binding::Virtual
    }
}

/// The composite graph of one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct CompositeGraph {
    pub pass: SdpaPass,
    pub problem: SdpaProblem,
    pub layout: SdpaLayout,
    pub tensors: Vec<CTensor>,
    /// In execution order: every input is a graph input or an earlier node's output.
    pub nodes: Vec<Node>,
}

/// Workspace tensors start at multiples of this (bytes).
const WS_ALIGN: usize = 256;

/// The first uid of tensors that are not device operands (those use [`Role::uid`], 1..=12).
const FIRST_INNER_UID: i64 = 200;

fn dense(d: [usize; 4]) -> [i64; 4] {
    [d[1] * d[2] * d[3], d[2] * d[3], d[3], 1].map(|x| x as i64)
}

fn i64s(v: [usize; 4]) -> [i64; 4] {
    v.map(|x| x as i64)
}

struct Builder {
    tensors: Vec<CTensor>,
    nodes: Vec<Node>,
    next_uid: i64,
    ws: usize,
}

impl Builder {
    fn add(&mut self, name: &'static str, elem: Elem, dims: [usize; 4], b: Binding) -> i64 {
        self.add_strided(name, elem, dims, dense(dims), b)
    }

    fn add_strided(
        &mut self,
        name: &'static str,
        elem: Elem,
        dims: [usize; 4],
        strides: [i64; 4],
        binding: Binding,
    ) -> i64 {
        let uid = match binding {
            Binding::Device(r) => r.uid(),
            _ => {
                self.next_uid += 1;
                self.next_uid - 1
            }
        };
        self.tensors.push(CTensor {
            uid,
            name,
            elem,
            dims: i64s(dims),
            strides,
            binding,
        });
        uid
    }

    fn value(&mut self, name: &'static str, v: Scalar) -> i64 {
        let elem = match v {
            Scalar::F32(_) => Elem::Float,
            Scalar::I32(_) => Elem::Int32,
        };
        self.add(name, elem, [1; 4], Binding::ByValue(v))
    }

    /// A dense fp32 tensor in the workspace.
    fn workspace(&mut self, name: &'static str, dims: [usize; 4]) -> i64 {
        let at = self.ws;
        self.ws += (dims.iter().product::<usize>() * 4).div_ceil(WS_ALIGN) * WS_ALIGN;
        self.add(name, Elem::Float, dims, Binding::Workspace(at))
    }

    fn node(&mut self, name: &'static str, kind: OpKind, inputs: &[i64], output: i64) {
        self.nodes.push(Node {
            name,
            kind,
            inputs: inputs.to_vec(),
            output,
        });
    }

    /// A pointwise node with a new virtual output.
    fn pw(
        &mut self,
        name: &'static str,
        mode: Pw,
        inputs: &[i64],
        elem: Elem,
        dims: [usize; 4],
    ) -> i64 {
        let out = self.add(name, elem, dims, Binding::Virtual);
        let compute = if elem == Elem::Float || matches!(mode, Pw::BinarySelect) {
            Elem::Float
        } else {
            elem
        };
        self.node(name, OpKind::Pointwise { mode, compute }, inputs, out);
        out
    }

    fn reduce(&mut self, name: &'static str, r: Red, x: i64, dims: [usize; 4]) -> i64 {
        let out = self.add(name, Elem::Float, dims, Binding::Virtual);
        self.node(name, OpKind::Reduction(r), &[x], out);
        out
    }

    /// A matmul with a new virtual fp32 output.
    fn matmul(&mut self, name: &'static str, a: i64, b: i64, dims: [usize; 4]) -> i64 {
        let out = self.add(name, Elem::Float, dims, Binding::Virtual);
        self.node(name, OpKind::Matmul, &[a, b], out);
        out
    }

    /// The causal mask on scores `s` [b, h, tq, tk]: keep (i, j) iff i + tk − tq ≥ j (sinter's
    /// bottom-right rule), else −∞. The frontend's composite DiagonalBandMask: int32 row and
    /// column indices, the row shifted by a by-value int32 when tq ≠ tk, CMP_GE to a boolean,
    /// BINARY_SELECT.
    fn causal_mask(&mut self, p: &SdpaProblem, s: i64, sd: [usize; 4]) -> i64 {
        let mut row = self.pw("row_index", Pw::GenIndex(2), &[s], Elem::Int32, sd);
        let col = self.pw("col_index", Pw::GenIndex(3), &[s], Elem::Int32, sd);
        if p.tk != p.tq {
            let shift = self.value("row_shift", Scalar::I32((p.tk - p.tq) as i32));
            row = self.pw("row_shifted", Pw::Add, &[row, shift], Elem::Int32, sd);
        }
        let keep = self.pw("row_ge_col", Pw::CmpGe, &[row, col], Elem::Boolean, sd);
        let fill = self.value("neg_inf", Scalar::F32(f32::NEG_INFINITY));
        self.pw(
            "causal_select",
            Pw::BinarySelect,
            &[s, fill, keep],
            Elem::Float,
            sd,
        )
    }
}

/// [b, h, t, d] strides → the transposed view's [b, h, d, t] strides.
fn transposed(s: [usize; 3]) -> [i64; 4] {
    [s[0] as i64, s[1] as i64, 1, s[2] as i64]
}

/// [b, h, t, d] strides of a view whose last dim is contiguous.
fn rows(s: [usize; 3]) -> [i64; 4] {
    [s[0] as i64, s[1] as i64, s[2] as i64, 1]
}

impl CompositeGraph {
    /// The graph of one pass (the problem validated first).
    pub fn build(p: &SdpaProblem, layout: &SdpaLayout, pass: SdpaPass) -> Result<CompositeGraph> {
        p.validate()?;
        let io = match p.dtype {
            DType::F16 => Elem::Half,
            _ => Elem::BFloat16,
        };
        let mut g = Builder {
            tensors: Vec::new(),
            nodes: Vec::new(),
            next_uid: FIRST_INNER_UID,
            ws: 0,
        };
        match pass {
            SdpaPass::Forward => forward(&mut g, p, layout, io),
            SdpaPass::Backward => backward(&mut g, p, layout, io),
        }
        Ok(CompositeGraph {
            pass,
            problem: *p,
            layout: *layout,
            tensors: g.tensors,
            nodes: g.nodes,
        })
    }

    pub fn tensor(&self, uid: i64) -> Option<&CTensor> {
        self.tensors.iter().find(|t| t.uid == uid)
    }

    /// Bytes of workspace the graph's own tensors take (after the plan's workspace).
    pub fn workspace_bytes(&self) -> usize {
        self.tensors
            .iter()
            .filter_map(|t| match t.binding {
                Binding::Workspace(at) => {
                    let n: i64 = t.dims.iter().product();
                    Some(at + (n as usize * 4).div_ceil(WS_ALIGN) * WS_ALIGN)
                }
                _ => None,
            })
            .max()
            .unwrap_or(0)
    }

    /// The workspace tensors the caller must zero before running (the dQ accumulator, which
    /// cuDNN before 9.6.0 does not clear itself): (byte offset, bytes).
    pub fn zeroed_workspace(&self) -> Vec<(usize, usize)> {
        self.tensors
            .iter()
            .filter(|t| t.name == "dq_accum")
            .filter_map(|t| match t.binding {
                Binding::Workspace(at) => Some((at, t.dims.iter().product::<i64>() as usize * 4)),
                _ => None,
            })
            .collect()
    }

    /// The by-value scalars: (uid, value).
    pub fn scalars(&self) -> Vec<(i64, Scalar)> {
        self.tensors
            .iter()
            .filter_map(|t| match t.binding {
                Binding::ByValue(v) => Some((t.uid, v)),
                _ => None,
            })
            .collect()
    }
}

fn forward(g: &mut Builder, p: &SdpaProblem, l: &SdpaLayout, io: Elem) {
    let (b, h, tq, tk, d) = (p.b, p.h, p.tq, p.tk, p.d);
    let (sd, row) = ([b, h, tq, tk], [b, h, tq, 1]);
    let q = g.add_strided("q", io, [b, h, tq, d], rows(l.q), Binding::Device(Role::Q));
    let kt = g.add_strided(
        "k_t",
        io,
        [b, h, d, tk],
        transposed(l.k),
        Binding::Device(Role::K),
    );
    let v = g.add_strided("v", io, [b, h, tk, d], rows(l.v), Binding::Device(Role::V));
    let s = g.matmul("bmm1", q, kt, sd);
    let scale = g.value("attn_scale", Scalar::F32(p.scale));
    let mut s = g.pw("scaled", Pw::Mul, &[s, scale], Elem::Float, sd);
    if p.causal {
        s = g.causal_mask(p, s, sd);
    }
    let m = g.reduce("row_max", Red::Max, s, row);
    let centred = g.pw("sub_max", Pw::Sub, &[s, m], Elem::Float, sd);
    let e = g.pw("exp", Pw::Exp, &[centred], Elem::Float, sd);
    let sum = g.reduce("row_sum", Red::Add, e, row);
    let log = g.pw("log_sum", Pw::Log, &[sum], Elem::Float, row);
    let stats = g.add_strided(
        "stats",
        Elem::Float,
        row,
        i64s([h * tq, tq, 1, 1]),
        Binding::Device(Role::Stats),
    );
    let add = OpKind::Pointwise {
        mode: Pw::Add,
        compute: Elem::Float,
    };
    g.node("stats", add, &[m, log], stats);
    // P in the io dtype: what the fused engine's second matmul reads.
    let prob = g.add("p", io, sd, Binding::Virtual);
    let div = OpKind::Pointwise {
        mode: Pw::Div,
        compute: Elem::Float,
    };
    g.node("softmax", div, &[e, sum], prob);
    let o = g.add_strided("o", io, [b, h, tq, d], rows(l.o), Binding::Device(Role::O));
    g.node("bmm2", OpKind::Matmul, &[prob, v], o);
}

fn backward(g: &mut Builder, p: &SdpaProblem, l: &SdpaLayout, io: Elem) {
    let (b, h, tq, tk, d) = (p.b, p.h, p.tq, p.tk, p.d);
    let (sd, row, qd) = ([b, h, tq, tk], [b, h, tq, 1], [b, h, tq, d]);
    let dev = Binding::Device;
    let q = g.add_strided("q", io, qd, rows(l.q), dev(Role::Q));
    let kt = g.add_strided("k_t", io, [b, h, d, tk], transposed(l.k), dev(Role::K));
    let vt = g.add_strided("v_t", io, [b, h, d, tk], transposed(l.v), dev(Role::V));
    let o = g.add_strided("o", io, qd, rows(l.o), dev(Role::O));
    let d_o = g.add_strided("d_o", io, qd, rows(l.d_o), dev(Role::DO));
    let stats = g.add_strided(
        "stats",
        Elem::Float,
        row,
        i64s([h * tq, tq, 1, 1]),
        dev(Role::Stats),
    );
    let f32pw = |mode| OpKind::Pointwise {
        mode,
        compute: Elem::Float,
    };
    // Σ_i = Σ_e dO ∘ O, kept in the workspace (the dropout-scale multiply by 1 is the
    // frontend's pattern, kept so the engines match it).
    let dodo = g.pw("mul_do_o", Pw::Mul, &[d_o, o], Elem::Float, qd);
    let dsum = g.reduce("sum_do_o", Red::Add, dodo, row);
    let one = g.value("one", Scalar::F32(1.0));
    let softmax_sum = g.workspace("softmax_sum", row);
    g.node("softmax_sum", f32pw(Pw::Mul), &[dsum, one], softmax_sum);
    // P recomputed from the forward's log-sum-exp.
    let s = g.matmul("bmm_q_kt", q, kt, sd);
    let scale = g.value("attn_scale", Scalar::F32(p.scale));
    let s = g.pw("scaled", Pw::Mul, &[s, scale], Elem::Float, sd);
    let mut s = g.pw("sub_stats", Pw::Sub, &[s, stats], Elem::Float, sd);
    if p.causal {
        s = g.causal_mask(p, s, sd);
    }
    let prob = g.pw("exp", Pw::Exp, &[s], Elem::Float, sd);
    let t_sd = [b, h, tk, tq];
    let t_str = i64s([h * tq * tk, tq * tk, 1, tk]);
    let p_t = g.add_strided("p_t", io, t_sd, t_str, Binding::Virtual);
    g.node("p_t", OpKind::Reshape, &[prob], p_t);
    let kd = [b, h, tk, d];
    let dv = g.add_strided("dv", io, kd, rows(l.dv), dev(Role::DV));
    g.node("bmm_pt_do", OpKind::Matmul, &[p_t, d_o], dv);
    let dp = g.matmul("bmm_do_vt", d_o, vt, sd);
    let x = g.pw(
        "sub_softmax_sum",
        Pw::Sub,
        &[dp, softmax_sum],
        Elem::Float,
        sd,
    );
    let x = g.pw("mul_p", Pw::Mul, &[x, prob], Elem::Float, sd);
    let ds = g.pw("ds", Pw::Mul, &[x, scale], Elem::Float, sd);
    let ds_t = g.add_strided("ds_t", io, t_sd, t_str, Binding::Virtual);
    g.node("ds_t", OpKind::Reshape, &[ds], ds_t);
    let dk = g.add_strided("dk", io, kd, rows(l.dk), dev(Role::DK));
    g.node("bmm_dst_q", OpKind::Matmul, &[ds_t, q], dk);
    let k = g.add_strided("k", io, kd, rows(l.k), Binding::Virtual);
    g.node("k", OpKind::Reshape, &[kt], k);
    let dq_acc = g.workspace("dq_accum", qd);
    g.node("bmm_ds_k", OpKind::Matmul, &[ds, k], dq_acc);
    let dq = g.add_strided("dq", io, qd, rows(l.dq), dev(Role::DQ));
    g.node("dq", f32pw(Pw::Identity), &[dq_acc], dq);
}

/// The first cuDNN release sinter builds the composite graph for. cuDNN 8.9 took it too, with
/// the frontend working around its bugs (s_kv not a multiple of 64 needed an extra padding
/// mask before 9.0.0); sinter declines those releases instead.
pub const COMPOSITE_MIN: Version = (9, 0, 0);

/// Whether cuDNN `loaded` takes the composite graph of `pass` for `p` (already known to be a
/// problem fused attention covers: [`SdpaProblem::supported`]). The rules are cudnn-frontend's
/// (node/scaled_dot_product_flash_attention.h and node/sdpa_support_surface.h):
/// - 9.10.0 and 9.10.1 have known fp16/bf16 SDPA bugs, forward and backward: declined;
/// - a bottom-right causal mask with tq ≠ tk needs tq and tk multiples of 64 before 9.6.0;
/// - the backward needs tk a multiple of 128 up to 9.15.x (the frontend adds a padding mask
///   there as a workaround; sinter declines) and rejects tq = tk = 1.
pub fn composite_supports(
    loaded: Option<Version>,
    p: &SdpaProblem,
    pass: SdpaPass,
) -> std::result::Result<(), String> {
    let Some(v) = loaded else {
        return Err("libcudnn is not loadable".into());
    };
    let ver = format!("cuDNN {}.{}.{}", v.0, v.1, v.2);
    if v < COMPOSITE_MIN {
        let m = COMPOSITE_MIN;
        return Err(format!(
            "{ver} is older than {}.{}.{}, the first sinter builds the composite attention graph for",
            m.0, m.1, m.2
        ));
    }
    if v.0 == 9 && v.1 == 10 && v.2 < 2 {
        return Err(format!(
            "{ver} has known fused-attention bugs (cudnn-frontend declines 9.10.0/9.10.1)"
        ));
    }
    if p.causal
        && p.tq != p.tk
        && v < (9, 6, 0)
        && (!p.tq.is_multiple_of(64) || !p.tk.is_multiple_of(64))
    {
        return Err(format!(
            "{ver}: a causal mask with {} queries and {} keys needs both multiples of 64 before 9.6.0",
            p.tq, p.tk
        ));
    }
    if pass == SdpaPass::Backward {
        if p.tq == 1 && p.tk == 1 {
            return Err("the fused backward rejects tq = tk = 1".into());
        }
        if !p.tk.is_multiple_of(128) && v < (9, 16, 0) {
            return Err(format!(
                "{ver}: the composite backward needs the key count ({}) a multiple of 128 before 9.16.0",
                p.tk
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prob(causal: bool, tq: usize, tk: usize) -> SdpaProblem {
        SdpaProblem {
            b: 2,
            h: 3,
            tq,
            tk,
            d: 64,
            dtype: DType::BF16,
            causal,
            scale: 0.125,
        }
    }

    fn kinds(g: &CompositeGraph) -> Vec<(&'static str, OpKind)> {
        g.nodes.iter().map(|n| (n.name, n.kind)).collect()
    }

    fn pw(mode: Pw) -> OpKind {
        OpKind::Pointwise {
            mode,
            compute: Elem::Float,
        }
    }

    fn int(mode: Pw) -> OpKind {
        OpKind::Pointwise {
            mode,
            compute: Elem::Int32,
        }
    }

    /// Every uid is unique, every node's inputs exist and are produced before use (or are
    /// graph inputs), every virtual tensor is produced by exactly one node, and every device
    /// output too.
    fn check_wiring(g: &CompositeGraph) {
        let uids: std::collections::HashSet<i64> = g.tensors.iter().map(|t| t.uid).collect();
        assert_eq!(uids.len(), g.tensors.len(), "uids unique");
        let mut made = std::collections::HashSet::new();
        for n in &g.nodes {
            for i in &n.inputs {
                let t = g.tensor(*i).expect("input exists");
                if t.is_virtual() || matches!(t.binding, Binding::Workspace(_)) {
                    assert!(
                        made.contains(i),
                        "{} reads {} before it is made",
                        n.name,
                        t.name
                    );
                }
            }
            assert!(made.insert(n.output), "{} made twice", n.output);
        }
        for t in &g.tensors {
            if t.is_virtual() {
                assert!(made.contains(&t.uid), "virtual {} is made", t.name);
            }
        }
    }

    #[test]
    fn forward_nodes_and_tensors() {
        let p = prob(true, 1024, 1024);
        let l = SdpaLayout::packed(1024, 3, 64);
        let g = CompositeGraph::build(&p, &l, SdpaPass::Forward).unwrap();
        use OpKind::{Matmul, Reduction};
        assert_eq!(
            kinds(&g),
            [
                ("bmm1", Matmul),
                ("scaled", pw(Pw::Mul)),
                ("row_index", int(Pw::GenIndex(2))),
                ("col_index", int(Pw::GenIndex(3))),
                (
                    "row_ge_col",
                    OpKind::Pointwise {
                        mode: Pw::CmpGe,
                        compute: Elem::Boolean
                    }
                ),
                ("causal_select", pw(Pw::BinarySelect)),
                ("row_max", Reduction(Red::Max)),
                ("sub_max", pw(Pw::Sub)),
                ("exp", pw(Pw::Exp)),
                ("row_sum", Reduction(Red::Add)),
                ("log_sum", pw(Pw::Log)),
                ("stats", pw(Pw::Add)),
                ("softmax", pw(Pw::Div)),
                ("bmm2", Matmul),
            ]
        );
        check_wiring(&g);
        let by = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap();
        let row = 3 * 3 * 64;
        // Q and K read in place from the packed [b, t, 3, h, d] projection; K transposed.
        let q = by("q");
        assert_eq!(
            (q.dims, q.strides),
            ([2, 3, 1024, 64], [1024 * row, 64, row, 1])
        );
        assert_eq!(
            (q.elem, q.binding),
            (Elem::BFloat16, Binding::Device(Role::Q))
        );
        let kt = by("k_t");
        assert_eq!(
            (kt.dims, kt.strides),
            ([2, 3, 64, 1024], [1024 * row, 64, 1, row])
        );
        assert_eq!(kt.uid, Role::K.uid());
        let o = by("o");
        assert_eq!(
            (o.dims, o.strides),
            ([2, 3, 1024, 64], [1024 * 192, 64, 192, 1])
        );
        let s = by("bmm1");
        assert_eq!((s.elem, s.is_virtual()), (Elem::Float, true));
        assert_eq!(s.strides, [3 * 1024 * 1024, 1024 * 1024, 1024, 1]);
        let st = by("stats");
        assert_eq!(
            (st.dims, st.strides),
            ([2, 3, 1024, 1], [3 * 1024, 1024, 1, 1])
        );
        assert_eq!(
            (st.elem, st.binding),
            (Elem::Float, Binding::Device(Role::Stats))
        );
        assert_eq!(by("row_max").dims, [2, 3, 1024, 1]);
        assert_eq!(
            (by("row_index").elem, by("row_ge_col").elem),
            (Elem::Int32, Elem::Boolean)
        );
        // P in the io dtype for the second matmul.
        assert_eq!((by("p").elem, by("p").is_virtual()), (Elem::BFloat16, true));
        assert_eq!(
            by("attn_scale").binding,
            Binding::ByValue(Scalar::F32(0.125))
        );
        assert_eq!(
            by("neg_inf").binding,
            Binding::ByValue(Scalar::F32(f32::NEG_INFINITY))
        );
        // Square: no row shift. Forward needs no workspace of its own.
        assert!(g.tensors.iter().all(|t| t.name != "row_shift"));
        assert_eq!(g.workspace_bytes(), 0);
        let devices: Vec<i64> = g
            .tensors
            .iter()
            .filter(|t| matches!(t.binding, Binding::Device(_)))
            .map(|t| t.uid)
            .collect();
        assert_eq!(devices, [1, 2, 3, 5, 4]);
    }

    #[test]
    fn the_mask_is_there_only_when_causal_and_shifts_for_more_keys() {
        let p = prob(false, 37, 37);
        let g = CompositeGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Forward).unwrap();
        let masks = |g: &CompositeGraph| {
            g.nodes
                .iter()
                .filter(|n| {
                    matches!(
                        n.kind,
                        OpKind::Pointwise {
                            mode: Pw::GenIndex(_) | Pw::CmpGe | Pw::BinarySelect,
                            ..
                        }
                    )
                })
                .count()
        };
        assert_eq!(masks(&g), 0);
        assert_eq!(g.nodes.len(), 10);
        let p = prob(true, 37, 100);
        let g = CompositeGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Backward).unwrap();
        assert_eq!(masks(&g), 4);
        let shift = g.tensors.iter().find(|t| t.name == "row_shift").unwrap();
        assert_eq!(shift.binding, Binding::ByValue(Scalar::I32(63)));
        let n = g.nodes.iter().find(|n| n.name == "row_shifted").unwrap();
        assert_eq!(n.kind, int(Pw::Add));
        check_wiring(&g);
    }

    #[test]
    fn backward_nodes_tensors_and_workspace() {
        let p = prob(true, 256, 256);
        let l = SdpaLayout::packed(256, 3, 64);
        let g = CompositeGraph::build(&p, &l, SdpaPass::Backward).unwrap();
        use OpKind::{Matmul, Reduction, Reshape};
        assert_eq!(
            kinds(&g),
            [
                ("mul_do_o", pw(Pw::Mul)),
                ("sum_do_o", Reduction(Red::Add)),
                ("softmax_sum", pw(Pw::Mul)),
                ("bmm_q_kt", Matmul),
                ("scaled", pw(Pw::Mul)),
                ("sub_stats", pw(Pw::Sub)),
                ("row_index", int(Pw::GenIndex(2))),
                ("col_index", int(Pw::GenIndex(3))),
                (
                    "row_ge_col",
                    OpKind::Pointwise {
                        mode: Pw::CmpGe,
                        compute: Elem::Boolean
                    }
                ),
                ("causal_select", pw(Pw::BinarySelect)),
                ("exp", pw(Pw::Exp)),
                ("p_t", Reshape),
                ("bmm_pt_do", Matmul),
                ("bmm_do_vt", Matmul),
                ("sub_softmax_sum", pw(Pw::Sub)),
                ("mul_p", pw(Pw::Mul)),
                ("ds", pw(Pw::Mul)),
                ("ds_t", Reshape),
                ("bmm_dst_q", Matmul),
                ("k", Reshape),
                ("bmm_ds_k", Matmul),
                ("dq", pw(Pw::Identity)),
            ]
        );
        check_wiring(&g);
        let by = |name: &str| g.tensors.iter().find(|t| t.name == name).unwrap();
        let row = 3 * 3 * 64;
        assert_eq!(by("v_t").strides, [256 * row, 64, 1, row]);
        assert_eq!(by("v_t").uid, Role::V.uid());
        assert_eq!(by("d_o").strides, [256 * 192, 64, 192, 1]);
        for name in ["dq", "dk", "dv"] {
            let t = by(name);
            assert_eq!(
                (t.dims, t.strides),
                ([2, 3, 256, 64], [256 * row, 64, row, 1])
            );
            assert_eq!(t.elem, Elem::BFloat16);
        }
        // The transposes: P and dS as [b, h, tk, tq] in the io dtype over the scores' memory
        // order; K back from its transposed binding.
        let pt = by("p_t");
        assert_eq!(
            (pt.dims, pt.strides),
            ([2, 3, 256, 256], [3 * 65536, 65536, 1, 256])
        );
        assert_eq!((pt.elem, pt.is_virtual()), (Elem::BFloat16, true));
        assert_eq!(by("k").strides, [256 * row, 64, row, 1]);
        assert_eq!(by("ds").elem, Elem::Float);
        // Workspace: Σ [b, h, tq, 1] fp32 then the fp32 dQ accumulator, 256-byte aligned.
        let ss = by("softmax_sum");
        assert_eq!(
            (ss.binding, ss.dims),
            (Binding::Workspace(0), [2, 3, 256, 1])
        );
        let acc = by("dq_accum");
        assert_eq!(acc.binding, Binding::Workspace(2 * 3 * 256 * 4));
        assert_eq!(acc.strides, [3 * 256 * 64, 256 * 64, 64, 1]);
        assert_eq!(g.workspace_bytes(), 2 * 3 * 256 * 4 + 2 * 3 * 256 * 64 * 4);
        assert_eq!(
            g.zeroed_workspace(),
            [(2 * 3 * 256 * 4, 2 * 3 * 256 * 64 * 4)]
        );
        let scalars: Vec<Scalar> = g.scalars().into_iter().map(|s| s.1).collect();
        assert_eq!(
            scalars,
            [
                Scalar::F32(1.0),
                Scalar::F32(0.125),
                Scalar::F32(f32::NEG_INFINITY)
            ]
        );
    }

    #[test]
    fn composite_version_rules() {
        use SdpaPass::{Backward as B, Forward as F};
        let sq = prob(true, 1024, 1024);
        assert!(composite_supports(None, &sq, F).is_err());
        assert!(composite_supports(Some((8, 9, 7)), &sq, F)
            .unwrap_err()
            .contains("9.0.0"));
        composite_supports(Some((9, 0, 0)), &sq, F).unwrap();
        composite_supports(Some((9, 14, 0)), &sq, B).unwrap();
        assert!(composite_supports(Some((9, 10, 1)), &sq, F)
            .unwrap_err()
            .contains("known"));
        composite_supports(Some((9, 10, 2)), &sq, B).unwrap();
        let odd = prob(true, 37, 100);
        assert!(composite_supports(Some((9, 5, 1)), &odd, F)
            .unwrap_err()
            .contains("multiples of 64"));
        composite_supports(Some((9, 6, 0)), &odd, F).unwrap();
        assert!(composite_supports(Some((9, 14, 0)), &odd, B)
            .unwrap_err()
            .contains("multiple of 128"));
        composite_supports(Some((9, 16, 0)), &odd, B).unwrap();
        assert!(composite_supports(Some((9, 22, 0)), &prob(false, 1, 1), B).is_err());
    }
}
