//! A GGUF file's vocabulary (its `tokenizer.ggml.*` metadata) and the Hugging Face tokenizer it
//! describes.
//!
//! GGUF files carry no `tokenizer.json`: llama.cpp stores the tokens, the merges or scores,
//! the token types and the special ids as metadata, plus a pre-tokenizer *name*
//! (`tokenizer.ggml.pre`) that stands for the regular expressions that cut text into words
//! before BPE. [`build_tokenizer`] rebuilds the equivalent `tokenizers::Tokenizer`:
//!
//! - `gpt2`: byte-level BPE over the file's merges; the text is split by the pre-tokenizer's
//!   regular expressions (llama.cpp's table, in the form the models' own `tokenizer.json` use),
//!   then mapped to GPT-2's byte alphabet.
//! - `llama`: SentencePiece BPE. Such files usually have scores, not merges; the merges are
//!   then recovered from the scores the way transformers' GGUF converter does (every split of
//!   a token into two tokens, best-scoring token first), with byte fallback (`<0x0A>`) and the
//!   `▁` metaspace.
//!
//! Where transformers' GGUF converter and llama.cpp disagree, this follows llama.cpp and the
//! model's own `tokenizer.json`: transformers has no entry for `smollm`/`starcoder`-style names
//! and so drops their one-digit-per-word split (SmolLM2 differs on text with numerals or
//! whitespace before digits), and it reads `default` as GPT-2's pattern where llama.cpp has
//! its own four.
//!
//! Control tokens (type 3) become special added tokens, matched whole in text and dropped by
//! `decode(.., skip_special_tokens = true)`; user-defined ones (type 4) become added tokens that
//! are matched whole but kept when decoding, as llama.cpp and transformers treat them.

use std::collections::HashSet;

use serde::Deserialize;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab as BpeVocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{
    AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer,
};

use crate::error::{DataError, Result};

/// The `tokenizer.ggml.*` metadata of a GGUF file: everything needed to rebuild its tokenizer.
///
/// Fill it from a GGUF reader (field names follow the metadata keys without the
/// `tokenizer.ggml.` prefix; `chat_template` is `tokenizer.chat_template`), or deserialize it
/// from JSON with the same field names. Absent arrays are empty; absent scalars are `None`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece BPE);
    /// others are refused by name.
    pub model: String,
    /// `tokenizer.ggml.pre`: the pre-tokenizer's name, e.g. `"smollm"`, `"llama-bpe"`,
    /// `"qwen2"`, `"gpt2"`, `"default"` (only byte-level vocabularies have one; absent means
    /// `"default"`, as in llama.cpp). Names this crate does not know are refused.
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: the token strings, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: one per token (SentencePiece vocabularies), else empty.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`: one per token (1 normal, 2 unknown, 3 control,
    /// 4 user-defined, 5 unused, 6 byte), or empty.
    pub token_type: Vec<i32>,
    /// `tokenizer.ggml.merges`: `"left right"` pairs, best first (byte-level vocabularies).
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_token_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_token_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown_token_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding_token_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn, where it differs from end of sequence).
    pub eot_token_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`; absent means yes for `llama` vocabularies, no for
    /// `gpt2` ones (as llama.cpp and transformers read it).
    pub add_bos_token: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`; absent means no.
    pub add_eos_token: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`: whether SentencePiece text gets a leading `▁`;
    /// absent means yes.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`: the Jinja chat template.
    pub chat_template: Option<String>,
}

/// llama.cpp's token type for control tokens (`<|im_start|>`, `<s>`).
const TOKEN_TYPE_CONTROL: i32 = 3;
/// llama.cpp's token type for user-defined tokens (`<think>`).
const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Where errors say the tokenizer came from.
pub(crate) const SOURCE_NAME: &str = "GGUF vocabulary";

/// GPT-2's word pattern (contractions, letters, digits, other symbols, whitespace runs).
const GPT2_SPLIT: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's: case-insensitive contractions, numbers in groups of up to three.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's: like Llama 3's but one digit per word.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Every digit alone (StarCoder, SmolLM: their `tokenizer.json` has `Digits(individual)`).
const DIGIT_SPLIT: &str = r"\p{N}";

