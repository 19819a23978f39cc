//! The real SmolLM2-135M-Instruct (Q4_1 GGUF) served with its own tokenizer and chat template,
//! asked "What is the capital of France?" by the official `openai` Python client
//! (tests/python/smollm2_chat.py): the greedy answer names Paris, streamed and whole alike,
//! with a finish_reason that matches its token count.
//!
//! Also: SmolLM2 answering under a JSON schema (the answer parses and matches it), and the
//! real all-MiniLM-L6-v2 behind /v1/embeddings (each vector equals `Bert::embed` of the
//! sentence alone).
//!
//! Needs the weights (`.ci/fetch-weights smollm2`, `minilm`) and Python with `openai`. Without them
//! the test says so and passes, unless SINTER_REQUIRE_WEIGHTS=1 / SINTER_REQUIRE_OPENAI=1
//! (CI), where it fails.

use std::path::Path;
use std::time::{Duration, Instant};

use sinter_nn::Module;
use sinter_serve::{DecoderModel, ServeOptions, Server, Tokenizer};

mod common;
#[path = "../../../tests/support/real_weights.rs"]
mod real_weights;
use common::{openai_available, python};

const GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Skips (returns None) with a message, or fails when `require` is set to 1.
fn unavailable<T>(require: &str, why: String) -> Option<T> {
    assert!(
        std::env::var(require).as_deref() != Ok("1"),
        "{require}=1 but {why}"
    );
    eprintln!("skipped: {why}");
    None
}

/// The server `sinter serve --model GGUF` runs, in process, named after the file.
fn serve(gguf: &Path) -> Server {
    let p = sinter_models::load_pretrained_with_tokenizer(gguf).unwrap();
    p.model.set_training(false);
    let context = p.model.config.block_size;
    let model = DecoderModel::new(p.model, context).unwrap();
    let o = ServeOptions {
        port: 0,
        model_name: GGUF.into(),
        ..Default::default()
    };
    Server::start(model, Tokenizer::text(p.tokenizer, p.chat_template), o).unwrap()
}

#[test]
fn the_openai_client_hears_paris_from_smollm2() {
    let Some(gguf) = real_weights::smollm2_gguf() else {
        return;
    };
    if !openai_available() {
        unavailable::<()>(
            "SINTER_REQUIRE_OPENAI",
            format!(
                "`{} -c 'import openai'` fails: pip install openai",
                python()
            ),
        );
        return;
    }
    let server = serve(&gguf);
    let url = format!("http://{}", server.addr());
    let (ok, stdout, stderr) =
        common::run_script("smollm2_chat.py", &[&url, GGUF], Duration::from_secs(300));
    println!("{stdout}");
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("smollm2 chat: ok"), "{stdout}");
    server.shutdown().unwrap();
}

