//! 2-D convolution (forward, backward-data, backward-filter) through cuDNN, NCHW, for f32, f16
//! and bf16 with f32 accumulation.
//!
//! cuDNN is optional: `libcudnn.so.9` is `dlopen`ed on first use and every entry point returns
//! [`Ran::Unsupported`] when it is missing or when cuDNN answers `NOT_SUPPORTED` for a shape, so
//! the caller falls back to im2col + GEMM. Nothing here panics when the library is absent.
//!
//! Per device there is one cuDNN handle bound to the device's stream (all work stays ordered
//! with the NVRTC kernels and cuBLASLt). Per problem ([`ConvProblem`]: shapes, conv parameters,
//! dtype, TF32 permission) the descriptors and the three algorithms are chosen once, from
//! cuDNN's own heuristics (`cudnnGet*Algorithm_v7`: no benchmarking run, so no warm-up
//! allocations or timing noise), and cached. Deterministic algorithms are preferred, as every
//! other reduction in sinter is deterministic. Workspaces come from the `Temporary` pool and go
//! back to it after the call (stream order makes the reuse safe).
//!
//! Everything that can be decided without a GPU (descriptor dimensions, math modes, the choice
//! among heuristic candidates) is a pure function, unit-tested on the CPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use cudarc::cudnn::{result as cr, sys as cs};

use crate::alloc::{DevSlice, Pool};
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{guard, CudaError, Result};

mod desc;
pub mod sdpa;
pub use desc::*;

/// True when convolutions can run through cuDNN: `libcudnn` loads (checked once; never panics),
/// or the devices are emulated (their cuDNN is a host reference implementation).
pub fn available() -> bool {
    crate::runtime::is_emulated() || crate::runtime::libraries().cudnn
}

// ---- descriptors (RAII over the raw handles) ----------------------------------------------------

fn cudnn_err(op: &'static str) -> impl Fn(cr::CudnnError) -> CudaError {
    move |e| CudaError::Cudnn {
        op,
        msg: format!("{:?}", e.0),
    }
}

fn is_not_supported(e: &cr::CudnnError) -> bool {
    falls_back(e.0 as u32)
}

/// Whether a cuDNN status means "cuDNN cannot do this here" (fall back to im2col) rather than a
/// failure: the NOT_SUPPORTED family (3000..=3999 in cuDNN 9; 9 in cuDNN 8), a misaligned
/// pointer (2003), or a sub-library (e.g. libcudnn_cnn) that failed to load (1008).
pub fn falls_back(status: u32) -> bool {
    (3000..4000).contains(&status) || matches!(status, 9 | 1008 | 2003)
}

struct TensorDesc(cs::cudnnTensorDescriptor_t);
impl Drop for TensorDesc {
    fn drop(&mut self) {
        // SAFETY: created by create_tensor_descriptor and destroyed once, here.
        let _ = unsafe { cr::destroy_tensor_descriptor(self.0) };
    }
}
struct FilterDesc(cs::cudnnFilterDescriptor_t);
impl Drop for FilterDesc {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { cr::destroy_filter_descriptor(self.0) };
    }
}
struct ConvDesc(cs::cudnnConvolutionDescriptor_t);
impl Drop for ConvDesc {
    fn drop(&mut self) {
        // SAFETY: as above.
        let _ = unsafe { cr::destroy_convolution_descriptor(self.0) };
    }
}

type FwdAlgo = cs::cudnnConvolutionFwdAlgo_t;
type BwdDataAlgo = cs::cudnnConvolutionBwdDataAlgo_t;
type BwdFilterAlgo = cs::cudnnConvolutionBwdFilterAlgo_t;

/// A problem's descriptors and, once asked for, its chosen algorithms (None inside = cuDNN
/// cannot do that direction: fall back every time without asking again).
struct ConvPlan {
    x: TensorDesc,
    w: FilterDesc,
    y: TensorDesc,
    conv: ConvDesc,
    fwd: Option<Option<Candidate<FwdAlgo>>>,
    bwd_data: Option<Option<Candidate<BwdDataAlgo>>>,
    bwd_filter: Option<Option<Candidate<BwdFilterAlgo>>>,
}

