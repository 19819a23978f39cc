//! An [`SdpaGraph`] through cuDNN's backend (graph) API, via cudarc's `cudnn::sys`: tensor
//! descriptors, the DIAGONAL_BAND_MASK operation in a score-modifier subgraph when causal, one
//! SDPA_FWD or SDPA_BWD operation, an operation graph, heuristics (mode A), the first engine
//! config that finalizes into an execution plan, its workspace, and per call a variant pack.
//! Plans are cached per (device, pass, shape, dtype, causal, strides); the scale and the
//! band's bound travel by value in the variant pack, so they are not part of the key.
//!
//! Not yet run on a GPU (no cuDNN ≥ 9.13 has been available to this project): every status
//! that is not SUCCESS becomes [`Fail`], which the caller turns into a fall-back to sinter's
//! flash kernel, and a shape cuDNN declined is remembered so it is not rebuilt every call.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cs::cudnnBackendAttributeName_t as A;
use cs::cudnnBackendAttributeType_t as T;
use cs::cudnnBackendDescriptorType_t as K;
use cudarc::cudnn::sys as cs;

use super::graph::{Elem, Role, Scalar, SdpaGraph, SdpaLayout, SdpaPass, SdpaProblem, TensorSpec};
use crate::dtype::DType;

/// A cuDNN call that did not return SUCCESS: which step, and the status.
#[derive(Debug)]
pub(super) struct Fail {
    pub(super) step: &'static str,
    pub(super) status: u32,
}

type R<X> = std::result::Result<X, Fail>;

fn check(step: &'static str, s: cs::cudnnStatus_t) -> R<()> {
    if s == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(Fail {
            step,
            status: s as u32,
        })
    }
}

/// One backend descriptor, destroyed once when dropped.
pub(super) struct Desc(cs::cudnnBackendDescriptor_t);

impl Drop for Desc {
    fn drop(&mut self) {
        // SAFETY: created by cudnnBackendCreateDescriptor, destroyed once, here.
        let _ = unsafe { cs::cudnnBackendDestroyDescriptor(self.0) };
    }
}

impl Desc {
    pub(super) fn new(kind: K) -> R<Desc> {
        let mut d: cs::cudnnBackendDescriptor_t = std::ptr::null_mut();
        // SAFETY: cuDNN writes one handle into `d`.
        check("cudnnBackendCreateDescriptor", unsafe {
            cs::cudnnBackendCreateDescriptor(kind, &mut d)
        })?;
        Ok(Desc(d))
    }

    /// Sets attribute `name` to `values`, whose Rust type must be what `ty` says (cuDNN reads
    /// `values.len()` elements of it).
    pub(super) fn set<V>(&self, name: A, ty: T, values: &[V]) -> R<()> {
        // SAFETY: a live descriptor and a slice of the attribute's element type.
        check("cudnnBackendSetAttribute", unsafe {
            cs::cudnnBackendSetAttribute(
                self.0,
                name,
                ty,
                values.len() as i64,
                values.as_ptr() as *const c_void,
            )
        })
    }

    pub(super) fn set_descs(&self, name: A, descs: &[&Desc]) -> R<()> {
        let raw: Vec<cs::cudnnBackendDescriptor_t> = descs.iter().map(|d| d.0).collect();
        self.set(name, T::CUDNN_TYPE_BACKEND_DESCRIPTOR, &raw)
    }

    pub(super) fn finalize(self) -> R<Desc> {
        // SAFETY: a live descriptor.
        check("cudnnBackendFinalize", unsafe {
            cs::cudnnBackendFinalize(self.0)
        })?;
        Ok(self)
    }
}

pub(super) fn data_type(e: Elem) -> cs::cudnnDataType_t {
    match e {
        Elem::Half => cs::cudnnDataType_t::CUDNN_DATA_HALF,
        Elem::BFloat16 => cs::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        Elem::Float => cs::cudnnDataType_t::CUDNN_DATA_FLOAT,
        Elem::Int32 => cs::cudnnDataType_t::CUDNN_DATA_INT32,
        Elem::Boolean => cs::cudnnDataType_t::CUDNN_DATA_BOOLEAN,
    }
}

