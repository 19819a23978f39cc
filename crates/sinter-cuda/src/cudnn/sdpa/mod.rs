//! cuDNN fused attention (scaled dot-product attention, forward and backward) for f16/bf16,
//! reading q, k and v as strided views (e.g. the thirds of a packed qkv projection) and writing
//! o in the layout the output projection reads: no permute copies.
//!
//! - `graph.rs`: the call as plain data ([`SdpaGraph`]: one unified SDPA_FWD/SDPA_BWD
//!   operation) and its version rules ([`version_supports`]); unit-tested without a GPU.
//! - `composite.rs`: the same call as cuDNN's composite fused-attention graph (matmul,
//!   pointwise, reduction nodes: [`composite::CompositeGraph`]) and its version rules, for the
//!   releases the unified operations do not cover (every causal backward; a causal forward
//!   before 9.21, any pass before 9.13/9.17). [`choose`] picks the graph.
//! - `backend.rs`: either graph as cuDNN backend descriptors, cached plans, variant packs.
//! - The emulated device runs the same graph on the host (`emulated::sdpa`) and reports a cuDNN
//!   version of its own (`SINTER_CUDA_EMU_CUDNN`).
//!
//! Every entry point answers [`Ran::Unsupported`] (never an error) when cuDNN is absent, too
//! old for the pass (cudnnGetVersion, checked at run time), or declines the shape; the caller
//! then runs sinter's flash kernel. A cuDNN failure past that is an `Err`.

mod backend;
pub mod composite;
pub mod graph;
mod lower;

use std::sync::Arc;

pub use graph::*;

use crate::alloc::{DevSlice, Pool};
use crate::cudnn::Ran;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{guard, CudaError, Result};

/// The cuDNN release serving `dev`'s attention: the loaded library's (cudnnGetVersion), or on
/// an emulated device the one it emulates.
pub fn loaded_version(dev: &CudaDevice) -> Option<Version> {
    if dev.is_emulated() {
        crate::emulated::sdpa::cudnn_version()
    } else {
        crate::runtime::cudnn_version()
    }
}

/// Which graph cuDNN is given for a pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// One SDPA_FWD / SDPA_BWD operation ([`SdpaGraph`]).
    Unified,
    /// The composite fused-attention graph ([`composite::CompositeGraph`]).
    Composite,
}

/// The graph cuDNN release `loaded` takes for `pass` of `p`: the unified operation where the
/// release has it, else the composite graph where the release takes that; Err says why neither.
pub fn choose(
    loaded: Option<Version>,
    p: &SdpaProblem,
    pass: SdpaPass,
) -> std::result::Result<Form, String> {
    p.supported()?;
    match version_supports(loaded, pass, p.causal) {
        Ok(()) => Ok(Form::Unified),
        Err(unified) => composite::composite_supports(loaded, p, pass)
            .map(|()| Form::Composite)
            .map_err(|c| format!("{unified}; and the composite graph: {c}")),
    }
}

/// Ok when cuDNN on `dev` takes `pass` of `p` (through either graph); Err says why not (the
/// caller falls back).
pub fn supports(
    dev: &CudaDevice,
    p: &SdpaProblem,
    pass: SdpaPass,
) -> std::result::Result<(), String> {
    choose(loaded_version(dev), p, pass).map(|_| ())
}

/// The forward's operands: q, k, v and o start at their element (0, 0, 0, 0); stats is fp32
/// [b, h, tq] (the natural-log log-sum-exp per query row, as sinter's flash kernel writes it).
pub struct SdpaForward<'a> {
    pub q: DevSlice<'a>,
    pub k: DevSlice<'a>,
    pub v: DevSlice<'a>,
    pub o: DevSlice<'a>,
    pub stats: DevSlice<'a>,
}

/// The backward's operands (as for [`SdpaForward`], plus the output gradient and the three
/// input gradients, fully overwritten).
pub struct SdpaBackward<'a> {
    pub q: DevSlice<'a>,
    pub k: DevSlice<'a>,
    pub v: DevSlice<'a>,
    pub o: DevSlice<'a>,
    pub d_o: DevSlice<'a>,
    pub stats: DevSlice<'a>,
    pub dq: DevSlice<'a>,
    pub dk: DevSlice<'a>,
    pub dv: DevSlice<'a>,
}

/// o, stats = attention(q, k, v) through cuDNN's SDPA_FWD.
pub fn sdpa_forward(
    dev: &CudaDevice,
    p: &SdpaProblem,
    layout: &SdpaLayout,
    ops: SdpaForward<'_>,
) -> Result<Ran> {
    let bound = [
        (Role::Q, ops.q),
        (Role::K, ops.k),
        (Role::V, ops.v),
        (Role::O, ops.o),
        (Role::Stats, ops.stats),
    ];
    run(dev, p, layout, SdpaPass::Forward, &bound)
}

