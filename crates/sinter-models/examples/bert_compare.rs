//! Checks sinter's BERT against transformers' `BertForMaskedLM`, from the files written by
//! `bench/gpu/bert_reference.py`.
//!
//! ```text
//! python3 bench/gpu/bert_reference.py --out /tmp/bert_ref
//! cargo run --release -p sinter-models --example bert_compare -- /tmp/bert_ref [--tol 1e-4]
//! ```
//!
//! Builds the BERT of `DIR/config.json` and loads `DIR/model.safetensors` with
//! `from_hf_pretrained` (as `BertForMaskedLM.from_pretrained(DIR)` does), runs the reference batch
//! (token types and a padding mask included) and compares logits, the masked-LM loss and
//! the `grad.<name>` tensors: max |ours − ref| / max |ref| per tensor. Exit status 1 if any
//! is above the tolerance.

use std::collections::HashMap;
use std::process::ExitCode;

use safetensors::tensor::{Dtype, SafeTensors};
use sinter_core::{DType, Device, Tensor};
use sinter_models::from_hf_pretrained;
use sinter_nn::module::shared_rng;
use sinter_nn::Module;

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn tensors(bytes: &[u8]) -> AnyResult<HashMap<String, Tensor>> {
    let st = SafeTensors::deserialize(bytes)?;
    let mut out = HashMap::new();
    for (name, v) in st.tensors() {
        let dtype = match v.dtype() {
            Dtype::F32 => DType::F32,
            Dtype::I64 => DType::I64,
            other => return Err(format!("tensor {name} has dtype {other:?}").into()),
        };
        out.insert(
            name,
            Tensor::from_le_bytes(v.data(), dtype, v.shape(), Device::Cpu)?,
        );
    }
    Ok(out)
}

fn rel_err(ours: &Tensor, reference: &Tensor) -> AnyResult<f64> {
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
    let diff = a.iter().zip(&b).fold(0f64, |m, (x, y)| {
        m.max(if x.is_finite() {
            (x - y).abs()
        } else {
            f64::INFINITY
        })
    });
    Ok(if scale > 0.0 { diff / scale } else { diff })
}

fn run() -> AnyResult<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut dir, mut tol) = (None, 1e-4);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--tol" => tol = it.next().ok_or("--tol needs a value")?.parse()?,
            "-h" | "--help" => {
                println!("usage: bert_compare DIR [--tol 1e-4]   (DIR written by bench/gpu/bert_reference.py)");
                return Ok(true);
            }
            d => dir = Some(std::path::PathBuf::from(d)),
        }
    }
    let dir = dir.ok_or("usage: bert_compare DIR [--tol 1e-4]")?;
    let model = from_hf_pretrained(&dir, &shared_rng(0))?;
    eprintln!("config: {:?}", model.config);
    model.set_training(false);
    let r = tensors(&std::fs::read(dir.join("reference.safetensors"))?)?;
    let get = |n: &str| {
        r.get(n)
            .ok_or_else(|| format!("reference.safetensors has no {n}"))
    };
    let (ids, tt, mask, labels) = (
        get("input_ids")?,
        get("token_type_ids")?,
        get("attention_mask")?,
        get("labels")?,
    );
    let t0 = std::time::Instant::now();
    let logits = model.forward_with(ids, Some(tt), Some(mask))?;
    let loss = model.mlm_loss(ids, labels, Some(tt), Some(mask))?;
    loss.backward()?;
    let secs = t0.elapsed().as_secs_f64();
    let mut rows = vec![
        ("logits".to_string(), rel_err(&logits, get("logits")?)?),
        (
            "loss".to_string(),
            rel_err(&loss.reshape(&[1])?, get("loss")?)?,
        ),
    ];
    let params: HashMap<String, Tensor> = model.parameters().into_iter().collect();
    let mut grads: Vec<&String> = r.keys().filter(|k| k.starts_with("grad.")).collect();
    grads.sort();
    for name in grads {
        let p = params
            .get(&name["grad.".len()..])
            .ok_or_else(|| format!("{name}: no such parameter"))?;
        let g = p.grad().ok_or_else(|| format!("{name}: no gradient"))?;
        rows.push((name.clone(), rel_err(&g, &r[name])?));
    }
    let mut ok = true;
    for (n, e) in &rows {
        ok &= *e <= tol;
        println!(
            "{n:<60} max rel err {e:.3e}  {}",
            if *e <= tol { "ok" } else { "FAIL" }
        );
    }
    let worst = rows.iter().map(|r| r.1).fold(0f64, f64::max);
    println!(
        "{{\"bench\": \"bert_compare\", \"ok\": {ok}, \"tol\": {tol:e}, \"max_rel_err\": {worst:e}, \"logits_rel_err\": {:e}, \"n_layer\": {}, \"hidden\": {}, \"fwd_bwd_s\": {secs:.3}}}",
        rows[0].1, model.config.n_layer, model.config.hidden
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
