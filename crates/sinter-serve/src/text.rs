//! Text in and out of a model: the tokenizer (bytes, GPT-2's BPE, or a pretrained model's
//! own), the streaming decoder that releases only whole UTF-8 characters, and stop sequences
//! (text that ends a completion and is not part of it; while a stop sequence might still be
//! forming, the characters that could begin it are held back from the stream).

use std::sync::Arc;

use anyhow::{anyhow, Result};
use sinter_data::{ChatTemplate, Gpt2Tokenizer, TextTokenizer};

/// A pretrained model's tokenizer and its chat template (if it ships one).
#[derive(Debug)]
pub struct ModelText {
    pub tokenizer: TextTokenizer,
    pub chat_template: Option<ChatTemplate>,
}

/// How text becomes token ids and back.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// One token per byte (vocabulary 256): the byte-level models trained on text.
    Bytes,
    /// GPT-2's BPE (vocabulary 50,257, `<|endoftext|>` = 50256).
    Gpt2(Gpt2Tokenizer),
    /// A pretrained (GGUF or Hugging Face) model's own tokenizer: its end-of-turn and
    /// end-of-text tokens end a completion, and chat goes through its chat template.
    Text(Arc<ModelText>),
}

impl Tokenizer {
    pub fn gpt2() -> Tokenizer {
        Tokenizer::Gpt2(Gpt2Tokenizer::new())
    }
    /// A pretrained model's tokenizer and chat template.
    pub fn text(tokenizer: TextTokenizer, chat_template: Option<ChatTemplate>) -> Tokenizer {
        Tokenizer::Text(Arc::new(ModelText {
            tokenizer,
            chat_template,
        }))
    }
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Bytes => "bytes",
            Tokenizer::Gpt2(_) => "gpt2",
            Tokenizer::Text(_) => "pretrained",
        }
    }
    /// The ids this tokenizer produces are below this.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Gpt2(_) => Gpt2Tokenizer::VOCAB_SIZE,
            Tokenizer::Text(t) => t.tokenizer.vocab_size(),
        }
    }
    /// The ids of a prompt text. A pretrained tokenizer adds the tokens it puts before a
    /// text (BOS for most Llama-family models), as Hugging Face's tokenizers do.
    pub fn encode(&self, text: &str) -> Result<Vec<i64>> {
        match self {
            Tokenizer::Bytes => Ok(text.bytes().map(i64::from).collect()),
            Tokenizer::Gpt2(t) => Ok(t.encode(text).into_iter().map(i64::from).collect()),
            Tokenizer::Text(t) => encode_text(&t.tokenizer, text, true),
        }
    }
    /// Whether `id` ends a completion: GPT-2's end-of-text, or a pretrained tokenizer's
    /// end-of-sequence and end-of-turn tokens.
    pub fn is_stop(&self, id: i64) -> bool {
        match self {
            Tokenizer::Bytes => false,
            Tokenizer::Gpt2(_) => id == Gpt2Tokenizer::EOT as i64,
            Tokenizer::Text(t) => {
                u32::try_from(id).is_ok_and(|i| t.tokenizer.stop_ids().contains(&i))
            }
        }
    }
    /// The bytes of one token of a byte-level tokenizer (an id it does not know, and every
    /// id of a pretrained tokenizer, whose tokens have no bytes of their own, give none).
    pub fn token_bytes(&self, id: i64, out: &mut Vec<u8>) {
        match self {
            Tokenizer::Bytes => {
                if let Ok(b) = u8::try_from(id) {
                    out.push(b)
                }
            }
            Tokenizer::Gpt2(t) => {
                if let Ok(b) = u16::try_from(id).map(|i| t.decode_bytes(&[i])) {
                    out.extend_from_slice(&b.unwrap_or_default())
                }
            }
            Tokenizer::Text(_) => {}
        }
    }
}

/// `text`'s ids from a pretrained tokenizer (`special`: with the tokens it adds around a
/// text; a chat template writes its own).
pub fn encode_text(t: &TextTokenizer, text: &str, special: bool) -> Result<Vec<i64>> {
    let ids = t
        .encode(text, special)
        .map_err(|e| anyhow!("cannot tokenize the prompt: {e}"))?;
    Ok(ids.into_iter().map(i64::from).collect())
}

