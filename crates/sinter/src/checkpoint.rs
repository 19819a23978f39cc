//! Checkpoints: one safetensors file holding the model's tensors (`model.<name>`), the
//! optimizer state (`optim.<name>.exp_avg`, …), and in its metadata the step, the RNG states,
//! the data loader's position, the run's config and what inference needs ([`InferenceInfo`]).
//!
//! The file is byte-reproducible: tensors in a fixed order and the metadata keys sorted, so
//! two identical runs (or a resumed run and an uninterrupted one) write the same bytes. It is
//! written to a temporary file, fsynced and renamed, so a crash never leaves a half-written
//! checkpoint in place of a good one; temporaries left by killed runs are removed on start
//! ([`remove_stale_temporaries`]). Loading checks everything it reads: the header, the
//! checksum of the tensor bytes (CRC-32C, stored in the metadata when the file is written;
//! `--no-verify` skips it), the config (like the flags), and every weight for NaN or infinity.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{anyhow, bail, Context, Result};
use safetensors::tensor::{Dtype, SafeTensorError, SafeTensors};
use serde::{Deserialize, Serialize};
use sinter_core::{DType, Device, Tensor};

use crate::config::TrainConfig;

pub const FILE_NAME: &str = "checkpoint.safetensors";
/// The checkpoint of the best validation loss (`--keep-best`).
pub const BEST_FILE: &str = "best.safetensors";
const FORMAT: &str = "sinter-checkpoint-1";
/// The metadata key of the CRC-32C of a file's tensor bytes (everything after the header).
pub const CHECKSUM_KEY: &str = "tensor_crc32c";
/// The format family of `sinter quantize`'s int8 files (`sinter-quantized-1`, `-2`, …).
const QUANTIZED_FAMILY: &str = "sinter-quantized-";

/// Whether loads check the tensor checksum (`--no-verify` turns it off for the process).
static VERIFY: AtomicBool = AtomicBool::new(true);
/// Whether a file without a checksum has been reported (once per process is enough).
static UNVERIFIED_SAID: AtomicBool = AtomicBool::new(false);

/// `--no-verify`: load checkpoints without checking their tensor checksum.
pub fn set_verify(on: bool) {
    VERIFY.store(on, Ordering::SeqCst);
}

/// The CRC-32C of a safetensors file's tensor bytes, as its metadata stores it.
fn checksum_text(data: &[u8]) -> String {
    format!("{:08x}", crc32c::crc32c(data))
}

/// Checks the tensor bytes of the safetensors file `bytes` against the checksum in its
/// metadata `md`. One pass with the CPU's CRC-32C instruction (the crc32c crate picks it at
/// run time), lighter than the NaN check every float tensor gets after it. A file written
/// before checksums were stored loads, and says so once per process.
pub(crate) fn verify_checksum(bytes: &[u8], md: &HashMap<String, String>) -> Result<()> {
    if !VERIFY.load(Ordering::SeqCst) {
        return Ok(());
    }
    let Some(stored) = md.get(CHECKSUM_KEY) else {
        if !UNVERIFIED_SAID.swap(true, Ordering::SeqCst) {
            crate::say!("note: a checkpoint holds no checksum of its tensors (written by an older sinter): it loads unverified");
        }
        return Ok(());
    };
    let header = bytes
        .get(..8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let data = usize::try_from(header)
        .ok()
        .and_then(|h| h.checked_add(8))
        .and_then(|start| bytes.get(start..))
        .ok_or_else(|| {
            anyhow!("is corrupt or truncated: its header runs past the end of the file")
        })?;
    let actual = checksum_text(data);
    if actual != *stored {
        bail!("is corrupt: its tensor bytes do not match the checksum stored when it was written (CRC-32C {actual}, stored {stored}): a byte changed on disk or in a copy. Use an earlier checkpoint or a fresh copy; --no-verify loads it anyway");
    }
    Ok(())
}

/// What running a checkpoint needs besides its weights, so that `generate`, `eval`, `serve`
/// and `predict` work from the checkpoint alone (no data set). Saved as JSON under the
/// metadata key `inference`; read it with [`load`] (`Loaded::meta.inference`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InferenceInfo {
    /// The model's name (one of `sinter_models::MODEL_NAMES`); with `input_shape` and
    /// `classes` it rebuilds the exact architecture (`sinter_models::build`).
    pub model: String,
    /// "classification", "language_model" or "masked_lm".
    pub task: String,
    /// Shape of one input example: `[c, h, w]` for images, `[context]` for token models.
    pub input_shape: Vec<usize>,
    /// Classes of a classifier, or the data's vocabulary size for token models (BERT adds
    /// its mask token after it).
    pub classes: usize,
    /// Class names by class id, where the data names them.
    pub class_names: Option<Vec<String>>,
    /// How raw inputs become model inputs.
    pub input: InputSpec,
}

