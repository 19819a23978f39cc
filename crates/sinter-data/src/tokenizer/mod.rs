//! Tokenizers and chat templates.
//!
//! - [`Gpt2Tokenizer`]: GPT-2's BPE (tiktoken's `r50k_base`, offline), the ids of llm.c token
//!   files and of the models `sinter train` makes.
//! - [`TextTokenizer`]: the tokenizer of a pretrained model, over Hugging Face's `tokenizers`
//!   crate, built from a `tokenizer.json` ([`TextTokenizer::from_file`]) or from a GGUF file's
//!   `tokenizer.ggml.*` metadata ([`GgufVocab`], [`TextTokenizer::from_gguf_vocab`]); streaming
//!   decoding with [`TextDecodeStream`].
//! - [`ChatTemplate`]: a model's Jinja chat template, rendered the way transformers'
//!   `apply_chat_template` renders it.
//!
//! ```text
//! TextTokenizer::from_file(path)                  // tokenizer.json (+ tokenizer_config.json beside it)
//! TextTokenizer::from_gguf_vocab(&GgufVocab)      // GGUF metadata
//!     .encode(text, add_special_tokens) -> Result<Vec<u32>>
//!     .decode(ids, skip_special_tokens) -> Result<String>
//!     .decode_stream(skip_special_tokens) -> TextDecodeStream   // .step(id) -> Result<Option<String>>
//!     .token_to_id(s) / .id_to_token(id) / .vocab_size()
//!     .bos_id() / .eos_id() -> Option<u32>, .stop_ids() -> &[u32]
//!     .chat_template() -> Result<Option<ChatTemplate>>
//! ChatTemplate::new(source, name, bos_token, eos_token)?
//!     .render(&[ChatMessage], add_generation_prompt) -> Result<String>
//! ```

mod chat;
mod gguf_vocab;
mod gpt2;
mod hf;

pub use chat::{ChatMessage, ChatTemplate};
pub use gguf_vocab::GgufVocab;
pub use gpt2::Gpt2Tokenizer;
pub use hf::{TextDecodeStream, TextTokenizer};
