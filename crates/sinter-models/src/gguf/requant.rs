//! A GGUF file re-quantized to one block format (`sinter quantize --format`): every 2-D
//! tensor whose rows are whole blocks of the format gets it. A k-quant's matrices whose rows
//! are not whole 256-value blocks (SmolLM2's 576) get a 32-block format instead, as
//! llama.cpp's quantizer falls back (it picks Q5_0 / Q8_0; sinter, which has no Q5_0
//! kernels, Q4_1 for Q4_K and Q8_0 for Q6_K). The others (norms and biases, rows that are
//! not whole blocks of either) keep their type when it is a float type, or become F32. Each
//! is named in the report. The
//! metadata (architecture, hyperparameters, tokenizer, chat template) is copied, with
//! `general.file_type` and `general.quantization_version` set for the new types.

use std::path::Path;

use sinter_core::{bail, Error, Result};
use sinter_cpu::ggml_quant::quantize::{quantize, QUANTIZE_TYPES};

use super::write::{write_gguf, OutTensor};
use super::{GgmlType, GgufFile, GgufValue};

/// What [`quantize_gguf`] did with each tensor.
pub struct RequantReport {
    /// Tensors written in the requested format.
    pub quantized: Vec<String>,
    /// Matrices written in the fallback format of a k-quant: name, the type written, why.
    pub fallback: Vec<(String, GgmlType, String)>,
    /// Tensors left in a float type: name, the type written, and why.
    pub kept: Vec<(String, GgmlType, String)>,
    pub bytes_written: u64,
}

/// llama.cpp's `llama_ftype` for a file mostly of `ty` (`general.file_type`).
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q4_K => 14, // MOSTLY_Q4_K_S: one type throughout
        GgmlType::Q6_K => 18,
        _ => unreachable!("checked against QUANTIZE_TYPES"),
    }
}

/// Writes `src` to `out` with its matrices in `ty` (see the module's comment).
pub fn quantize_gguf(src: &GgufFile, ty: GgmlType, out: &Path) -> Result<RequantReport> {
    if !QUANTIZE_TYPES.contains(&ty) || matches!(ty, GgmlType::F32 | GgmlType::F16) {
        bail!("sinter quantize writes Q8_0, Q4_0, Q4_1, Q4_K or Q6_K, not {ty}");
    }
    let mut report = RequantReport {
        quantized: Vec::new(),
        fallback: Vec::new(),
        kept: Vec::new(),
        bytes_written: 0,
    };
    let mut tensors = Vec::with_capacity(src.tensor_infos().len());
    let block = ty.block_elems();
    for info in src.tensor_infos() {
        let row = *info.shape.last().unwrap_or(&1);
        let why = if info.shape.len() != 2 {
            Some(format!("{}-D", info.shape.len()))
        } else if !row.is_multiple_of(block) {
            Some(format!(
                "rows of {row} are not whole {ty} blocks of {block}"
            ))
        } else {
            None
        };
        let fallback = fallback_of(ty)
            .filter(|f| info.shape.len() == 2 && row.is_multiple_of(f.block_elems()));
        let (out_ty, bytes) = match (why, fallback) {
            (None, _) => {
                let bytes = quantized(src, &info.name, ty, row)?;
                report.quantized.push(info.name.clone());
                (ty, bytes)
            }
            (Some(why), Some(f)) => {
                let bytes = quantized(src, &info.name, f, row)?;
                report
                    .fallback
                    .push((info.name.clone(), f, format!("{why}: {f} instead")));
                (f, bytes)
            }
            (Some(why), None) => {
                let raw = src.raw(&info.name)?;
                let (out_ty, bytes) = match raw.ggml_type {
                    GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => {
                        (raw.ggml_type, raw.bytes.to_vec())
                    }
                    _ => {
                        let values = src.tensor(&info.name)?.to_vec_f32()?;
                        (
                            GgmlType::F32,
                            quantize(GgmlType::F32, &values, row)
                                .map_err(|e| Error::Msg(format!("tensor {}: {e}", info.name)))?,
                        )
                    }
                };
                report.kept.push((info.name.clone(), out_ty, why));
                (out_ty, bytes)
            }
        };
        report.bytes_written += bytes.len() as u64;
        tensors.push(OutTensor {
            name: info.name.clone(),
            shape: info.shape.clone(),
            ggml_type: out_ty,
            bytes,
        });
    }
    write_gguf(out, &metadata_for(src, ty), &tensors)?;
    Ok(report)
}

/// The 32-value-block format a k-quant's matrices fall back to when their rows are not whole
/// 256-value blocks (llama.cpp: Q4_K → Q5_0, Q6_K → Q8_0; Q5_0 has no kernels here).
fn fallback_of(ty: GgmlType) -> Option<GgmlType> {
    match ty {
        GgmlType::Q4_K => Some(GgmlType::Q4_1),
        GgmlType::Q6_K => Some(GgmlType::Q8_0),
        _ => None,
    }
}

/// Tensor `name` of `src` (rows of `row` values) as `ty`'s bytes.
fn quantized(src: &GgufFile, name: &str, ty: GgmlType, row: usize) -> Result<Vec<u8>> {
    let values = src.tensor(name)?.to_vec_f32()?;
    quantize(ty, &values, row).map_err(|e| Error::Msg(format!("tensor {name}: {e}")))
}

/// `src`'s metadata with the file type and quantization version of a `ty` file.
fn metadata_for(src: &GgufFile, ty: GgmlType) -> Vec<(String, GgufValue)> {
    let set = [
        ("general.file_type", GgufValue::U32(file_type(ty))),
        ("general.quantization_version", GgufValue::U32(2)),
    ];
    let mut meta: Vec<(String, GgufValue)> = src
        .metadata()
        .iter()
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == k))
        .cloned()
        .collect();
    meta.extend(set.into_iter().map(|(k, v)| (k.to_string(), v)));
    meta
}
