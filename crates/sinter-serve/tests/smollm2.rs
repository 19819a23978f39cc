//! The real SmolLM2-135M-Instruct (Q4_1 GGUF) served with its own tokenizer and chat template,
//! asked "What is the capital of France?" by the official `openai` Python client
//! (tests/python/smollm2_chat.py): the greedy answer names Paris, streamed and whole alike,
//! with a finish_reason that matches its token count.
//!
//! Needs the weights (`.ci/fetch-weights smollm2`) and Python with `openai`. Without them
//! the test says so and passes, unless SINTER_REQUIRE_WEIGHTS=1 / SINTER_REQUIRE_OPENAI=1
//! (CI), where it fails.

use std::path::Path;
use std::time::{Duration, Instant};

use sinter_nn::Module;
use sinter_serve::{GptModel, ServeOptions, Server, Tokenizer};

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
    let model = GptModel::new(p.model, context).unwrap();
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
