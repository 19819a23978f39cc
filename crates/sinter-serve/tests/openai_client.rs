//! The official `openai` Python client (from PyPI) against the real server: completions,
//! chat, both streamed, and a bad request raising the client's own error type. Skipped, with
//! a note, when Python or the `openai` package is missing, unless SINTER_REQUIRE_OPENAI=1
//! (CI installs it).

use std::process::Command;
use std::time::{Duration, Instant};

use sinter_serve::{ServeOptions, Server, Tokenizer};

mod common;

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".into())
}

fn openai_available() -> bool {
    Command::new(python())
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success())
}

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
    let server = Server::start(
        common::tiny_gpt(3),
        Tokenizer::Bytes,
        ServeOptions {
            port: 0,
            model_name: "tiny".into(),
            api_key: Some("test-key".into()),
            ..Default::default()
        },
    )
    .unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/openai_client.py");
    let mut child = Command::new(python())
        .args([
            script,
            &format!("http://{}", server.addr()),
            "tiny",
            "test-key",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The script's own requests time out after 60 s; never wait much longer than that.
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("the openai client script did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("5 passed, 0 failed"), "{stdout}");
    server.shutdown().unwrap();
}
