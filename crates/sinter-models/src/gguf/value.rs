//! GGUF metadata values: the 13 value types of the format, arrays (nested too) included.

use std::fmt;

/// A GGUF value type (`enum gguf_type` in llama.cpp; the id is what the file stores).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl GgufValueType {
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        use GgufValueType::*;
        [
            U8, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64,
        ]
        .into_iter()
        .find(|t| *t as u32 == id)
    }

    /// The name gguf-py uses (UINT32, STRING, …), for messages.
    pub fn name(self) -> &'static str {
        match self {
            GgufValueType::U8 => "UINT8",
            GgufValueType::I8 => "INT8",
            GgufValueType::U16 => "UINT16",
            GgufValueType::I16 => "INT16",
            GgufValueType::U32 => "UINT32",
            GgufValueType::I32 => "INT32",
            GgufValueType::F32 => "FLOAT32",
            GgufValueType::Bool => "BOOL",
            GgufValueType::String => "STRING",
            GgufValueType::Array => "ARRAY",
            GgufValueType::U64 => "UINT64",
            GgufValueType::I64 => "INT64",
            GgufValueType::F64 => "FLOAT64",
        }
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// The element type is kept so that an empty array still has one.
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// The value of any integer type, widened (i128 holds every u64 and i64).
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            GgufValue::U8(v) => v.into(),
            GgufValue::I8(v) => v.into(),
            GgufValue::U16(v) => v.into(),
            GgufValue::I16(v) => v.into(),
            GgufValue::U32(v) => v.into(),
            GgufValue::I32(v) => v.into(),
            GgufValue::U64(v) => v.into(),
            GgufValue::I64(v) => v.into(),
            _ => return None,
        })
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// Describes the value's type for messages: "UINT32", "ARRAY of STRING".
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(elem, _) => format!("ARRAY of {}", elem.name()),
            v => v.value_type().name().to_string(),
        }
    }
}

/// Short previews: long strings and arrays are cut, so a message stays one line.
impl fmt::Display for GgufValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(s) if s.chars().count() > 60 => {
                write!(f, "{:?}…", s.chars().take(60).collect::<String>())
            }
            GgufValue::String(s) => write!(f, "{s:?}"),
            GgufValue::Array(_, items) => {
                write!(f, "[")?;
                for (i, item) in items.iter().take(4).enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if items.len() > 4 {
                    write!(f, ", … ({} items)", items.len())?;
                }
                write!(f, "]")
            }
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
        }
    }
}
