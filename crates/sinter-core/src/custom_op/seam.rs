//! The custom-op primitive of the backend seam: each backend runs an op's forward for its own
//! storage (the CPU: the Rust closure of `cpu.rs`; CUDA: the NVRTC kernel of `cuda.rs`) or says
//! it has none. `Storage::custom_forward` dispatches to it, once, like every other primitive.
//! The call carries the forwards themselves, not the op, so that the storage layer needs
//! nothing from the op above it (which records autograd nodes on tensors).

use sinter_cuda::launch::Arg;
use sinter_cuda::user_kernel::UserLaunch;

use super::cpu::{CpuForwardFn, HostInput, HostOutput, HostSlice};
use super::cuda::CudaKernel;
use super::spec::{OutputSpec, TensorMeta};
use crate::backend::BackendStorage;
use crate::cpu::CpuStorage;
use crate::cuda::{alloc, CudaStorage};
use crate::{bail, Device, Error, Layout, Result};

/// One forward call: the op's name and forwards, its inputs' metadata and the outputs it must
/// make.
pub(crate) struct ForwardCall<'a> {
    pub name: &'static str,
    pub cpu: Option<&'a CpuForwardFn>,
    pub cuda: Option<&'a CudaKernel>,
    pub metas: &'a [TensorMeta],
    pub specs: &'a [OutputSpec],
}

pub(crate) trait CustomForward: BackendStorage {
    /// The op's outputs (fresh, contiguous, one per spec, in order) computed from `inputs`
    /// (all of this backend, at least one), or None when the op has no forward for it.
    fn custom_forward(
        call: &ForwardCall<'_>,
        inputs: &[(&Self, &Layout)],
    ) -> Result<Option<Vec<Self>>>;
}

/// The elements `l` addresses in `s`: borrowed when contiguous, else from `copy`.
fn host_slice<'a>(s: &'a CpuStorage, l: &Layout, copy: Option<&'a CpuStorage>) -> HostSlice<'a> {
    let (s, r) = match copy {
        Some(c) => (c, 0..c.len()),
        None => (s, l.contiguous_range().expect("contiguous or copied")),
    };
    match s {
        CpuStorage::F32(v) => HostSlice::F32(&v[r]),
        CpuStorage::F16(v) => HostSlice::F16(&v[r]),
        CpuStorage::BF16(v) => HostSlice::BF16(&v[r]),
        CpuStorage::I64(v) => HostSlice::I64(&v[r]),
        CpuStorage::Bool(v) => HostSlice::Bool(&v[r]),
    }
}

/// An error unless the forward's outputs match the declared ones in number, shape, dtype and
/// length.
fn check_outputs(op: &str, outs: &[HostOutput], specs: &[OutputSpec]) -> Result<()> {
    if outs.len() != specs.len() {
        bail!(
            "custom op `{op}`: the CPU forward returned {} outputs, but the op declares {} (saved-only ones included)",
            outs.len(),
            specs.len()
        );
    }
    for (k, (o, s)) in outs.iter().zip(specs).enumerate() {
        if o.shape != s.shape {
            bail!(
                "custom op `{op}`: output {k} of the CPU forward has shape {:?}, but the op declares {:?}",
                o.shape,
                s.shape
            );
        }
        if o.data.dtype() != s.dtype {
            bail!(
                "custom op `{op}`: output {k} of the CPU forward is {}, but the op declares {}",
                o.data.dtype(),
                s.dtype
            );
        }
        if o.data.len() != s.numel() {
            bail!(
                "custom op `{op}`: output {k} of the CPU forward holds {} elements, but its shape {:?} has {}",
                o.data.len(),
                s.shape,
                s.numel()
            );
        }
    }
    Ok(())
}

impl CustomForward for CpuStorage {
    fn custom_forward(
        call: &ForwardCall<'_>,
        inputs: &[(&Self, &Layout)],
    ) -> Result<Option<Vec<Self>>> {
        let Some(f) = call.cpu else {
            return Ok(None);
        };
        let copies: Vec<Option<CpuStorage>> = inputs
            .iter()
            .map(|(s, l)| match l.contiguous_range() {
                Some(_) => Ok(None),
                None => s.copy_strided(l).map(Some),
            })
            .collect::<Result<_>>()?;
        let host: Vec<HostInput<'_>> = inputs
            .iter()
            .zip(&copies)
            .enumerate()
            .map(|(index, ((s, l), c))| HostInput {
                op: call.name,
                index,
                data: host_slice(s, l, c.as_ref()),
                shape: l.shape(),
            })
            .collect();
        let outs = f(&host)?;
        check_outputs(call.name, &outs, call.specs)?;
        Ok(Some(outs.into_iter().map(|o| o.data).collect()))
    }
}

/// The buffer an in-place output is written to: the input's own when its view is the whole
/// buffer, else a fresh copy of the view's values.
fn in_place_buffer(
    dev: &sinter_cuda::CudaDevice,
    v: &crate::cuda::storage::DevView,
) -> Result<std::sync::Arc<sinter_cuda::DeviceBuffer>> {
    if v.off == 0 && v.len == v.buf.len() {
        return Ok(v.buf.clone());
    }
    let out = alloc(dev, v.len, v.buf.dtype())?;
    sinter_cuda::ops::copy::cast(dev, v.slice(), out.as_slice())
        .map_err(|e| Error::Msg(format!("in-place output: {e}")))?;
    Ok(out)
}

impl CustomForward for CudaStorage {
    fn custom_forward(
        call: &ForwardCall<'_>,
        inputs: &[(&Self, &Layout)],
    ) -> Result<Option<Vec<Self>>> {
        let Some(k) = call.cuda else {
            return Ok(None);
        };
        let first = inputs[0].0;
        let dev = first.device();
        let on_device = |e: sinter_cuda::CudaError| {
            Error::Msg(format!(
                "custom op `{}` on {}: {e}",
                call.name,
                Device::Cuda(first.ordinal())
            ))
        };
        let views = inputs
            .iter()
            .map(|(s, l)| s.window(l))
            .collect::<Result<Vec<_>>>()?;
        let outs = call
            .specs
            .iter()
            .map(|s| match s.in_place_of {
                Some(i) => in_place_buffer(dev, &views[i]),
                None => alloc(dev, s.numel(), s.dtype),
            })
            .collect::<Result<Vec<_>>>()?;
        let plan = (k.launch)(call.metas)?;
        let args = views
            .iter()
            .map(|v| Arg::Ptr(v.slice().ptr()))
            .chain(outs.iter().map(|b| Arg::Ptr(b.ptr())))
            .chain(plan.scalars.iter().map(|s| s.arg()))
            .collect();
        let launch = UserLaunch {
            kernel: k.kernel.clone(),
            grid: plan.grid,
            block: plan.block,
            shared_mem: plan.shared_mem,
            args,
            declared: plan.cost,
        };
        dev.launch_user(&k.source, &launch).map_err(on_device)?;
        Ok(Some(
            outs.into_iter()
                .zip(call.specs)
                .map(|(b, s)| first.sibling(b, s.dtype))
                .collect(),
        ))
    }
}