/// How raw inputs become model inputs (see `sinter_data::InputEncoding`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum InputSpec {
    /// Images `[c, h, w]`: `x = (pixel / pixel_max − mean[c]) / std[c]`.
    Image {
        pixel_max: f32,
        mean: Vec<f32>,
        std: Vec<f32>,
    },
    /// Text as bytes: one token per byte (vocabulary 256).
    Bytes,
    /// Text as GPT-2 BPE tokens.
    Gpt2Tokens,
    /// Not known (token files of another tokenizer).
    Unspecified,
}

impl InputSpec {
    pub fn from_data(e: &sinter_data::InputEncoding) -> InputSpec {
        use sinter_data::InputEncoding as E;
        match e {
            E::Image {
                pixel_max,
                mean,
                std,
            } => InputSpec::Image {
                pixel_max: *pixel_max,
                mean: mean.clone(),
                std: std.clone(),
            },
            E::Bytes => InputSpec::Bytes,
            E::Gpt2Tokens => InputSpec::Gpt2Tokens,
            E::Unspecified => InputSpec::Unspecified,
        }
    }
}

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
    /// The trainer's own state (best validation loss, early-stopping counters) as JSON.
    pub trainer: Option<String>,
    /// What inference needs; None in checkpoints written before it was saved.
    pub inference: Option<InferenceInfo>,
}

pub(crate) fn st_dtype(d: DType) -> Dtype {
    match d {
        DType::F32 => Dtype::F32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::I64 => Dtype::I64,
        DType::I32 => Dtype::I32,
        DType::U8 => Dtype::U8,
        DType::Bool => Dtype::BOOL,
    }
}

pub(crate) fn our_dtype(d: Dtype, name: &str) -> Result<DType> {
    Ok(match d {
        Dtype::F32 => DType::F32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::I64 => DType::I64,
        Dtype::I32 => DType::I32,
        Dtype::U8 => DType::U8,
        Dtype::BOOL => DType::Bool,
        other => bail!("tensor {name} has dtype {other:?}, which sinter does not load"),
    })
}

fn u64s(v: &[u64]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

fn parse_u64s<const N: usize>(s: Option<&String>, key: &str) -> Result<[u64; N]> {
    let s = s.ok_or_else(|| anyhow!("its metadata lacks '{key}'"))?;
    let v: Vec<u64> = s
        .split(',')
        .map(|x| x.parse())
        .collect::<std::result::Result<_, _>>()
        .with_context(|| format!("its metadata '{key}' is not a list of integers"))?;
    v.try_into()
        .map_err(|_| anyhow!("its metadata '{key}' should hold {N} integers"))
}

pub fn path_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// The name of `path`'s temporary twin for this process.
fn temporary(path: &Path, dir: &Path) -> PathBuf {
    dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file"),
        std::process::id()
    ))
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
    let tmp = temporary(path, dir);
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

