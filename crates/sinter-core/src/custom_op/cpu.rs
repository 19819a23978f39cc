//! A custom op's CPU forward: a Rust closure over contiguous host slices ([`HostInput`]) that
//! returns its outputs ([`HostOutput`]), checked against the op's declared outputs.

use std::borrow::Cow;

use half::{bf16, f16};

use crate::cpu::CpuStorage;
use crate::{DType, Error, Result};

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
    pub(super) op: &'static str,
    pub(super) index: usize,
    pub(super) data: HostSlice<'a>,
    pub(super) shape: &'a [usize],
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
    /// The elements as f32: borrowed when they are f32, else widened into a new vector (how a
    /// kernel that computes in f32 reads half-precision inputs).
    pub fn f32_values(&self) -> Result<Cow<'a, [f32]>> {
        Ok(match self.data {
            HostSlice::F32(v) => Cow::Borrowed(v),
            HostSlice::F16(v) => Cow::Owned(v.iter().map(|a| a.to_f32()).collect()),
            HostSlice::BF16(v) => Cow::Owned(v.iter().map(|a| a.to_f32()).collect()),
            _ => return Err(self.wrong_dtype(DType::F32)),
        })
    }
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
    pub(super) data: CpuStorage,
    pub(super) shape: Vec<usize>,
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
