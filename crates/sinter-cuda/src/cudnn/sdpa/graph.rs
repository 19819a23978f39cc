//! What one cuDNN fused attention call is, as plain data: the problem ([`SdpaProblem`]), where
//! its operands live ([`SdpaLayout`]: [batch, head, row] strides of views whose last dim is
//! contiguous), and the graph built from them ([`SdpaGraph`]: tensors with uids, dims, strides
//! and types, one SDPA_FWD or SDPA_BWD operation, and for causal attention a diagonal-band mask
//! on the scores). The real backend (`backend.rs`) turns a graph into cuDNN descriptors; the
//! emulated device (`emulated::sdpa`) executes the same graph on the host. Imports neither.

use crate::dtype::DType;
use crate::error::{CudaError, Result};

/// Forward (o and the softmax stats from q, k, v) or backward (dq, dk, dv from q, k, v, o, dO
/// and the stats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SdpaPass {
    Forward,
    Backward,
}

impl SdpaPass {
    pub fn name(self) -> &'static str {
        match self {
            SdpaPass::Forward => "fwd",
            SdpaPass::Backward => "bwd",
        }
    }
}

/// softmax(scale · q kᵀ [+ causal mask]) v for q [b, h, tq, d], k and v [b, h, tk, d] in
/// `dtype` (f16 or bf16), fp32 softmax statistics, no dropout. Causal masking is aligned
/// bottom-right (query i sees keys 0..=i + tk − tq), sinter's rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SdpaProblem {
    pub b: usize,
    pub h: usize,
    pub tq: usize,
    pub tk: usize,
    pub d: usize,
    pub dtype: DType,
    pub causal: bool,
    pub scale: f32,
}

/// The head dims cuDNN's fused attention takes on sm80/sm90 for both passes: multiples of 8
/// up to 128 (cuDNN's "fused flash attention" support table; larger ones are forward-only or
/// Blackwell-only, so sinter declines them and its flash kernel or the composite runs).
pub const MAX_HEAD_DIM: usize = 128;

impl SdpaProblem {
    /// Checks what the graph needs; an error names the field. Problems cuDNN cannot take
    /// (fp32, head dims outside the table, causal rows that see no key) are errors too: the
    /// caller asks [`SdpaProblem::supported`] first and falls back.
    pub fn validate(&self) -> Result<()> {
        let op = "cudnn sdpa";
        if let Err(why) = self.supported() {
            return Err(CudaError::invalid(op, why));
        }
        for (what, v) in [
            ("b", self.b),
            ("h", self.h),
            ("tq", self.tq),
            ("tk", self.tk),
        ] {
            if v == 0 || i32::try_from(v).is_err() {
                return Err(CudaError::invalid(
                    op,
                    format!("{what} = {v} must be in 1..=i32::MAX"),
                ));
            }
        }
        if !self.scale.is_finite() {
            return Err(CudaError::invalid(
                op,
                format!("scale {} is not finite", self.scale),
            ));
        }
        Ok(())
    }

    /// Whether cuDNN's fused attention covers this problem (independent of the cuDNN version).
    pub fn supported(&self) -> std::result::Result<(), String> {
        if [self.b, self.h, self.tq, self.tk].contains(&0) {
            return Err(format!(
                "an empty problem (b {}, h {}, tq {}, tk {})",
                self.b, self.h, self.tq, self.tk
            ));
        }
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Err(format!("needs f16 or bf16, got {}", self.dtype));
        }
        if self.d == 0 || !self.d.is_multiple_of(8) || self.d > MAX_HEAD_DIM {
            return Err(format!(
                "head dim {} is not a multiple of 8 in 8..={MAX_HEAD_DIM}",
                self.d
            ));
        }
        if self.causal && self.tq > self.tk {
            // Rows that see no key: sinter defines them as 0; what cuDNN writes there is not
            // documented, so those calls stay with sinter's kernels.
            return Err(format!(
                "causal with more queries ({}) than keys ({})",
                self.tq, self.tk
            ));
        }
        Ok(())
    }

    /// The diagonal-band shift that keeps score (i, j) iff j < i + shift: sinter's bottom-right
    /// causal rule (query i sees keys 0..=i + tk − tq).
    pub fn causal_shift(&self) -> i64 {
        self.tk as i64 - self.tq as i64 + 1
    }
}

