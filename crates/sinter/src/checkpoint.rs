//! Checkpoints: one safetensors file holding the model's tensors (`model.<name>`), the
//! optimizer state (`optim.<name>.exp_avg`, …), and in its metadata the step, the RNG states,
//! the data loader's position and the run's config. Written to a temporary file, fsynced and
//! renamed, so a crash never leaves a half-written checkpoint in place of a good one.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use sinter_core::{DType, Device, Tensor};

use crate::config::TrainConfig;

pub const FILE_NAME: &str = "checkpoint.safetensors";
const FORMAT: &str = "sinter-checkpoint-1";

/// Everything besides tensors that a resumed run needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Meta {
    pub step: u64,
    pub optimizer_steps: u64,
    pub rng: [u64; 4],
    pub dropout_rng: [u64; 4],
    pub loader: [u64; 2],
    pub config: TrainConfig,
    /// The precision hooks' state (`Precision::state`: the fp16 loss scale and its growth
    /// tracker), so a resumed fp16 run continues with the same scale; None in older checkpoints.
    pub precision: Option<String>,
}

fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
    }
}

fn our_dtype(d: Dtype, name: &str) -> Result<DType> {
    Ok(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        other => bail!("checkpoint tensor {name} has dtype {other:?}, which sinter does not load"),
    })
}