/// A completion's token ids in, its text out as it grows: whole UTF-8 characters only, and
/// (pretrained tokenizers) pieces whose concatenation is the decode of all the ids.
#[derive(Default)]
pub struct TokenText {
    /// Byte-level tokenizers: the bytes of an unfinished character.
    utf8: Utf8Stream,
    /// Pretrained tokenizers: the ids so far (those the tokenizer knows).
    ids: Vec<u32>,
    /// The first id whose text has not gone out yet.
    sent: usize,
}

impl TokenText {
    /// Appends token `id`; returns the text it completes (empty while a character is
    /// unfinished).
    pub fn push(&mut self, tok: &Tokenizer, id: i64) -> String {
        let Tokenizer::Text(t) = tok else {
            let mut bytes = Vec::new();
            tok.token_bytes(id, &mut bytes);
            return self.utf8.push(&bytes);
        };
        let Ok(id) = u32::try_from(id) else {
            return String::new();
        };
        self.ids.push(id);
        match self.new_text(&t.tokenizer) {
            // Decoding stops at an unfinished character: U+FFFD until its last byte arrives.
            Some(text) if !text.ends_with(char::REPLACEMENT_CHARACTER) => {
                self.sent = self.ids.len();
                text
            }
            Some(_) => String::new(),
            // An id the tokenizer does not know (a model row past its vocabulary): no text.
            None => {
                self.ids.pop();
                String::new()
            }
        }
    }

    /// The end of the completion: what is still held (an unfinished character as U+FFFD).
    pub fn finish(&mut self, tok: &Tokenizer) -> String {
        let Tokenizer::Text(t) = tok else {
            return self.utf8.finish();
        };
        let text = self.new_text(&t.tokenizer).unwrap_or_default();
        self.sent = self.ids.len();
        text
    }

    /// The text of the ids not sent yet. Decoded after the one sent id before them (their
    /// context: decoders such as SentencePiece's drop the space of a text's first token, which
    /// a token in mid-completion must keep), less that id's own text.
    fn new_text(&self, t: &TextTokenizer) -> Option<String> {
        let from = self.sent.saturating_sub(1);
        let before = t.decode(&self.ids[from..self.sent], true).ok()?;
        let all = t.decode(&self.ids[from..], true).ok()?;
        match all.strip_prefix(before.as_str()) {
            Some(new) => Some(new.to_string()),
            // The context's text changed with what follows it (no decoder in use does this):
            // what is past its length, at a character boundary.
            None => Some(
                all.char_indices()
                    .find(|&(i, _)| i >= before.len())
                    .map_or(String::new(), |(i, _)| all[i..].to_string()),
            ),
        }
    }
}

/// Bytes in, whole UTF-8 characters out: a character split across tokens is released when
/// its last byte arrives; bytes that can never form a character become U+FFFD.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Appends `bytes` and returns the text completed by them.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let ok = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..ok]).expect("valid prefix"));
                    match e.error_len() {
                        // An incomplete character at the end: wait for its next bytes.
                        None => {
                            self.pending.drain(..ok);
                            return out;
                        }
                        Some(bad) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..ok + bad);
                        }
                    }
                }
            }
        }
    }
    /// The end of the stream: an unfinished character becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.pending.is_empty() {
            return String::new();
        }
        self.pending.clear();
        char::REPLACEMENT_CHARACTER.to_string()
    }
}

/// Completion text with stop sequences: `push` returns what may be sent now; when a stop
/// sequence appears, the text before it is the last to go out and `stopped` turns true.
pub struct StopText {
    stops: Vec<String>,
    /// Text produced but not sent yet (the longest tail that could begin a stop sequence).
    held: String,
    stopped: bool,
    /// Leading spaces still to drop (chat answers start after "Assistant:").
    trim_start: bool,
}