/// [batch, head, row] strides in elements of a [b, h, t, d] view whose last dim is contiguous.
pub type Strides = [usize; 3];

/// Where each operand lives. The forward reads q, k, v and writes o; the backward also reads
/// `d_o` and writes dq, dk, dv (their strides are unused by the forward).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SdpaLayout {
    pub q: Strides,
    pub k: Strides,
    pub v: Strides,
    pub o: Strides,
    pub d_o: Strides,
    pub dq: Strides,
    pub dk: Strides,
    pub dv: Strides,
}

impl SdpaLayout {
    /// q, k and v as the thirds of a packed projection [b, t, 3, h, d] (GPT-2's c_attn output,
    /// read in place: the pointers of k and v are h·d elements past q's), o and dO as
    /// [b, t, h, d] (what the output projection reads), dq, dk and dv as the thirds of dqkv.
    pub fn packed(t: usize, h: usize, d: usize) -> SdpaLayout {
        let row = 3 * h * d;
        let qkv = [t * row, d, row];
        let merged = [t * h * d, d, h * d];
        SdpaLayout {
            q: qkv,
            k: qkv,
            v: qkv,
            o: merged,
            d_o: merged,
            dq: qkv,
            dk: qkv,
            dv: qkv,
        }
    }

    /// Every operand a contiguous [b, h, t, d] tensor.
    pub fn dense(p: &SdpaProblem) -> SdpaLayout {
        let (q, kv) = (
            [p.h * p.tq * p.d, p.tq * p.d, p.d],
            [p.h * p.tk * p.d, p.tk * p.d, p.d],
        );
        SdpaLayout {
            q,
            k: kv,
            v: kv,
            o: q,
            d_o: q,
            dq: q,
            dk: kv,
            dv: kv,
        }
    }
}

/// What a tensor of the graph is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Q,
    K,
    V,
    O,
    /// fp32 log-sum-exp of each query row's scaled, masked scores, [b, h, tq, 1].
    Stats,
    /// The softmax scale, passed by value.
    Scale,
    DO,
    DQ,
    DK,
    DV,
    /// The scaled scores entering the mask subgraph (virtual: never in memory).
    Scores,
    /// The masked scores leaving it (virtual).
    MaskedScores,
    /// The band's right-bound shift, an int32 by value.
    RightBound,
    /// What masked scores become (−∞), an fp32 by value.
    Fill,
}

impl Role {
    /// The uid of this role's tensor: fixed, so that variant packs need no lookup.
    pub fn uid(self) -> i64 {
        match self {
            Role::Q => 1,
            Role::K => 2,
            Role::V => 3,
            Role::O => 4,
            Role::Stats => 5,
            Role::Scale => 6,
            Role::DO => 7,
            Role::DQ => 8,
            Role::DK => 9,
            Role::DV => 10,
            Role::RightBound => 11,
            Role::Fill => 12,
            Role::Scores => 100,
            Role::MaskedScores => 101,
        }
    }
}

/// A tensor's element type in the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Half,
    BFloat16,
    Float,
    Int32,
    /// The composite graph's mask predicate.
    Boolean,
}

/// A scalar passed by value (from host memory, in the variant pack).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scalar {
    F32(f32),
    I32(i32),
}

/// One tensor of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub uid: i64,
    pub role: Role,
    pub elem: Elem,
    pub dims: [i64; 4],
    pub strides: [i64; 4],
    /// Only inside the graph (the mask's scores): never bound to memory.
    pub is_virtual: bool,
    /// Passed by value: its value (scale, band bound, fill).
    pub value: Option<Scalar>,
}

/// The causal mask as cuDNN's DIAGONAL_BAND_MASK operation on the scaled scores: score (i, j)
/// is kept iff j < i + `shift` (comparison "less than" against the shifted right bound), else
/// replaced by the fill (−∞). With shift = tk − tq + 1 that is sinter's bottom-right rule.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BandMask {
    pub shift: i64,
}

impl BandMask {
    /// Whether score (i, j) survives the mask.
    pub fn keeps(&self, i: usize, j: usize) -> bool {
        (j as i64) < i as i64 + self.shift
    }
}