fn u64s(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_u64s<const N: usize>(s: Option<&String>, key: &str) -> Result<[u64; N]> {
    let s = s.ok_or_else(|| anyhow!("checkpoint metadata lacks '{key}'"))?;
    let v: Vec<u64> = s
        .split(',')
        .map(|x| x.parse())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("checkpoint metadata '{key}' is not a list of integers"))?;
    v.try_into()
        .map_err(|_| anyhow!("checkpoint metadata '{key}' should hold {N} integers"))
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Writes `bytes` to `path` atomically: temporary file in the same directory, fsync, rename,
/// fsync of the directory.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)
            .with_context(|| format!("cannot create {}", tmp.display()))?;
        f.write_all(bytes)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("cannot fsync {}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .with_context(|| format!("cannot move {} to {}", tmp.display(), path.display()))?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub fn save(
    dir: &Path,
    model: &[(String, Tensor)],
    optim: &[(String, Tensor)],
    meta: &Meta,
) -> Result<()> {
    let mut owned: Vec<(String, DType, Vec<usize>, Vec<u8>)> = Vec::new();
    for (prefix, list) in [("model", model), ("optim", optim)] {
        for (n, t) in list {
            owned.push((
                format!("{prefix}.{n}"),
                t.dtype(),
                t.shape().to_vec(),
                t.to_le_bytes()?,
            ));
        }
    }
    let views: Vec<(String, TensorView)> = owned
        .iter()
        .map(|(n, d, s, b)| {
            Ok((
                n.clone(),
                TensorView::new(st_dtype(*d), s.clone(), b)
                    .map_err(|e| anyhow!("tensor {n}: {e}"))?,
            ))
        })
        .collect::<Result<_>>()?;
    let mut md = HashMap::new();
    md.insert("format".to_string(), FORMAT.to_string());
    md.insert("step".into(), meta.step.to_string());
    md.insert("optimizer_steps".into(), meta.optimizer_steps.to_string());
    md.insert("rng".into(), u64s(&meta.rng));
    md.insert("dropout_rng".into(), u64s(&meta.dropout_rng));
    md.insert("loader".into(), u64s(&meta.loader));
    md.insert("config".into(), serde_json::to_string(&meta.config)?);
    if let Some(p) = &meta.precision {
        md.insert("precision".into(), p.clone());
    }
    let bytes = safetensors::serialize(views, &Some(md))
        .map_err(|e| anyhow!("cannot serialise checkpoint: {e}"))?;
    write_atomic(&path_in(dir), &bytes)
}

/// A checkpoint read back: tensors by full name, and its metadata.
pub struct Loaded {
    pub tensors: HashMap<String, Tensor>,
    pub meta: Meta,
}

pub fn load(dir: &Path) -> Result<Loaded> {
    let path = if dir.is_dir() {
        path_in(dir)
    } else {
        dir.to_path_buf()
    };
    let bytes = std::fs::read(&path).with_context(|| {
        format!(
            "cannot read checkpoint {} (does the run directory exist and hold {FILE_NAME}?)",
            path.display()
        )
    })?;
    let (_, header) = SafeTensors::read_metadata(&bytes)
        .map_err(|e| anyhow!("checkpoint {} is corrupt or truncated: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes)
        .map_err(|e| anyhow!("checkpoint {} is corrupt or truncated: {e}", path.display()))?;
    let md = header.metadata().clone().unwrap_or_default();
    if md.get("format").map(String::as_str) != Some(FORMAT) {
        bail!(
            "{} is not a sinter checkpoint (metadata format is {:?})",
            path.display(),
            md.get("format")
        );
    }
    let parse = |k: &str| -> Result<u64> {
        md.get(k)
            .ok_or_else(|| anyhow!("checkpoint metadata lacks '{k}'"))?
            .parse()
            .with_context(|| format!("checkpoint metadata '{k}' is not an integer"))
    };
    let config: TrainConfig = serde_json::from_str(
        md.get("config")
            .ok_or_else(|| anyhow!("checkpoint metadata lacks 'config'"))?,
    )
    .context("checkpoint config is unreadable")?;
    let meta = Meta {
        step: parse("step")?,
        optimizer_steps: parse("optimizer_steps")?,
        rng: parse_u64s(md.get("rng"), "rng")?,
        dropout_rng: parse_u64s(md.get("dropout_rng"), "dropout_rng")?,
        loader: parse_u64s(md.get("loader"), "loader")?,
        config,
        precision: md.get("precision").cloned(),
    };
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = our_dtype(view.dtype(), &name)?;
        let t = Tensor::from_le_bytes(view.data(), dtype, view.shape(), Device::Cpu)
            .with_context(|| format!("checkpoint tensor {name}"))?;
        tensors.insert(name, t);
    }
    Ok(Loaded { tensors, meta })
}

/// Copies `model.<name>` tensors into the model's tensors, checking that every one is present
/// and has the model's shape. The error names the tensor and both shapes.
pub fn restore_model(loaded: &HashMap<String, Tensor>, named: &[(String, Tensor)]) -> Result<()> {
    for (n, t) in named {
        let key = format!("model.{n}");
        let src = loaded.get(&key).ok_or_else(|| anyhow!("checkpoint has no tensor {key}, which the model needs (was it saved from a different model?)"))?;
        if src.shape() != t.shape() {
            bail!("checkpoint tensor {key} has shape {:?} but the model needs {:?} (was it saved from a different model or config?)", src.shape(), t.shape());
        }
        t.assign(src).with_context(|| format!("loading {key}"))?;
    }
    Ok(())
}

/// The optimizer part of a checkpoint, with the `optim.` prefix removed.
pub fn optimizer_state(loaded: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    loaded
        .iter()
        .filter_map(|(k, v)| k.strip_prefix("optim.").map(|n| (n.to_string(), v.clone())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::Tensor;

    fn t(shape: &[usize]) -> Tensor {
        Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap()
    }

    #[test]
    fn a_misfitting_tensor_is_named_with_both_shapes() {
        let mut loaded = HashMap::new();
        loaded.insert("model.fc.weight".to_string(), t(&[10, 64]));
        let err = restore_model(&loaded, &[("fc.weight".into(), t(&[10, 128]))])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("model.fc.weight")
                && err.contains("[10, 64]")
                && err.contains("[10, 128]"),
            "{err}"
        );
        let err = restore_model(&loaded, &[("fc.bias".into(), t(&[10]))])
            .unwrap_err()
            .to_string();
        assert!(err.contains("model.fc.bias"), "{err}");
    }

    #[test]
    fn atomic_write_replaces_whole_files_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.bin");
        write_atomic(&p, b"first").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        // A directory that cannot be created is an error, not a panic.
        assert!(write_atomic(&p.join("sub/y.bin"), b"z").is_err());
    }
}
