//! `TextTokenizer` against Hugging Face: the ids transformers and `tokenizers` give for 1,000
//! lines of mixed text (fixtures written by `bench/llm/tokenizer_ref.py`), round trips,
//! streaming decoding, special tokens, and the errors for bad files and vocabularies.
//!
//! The SmolLM2 and MiniLM tests need the real files (`.ci/fetch-weights`); offline they print
//! why and pass, unless `SINTER_REQUIRE_WEIGHTS=1`. The SmolLM2 vocabulary is read from the GGUF
//! by `bench/llm/gguf_vocab_dump.py` (PyPI `gguf` + `numpy`) run with `$SINTER_PYTHON` or
//! `python3`, cached under the target directory.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Instant;

use serde::Deserialize;
use sinter_data::tokenizer::{GgufVocab, TextTokenizer};
use sinter_data::DataError;

#[path = "../../../tests/support/real_weights.rs"]
mod real_weights;
use real_weights::{repo_root, weights_dir};

const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Deserialize)]
struct Cases {
    texts: Vec<String>,
    smollm2: Vec<Vec<u32>>,
    smollm2_transformers_raw: std::collections::BTreeMap<String, Vec<u32>>,
    smollm2_special: Vec<Vec<u32>>,
    minilm: Vec<Vec<u32>>,
    other_pre: std::collections::BTreeMap<String, Vec<Vec<u32>>>,
    spm: SpmCase,
    spm_flat: SpmCase,
}

#[derive(Deserialize)]
struct SpmCase {
    vocab: GgufVocab,
    texts: Vec<String>,
    ids: Vec<Vec<u32>>,
}

fn cases() -> &'static Cases {
    static CASES: OnceLock<Cases> = OnceLock::new();
    CASES.get_or_init(|| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/cases.json");
        serde_json::from_slice(&std::fs::read(&path).expect("read cases.json"))
            .expect("parse cases.json")
    })
}

/// SmolLM2's GGUF vocabulary, dumped to JSON once and cached under the target directory.
fn smollm2_vocab() -> Option<GgufVocab> {
    let dir = weights_dir("smollm2")?;
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("smollm2-gguf-vocab.json");
    if !cache.exists() {
        let python = std::env::var("SINTER_PYTHON").unwrap_or_else(|_| "python3".to_string());
        let out = Command::new(&python)
            .arg(repo_root().join("bench/llm/gguf_vocab_dump.py"))
            .arg(dir.join(GGUF_NAME))
            .arg(&cache)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
        assert!(
            out.status.success(),
            "gguf_vocab_dump.py failed (needs the PyPI packages gguf and numpy for {python}; \
             set SINTER_PYTHON to a Python that has them): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(
        serde_json::from_slice(&std::fs::read(&cache).unwrap()).expect("parse the vocabulary dump"),
    )
}

fn smollm2() -> Option<&'static TextTokenizer> {
    static TOK: OnceLock<Option<TextTokenizer>> = OnceLock::new();
    TOK.get_or_init(|| {
        let vocab = smollm2_vocab()?;
        let start = Instant::now();
        let tok = TextTokenizer::from_gguf_vocab(&vocab).expect("build SmolLM2's tokenizer");
        eprintln!(
            "built SmolLM2's tokenizer from its GGUF vocabulary in {:?}",
            start.elapsed()
        );
        Some(tok)
    })
    .as_ref()
}

fn minilm() -> Option<TextTokenizer> {
    let dir = weights_dir("minilm")?;
    Some(
        TextTokenizer::from_file(dir.join("tokenizer.json")).expect("load MiniLM's tokenizer.json"),
    )
}

/// Asserts `got[i] == want[i]` on every line, listing the first lines that differ.
fn assert_all_lines_equal(what: &str, texts: &[String], got: &[Vec<u32>], want: &[Vec<u32>]) {
    assert_eq!(got.len(), want.len());
    let bad: Vec<String> = (0..want.len())
        .filter(|&i| got[i] != want[i])
        .take(5)
        .map(|i| {
            format!(
                "line {i} {:?}:\n  ours   {:?}\n  theirs {:?}",
                texts[i], got[i], want[i]
            )
        })
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: ids differ on lines:\n{}",
        bad.join("\n")
    );
}

