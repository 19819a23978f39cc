//! A pretrained Llama-family model served with its own tokenizer and chat template: a tiny
//! random Llama in Hugging Face layout (written here with `save_hf_llama`) and a hand-made
//! SentencePiece-style tokenizer (byte fallback, ChatML special tokens, a chat template).
//! The chat prompt's ids are exactly the template's rendering, greedy answers are `Decoder`'s
//! greedy tokens decoded, streamed text equals the whole response, the tokenizer's stop tokens
//! end a completion with "stop", and bad requests are 4xx while the server keeps serving.

use std::path::Path;

use serde_json::{json, Value};
use sinter_core::Rng;
use sinter_data::{ChatMessage, TextTokenizer};
use sinter_models::decoder::{ContextPolicy, GenerateOptions, SamplingParams};
use sinter_models::hf_llama::save_hf_llama;
use sinter_models::{
    load_pretrained, load_pretrained_with_tokenizer, Decoder, DecoderArch, DecoderConfig,
};
use sinter_nn::module::shared_rng;
use sinter_nn::Module;
use sinter_serve::text::TokenText;
use sinter_serve::{DecoderModel, ServeOptions, Server, Tokenizer};

const CONTEXT: usize = 128;
/// Rows of the model's embedding: more than the tokenizer's ids (as real models pad theirs),
/// so that the model may pick ids with no text.
const MODEL_VOCAB: usize = 352;
const SPECIALS: [&str; 5] = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"];
const CHATML: &str = "{% if messages[0].role == 'assistant' %}{{ raise_exception('the conversation must begin with a user or system message') }}{% endif %}\
{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A SentencePiece-style BPE `tokenizer.json`: the special tokens, the 256 byte-fallback
/// tokens `<0x00>`…`<0xFF>`, "▁", ASCII letters, digits and some punctuation, and a few
/// merges; decoding turns "▁" into spaces, fuses bytes and drops the text's first space.
fn tokenizer_json() -> Value {
    let mut vocab = serde_json::Map::new();
    let mut add = |t: String| {
        let id = vocab.len();
        vocab.insert(t, json!(id));
    };
    SPECIALS.iter().for_each(|s| add(s.to_string()));
    (0..256).for_each(|b| add(format!("<0x{b:02X}>")));
    "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:?!'\n"
        .chars()
        .for_each(|c| add(c.to_string()));
    let merges = [
        ("▁", "t"),
        ("h", "e"),
        ("▁t", "he"),
        ("i", "s"),
        ("▁", "P"),
        ("a", "r"),
    ];
    merges.iter().for_each(|(a, b)| add(format!("{a}{b}")));
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(id, s)| {
            json!({"id": id, "content": s, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"},
        ]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null,
            "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab,
            "merges": merges.iter().map(|(a, b)| format!("{a} {b}")).collect::<Vec<_>>(),
        },
    })
}

/// `tokenizer_config.json`: BOS added to texts, `eos` as the end-of-sequence token, and the
/// chat template when given.
fn write_config(dir: &Path, eos: &str, template: Option<&str>) {
    let mut c = json!({"bos_token": "<s>", "eos_token": eos, "add_bos_token": true});
    if let Some(t) = template {
        c["chat_template"] = json!(t);
    }
    std::fs::write(dir.join("tokenizer_config.json"), c.to_string()).unwrap();
}

/// A tiny random Llama (grouped-query attention, SwiGLU, rotary) with the tokenizer above,
/// in `dir`.
fn write_model(dir: &Path, template: Option<&str>) {
    let cfg = DecoderConfig {
        n_layer: 2,
        n_head: 4,
        n_embd: 32,
        block_size: CONTEXT,
        vocab_size: MODEL_VOCAB,
        dropout: 0.0,
        arch: DecoderArch {
            n_kv_head: Some(2),
            mlp_hidden: Some(64),
            ..DecoderArch::llama(10_000.0)
        },
    };
    let gpt = Decoder::new(cfg, &mut Rng::new(7), &shared_rng(7)).unwrap();
    save_hf_llama(&gpt, dir).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json().to_string()).unwrap();
    write_config(dir, "</s>", template);
}

fn tokenizer(dir: &Path) -> TextTokenizer {
    TextTokenizer::from_file(dir.join("tokenizer.json")).unwrap()
}

/// `Decoder`'s own greedy continuation of `prompt` (no stop tokens).
fn gpt_greedy(dir: &Path, prompt: &[i64], n: usize) -> Vec<i64> {
    let gpt = load_pretrained(dir).unwrap();
    gpt.set_training(false);
    let o = GenerateOptions {
        max_new: n,
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        context: CONTEXT,
        policy: ContextPolicy::Shift,
        use_cache: true,
    };
    let all = gpt
        .generate_streaming(prompt, &o, &mut Rng::new(0), |_| true)
        .unwrap();
    all[prompt.len()..].to_vec()
}

