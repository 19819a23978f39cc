//! A custom op's CPU forward: a Rust closure over contiguous host slices ([`HostInput`]) that
//! returns its outputs ([`HostOutput`]), checked against the op's declared outputs.

use half::{bf16, f16};

use super::seam::{CustomForward, ForwardCall};
use super::spec::OutputSpec;
use crate::backend::BackendStorage;
use crate::cpu::CpuStorage;
use crate::{bail, DType, Error, Layout, Result};

/// The closure of a CPU forward.
pub(crate) type CpuForwardFn = dyn Fn(&[HostInput<'_>]) -> Result<Vec<HostOutput>> + Send + Sync;

/// Host elements of one dtype.
#[derive(Clone, Copy, Debug)]
pub enum HostSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    BF16(&'a [bf16]),
    I64(&'a [i64]),
    Bool(&'a [bool]),
}

/// One input of a CPU forward: its elements, contiguous and row-major, and its shape.
#[derive(Clone, Copy, Debug)]
pub struct HostInput<'a> {
    op: &'static str,
    index: usize,
    data: HostSlice<'a>,
    shape: &'a [usize],
}

macro_rules! typed_getter {
    ($(#[$doc:meta])* $name:ident, $variant:ident, $t:ty) => {
        $(#[$doc])*
        pub fn $name(&self) -> Result<&'a [$t]> {
            match self.data {
                HostSlice::$variant(v) => Ok(v),
                _ => Err(self.wrong_dtype(DType::$variant)),
            }
        }
    };
}

impl<'a> HostInput<'a> {
    pub fn shape(&self) -> &'a [usize] {
        self.shape
    }
    pub fn dtype(&self) -> DType {
        match self.data {
            HostSlice::F32(_) => DType::F32,
            HostSlice::F16(_) => DType::F16,
            HostSlice::BF16(_) => DType::BF16,
            HostSlice::I64(_) => DType::I64,
            HostSlice::Bool(_) => DType::Bool,
        }
    }
    pub fn data(&self) -> HostSlice<'a> {
        self.data
    }
    typed_getter!(
        /// The elements as f32 (an error naming the op and input when they are not f32).
        f32, F32, f32
    );
    typed_getter!(f16, F16, f16);
    typed_getter!(bf16, BF16, bf16);
    typed_getter!(i64, I64, i64);
    typed_getter!(bool, Bool, bool);

    fn wrong_dtype(&self, want: DType) -> Error {
        Error::Msg(format!(
            "custom op `{}`: the CPU forward reads input {} as {want}, but it is {} (declare the dtypes the op accepts with CustomOpBuilder::dtypes)",
            self.op,
            self.index,
            self.dtype()
        ))
    }
}

/// One output of a CPU forward: its elements (row-major) and shape.
#[derive(Clone, Debug)]
pub struct HostOutput {
    data: CpuStorage,
    shape: Vec<usize>,
}

impl HostOutput {
    pub fn new(data: CpuStorage, shape: &[usize]) -> HostOutput {
        HostOutput {
            data,
            shape: shape.to_vec(),
        }
    }
    pub fn f32(data: Vec<f32>, shape: &[usize]) -> HostOutput {
        HostOutput::new(CpuStorage::F32(data), shape)
    }
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
        let Some(f) = call.def.cpu.as_deref() else {
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
                op: call.def.name,
                index,
                data: host_slice(s, l, c.as_ref()),
                shape: l.shape(),
            })
            .collect();
        let outs = f(&host)?;
        check_outputs(call.def.name, &outs, call.specs)?;
        Ok(Some(outs.into_iter().map(|o| o.data).collect()))
    }
}
