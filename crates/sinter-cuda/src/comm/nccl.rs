//! Real NCCL (`libnccl`, loaded at run time under the bare name `libnccl.so`).

use std::sync::Arc;

use cudarc::nccl::sys as nsys;

use super::api::{Call, Collectives, Op, RedOp, UniqueId};
use crate::device::CudaDevice;
use crate::driver::real::RealStream;
use crate::driver::Stream;
use crate::dtype::DType;
use crate::error::{guard, CudaError, Result};

/// What to do when NCCL cannot be loaded.
pub const NCCL_HINT: &str = "NCCL is loaded at run time under the bare name `libnccl.so`, which most installs do not ship (only `libnccl.so.2`): create a symlink `libnccl.so -> libnccl.so.2` in a directory on LD_LIBRARY_PATH (e.g. `mkdir -p ~/lib && ln -s /usr/lib/x86_64-linux-gnu/libnccl.so.2 ~/lib/libnccl.so && export LD_LIBRARY_PATH=~/lib:$LD_LIBRARY_PATH`), or pass `--dist-backend host`";

/// NCCL's version if the driver and NCCL both load, else an explanation with the fix.
pub(super) fn version() -> std::result::Result<(u32, u32, u32), String> {
    let libs = crate::libs::libraries();
    if !libs.driver {
        return Err("the CUDA driver (libcuda.so.1) is not loadable on this machine".into());
    }
    if !libs.nccl {
        return Err(format!("NCCL could not be loaded. {NCCL_HINT}"));
    }
    let v = guard(|| {
        cudarc::nccl::result::get_nccl_version()
            .map_err(|e| CudaError::Panicked(format!("{:?}", e.0)))
    })
    .map_err(|e| format!("NCCL loaded but ncclGetVersion failed: {e}"))?;
    Ok(split_nccl_version(v as u32))
}

/// NCCL encodes 2.19.3 as 21903 (and versions before 2.9 as 2903).
pub fn split_nccl_version(v: u32) -> (u32, u32, u32) {
    if v >= 10000 {
        (v / 10000, (v / 100) % 100, v % 100)
    } else {
        (v / 1000, (v / 100) % 10, v % 100)
    }
}

fn err(op: &'static str, r: nsys::ncclResult_t) -> CudaError {
    CudaError::Driver {
        op,
        msg: format!("NCCL: {r:?}"),
    }
}

pub(super) fn unique_id() -> Result<UniqueId> {
    version().map_err(|m| CudaError::LibraryNotFound {
        lib: "libnccl.so",
        hint: m,
    })?;
    let id =
        guard(|| cudarc::nccl::result::get_uniqueid().map_err(|e| err("ncclGetUniqueId", e.0)))?;
    Ok(id.internal.map(|c| c as u8))
}

fn data_type(d: DType) -> nsys::ncclDataType_t {
    match d {
        DType::F16 => nsys::ncclDataType_t::ncclFloat16,
        DType::BF16 => nsys::ncclDataType_t::ncclBfloat16,
        _ => nsys::ncclDataType_t::ncclFloat32,
    }
}

fn red_op(op: RedOp) -> nsys::ncclRedOp_t {
    match op {
        RedOp::Sum => nsys::ncclRedOp_t::ncclSum,
        RedOp::Avg => nsys::ncclRedOp_t::ncclAvg,
    }
}

/// An NCCL communicator handle (null once aborted or destroyed).
pub(super) struct NcclComm(nsys::ncclComm_t);

// SAFETY: NCCL allows a communicator to be used from any thread, one call at a time, which
// `Comm`'s `&self` / `&mut self` methods and the owning communicator's `&mut` use ensure.
unsafe impl Send for NcclComm {}
unsafe impl Sync for NcclComm {}

impl NcclComm {
    pub(super) fn init_rank(
        dev: &Arc<CudaDevice>,
        id: &UniqueId,
        nranks: usize,
        rank: usize,
    ) -> Result<NcclComm> {
        let r = dev
            .real()
            .ok_or_else(|| CudaError::invalid("ncclCommInitRank", "not a real GPU"))?;
        r.bind()?;
        let uid = nsys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm: nsys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: `comm` is a valid out-pointer; the id is the one every member uses.
        let res = guard(|| {
            Ok(unsafe { nsys::ncclCommInitRank(&mut comm, nranks as i32, uid, rank as i32) })
        })?;
        if res != nsys::ncclResult_t::ncclSuccess {
            return Err(err("ncclCommInitRank", res));
        }
        Ok(NcclComm(comm))
    }
}

impl Collectives for NcclComm {
    fn owns(&self, _dev: &CudaDevice, stream: &Stream) -> bool {
        RealStream::of(stream).is_some()
    }

    fn is_emulated(&self) -> bool {
        false
    }

    fn call(&self, dev: &CudaDevice, op: &Op, stream: &Stream) -> Result<()> {
        if self.0.is_null() {
            return Err(CudaError::invalid("nccl", "the communicator was aborted"));
        }
        if let Some(r) = dev.real() {
            r.bind()?;
        }
        let s = RealStream::of(stream)
            .ok_or_else(|| CudaError::invalid("nccl", "not a CUDA stream"))?
            .0
            .cu_stream() as nsys::cudaStream_t;
        let dt = data_type(op.dtype);
        let (send, recv) = (op.send as *const _, op.recv as *mut _);
        // SAFETY: `Comm` checked the buffers' dtypes and lengths against the call; they lie in
        // live allocations of this device, which the caller keeps alive in stream order.
        let res = unsafe {
            match op.call {
                Call::AllReduce(o) => {
                    nsys::ncclAllReduce(send, recv, op.count, dt, red_op(o), self.0, s)
                }
                Call::ReduceScatter(o) => {
                    nsys::ncclReduceScatter(send, recv, op.recv_count, dt, red_op(o), self.0, s)
                }
                Call::AllGather => nsys::ncclAllGather(send, recv, op.count, dt, self.0, s),
                Call::Broadcast(root) => {
                    nsys::ncclBroadcast(send, recv, op.count, dt, root as i32, self.0, s)
                }
                Call::Send(peer) => nsys::ncclSend(send, op.count, dt, peer as i32, self.0, s),
                Call::Recv(peer) => nsys::ncclRecv(recv, op.count, dt, peer as i32, self.0, s),
            }
        };
        if res != nsys::ncclResult_t::ncclSuccess {
            return Err(err("nccl collective", res));
        }
        Ok(())
    }

    fn async_error(&self) -> Option<String> {
        if self.0.is_null() {
            return None;
        }
        let mut e = nsys::ncclResult_t::ncclSuccess;
        // SAFETY: live communicator, valid out-pointer.
        unsafe { nsys::ncclCommGetAsyncError(self.0, &mut e) };
        (e != nsys::ncclResult_t::ncclSuccess && e != nsys::ncclResult_t::ncclInProgress)
            .then(|| format!("{e:?}"))
    }

    fn abort(&mut self) {
        if !self.0.is_null() {
            // SAFETY: live communicator; abort makes pending kernels return.
            unsafe { nsys::ncclCommAbort(self.0) };
            self.0 = std::ptr::null_mut();
        }
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: live communicator; the owner synchronised its stream first.
            unsafe { nsys::ncclCommDestroy(self.0) };
        }
    }
}
