//! Chat templates: the Jinja template a chat model ships (`tokenizer_config.json`'s or the
//! GGUF's `chat_template`) that turns a conversation into the prompt text it was trained on.
//!
//! Rendered with `minijinja` set up like transformers' `apply_chat_template` environment:
//! `trim_blocks` and `lstrip_blocks` on, a trailing newline dropped, Python string methods
//! (`.strip()`, `.startswith()`, …) through `minijinja-contrib`'s pycompat, `raise_exception`,
//! and a `tojson` that writes JSON as Python's `json.dumps` does (`", "` and `": "`, non-ASCII
//! kept, keys in their order).

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{context, Environment, Error, ErrorKind, Value};
use serde::Serialize;

use crate::error::{DataError, Result};

/// Special tokens that end a turn in the chat formats in use; where a tokenizer has one as a
/// special token, generation stops there as it does at end of sequence (llama.cpp's list).
pub(crate) const END_OF_TURN_TOKENS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
];

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// Who speaks: `"system"`, `"user"` or `"assistant"` (templates may know others).
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A parsed chat template (see the module documentation).
///
/// ```
/// use sinter_data::tokenizer::{ChatMessage, ChatTemplate};
///
/// let source = "{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}\n{% endfor %}\
///               {% if add_generation_prompt %}<|assistant|>{% endif %}";
/// let template = ChatTemplate::new(source, "example", None, None)?;
/// let text = template.render(&[ChatMessage::new("user", " Hi! ")], true)?;
/// assert_eq!(text, "<|user|>Hi!\n<|assistant|>");
/// # Ok::<(), sinter_data::DataError>(())
/// ```
pub struct ChatTemplate {
    env: Environment<'static>,
    name: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Parses `source`. `name` says where it came from in error messages; `bos_token` and
    /// `eos_token` are the texts the template sees as `bos_token` / `eos_token` (undefined when
    /// `None`), as transformers passes them. A syntax error names the template and the line.
    pub fn new(
        source: &str,
        name: &str,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", to_python_json);
        env.add_template_owned(name.to_string(), source.to_string())
            .map_err(|e| template_error(name, "does not parse", &e))?;
        Ok(ChatTemplate {
            env,
            name: name.to_string(),
            bos_token,
            eos_token,
        })
    }

    /// The prompt text for `messages`; with `add_generation_prompt`, followed by the start of
    /// the assistant's turn. An error (the template's own `raise_exception`, an undefined
    /// operation) names the template, the line and what failed.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|e| template_error(&self.name, "is missing", &e))?;
        // An absent token is undefined (prints nothing), not none (which prints "none").
        let token = |t: &Option<String>| t.as_deref().map_or(Value::UNDEFINED, Value::from);
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => add_generation_prompt,
                bos_token => token(&self.bos_token),
                eos_token => token(&self.eos_token),
                tools => Value::from(()),
                documents => Value::from(()),
            })
            .map_err(|e| template_error(&self.name, "failed to render", &e))
    }
}

fn template_error(name: &str, what: &str, e: &Error) -> DataError {
    let mut detail = format!("{what}: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        detail.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    DataError::ChatTemplate {
        template: name.to_string(),
        detail,
    }
}

/// Templates call `raise_exception("...")` to refuse a conversation (e.g. roles out of order).
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the template raised: {message}"),
    ))
}

/// `tojson` as transformers defines it: Python's `json.dumps(value, ensure_ascii=False,
/// indent=indent)`. minijinja's own escapes `<`, `>`, `&` and `'` for HTML, which would change
/// the prompt.
fn to_python_json(value: Value, kwargs: Kwargs) -> std::result::Result<String, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write_json(&value, indent, 0, &mut out)?;
    Ok(out)
}

fn write_json(
    value: &Value,
    indent: Option<usize>,
    depth: usize,
    out: &mut String,
) -> std::result::Result<(), Error> {
    // Python puts ", " between items on one line, "," before a newline when indenting.
    let newline = |out: &mut String, depth: usize| {
        if let Some(width) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * depth));
        }
    };
    let separator = if indent.is_some() { "," } else { ", " };
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&value.to_string()),
        ValueKind::String => out.push_str(
            &serde_json::to_string(value.as_str().unwrap_or_default())
                .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?,
        ),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                write_json(item, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = value.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(separator);
                }
                newline(out, depth + 1);
                let key_text = key.as_str().map_or_else(|| key.to_string(), str::to_string);
                write_json(&Value::from(key_text), indent, depth + 1, out)?;
                out.push_str(": ");
                write_json(&value.get_item(key)?, indent, depth + 1, out)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot write a {} value", value.kind()),
            ))
        }
    }
    Ok(())
}
