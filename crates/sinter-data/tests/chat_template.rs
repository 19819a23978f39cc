//! Chat templates rendered by `ChatTemplate` against transformers' `apply_chat_template`
//! (fixture written by `bench/llm/tokenizer_ref.py`): SmolLM2's template and one using Python
//! string methods, loop controls, `namespace`, `tojson` and `raise_exception`, byte for byte;
//! and the errors for broken templates.

use serde::Deserialize;
use sinter_data::tokenizer::{ChatMessage, ChatTemplate};
use sinter_data::DataError;

#[derive(Deserialize)]
struct Fixture {
    bos_token: String,
    eos_token: String,
    smollm2_template: String,
    rich_template: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    template: String,
    messages: Vec<Message>,
    add_generation_prompt: bool,
    text: String,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn fixture() -> Fixture {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/chat.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn renders_byte_for_byte_like_transformers() {
    let f = fixture();
    let template = |source: &str, name: &str| {
        ChatTemplate::new(
            source,
            name,
            Some(f.bos_token.clone()),
            Some(f.eos_token.clone()),
        )
        .unwrap()
    };
    let smollm2 = template(&f.smollm2_template, "smollm2");
    let rich = template(&f.rich_template, "rich");
    assert_eq!(f.cases.len(), 16);
    for case in &f.cases {
        let messages: Vec<ChatMessage> = case
            .messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        let t = if case.template == "smollm2" {
            &smollm2
        } else {
            &rich
        };
        let text = t.render(&messages, case.add_generation_prompt).unwrap();
        assert_eq!(
            text, case.text,
            "template {} with add_generation_prompt={} on {:?}",
            case.template, case.add_generation_prompt, messages
        );
    }
}

fn chat_error(result: Result<impl std::fmt::Debug, DataError>) -> String {
    let err = result.unwrap_err();
    assert!(matches!(err, DataError::ChatTemplate { .. }), "{err:?}");
    err.to_string()
}

#[test]
fn syntax_errors_name_the_template_and_line() {
    let err = chat_error(ChatTemplate::new(
        "{% for m in messages %}\n{{ m.content }\n{% endfor %}",
        "broken.jinja",
        None,
        None,
    ));
    assert!(
        err.contains("broken.jinja") && err.contains("does not parse"),
        "{err}"
    );
    assert!(err.contains(":2"), "line number missing: {err}");

    let err = chat_error(ChatTemplate::new(
        "{% if x %}never closed",
        "unclosed",
        None,
        None,
    ));
    assert!(err.contains("unclosed"), "{err}");
}

#[test]
fn render_errors_say_what_failed() {
    let user = [ChatMessage::new("user", "hi")];
    let template = ChatTemplate::new(
        "{% if messages[0].role != 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}",
        "strict",
        None,
        None,
    )
    .unwrap();
    let err = chat_error(template.render(&user, true));
    assert!(
        err.contains("strict") && err.contains("a system message must come first"),
        "{err}"
    );

    let template = ChatTemplate::new("{{ messages | no_such_filter }}", "filters", None, None);
    // minijinja resolves filters when rendering; either way the error names the template.
    let err = match template {
        Err(e) => e.to_string(),
        Ok(t) => chat_error(t.render(&user, false)),
    };
    assert!(
        err.contains("filters") && err.contains("no_such_filter"),
        "{err}"
    );
}

#[test]
fn undefined_special_tokens_render_empty() {
    // Without a BOS token, `bos_token` is undefined and prints nothing, as in transformers.
    let t = ChatTemplate::new(
        "[{{ bos_token }}]{{ messages[0].content }}",
        "bos",
        None,
        None,
    )
    .unwrap();
    assert_eq!(
        t.render(&[ChatMessage::new("user", "x")], false).unwrap(),
        "[]x"
    );
}