/// A tensor descriptor. Device tensors promise 16-byte alignment (sinter's buffers are
/// 256-byte aligned and every view offset the attention op makes is a multiple of 8 elements,
/// as the head dim is); by-value scalars their element size.
pub(super) fn tensor_desc(
    uid: i64,
    elem: Elem,
    dims: &[i64; 4],
    strides: &[i64; 4],
    is_virtual: bool,
    by_value: bool,
) -> R<Desc> {
    let d = Desc::new(K::CUDNN_BACKEND_TENSOR_DESCRIPTOR)?;
    d.set(A::CUDNN_ATTR_TENSOR_UNIQUE_ID, T::CUDNN_TYPE_INT64, &[uid])?;
    d.set(
        A::CUDNN_ATTR_TENSOR_DATA_TYPE,
        T::CUDNN_TYPE_DATA_TYPE,
        &[data_type(elem)],
    )?;
    let alignment: i64 = if by_value { 4 } else { 16 };
    d.set(
        A::CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT,
        T::CUDNN_TYPE_INT64,
        &[alignment],
    )?;
    d.set(A::CUDNN_ATTR_TENSOR_DIMENSIONS, T::CUDNN_TYPE_INT64, dims)?;
    d.set(A::CUDNN_ATTR_TENSOR_STRIDES, T::CUDNN_TYPE_INT64, strides)?;
    if is_virtual {
        d.set(
            A::CUDNN_ATTR_TENSOR_IS_VIRTUAL,
            T::CUDNN_TYPE_BOOLEAN,
            &[true],
        )?;
    }
    if by_value {
        d.set(
            A::CUDNN_ATTR_TENSOR_IS_BY_VALUE,
            T::CUDNN_TYPE_BOOLEAN,
            &[true],
        )?;
    }
    d.finalize()
}

fn tensor(t: &TensorSpec) -> R<Desc> {
    tensor_desc(
        t.uid,
        t.elem,
        &t.dims,
        &t.strides,
        t.is_virtual,
        t.value.is_some(),
    )
}

/// The attributes of each role on the pass's operation.
fn operand_attr(pass: SdpaPass, role: Role) -> Option<A> {
    use Role::*;
    Some(match (pass, role) {
        (SdpaPass::Forward, Q) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_QDESC,
        (SdpaPass::Forward, K) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_KDESC,
        (SdpaPass::Forward, V) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_VDESC,
        (SdpaPass::Forward, O) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_ODESC,
        (SdpaPass::Forward, Stats) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_STATSDESC,
        (SdpaPass::Forward, Scale) => A::CUDNN_ATTR_OPERATION_SDPA_FWD_SCALEDESC,
        (SdpaPass::Backward, Q) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_QDESC,
        (SdpaPass::Backward, K) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_KDESC,
        (SdpaPass::Backward, V) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_VDESC,
        (SdpaPass::Backward, O) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_ODESC,
        (SdpaPass::Backward, Stats) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_STATSDESC,
        (SdpaPass::Backward, Scale) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_SCALEDESC,
        (SdpaPass::Backward, DO) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_DODDESC,
        (SdpaPass::Backward, DQ) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_DQDESC,
        (SdpaPass::Backward, DK) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_DKDESC,
        (SdpaPass::Backward, DV) => A::CUDNN_ATTR_OPERATION_SDPA_BWD_DVDESC,
        _ => return None,
    })
}

