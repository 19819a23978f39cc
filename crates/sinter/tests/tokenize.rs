//! `sinter tokenize text:PATH --out DIR` end to end: the token files, their split and
//! content, that `sinter train --data tokens:DIR` trains on them, and the errors.

mod common;

use std::path::Path;

use common::*;
use sinter_data::{read_tokens, Gpt2Tokenizer};

fn text() -> String {
    let lines = [
        "It was the best of times, it was the worst of times,",
        "it was the age of wisdom, it was the age of foolishness,",
        "  it was the epoch of belief; it was the epoch of incredulity —",
        "\tnaïve café, 日本語, and 3.14159 apples.",
        "",
    ];
    (0..400)
        .map(|i| format!("{} {i}\n", lines[i % lines.len()]))
        .collect()
}

#[test]
fn tokenize_writes_a_90_10_split_that_trains() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("story.txt");
    let text = text();
    std::fs::write(&input, &text).unwrap();
    let out = dir.path().join("tok");
    let o = sinter(&[
        "tokenize",
        &format!("text:{}", input.display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("tokenizing story")
            && err.contains("story_train.bin")
            && err.contains("story_val.bin"),
        "{err}"
    );

    let train = read_tokens(out.join("story_train.bin")).unwrap();
    let val = read_tokens(out.join("story_val.bin")).unwrap();
    let tok = Gpt2Tokenizer::new();
    let mut expect = vec![Gpt2Tokenizer::EOT];
    expect.extend(tok.encode(&text));
    let all: Vec<u16> = train.iter().chain(&val).copied().collect();
    assert_eq!(all, expect);
    let n = all.len() as f64;
    assert!(
        (val.len() as f64 - 0.1 * n).abs() <= 1.0,
        "{} of {n}",
        val.len()
    );
    assert_eq!(tok.decode(&all[1..]), text);
    // No temporary files left behind.
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["story_train.bin", "story_val.bin"]);

    // gpt-tiny trains on it (its vocabulary grows to GPT-2's 50,257).
    let run = dir.path().join("run");
    let o = sinter(&[
        "train",
        "--model",
        "gpt-tiny",
        "--data",
        &format!("tokens:{}", out.display()),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--context",
        "16",
        "--eval-batches",
        "2",
        "--device",
        "cpu",
        "--out",
        run.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let summary: String = std::fs::read_to_string(run.join("summary.json")).unwrap();
    assert!(
        summary.contains("\"steps\": 2") && summary.contains("val_loss"),
        "{summary}"
    );
}

#[test]
fn tokenize_names_and_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("interval.txt");
    std::fs::write(&input, "Hello world\nagain and again\n").unwrap();
    let out = dir.path().join("o");
    let spec = format!("text:{}", input.display());
    // 'interval' contains 'val': refused, with the way out.
    let o = sinter(&["tokenize", &spec, "--out", out.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--name"), "{}", stderr(&o));
    let o = sinter(&[
        "tokenize",
        &spec,
        "--out",
        out.to_str().unwrap(),
        "--name",
        "hello",
        "--quiet",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).is_empty(), "{}", stderr(&o));
    let train = read_tokens(out.join("hello_train.bin")).unwrap();
    let val = read_tokens(out.join("hello_val.bin")).unwrap();
    assert_eq!(train[..3], [Gpt2Tokenizer::EOT, 15496, 995]);
    assert_eq!(val.len(), 1);
}

#[test]
fn tokenize_reports_bad_input() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    let o = sinter(&["tokenize", "shakespeare", "--out", out.to_str().unwrap()]);
    assert!(
        !o.status.success() && stderr(&o).contains("text:PATH"),
        "{}",
        stderr(&o)
    );
    let missing = dir.path().join("missing.txt");
    let o = sinter(&[
        "tokenize",
        &format!("text:{}", missing.display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("missing.txt"),
        "{}",
        stderr(&o)
    );
    let binary = dir.path().join("bin.txt");
    std::fs::write(&binary, [b'a', 0xff, 0xfe, b'b']).unwrap();
    let o = sinter(&[
        "tokenize",
        &format!("text:{}", binary.display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("UTF-8") && stderr(&o).contains("offset 1"),
        "{}",
        stderr(&o)
    );
    let tiny = dir.path().join("tiny.txt");
    std::fs::write(&tiny, "a").unwrap();
    let o = sinter(&[
        "tokenize",
        &format!("text:{}", tiny.display()),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(
        !o.status.success() && stderr(&o).contains("tokens"),
        "{}",
        stderr(&o)
    );
    assert!(!Path::new(&out).join("tiny_train.bin").exists());
}
