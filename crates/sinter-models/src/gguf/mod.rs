//! GGUF files (llama.cpp's model format, versions 2 and 3): metadata, tensor infos and the
//! tensors themselves, dequantized to f32 or as raw GGML blocks.
//!
//! The file is memory-mapped: opening reads only the header (metadata and tensor infos) and
//! checks that every tensor's bytes lie inside the file at an aligned offset; a tensor's bytes
//! are read when it is asked for. [`hf`] turns a Llama-family GGUF into the config and
//! tensors of its Hugging Face checkpoint.
//!
//! Layout: "GGUF", u32 version, u64 tensor count, u64 key/value count, the key/values, the
//! tensor infos (name, dims innermost-first, ggml type, offset), padding to
//! `general.alignment` (32 by default), then the data section the offsets point into.

pub mod hf;
mod parse;
mod requant;
mod value;
mod write;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use sinter_core::{bail, DType, Device, Error, Result, Tensor};
pub use sinter_cpu::ggml_quant::GgmlType;

pub use hf::{to_hf, to_hf_keeping};
pub use requant::{quantize_gguf, RequantReport};
pub use value::{GgufValue, GgufValueType};
pub use write::{write_gguf, OutTensor};

/// The data section's alignment when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// A tensor as the file describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    pub ggml_type: GgmlType,
    /// Dimensions in PyTorch order, outermost first (GGUF stores them innermost first).
    pub shape: Vec<usize>,
    /// Where the tensor's bytes start in the file.
    pub file_offset: usize,
    pub n_bytes: usize,
}

impl GgufTensorInfo {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// The stand-in for a weight kept quantized: its shape, no data (one zero broadcast), so a
/// model can be built around it without the f32 copy. Its layer must get a quantized form
/// before it runs (see `pretrained`).
pub fn placeholder(shape: &[usize]) -> Result<Tensor> {
    Tensor::zeros(&vec![1; shape.len()], DType::F32, Device::Cpu)?.broadcast_as(shape)
}

/// Whether `t` is a [`placeholder`] (a tensor of several values, all one broadcast value).
pub fn is_placeholder(t: &Tensor) -> bool {
    t.numel() > 1 && t.layout().strides().iter().all(|&s| s == 0)
}

/// A tensor's stored bytes, for kernels that work on GGML blocks directly.
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    pub ggml_type: GgmlType,
    pub shape: &'a [usize],
    pub bytes: &'a [u8],
}