/// The causal band mask as a one-operation subgraph: masked = (j < i + bound) ? scores : fill.
fn mask_subgraph(handle: cs::cudnnHandle_t, t: &HashMap<Role, Desc>) -> R<Vec<Desc>> {
    let get = |r: Role| {
        t.get(&r).ok_or(Fail {
            step: "SDPA mask tensors",
            status: cs::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM as u32,
        })
    };
    let mask = Desc::new(K::CUDNN_BACKEND_OPERATION_DIAGONAL_BAND_MASK_DESCRIPTOR)?;
    mask.set_descs(
        A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_XDESC,
        &[get(Role::Scores)?],
    )?;
    mask.set_descs(
        A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_SHIFT_RIGHT_BOUND_DESC,
        &[get(Role::RightBound)?],
    )?;
    mask.set_descs(
        A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_BDESC,
        &[get(Role::Fill)?],
    )?;
    mask.set_descs(
        A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_YDESC,
        &[get(Role::MaskedScores)?],
    )?;
    mask.set(
        A::CUDNN_ATTR_OPERATION_DIAGONAL_BAND_MASK_COMPARISON_MODE,
        T::CUDNN_TYPE_POINTWISE_MODE,
        &[cs::cudnnPointwiseMode_t::CUDNN_POINTWISE_CMP_LT],
    )?;
    let mask = mask.finalize()?;
    let sub = Desc::new(K::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    sub.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    sub.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &[&mask])?;
    Ok(vec![mask, sub.finalize()?])
}

/// The SDPA operation (and what it must outlive: its tensors and mask subgraph).
fn operation(handle: cs::cudnnHandle_t, g: &SdpaGraph) -> R<(Desc, Vec<Desc>)> {
    let mut tensors = HashMap::new();
    for t in &g.tensors {
        tensors.insert(t.role, tensor(t)?);
    }
    let kind = match g.pass {
        SdpaPass::Forward => K::CUDNN_BACKEND_OPERATION_SDPA_FWD_DESCRIPTOR,
        SdpaPass::Backward => K::CUDNN_BACKEND_OPERATION_SDPA_BWD_DESCRIPTOR,
    };
    let op = Desc::new(kind)?;
    for (role, d) in &tensors {
        if let Some(attr) = operand_attr(g.pass, *role) {
            op.set_descs(attr, &[d])?;
        }
    }
    let mut keep = Vec::new();
    if g.mask.is_some() {
        let sub = mask_subgraph(handle, &tensors)?;
        let (a_sub, a_in, a_out) = match g.pass {
            SdpaPass::Forward => (
                A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH,
                A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_INPUT_UID,
                A::CUDNN_ATTR_OPERATION_SDPA_FWD_SUBGRAPH_OUTPUT_UID,
            ),
            SdpaPass::Backward => (
                A::CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH,
                A::CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH_INPUT_UID,
                A::CUDNN_ATTR_OPERATION_SDPA_BWD_SUBGRAPH_OUTPUT_UID,
            ),
        };
        op.set_descs(a_sub, &[&sub[1]])?;
        op.set(a_in, T::CUDNN_TYPE_INT64, &[Role::Scores.uid()])?;
        op.set(a_out, T::CUDNN_TYPE_INT64, &[Role::MaskedScores.uid()])?;
        keep.extend(sub);
    }
    keep.extend(tensors.into_values());
    Ok((op.finalize()?, keep))
}

/// A built execution plan and the workspace it needs.
pub(super) struct Plan {
    plan: Desc,
    workspace: usize,
    _keep: Vec<Desc>,
}

// SAFETY: the descriptors are only used under `run`'s lock of the device's cuDNN handle (one
// thread at a time, as cuDNN requires); nothing else aliases them.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

pub(super) fn build(handle: cs::cudnnHandle_t, g: &SdpaGraph) -> R<Plan> {
    let (op, keep) = operation(handle, g)?;
    finish(handle, vec![op], keep)
}