/// Whether process `pid` is alive on this machine.
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Removes the temporary files (`.<name>.tmp-<pid>`) that runs killed while writing left in
/// `dir`, skipping those of live processes; returns what it removed and the bytes freed.
pub fn remove_stale_temporaries(dir: &Path) -> Result<(Vec<PathBuf>, u64)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok((Vec::new(), 0));
    };
    let mut removed = (Vec::new(), 0);
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix('.')
            .and_then(|n| n.rsplit_once(".tmp-"))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && alive(pid) {
            continue;
        }
        let bytes = e.metadata().map(|m| m.len()).unwrap_or(0);
        std::fs::remove_file(e.path())
            .with_context(|| format!("cannot remove stale {}", e.path().display()))?;
        removed.0.push(e.path());
        removed.1 += bytes;
    }
    Ok(removed)
}

/// The metadata of a checkpoint, keys sorted (so the file's bytes do not depend on the
/// process).
fn metadata(meta: &Meta) -> Result<BTreeMap<String, String>> {
    let mut md = BTreeMap::new();
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
    if let Some(t) = &meta.trainer {
        md.insert("trainer".into(), t.clone());
    }
    if let Some(i) = &meta.inference {
        md.insert("inference".into(), serde_json::to_string(i)?);
    }
    Ok(md)
}

/// A safetensors file: an 8-byte little-endian header length, the JSON header (metadata
/// first, then each tensor's dtype, shape and byte range, in data order), padded with spaces
/// to 8 bytes, then the tensors' bytes. Tensors are ordered by descending dtype size, then
/// name (as the safetensors crate orders them), so every tensor stays aligned. The metadata
/// gains the tensor bytes' checksum ([`CHECKSUM_KEY`]). The same tensors and metadata always
/// give the same bytes (int8 checkpoints are written here too).
pub(crate) fn serialize(
    tensors: Vec<(String, Dtype, Vec<usize>, Vec<u8>)>,
    md: &BTreeMap<String, String>,
) -> Result<Vec<u8>> {
    let mut tensors = tensors;
    tensors.sort_by(|a, b| b.1.size().cmp(&a.1.size()).then(a.0.cmp(&b.0)));
    // The checksum of the tensor bytes in file order, which loading verifies.
    let crc = tensors
        .iter()
        .fold(0, |crc, t| crc32c::crc32c_append(crc, &t.3));
    let mut md = md.clone();
    md.insert(CHECKSUM_KEY.into(), format!("{crc:08x}"));
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::to_value(&md)?);
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in &tensors {
        if header.contains_key(name) {
            bail!("two tensors are named {name}");
        }
        let dt = serde_json::to_value(dtype)?;
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [offset, offset + bytes.len()]}),
        );
        offset += bytes.len();
    }
    let mut h = serde_json::to_string(&serde_json::Value::Object(header))?.into_bytes();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = Vec::with_capacity(8 + h.len() + offset);
    out.extend_from_slice(&(h.len() as u64).to_le_bytes());
    out.extend_from_slice(&h);
    for (_, _, _, bytes) in &tensors {
        out.extend_from_slice(bytes);
    }
    Ok(out)
}

/// The bytes of a checkpoint of `model` and `optim` tensors with `meta`.
pub fn to_bytes(
    model: &[(String, Tensor)],
    optim: &[(String, Tensor)],
    meta: &Meta,
) -> Result<Vec<u8>> {
    let mut owned = Vec::new();
    for (prefix, list) in [("model", model), ("optim", optim)] {
        for (n, t) in list {
            owned.push((
                format!("{prefix}.{n}"),
                st_dtype(t.dtype()),
                t.shape().to_vec(),
                t.to_le_bytes()?,
            ));
        }
    }
    serialize(owned, &metadata(meta)?)
}

/// The step of a `--keep-last` copy's file name (`checkpoint-step<STEP>.safetensors`).
pub fn kept_step(name: &str) -> Option<u64> {
    name.strip_prefix("checkpoint-step")?
        .strip_suffix(".safetensors")?
        .parse()
        .ok()
}