/// One SDPA_FWD or SDPA_BWD operation and its tensors (dropout: none).
#[derive(Clone, Debug, PartialEq)]
pub struct SdpaGraph {
    pub pass: SdpaPass,
    pub problem: SdpaProblem,
    pub layout: SdpaLayout,
    pub tensors: Vec<TensorSpec>,
    /// The score-modifier subgraph: the causal band mask, or None.
    pub mask: Option<BandMask>,
}

fn i64s<const N: usize>(v: [usize; N]) -> [i64; N] {
    v.map(|x| x as i64)
}

impl SdpaGraph {
    /// The graph of one pass (the problem validated first).
    pub fn build(p: &SdpaProblem, layout: &SdpaLayout, pass: SdpaPass) -> Result<SdpaGraph> {
        p.validate()?;
        let elem = match p.dtype {
            DType::F16 => Elem::Half,
            _ => Elem::BFloat16,
        };
        let view = |role: Role, t: usize, s: Strides| TensorSpec {
            uid: role.uid(),
            role,
            elem,
            dims: i64s([p.b, p.h, t, p.d]),
            strides: i64s([s[0], s[1], s[2], 1]),
            is_virtual: false,
            value: None,
        };
        let scalar = |role: Role, value: Scalar| TensorSpec {
            uid: role.uid(),
            role,
            elem: match value {
                Scalar::F32(_) => Elem::Float,
                Scalar::I32(_) => Elem::Int32,
            },
            dims: [1; 4],
            strides: [1; 4],
            is_virtual: false,
            value: Some(value),
        };
        let l = layout;
        let mut tensors = vec![
            view(Role::Q, p.tq, l.q),
            view(Role::K, p.tk, l.k),
            view(Role::V, p.tk, l.v),
            view(Role::O, p.tq, l.o),
            TensorSpec {
                uid: Role::Stats.uid(),
                role: Role::Stats,
                elem: Elem::Float,
                dims: i64s([p.b, p.h, p.tq, 1]),
                strides: i64s([p.h * p.tq, p.tq, 1, 1]),
                is_virtual: false,
                value: None,
            },
            scalar(Role::Scale, Scalar::F32(p.scale)),
        ];
        if pass == SdpaPass::Backward {
            tensors.extend([
                view(Role::DO, p.tq, l.d_o),
                view(Role::DQ, p.tq, l.dq),
                view(Role::DK, p.tk, l.dk),
                view(Role::DV, p.tk, l.dv),
            ]);
        }
        let mask = p.causal.then(|| BandMask {
            shift: p.causal_shift(),
        });
        if let Some(m) = mask {
            let scores = |role: Role| TensorSpec {
                uid: role.uid(),
                role,
                elem: Elem::Float,
                dims: i64s([p.b, p.h, p.tq, p.tk]),
                strides: i64s([p.h * p.tq * p.tk, p.tq * p.tk, p.tk, 1]),
                is_virtual: true,
                value: None,
            };
            tensors.extend([
                scores(Role::Scores),
                scores(Role::MaskedScores),
                scalar(Role::RightBound, Scalar::I32(m.shift as i32)),
                scalar(Role::Fill, Scalar::F32(f32::NEG_INFINITY)),
            ]);
        }
        Ok(SdpaGraph {
            pass,
            problem: *p,
            layout: *layout,
            tensors,
            mask,
        })
    }

    /// The tensor of `role`, if the graph has one.
    pub fn tensor(&self, role: Role) -> Option<&TensorSpec> {
        self.tensors.iter().find(|t| t.role == role)
    }

    /// The tensors bound to device memory in a variant pack (not virtual, not by value).
    pub fn device_tensors(&self) -> impl Iterator<Item = &TensorSpec> {
        self.tensors
            .iter()
            .filter(|t| !t.is_virtual && t.value.is_none())
    }

    /// Elements a view of `role` must reach: its last element's index + 1.
    pub fn extent(&self, role: Role) -> Option<usize> {
        let t = self.tensor(role)?;
        if t.dims.contains(&0) {
            return Some(0);
        }
        let last: i64 = t
            .dims
            .iter()
            .zip(&t.strides)
            .map(|(n, s)| (n - 1) * s)
            .sum();
        Some(last as usize + 1)
    }
}

/// A cuDNN release, as cudnnGetVersion reports it (major, minor, patch).
pub type Version = (u32, u32, u32);

