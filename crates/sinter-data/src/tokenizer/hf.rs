//! [`TextTokenizer`]: a pretrained model's tokenizer over Hugging Face's `tokenizers` crate.

use std::path::Path;

use serde_json::Value;
use tokenizers::{
    DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper,
    Tokenizer,
};

use super::chat::{ChatTemplate, END_OF_TURN_TOKENS};
use super::gguf_vocab::{self, GgufVocab};
use crate::error::{DataError, Result};

/// A pretrained model's tokenizer: text to token ids and back, its special tokens, the ids that
/// end a generation, and its chat template.
///
/// Built from a Hugging Face `tokenizer.json` ([`from_file`](Self::from_file)) or from a GGUF
/// file's vocabulary ([`from_gguf_vocab`](Self::from_gguf_vocab)); either way the work is done
/// by Hugging Face's `tokenizers` crate, so ids match transformers'.
pub struct TextTokenizer {
    inner: Tokenizer,
    /// Where it came from, for error messages.
    source: String,
    /// Ids are below this.
    vocab_size: usize,
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
    stop_ids: Vec<u32>,
    chat_template: Option<String>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("stop_ids", &self.stop_ids)
            .finish_non_exhaustive()
    }
}

/// The `tokenizers` stream decoder over [`Tokenizer`]'s component types.
type InnerDecodeStream<'a> = tokenizers::DecodeStream<
    'a,
    ModelWrapper,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// Decodes ids one at a time as a model generates them, handing out each piece of text as soon
/// as it is complete UTF-8 (a character split over byte tokens comes out whole, once its last
/// byte arrives), so concatenating the pieces gives the full decode. Like `tokenizers`'
/// `DecodeStream` and transformers' `TextIteratorStreamer`.
pub struct TextDecodeStream<'a> {
    tokenizer: &'a TextTokenizer,
    inner: InnerDecodeStream<'a>,
    position: usize,
}

impl TextDecodeStream<'_> {
    /// Feeds the next id; returns the new text, or `None` while a character is incomplete.
    /// An id outside the vocabulary is an error naming it and its position in the stream.
    pub fn step(&mut self, id: u32) -> Result<Option<String>> {
        self.tokenizer.check_id(id, self.position)?;
        self.position += 1;
        self.inner.step(id).map_err(|e| {
            self.tokenizer
                .error(format!("cannot decode token {id}: {e}"))
        })
    }
}