/// `--keep-last n`: links the latest checkpoint (step `step`) as
/// `checkpoint-step<step>.safetensors` and removes all but the `n` newest such copies.
pub fn keep_last(dir: &Path, step: u64, n: u64) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    let copy = dir.join(format!("checkpoint-step{step}.safetensors"));
    let _ = std::fs::remove_file(&copy);
    if std::fs::hard_link(path_in(dir), &copy).is_err() {
        std::fs::copy(path_in(dir), &copy)
            .with_context(|| format!("cannot write {}", copy.display()))?;
    }
    let mut kept: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .flatten()
        .filter_map(|e| Some((kept_step(&e.file_name().to_string_lossy())?, e.path())))
        .collect();
    kept.sort();
    let extra = kept.len().saturating_sub(n as usize);
    for (_, p) in &kept[..extra] {
        std::fs::remove_file(p).with_context(|| format!("cannot remove {}", p.display()))?;
    }
    Ok(())
}

/// A checkpoint read back: tensors by full name, and its metadata.
pub struct Loaded {
    pub tensors: HashMap<String, Tensor>,
    pub meta: Meta,
}

/// What a safetensors error means, in words.
fn explain(e: &SafeTensorError) -> String {
    use SafeTensorError as E;
    let what = match e {
        E::HeaderTooLarge => "its header claims to be larger than sinter accepts (100 MB)",
        E::HeaderTooSmall => "it is shorter than the 8 bytes that give the header's length",
        E::InvalidHeaderLength => "its header runs past the end of the file",
        E::InvalidHeader | E::InvalidHeaderStart | E::InvalidHeaderDeserialization => {
            "its header is not the JSON a safetensors file starts with"
        }
        E::MetadataIncompleteBuffer => {
            "its length does not match the tensor data its header describes (the file was cut short, or bytes were added)"
        }
        E::InvalidOffset(_) | E::TensorInvalidInfo | E::ValidationOverflow => {
            "its header gives tensor positions that do not fit the file"
        }
        _ => "it could not be read as safetensors",
    };
    format!("{what} ({e:?})")
}

pub(crate) fn file_of(dir: &Path) -> PathBuf {
    if dir.is_dir() {
        path_in(dir)
    } else {
        dir.to_path_buf()
    }
}

/// Reads and checks a checkpoint (a run directory or the file itself). Every error names
/// the file.
pub fn load(dir: &Path) -> Result<Loaded> {
    let path = file_of(dir);
    let bytes = std::fs::read(&path).map_err(|e| unreadable(dir, &path, e))?;
    parse(&bytes).with_context(|| format!("checkpoint {}", path.display()))
}

/// Why the checkpoint `path` of `dir` cannot be read, in words: a run directory whose run
/// never wrote a checkpoint (stopped or killed before or during its first) says so and what
/// to do.
fn unreadable(dir: &Path, path: &Path, e: std::io::Error) -> anyhow::Error {
    if dir.is_dir() && e.kind() == std::io::ErrorKind::NotFound {
        if let Some(what) = run_without_checkpoint(dir) {
            return anyhow!("{} holds {what}, but no {FILE_NAME}: the run was stopped or killed before its first checkpoint was written (or while it was being written), so there is nothing to resume. Start it again with `sinter train --out {} --overwrite …` (its flags as before), or choose another --out", dir.display(), dir.display());
        }
    }
    anyhow!(
        "cannot read checkpoint {} (does the run directory exist and hold {FILE_NAME}?): {e}",
        path.display()
    )
}

/// When `dir` holds the files of a run (history, an unfinished checkpoint's temporary) but
/// no checkpoint: what it holds, in words.
pub fn run_without_checkpoint(dir: &Path) -> Option<String> {
    if path_in(dir).exists() || dir.join(BEST_FILE).exists() {
        return None;
    }
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.starts_with("metrics.")
                || n.starts_with("events.out.tfevents")
                || n.starts_with(&format!(".{FILE_NAME}.tmp-"))
        })
        .collect();
    found.sort();
    if found.is_empty() {
        return None;
    }
    Some(format!("the files of a run ({})", found.join(", ")))
}

