//! What the server test files share: a tiny random byte-level GPT to serve, and running the
//! Python client scripts under tests/python with a time bound.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sinter_core::Rng;
use sinter_models::{Decoder, DecoderConfig};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;
use sinter_serve::DecoderModel;

/// 2 layers, width 32, context 64, 256 byte tokens; its text is gibberish, fixed by `seed`.
pub fn tiny_gpt(seed: u64) -> DecoderModel {
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 64,
        vocab_size: 256,
        dropout: 0.0,
        ..Default::default()
    };
    let gpt = Decoder::new(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    gpt.set_training(false);
    DecoderModel::new(gpt, 64).unwrap()
}

/// The Python to run client scripts with ($PYTHON, else python3).
pub fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Whether that Python imports the `openai` package.
pub fn openai_available() -> bool {
    Command::new(python())
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs tests/python/`script` with `args`, killed (and the test failed) after `limit`;
/// returns (success, stdout, stderr).
pub fn run_script(script: &str, args: &[&str], limit: Duration) -> (bool, String, String) {
    let path = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(python())
        .arg(&path)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = child.kill();
            panic!("{script} did not finish in {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A tiny random BERT encoder (2 layers, width 32, 16 positions, 256 byte tokens) and the
/// embedder that serves it as `name`.
pub fn tiny_bert(seed: u64) -> sinter_models::Bert {
    let cfg = sinter_models::BertConfig {
        vocab_size: 256,
        hidden: 32,
        n_layer: 2,
        n_head: 2,
        intermediate: 64,
        max_position: 16,
        type_vocab_size: 2,
        dropout: 0.0,
        attention_dropout: 0.0,
        layer_norm_eps: 1e-12,
        hidden_act: sinter_models::HiddenAct::Gelu,
        pad_token_id: Some(0),
    };
    let bert =
        sinter_models::Bert::encoder_only(cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    bert.set_training(false);
    bert
}

pub fn tiny_embedder(seed: u64, name: &str) -> sinter_serve::Embedder {
    let mut e = sinter_serve::Embedder::new(
        sinter_serve::BertEmbedder::new(tiny_bert(seed)),
        sinter_serve::Tokenizer::Bytes,
        name,
    );
    // Small batches: a request of a few inputs runs in more than one.
    e.max_batch = 2;
    e
}