/// Operation graph of `ops` → heuristics → the first engine config that finalizes as a plan
/// (`keep`: descriptors the operations refer to, kept alive with the plan).
pub(super) fn finish(handle: cs::cudnnHandle_t, ops: Vec<Desc>, mut keep: Vec<Desc>) -> R<Plan> {
    let graph = Desc::new(K::CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR)?;
    graph.set(
        A::CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
        T::CUDNN_TYPE_HANDLE,
        &[handle],
    )?;
    let op_refs: Vec<&Desc> = ops.iter().collect();
    graph.set_descs(A::CUDNN_ATTR_OPERATIONGRAPH_OPS, &op_refs)?;
    let graph = graph.finalize()?;
    let heur = Desc::new(K::CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR)?;
    heur.set_descs(A::CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, &[&graph])?;
    heur.set(
        A::CUDNN_ATTR_ENGINEHEUR_MODE,
        T::CUDNN_TYPE_HEUR_MODE,
        &[cs::cudnnBackendHeurMode_t::CUDNN_HEUR_MODE_A],
    )?;
    let heur = heur.finalize()?;
    let mut count = 0i64;
    // SAFETY: asks only for the count (no output array).
    check("CUDNN_ATTR_ENGINEHEUR_RESULTS (count)", unsafe {
        cs::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            0,
            &mut count,
            std::ptr::null_mut(),
        )
    })?;
    let configs: Vec<Desc> = (0..count.max(0))
        .map(|_| Desc::new(K::CUDNN_BACKEND_ENGINECFG_DESCRIPTOR))
        .collect::<R<_>>()?;
    let mut raw: Vec<cs::cudnnBackendDescriptor_t> = configs.iter().map(|c| c.0).collect();
    let mut returned = 0i64;
    // SAFETY: `raw` holds `count` created ENGINECFG descriptors for cuDNN to fill.
    check("CUDNN_ATTR_ENGINEHEUR_RESULTS", unsafe {
        cs::cudnnBackendGetAttribute(
            heur.0,
            A::CUDNN_ATTR_ENGINEHEUR_RESULTS,
            T::CUDNN_TYPE_BACKEND_DESCRIPTOR,
            count,
            &mut returned,
            raw.as_mut_ptr() as *mut c_void,
        )
    })?;
    let mut last = Fail {
        step: "no engine config for this SDPA graph",
        status: cs::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED as u32,
    };
    let mut chosen = None;
    for cfg in configs.iter().take(returned.max(0) as usize) {
        let attempt = (|| {
            let plan = Desc::new(K::CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR)?;
            plan.set(
                A::CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                T::CUDNN_TYPE_HANDLE,
                &[handle],
            )?;
            plan.set_descs(A::CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, &[cfg])?;
            plan.finalize()
        })();
        match attempt {
            Ok(plan) => {
                chosen = Some(plan);
                break;
            }
            Err(f) => last = f,
        }
    }
    let plan = chosen.ok_or(last)?;
    let (mut ws, mut n) = (0i64, 0i64);
    // SAFETY: one INT64 out of a finalized plan.
    check("CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE", unsafe {
        cs::cudnnBackendGetAttribute(
            plan.0,
            A::CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
            T::CUDNN_TYPE_INT64,
            1,
            &mut n,
            &mut ws as *mut i64 as *mut c_void,
        )
    })?;
    keep.extend(ops);
    keep.extend([graph, heur]);
    keep.extend(configs);
    Ok(Plan {
        plan,
        workspace: ws.max(0) as usize,
        _keep: keep,
    })
}

/// What a plan depends on: everything in the graph but the by-value scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    ordinal: usize,
    /// The composite graph rather than the unified operation.
    composite: bool,
    pass: SdpaPass,
    dims: [usize; 5],
    dtype: DType,
    causal: bool,
    layout: SdpaLayout,
}

pub(super) fn key(
    ordinal: usize,
    composite: bool,
    pass: SdpaPass,
    p: &SdpaProblem,
    l: &SdpaLayout,
) -> PlanKey {
    PlanKey {
        ordinal,
        composite,
        pass,
        dims: [p.b, p.h, p.tq, p.tk, p.d],
        dtype: p.dtype,
        causal: p.causal,
        layout: *l,
    }
}

type Cache = Mutex<HashMap<PlanKey, Option<Arc<Plan>>>>;

fn cache() -> &'static Cache {
    static PLANS: OnceLock<Cache> = OnceLock::new();
    PLANS.get_or_init(Default::default)
}

