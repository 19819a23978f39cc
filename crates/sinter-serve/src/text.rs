//! Text in and out of a model: the tokenizer (bytes or GPT-2's BPE), the streaming decoder
//! that releases only whole UTF-8 characters, and stop sequences (text that ends a
//! completion and is not part of it; while a stop sequence might still be forming, the
//! characters that could begin it are held back from the stream).

use sinter_data::Gpt2Tokenizer;

/// How text becomes token ids and back.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// One token per byte (vocabulary 256): the byte-level models trained on text.
    Bytes,
    /// GPT-2's BPE (vocabulary 50,257, `<|endoftext|>` = 50256).
    Gpt2(Gpt2Tokenizer),
}

impl Tokenizer {
    pub fn gpt2() -> Tokenizer {
        Tokenizer::Gpt2(Gpt2Tokenizer::new())
    }
    pub fn name(&self) -> &'static str {
        match self {
            Tokenizer::Bytes => "bytes",
            Tokenizer::Gpt2(_) => "gpt2",
        }
    }
    /// The ids this tokenizer produces are below this.
    pub fn vocab_size(&self) -> usize {
        match self {
            Tokenizer::Bytes => 256,
            Tokenizer::Gpt2(_) => Gpt2Tokenizer::VOCAB_SIZE,
        }
    }
    pub fn encode(&self, text: &str) -> Vec<i64> {
        match self {
            Tokenizer::Bytes => text.bytes().map(i64::from).collect(),
            Tokenizer::Gpt2(t) => t.encode(text).into_iter().map(i64::from).collect(),
        }
    }
    /// The end-of-text token, after which a model's document is over.
    pub fn eos(&self) -> Option<i64> {
        match self {
            Tokenizer::Bytes => None,
            Tokenizer::Gpt2(_) => Some(Gpt2Tokenizer::EOT as i64),
        }
    }
    /// The bytes of one token (an id this tokenizer does not know gives none).
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
        assert_eq!(b.encode("hé"), vec![104, 195, 169]);
        let mut out = Vec::new();
        for id in b.encode("hé") {
            b.token_bytes(id, &mut out);
        }
        assert_eq!(out, "hé".as_bytes());
        let g = Tokenizer::gpt2();
        let ids = g.encode("Hello world");
        assert_eq!(ids, vec![15496, 995]);
        let mut out = Vec::new();
        ids.iter().for_each(|&i| g.token_bytes(i, &mut out));
        assert_eq!(out, b"Hello world");
        assert_eq!(g.eos(), Some(50256));
        assert_eq!(b.eos(), None);
    }
}
