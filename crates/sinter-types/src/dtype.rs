//! Element types. One enum names the element type of a tensor and of a device buffer.
//!
//! Tensors hold [`DType::TENSOR`] (f32, f16, bf16, i64, bool): floats compute in f32 on the CPU,
//! and f16/bf16 are storage formats whose values are widened to f32 for arithmetic and rounded
//! back, as tensor cores do. `Bool` is PyTorch's `torch.bool`: one byte per element holding 0 or
//! 1, what comparisons return and what `where` / `masked_fill` take as their condition. i32 and
//! u8 exist only as device-buffer types of kernels (e.g. int8 data); a tensor op asked for one
//! answers with an error that says so.

use half::{bf16, f16};

/// The element type of a tensor or a device buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    /// Integer indices (class labels, token ids); signed so that `ignore_index = -100` works.
    I64,
    /// Device buffers only (kernel operands); no tensor holds it.
    I32,
    /// Device buffers only (kernel operands); no tensor holds it.
    U8,
    /// `torch.bool`: one byte, 0 (false) or 1 (true). Comparisons return it; `where` and
    /// `masked_fill` take it as their condition.
    Bool,
}

impl DType {
    /// Every dtype, tensor or buffer.
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I64,
        DType::I32,
        DType::U8,
        DType::Bool,
    ];
    /// The floating-point dtypes (every math kernel is instantiated for these).
    pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
    /// The dtypes a tensor can hold.
    pub const TENSOR: [DType; 5] = [DType::F32, DType::F16, DType::BF16, DType::I64, DType::Bool];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
            DType::U8 | DType::Bool => 1,
        }
    }
    /// Bytes per element (the same as [`DType::size`]).
    pub const fn size_in_bytes(self) -> usize {
        self.size()
    }
    /// f32, f16 or bf16.
    pub const fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
    /// The dtype two tensor operands of an elementwise op compute in (PyTorch's type
    /// promotion lattice for the dtypes here, bool < i64 < floats): equal dtypes stay; bool
    /// with any other gives the other (bool + i64 is i64, bool + f16 is f16); two different
    /// floats give f32 (f32 holds f16 and bf16, and neither half holds the other); an integer
    /// with a float gives that float (i64 + f16 is f16, as in PyTorch). None where they cannot
    /// be mixed (a buffer-only dtype, or two different integers).
    pub const fn promote(a: DType, b: DType) -> Option<DType> {
        match (a, b) {
            (DType::I32 | DType::U8, _) | (_, DType::I32 | DType::U8) => None,
            _ if a as u8 == b as u8 => Some(a),
            (DType::Bool, _) => Some(b),
            (_, DType::Bool) => Some(a),
            _ if a.is_float() && b.is_float() => Some(DType::F32),
            _ if a.is_float() => Some(a),
            _ if b.is_float() => Some(b),
            _ => None,
        }
    }
    /// True for the dtypes a tensor can hold ([`DType::TENSOR`]).
    pub const fn is_tensor_dtype(self) -> bool {
        !matches!(self, DType::I32 | DType::U8)
    }
    /// The short name: `f32`, `f16`, `bf16`, `i64`, `i32`, `u8`, `bool` (also the suffix of kernel
    /// names instantiated for this dtype, `add_f32`, `cast_bf16_i64`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::U8 => "u8",
            DType::Bool => "bool",
        }
    }
    /// The kernel-name suffix (the same as [`DType::as_str`]).
    pub const fn suffix(self) -> &'static str {
        self.as_str()
    }
    /// Parses a short or long name (`f32`/`float32`, `bf16`/`bfloat16`, `i64`/`int64`, ...).
    pub fn parse(s: &str) -> Option<DType> {
        match s {
            "f32" | "float32" => Some(DType::F32),
            "f16" | "float16" | "fp16" => Some(DType::F16),
            "bf16" | "bfloat16" => Some(DType::BF16),
            "i64" | "int64" => Some(DType::I64),
            "i32" | "int32" => Some(DType::I32),
            "u8" | "uint8" => Some(DType::U8),
            "bool" => Some(DType::Bool),
            _ => None,
        }
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A Rust element type that a tensor can hold. `NoUninit` (not `Pod`): a tensor's values are
/// written out as bytes (checkpoints), but bytes are not read back as any `Element` blindly
/// (a `bool` byte must be 0 or 1).
pub trait Element: Copy + Send + Sync + 'static + bytemuck::NoUninit + std::fmt::Debug {
    const DTYPE: DType;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn to_f32(self) -> f32;
    fn from_f32(v: f32) -> Self;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}
