//! One error type for every fallible tensor operation: each variant says which op failed and why.

use crate::{DType, Device};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op}: shapes {lhs:?} and {rhs:?} do not fit together")]
    ShapeMismatch {
        op: &'static str,
        lhs: Vec<usize>,
        rhs: Vec<usize>,
    },
    #[error("{op}: dimension {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange {
        op: &'static str,
        dim: isize,
        rank: usize,
    },
    #[error("{op}: expected dtype {expected:?}, got {got:?}")]
    DTypeMismatch {
        op: &'static str,
        expected: DType,
        got: DType,
    },
    #[error("{op}: tensors live on different devices ({lhs:?} and {rhs:?}); move them with to_device first")]
    DeviceMismatch {
        op: &'static str,
        lhs: Device,
        rhs: Device,
    },
    #[error("{op}: dtype {dtype} is not supported ({supported})")]
    UnsupportedDType {
        op: &'static str,
        dtype: DType,
        supported: &'static str,
    },
    #[error("device {0:?} is not available: {1}")]
    DeviceUnavailable(Device, String),
    #[error("{0}")]
    Msg(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// `op` on two bool tensors where PyTorch refuses it (`-`, `floor_divide`): the same words
    /// from the tensor op and from every backend.
    pub fn bool_operands(op: crate::op::BinaryOp) -> Error {
        Error::Msg(format!(
            "{}: not defined for two bool tensors (as in PyTorch); use logical_xor / logical_not for masks, or convert with to_dtype first",
            op.name()
        ))
    }
}

/// Builds an `Error::Msg` from a format string and returns it.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::Error::Msg(format!($($arg)*)))
    };
}