/// The releases that take each form of the graph, from the "Since" notes of cuDNN's backend
/// header (as bound by cudarc 0.19.10's `cudnn::sys`, which documents up to 9.22.0):
/// - the SDPA_FWD operation (q, k, v, o, stats, scale): 9.13.0;
/// - its score-modifier subgraph (SDPA_FWD_SUBGRAPH, where the causal band mask goes): 9.21.0
///   (the DIAGONAL_BAND_MASK operation itself exists from 9.20.0);
/// - the SDPA_BWD operation: 9.17.0;
/// - its subgraph (SDPA_BWD_SUBGRAPH, needed for a causal backward): "UNPUBLISHED" in that
///   header, so no release is known to take it: a causal backward runs sinter's flash backward
///   on cuDNN's stats (the same natural-log log-sum-exp, fp32 [b, h, tq]).
pub const SDPA_FWD_MIN: Version = (9, 13, 0);
pub const SDPA_FWD_CAUSAL_MIN: Version = (9, 21, 0);
pub const SDPA_BWD_MIN: Version = (9, 17, 0);
pub const SDPA_BWD_CAUSAL_MIN: Option<Version> = None;

/// The first release that takes `pass` with (or without) the causal mask, None if none does.
pub fn min_version(pass: SdpaPass, causal: bool) -> Option<Version> {
    match (pass, causal) {
        (SdpaPass::Forward, false) => Some(SDPA_FWD_MIN),
        (SdpaPass::Forward, true) => Some(SDPA_FWD_CAUSAL_MIN),
        (SdpaPass::Backward, false) => Some(SDPA_BWD_MIN),
        (SdpaPass::Backward, true) => SDPA_BWD_CAUSAL_MIN,
    }
}