/// The pre-tokenizer names this crate knows (as `tokenizer.ggml.pre` spells them) and the
/// regular expressions each applies in turn, every one cutting the pieces the previous left
/// (llama.cpp's `regex_exprs`; each match and each gap between matches is a piece).
const PRE_TOKENIZERS: &[(&[&str], &[&str])] = &[
    (&["gpt2", "gpt-2", "mpt", "olmo", "jais"], &[GPT2_SPLIT]),
    (
        &[
            "smollm",
            "starcoder",
            "refact",
            "command-r",
            "codeshell",
            "exaone",
            "minerva-7b",
        ],
        &[DIGIT_SPLIT, GPT2_SPLIT],
    ),
    (
        &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "dbrx",
            "smaug-bpe",
        ],
        &[LLAMA3_SPLIT],
    ),
    (
        &["qwen2", "stablelm2", "deepseek-r1-qwen", "megrez"],
        &[QWEN2_SPLIT],
    ),
    // llama.cpp's fallback for byte-level vocabularies converted before `pre` existed.
    (
        &["default"],
        &[
            r"[\p{P}\$\+<=>\^~\|]+",
            GPT2_SPLIT,
            r"\p{N}+",
            r"[0-9][0-9][0-9]",
        ],
    ),
];

fn error(detail: impl Into<String>) -> DataError {
    DataError::Tokenizer {
        source_name: SOURCE_NAME.to_string(),
        detail: detail.into(),
    }
}

fn known_pre_names() -> String {
    PRE_TOKENIZERS
        .iter()
        .flat_map(|(names, _)| names.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The regular expressions of pre-tokenizer `name`, or an error naming it and the known ones.
fn pre_tokenizer_splits(name: &str) -> Result<&'static [&'static str]> {
    PRE_TOKENIZERS
        .iter()
        .find(|(names, _)| names.contains(&name))
        .map(|(_, splits)| *splits)
        .ok_or_else(|| {
            error(format!(
                "unknown pre-tokenizer \"{name}\" (tokenizer.ggml.pre); its text would be split \
                 into words wrongly, so it is refused. Known: {}",
                known_pre_names()
            ))
        })
}

impl GgufVocab {
    /// Checks sizes, ids and scores against each other so the build never indexes out of range.
    fn validate(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(error(
                "tokenizer.ggml.tokens is empty or missing; the file holds no vocabulary",
            ));
        }
        for (name, len) in [
            ("scores", self.scores.len()),
            ("token_type", self.token_type.len()),
        ] {
            if len != 0 && len != n {
                return Err(error(format!(
                    "tokenizer.ggml.{name} has {len} entries for {n} tokens; the file is corrupt"
                )));
            }
        }
        if let Some(i) = self.scores.iter().position(|s| s.is_nan()) {
            return Err(error(format!(
                "tokenizer.ggml.scores[{i}] (token {:?}) is NaN; the file is corrupt",
                self.tokens[i]
            )));
        }
        for (name, id) in [
            ("bos_token_id", self.bos_token_id),
            ("eos_token_id", self.eos_token_id),
            ("unknown_token_id", self.unknown_token_id),
            ("padding_token_id", self.padding_token_id),
            ("eot_token_id", self.eot_token_id),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(error(format!(
                    "tokenizer.ggml.{name} is {id}, outside the vocabulary of {n} tokens"
                )));
            }
        }
        Ok(())
    }

    fn token_type_of(&self, id: usize) -> Option<i32> {
        self.token_type.get(id).copied()
    }

    /// The ids that end a generation: end of sequence, end of turn, and the control tokens
    /// that conventionally end a turn (llama.cpp's end-of-generation list).
    pub(crate) fn stop_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = [self.eos_token_id, self.eot_token_id]
            .into_iter()
            .flatten()
            .collect();
        for (id, token) in self.tokens.iter().enumerate() {
            if self.token_type_of(id) == Some(TOKEN_TYPE_CONTROL)
                && super::chat::END_OF_TURN_TOKENS.contains(&token.as_str())
            {
                ids.push(id as u32);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Whether encoding adds the BOS token (absent: yes for SentencePiece, no for byte-level).
    pub(crate) fn adds_bos(&self) -> bool {
        self.add_bos_token.unwrap_or(self.model == "llama")
    }
}

/// The `tokenizers::Tokenizer` a GGUF vocabulary describes (see the module documentation).
pub(crate) fn build_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    vocab.validate()?;
    let mut tokenizer = match vocab.model.as_str() {
        "gpt2" => byte_level_tokenizer(vocab)?,
        "llama" => sentencepiece_tokenizer(vocab)?,
        other => {
            return Err(error(format!(
                "tokenizer.ggml.model \"{other}\" is not supported; supported: \"gpt2\" \
                 (byte-level BPE) and \"llama\" (SentencePiece BPE)"
            )))
        }
    };
    add_special_tokens(&mut tokenizer, vocab);
    if let Some(post) = bos_eos_template(vocab)? {
        tokenizer.with_post_processor(Some(post));
    }
    Ok(tokenizer)
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the others
/// for the characters from U+0100 on, in byte order (so every byte is a visible character).
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_free = 256u32;
    for (byte, slot) in table.iter_mut().enumerate() {
        let printable = matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let code = if printable {
            byte as u32
        } else {
            next_free += 1;
            next_free - 1
        };
        *slot = char::from_u32(code).expect("codes below 0x200 are characters");
    }
    table
}