/// The metadata of a checkpoint (a run directory or the file itself), read from its header
/// alone: a first look (e.g. at a resumed run's config) without reading every tensor.
/// [`load`] checks the whole file later.
pub fn load_meta(dir: &Path) -> Result<Meta> {
    let path = file_of(dir);
    let f = std::fs::File::open(&path).map_err(|e| unreadable(dir, &path, e))?;
    header_meta(std::io::BufReader::new(f))
        .with_context(|| format!("checkpoint {}", path.display()))
}

/// The largest header [`load_meta`] reads (safetensors' own limit).
const MAX_HEADER: u64 = 100_000_000;

/// The metadata in the header at the start of `f` (see [`load_meta`]).
fn header_meta(mut f: impl std::io::Read) -> Result<Meta> {
    use std::io::Read;
    let corrupt = |what: &str| anyhow!("is corrupt or truncated: {what}");
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|_| corrupt("it is shorter than the 8 bytes that give the header's length"))?;
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(corrupt(
            "its header claims to be larger than sinter accepts (100 MB)",
        ));
    }
    let mut header = Vec::new();
    f.take(len).read_to_end(&mut header)?;
    if header.len() as u64 != len {
        return Err(corrupt("its header runs past the end of the file"));
    }
    #[derive(Deserialize)]
    struct Header {
        #[serde(rename = "__metadata__", default)]
        metadata: HashMap<String, String>,
    }
    let h: Header = serde_json::from_slice(&header)
        .map_err(|_| corrupt("its header is not the JSON a safetensors file starts with"))?;
    check_format(&h.metadata)?;
    parse_meta(&h.metadata)
}

fn check_format(md: &HashMap<String, String>) -> Result<()> {
    match md.get("format").map(String::as_str) {
        Some(FORMAT) => Ok(()),
        Some(f) if f.starts_with(QUANTIZED_FAMILY) => {
            let source = md
                .get("source")
                .map(|s| format!(" (this one was made from {s})"))
                .unwrap_or_default();
            bail!("is an int8 inference checkpoint (format {f}) made by `sinter quantize`: it holds no optimizer state and cannot be trained further. eval, generate, predict and serve load it; to train, resume from the f32 training checkpoint it was quantized from{source}, which `sinter train --out DIR` writes")
        }
        Some(f) => bail!("is not a sinter training checkpoint: its metadata format is '{f}', not '{FORMAT}'"),
        None => bail!("is not a sinter checkpoint: its metadata has no 'format' (a safetensors file from elsewhere?); sinter loads the checkpoint.safetensors that `sinter train --out DIR` writes"),
    }
}

/// A checkpoint from its bytes (see [`load`]).
pub fn parse(bytes: &[u8]) -> Result<Loaded> {
    let corrupt = |e: SafeTensorError| anyhow!("is corrupt or truncated: {}", explain(&e));
    let (_, header) = SafeTensors::read_metadata(bytes).map_err(corrupt)?;
    let st = SafeTensors::deserialize(bytes).map_err(corrupt)?;
    let md = header.metadata().clone().unwrap_or_default();
    check_format(&md)?;
    verify_checksum(bytes, &md)?;
    let meta = parse_meta(&md)?;
    let mut tensors = HashMap::new();
    for (name, view) in st.tensors() {
        let dtype = our_dtype(view.dtype(), &name)?;
        let t = Tensor::from_le_bytes(view.data(), dtype, view.shape(), Device::Cpu)
            .with_context(|| format!("tensor {name} is corrupt"))?;
        check_finite(&name, &t)?;
        tensors.insert(name, t);
    }
    Ok(Loaded { tensors, meta })
}

/// The metadata every file that holds a model shares (training and int8 checkpoints): the
/// step, the run's config (checked like the flags) and the inference information.
pub(crate) fn parse_model_meta(
    md: &HashMap<String, String>,
) -> Result<(u64, TrainConfig, Option<InferenceInfo>)> {
    let config: TrainConfig = serde_json::from_str(
        md.get("config")
            .ok_or_else(|| anyhow!("its metadata lacks 'config'"))?,
    )
    .context("its config is unreadable")?;
    config
        .validate()
        .context("its config is invalid (was the file edited?)")?;
    let inference = md
        .get("inference")
        .map(|s| serde_json::from_str(s))
        .transpose()
        .context("its inference information is unreadable")?;
    Ok((parse_u64(md, "step")?, config, inference))
}