/// Whether cuDNN `loaded` (None: not loadable) takes `pass`; Err says why not.
pub fn version_supports(
    loaded: Option<Version>,
    pass: SdpaPass,
    causal: bool,
) -> std::result::Result<(), String> {
    let Some(v) = loaded else {
        return Err("libcudnn is not loadable".into());
    };
    let what = format!(
        "{}the SDPA {} operation",
        if causal { "a causal mask on " } else { "" },
        pass.name()
    );
    match min_version(pass, causal) {
        None => Err(format!(
            "no published cuDNN release takes {what} (loaded {}.{}.{})",
            v.0, v.1, v.2
        )),
        Some(min) if v < min => Err(format!(
            "cuDNN {}.{}.{} is older than {}.{}.{}, the first to take {what}",
            v.0, v.1, v.2, min.0, min.1, min.2
        )),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prob(causal: bool) -> SdpaProblem {
        SdpaProblem {
            b: 2,
            h: 12,
            tq: 1024,
            tk: 1024,
            d: 64,
            dtype: DType::BF16,
            causal,
            scale: 0.125,
        }
    }

    #[test]
    fn packed_qkv_views_read_the_projection_in_place() {
        let p = prob(true);
        let g = SdpaGraph::build(&p, &SdpaLayout::packed(1024, 12, 64), SdpaPass::Forward).unwrap();
        let q = g.tensor(Role::Q).unwrap();
        // [B, T, 3, H, D]: batch stride T·3·H·D, head stride D, row stride 3·H·D.
        assert_eq!(q.dims, [2, 12, 1024, 64]);
        assert_eq!(q.strides, [1024 * 3 * 768, 64, 3 * 768, 1]);
        assert_eq!(g.tensor(Role::K).unwrap().strides, q.strides);
        assert_eq!(g.tensor(Role::V).unwrap().strides, q.strides);
        // O [B, T, H, D]: what the output projection reads as [B·T, C].
        let o = g.tensor(Role::O).unwrap();
        assert_eq!(o.strides, [1024 * 768, 64, 768, 1]);
        let stats = g.tensor(Role::Stats).unwrap();
        assert_eq!((stats.dims, stats.elem), ([2, 12, 1024, 1], Elem::Float));
        assert_eq!(stats.strides, [12 * 1024, 1024, 1, 1]);
        assert_eq!(
            g.tensor(Role::Scale).unwrap().value,
            Some(Scalar::F32(0.125))
        );
        assert_eq!(q.elem, Elem::BFloat16);
        // The whole packed projection minus k's and v's offsets: q reaches its last row's
        // first third.
        assert_eq!(g.extent(Role::Q).unwrap(), (2 * 1024 - 1) * 3 * 768 + 768);
        assert_eq!(g.extent(Role::O).unwrap(), 2 * 1024 * 768);
        // Forward binds q, k, v, o, stats; the mask's scores are virtual, its bound by value.
        let bound: Vec<i64> = g.device_tensors().map(|t| t.uid).collect();
        assert_eq!(bound, [1, 2, 3, 4, 5]);
        assert!(g.tensor(Role::Scores).unwrap().is_virtual);
        assert_eq!(
            g.tensor(Role::RightBound).unwrap().value,
            Some(Scalar::I32(1))
        );
        assert_eq!(
            g.tensor(Role::Fill).unwrap().value,
            Some(Scalar::F32(f32::NEG_INFINITY))
        );
    }

    #[test]
    fn dense_layout_and_backward_tensors() {
        let mut p = prob(false);
        p.tq = 7;
        p.tk = 9;
        p.d = 128;
        p.dtype = DType::F16;
        let g = SdpaGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Backward).unwrap();
        assert_eq!(
            g.tensor(Role::Q).unwrap().strides,
            [12 * 7 * 128, 7 * 128, 128, 1]
        );
        assert_eq!(g.tensor(Role::K).unwrap().dims, [2, 12, 9, 128]);
        assert_eq!(
            g.tensor(Role::DK).unwrap().strides,
            [12 * 9 * 128, 9 * 128, 128, 1]
        );
        assert_eq!(g.tensor(Role::DQ).unwrap().elem, Elem::Half);
        assert!(g.mask.is_none() && g.tensor(Role::Scores).is_none());
        let bound: Vec<i64> = g.device_tensors().map(|t| t.uid).collect();
        assert_eq!(bound, [1, 2, 3, 4, 5, 7, 8, 9, 10]);
    }

    #[test]
    fn the_band_mask_is_the_bottom_right_causal_rule() {
        for (tq, tk) in [(4, 4), (3, 7), (1, 5)] {
            let mut p = prob(true);
            p.tq = tq;
            p.tk = tk;
            let m = BandMask {
                shift: p.causal_shift(),
            };
            for i in 0..tq {
                for j in 0..tk {
                    // sinter's rule: query i sits at position tk − tq + i.
                    assert_eq!(m.keeps(i, j), j <= i + tk - tq, "{tq}x{tk} ({i}, {j})");
                }
            }
        }
    }

    #[test]
    fn unsupported_problems_are_named() {
        let mut p = prob(false);
        p.dtype = DType::F32;
        assert!(p.supported().unwrap_err().contains("f16 or bf16"));
        let mut p = prob(false);
        p.d = 80 + 4;
        assert!(p.supported().unwrap_err().contains("head dim 84"));
        p.d = 256;
        assert!(p.supported().is_err());
        let mut p = prob(true);
        p.tq = 8;
        p.tk = 4;
        assert!(p.supported().unwrap_err().contains("more queries"));
        let mut p = prob(false);
        p.b = 0;
        assert!(
            SdpaGraph::build(&p, &SdpaLayout::dense(&p), SdpaPass::Forward)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        for d in [8, 64, 96, 128] {
            let mut p = prob(true);
            p.d = d;
            p.supported().unwrap();
        }
    }

    #[test]
    fn version_rules() {
        use SdpaPass::{Backward as B, Forward as F};
        assert!(version_supports(None, F, false)
            .unwrap_err()
            .contains("not loadable"));
        let old = Some((9, 12, 0));
        assert!(version_supports(old, F, false)
            .unwrap_err()
            .contains("9.13.0"));
        version_supports(Some((9, 13, 0)), F, false).unwrap();
        assert!(version_supports(Some((9, 20, 2)), F, true)
            .unwrap_err()
            .contains("9.21.0"));
        version_supports(Some((9, 21, 0)), F, true).unwrap();
        assert!(version_supports(Some((9, 16, 9)), B, false).is_err());
        version_supports(Some((9, 17, 0)), B, false).unwrap();
        // No release is known to take a causal SDPA_BWD: flash runs the causal backward.
        assert!(version_supports(Some((10, 0, 0)), B, true)
            .unwrap_err()
            .contains("no published"));
        assert_eq!(min_version(F, true), Some(SDPA_FWD_CAUSAL_MIN));
    }
}
