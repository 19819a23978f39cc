//! GPT-2's byte-level BPE tokeniser (tiktoken's `r50k_base`, whose ranks ship inside the
//! `tiktoken-rs` crate, so it works offline), with ids as `u16` like llm.c's token files.

use tiktoken_rs::CoreBPE;

use crate::error::{DataError, Result};

/// GPT-2's BPE tokeniser: 50,257 tokens, `<|endoftext|>` = 50256.
///
/// ```
/// let tok = sinter_data::Gpt2Tokenizer::new();
/// assert_eq!(tok.encode("Hello world"), vec![15496, 995]);
/// assert_eq!(tok.decode(&[15496, 995]), "Hello world");
/// ```
#[derive(Clone, Copy)]
pub struct Gpt2Tokenizer {
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer(r50k_base)")
    }
}

impl Default for Gpt2Tokenizer {
    fn default() -> Self {
        Self::new()
    }
}

impl Gpt2Tokenizer {
    /// The `<|endoftext|>` token, which separates documents.
    pub const EOT: u16 = 50256;
    /// Number of tokens (ids are `0..VOCAB_SIZE`).
    pub const VOCAB_SIZE: usize = 50257;

    /// The tokeniser. The ranks are parsed once per process (a few tens of milliseconds) and
    /// shared by every copy.
    pub fn new() -> Self {
        Gpt2Tokenizer {
            bpe: tiktoken_rs::r50k_base_singleton(),
        }
    }

    /// Token ids of `text`. Special-token text such as `<|endoftext|>` is encoded as
    /// ordinary text, like `tiktoken`'s `encode_ordinary`; append [`Self::EOT`] yourself to
    /// separate documents.
    pub fn encode(&self, text: &str) -> Vec<u16> {
        // r50k ids are below 50257, so they always fit u16.
        self.bpe
            .encode_ordinary(text)
            .into_iter()
            .map(|t| t as u16)
            .collect()
    }

    /// Token ids of `text` in which the literal `<|endoftext|>` becomes [`Self::EOT`].
    pub fn encode_with_special(&self, text: &str) -> Vec<u16> {
        self.bpe
            .encode_with_special_tokens(text)
            .into_iter()
            .map(|t| t as u16)
            .collect()
    }

    /// The bytes of `tokens`; an id outside the vocabulary is an error naming it and its
    /// position.
    pub fn decode_bytes(&self, tokens: &[u16]) -> Result<Vec<u8>> {
        let ranks: Vec<u32> = tokens.iter().map(|&t| t as u32).collect();
        self.bpe.decode_bytes(&ranks).map_err(|e| {
            let pos = tokens
                .iter()
                .position(|&t| t as u32 == e.token)
                .unwrap_or(0);
            DataError::Config(format!(
                "token {} at position {pos} is not in GPT-2's vocabulary of {} tokens",
                e.token,
                Self::VOCAB_SIZE
            ))
        })
    }

    /// The text of `tokens`. Byte sequences that are not valid UTF-8 (a token sequence cut in
    /// the middle of a character) and ids outside the vocabulary become U+FFFD.
    pub fn decode(&self, tokens: &[u16]) -> String {
        let bytes = match self.decode_bytes(tokens) {
            Ok(b) => b,
            Err(_) => {
                let mut b = Vec::with_capacity(tokens.len() * 4);
                for &t in tokens {
                    match self.bpe.decode_bytes(&[t as u32]) {
                        Ok(x) => b.extend_from_slice(&x),
                        Err(_) => b.extend_from_slice("\u{FFFD}".as_bytes()),
                    }
                }
                b
            }
        };
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Splits `text` into consecutive pieces of roughly `approx_bytes` (at least) each, cut
    /// only where GPT-2's pre-tokeniser always cuts and whose context cannot change the
    /// pieces on either side — just before a `\n` that follows a character that is not
    /// whitespace — so encoding the pieces separately and concatenating the ids gives exactly
    /// `encode(text)`. Lets large files be encoded in parallel and with progress. A text
    /// without such places is one piece.
    pub fn split_for_encoding(text: &str, approx_bytes: usize) -> Vec<&str> {
        let bytes = text.as_bytes();
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < bytes.len() {
            // The first '\n' at or after start + approx_bytes whose preceding character is
            // not whitespace ('\n' is ASCII, so positions before it are char boundaries).
            let mut cut = bytes.len();
            let mut from = start + approx_bytes.max(1);
            while from < bytes.len() {
                let Some(i) = memchr_newline(&bytes[from..]) else {
                    break;
                };
                let p = from + i;
                if text[..p]
                    .chars()
                    .next_back()
                    .is_some_and(|c| !c.is_whitespace())
                {
                    cut = p;
                    break;
                }
                from = p + 1;
            }
            pieces.push(&text[start..cut]);
            start = cut;
        }
        pieces
    }
}

fn memchr_newline(b: &[u8]) -> Option<usize> {
    b.iter().position(|&c| c == b'\n')
}
