//! Property tests: every loader takes any bytes — random, or a valid file cut short or with
//! bytes flipped — and gives data or an error, never a panic. Cases are bounded (64 per
//! property) so the suite stays fast.

use std::path::Path;

use proptest::prelude::*;
use sinter_data::{
    cifar10, mnist, read_tokens, text, tokens, write_tokens, DataLoader, Dataset, Split,
};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        ..ProptestConfig::default()
    }
}

/// Reads every example of a dataset that opened (the loader must not panic on what it
/// accepted either).
fn touch(d: &dyn Dataset) {
    for i in 0..d.len().min(8) {
        let _ = d.get(i);
    }
}

/// An IDX header for `dims` of u8 data (`magic` 0x0000_0803 for images, 0x0000_0801 for labels).
fn idx(dims: &[u32], body: &[u8]) -> Vec<u8> {
    let mut v = vec![0, 0, 8, dims.len() as u8];
    for d in dims {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.extend_from_slice(body);
    v
}

/// `bytes` with `cut` bytes removed from the end and the byte at `flip` (if any) inverted.
fn damage(mut bytes: Vec<u8>, cut: usize, flip: Option<usize>) -> Vec<u8> {
    bytes.truncate(bytes.len().saturating_sub(cut));
    if let Some(i) = flip {
        if !bytes.is_empty() {
            let i = i % bytes.len();
            bytes[i] = !bytes[i];
        }
    }
    bytes
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).unwrap();
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn idx_files_never_panic(
        n in 0u32..4,
        rows in 0u32..30,
        cut in 0usize..40,
        flip in proptest::option::of(0usize..4000),
        junk in proptest::collection::vec(any::<u8>(), 0..64),
        random in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (images, labels) = if random {
            (junk.clone(), junk.iter().rev().copied().collect())
        } else {
            let body = vec![7u8; (n * rows * 28) as usize];
            (
                damage(idx(&[n, rows, 28], &body), cut, flip),
                damage(idx(&[n], &vec![3u8; n as usize]), cut / 4, flip),
            )
        };
        write(dir.path(), "train-images-idx3-ubyte", &images);
        write(dir.path(), "train-labels-idx1-ubyte", &labels);
        if let Ok(d) = mnist(dir.path(), Split::Train) {
            touch(&d);
        }
    }

    #[test]
    fn cifar_batches_never_panic(
        records in 0usize..3,
        cut in 0usize..3100,
        label in any::<u8>(),
        junk in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = Vec::new();
        for _ in 0..records {
            bytes.push(label);
            bytes.extend(std::iter::repeat_n(128u8, 3072));
        }
        bytes.truncate(bytes.len().saturating_sub(cut));
        bytes.extend_from_slice(&junk);
        write(dir.path(), "test_batch.bin", &bytes);
        if let Ok(d) = cifar10(dir.path(), Split::Validation) {
            touch(&d);
        }
    }

    #[test]
    fn token_files_never_panic(
        toks in proptest::collection::vec(any::<u16>(), 0..300),
        cut in 0usize..64,
        flip in proptest::option::of(0usize..1000),
        context in 0usize..40,
        vocab in 0usize..70000,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.bin");
        write_tokens(&p, &toks).unwrap();
        let bytes = damage(std::fs::read(&p).unwrap(), cut, flip);
        std::fs::write(&p, &bytes).unwrap();
        let _ = read_tokens(&p);
        for split in [Split::Train, Split::Validation] {
            if let Ok(d) = tokens(&p, split, context, vocab) {
                touch(&d);
                if d.len() > 0 {
                    let mut l = DataLoader::new(std::sync::Arc::new(d), 2, true, false, 1);
                    let _ = l.next_batch();
                }
            }
        }
    }

    #[test]
    fn text_files_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..400),
        context in 0usize..64,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.txt");
        std::fs::write(&p, &bytes).unwrap();
        for split in [Split::Train, Split::Validation] {
            if let Ok(d) = text(&p, split, context) {
                touch(&d);
            }
        }
    }
}
