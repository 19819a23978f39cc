//! What the Llama-family tests share: the reference format bench/llm writes (`ref.json` and
//! raw little-endian f32 logits per prompt), the error measure, and greedy decoding through
//! the KV cache.

use std::path::Path;

use serde_json::Value;
use sinter_core::{Device, Tensor};
use sinter_models::Decoder;

pub struct Reference {
    pub ids: Vec<i64>,
    pub logits: Vec<f32>,
    pub vocab: usize,
    pub greedy: Vec<i64>,
}

/// The prompts and reference outputs in `dir` (its ref.json and the logits files it names).
pub fn read_references(dir: &Path) -> Vec<Reference> {
    let text = std::fs::read_to_string(dir.join("ref.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let ints = |k: &str| -> Vec<i64> {
                p[k].as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect()
            };
            let bytes = std::fs::read(dir.join(p["logits_file"].as_str().unwrap())).unwrap();
            let logits: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            let shape = ints("shape");
            assert_eq!(logits.len() as i64, shape[0] * shape[1]);
            Reference {
                ids: ints("ids"),
                logits,
                vocab: shape[1] as usize,
                greedy: ints("greedy"),
            }
        })
        .collect()
}

/// max over positions of max|a − b| / max|b| (each position's error relative to its scale).
pub fn worst_relative_error(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(x, y)| {
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        })
        .fold(0f32, f32::max)
}

pub fn argmax(v: &[f32]) -> i64 {
    v.iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &x)| {
            if x > bv {
                (i, x)
            } else {
                (bi, bv)
            }
        })
        .0 as i64
}

pub fn ids_tensor(ids: &[i64]) -> Tensor {
    Tensor::from_slice(ids, &[1, ids.len()], Device::Cpu).unwrap()
}

/// Greedy continuation through the KV cache: the prompt as one prefill, then a token a step.
pub fn greedy(model: &Decoder, prompt: &[i64], n: usize) -> Vec<i64> {
    let mut cache = model.kv_cache_with_capacity(1, prompt.len() + n).unwrap();
    let v = model.config.vocab_size;
    let all = model
        .forward_step(&ids_tensor(prompt), &mut cache)
        .unwrap()
        .to_vec_f32()
        .unwrap();
    let mut out = vec![argmax(&all[all.len() - v..])];
    while out.len() < n {
        let l = model
            .forward_step(&ids_tensor(&out[out.len() - 1..]), &mut cache)
            .unwrap();
        out.push(argmax(&l.to_vec_f32().unwrap()));
    }
    out
}