impl StopText {
    pub fn new(stops: Vec<String>, trim_start: bool) -> StopText {
        StopText {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
            trim_start,
        }
    }
    pub fn stopped(&self) -> bool {
        self.stopped
    }
    /// Adds newly decoded text; returns the text that can be released now.
    pub fn push(&mut self, text: &str) -> String {
        if self.stopped {
            return String::new();
        }
        let mut text = text;
        if self.trim_start {
            text = text.trim_start_matches(' ');
            if text.is_empty() {
                return String::new();
            }
            self.trim_start = false;
        }
        self.held.push_str(text);
        // The earliest complete stop sequence ends the completion.
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            self.held.truncate(at);
            return std::mem::take(&mut self.held);
        }
        // Hold back the longest tail that is a proper prefix of some stop sequence.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_tail_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        out
    }
    /// The end of the completion without a stop sequence: everything held goes out.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// The length in bytes of the longest tail of `text` that is a proper prefix of `stop` (cut
/// at character boundaries).
fn longest_tail_prefix(text: &str, stop: &str) -> usize {
    let max = text.len().min(stop.len().saturating_sub(1));
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && stop.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_is_released_by_whole_characters() {
        let mut s = Utf8Stream::default();
        let bytes = "aé€😀".as_bytes();
        let out: Vec<String> = bytes.iter().map(|&b| s.push(&[b])).collect();
        assert_eq!(out.concat(), "aé€😀");
        // Each character appears with its last byte, never before.
        assert_eq!(out[0], "a");
        assert_eq!((out[1].as_str(), out[2].as_str()), ("", "é"));
        assert_eq!(out[5], "€");
        assert_eq!(out[9], "😀");
        // Bytes that cannot form a character, and an unfinished one at the end.
        assert_eq!(s.push(&[0xff, b'x']), "\u{FFFD}x");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn stop_sequences_cut_the_text_and_hold_back_what_may_begin_one() {
        let mut t = StopText::new(vec!["\nUser:".into(), "END".into()], false);
        assert_eq!(t.push("Hello"), "Hello");
        assert_eq!(t.push(" wor"), " wor");
        assert_eq!(t.push("ld\nU"), "ld");
        assert_eq!(t.push("s"), "");
        assert_eq!(t.push("ual"), "\nUsual");
        assert_eq!(t.push(" E"), " ");
        assert_eq!(t.push("NDING"), "");
        assert!(t.stopped());
        assert_eq!(t.push("more"), "");
        // Without a stop sequence, what was held goes out at the end.
        let mut t = StopText::new(vec!["xyz".into()], false);
        assert_eq!(t.push("abcxy"), "abc");
        assert_eq!(t.finish(), "xy");
        // Multi-byte characters are never split.
        let mut t = StopText::new(vec!["éa".into()], false);
        assert_eq!(t.push("zé"), "z");
        assert_eq!(t.push("b"), "éb");
    }

    #[test]
    fn chat_answers_drop_leading_spaces() {
        let mut t = StopText::new(vec![], true);
        assert_eq!(t.push(" "), "");
        assert_eq!(t.push("  Hi there"), "Hi there");
        assert_eq!(t.push(" you"), " you");
    }

    #[test]
    fn tokenizers_round_trip() {
        let b = Tokenizer::Bytes;
        assert_eq!(b.encode("hé").unwrap(), vec![104, 195, 169]);
        let mut out = Vec::new();
        for id in b.encode("hé").unwrap() {
            b.token_bytes(id, &mut out);
        }
        assert_eq!(out, "hé".as_bytes());
        let g = Tokenizer::gpt2();
        let ids = g.encode("Hello world").unwrap();
        assert_eq!(ids, vec![15496, 995]);
        let mut out = Vec::new();
        ids.iter().for_each(|&i| g.token_bytes(i, &mut out));
        assert_eq!(out, b"Hello world");
        assert!(g.is_stop(50256) && !g.is_stop(50255));
        assert!((0..256).all(|i| !b.is_stop(i)));
        // Byte-level tokens through TokenText: whole characters, the rest at the end.
        let mut t = TokenText::default();
        let got: Vec<String> = "é€".bytes().map(|x| t.push(&b, i64::from(x))).collect();
        assert_eq!(got, ["", "é", "", "", "€"]);
        assert_eq!(
            (t.push(&b, 0xe2), t.finish(&b)),
            (String::new(), "\u{FFFD}".into())
        );
    }
}