/// The text of generated ids as a whole decode gives it (ids the tokenizer lacks have none).
fn decode(tok: &TextTokenizer, ids: &[i64]) -> String {
    let known: Vec<u32> = ids
        .iter()
        .filter(|&&i| (i as usize) < tok.vocab_size())
        .map(|&i| i as u32)
        .collect();
    tok.decode(&known, true).unwrap()
}

/// Serves the model in `dir` (the CLI's `serve --model DIR`, in process) as `name`.
fn serve(dir: &Path, name: &str) -> (Server, String) {
    let p = load_pretrained_with_tokenizer(dir).unwrap();
    p.model.set_training(false);
    let model = DecoderModel::new(p.model, CONTEXT).unwrap();
    let o = ServeOptions {
        port: 0,
        model_name: name.into(),
        max_batch: 2,
        ..Default::default()
    };
    let server = Server::start(model, Tokenizer::text(p.tokenizer, p.chat_template), o).unwrap();
    let url = format!("http://{}", server.addr());
    (server, url)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

async fn post(url: &str, path: &str, body: &Value) -> (u16, String) {
    let r = client()
        .post(format!("{url}{path}"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post_ok(url: &str, path: &str, body: &Value) -> Value {
    let (status, text) = post(url, path, body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// A streamed chat response: its text deltas and its last finish_reason.
async fn chat_stream(url: &str, body: &Value) -> (Vec<String>, String) {
    let mut body = body.clone();
    body["stream"] = json!(true);
    let (status, text) = post(url, "/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{text}");
    let mut deltas = Vec::new();
    let mut finish = String::new();
    for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"].as_str().filter(|t| !t.is_empty()) {
            deltas.push(t.to_string());
        }
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (deltas, finish)
}

fn messages() -> Value {
    json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Où est Paris? 20 €"},
    ])
}

#[test]
fn streamed_text_is_the_decode_with_byte_fallback_characters_whole() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), Some(CHATML));
    let tok = tokenizer(dir.path());
    let id = |t: &str| i64::from(tok.token_to_id(t).unwrap());
    // "the", "▁" and "€" in byte-fallback bytes E2 82 AC (no text until the last), "▁Paris",
    // "<|im_start|>" (special: no text), an id past the tokenizer (none), "!"
    let ids = [
        id("t"),
        id("he"),
        id("▁"),
        id("<0xE2>"),
        id("<0x82>"),
        id("<0xAC>"),
        id("▁P"),
        id("ar"),
        id("is"),
        id("<|im_start|>"),
        MODEL_VOCAB as i64 - 1,
        id("!"),
    ];
    let serve_tok = Tokenizer::text(tokenizer(dir.path()), None);
    let mut t = TokenText::default();
    let pieces: Vec<String> = ids.iter().map(|&i| t.push(&serve_tok, i)).collect();
    assert_eq!(
        pieces,
        ["t", "he", " ", "", "", "€", " P", "ar", "is", "", "", "!"]
    );
    assert_eq!(pieces.concat(), decode(&tok, &ids));
    assert_eq!(t.finish(&serve_tok), "");
    // An unfinished character at the end comes out as U+FFFD, as a whole decode has it.
    let mut t = TokenText::default();
    assert_eq!(t.push(&serve_tok, id("<0xE2>")), "");
    assert_eq!(t.finish(&serve_tok), "\u{FFFD}");
    // The stop tokens: end of sequence and the end-of-turn special token.
    assert!(serve_tok.is_stop(id("</s>")) && serve_tok.is_stop(id("<|im_end|>")));
    assert!(!serve_tok.is_stop(id("<|im_start|>")) && !serve_tok.is_stop(id("!")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_prompts_are_the_templates_and_answers_are_gpt_greedy() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), Some(CHATML));
    let tok = tokenizer(dir.path());
    let template = tok.chat_template().unwrap().unwrap();
    let rendered = template
        .render(
            &[
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", "Où est Paris? 20 €"),
            ],
            true,
        )
        .unwrap();
    assert!(
        rendered.ends_with("<|im_start|>assistant\n"),
        "{rendered:?}"
    );
    let prompt: Vec<i64> = tok
        .encode(&rendered, false)
        .unwrap()
        .into_iter()
        .map(i64::from)
        .collect();
    let greedy = gpt_greedy(dir.path(), &prompt, 24);
    // The end-of-sequence token becomes the one the model picks at step k (the first new
    // token from the fourth on), so that the answer must stop there.
    let known = |i: i64| (SPECIALS.len() as i64..tok.vocab_size() as i64).contains(&i);
    let k = (3..greedy.len())
        .find(|&k| known(greedy[k]) && !greedy[..k].contains(&greedy[k]))
        .unwrap_or_else(|| panic!("no fresh token in {greedy:?}"));
    let eos = tok.id_to_token(greedy[k] as u32).unwrap();
    write_config(dir.path(), &eos, Some(CHATML));

    let name = dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let (server, url) = serve(dir.path(), &name);
    let body = json!({"model": name, "messages": messages(), "max_tokens": 20, "temperature": 0});
    let v = post_ok(&url, "/v1/chat/completions", &body).await;
    assert_eq!(v["model"], json!(name));
    assert_eq!(v["usage"]["prompt_tokens"], json!(prompt.len()));
    assert_eq!(v["usage"]["completion_tokens"], json!(k + 1));
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    let answer = choice["message"]["content"].as_str().unwrap();
    assert_eq!(answer, decode(&tok, &greedy[..k]));

    let (deltas, finish) = chat_stream(&url, &body).await;
    assert_eq!(
        (deltas.concat().as_str(), finish.as_str()),
        (answer, "stop")
    );

    // Cut by max_tokens before the stop token: "length", the first tokens' text.
    let short = json!({"model": name, "messages": messages(), "max_tokens": 2, "temperature": 0});
    let v = post_ok(&url, "/v1/chat/completions", &short).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(
        v["choices"][0]["message"]["content"],
        json!(decode(&tok, &greedy[..2]))
    );
    let (deltas, finish) = chat_stream(&url, &short).await;
    assert_eq!(
        (deltas.concat(), finish.as_str()),
        (decode(&tok, &greedy[..2]), "length")
    );

    // The same ids through /v1/completions answer the same; a text prompt gets BOS first.
    let v = post_ok(
        &url,
        "/v1/completions",
        &json!({"model": name, "prompt": prompt, "max_tokens": 20, "temperature": 0}),
    )
    .await;
    assert_eq!(v["choices"][0]["text"], json!(answer));
    let v = post_ok(
        &url,
        "/v1/completions",
        &json!({"model": name, "prompt": "the", "max_tokens": 1}),
    )
    .await;
    assert_eq!(
        v["usage"]["prompt_tokens"],
        json!(tok.encode("the", true).unwrap().len())
    );
    assert_eq!(tok.encode("the", true).unwrap()[0], 1, "BOS first");

    let models = client()
        .get(format!("{url}/v1/models"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let models: Value = serde_json::from_str(&models).unwrap();
    assert_eq!(models["data"][0]["id"], json!(name));
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_chat_requests_are_clear_4xx_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), Some(CHATML));
    let (server, url) = serve(dir.path(), "tiny-llama");
    let chat =
        |messages: Value| json!({"model": "tiny-llama", "messages": messages, "max_tokens": 2});
    let long = "word ".repeat(CONTEXT);
    for (messages, status, says) in [
        (
            json!([{"role": "tool", "content": "x"}]),
            400,
            "role 'tool' is not supported",
        ),
        (
            json!([{"role": "robot", "content": "x"}]),
            400,
            "role 'robot'",
        ),
        (
            json!([{"role": "user", "content": 5}]),
            400,
            "content is a string",
        ),
        (
            json!([{"role": "user", "content": {"text": "x"}}]),
            400,
            "content is a string",
        ),
        (
            json!([{"role": "assistant", "content": "Hi"}]),
            400,
            "the conversation must begin with a user or system message",
        ),
        (
            json!([{"role": "user", "content": long}]),
            400,
            "maximum context length is 128 tokens",
        ),
    ] {
        let (got, text) = post(&url, "/v1/chat/completions", &chat(messages.clone())).await;
        assert_eq!(got, status, "{messages}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(says), "{messages}: {msg}");
    }
    let v = post_ok(&url, "/v1/chat/completions", &chat(messages())).await;
    assert_eq!(v["usage"]["completion_tokens"], 2);
    server.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_a_chat_template_refuses_chat_by_name() {
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), None);
    let (server, url) = serve(dir.path(), "plain");
    let (status, text) = post(
        &url,
        "/v1/chat/completions",
        &json!({"model": "plain", "messages": messages()}),
    )
    .await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("no chat template"), "{text}");
    assert!(text.contains("/v1/completions"), "{text}");
    // Completions still work (3 tokens, or fewer ended by a stop token).
    let v = post_ok(
        &url,
        "/v1/completions",
        &json!({"model": "plain", "prompt": "the", "max_tokens": 3, "temperature": 0}),
    )
    .await;
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
    assert!(
        (n, finish) == (3, "length") || (n <= 3 && finish == "stop"),
        "{v}"
    );
    server.shutdown().unwrap();
}