impl ConvPlan {
    fn new(p: &ConvProblem) -> std::result::Result<ConvPlan, cr::CudnnError> {
        let dt = p.data_type();
        let fmt = cs::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
        let x = TensorDesc(cr::create_tensor_descriptor()?);
        let y = TensorDesc(cr::create_tensor_descriptor()?);
        let w = FilterDesc(cr::create_filter_descriptor()?);
        let conv = ConvDesc(cr::create_convolution_descriptor()?);
        let (s, pd, d) = (p.stride, p.padding, p.dilation);
        // SAFETY: freshly created descriptors, plain integer arguments validated to fit.
        unsafe {
            cr::set_tensor4d_descriptor(x.0, fmt, dt, p.x_dims())?;
            cr::set_filter4d_descriptor(w.0, dt, fmt, p.w_dims())?;
            // Cross-correlation (what deep-learning "convolution" means) accumulated in f32.
            cr::set_convolution2d_descriptor(
                conv.0,
                pd.h as i32,
                pd.w as i32,
                s.h as i32,
                s.w as i32,
                d.h as i32,
                d.w as i32,
                cs::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                cs::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )?;
            cr::set_convolution_group_count(conv.0, p.groups as i32)?;
            cr::set_convolution_math_type(conv.0, p.initial_math())?;
        }
        let yd = p
            .y_dims()
            .map_err(|_| cr::CudnnError(cs::cudnnStatus_t::CUDNN_STATUS_BAD_PARAM))?;
        // SAFETY: as above.
        unsafe { cr::set_tensor4d_descriptor(y.0, fmt, dt, yd)? };
        Ok(ConvPlan {
            x,
            w,
            y,
            conv,
            fwd: None,
            bwd_data: None,
            bwd_filter: None,
        })
    }
}

/// Per-device cuDNN state: the handle (bound to the device's stream) and the plans.
struct State {
    handle: cs::cudnnHandle_t,
    plans: HashMap<ConvProblem, ConvPlan>,
}

// SAFETY: the handle and descriptors are only used while holding the state's mutex, one thread
// at a time, which is what cuDNN requires of a handle.
unsafe impl Send for State {}

