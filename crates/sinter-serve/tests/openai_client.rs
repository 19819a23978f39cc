//! The official `openai` Python client (from PyPI) against the real server: completions,
//! chat, both streamed, a bad request raising the client's own error type, embeddings
//! (base64 and float) and a JSON response_format. Skipped, with
//! a note, when Python or the `openai` package is missing, unless SINTER_REQUIRE_OPENAI=1
//! (CI installs it).

use std::time::Duration;

use sinter_serve::{ServeOptions, Server, Tokenizer};

mod common;
use common::{openai_available, python};

#[test]
fn the_official_openai_client_works_against_the_server() {
    if !openai_available() {
        assert!(
            std::env::var("SINTER_REQUIRE_OPENAI").as_deref() != Ok("1"),
            "SINTER_REQUIRE_OPENAI=1 but `{} -c 'import openai'` fails: pip install openai",
            python()
        );
        println!("skipped: the openai Python package is not installed (pip install openai)");
        return;
    }
    let server = Server::start_with(
        common::tiny_gpt(3),
        Tokenizer::Bytes,
        Some(common::tiny_embedder(2, "tiny-embed")),
        ServeOptions {
            port: 0,
            model_name: "tiny".into(),
            api_key: Some("test-key".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let url = format!("http://{}", server.addr());
    // The script's own requests time out after 60 s; never wait much longer than that.
    let (ok, stdout, stderr) = common::run_script(
        "openai_client.py",
        &[&url, "tiny", "test-key", "tiny-embed"],
        Duration::from_secs(120),
    );
    assert!(ok, "{stdout}\n{stderr}");
    assert!(stdout.contains("7 passed, 0 failed"), "{stdout}");
    server.shutdown().unwrap();
}
