//! Checks sinter's GPT against reference outputs written by `bench/gpu/gpt2_reference.py`
//! (transformers' GPT2LMHeadModel, or the same model in plain PyTorch).
//!
//! ```text
//! python3 bench/gpu/gpt2_reference.py --out /tmp/gpt2_ref
//! cargo run --release -p sinter-models --example gpt2_compare -- /tmp/gpt2_ref [--tol 1e-4]
//! ```
//!
//! Loads `DIR/model.safetensors` (Hugging Face layout) into a GPT built from the file's
//! shapes, runs `input_ids` from `DIR/reference.safetensors`, and compares the logits, the
//! next-token loss and every `grad.<name>` there (in HF layout; Conv1D gradients are
//! transposed to match). Errors are relative to the largest reference magnitude of each
//! tensor: max |ours − ref| / max |ref|. Prints one line per tensor and a JSON summary;
//! exits with status 1 if any error is above the tolerance.
//!
//! `--export OUT` also writes the loaded model back with `save_hf_gpt2` (`OUT/model.safetensors`
//! and `OUT/config.json`), which `GPT2LMHeadModel.from_pretrained(OUT)` loads.

use std::collections::HashMap;
use std::process::ExitCode;

use safetensors::tensor::{Dtype, SafeTensors};
use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::hf_gpt2::hf_gpt2_config_json;
use sinter_models::hf_gpt2::hf_gpt2_name;
use sinter_models::{hf_gpt2_config, load_hf_gpt2, save_hf_gpt2, Decoder};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn read_reference(bytes: &[u8]) -> AnyResult<HashMap<String, Tensor>> {
    let st = SafeTensors::deserialize(bytes)?;
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        let dtype = match v.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::I64 => DType::I64,
            other => {
                return Err(format!(
                    "reference tensor {name} has dtype {other:?}; expected F32 or I64"
                )
                .into())
            }
        };
        out.insert(
            name,
            Tensor::from_le_bytes(v.data(), dtype, v.shape(), Device::Cpu)?,
        );
    }
    Ok(out)
}

/// (max |a − b| / max |b|, max |a − b|).
fn rel_err(ours: &Tensor, reference: &Tensor) -> AnyResult<(f64, f64)> {
    if ours.shape() != reference.shape() {
        return Err(format!(
            "shape {:?} differs from the reference's {:?}",
            ours.shape(),
            reference.shape()
        )
        .into());
    }
    let (a, b) = (ours.to_vec_f64()?, reference.to_vec_f64()?);
    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f64, |m, (x, y)| m.max((x - y).abs()));
    if a.iter().any(|x| !x.is_finite()) {
        return Ok((f64::INFINITY, f64::INFINITY));
    }
    Ok((if scale > 0.0 { diff / scale } else { diff }, diff))
}

fn run() -> AnyResult<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut dir = None;
    let mut tol = 1e-4;
    let mut export = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tol" => tol = it.next().ok_or("--tol needs a value")?.parse()?,
            "--export" => {
                export = Some(std::path::PathBuf::from(
                    it.next().ok_or("--export needs a directory")?,
                ))
            }
            "-h" | "--help" => {
                println!("usage: gpt2_compare DIR [--tol 1e-4] [--export OUT]   (DIR written by bench/gpu/gpt2_reference.py)");
                return Ok(true);
            }
            d => dir = Some(std::path::PathBuf::from(d)),
        }
    }
    let dir = dir.ok_or("usage: gpt2_compare DIR [--tol 1e-4] [--export OUT]")?;
    let weights = dir.join("model.safetensors");
    let config = hf_gpt2_config(&weights, None)?;
    eprintln!("config from {}: {config:?}", weights.display());
    let model = Decoder::new(config.clone(), &mut Rng::new(0), &shared_rng(0))?;
    load_hf_gpt2(&weights, &model)?;
    model.set_training(false);
    if let Some(out) = &export {
        std::fs::create_dir_all(out)?;
        save_hf_gpt2(&model, out.join("model.safetensors"))?;
        std::fs::write(out.join("config.json"), hf_gpt2_config_json(&config))?;
        eprintln!("exported the model to {}", out.display());
    }

    let ref_bytes = std::fs::read(dir.join("reference.safetensors"))?;
    let r = read_reference(&ref_bytes)?;
    let ids = r
        .get("input_ids")
        .ok_or("reference.safetensors has no input_ids")?;
    let (b, t) = (ids.shape()[0], ids.shape()[1]);
    let t0 = std::time::Instant::now();
    let logits = model.forward(ids)?;
    let v = config.vocab_size;
    let pred = logits.narrow(1, 0, t - 1)?.reshape(&[b * (t - 1), v])?;
    let targets = ids
        .narrow(1, 1, t - 1)?
        .contiguous()?
        .reshape(&[b * (t - 1)])?;
    let loss = pred.cross_entropy(&targets, -100)?;
    loss.backward()?;
    let secs = t0.elapsed().as_secs_f64();

    let mut rows: Vec<(String, f64, f64)> = Vec::new();
    let (e, d) = rel_err(
        &logits,
        r.get("logits").ok_or("no logits in the reference")?,
    )?;
    rows.push(("logits".into(), e, d));
    if let Some(rl) = r.get("loss") {
        let (e, d) = rel_err(&loss.reshape(&[1])?, rl)?;
        rows.push(("loss".into(), e, d));
    }
    let ours: HashMap<String, (Tensor, bool)> = model
        .named_tensors()
        .into_iter()
        .filter_map(|nt| hf_gpt2_name(&nt.name).map(|(hf, conv1d)| (hf, (nt.tensor, conv1d))))
        .collect();
    let mut grads: Vec<&String> = r.keys().filter(|k| k.starts_with("grad.")).collect();
    grads.sort();
    for name in grads {
        let hf = &name["grad.".len()..];
        let Some((p, conv1d)) = ours.get(hf) else {
            return Err(
                format!("reference gradient {name}: no such GPT-2 weight in the model").into(),
            );
        };
        let g = p
            .grad()
            .ok_or_else(|| format!("{hf} received no gradient"))?;
        let g = if *conv1d { g.t()?.contiguous()? } else { g };
        let (e, d) = rel_err(&g, &r[name])?;
        rows.push((name.clone(), e, d));
    }
    let mut ok = true;
    for (n, e, d) in &rows {
        let pass = *e <= tol;
        ok &= pass;
        println!(
            "{:<40} max rel err {e:.3e}  max abs err {d:.3e}  {}",
            n,
            if pass { "ok" } else { "FAIL" }
        );
    }
    let worst = rows.iter().map(|r| r.1).fold(0f64, f64::max);
    println!(
        "{{\"bench\": \"gpt2_compare\", \"ok\": {ok}, \"tol\": {tol:e}, \"max_rel_err\": {worst:e}, \"logits_rel_err\": {:e}, \"batch\": {b}, \"seq\": {t}, \"n_layer\": {}, \"n_embd\": {}, \"fwd_bwd_s\": {secs:.3}}}",
        rows[0].1, config.n_layer, config.n_embd
    );
    Ok(ok)
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}