impl Drop for State {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: created by create_handle, destroyed once.
        let _ = unsafe { cr::destroy_handle(self.handle) };
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Slot = Arc<Mutex<Option<State>>>;

/// The state of `dev`, created on first use (None inside when cuDNN cannot be initialised:
/// remembered, so a broken install costs one attempt, not one per convolution).
fn state_of(dev: &CudaDevice) -> Result<Slot> {
    static STATES: OnceLock<Mutex<HashMap<usize, Slot>>> = OnceLock::new();
    let mut map = lock(STATES.get_or_init(Default::default));
    if let Some(s) = map.get(&dev.ordinal()) {
        return Ok(s.clone());
    }
    let real = dev.real().ok_or_else(|| {
        CudaError::invalid("cudnnCreate", "an emulated device has no cuDNN handle")
    })?;
    let state = guard(|| {
        real.bind()?;
        let handle = cr::create_handle().map_err(cudnn_err("cudnnCreate"))?;
        let stream = real.cu_stream() as cs::cudaStream_t;
        // SAFETY: a fresh handle and the device's live stream.
        if let Err(e) = unsafe { cr::set_stream(handle, stream) } {
            // SAFETY: created just above.
            let _ = unsafe { cr::destroy_handle(handle) };
            return Err(cudnn_err("cudnnSetStream")(e));
        }
        Ok(State {
            handle,
            plans: HashMap::new(),
        })
    })
    .ok();
    let slot = Arc::new(Mutex::new(state));
    map.insert(dev.ordinal(), slot.clone());
    Ok(slot)
}

fn check_operands(
    p: &ConvProblem,
    pass: Pass,
    a: &DevSlice<'_>,
    b: &DevSlice<'_>,
    out: &DevSlice<'_>,
) -> Result<()> {
    let (nx, nw, ny) = p.numels()?;
    let (na, nb, no, names) = match pass {
        Pass::Forward => (nx, nw, ny, ["x", "w", "y"]),
        Pass::BackwardData => (nw, ny, nx, ["w", "dy", "dx"]),
        Pass::BackwardFilter => (nx, ny, nw, ["x", "dy", "dw"]),
    };
    for (s, n, what) in [(a, na, names[0]), (b, nb, names[1]), (out, no, names[2])] {
        crate::check::need("cudnn conv2d", what, s, p.dtype, n)?;
    }
    Ok(())
}

/// Runs one pass: `out = pass(a, b)` with beta = 0. A panic inside cudarc's cuDNN wrappers (a
/// symbol missing from an unexpected libcudnn version) means "cannot use cuDNN", not an error.
fn run(
    dev: &CudaDevice,
    p: &ConvProblem,
    pass: Pass,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<Ran> {
    match run_pass(dev, p, pass, a, b, out) {
        Err(CudaError::Panicked(m)) => Ok(Ran::Unsupported(format!("a cuDNN call panicked: {m}"))),
        r => r,
    }
}

fn run_pass(
    dev: &CudaDevice,
    p: &ConvProblem,
    pass: Pass,
    a: DevSlice<'_>,
    b: DevSlice<'_>,
    out: DevSlice<'_>,
) -> Result<Ran> {
    if let Some(emu) = dev.emulated() {
        p.validate()?;
        check_operands(p, pass, &a, &b, &out)?;
        emu.conv(p, pass, a.ptr(), b.ptr(), out.ptr())?;
        return Ok(Ran::Done);
    }
    if !available() {
        return Ok(Ran::Unsupported("libcudnn is not loadable".into()));
    }
    p.validate()?;
    check_operands(p, pass, &a, &b, &out)?;
    let slot = state_of(dev)?;
    let mut guard_state = lock(&slot);
    let Some(state) = guard_state.as_mut() else {
        return Ok(Ran::Unsupported(
            "cuDNN could not be initialised on this device".into(),
        ));
    };
    let handle = state.handle;
    if !state.plans.contains_key(p) {
        match guard(|| Ok(ConvPlan::new(p)))? {
            Ok(plan) => {
                state.plans.insert(*p, plan);
            }
            Err(e) if is_not_supported(&e) || (e.0 as u32) == 2000 || (e.0 as u32) == 3 => {
                return Ok(Ran::Unsupported(format!("cuDNN descriptors: {:?}", e.0)));
            }
            Err(e) => return Err(cudnn_err("cuDNN descriptors")(e)),
        }
    }
    let plan = state.plans.get_mut(p).expect("inserted above");
    if let Some(r) = dev.real() {
        r.bind()?;
    }
    // Choose (once) and look up the algorithm and its workspace.
    let (math, ws_bytes, algo) = match pass {
        Pass::Forward => {
            if plan.fwd.is_none() {
                plan.fwd = Some(guard(|| choose_fwd(handle, p, plan))?);
            }
            match plan.fwd.flatten() {
                Some(c) => (c.math, c.workspace, AnyAlgo::Fwd(c.algo)),
                None => {
                    return Ok(Ran::Unsupported(
                        "no cuDNN forward algorithm for this shape".into(),
                    ))
                }
            }
        }
        Pass::BackwardData => {
            if plan.bwd_data.is_none() {
                plan.bwd_data = Some(guard(|| choose_bwd_data(handle, p, plan))?);
            }
            match plan.bwd_data.flatten() {
                Some(c) => (c.math, c.workspace, AnyAlgo::Data(c.algo)),
                None => {
                    return Ok(Ran::Unsupported(
                        "no cuDNN backward-data algorithm for this shape".into(),
                    ))
                }
            }
        }
        Pass::BackwardFilter => {
            if plan.bwd_filter.is_none() {
                plan.bwd_filter = Some(guard(|| choose_bwd_filter(handle, p, plan))?);
            }
            match plan.bwd_filter.flatten() {
                Some(c) => (c.math, c.workspace, AnyAlgo::Filter(c.algo)),
                None => {
                    return Ok(Ran::Unsupported(
                        "no cuDNN backward-filter algorithm for this shape".into(),
                    ))
                }
            }
        }
    };
    let ws = if ws_bytes > 0 {
        Some(dev.alloc(ws_bytes, DType::U8, Pool::Temporary)?)
    } else {
        None
    };
    let (ws_ptr, ws_len) = ws.as_ref().map_or((std::ptr::null_mut(), 0), |b| {
        (b.ptr() as *mut std::ffi::c_void, b.num_bytes())
    });
    let (alpha, beta) = (1.0f32, 0.0f32);
    let al = &alpha as *const f32 as *const std::ffi::c_void;
    let be = &beta as *const f32 as *const std::ffi::c_void;
    let (pa, pb, po) = (
        a.ptr() as *const std::ffi::c_void,
        b.ptr() as *const std::ffi::c_void,
        out.ptr() as *mut std::ffi::c_void,
    );
    let r = guard(|| {
        // SAFETY: descriptors match the operands (checked by `check_operands`), pointers are live
        // device buffers of the right sizes, the workspace outlives the call in stream order.
        unsafe {
            cr::set_convolution_math_type(plan.conv.0, p.exec_math(math))
                .map_err(cudnn_err(pass.name()))?;
            let r = match algo {
                AnyAlgo::Fwd(al_) => cr::convolution_forward(
                    handle,
                    al,
                    plan.x.0,
                    pa,
                    plan.w.0,
                    pb,
                    plan.conv.0,
                    al_,
                    ws_ptr,
                    ws_len,
                    be,
                    plan.y.0,
                    po,
                ),
                AnyAlgo::Data(al_) => cr::convolution_backward_data(
                    handle,
                    al,
                    plan.w.0,
                    pa,
                    plan.y.0,
                    pb,
                    plan.conv.0,
                    al_,
                    ws_ptr,
                    ws_len,
                    be,
                    plan.x.0,
                    po,
                ),
                AnyAlgo::Filter(al_) => cr::convolution_backward_filter(
                    handle,
                    al,
                    plan.x.0,
                    pa,
                    plan.y.0,
                    pb,
                    plan.conv.0,
                    al_,
                    ws_ptr,
                    ws_len,
                    be,
                    plan.w.0,
                    po,
                ),
            };
            Ok(r)
        }
    })?;
    match r {
        Ok(()) => Ok(Ran::Done),
        Err(e) if is_not_supported(&e) => {
            // Remember: this direction falls back from now on.
            match pass {
                Pass::Forward => plan.fwd = Some(None),
                Pass::BackwardData => plan.bwd_data = Some(None),
                Pass::BackwardFilter => plan.bwd_filter = Some(None),
            }
            Ok(Ran::Unsupported(format!("{}: NOT_SUPPORTED", pass.name())))
        }
        Err(e) => Err(cudnn_err(pass.name())(e)),
    }
}

#[derive(Clone, Copy)]
enum AnyAlgo {
    Fwd(FwdAlgo),
    Data(BwdDataAlgo),
    Filter(BwdFilterAlgo),
}

fn candidate<A: Copy>(
    algo: A,
    status: cs::cudnnStatus_t,
    determinism: cs::cudnnDeterminism_t,
    memory: usize,
    math: cs::cudnnMathType_t,
) -> Candidate<A> {
    Candidate {
        algo,
        ok: status == cs::cudnnStatus_t::CUDNN_STATUS_SUCCESS,
        deterministic: determinism == cs::cudnnDeterminism_t::CUDNN_DETERMINISTIC,
        workspace: memory,
        math,
    }
}

/// cuDNN's heuristics ask for at most this many ranked algorithms (more than any direction has).
const MAX_ALGOS: usize = 16;

fn choose_fwd(
    h: cs::cudnnHandle_t,
    p: &ConvProblem,
    plan: &ConvPlan,
) -> Result<Option<Candidate<FwdAlgo>>> {
    let mut n = 0i32;
    // SAFETY: zeroed perf structs are plain data; cuDNN fills `n` of them.
    let mut perf: [cs::cudnnConvolutionFwdAlgoPerf_t; MAX_ALGOS] = unsafe { std::mem::zeroed() };
    let r = unsafe {
        cr::get_convolution_forward_algorithm(
            h,
            plan.x.0,
            plan.w.0,
            plan.conv.0,
            plan.y.0,
            MAX_ALGOS as i32,
            &mut n,
            perf.as_mut_ptr(),
        )
    };
    match r {
        Ok(()) => {}
        Err(e) if is_not_supported(&e) => return Ok(None),
        Err(e) => return Err(cudnn_err("cudnnGetConvolutionForwardAlgorithm_v7")(e)),
    }
    let c: Vec<_> = perf[..(n.max(0) as usize).min(MAX_ALGOS)]
        .iter()
        .map(|q| candidate(q.algo, q.status, q.determinism, q.memory, q.mathType))
        .collect();
    let Some(mut c) = pick(p, &c) else {
        return Ok(None);
    };
    // The exact workspace for the mode it will run in (the heuristic's figure is an estimate).
    // SAFETY: live handle and descriptors.
    let ws = unsafe {
        cr::set_convolution_math_type(plan.conv.0, p.exec_math(c.math)).and_then(|_| {
            cr::get_convolution_forward_workspace_size(
                h,
                plan.x.0,
                plan.w.0,
                plan.conv.0,
                plan.y.0,
                c.algo,
            )
        })
    };
    Ok(ws
        .ok()
        .map(|w| {
            c.workspace = c.workspace.max(w);
            c
        })
        .filter(|c| c.workspace <= MAX_WORKSPACE))
}

fn choose_bwd_data(
    h: cs::cudnnHandle_t,
    p: &ConvProblem,
    plan: &ConvPlan,
) -> Result<Option<Candidate<BwdDataAlgo>>> {
    let mut n = 0i32;
    // SAFETY: as in choose_fwd.
    let mut perf: [cs::cudnnConvolutionBwdDataAlgoPerf_t; MAX_ALGOS] =
        unsafe { std::mem::zeroed() };
    let r = unsafe {
        cr::get_convolution_backward_data_algorithm(
            h,
            plan.w.0,
            plan.y.0,
            plan.conv.0,
            plan.x.0,
            MAX_ALGOS as i32,
            &mut n,
            perf.as_mut_ptr(),
        )
    };
    match r {
        Ok(()) => {}
        Err(e) if is_not_supported(&e) => return Ok(None),
        Err(e) => return Err(cudnn_err("cudnnGetConvolutionBackwardDataAlgorithm_v7")(e)),
    }
    let c: Vec<_> = perf[..(n.max(0) as usize).min(MAX_ALGOS)]
        .iter()
        .map(|q| candidate(q.algo, q.status, q.determinism, q.memory, q.mathType))
        .collect();
    let Some(mut c) = pick(p, &c) else {
        return Ok(None);
    };
    // SAFETY: as in choose_fwd.
    let ws = unsafe {
        cr::set_convolution_math_type(plan.conv.0, p.exec_math(c.math)).and_then(|_| {
            cr::get_convolution_backward_data_workspace_size(
                h,
                plan.w.0,
                plan.y.0,
                plan.conv.0,
                plan.x.0,
                c.algo,
            )
        })
    };
    Ok(ws
        .ok()
        .map(|w| {
            c.workspace = c.workspace.max(w);
            c
        })
        .filter(|c| c.workspace <= MAX_WORKSPACE))
}

fn choose_bwd_filter(
    h: cs::cudnnHandle_t,
    p: &ConvProblem,
    plan: &ConvPlan,
) -> Result<Option<Candidate<BwdFilterAlgo>>> {
    let mut n = 0i32;
    // SAFETY: as in choose_fwd.
    let mut perf: [cs::cudnnConvolutionBwdFilterAlgoPerf_t; MAX_ALGOS] =
        unsafe { std::mem::zeroed() };
    let r = unsafe {
        cr::get_convolution_backward_filter_algorithm(
            h,
            plan.x.0,
            plan.y.0,
            plan.conv.0,
            plan.w.0,
            MAX_ALGOS as i32,
            &mut n,
            perf.as_mut_ptr(),
        )
    };
    match r {
        Ok(()) => {}
        Err(e) if is_not_supported(&e) => return Ok(None),
        Err(e) => {
            return Err(cudnn_err("cudnnGetConvolutionBackwardFilterAlgorithm_v7")(
                e,
            ))
        }
    }
    let c: Vec<_> = perf[..(n.max(0) as usize).min(MAX_ALGOS)]
        .iter()
        .map(|q| candidate(q.algo, q.status, q.determinism, q.memory, q.mathType))
        .collect();
    let Some(mut c) = pick(p, &c) else {
        return Ok(None);
    };
    // SAFETY: as in choose_fwd.
    let ws = unsafe {
        cr::set_convolution_math_type(plan.conv.0, p.exec_math(c.math)).and_then(|_| {
            cr::get_convolution_backward_filter_workspace_size(
                h,
                plan.x.0,
                plan.y.0,
                plan.conv.0,
                plan.w.0,
                c.algo,
            )
        })
    };
    Ok(ws
        .ok()
        .map(|w| {
            c.workspace = c.workspace.max(w);
            c
        })
        .filter(|c| c.workspace <= MAX_WORKSPACE))
}

/// y = conv2d(x, w) (contiguous NCHW operands of `p.dtype`).
pub fn conv2d_forward(
    dev: &CudaDevice,
    p: &ConvProblem,
    x: DevSlice<'_>,
    w: DevSlice<'_>,
    y: DevSlice<'_>,
) -> Result<Ran> {
    run(dev, p, Pass::Forward, x, w, y)
}

/// dx = the input gradient of conv2d from the weight and the output gradient dy.
pub fn conv2d_backward_data(
    dev: &CudaDevice,
    p: &ConvProblem,
    w: DevSlice<'_>,
    dy: DevSlice<'_>,
    dx: DevSlice<'_>,
) -> Result<Ran> {
    run(dev, p, Pass::BackwardData, w, dy, dx)
}

/// dw = the weight gradient of conv2d from the input x and the output gradient dy.
pub fn conv2d_backward_filter(
    dev: &CudaDevice,
    p: &ConvProblem,
    x: DevSlice<'_>,
    dy: DevSlice<'_>,
    dw: DevSlice<'_>,
) -> Result<Ran> {
    run(dev, p, Pass::BackwardFilter, x, dy, dw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cs::cudnnMathType_t as M;
    use sinter_types::Hw;

    fn prob(dtype: DType, tf32: bool) -> ConvProblem {
        ConvProblem {
            n: 3,
            c: 4,
            h: 9,
            w: 7,
            o: 6,
            kh: 3,
            kw: 2,
            stride: Hw::square(2),
            padding: Hw::square(1),
            dilation: Hw::square(1),
            groups: 2,
            dtype,
            allow_tf32: tf32,
        }
    }

    #[test]
    fn descriptor_dims_follow_the_tensor_layouts() {
        let p = prob(DType::F32, false);
        assert_eq!(p.x_dims(), [3, 4, 9, 7]);
        // Grouped filters hold c/groups input channels.
        assert_eq!(p.w_dims(), [6, 2, 3, 2]);
        // (9 + 2 - 3) / 2 + 1 = 5, (7 + 2 - 2) / 2 + 1 = 4.
        assert_eq!(p.y_dims().unwrap(), [3, 6, 5, 4]);
        assert_eq!(
            p.numels().unwrap(),
            (3 * 4 * 9 * 7, 6 * 2 * 3 * 2, 3 * 6 * 5 * 4)
        );
        let mut d = p;
        d.dilation = Hw::square(2);
        d.padding = Hw::square(2);
        // span 5: (9 + 4 - 5) / 2 + 1 = 5; span 3: (7 + 4 - 3) / 2 + 1 = 5.
        assert_eq!(d.out_hw().unwrap(), (5, 5));
        // Per axis: stride (1, 2), padding (0, 1), dilation (2, 1): rows (9 - 5) / 1 + 1 = 5,
        // columns (7 + 2 - 2) / 2 + 1 = 4.
        d.stride = Hw::new(1, 2);
        d.padding = Hw::new(0, 1);
        d.dilation = Hw::new(2, 1);
        assert_eq!(d.out_hw().unwrap(), (5, 4));
        assert_eq!(p.data_type(), cs::cudnnDataType_t::CUDNN_DATA_FLOAT);
        assert_eq!(
            prob(DType::F16, false).data_type(),
            cs::cudnnDataType_t::CUDNN_DATA_HALF
        );
        assert_eq!(
            prob(DType::BF16, false).data_type(),
            cs::cudnnDataType_t::CUDNN_DATA_BFLOAT16
        );
    }

    #[test]
    fn bad_problems_are_errors() {
        let mut p = prob(DType::F32, false);
        p.groups = 3;
        assert!(p.validate().unwrap_err().to_string().contains("groups"));
        let mut p = prob(DType::I64, false);
        p.groups = 1;
        assert!(p.validate().unwrap_err().to_string().contains("f32"));
        let mut p = prob(DType::F32, false);
        p.kh = 20;
        assert!(p
            .validate()
            .unwrap_err()
            .to_string()
            .contains("does not fit"));
        let mut p = prob(DType::F32, false);
        p.n = 1 << 31;
        assert!(p.validate().unwrap_err().to_string().contains("int range"));
        let mut p = prob(DType::F32, false);
        p.n = 1 << 24;
        p.c = 1 << 10;
        p.groups = 1;
        assert!(p.validate().unwrap_err().to_string().contains("elements"));
        prob(DType::BF16, true).validate().unwrap();
    }

    #[test]
    fn math_modes_keep_the_promised_precision() {
        let strict = prob(DType::F32, false);
        assert_eq!(strict.initial_math(), M::CUDNN_FMA_MATH);
        assert!(strict.math_allowed(M::CUDNN_FMA_MATH));
        assert!(strict.math_allowed(M::CUDNN_DEFAULT_MATH));
        assert!(!strict.math_allowed(M::CUDNN_TENSOR_OP_MATH));
        assert!(!strict.math_allowed(M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
        // Whatever cuDNN reports, plain fp32 runs with FMA math (no TF32).
        assert_eq!(strict.exec_math(M::CUDNN_DEFAULT_MATH), M::CUDNN_FMA_MATH);
        assert_eq!(
            prob(DType::F32, true).exec_math(M::CUDNN_DEFAULT_MATH),
            M::CUDNN_DEFAULT_MATH
        );
        assert_eq!(
            prob(DType::BF16, false).exec_math(M::CUDNN_TENSOR_OP_MATH),
            M::CUDNN_TENSOR_OP_MATH
        );
        let tf32 = prob(DType::F32, true);
        assert_eq!(tf32.initial_math(), M::CUDNN_DEFAULT_MATH);
        assert!(tf32.math_allowed(M::CUDNN_TENSOR_OP_MATH));
        assert!(!tf32.math_allowed(M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
        for d in [DType::F16, DType::BF16] {
            let h = prob(d, false);
            assert_eq!(h.initial_math(), M::CUDNN_TENSOR_OP_MATH);
            assert!(h.math_allowed(M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION));
        }
    }

    fn cand(algo: u32, ok: bool, det: bool, ws: usize, math: M) -> Candidate<u32> {
        Candidate {
            algo,
            ok,
            deterministic: det,
            workspace: ws,
            math,
        }
    }

    #[test]
    fn pick_prefers_the_first_usable_deterministic_algorithm() {
        let strict = prob(DType::F32, false);
        let ranked = [
            cand(0, false, true, 0, M::CUDNN_FMA_MATH),      // failed
            cand(1, true, true, 0, M::CUDNN_TENSOR_OP_MATH), // would use TF32
            cand(2, true, false, 0, M::CUDNN_DEFAULT_MATH),  // non-deterministic
            cand(3, true, true, MAX_WORKSPACE + 1, M::CUDNN_FMA_MATH), // too much memory
            cand(4, true, true, 64, M::CUDNN_FMA_MATH),
            cand(5, true, true, 0, M::CUDNN_FMA_MATH),
        ];
        assert_eq!(pick(&strict, &ranked).unwrap().algo, 4);
        // With TF32 allowed the tensor-op algorithm qualifies first.
        assert_eq!(pick(&prob(DType::F32, true), &ranked).unwrap().algo, 1);
        // Without a deterministic one, the fastest usable one.
        assert_eq!(pick(&strict, &ranked[..3]).unwrap().algo, 2);
        // Nothing usable: fall back.
        assert!(pick(&strict, &ranked[..2]).is_none());
        assert!(pick::<u32>(&strict, &[]).is_none());
    }

    #[test]
    fn not_supported_statuses_fall_back_and_failures_do_not() {
        for code in [3000, 3002, 3007, 3009, 3999, 1008, 2003, 9] {
            assert!(falls_back(code), "{code}");
        }
        for code in [0, 2000, 4000, 4004, 5000, 5002, 1001] {
            assert!(!falls_back(code), "{code}");
        }
        assert!(falls_back(
            cs::cudnnStatus_t::CUDNN_STATUS_NOT_SUPPORTED as u32
        ));
    }

    #[test]
    fn absent_library_never_panics() {
        // Whatever this machine has, asking is safe; without cuDNN every pass is Unsupported
        // (checked end to end by the GPU tests).
        let _ = available();
        let _ = crate::runtime::cudnn_version();
    }
}