/// An open GGUF file.
pub struct GgufFile {
    path: PathBuf,
    mmap: Option<Mmap>,
    version: u32,
    alignment: u64,
    metadata: Vec<(String, GgufValue)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<GgufTensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps `path`, reading its header and checking where its tensors lie.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = File::open(path)
            .map_err(|e| Error::Msg(format!("cannot open GGUF file {}: {e}", path.display())))?;
        let len = file
            .metadata()
            .map_err(|e| Error::Msg(format!("cannot read {}: {e}", path.display())))?
            .len();
        // An empty file cannot be mapped; it is reported as truncated by the parser.
        let mmap =
            if len == 0 {
                None
            } else {
                // SAFETY: the map is read-only. As with every mapped file, another process
                // truncating it while it is open would fault; model files are not rewritten in
                // place (sinter's own writers rename a finished temporary over the old file).
                Some(unsafe { Mmap::map(&file) }.map_err(|e| {
                    Error::Msg(format!("cannot memory-map {}: {e}", path.display()))
                })?)
            };
        Self::from_mmap(path.to_path_buf(), mmap)
    }

    fn from_mmap(path: PathBuf, mmap: Option<Mmap>) -> Result<GgufFile> {
        let bytes: &[u8] = mmap.as_deref().unwrap_or(&[]);
        let name = path.display().to_string();
        let header = parse::read_header(bytes, &name)?;
        let mut metadata_index = HashMap::with_capacity(header.metadata.len());
        for (i, (key, _)) in header.metadata.iter().enumerate() {
            if metadata_index.insert(key.clone(), i).is_some() {
                bail!("{name}: metadata key {key} appears twice; the file is corrupt");
            }
        }
        let alignment = match header
            .metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
        {
            None => DEFAULT_ALIGNMENT,
            Some((_, GgufValue::U32(a))) if a.is_power_of_two() => *a as u64,
            Some((_, v)) => bail!(
                "{name}: metadata general.alignment is {v} ({}); it must be a UINT32 power of two",
                v.type_description()
            ),
        };
        let data_start = (header.end as u64).next_multiple_of(alignment);
        let tensors = header
            .tensors
            .iter()
            .map(|t| tensor_info(t, data_start, alignment, bytes.len() as u64, &name))
            .collect::<Result<Vec<_>>>()?;
        let mut tensor_index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            if tensor_index.insert(t.name.clone(), i).is_some() {
                bail!(
                    "{name}: tensor {} appears twice; the file is corrupt",
                    t.name
                );
            }
        }
        Ok(GgufFile {
            path,
            version: header.version,
            alignment,
            metadata: header.metadata,
            metadata_index,
            tensors,
            tensor_index,
            mmap,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The data section's alignment (`general.alignment`, else 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Every metadata key/value, in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// The value of `key`, if the file has it.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// Every tensor the file describes, in file order.
    pub fn tensor_infos(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    /// The description of tensor `name`; an error listing a few names if there is none.
    pub fn tensor_info(&self, name: &str) -> Result<&GgufTensorInfo> {
        match self.tensor_index.get(name) {
            Some(&i) => Ok(&self.tensors[i]),
            None => {
                let some: Vec<&str> = self.tensors.iter().take(8).map(|t| &*t.name).collect();
                bail!(
                    "{}: no tensor named {name} (it has {} tensors: {}{})",
                    self.path.display(),
                    self.tensors.len(),
                    some.join(", "),
                    if self.tensors.len() > some.len() {
                        ", …"
                    } else {
                        ""
                    }
                )
            }
        }
    }

    /// Whether the file has tensor `name`.
    pub fn has_tensor(&self, name: &str) -> bool {
        self.tensor_index.contains_key(name)
    }

    /// Tensor `name`'s type, shape and stored bytes (checked to lie inside the file at open).
    pub fn raw(&self, name: &str) -> Result<RawTensor<'_>> {
        let info = self.tensor_info(name)?;
        let bytes = self.mmap.as_deref().unwrap_or(&[]);
        Ok(RawTensor {
            ggml_type: info.ggml_type,
            shape: &info.shape,
            bytes: &bytes[info.file_offset..info.file_offset + info.n_bytes],
        })
    }

    /// Tensor `name` dequantized to f32, on the CPU.
    pub fn tensor(&self, name: &str) -> Result<Tensor> {
        let raw = self.raw(name)?;
        let mut out = vec![0f32; raw.shape.iter().product()];
        sinter_cpu::ggml_quant::dequantize(raw.ggml_type, raw.bytes, &mut out).map_err(|e| {
            Error::Msg(format!(
                "{}: tensor {name} ({}, shape {:?}): {e}",
                self.path.display(),
                raw.ggml_type,
                raw.shape
            ))
        })?;
        Tensor::from_vec(out, raw.shape, Device::Cpu)
    }

    /// Tensor `name` in its stored float type (F32, F16 or BF16), on the CPU, without
    /// converting; quantized tensors are an error (use [`GgufFile::tensor`] to dequantize).
    pub fn tensor_native(&self, name: &str) -> Result<Tensor> {
        let raw = self.raw(name)?;
        let dtype = match raw.ggml_type {
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            GgmlType::BF16 => DType::BF16,
            q => bail!(
                "{}: tensor {name} is quantized ({q}), not F32/F16/BF16; dequantize it with tensor()",
                self.path.display()
            ),
        };
        Tensor::from_le_bytes(raw.bytes, dtype, raw.shape, Device::Cpu)
    }

    fn require(&self, key: &str) -> Result<&GgufValue> {
        self.get(key).ok_or_else(|| {
            Error::Msg(format!(
                "{}: metadata key {key} is missing",
                self.path.display()
            ))
        })
    }

    fn wrong_type(&self, key: &str, v: &GgufValue, wanted: &str) -> Error {
        Error::Msg(format!(
            "{}: metadata {key} is {} {v}, not {wanted}",
            self.path.display(),
            v.type_description()
        ))
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self.require(key)?;
        v.as_str()
            .ok_or_else(|| self.wrong_type(key, v, "a STRING"))
    }

    fn get_int<T: TryFrom<i128>>(&self, key: &str, wanted: &str) -> Result<T> {
        let v = self.require(key)?;
        let i = v
            .as_integer()
            .ok_or_else(|| self.wrong_type(key, v, wanted))?;
        T::try_from(i).map_err(|_| self.wrong_type(key, v, wanted))
    }

    /// `key` as a u32: any integer type whose value fits.
    pub fn get_u32(&self, key: &str) -> Result<u32> {
        self.get_int(key, "an integer that fits in u32")
    }

    /// `key` as a u64: any integer type whose value fits.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_int(key, "an integer that fits in u64")
    }

    /// `key` as an i64: any integer type whose value fits.
    pub fn get_i64(&self, key: &str) -> Result<i64> {
        self.get_int(key, "an integer that fits in i64")
    }

    /// `key` as an f32: FLOAT32, or FLOAT64 rounded.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        match self.require(key)? {
            GgufValue::F32(f) => Ok(*f),
            GgufValue::F64(f) => Ok(*f as f32),
            v => Err(self.wrong_type(key, v, "a FLOAT32")),
        }
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        match self.require(key)? {
            GgufValue::Bool(b) => Ok(*b),
            v => Err(self.wrong_type(key, v, "a BOOL")),
        }
    }

    fn get_array(&self, key: &str, wanted: &str) -> Result<&[GgufValue]> {
        match self.require(key)? {
            GgufValue::Array(_, items) => Ok(items),
            v => Err(self.wrong_type(key, v, wanted)),
        }
    }

    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let wanted = "an ARRAY of STRING";
        let items = self.get_array(key, wanted)?;
        items
            .iter()
            .map(|v| v.as_str())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, self.require(key).expect("present"), wanted))
    }

    /// `key` as f32s: an ARRAY of FLOAT32 (FLOAT64 rounded).
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>> {
        let wanted = "an ARRAY of FLOAT32";
        let items = self.get_array(key, wanted)?;
        items
            .iter()
            .map(|v| match v {
                GgufValue::F32(f) => Some(*f),
                GgufValue::F64(f) => Some(*f as f32),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, self.require(key).expect("present"), wanted))
    }

    /// `key` as i32s: an ARRAY of any integer type whose values fit.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>> {
        let wanted = "an ARRAY of integers that fit in i32";
        let items = self.get_array(key, wanted)?;
        items
            .iter()
            .map(|v| v.as_integer().and_then(|i| i32::try_from(i).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| self.wrong_type(key, self.require(key).expect("present"), wanted))
    }
}