impl TextTokenizer {
    /// Loads a Hugging Face `tokenizer.json`. A `tokenizer_config.json` in the same directory,
    /// if there is one, names the BOS / EOS tokens, supplies the chat template and, where it
    /// sets `add_bos_token` / `add_eos_token`, decides whether encoding adds them (as
    /// transformers' Llama-family tokenizers do). Truncation and padding saved in the file are
    /// turned off, as transformers leaves them unless asked.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path)
            .map_err(|e| DataError::from_read("tokenizer file", path.to_path_buf(), e))?;
        let mut inner = Tokenizer::from_bytes(&bytes).map_err(|e| DataError::Malformed {
            format: "tokenizer.json",
            path: path.to_path_buf(),
            detail: format!("{e}; it is corrupt or not a Hugging Face tokenizer: re-download it"),
        })?;
        // A saved tokenizer may carry fixed-length truncation and padding (sentence-transformers
        // save 128 tokens of both); transformers applies them only on request, and so do we:
        // encode returns exactly the text's tokens.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| DataError::Tokenizer {
                source_name: path.display().to_string(),
                detail: format!("cannot turn truncation off: {e}"),
            })?;
        let config_path = path.with_file_name("tokenizer_config.json");
        let config = read_config(&config_path)?;
        let source = path.display().to_string();

        let special = |key: &str| -> Option<(String, u32)> {
            let name = config.as_ref().and_then(|c| token_name(c.get(key)?))?;
            let id = inner.token_to_id(&name)?;
            Some((name, id))
        };
        let (bos, eos) = (special("bos_token"), special("eos_token"));
        if let Some(config) = &config {
            apply_bos_eos_flags(&mut inner, config, &config_path, &bos, &eos)?;
        }

        let mut stop_ids: Vec<u32> = eos.iter().map(|(_, id)| *id).collect();
        for (id, token) in inner.get_added_tokens_decoder() {
            if token.special && END_OF_TURN_TOKENS.contains(&token.content.as_str()) {
                stop_ids.push(id);
            }
        }
        let chat_template = config.as_ref().and_then(chat_template_of);
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .max()
            .map_or(0, |&id| id as usize + 1);
        Ok(Self::assemble(
            inner,
            source,
            vocab_size,
            bos,
            eos,
            stop_ids,
            chat_template,
        ))
    }

    /// The tokenizer a GGUF file's vocabulary describes (see [`GgufVocab`]): byte-level BPE
    /// for `gpt2` vocabularies, SentencePiece BPE for `llama` ones. Unknown tokenizer models and
    /// unknown pre-tokenizer names are refused by name.
    pub fn from_gguf_vocab(vocab: &GgufVocab) -> Result<Self> {
        let inner = gguf_vocab::build_tokenizer(vocab)?;
        let named = |id: Option<u32>| id.map(|id| (vocab.tokens[id as usize].clone(), id));
        Ok(Self::assemble(
            inner,
            gguf_vocab::SOURCE_NAME.to_string(),
            vocab.tokens.len(),
            named(vocab.bos_token_id),
            named(vocab.eos_token_id),
            vocab.stop_ids(),
            vocab.chat_template.clone(),
        ))
    }

    fn assemble(
        inner: Tokenizer,
        source: String,
        vocab_size: usize,
        bos: Option<(String, u32)>,
        eos: Option<(String, u32)>,
        mut stop_ids: Vec<u32>,
        chat_template: Option<String>,
    ) -> Self {
        stop_ids.sort_unstable();
        stop_ids.dedup();
        TextTokenizer {
            inner,
            source,
            vocab_size,
            bos,
            eos,
            stop_ids,
            chat_template,
        }
    }

    fn error(&self, detail: String) -> DataError {
        DataError::Tokenizer {
            source_name: self.source.clone(),
            detail,
        }
    }

    fn check_id(&self, id: u32, position: usize) -> Result<()> {
        if (id as usize) < self.vocab_size && self.inner.id_to_token(id).is_some() {
            return Ok(());
        }
        Err(self.error(format!(
            "token id {id} at position {position} is not in the vocabulary of {} tokens; the \
             ids come from another tokenizer or model",
            self.vocab_size
        )))
    }

    /// The token ids of `text`. With `add_special_tokens`, the tokens the tokenizer puts around
    /// a text (BOS for most Llama-family models, `[CLS]`/`[SEP]` for BERT) are added. Special
    /// tokens written in the text (`<|im_start|>`) are always recognised.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| self.error(format!("cannot encode text: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special_tokens`, special tokens are left out. A byte
    /// sequence that is not valid UTF-8 (ids cut in the middle of a character) becomes U+FFFD;
    /// an id outside the vocabulary is an error naming it and its position.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        for (position, &id) in ids.iter().enumerate() {
            self.check_id(id, position)?;
        }
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| self.error(format!("cannot decode: {e}")))
    }

    /// A stream decoder for generated ids (see [`TextDecodeStream`]).
    pub fn decode_stream(&self, skip_special_tokens: bool) -> TextDecodeStream<'_> {
        TextDecodeStream {
            tokenizer: self,
            inner: self.inner.decode_stream(skip_special_tokens),
            position: 0,
        }
    }

    /// The id of token `token` (as the vocabulary spells it, e.g. `"Ġthe"`), if there is one.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token with id `id` (as the vocabulary spells it), if there is one.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The number of ids: every id is below this (the model's embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The beginning-of-sequence token's id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos.as_ref().map(|(_, id)| *id)
    }

    /// The end-of-sequence token's id, if the tokenizer has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos.as_ref().map(|(_, id)| *id)
    }

    /// The ids at which generation stops, sorted: end of sequence, end of turn, and special
    /// tokens that end a turn in common chat formats (`<|im_end|>`, `<|eot_id|>`, …).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// The model's chat template, ready to render, or `None` if it has none. An error if the
    /// template does not parse (naming it and the line).
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>> {
        let Some(source) = &self.chat_template else {
            return Ok(None);
        };
        let text = |t: &Option<(String, u32)>| t.as_ref().map(|(s, _)| s.clone());
        ChatTemplate::new(
            source,
            &format!("{} chat template", self.source),
            text(&self.bos),
            text(&self.eos),
        )
        .map(Some)
    }
}

