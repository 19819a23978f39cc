//! Element types that live in device buffers: the one `DType` of `sinter-types` (shared with
//! sinter-core's tensors; i32 and u8 are buffer-only there).

pub use sinter_types::DType;

/// A host type with a device counterpart: used by the typed host <-> device copies.
pub trait DeviceScalar: Copy + Default + Send + Sync + 'static {
    const DTYPE: DType;
}
impl DeviceScalar for f32 {
    const DTYPE: DType = DType::F32;
}
impl DeviceScalar for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl DeviceScalar for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl DeviceScalar for i64 {
    const DTYPE: DType = DType::I64;
}
impl DeviceScalar for i32 {
    const DTYPE: DType = DType::I32;
}
impl DeviceScalar for u8 {
    const DTYPE: DType = DType::U8;
}
