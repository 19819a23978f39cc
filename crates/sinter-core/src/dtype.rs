//! Runtime element types: defined once in `sinter-types` (shared with sinter-cuda's buffers)
//! and re-exported here. Tensors hold the [`DType::TENSOR`] dtypes; constructors and casts
//! refuse the buffer-only ones (i32, u8) with [`Error::UnsupportedDType`](crate::Error).

pub use sinter_types::dtype::{DType, Element};

/// Ok when a tensor can hold `dtype`, else an error naming the op and the dtypes it supports.
pub(crate) fn check_tensor_dtype(op: &'static str, dtype: DType) -> crate::Result<()> {
    if dtype.is_tensor_dtype() {
        Ok(())
    } else {
        Err(crate::Error::UnsupportedDType {
            op,
            dtype,
            supported: "tensors hold f32, f16, bf16, i64 or bool",
        })
    }
}