impl TextTokenizer {
    /// Writes this tokenizer into `dir` as Hugging Face files: `tokenizer.json` (what it
    /// does, post-processor included) and `tokenizer_config.json` (its BOS / EOS names and chat
    /// template), which [`from_file`](Self::from_file) and transformers'
    /// `PreTrainedTokenizerFast` read back to the same ids. Lets a model loaded from GGUF be
    /// saved as a Hugging Face directory.
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let json = self
            .inner
            .to_string(true)
            .map_err(|e| self.error(format!("cannot serialise the tokenizer: {e}")))?;
        let mut config = serde_json::json!({
            // Not a model-specific class: those rebuild the post-processor from their own
            // defaults; the generic one keeps tokenizer.json's.
            "tokenizer_class": "PreTrainedTokenizerFast",
        });
        for (key, token) in [("bos_token", &self.bos), ("eos_token", &self.eos)] {
            if let Some((name, _)) = token {
                config[key] = Value::String(name.clone());
            }
        }
        if let Some(t) = &self.chat_template {
            config["chat_template"] = Value::String(t.clone());
        }
        let config = serde_json::to_string_pretty(&config)
            .map_err(|e| self.error(format!("cannot serialise tokenizer_config.json: {e}")))?;
        for (name, text) in [("tokenizer.json", json), ("tokenizer_config.json", config)] {
            let path = dir.join(name);
            std::fs::write(&path, text)
                .map_err(|e| self.error(format!("cannot write {}: {e}", path.display())))?;
        }
        Ok(())
    }
}

/// Where `tokenizer_config.json` sets `add_bos_token` / `add_eos_token`, replaces the
/// post-processor by one that adds exactly those, as transformers' Llama-family tokenizers
/// rebuild theirs from the flags (an absent flag counts as false).
fn apply_bos_eos_flags(
    inner: &mut Tokenizer,
    config: &Value,
    config_path: &Path,
    bos: &Option<(String, u32)>,
    eos: &Option<(String, u32)>,
) -> Result<()> {
    let flag = |key: &str| config.get(key).and_then(Value::as_bool);
    let (add_bos, add_eos) = (flag("add_bos_token"), flag("add_eos_token"));
    if add_bos.is_none() && add_eos.is_none() {
        return Ok(());
    }
    let malformed = |detail: String| DataError::Malformed {
        format: "tokenizer_config.json",
        path: config_path.to_path_buf(),
        detail,
    };
    let wanted = |on: Option<bool>, token: &Option<(String, u32)>, key: &str| match (
        on.unwrap_or(false),
        token,
    ) {
        (false, _) => Ok(None),
        (true, Some(t)) => Ok(Some(t.clone())),
        (true, None) => Err(malformed(format!(
            "add_{key}_token is true but {key}_token is missing or not in the vocabulary"
        ))),
    };
    let post =
        gguf_vocab::template_processing(wanted(add_bos, bos, "bos")?, wanted(add_eos, eos, "eos")?)
            .map_err(malformed)?;
    inner.with_post_processor(post);
    Ok(())
}

/// `tokenizer_config.json`, if it exists; an error if it exists but is not a JSON object.
fn read_config(path: &Path) -> Result<Option<Value>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(DataError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let malformed = |detail: String| DataError::Malformed {
        format: "tokenizer_config.json",
        path: path.to_path_buf(),
        detail,
    };
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        malformed(format!(
            "not valid JSON ({e}); re-download it or delete it to use tokenizer.json alone"
        ))
    })?;
    if !value.is_object() {
        return Err(malformed("not a JSON object; re-download it".to_string()));
    }
    Ok(Some(value))
}

/// A special token in `tokenizer_config.json`: a string or an `{"content": …}` object.
fn token_name(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// The chat template: a string, or a list of named templates of which "default" is taken.
fn chat_template_of(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))?
            .get("template")?
            .as_str()
            .map(str::to_string),
        _ => None,
    }
}