#[test]
fn smollm2_gguf_ids_match_transformers_on_every_line() {
    let Some(tok) = smollm2() else { return };
    let c = cases();
    let start = Instant::now();
    let ids: Vec<Vec<u32>> = c
        .texts
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    let bytes: usize = c.texts.iter().map(String::len).sum();
    eprintln!(
        "encoded {} lines ({bytes} bytes) in {:?}",
        c.texts.len(),
        start.elapsed()
    );
    assert_all_lines_equal("SmolLM2 (GGUF)", &c.texts, &ids, &c.smollm2);

    // BOS is not added (tokenizer.ggml.add_bos_token = false), as transformers does not.
    let with_special: Vec<Vec<u32>> = c.texts[..50]
        .iter()
        .map(|t| tok.encode(t, true).unwrap())
        .collect();
    assert_all_lines_equal(
        "SmolLM2 (GGUF), special",
        &c.texts,
        &with_special,
        &c.smollm2_special,
    );

    // transformers' own conversion skips the "smollm" digit split; it differs from ours (and
    // from llama.cpp's) only on lines with numerals, and there ours is the split one.
    assert!(!c.smollm2_transformers_raw.is_empty());
    for (line, raw) in &c.smollm2_transformers_raw {
        let i: usize = line.parse().unwrap();
        assert!(
            c.texts[i].chars().any(char::is_numeric),
            "line {i} {:?} differs from transformers without a numeral",
            c.texts[i]
        );
        assert_ne!(&ids[i], raw);
    }
}

#[test]
fn other_pre_tokenizer_names_split_like_transformers() {
    // SmolLM2's vocabulary under other names: the regular expressions of "llama-bpe", "qwen2"
    // and "gpt2" (run by fancy-regex here, Oniguruma in Python) cut text the same way.
    let Some(vocab) = smollm2_vocab() else { return };
    let c = cases();
    assert_eq!(c.other_pre.len(), 3);
    for (pre, want) in &c.other_pre {
        let renamed = GgufVocab {
            pre: Some(pre.clone()),
            ..vocab.clone()
        };
        let tok = TextTokenizer::from_gguf_vocab(&renamed).unwrap();
        let texts = &c.texts[..want.len()];
        let ids: Vec<Vec<u32>> = texts
            .iter()
            .map(|t| tok.encode(t, false).unwrap())
            .collect();
        assert_all_lines_equal(&format!("pre-tokenizer {pre}"), texts, &ids, want);
    }
}

#[test]
fn smollm2_round_trips_and_streams() {
    let Some(tok) = smollm2() else { return };
    for text in &cases().texts {
        let ids = tok.encode(text, false).unwrap();
        let full = tok.decode(&ids, false).unwrap();
        assert_eq!(&full, text, "decode(encode(x)) != x");
        let mut stream = tok.decode_stream(false);
        let mut streamed = String::new();
        for &id in &ids {
            if let Some(piece) = stream.step(id).unwrap() {
                streamed.push_str(&piece);
            }
        }
        assert_eq!(streamed, full, "streamed decode of {text:?}");
    }
}

#[test]
fn smollm2_stream_holds_back_incomplete_characters() {
    let Some(tok) = smollm2() else { return };
    // An emoji spread over several byte tokens comes out whole, once, at its last byte.
    let ids = tok.encode("a🦀", false).unwrap();
    assert!(
        ids.len() >= 3,
        "expected the crab to take several byte tokens: {ids:?}"
    );
    let mut stream = tok.decode_stream(false);
    let pieces: Vec<Option<String>> = ids.iter().map(|&id| stream.step(id).unwrap()).collect();
    assert_eq!(pieces[0].as_deref(), Some("a"));
    assert!(
        pieces[1..ids.len() - 1].iter().all(Option::is_none),
        "{pieces:?}"
    );
    assert_eq!(pieces.last().unwrap().as_deref(), Some("🦀"));
}

#[test]
fn smollm2_special_tokens_and_stop_ids() {
    let Some(tok) = smollm2() else { return };
    assert_eq!(tok.vocab_size(), 49152);
    assert_eq!(tok.bos_id(), Some(1));
    assert_eq!(tok.eos_id(), Some(2));
    assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
    assert_eq!(tok.id_to_token(1).as_deref(), Some("<|im_start|>"));
    // <|endoftext|> (0) and <|im_end|> (2, eos) both end a generation.
    assert_eq!(tok.stop_ids(), &[0, 2]);

    let ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tok.decode(&ids, true).unwrap(), "user\nHi");
    assert_eq!(
        tok.decode(&ids, false).unwrap(),
        "<|im_start|>user\nHi<|im_end|>"
    );

    let err = tok.decode(&[1, 49152], false).unwrap_err().to_string();
    assert!(err.contains("49152") && err.contains("position 1"), "{err}");
    let err = tok
        .decode_stream(false)
        .step(70000)
        .unwrap_err()
        .to_string();
    assert!(err.contains("70000") && err.contains("position 0"), "{err}");
}