/// The time of one 32-token chat completion (README's figure). Not run by default:
/// `cargo test -p sinter-serve --test smollm2 -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "timing; run with --ignored --nocapture"]
async fn time_of_a_32_token_chat_completion() {
    let Some(gguf) = real_weights::smollm2_gguf() else {
        return;
    };
    let server = serve(&gguf);
    let body = serde_json::json!({
        "model": GGUF,
        "messages": [{"role": "user", "content": "Write a long poem about the sea."}],
        "max_tokens": 32,
        "temperature": 0,
    });
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{}/v1/chat/completions", server.addr());
    let t0 = Instant::now();
    let r = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    let secs = t0.elapsed().as_secs_f64();
    assert_eq!(v["usage"]["completion_tokens"], 32, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
    println!(
        "one 32-token chat completion ({} prompt tokens): {secs:.2} s, {:.3} s/token; {:?}",
        v["usage"]["prompt_tokens"],
        secs / 32.0,
        v["choices"][0]["message"]["content"]
    );
    server.shutdown().unwrap();
}

async fn post_json(url: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let r = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (
        status,
        serde_json::from_str(&r.text().await.unwrap()).unwrap(),
    )
}

/// SmolLM2 asked for a country as JSON under a schema, greedy and sampled: the answer parses
/// and has exactly the schema's shape (its own tokenizer's token texts drive the mask).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smollm2_answers_in_the_json_schema() {
    let Some(gguf) = real_weights::smollm2_gguf() else {
        return;
    };
    let server = serve(&gguf);
    let url = format!("http://{}/v1/chat/completions", server.addr());
    let schema = serde_json::json!({
        "type": "object",
        "properties": {
            "country": {"type": "string"},
            "capital": {"type": "string"},
            "population_millions": {"type": "number"},
            "continent": {"enum": ["Europe", "Asia", "Africa", "America", "Oceania"]}
        },
        "required": ["country", "capital", "continent"]
    });
    for temperature in [0.0, 0.8] {
        let (status, v) = post_json(
            &url,
            serde_json::json!({
                "model": GGUF,
                "messages": [{"role": "user", "content": "Describe France as JSON with its capital."}],
                "max_tokens": 60,
                "temperature": temperature,
                "seed": 1,
                "response_format": {"type": "json_schema", "json_schema": {"name": "country", "schema": schema}},
            }),
        )
        .await;
        assert_eq!(status, 200, "{v}");
        let text = v["choices"][0]["message"]["content"].as_str().unwrap();
        println!("temperature {temperature}: {text}");
        let doc: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(
            doc["country"].is_string() && doc["capital"].is_string(),
            "{doc}"
        );
        assert!(doc["continent"].is_string(), "{doc}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    server.shutdown().unwrap();
}

/// The real all-MiniLM-L6-v2 behind /v1/embeddings: each sentence's vector (batched with
/// the others, padded and masked) equals `Bert::embed` of its tokenizer ids alone within
/// 1e-5; an input past its 512 positions is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minilm_embeddings_equal_bert_embed() {
    use sinter_core::{Device, Tensor};
    use sinter_serve::{BertEmbedder, Embedder};
    let Some(dir) = real_weights::weights_dir("minilm") else {
        return;
    };
    let load = || {
        let b = sinter_models::from_hf_pretrained(&dir, &sinter_nn::module::shared_rng(0)).unwrap();
        b.set_training(false);
        b
    };
    let tokenizer = || sinter_data::TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let tok = tokenizer();
    let emb = Embedder::new(
        BertEmbedder::new(load()),
        Tokenizer::text(tokenizer(), None),
        "minilm",
    );
    let server = Server::start_embeddings(
        emb,
        ServeOptions {
            port: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let url = format!("http://{}/v1/embeddings", server.addr());
    let sentences = [
        "This is an example sentence.",
        "Each sentence is converted.",
        "The quick brown fox jumps over the lazy dog, twice, before breakfast.",
    ];
    let (status, v) = post_json(
        &url,
        serde_json::json!({"model": "minilm", "input": sentences}),
    )
    .await;
    assert_eq!(status, 200, "{v}");
    let bert = load();
    for (i, s) in sentences.iter().enumerate() {
        let ids: Vec<i64> = tok
            .encode(s, true)
            .unwrap()
            .into_iter()
            .map(i64::from)
            .collect();
        let t = Tensor::from_vec(ids.clone(), &[1, ids.len()], Device::Cpu).unwrap();
        let want = bert.embed(&t, None, true).unwrap().to_vec_f32().unwrap();
        let got: Vec<f32> = v["data"][i]["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap() as f32)
            .collect();
        assert_eq!(got.len(), 384);
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst <= 1e-5, "sentence {i}: worst difference {worst:e}");
    }
    let long = "word ".repeat(600);
    let (status, v) = post_json(&url, serde_json::json!({"model": "minilm", "input": long})).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("context_length_exceeded")),
        "{v}"
    );
    server.shutdown().unwrap();
}