fn parse_u64(md: &HashMap<String, String>, k: &str) -> Result<u64> {
    md.get(k)
        .ok_or_else(|| anyhow!("its metadata lacks '{k}'"))?
        .parse()
        .with_context(|| format!("its metadata '{k}' is not an integer"))
}

fn parse_meta(md: &HashMap<String, String>) -> Result<Meta> {
    let parse = |k: &str| parse_u64(md, k);
    let (step, config, inference) = parse_model_meta(md)?;
    Ok(Meta {
        step,
        optimizer_steps: parse("optimizer_steps")?,
        rng: parse_u64s(md.get("rng"), "rng")?,
        dropout_rng: parse_u64s(md.get("dropout_rng"), "dropout_rng")?,
        loader: parse_u64s(md.get("loader"), "loader")?,
        config,
        precision: md.get("precision").cloned(),
        trainer: md.get("trainer").cloned(),
        inference,
    })
}

/// A weight or optimizer state with NaN or infinity cannot be what training saved.
pub(crate) fn check_finite(name: &str, t: &Tensor) -> Result<()> {
    if !t.dtype().is_float() {
        return Ok(());
    }
    let v = t.to_dtype(DType::F32)?.to_vec_f32()?;
    let bad = v.iter().filter(|x| !x.is_finite()).count();
    if bad > 0 {
        let first = v.iter().position(|x| !x.is_finite()).unwrap_or(0);
        bail!(
            "tensor {name} holds {bad} NaN or infinite value(s) of {} (the first at index {first}, {}); the weights are corrupt — use an earlier checkpoint",
            v.len(),
            v[first]
        );
    }
    Ok(())
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

    #[test]
    fn stale_temporaries_of_dead_processes_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        // pid 4194305 is above Linux's pid_max (2^22): never alive.
        let stale = dir.path().join(".checkpoint.safetensors.tmp-4194305");
        std::fs::write(&stale, vec![0u8; 1000]).unwrap();
        // pid 1 is alive: its file is left alone.
        let live = dir.path().join(".summary.json.tmp-1");
        std::fs::write(&live, b"x").unwrap();
        let keep = dir.path().join("checkpoint.safetensors");
        std::fs::write(&keep, b"x").unwrap();
        let (removed, bytes) = remove_stale_temporaries(dir.path()).unwrap();
        assert_eq!((removed, bytes), (vec![stale.clone()], 1000));
        assert!(!stale.exists() && live.exists() && keep.exists());
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn meta() -> Meta {
            let config = crate::config::TrainConfig::resolve(&Default::default()).unwrap();
            Meta {
                step: 3,
                optimizer_steps: 3,
                rng: [1, 2, 3, 4],
                dropout_rng: [5, 6, 7, 8],
                loader: [0, 3],
                config,
                precision: None,
                trainer: None,
                inference: None,
            }
        }

        /// The bytes of a small valid checkpoint.
        fn valid() -> Vec<u8> {
            let w = Tensor::from_vec(vec![0.5f32; 6], &[2, 3], Device::Cpu).unwrap();
            to_bytes(
                &[("fc.weight".into(), w.clone())],
                &[("fc.weight.exp_avg".into(), w)],
                &meta(),
            )
            .unwrap()
        }

        #[test]
        fn bool_tensors_are_saved_as_safetensors_bool_and_load_back() {
            let v = vec![true, false, false, true, true, false];
            let mask = Tensor::from_vec(v.clone(), &[2, 3], Device::Cpu).unwrap();
            let b = to_bytes(&[("mask".into(), mask)], &[], &meta()).unwrap();
            let (_, header) = SafeTensors::read_metadata(&b).unwrap();
            assert_eq!(header.tensors()["model.mask"].dtype, Dtype::BOOL);
            let t = &parse(&b).unwrap().tensors["model.mask"];
            assert_eq!((t.dtype(), t.shape()), (DType::Bool, &[2usize, 3][..]));
            assert_eq!(t.to_vec_bool().unwrap(), v);
            // A bool byte other than 0 or 1 fails the checksum; with the checksum made to
            // match, it is still corrupt data, named as such.
            let mut bad = b.clone();
            let last = bad.len() - 1;
            bad[last] = 7;
            let e = format!("{:#}", parse(&bad).err().expect("a changed byte loaded"));
            assert!(e.contains("checksum"), "{e}");
            let Err(e) = parse(&restamped(bad)) else {
                panic!("a bool byte of 7 loaded");
            };
            let e = format!("{e:#}");
            assert!(e.contains("model.mask") && e.contains("not 0 or 1"), "{e}");
        }

        /// `bytes` with the checksum in its header replaced by its tensor bytes' (the same
        /// length of text, so nothing moves).
        fn restamped(mut bytes: Vec<u8>) -> Vec<u8> {
            let start = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
            let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
            let old = header.metadata().as_ref().unwrap()[CHECKSUM_KEY].clone();
            let new = checksum_text(&bytes[start..]);
            let text = String::from_utf8(bytes[8..start].to_vec()).unwrap();
            let text = text.replace(&format!("\"{old}\""), &format!("\"{new}\""));
            bytes[8..start].copy_from_slice(text.as_bytes());
            bytes
        }

        #[test]
        fn one_changed_tensor_byte_is_refused_by_the_checksum() {
            let good = valid();
            let start = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
            for at in [start, good.len() - 1] {
                let mut bad = good.clone();
                bad[at] ^= 0x01;
                let e = format!("{:#}", parse(&bad).err().expect("a flipped byte loaded"));
                assert!(e.contains("do not match the checksum"), "{e}");
                // The same change with its checksum loads: the check is what refused it.
                assert!(parse(&restamped(bad)).is_ok());
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

            #[test]
            fn random_bytes_are_refused_without_a_panic(
                bytes in proptest::collection::vec(any::<u8>(), 0..512),
            ) {
                prop_assert!(parse(&bytes).is_err());
            }

            #[test]
            fn damaged_checkpoints_load_or_are_refused_without_a_panic(
                cut in 0usize..200,
                flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..4),
            ) {
                let mut b = valid();
                b.truncate(b.len() - cut.min(b.len()));
                for (at, x) in flips {
                    if !b.is_empty() {
                        let i = at % b.len();
                        b[i] ^= x;
                    }
                }
                let _ = parse(&b);
                let _ = header_meta(&b[..]);
            }

            #[test]
            fn toml_configs_never_panic(text in "[a-z_ =\"0-9.\n-]{0,120}") {
                if let Ok(c) = toml::from_str::<crate::config::ConfigFile>(&text) {
                    let _ = crate::config::TrainConfig::resolve(&c);
                }
            }
        }

        #[test]
        fn the_header_alone_gives_the_metadata() {
            let b = valid();
            let whole = parse(&b).unwrap().meta;
            // Without its tensor data the file does not load, but its header still reads.
            let cut = &b[..b.len() - 8];
            assert!(parse(cut).is_err());
            assert_eq!(header_meta(cut).unwrap(), whole);
            let e = header_meta(&b[..20]).unwrap_err().to_string();
            assert!(e.contains("corrupt or truncated"), "{e}");
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(path_in(dir.path()), &b).unwrap();
            assert_eq!(load_meta(dir.path()).unwrap(), whole);
        }

        #[test]
        fn the_valid_checkpoint_parses() {
            let l = parse(&valid()).unwrap();
            assert_eq!(l.meta.step, 3);
            assert_eq!(
                to_bytes(&[], &[], &l.meta).unwrap(),
                to_bytes(&[], &[], &l.meta).unwrap()
            );
        }
    }
}
