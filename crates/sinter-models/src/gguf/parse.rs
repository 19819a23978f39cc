//! The GGUF header, read from the front of the file's bytes: magic, version, counts, the
//! metadata key/values and the tensor infos (all little-endian). Where the tensors' bytes lie
//! is checked by the caller, which knows the alignment.
//!
//! Counts and lengths come from the file, so nothing is allocated from them before the bytes
//! they promise are known to be there: a corrupt count is a "truncated" error, never an
//! out-of-memory abort.

use sinter_core::{Error, Result};

use super::value::{GgufValue, GgufValueType};

/// "GGUF" as the first four bytes.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Arrays of arrays deeper than this are refused (the format allows nesting; real files use
/// none), so a crafted file cannot overflow the stack.
const MAX_ARRAY_DEPTH: usize = 8;

/// ggml tensors have at most 4 dimensions (`GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;

/// A tensor info as stored: dims innermost-first, the ggml type id, the offset into the data
/// section.
pub struct StoredTensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub type_id: u32,
    pub offset: u64,
}

pub struct Header {
    pub version: u32,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<StoredTensorInfo>,
    /// Where the tensor infos end: the data section starts at the next aligned offset.
    pub end: usize,
}

/// A cursor over the file's bytes whose errors name the file, the byte offset and what was
/// being read.
pub struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    file: &'a str,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], file: &'a str) -> Reader<'a> {
        Reader {
            bytes,
            pos: 0,
            file,
        }
    }

    fn error(&self, msg: String) -> Error {
        Error::Msg(format!("{}: {msg}", self.file))
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let left = self.bytes.len() - self.pos;
        if n > left {
            return Err(self.error(format!(
                "truncated: {} needs {n} bytes at byte {} but the file ends after {} more; the file is cut short or corrupt (download or convert it again)",
                what(),
                self.pos,
                left
            )));
        }
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A u64 count of items each at least `min_item_bytes` long, checked against the bytes
    /// left so that a corrupt count fails here rather than in an allocation.
    fn count(&mut self, min_item_bytes: usize, what: &dyn Fn() -> String) -> Result<usize> {
        let at = self.pos;
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes as u64) > left {
            return Err(self.error(format!(
                "truncated or corrupt: {} at byte {at} is {n}, more than the {left} bytes left in the file can hold",
                what()
            )));
        }
        Ok(n as usize)
    }

    /// A GGUF string: u64 length, then UTF-8 bytes.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        let len = self.count(1, &|| format!("the length of {}", what()))?;
        let at = self.pos;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| {
            self.error(format!(
                "{} at byte {at} is not valid UTF-8 ({e}); the file is corrupt",
                what()
            ))
        })
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> Result<GgufValueType> {
        let at = self.pos;
        let id = self.u32(&|| format!("the value type of {}", what()))?;
        GgufValueType::from_id(id).ok_or_else(|| {
            self.error(format!(
                "{} at byte {at} has value type {id}, which GGUF does not define (0..=12); the file is corrupt",
                what()
            ))
        })
    }

    fn value(
        &mut self,
        ty: GgufValueType,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<GgufValue> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(self.u32(what)?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::U64 => GgufValue::U64(self.u64(what)?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => {
                let at = self.pos;
                match self.array::<1>(what)?[0] {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    b => {
                        return Err(self.error(format!(
                        "{} at byte {at} is a BOOL of value {b}, not 0 or 1; the file is corrupt",
                        what()
                    )))
                    }
                }
            }
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.error(format!(
                        "{} nests arrays more than {MAX_ARRAY_DEPTH} deep; the file is corrupt",
                        what()
                    )));
                }
                let elem = self.value_type(&|| format!("the elements of {}", what()))?;
                let min_bytes = match elem {
                    GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
                    GgufValueType::U16 | GgufValueType::I16 => 2,
                    GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
                    // A string or array is at least its 8-byte length.
                    _ => 8,
                };
                let n = self.count(min_bytes, &|| format!("the length of {}", what()))?;
                let mut items = Vec::with_capacity(n);
                for i in 0..n {
                    items.push(
                        self.value(elem, depth + 1, &|| format!("element {i} of {}", what()))?,
                    );
                }
                GgufValue::Array(elem, items)
            }
        })
    }
}

/// Reads the header of a GGUF file from `bytes` (the whole file); `file` names it in errors.
pub fn read_header(bytes: &[u8], file: &str) -> Result<Header> {
    let mut r = Reader::new(bytes, file);
    let magic = r.array::<4>(&|| "the magic number \"GGUF\"".into())?;
    if magic != GGUF_MAGIC {
        return Err(r.error(format!(
            "not a GGUF file: it starts with {magic:02x?} ({:?}), not \"GGUF\"",
            String::from_utf8_lossy(&magic)
        )));
    }
    let version = r.u32(&|| "the version".into())?;
    match version {
        2 | 3 => {}
        1 => {
            return Err(r.error(
                "GGUF version 1 is not supported (sinter reads versions 2 and 3); convert the model again with a current llama.cpp".into(),
            ))
        }
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(r.error(format!(
                "a big-endian GGUF file (version {} byte-swapped); sinter reads little-endian GGUF only: convert the model again without --bigendian",
                v.swap_bytes()
            )))
        }
        v => {
            return Err(r.error(format!(
                "unsupported GGUF version {v}; sinter reads versions 2 and 3"
            )))
        }
    }
    // A tensor info is at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes,
    // a key/value at least 8 (key length) + 4 (type) + 1.
    let n_tensors = r.count(24, &|| "the tensor count".into())?;
    let n_kv = r.count(13, &|| "the metadata key/value count".into())?;
    let mut metadata = Vec::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = r.string(&|| format!("the key of metadata entry {i}"))?;
        let what = || format!("metadata {key}");
        let ty = r.value_type(&what)?;
        let value = r.value(ty, 0, &what)?;
        metadata.push((key, value));
    }
    let mut tensors = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = r.string(&|| format!("the name of tensor {i}"))?;
        let what = |field: &str| format!("the {field} of tensor {name}");
        let at = r.pos;
        let n_dims = r.u32(&|| what("dimension count"))?;
        if n_dims > MAX_DIMS {
            return Err(r.error(format!(
                "tensor {name} at byte {at} has {n_dims} dimensions; ggml tensors have at most {MAX_DIMS}, so the file is corrupt"
            )));
        }
        let dims = (0..n_dims)
            .map(|d| r.u64(&|| what(&format!("dimension {d}"))))
            .collect::<Result<Vec<u64>>>()?;
        let type_id = r.u32(&|| what("type"))?;
        let offset = r.u64(&|| what("data offset"))?;
        tensors.push(StoredTensorInfo {
            name,
            dims,
            type_id,
            offset,
        });
    }
    Ok(Header {
        version,
        metadata,
        tensors,
        end: r.pos,
    })
}