/// The plan under `k`, built by `build` on first use; Ok(None) when cuDNN declined it
/// (remembered).
pub(super) fn cached(
    k: PlanKey,
    build: impl FnOnce() -> R<Plan>,
    declined: impl Fn(&Fail) -> bool,
) -> R<Option<Arc<Plan>>> {
    let mut plans = cache().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = plans.get(&k) {
        return Ok(p.clone());
    }
    let built = match build() {
        Ok(p) => Some(Arc::new(p)),
        Err(f) if declined(&f) => None,
        Err(f) => return Err(f),
    };
    plans.insert(k, built.clone());
    Ok(built)
}

impl Plan {
    pub(super) fn workspace(&self) -> usize {
        self.workspace
    }

    /// Runs the plan on the handle's stream: `bound` gives every device (and workspace)
    /// tensor's (uid, address), `scalars` every by-value tensor's (uid, value).
    ///
    /// # Safety
    /// `handle` is the device's live cuDNN handle (held exclusively); the addresses are device
    /// buffers of the graph's extents that stay live in stream order; `workspace` holds
    /// `self.workspace()` bytes (or is null when that is 0).
    pub(super) unsafe fn execute(
        &self,
        handle: cs::cudnnHandle_t,
        bound: &[(i64, u64)],
        scalars: &[(i64, Scalar)],
        workspace: *mut c_void,
    ) -> R<()> {
        // Host copies of the by-value scalars, alive until cudnnBackendExecute returns (cuDNN
        // reads them when it launches).
        let values: Vec<(i64, Box<[u8; 4]>)> = scalars
            .iter()
            .map(|(uid, v)| {
                let bytes = match v {
                    Scalar::F32(x) => x.to_ne_bytes(),
                    Scalar::I32(x) => x.to_ne_bytes(),
                };
                (*uid, Box::new(bytes))
            })
            .collect();
        let mut uids: Vec<i64> = bound.iter().map(|b| b.0).collect();
        let mut data: Vec<*mut c_void> = bound.iter().map(|b| b.1 as *mut c_void).collect();
        for (uid, b) in &values {
            uids.push(*uid);
            data.push(b.as_ptr() as *mut c_void);
        }
        let pack = Desc::new(K::CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR)?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
            T::CUDNN_TYPE_INT64,
            &uids,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS,
            T::CUDNN_TYPE_VOID_PTR,
            &data,
        )?;
        pack.set(
            A::CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
            T::CUDNN_TYPE_VOID_PTR,
            &[workspace],
        )?;
        let pack = pack.finalize()?;
        // SAFETY: the caller's promises; plan and pack are finalized.
        check("cudnnBackendExecute", unsafe {
            cs::cudnnBackendExecute(handle, self.plan.0, pack.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every tensor the graph binds (and the by-value scale) is an operand attribute of the
    /// pass's operation; the mask's tensors are not (they go to the subgraph).
    #[test]
    fn every_operand_of_the_graph_has_its_attribute() {
        let p = SdpaProblem {
            b: 1,
            h: 2,
            tq: 5,
            tk: 5,
            d: 64,
            dtype: DType::BF16,
            causal: true,
            scale: 0.5,
        };
        for pass in [SdpaPass::Forward, SdpaPass::Backward] {
            let g = SdpaGraph::build(&p, &SdpaLayout::dense(&p), pass).unwrap();
            for t in &g.tensors {
                let has = operand_attr(pass, t.role).is_some();
                let in_mask = matches!(
                    t.role,
                    Role::Scores | Role::MaskedScores | Role::RightBound | Role::Fill
                );
                assert_eq!(has, !in_mask, "{pass:?} {:?}", t.role);
            }
            let attrs: Vec<A> = g
                .tensors
                .iter()
                .filter_map(|t| operand_attr(pass, t.role))
                .collect();
            let unique: std::collections::HashSet<A> = attrs.iter().copied().collect();
            assert_eq!(attrs.len(), unique.len(), "one attribute per role");
        }
        assert_eq!(
            data_type(Elem::BFloat16),
            cs::cudnnDataType_t::CUDNN_DATA_BFLOAT16
        );
        assert_eq!(
            data_type(Elem::Int32),
            cs::cudnnDataType_t::CUDNN_DATA_INT32
        );
    }
}