impl Element for f16 {
    const DTYPE: DType = DType::F16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    // Through f32, as the GPU rounds: `half`'s own f64 path drops the low 32 bits of the f64
    // before rounding, so a value just above a halfway point would round down.
    fn from_f64(v: f64) -> Self {
        f16::from_f32(v as f32)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}
impl Element for bf16 {
    const DTYPE: DType = DType::BF16;
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn from_f64(v: f64) -> Self {
        bf16::from_f32(v as f32)
    }
    fn to_f32(self) -> f32 {
        self.to_f32()
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn from_f64(v: f64) -> Self {
        v as i64
    }
    fn to_f32(self) -> f32 {
        self as f32
    }
    fn from_f32(v: f32) -> Self {
        v as i64
    }
}

/// `torch.bool`: a value converts to true when it is non-zero (NaN included, as in PyTorch);
/// true converts to 1 and false to 0.
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_f32(self) -> f32 {
        self as u8 as f32
    }
    fn from_f32(v: f32) -> Self {
        v != 0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promotion_follows_pytorch() {
        use DType::*;
        // torch.promote_types: float32 with bfloat16/float16 -> float32, bfloat16 with float16
        // -> float32, int64 with any float -> that float.
        assert_eq!(DType::promote(F32, BF16), Some(F32));
        assert_eq!(DType::promote(F16, F32), Some(F32));
        assert_eq!(DType::promote(BF16, F16), Some(F32));
        assert_eq!(DType::promote(BF16, BF16), Some(BF16));
        assert_eq!(DType::promote(I64, I64), Some(I64));
        assert_eq!(DType::promote(I64, F32), Some(F32));
        assert_eq!(DType::promote(F16, I64), Some(F16));
        assert_eq!(DType::promote(I64, BF16), Some(BF16));
        assert_eq!(DType::promote(I32, F32), None);
        assert_eq!(DType::promote(U8, U8), None);
        // torch.promote_types: bool with anything else -> the other; bool with bool -> bool.
        assert_eq!(DType::promote(Bool, Bool), Some(Bool));
        assert_eq!(DType::promote(Bool, I64), Some(I64));
        assert_eq!(DType::promote(F16, Bool), Some(F16));
        assert_eq!(DType::promote(Bool, F32), Some(F32));
        assert_eq!(DType::promote(Bool, BF16), Some(BF16));
        assert_eq!(DType::promote(Bool, U8), None);
    }

    #[test]
    fn bool_converts_like_torch_bool() {
        // Non-zero is true (NaN and -0.0 behave as in PyTorch: NaN true, -0.0 false).
        for (v, want) in [(0.0, false), (-0.0, false), (0.5, true), (-2.0, true)] {
            assert_eq!(<bool as Element>::from_f64(v), want, "{v}");
            assert_eq!(<bool as Element>::from_f32(v as f32), want, "{v}");
        }
        assert!(<bool as Element>::from_f64(f64::NAN));
        assert!(<bool as Element>::from_f32(f32::INFINITY));
        assert_eq!(true.to_f64(), 1.0);
        assert_eq!(false.to_f32(), 0.0);
        assert_eq!(DType::Bool.size(), 1);
        assert!(!DType::Bool.is_float());
    }

    #[test]
    fn half_types_round_f64_values_as_the_gpu_rounds_their_f32() {
        // Just above the halfway point between two bf16 values: rounds up (0x3f37), as
        // __float2bfloat16_rn does; truncating the f64 first would give 0x3f36.
        let x = f32::from_bits(0x3f36_8006);
        assert_eq!(<bf16 as Element>::from_f64(x as f64).to_bits(), 0x3f37);
        assert_eq!(<bf16 as Element>::from_f32(x).to_bits(), 0x3f37);
        let y = f32::from_bits(0x3f80_1001); // 1 + 2^-11 + 2^-23: just above an f16 halfway
        assert_eq!(
            <f16 as Element>::from_f64(y as f64).to_bits(),
            f16::from_f32(y).to_bits()
        );
    }

    #[test]
    fn names_sizes_and_classes_agree() {
        for d in DType::ALL {
            assert_eq!(DType::parse(d.as_str()), Some(d));
            assert_eq!(d.to_string(), d.suffix());
            assert_eq!(d.size(), d.size_in_bytes());
            assert_eq!(d.is_tensor_dtype(), DType::TENSOR.contains(&d), "{d}");
            assert_eq!(d.is_float(), DType::FLOATS.contains(&d), "{d}");
        }
        assert_eq!(
            [f32::DTYPE, f16::DTYPE, bf16::DTYPE, i64::DTYPE, bool::DTYPE],
            DType::TENSOR
        );
        assert_eq!(std::mem::size_of::<bf16>(), DType::BF16.size());
        assert_eq!(DType::parse("float64"), None);
    }
}