/// Checks a stored tensor info against the file: a supported type, dims whose product fits,
/// whole blocks per row, an aligned offset, bytes inside the file.
fn tensor_info(
    t: &parse::StoredTensorInfo,
    data_start: u64,
    alignment: u64,
    file_len: u64,
    file: &str,
) -> Result<GgufTensorInfo> {
    let name = &t.name;
    let ggml_type = GgmlType::from_id(t.type_id)
        .map_err(|e| Error::Msg(format!("{file}: tensor {name}: {e}")))?;
    let numel = t
        .dims
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d))
        .filter(|&n| n <= isize::MAX as u64)
        .ok_or_else(|| {
            Error::Msg(format!(
                "{file}: tensor {name} has dimensions {:?} whose product overflows; the file is corrupt",
                t.dims
            ))
        })?;
    let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
    // ggml quantizes along the innermost dimension: each row must be whole blocks.
    let row = t.dims.first().copied().unwrap_or(1) as usize;
    ggml_type
        .bytes_for(row)
        .map_err(|e| Error::Msg(format!("{file}: tensor {name} of shape {shape:?}: {e}")))?;
    let n_bytes = ggml_type
        .bytes_for(numel as usize)
        .map_err(|e| Error::Msg(format!("{file}: tensor {name} of shape {shape:?}: {e}")))?;
    if !t.offset.is_multiple_of(alignment) {
        bail!(
            "{file}: tensor {name}'s data offset {} is not a multiple of the alignment {alignment}; the file is corrupt",
            t.offset
        );
    }
    let start = data_start.checked_add(t.offset);
    let end = start.and_then(|s| s.checked_add(n_bytes as u64));
    match (start, end) {
        (Some(start), Some(end)) if end <= file_len => Ok(GgufTensorInfo {
            name: name.clone(),
            ggml_type,
            shape,
            file_offset: start as usize,
            n_bytes,
        }),
        _ => bail!(
            "{file}: tensor {name} ({ggml_type}, shape {shape:?}, {n_bytes} bytes at data offset {}) runs past the end of the file ({file_len} bytes, data from byte {data_start}); the file is truncated or corrupt",
            t.offset
        ),
    }
}
