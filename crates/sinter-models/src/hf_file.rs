//! Safetensors files as Hugging Face writes them, shared by the GPT-2 and BERT converters:
//! reading with errors that name the file, float tensors in and out, and the atomic write.
//! `what` names the model in messages ("GPT-2", "BERT").

use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sinter_core::{bail, DType, Device, Error, Result, Tensor};

pub(crate) fn read(path: &Path, what: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        Error::Msg(format!(
            "cannot read {what} weights {}: {e}",
            path.display()
        ))
    })
}

pub(crate) fn parse<'a>(bytes: &'a [u8], path: &Path) -> Result<SafeTensors<'a>> {
    SafeTensors::deserialize(bytes).map_err(|e| {
        Error::Msg(format!(
            "{} is not a valid safetensors file: {e}",
            path.display()
        ))
    })
}

/// A float tensor of the file, on the CPU.
pub(crate) fn view_tensor(v: &TensorView, name: &str, what: &str) -> Result<Tensor> {
    let dtype = match v.dtype() {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        other => {
            bail!("tensor {name} has dtype {other:?}; {what} weights must be F32, F16 or BF16")
        }
    };
    Tensor::from_le_bytes(v.data(), dtype, v.shape(), Device::Cpu)
}

/// The safetensors bytes of named float tensors with `metadata` (Hugging Face's loaders
/// require `format = pt`).
pub(crate) fn serialize(
    tensors: &[(String, Tensor)],
    metadata: HashMap<String, String>,
    what: &str,
) -> Result<Vec<u8>> {
    let mut owned = Vec::with_capacity(tensors.len());
    for (name, t) in tensors {
        let dtype = match t.dtype() {
            DType::F32 => Dtype::F32,
            DType::F16 => Dtype::F16,
            DType::BF16 => Dtype::BF16,
            d @ (DType::I64 | DType::I32 | DType::U8 | DType::Bool) => {
                bail!("{what} weights are floating point, not {d} (tensor {name})")
            }
        };
        owned.push((name, dtype, t.shape().to_vec(), t.to_le_bytes()?));
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            Ok((
                n.to_string(),
                TensorView::new(*d, s.clone(), b)
                    .map_err(|e| Error::Msg(format!("tensor {n}: {e}")))?,
            ))
        })
        .collect::<Result<_>>()?;
    safetensors::serialize(views, &Some(metadata))
        .map_err(|e| Error::Msg(format!("cannot serialise {what} weights: {e}")))
}

/// Writes `bytes` to `path` atomically: a temporary file in the same directory, fsynced,
/// then renamed over `path` (removed again if anything fails).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("model.safetensors");
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let werr =
        |p: &Path, e: std::io::Error| Error::Msg(format!("cannot write {}: {e}", p.display()));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp).map_err(|e| werr(&tmp, e))?;
        f.write_all(bytes).map_err(|e| werr(&tmp, e))?;
        f.sync_all().map_err(|e| werr(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| werr(path, e))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
