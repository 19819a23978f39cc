//! Naming a data set on the command line: `digits`, `shakespeare`, `mnist:DIR`,
//! `cifar10:DIR`, `text:FILE`, `tokens:FILE_OR_DIR`.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use crate::error::{DataError, Result};
use crate::text::Windows;
use crate::tokens::GPT2_VOCAB_SIZE;
use crate::{Dataset, Split};

/// Whether a data set is for classification or language modelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataKind {
    /// Images with a class label (digits, MNIST, CIFAR-10).
    Classification,
    /// Token windows for next-token prediction (text, tokens).
    LanguageModel,
}

/// A data set named on the command line.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DataSpec {
    /// The bundled 8×8 digits.
    Digits,
    /// The bundled tiny Shakespeare, as bytes.
    Shakespeare,
    /// MNIST IDX files in a directory.
    Mnist(PathBuf),
    /// CIFAR-10 binary batches in a directory.
    Cifar10(PathBuf),
    /// Any file, as bytes.
    Text(PathBuf),
    /// An llm.c token file (split 90/10) or a directory of `*train*.bin` / `*val*.bin`.
    Tokens(PathBuf),
}

/// Settings for opening a [`DataSpec`]; see [`DataSpec::open_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenOptions {
    /// Context length `T` of language-model windows (ignored for image data).
    pub context_len: usize,
    /// Vocabulary size for `tokens:` data (`None`: [`GPT2_VOCAB_SIZE`]). Text is always 256.
    pub vocab_size: Option<usize>,
    /// Window mode for language-model data.
    pub windows: Windows,
}

impl OpenOptions {
    /// Sliding windows of `context_len`, default vocabulary.
    pub fn new(context_len: usize) -> Self {
        OpenOptions {
            context_len,
            vocab_size: None,
            windows: Windows::Sliding,
        }
    }
}

impl DataSpec {
    /// Parses `digits`, `shakespeare`, `mnist:DIR`, `cifar10:DIR`, `text:FILE` or
    /// `tokens:FILE_OR_DIR` (names are case-insensitive; the path is everything after the
    /// first colon). Anything else is a [`DataError::UnknownSpec`] listing the valid forms.
    pub fn parse(s: &str) -> Result<Self> {
        let unknown = |reason: &str| DataError::UnknownSpec {
            spec: s.to_string(),
            reason: reason.to_string(),
        };
        let trimmed = s.trim();
        let (name, path) = match trimmed.split_once(':') {
            Some((n, p)) => (n.trim().to_ascii_lowercase(), Some(p)),
            None => (trimmed.to_ascii_lowercase(), None),
        };
        let needs_path = |p: Option<&str>| -> Result<PathBuf> {
            match p {
                Some(p) if !p.trim().is_empty() => Ok(PathBuf::from(p.trim())),
                _ => Err(unknown(&format!("\"{name}\" needs a path after the colon"))),
            }
        };
        match name.as_str() {
            "digits" | "shakespeare" if path.is_some() => Err(unknown(&format!(
                "\"{name}\" is bundled and takes no path; use text:FILE for your own text"
            ))),
            "digits" => Ok(DataSpec::Digits),
            "shakespeare" => Ok(DataSpec::Shakespeare),
            "mnist" => Ok(DataSpec::Mnist(needs_path(path)?)),
            "cifar10" | "cifar-10" => Ok(DataSpec::Cifar10(needs_path(path)?)),
            "text" => Ok(DataSpec::Text(needs_path(path)?)),
            "tokens" => Ok(DataSpec::Tokens(needs_path(path)?)),
            "" => Err(unknown("no name given")),
            other => Err(unknown(&format!("\"{other}\" is not a known data set"))),
        }
    }

    /// Classification (images) or language model (text, tokens).
    pub fn kind(&self) -> DataKind {
        match self {
            DataSpec::Digits | DataSpec::Mnist(_) | DataSpec::Cifar10(_) => {
                DataKind::Classification
            }
            DataSpec::Shakespeare | DataSpec::Text(_) | DataSpec::Tokens(_) => {
                DataKind::LanguageModel
            }
        }
    }

    /// Opens `split` with sliding windows of `context_len` (ignored for image data) and the
    /// default vocabulary.
    pub fn open(&self, split: Split, context_len: usize) -> Result<Arc<dyn Dataset>> {
        self.open_with(split, &OpenOptions::new(context_len))
    }