/// Byte-level BPE over the file's merges, split by the pre-tokenizer `pre` names.
fn byte_level_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    if vocab.merges.is_empty() {
        return Err(error(
            "tokenizer.ggml.merges is empty or missing, but a \"gpt2\" (byte-level BPE) \
             vocabulary needs its merges; the file is incomplete",
        ));
    }
    let pre = vocab.pre.as_deref().unwrap_or("default");
    let splits = pre_tokenizer_splits(pre)?;

    // A token spelled outside the byte alphabet (a raw space in an added token) is respelled
    // byte by byte, as transformers does, so the BPE model can hold it.
    let alphabet = byte_alphabet();
    let in_alphabet: HashSet<char> = alphabet.iter().copied().collect();
    let mut ids = BpeVocab::with_capacity(vocab.tokens.len());
    for (id, token) in vocab.tokens.iter().enumerate() {
        let spelled = if token.chars().all(|c| in_alphabet.contains(&c)) {
            token.clone()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        ids.insert(spelled, id as u32);
    }
    let merges = parse_merges(&vocab.merges, &ids)?;
    let bpe = BPE::builder()
        .vocab_and_merges(ids, merges)
        .build()
        .map_err(|e| error(format!("cannot build the byte-level BPE model: {e}")))?;

    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(splits.len() + 1);
    for pattern in splits {
        let split = Split::new(
            SplitPattern::Regex(pattern.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| {
            error(format!(
                "pre-tokenizer \"{pre}\": bad pattern {pattern}: {e}"
            ))
        })?;
        steps.push(split.into());
    }
    // The regular expressions above did the splitting; this only maps bytes to the alphabet.
    steps.push(tokenizers::pre_tokenizers::byte_level::ByteLevel::new(false, true, false).into());

    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(PreTokenizerSequence::new(steps)))
        .with_decoder(Some(ByteLevel::default()));
    Ok(tokenizer)
}

/// `"left right"` merge strings as pairs; both halves must be tokens.
fn parse_merges(merges: &[String], ids: &BpeVocab) -> Result<Vec<(String, String)>> {
    merges
        .iter()
        .enumerate()
        .map(|(i, merge)| {
            let pair = merge
                .split_once(' ')
                .filter(|(l, r)| !r.contains(' ') && ids.contains_key(*l) && ids.contains_key(*r));
            match pair {
                Some((l, r)) => Ok((l.to_string(), r.to_string())),
                None => Err(error(format!(
                    "tokenizer.ggml.merges[{i}] is {merge:?}, not two tokens of the vocabulary \
                     separated by one space; the file is corrupt"
                ))),
            }
        })
        .collect()
}

