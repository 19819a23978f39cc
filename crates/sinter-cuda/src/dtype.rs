//! Element types that live in device buffers. sinter-core maps its own `DType` onto this one.

/// Element type of a device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
    I32,
    U8,
}

impl DType {
    /// All dtypes.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
    ];
    /// The floating-point dtypes every math kernel is instantiated for.
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 => 1,
        }
    }

    /// Suffix of kernel names instantiated for this dtype (`add_f32`, `cast_bf16_i64`, ...).
    pub const fn suffix(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
        }
    }

    /// f32, f16 or bf16.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.suffix())
    }
}

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