/// dq, dk, dv of attention through cuDNN's SDPA_BWD.
pub fn sdpa_backward(
    dev: &CudaDevice,
    p: &SdpaProblem,
    layout: &SdpaLayout,
    ops: SdpaBackward<'_>,
) -> Result<Ran> {
    let bound = [
        (Role::Q, ops.q),
        (Role::K, ops.k),
        (Role::V, ops.v),
        (Role::O, ops.o),
        (Role::DO, ops.d_o),
        (Role::Stats, ops.stats),
        (Role::DQ, ops.dq),
        (Role::DK, ops.dk),
        (Role::DV, ops.dv),
    ];
    run(dev, p, layout, SdpaPass::Backward, &bound)
}

/// Every device tensor of `g` is bound once, with its dtype, and its view stays inside its
/// buffer.
fn check_operands(g: &SdpaGraph, bound: &[(Role, DevSlice<'_>)]) -> Result<Vec<(Role, u64)>> {
    let op = "cudnn sdpa";
    let mut ptrs = Vec::with_capacity(bound.len());
    for t in g.device_tensors() {
        let Some((_, s)) = bound.iter().find(|(r, _)| *r == t.role) else {
            return Err(CudaError::invalid(op, format!("{:?} is not bound", t.role)));
        };
        let dtype = if t.role == Role::Stats {
            DType::F32
        } else {
            g.problem.dtype
        };
        crate::check::need_dtype(op, &format!("{:?}", t.role), s, dtype)?;
        let extent = g.extent(t.role).unwrap_or(0);
        if extent > s.len() {
            return Err(CudaError::invalid(
                op,
                format!(
                    "{:?} view {:?} with strides {:?} reaches element {extent} of a buffer of {}",
                    t.role,
                    t.dims,
                    t.strides,
                    s.len()
                ),
            ));
        }
        ptrs.push((t.role, s.ptr()));
    }
    Ok(ptrs)
}

fn run(
    dev: &CudaDevice,
    p: &SdpaProblem,
    layout: &SdpaLayout,
    pass: SdpaPass,
    bound: &[(Role, DevSlice<'_>)],
) -> Result<Ran> {
    let form = match choose(loaded_version(dev), p, pass) {
        Ok(f) => f,
        Err(why) => return Ok(Ran::Unsupported(why)),
    };
    // The unified graph describes every operand's view (the composite binds the same memory,
    // k and v transposed), so it checks the operands for both forms.
    let g = Arc::new(SdpaGraph::build(p, layout, pass)?);
    let ptrs = check_operands(&g, bound)?;
    let r = match (form, dev.emulated()) {
        (Form::Unified, Some(emu)) => emu.sdpa(g, ptrs).map(|()| Ran::Done),
        (Form::Composite, Some(emu)) => {
            let c = composite::CompositeGraph::build(p, layout, pass)?;
            let host = crate::emulated::sdpa::host_graph(&c)?;
            emu.sdpa(Arc::new(host), ptrs).map(|()| Ran::Done)
        }
        (Form::Unified, None) => run_real(dev, &g, &ptrs),
        (Form::Composite, None) => {
            let c = composite::CompositeGraph::build(p, layout, pass)?;
            run_real_composite(dev, &c, &ptrs)
        }
    };
    match r {
        Err(CudaError::Panicked(m)) => Ok(Ran::Unsupported(format!("a cuDNN call panicked: {m}"))),
        r => r,
    }
}

/// Runs `f` with this device's cuDNN handle, bound to the device and held under the state's
/// lock until `f` returns (its plan executes under it), or says why cuDNN cannot run here.
fn with_handle(
    dev: &CudaDevice,
    f: impl FnOnce(cudarc::cudnn::sys::cudnnHandle_t) -> Result<Ran>,
) -> Result<Ran> {
    let slot = super::state_of(dev)?;
    let held = super::lock(&slot);
    let Some(state) = held.as_ref() else {
        return Ok(Ran::Unsupported(
            "cuDNN could not be initialised on this device".into(),
        ));
    };
    if let Some(r) = dev.real() {
        r.bind()?;
    }
    f(state.handle)
}

/// How a cuDNN backend failure reads as an error of `op`.
fn cudnn_error(op: &'static str) -> impl Fn(backend::Fail) -> CudaError {
    move |f| CudaError::Cudnn {
        op,
        msg: format!("{}: status {}", f.step, f.status),
    }
}

/// The plan cache's entry under `k`, built by `build` on first use (a panic in cuDNN is an
/// error of `op`); None when cuDNN declined the graph (remembered), which the caller answers
/// with [`declined`].
fn cached_plan(
    op: &'static str,
    k: backend::PlanKey,
    build: impl FnOnce() -> std::result::Result<backend::Plan, backend::Fail>,
) -> Result<Option<Arc<backend::Plan>>> {
    let plan = guard(|| Ok(backend::cached(k, build, |f| super::falls_back(f.status))))?;
    plan.map_err(cudnn_error(op))
}

/// The answer when cuDNN declines `pass` of a graph: the caller falls back.
fn declined(graph: &str, pass: SdpaPass) -> Ran {
    Ran::Unsupported(format!("cuDNN declined the {graph} {} graph", pass.name()))
}

fn run_real(dev: &CudaDevice, g: &SdpaGraph, ptrs: &[(Role, u64)]) -> Result<Ran> {
    with_handle(dev, |handle| run_real_on(dev, handle, g, ptrs))
}

fn run_real_on(
    dev: &CudaDevice,
    handle: cudarc::cudnn::sys::cudnnHandle_t,
    g: &SdpaGraph,
    ptrs: &[(Role, u64)],
) -> Result<Ran> {
    let op = "cudnn sdpa";
    let k = backend::key(dev.ordinal(), false, g.pass, &g.problem, &g.layout);
    let Some(plan) = cached_plan(op, k, || backend::build(handle, g))? else {
        return Ok(declined("SDPA", g.pass));
    };
    let ws = if plan.workspace() > 0 {
        Some(dev.alloc(plan.workspace(), DType::U8, Pool::Temporary)?)
    } else {
        None
    };
    let ws_ptr = ws
        .as_ref()
        .map_or(std::ptr::null_mut(), |b| b.ptr() as *mut std::ffi::c_void);
    let bound: Vec<(i64, u64)> = ptrs.iter().map(|(r, p)| (r.uid(), *p)).collect();
    let scalars: Vec<(i64, Scalar)> = g
        .tensors
        .iter()
        .filter_map(|t| t.value.map(|v| (t.uid, v)))
        .collect();
    // SAFETY: the handle is held under the state's lock; the operands were checked against
    // the graph's extents; the workspace is a temporary-pool buffer released in stream order
    // after this call's work.
    guard(|| Ok(unsafe { plan.execute(handle, &bound, &scalars, ws_ptr) }))?
        .map_err(cudnn_error(op))?;
    Ok(Ran::Done)
}

/// The composite graph on a real device: as [`run_real`], with the graph's own workspace
/// tensors (Σ and the zeroed dQ accumulator) placed after the plan's workspace.
fn run_real_composite(
    dev: &CudaDevice,
    c: &composite::CompositeGraph,
    ptrs: &[(Role, u64)],
) -> Result<Ran> {
    with_handle(dev, |handle| run_real_composite_on(dev, handle, c, ptrs))
}

fn run_real_composite_on(
    dev: &CudaDevice,
    handle: cudarc::cudnn::sys::cudnnHandle_t,
    c: &composite::CompositeGraph,
    ptrs: &[(Role, u64)],
) -> Result<Ran> {
    let op = "cudnn sdpa (composite)";
    let k = backend::key(dev.ordinal(), true, c.pass, &c.problem, &c.layout);
    let Some(plan) = cached_plan(op, k, || lower::build(handle, c))? else {
        return Ok(declined("composite attention", c.pass));
    };
    let base = plan.workspace().div_ceil(256) * 256;
    let total = base + c.workspace_bytes();
    let ws = if total > 0 {
        Some(dev.alloc(total, DType::U8, Pool::Temporary)?)
    } else {
        None
    };
    let ws_ptr = ws.as_ref().map_or(0, |b| b.ptr());
    let mut bound: Vec<(i64, u64)> = ptrs.iter().map(|(r, p)| (r.uid(), *p)).collect();
    for t in &c.tensors {
        if let composite::Binding::Workspace(at) = t.binding {
            bound.push((t.uid, ws_ptr + (base + at) as u64));
        }
    }
    if let Some(buf) = &ws {
        for (at, bytes) in c.zeroed_workspace() {
            dev.zero(buf.slice(base + at, bytes)?)?;
        }
    }
    // SAFETY: as in `run_real_on`; the graph's workspace tensors lie inside the buffer.
    guard(|| {
        Ok(unsafe {
            plan.execute(
                handle,
                &bound,
                &c.scalars(),
                ws_ptr as *mut std::ffi::c_void,
            )
        })
    })?
    .map_err(cudnn_error(op))?;
    Ok(Ran::Done)
}