#[test]
fn smollm2_chat_template_comes_from_the_gguf() {
    let Some(tok) = smollm2() else { return };
    let template = tok
        .chat_template()
        .unwrap()
        .expect("SmolLM2 has a chat template");
    let messages = [sinter_data::ChatMessage::new("user", "Hi")];
    assert_eq!(
        template.render(&messages, true).unwrap(),
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging \
         Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn minilm_ids_match_tokenizers_on_every_line() {
    let Some(tok) = minilm() else { return };
    let c = cases();
    let ids: Vec<Vec<u32>> = c
        .texts
        .iter()
        .map(|t| tok.encode(t, true).unwrap())
        .collect();
    assert_all_lines_equal("MiniLM (tokenizer.json)", &c.texts, &ids, &c.minilm);
    assert_eq!(tok.vocab_size(), 30522);
    assert_eq!((tok.bos_id(), tok.eos_id()), (None, None));
    // No fixed-length padding or truncation from the file: exactly the text's tokens.
    assert_eq!(
        tok.encode("hello world", true).unwrap(),
        vec![101, 7592, 2088, 102]
    );
    assert_eq!(
        tok.decode(&[101, 7592, 2088, 102], true).unwrap(),
        "hello world"
    );
}

#[test]
fn tokenizer_config_sets_bos_eos_and_chat_template() {
    let Some(dir) = weights_dir("minilm") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir.join("tokenizer.json"),
        tmp.path().join("tokenizer.json"),
    )
    .unwrap();
    let config = serde_json::json!({
        "bos_token": {"content": "[CLS]"},
        "eos_token": "[SEP]",
        "add_bos_token": true,
        "add_eos_token": false,
        "chat_template": [
            {"name": "tool_use", "template": "unused"},
            {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"}
        ]
    });
    std::fs::write(tmp.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let tok = TextTokenizer::from_file(tmp.path().join("tokenizer.json")).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(101), Some(102)));
    assert_eq!(tok.stop_ids(), &[102]);
    // add_bos_token without add_eos_token: [CLS] before, no [SEP] after.
    assert_eq!(
        tok.encode("hello world", true).unwrap(),
        vec![101, 7592, 2088]
    );
    let template = tok.chat_template().unwrap().unwrap();
    let text = template
        .render(&[sinter_data::ChatMessage::new("user", "x")], false)
        .unwrap();
    assert_eq!(text, "[CLS]x[SEP]");
}

#[test]
fn sentencepiece_merge_ties_rank_like_transformers() {
    // Every piece at one score: only the tie-breaks order the merges.
    let spm = &cases().spm_flat;
    let tok = TextTokenizer::from_gguf_vocab(&spm.vocab).unwrap();
    let ids: Vec<Vec<u32>> = spm
        .texts
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    assert_all_lines_equal("SentencePiece, tied scores", &spm.texts, &ids, &spm.ids);
}

#[test]
fn sentencepiece_gguf_vocab_matches_transformers() {
    let spm = &cases().spm;
    let tok = TextTokenizer::from_gguf_vocab(&spm.vocab).unwrap();
    let ids: Vec<Vec<u32>> = spm
        .texts
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    assert_all_lines_equal("SentencePiece (GGUF)", &spm.texts, &ids, &spm.ids);
    // add_bos_token is absent: a SentencePiece vocabulary adds BOS.
    assert_eq!(tok.encode("hello", true).unwrap()[0], 1);
    for (text, ids) in spm.texts.iter().zip(&ids) {
        let full = tok.decode(ids, false).unwrap();
        let mut stream = tok.decode_stream(false);
        let streamed: String = ids
            .iter()
            .filter_map(|&id| stream.step(id).unwrap())
            .collect();
        assert_eq!(streamed, full, "streamed decode of {text:?}");
    }
    // Byte fallback and the leading-space strip give the text back.
    for text in ["hello world", "é ü 😀", "the  theory"] {
        assert_eq!(
            tok.decode(&tok.encode(text, false).unwrap(), false)
                .unwrap(),
            text
        );
    }
}

#[test]
fn sentencepiece_merges_from_the_file_win_over_scores() {
    let tokens = ["<unk>", "<s>", "</s>", "▁", "h", "i", "▁h", "▁hi", "hi"];
    let vocab = GgufVocab {
        model: "llama".into(),
        tokens: tokens.map(String::from).to_vec(),
        // The scores imply "h i", then "▁ hi" → "▁hi"; the file's one merge stops at "hi".
        scores: vec![0.0, 0.0, 0.0, -9.0, -9.0, -9.0, -5.0, -4.0, 0.0],
        merges: vec!["h i".into()],
        bos_token_id: Some(1),
        add_bos_token: Some(false),
        ..GgufVocab::default()
    };
    let tok = TextTokenizer::from_gguf_vocab(&vocab).unwrap();
    assert_eq!(tok.encode("hi", true).unwrap(), vec![3, 8]);
    let by_scores = TextTokenizer::from_gguf_vocab(&GgufVocab {
        merges: vec![],
        ..vocab
    })
    .unwrap();
    assert_eq!(by_scores.encode("hi", false).unwrap(), vec![7]);
}

fn tokenizer_error(vocab: &GgufVocab) -> String {
    let err = TextTokenizer::from_gguf_vocab(vocab).unwrap_err();
    assert!(matches!(err, DataError::Tokenizer { .. }), "{err:?}");
    err.to_string()
}

#[test]
fn bad_gguf_vocabularies_are_refused_by_name() {
    let spm = &cases().spm.vocab;
    let byte_level = GgufVocab {
        model: "gpt2".into(),
        pre: Some("smollm".into()),
        tokens: ["a", "b", "ab"].map(String::from).to_vec(),
        merges: vec!["a b".into()],
        ..GgufVocab::default()
    };
    assert!(TextTokenizer::from_gguf_vocab(&byte_level).is_ok());

    let err = tokenizer_error(&GgufVocab {
        pre: Some("klingon-bpe".into()),
        ..byte_level.clone()
    });
    assert!(
        err.contains("unknown pre-tokenizer \"klingon-bpe\""),
        "{err}"
    );
    assert!(
        err.contains("smollm") && err.contains("llama-bpe") && err.contains("qwen2"),
        "{err}"
    );

    let err = tokenizer_error(&GgufVocab {
        model: "bert".into(),
        ..byte_level.clone()
    });
    assert!(
        err.contains("\"bert\" is not supported") && err.contains("gpt2"),
        "{err}"
    );

    let err = tokenizer_error(&GgufVocab {
        merges: vec!["a c".into()],
        ..byte_level.clone()
    });
    assert!(
        err.contains("merges[0]") && err.contains("\"a c\""),
        "{err}"
    );

    let err = tokenizer_error(&GgufVocab {
        merges: vec![],
        ..byte_level.clone()
    });
    assert!(err.contains("merges is empty"), "{err}");

    let err = tokenizer_error(&GgufVocab {
        tokens: vec![],
        ..byte_level.clone()
    });
    assert!(err.contains("tokens is empty"), "{err}");

    let err = tokenizer_error(&GgufVocab {
        eos_token_id: Some(3),
        ..byte_level.clone()
    });
    assert!(
        err.contains("eos_token_id is 3") && err.contains("3 tokens"),
        "{err}"
    );

    let err = tokenizer_error(&GgufVocab {
        token_type: vec![1],
        ..byte_level.clone()
    });
    assert!(
        err.contains("token_type has 1 entries for 3 tokens"),
        "{err}"
    );

    let mut nan = spm.clone();
    nan.scores[300] = f32::NAN;
    let err = tokenizer_error(&nan);
    assert!(err.contains("scores[300]") && err.contains("NaN"), "{err}");

    let err = tokenizer_error(&GgufVocab {
        scores: vec![],
        ..spm.clone()
    });
    assert!(err.contains("scores is empty"), "{err}");

    let err = tokenizer_error(&GgufVocab {
        add_bos_token: Some(true),
        ..byte_level.clone()
    });
    assert!(
        err.contains("add_bos_token is set but tokenizer.ggml.bos_token_id is missing"),
        "{err}"
    );
}

#[test]
fn bad_tokenizer_files_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope/tokenizer.json");
    let err = TextTokenizer::from_file(&missing).unwrap_err();
    assert!(matches!(err, DataError::NotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("nope/tokenizer.json"), "{err}");

    let corrupt = tmp.path().join("tokenizer.json");
    std::fs::write(&corrupt, "{\"version\": \"1.0\", \"model\": ").unwrap();
    let err = TextTokenizer::from_file(&corrupt).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Malformed {
                format: "tokenizer.json",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("re-download"), "{err}");

    std::fs::write(&corrupt, "[1, 2, 3]").unwrap();
    assert!(TextTokenizer::from_file(&corrupt).is_err());

    // A real tokenizer.json cut in half, then a good one beside a corrupt tokenizer_config.json.
    let Some(dir) = weights_dir("minilm") else {
        return;
    };
    let good = std::fs::read(dir.join("tokenizer.json")).unwrap();
    std::fs::write(&corrupt, &good[..good.len() / 2]).unwrap();
    let err = TextTokenizer::from_file(&corrupt).unwrap_err();
    assert!(matches!(err, DataError::Malformed { .. }), "{err:?}");
    std::fs::write(&corrupt, &good).unwrap();
    std::fs::write(tmp.path().join("tokenizer_config.json"), "{\"bos_token\": ").unwrap();
    let err = TextTokenizer::from_file(&corrupt).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Malformed {
                format: "tokenizer_config.json",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}