/// SentencePiece BPE: merges from the file or recovered from the scores, byte fallback, `▁`
/// for spaces.
fn sentencepiece_tokenizer(vocab: &GgufVocab) -> Result<Tokenizer> {
    if vocab.scores.is_empty() && vocab.merges.is_empty() {
        return Err(error(
            "tokenizer.ggml.scores is empty or missing, but a \"llama\" (SentencePiece) \
             vocabulary without merges needs its scores to order them; the file is incomplete",
        ));
    }
    let ids: BpeVocab = vocab
        .tokens
        .iter()
        .enumerate()
        .map(|(id, t)| (t.clone(), id as u32))
        .collect();
    // Merges the file lists win over those the scores imply (as in transformers).
    let merges = if vocab.merges.is_empty() {
        merges_from_scores(&vocab.tokens, &vocab.scores, &ids)
    } else {
        parse_merges(&vocab.merges, &ids)?
    };
    let mut builder = BPE::builder()
        .vocab_and_merges(ids, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = vocab.unknown_token_id {
        builder = builder.unk_token(vocab.tokens[unk as usize].clone());
    }
    let bpe = builder
        .build()
        .map_err(|e| error(format!("cannot build the SentencePiece BPE model: {e}")))?;

    let prefix_space = vocab.add_space_prefix.unwrap_or(true);
    let scheme = if prefix_space {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    let replace = Replace::new("▁", " ").map_err(|e| error(e.to_string()))?;
    let mut decoders: Vec<DecoderWrapper> = vec![
        replace.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if prefix_space {
        // The leading `▁` the pre-tokenizer added is not part of the text.
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    let mut tokenizer = Tokenizer::new(bpe);
    tokenizer
        .with_pre_tokenizer(Some(Metaspace::new('▁', scheme, false)))
        .with_decoder(Some(DecoderSequence::new(decoders)));
    Ok(tokenizer)
}

/// BPE merges implied by SentencePiece scores: every way to cut a token into two tokens is a
/// merge ranked by the whole token's score (higher first; ties: longer left part, then
/// longer right part, then vocabulary order), as transformers' `generate_merges` ranks them.
fn merges_from_scores(tokens: &[String], scores: &[f32], ids: &BpeVocab) -> Vec<(String, String)> {
    // (score, left, right), candidates of one token ordered by the ids of their halves.
    let mut ranked: Vec<(f32, &str, &str)> = Vec::new();
    let mut seen: HashSet<&str> = HashSet::with_capacity(tokens.len());
    for token in tokens {
        // A repeated token counts once, at its first place, with its last score.
        if !seen.insert(token.as_str()) {
            continue;
        }
        let score = scores[ids[token.as_str()] as usize];
        let mut local: Vec<(&str, &str)> = token
            .char_indices()
            .skip(1)
            .map(|(at, _)| token.split_at(at))
            .filter(|(l, r)| ids.contains_key(*l) && ids.contains_key(*r))
            .collect();
        local.sort_by_key(|(l, r)| (ids[*l], ids[*r]));
        ranked.extend(local.into_iter().map(|(l, r)| (score, l, r)));
    }
    // Stable, so equal keys keep the order above.
    ranked.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(b.1.chars().count().cmp(&a.1.chars().count()))
            .then(b.2.chars().count().cmp(&a.2.chars().count()))
    });
    ranked
        .into_iter()
        .map(|(_, l, r)| (l.to_string(), r.to_string()))
        .collect()
}

/// Control tokens as special added tokens, user-defined ones as plain added tokens. In a
/// byte-level vocabulary a control token spelled outside the byte alphabet is a converter's
/// mislabel and is skipped (transformers does the same).
fn add_special_tokens(tokenizer: &mut Tokenizer, vocab: &GgufVocab) {
    let alphabet: HashSet<char> = byte_alphabet().into_iter().collect();
    let byte_level = vocab.model == "gpt2";
    let mut control = Vec::new();
    let mut user_defined = Vec::new();
    for (id, token) in vocab.tokens.iter().enumerate() {
        match vocab.token_type_of(id) {
            Some(TOKEN_TYPE_CONTROL)
                if !byte_level || token.chars().all(|c| alphabet.contains(&c)) =>
            {
                control.push(AddedToken::from(token.clone(), true).normalized(false));
            }
            Some(TOKEN_TYPE_USER_DEFINED) => {
                user_defined.push(AddedToken::from(token.clone(), false).normalized(false));
            }
            _ => {}
        }
    }
    tokenizer.add_special_tokens(&control);
    tokenizer.add_tokens(&user_defined);
}

/// The post-processor that adds BOS / EOS around encoded text, or `None` if neither is added.
fn bos_eos_template(vocab: &GgufVocab) -> Result<Option<TemplateProcessing>> {
    let special = |id: Option<u32>, what: &str| -> Result<(String, u32)> {
        let id = id.ok_or_else(|| {
            error(format!(
                "tokenizer.ggml.add_{what}_token is set but tokenizer.ggml.{what}_token_id is \
                 missing"
            ))
        })?;
        Ok((vocab.tokens[id as usize].clone(), id))
    };
    let bos = if vocab.adds_bos() {
        Some(special(vocab.bos_token_id, "bos")?)
    } else {
        None
    };
    let eos = if vocab.add_eos_token.unwrap_or(false) {
        Some(special(vocab.eos_token_id, "eos")?)
    } else {
        None
    };
    template_processing(bos, eos).map_err(error)
}

/// `[bos] $A [eos]` (and `[bos] $A [eos] [bos] $B [eos]` for pairs) with whichever of the two
/// is given, as transformers' `update_post_processor` builds it; `None` when neither is.
pub(crate) fn template_processing(
    bos: Option<(String, u32)>,
    eos: Option<(String, u32)>,
) -> std::result::Result<Option<TemplateProcessing>, String> {
    if bos.is_none() && eos.is_none() {
        return Ok(None);
    }
    let b = bos
        .as_ref()
        .map(|(t, _)| format!("{t}:0 "))
        .unwrap_or_default();
    let e = eos
        .as_ref()
        .map(|(t, _)| format!(" {t}:0"))
        .unwrap_or_default();
    let b1 = bos
        .as_ref()
        .map(|(t, _)| format!("{t}:1 "))
        .unwrap_or_default();
    let e1 = eos
        .as_ref()
        .map(|(t, _)| format!(" {t}:1"))
        .unwrap_or_default();
    let single = format!("{b}$A:0{e}");
    let pair = format!("{single} {b1}$B:1{e1}");
    let specials: Vec<(String, u32)> = bos.into_iter().chain(eos).collect();
    TemplateProcessing::builder()
        .try_single(single.as_str())
        .and_then(|b| b.try_pair(pair.as_str()))
        .map_err(|e| format!("cannot build the BOS/EOS template: {e}"))?
        .special_tokens(specials)
        .build()
        .map(Some)
        .map_err(|e| format!("cannot build the BOS/EOS template: {e}"))
}
