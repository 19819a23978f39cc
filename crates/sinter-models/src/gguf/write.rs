//! Writing a GGUF file (version 3, little-endian): the metadata key/values, the tensor infos
//! and the tensors' bytes, each tensor at a multiple of `general.alignment` (32 unless the
//! metadata says otherwise), as llama.cpp and gguf-py read it.

use std::io::{BufWriter, Write};
use std::path::Path;

use sinter_core::{bail, Error, Result};

use super::parse::GGUF_MAGIC;
use super::value::GgufValue;
use super::{GgmlType, DEFAULT_ALIGNMENT};

/// A tensor to write: its shape row-major (as `GgufTensorInfo::shape`), type and bytes.
pub struct OutTensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub ggml_type: GgmlType,
    pub bytes: Vec<u8>,
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

/// A value's bytes without its type id (an array: element type, count, elements).
fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(*x as u8),
        GgufValue::String(s) => put_string(out, s),
        GgufValue::Array(elem, items) => {
            out.extend((*elem as u32).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

/// The alignment the metadata asks for (a power of two), or the default.
fn alignment_of(metadata: &[(String, GgufValue)]) -> Result<u64> {
    let Some((_, v)) = metadata.iter().find(|(k, _)| k == "general.alignment") else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    match v.as_integer() {
        Some(a) if a > 0 && (a as u64).is_power_of_two() => Ok(a as u64),
        _ => bail!("general.alignment is {v}; it must be a power of two"),
    }
}

/// Writes `metadata` and `tensors` to `path` as a GGUF v3 file. Each tensor's bytes must be
/// its shape's values in its type (whole blocks per row).
pub fn write_gguf(
    path: &Path,
    metadata: &[(String, GgufValue)],
    tensors: &[OutTensor],
) -> Result<()> {
    let align = alignment_of(metadata)?;
    let mut head = GGUF_MAGIC.to_vec();
    head.extend(3u32.to_le_bytes());
    head.extend((tensors.len() as u64).to_le_bytes());
    head.extend((metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut head, key);
        head.extend((value.value_type() as u32).to_le_bytes());
        put_value(&mut head, value);
    }
    let padded = |n: u64| n.div_ceil(align) * align;
    let mut offset = 0u64;
    for t in tensors {
        let row = *t.shape.last().unwrap_or(&1);
        let rows = t.shape.iter().rev().skip(1).product::<usize>();
        let need = t
            .ggml_type
            .bytes_for(row)
            .map_err(|e| Error::Msg(format!("tensor {}: {e}", t.name)))?
            * rows;
        if t.bytes.len() != need {
            bail!(
                "tensor {}: {:?} {} values take {need} bytes, {} were given",
                t.name,
                t.shape,
                t.ggml_type,
                t.bytes.len()
            );
        }
        put_string(&mut head, &t.name);
        head.extend((t.shape.len() as u32).to_le_bytes());
        for &d in t.shape.iter().rev() {
            head.extend((d as u64).to_le_bytes());
        }
        head.extend(t.ggml_type.id().to_le_bytes());
        head.extend(offset.to_le_bytes());
        offset = padded(offset + need as u64);
    }
    let io = |e: std::io::Error| Error::Msg(format!("{}: cannot write: {e}", path.display()));
    let mut w = BufWriter::new(std::fs::File::create(path).map_err(io)?);
    let start = padded(head.len() as u64);
    head.resize(start as usize, 0);
    w.write_all(&head).map_err(io)?;
    for t in tensors {
        w.write_all(&t.bytes).map_err(io)?;
        let pad = padded(t.bytes.len() as u64) - t.bytes.len() as u64;
        w.write_all(&vec![0u8; pad as usize]).map_err(io)?;
    }
    w.flush().map_err(io)
}