    /// Opens `split` with explicit [`OpenOptions`].
    pub fn open_with(&self, split: Split, opts: &OpenOptions) -> Result<Arc<dyn Dataset>> {
        if self.kind() == DataKind::LanguageModel && opts.context_len == 0 {
            return Err(DataError::Config(format!(
                "context length is 0 for {self}; use a context length of at least 1"
            )));
        }
        Ok(match self {
            DataSpec::Digits => Arc::new(crate::digits(split)?),
            DataSpec::Mnist(p) => Arc::new(crate::mnist(p, split)?),
            DataSpec::Cifar10(p) => Arc::new(crate::cifar10(p, split)?),
            DataSpec::Shakespeare => {
                Arc::new(crate::shakespeare(split, opts.context_len)?.with_windows(opts.windows))
            }
            DataSpec::Text(p) => {
                Arc::new(crate::text(p, split, opts.context_len)?.with_windows(opts.windows))
            }
            DataSpec::Tokens(p) => Arc::new(
                crate::tokens(
                    p,
                    split,
                    opts.context_len,
                    opts.vocab_size.unwrap_or(GPT2_VOCAB_SIZE),
                )?
                .with_windows(opts.windows),
            ),
        })
    }
}

/// Opens `spec`'s `split` as a dataset; see [`DataSpec::open`].
pub fn open(spec: &DataSpec, split: Split, context_len: usize) -> Result<Arc<dyn Dataset>> {
    spec.open(split, context_len)
}

impl FromStr for DataSpec {
    type Err = DataError;

    fn from_str(s: &str) -> Result<Self> {
        DataSpec::parse(s)
    }
}

impl fmt::Display for DataSpec {
    /// The form [`DataSpec::parse`] reads back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DataSpec::Digits => f.write_str("digits"),
            DataSpec::Shakespeare => f.write_str("shakespeare"),
            DataSpec::Mnist(p) => write!(f, "mnist:{}", p.display()),
            DataSpec::Cifar10(p) => write!(f, "cifar10:{}", p.display()),
            DataSpec::Text(p) => write!(f, "text:{}", p.display()),
            DataSpec::Tokens(p) => write!(f, "tokens:{}", p.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::VALID_FORMS;

    #[test]
    fn parses_every_form_and_round_trips() {
        let cases = [
            ("digits", DataSpec::Digits),
            ("shakespeare", DataSpec::Shakespeare),
            ("mnist:/d/mnist", DataSpec::Mnist("/d/mnist".into())),
            ("cifar10:rel/c", DataSpec::Cifar10("rel/c".into())),
            ("text:a:b.txt", DataSpec::Text("a:b.txt".into())),
            ("tokens:/x/y.bin", DataSpec::Tokens("/x/y.bin".into())),
        ];
        for (s, want) in cases {
            let got = DataSpec::parse(s).unwrap();
            assert_eq!(got, want);
            assert_eq!(DataSpec::parse(&got.to_string()).unwrap(), want);
        }
        assert_eq!(DataSpec::parse(" Digits ").unwrap(), DataSpec::Digits);
        assert_eq!(
            "MNIST:d".parse::<DataSpec>().unwrap(),
            DataSpec::Mnist("d".into())
        );
    }

    #[test]
    fn kinds() {
        assert_eq!(DataSpec::Digits.kind(), DataKind::Classification);
        assert_eq!(
            DataSpec::Cifar10("x".into()).kind(),
            DataKind::Classification
        );
        assert_eq!(DataSpec::Mnist("x".into()).kind(), DataKind::Classification);
        assert_eq!(DataSpec::Shakespeare.kind(), DataKind::LanguageModel);
        assert_eq!(DataSpec::Text("x".into()).kind(), DataKind::LanguageModel);
        assert_eq!(DataSpec::Tokens("x".into()).kind(), DataKind::LanguageModel);
    }

    #[test]
    fn rejects_unknown_and_incomplete_specs() {
        for bad in [
            "imagenet",
            "",
            "mnist",
            "mnist:",
            "text:  ",
            "digits:/x",
            "foo:bar",
        ] {
            let err = DataSpec::parse(bad).unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, DataError::UnknownSpec { .. }), "{bad}: {msg}");
            assert!(msg.contains(VALID_FORMS), "{bad}: {msg}");
            assert!(msg.contains(&format!("\"{bad}\"")), "{bad}: {msg}");
        }
    }
}
