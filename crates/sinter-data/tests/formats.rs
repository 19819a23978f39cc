//! File formats: digits, MNIST, CIFAR-10, text, token files and data specs, including
//! malformed inputs.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::path::Path;

use flate2::write::GzEncoder;
use flate2::Compression;
use sinter_data::{
    cifar10, digits, mnist, read_tokens, shakespeare, text, tokens, write_tokens, DataError,
    DataKind, DataSpec, Dataset, OpenOptions, Split, Windows, CIFAR10_MEAN, CIFAR10_STD,
    MNIST_MEAN, MNIST_STD, TOKENS_MAGIC,
};

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn close(a: f32, b: f32) -> bool {
    (a - b).abs() < 1e-5
}

/// Asserts `err`'s message mentions `path` and returns the message.
fn names_file(err: &DataError, path: &Path) -> String {
    let msg = err.to_string();
    assert!(
        msg.contains(&path.display().to_string()),
        "message does not name {}: {msg}",
        path.display()
    );
    msg
}

// ---------------------------------------------------------------- digits

#[test]
fn digits_split_values_and_first_line() {
    let train = digits(Split::Train).unwrap();
    let val = digits(Split::Validation).unwrap();
    assert_eq!(train.len(), 1437);
    assert_eq!(val.len(), 360);
    assert_eq!(train.input_shape(), vec![1, 8, 8]);
    assert_eq!(train.target_shape(), Vec::<usize>::new());
    assert_eq!(train.num_classes(), Some(10));

    // The two splits partition the 1,797 lines.
    let rows: HashSet<usize> = (0..train.len())
        .map(|i| train.source_index(i))
        .chain((0..val.len()).map(|i| val.source_index(i)))
        .collect();
    assert_eq!(rows, (0..1797).collect::<HashSet<_>>());
    // The split is fixed.
    let again = digits(Split::Validation).unwrap();
    assert!((0..360).all(|i| again.source_index(i) == val.source_index(i)));

    let mut labels_seen = HashSet::new();
    for ds in [&train, &val] {
        for i in 0..ds.len() {
            let (x, y) = ds.get(i);
            assert_eq!(x.shape, vec![1, 8, 8]);
            assert_eq!(y.shape, Vec::<usize>::new());
            assert!(x
                .data
                .as_f32()
                .unwrap()
                .iter()
                .all(|&v| (0.0..=1.0).contains(&v)));
            let l = y.data.as_i64().unwrap()[0];
            assert!((0..10).contains(&l));
            labels_seen.insert(l);
        }
    }
    assert_eq!(labels_seen.len(), 10);

    // The example from CSV line 0 equals that line / 16.
    let mut csv = String::new();
    flate2::read::GzDecoder::new(
        &include_bytes!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../data/digits.csv.gz"
        ))[..],
    )
    .read_to_string(&mut csv)
    .unwrap();
    let first: Vec<f32> = csv
        .lines()
        .next()
        .unwrap()
        .split(',')
        .map(|f| f.parse::<f32>().unwrap())
        .collect();
    let (ds, i) = (0..train.len())
        .find(|&i| train.source_index(i) == 0)
        .map(|i| (&train, i))
        .or_else(|| {
            (0..val.len())
                .find(|&i| val.source_index(i) == 0)
                .map(|i| (&val, i))
        })
        .unwrap();
    let (x, y) = ds.get(i);
    let want: Vec<f32> = first[..64].iter().map(|v| v / 16.0).collect();
    assert_eq!(x.data.as_f32().unwrap(), want.as_slice());
    assert_eq!(y.data.as_i64().unwrap()[0], first[64] as i64);
}

// ---------------------------------------------------------------- MNIST

fn idx_images(n: u32, rows: u32, cols: u32, pixels: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    for h in [2051, n, rows, cols] {
        v.extend_from_slice(&h.to_be_bytes());
    }
    v.extend_from_slice(pixels);
    v
}

fn idx_labels(labels: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&2049u32.to_be_bytes());
    v.extend_from_slice(&(labels.len() as u32).to_be_bytes());
    v.extend_from_slice(labels);
    v
}

/// 5 images of 28×28; image i has every pixel = 50·i, except pixel 0 which is 255.
fn mnist_pixels(n: usize) -> Vec<u8> {
    let mut p = Vec::new();
    for i in 0..n {
        let mut img = vec![(50 * i) as u8; 784];
        img[0] = 255;
        p.extend_from_slice(&img);
    }
    p
}

fn write_mnist(dir: &Path, prefix: &str, gz: bool, labels: &[u8]) {
    let n = labels.len();
    let imgs = idx_images(n as u32, 28, 28, &mnist_pixels(n));
    let lbls = idx_labels(labels);
    let (imgs, lbls, ext) = if gz {
        (gzip(&imgs), gzip(&lbls), ".gz")
    } else {
        (imgs, lbls, "")
    };
    std::fs::write(dir.join(format!("{prefix}-images-idx3-ubyte{ext}")), imgs).unwrap();
    std::fs::write(dir.join(format!("{prefix}-labels-idx1-ubyte{ext}")), lbls).unwrap();
}

fn check_mnist(ds: &dyn Dataset, labels: &[u8]) {
    assert_eq!(ds.len(), labels.len());
    assert_eq!(ds.input_shape(), vec![1, 28, 28]);
    assert_eq!(ds.num_classes(), Some(10));
    for (i, &l) in labels.iter().enumerate() {
        let (x, y) = ds.get(i);
        let x = x.data.as_f32().unwrap();
        assert_eq!(x.len(), 784);
        assert!(close(x[0], (1.0 - MNIST_MEAN) / MNIST_STD));
        let v = (50 * i) as f32 / 255.0;
        assert!(close(x[500], (v - MNIST_MEAN) / MNIST_STD));
        assert_eq!(y.data.as_i64().unwrap(), &[l as i64]);
    }
}

#[test]
fn mnist_raw_and_gzip() {
    let dir = tempfile::tempdir().unwrap();
    write_mnist(dir.path(), "train", false, &[3, 1, 4, 1, 5]);
    write_mnist(dir.path(), "t10k", true, &[9, 2, 6]);
    check_mnist(&mnist(dir.path(), Split::Train).unwrap(), &[3, 1, 4, 1, 5]);
    check_mnist(&mnist(dir.path(), Split::Validation).unwrap(), &[9, 2, 6]);

    // Gzip is detected by content: a compressed file without .gz is still read.
    let other = tempfile::tempdir().unwrap();
    write_mnist(other.path(), "train", true, &[0, 7]);
    for kind in ["images-idx3", "labels-idx1"] {
        std::fs::rename(
            other.path().join(format!("train-{kind}-ubyte.gz")),
            other.path().join(format!("train-{kind}-ubyte")),
        )
        .unwrap();
    }
    check_mnist(&mnist(other.path(), Split::Train).unwrap(), &[0, 7]);
}

#[test]
fn mnist_truncated_files_are_errors() {
    for gz in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        write_mnist(dir.path(), "train", false, &[1, 2, 3]);
        let mut imgs = idx_images(3, 28, 28, &mnist_pixels(3));
        imgs.truncate(1000);
        let name = if gz {
            std::fs::remove_file(dir.path().join("train-images-idx3-ubyte")).unwrap();
            "train-images-idx3-ubyte.gz"
        } else {
            "train-images-idx3-ubyte"
        };
        let path = dir.path().join(name);
        std::fs::write(&path, if gz { gzip(&imgs) } else { imgs }).unwrap();
        let err = mnist(dir.path(), Split::Train).err().unwrap();
        assert!(matches!(err, DataError::Truncated { .. }), "{err}");
        let msg = names_file(&err, &path);
        assert!(msg.contains("3 images of 28×28 (2368 bytes)"), "{msg}");
        assert!(msg.contains("1000 bytes"), "{msg}");
    }

    // A file shorter than the header.
    let dir = tempfile::tempdir().unwrap();
    write_mnist(dir.path(), "train", false, &[1]);
    let path = dir.path().join("train-labels-idx1-ubyte");
    std::fs::write(&path, [0, 0, 8]).unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::Truncated { .. }), "{err}");
    names_file(&err, &path);
}

#[test]
fn mnist_bad_magic_corrupt_gzip_and_mismatches() {
    // Images and labels swapped.
    let dir = tempfile::tempdir().unwrap();
    write_mnist(dir.path(), "train", false, &[1, 2]);
    let path = dir.path().join("train-images-idx3-ubyte");
    std::fs::write(&path, idx_labels(&[1, 2])).unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(
        matches!(
            err,
            DataError::BadMagic {
                found: 2049,
                expected: 2051,
                ..
            }
        ),
        "{err}"
    );
    assert!(names_file(&err, &path).contains("labels file"));

    // Corrupt gzip: damage the compressed body.
    let dir = tempfile::tempdir().unwrap();
    write_mnist(dir.path(), "t10k", true, &[1, 2, 3]);
    let path = dir.path().join("t10k-images-idx3-ubyte.gz");
    let mut gz = std::fs::read(&path).unwrap();
    let mid = gz.len() / 2;
    for b in &mut gz[mid..mid + 8] {
        *b ^= 0xA5;
    }
    std::fs::write(&path, &gz).unwrap();
    let err = mnist(dir.path(), Split::Validation).err().unwrap();
    assert!(matches!(err, DataError::CorruptGzip { .. }), "{err}");
    names_file(&err, &path);

    // Gzip cut short.
    let path = dir.path().join("t10k-images-idx3-ubyte.gz");
    let good = gzip(&idx_images(3, 28, 28, &mnist_pixels(3)));
    std::fs::write(&path, &good[..good.len() - 10]).unwrap();
    let err = mnist(dir.path(), Split::Validation).err().unwrap();
    assert!(matches!(err, DataError::CorruptGzip { .. }), "{err}");

    // Label count differs from image count.
    let dir = tempfile::tempdir().unwrap();
    write_mnist(dir.path(), "train", false, &[1, 2, 3]);
    std::fs::write(
        dir.path().join("train-labels-idx1-ubyte"),
        idx_labels(&[1, 2]),
    )
    .unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("2 labels"), "{err}");

    // Label out of range.
    std::fs::write(
        dir.path().join("train-labels-idx1-ubyte"),
        idx_labels(&[1, 10, 3]),
    )
    .unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(
        matches!(
            err,
            DataError::OutOfRange {
                value: 10,
                index: 1,
                ..
            }
        ),
        "{err}"
    );

    // Extra bytes after the data.
    let path = dir.path().join("train-images-idx3-ubyte");
    let mut imgs = idx_images(3, 28, 28, &mnist_pixels(3));
    imgs.push(0);
    std::fs::write(&path, imgs).unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::Malformed { .. }), "{err}");
    names_file(&err, &path);
}

#[test]
fn mnist_missing_files() {
    let dir = tempfile::tempdir().unwrap();
    let err = mnist(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::NotFound { .. }), "{err}");
    let msg = names_file(&err, dir.path());
    assert!(msg.contains("train-images-idx3-ubyte.gz"), "{msg}");

    let missing = dir.path().join("nope");
    let err = mnist(&missing, Split::Train).err().unwrap();
    assert!(matches!(err, DataError::NotFound { .. }), "{err}");
    names_file(&err, &missing);
}

// ---------------------------------------------------------------- CIFAR-10

/// A record whose R plane is all `10·k`, G plane `255`, B plane `0`, label `k % 10`.
fn cifar_record(k: usize) -> Vec<u8> {
    let mut r = vec![(k % 10) as u8];
    r.extend(std::iter::repeat_n((10 * k) as u8, 1024));
    r.extend(std::iter::repeat_n(255u8, 1024));
    r.extend(std::iter::repeat_n(0u8, 1024));
    r
}

fn write_cifar(dir: &Path) {
    let mut k = 0;
    for b in 1..=5 {
        let mut bytes = Vec::new();
        for _ in 0..2 {
            bytes.extend(cifar_record(k));
            k += 1;
        }
        std::fs::write(dir.join(format!("data_batch_{b}.bin")), bytes).unwrap();
    }
    let test: Vec<u8> = (0..3).flat_map(|j| cifar_record(20 + j)).collect();
    std::fs::write(dir.join("test_batch.bin"), gzip(&test)).unwrap();
}

#[test]
fn cifar10_reads_and_normalises() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar(dir.path());
    let train = cifar10(dir.path(), Split::Train).unwrap();
    let val = cifar10(dir.path(), Split::Validation).unwrap();
    assert_eq!(train.len(), 10);
    assert_eq!(val.len(), 3, "gzip-compressed test batch is read too");
    assert_eq!(train.input_shape(), vec![3, 32, 32]);
    for (ds, offset) in [(&train, 0), (&val, 20)] {
        for i in 0..ds.len() {
            let k = offset + i;
            let (x, y) = ds.get(i);
            let x = x.data.as_f32().unwrap();
            assert_eq!(x.len(), 3072);
            let r = (10 * k) as f32 / 255.0;
            assert!(close(x[5], (r - CIFAR10_MEAN[0]) / CIFAR10_STD[0]));
            assert!(close(x[1024 + 7], (1.0 - CIFAR10_MEAN[1]) / CIFAR10_STD[1]));
            assert!(close(
                x[2048 + 1023],
                (0.0 - CIFAR10_MEAN[2]) / CIFAR10_STD[2]
            ));
            assert_eq!(y.data.as_i64().unwrap(), &[(k % 10) as i64]);
        }
    }

    // The archive's own sub-folder is found.
    let outer = tempfile::tempdir().unwrap();
    let inner = outer.path().join("cifar-10-batches-bin");
    std::fs::create_dir(&inner).unwrap();
    write_cifar(&inner);
    assert_eq!(cifar10(outer.path(), Split::Train).unwrap().len(), 10);
}

#[test]
fn cifar10_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    write_cifar(dir.path());
    let path = dir.path().join("data_batch_3.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(3073 + 100);
    std::fs::write(&path, &bytes).unwrap();
    let err = cifar10(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::Truncated { .. }), "{err}");
    let msg = names_file(&err, &path);
    assert!(
        msg.contains("3173 bytes") && msg.contains("100 stray bytes"),
        "{msg}"
    );

    // Label out of range.
    let mut rec = cifar_record(0);
    rec[0] = 11;
    std::fs::write(&path, &rec).unwrap();
    let err = cifar10(dir.path(), Split::Train).err().unwrap();
    assert!(
        matches!(err, DataError::OutOfRange { value: 11, .. }),
        "{err}"
    );
    names_file(&err, &path);

    // Missing file.
    std::fs::remove_file(&path).unwrap();
    let err = cifar10(dir.path(), Split::Train).err().unwrap();
    assert!(matches!(err, DataError::NotFound { .. }), "{err}");
    names_file(&err, &path);

    // Corrupt gzip.
    let path = dir.path().join("test_batch.bin");
    let mut gz = std::fs::read(&path).unwrap();
    let n = gz.len();
    gz[n - 5] ^= 0xFF; // in the CRC/length trailer
    std::fs::write(&path, &gz).unwrap();
    let err = cifar10(dir.path(), Split::Validation).err().unwrap();
    assert!(matches!(err, DataError::CorruptGzip { .. }), "{err}");
    names_file(&err, &path);
}

// ---------------------------------------------------------------- text

#[test]
fn shakespeare_windows_are_shifted_by_one() {
    let bytes = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../data/tinyshakespeare.txt"
    ))
    .unwrap();
    let t = 16;
    let train = shakespeare(Split::Train, t).unwrap();
    let val = shakespeare(Split::Validation, t).unwrap();
    let cut = bytes.len() * 9 / 10;
    assert_eq!(train.len(), cut - t);
    assert_eq!(val.len(), bytes.len() - cut - t);
    assert_eq!(train.num_classes(), Some(256));
    assert_eq!(train.input_shape(), vec![t]);
    assert_eq!(train.target_shape(), vec![t]);
    for (ds, base) in [(&train, 0), (&val, cut)] {
        for i in [0, 1, 777, ds.len() - 1] {
            let (x, y) = ds.get(i);
            let x = x.data.as_i64().unwrap();
            let y = y.data.as_i64().unwrap();
            assert_eq!(x[1..], y[..t - 1]);
            let want: Vec<i64> = bytes[base + i..base + i + t + 1]
                .iter()
                .map(|&b| b as i64)
                .collect();
            assert_eq!(x, &want[..t]);
            assert_eq!(y, &want[1..]);
        }
    }

    // Evaluation windows: non-overlapping, stride T.
    let eval = val.clone().with_windows(Windows::Strided);
    assert_eq!(eval.len(), (bytes.len() - cut - 1) / t);
    let (x0, _) = eval.get(0);
    let (x1, _) = eval.get(1);
    let (_, y_last) = eval.get(eval.len() - 1);
    assert_eq!(x0.data.as_i64().unwrap()[t - 1], bytes[cut + t - 1] as i64);
    assert_eq!(x1.data.as_i64().unwrap()[0], bytes[cut + t] as i64);
    assert!(eval.window_start(eval.len() - 1) + t < val.tokens().len());
    assert_eq!(y_last.data.as_i64().unwrap().len(), t);
}

#[test]
fn text_file_and_too_short() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.txt");
    let content: Vec<u8> = (0..100u8).collect();
    std::fs::write(&path, &content).unwrap();
    let train = text(&path, Split::Train, 4).unwrap();
    let val = text(&path, Split::Validation, 4).unwrap();
    assert_eq!(
        train.tokens(),
        &content[..90]
            .iter()
            .map(|&b| u32::from(b))
            .collect::<Vec<_>>()[..]
    );
    assert_eq!(val.tokens().len(), 10);
    assert_eq!(val.len(), 6);
    let (x, y) = val.get(5);
    assert_eq!(x.data.as_i64().unwrap(), &[95, 96, 97, 98]);
    assert_eq!(y.data.as_i64().unwrap(), &[96, 97, 98, 99]);

    let err = text(&path, Split::Validation, 10).err().unwrap();
    assert!(matches!(err, DataError::Config(_)), "{err}");
    names_file(&err, &path);

    let missing = dir.path().join("missing.txt");
    let err = text(&missing, Split::Train, 4).err().unwrap();
    assert!(matches!(err, DataError::NotFound { .. }), "{err}");
    names_file(&err, &missing);
}

// ---------------------------------------------------------------- token files

#[test]
fn token_file_round_trip_and_split() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tok.bin");
    let toks: Vec<u16> = (0..1000u32).map(|i| ((i * 7919) % 50257) as u16).collect();
    write_tokens(&path, &toks).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 1024 + 2000);
    assert_eq!(&bytes[..4], &TOKENS_MAGIC.to_le_bytes());
    assert_eq!(&bytes[8..12], &1000i32.to_le_bytes());
    assert_eq!(read_tokens(&path).unwrap(), toks);
    // No temporary files left behind.
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(names.len(), 1);
    // Overwriting works.
    write_tokens(&path, &toks[..10]).unwrap();
    assert_eq!(read_tokens(&path).unwrap(), &toks[..10]);
    write_tokens(&path, &toks).unwrap();

    let train = tokens(&path, Split::Train, 8, 50257).unwrap();
    let val = tokens(&path, Split::Validation, 8, 50257).unwrap();
    let wide: Vec<u32> = toks.iter().map(|&t| u32::from(t)).collect();
    assert_eq!(train.tokens(), &wide[..900]);
    assert_eq!(val.tokens(), &wide[900..]);
    assert_eq!(train.len(), 892);
    assert_eq!(train.num_classes(), Some(50257));
    let (x, y) = val.get(3);
    let want: Vec<i64> = toks[903..912].iter().map(|&t| t as i64).collect();
    assert_eq!(x.data.as_i64().unwrap(), &want[..8]);
    assert_eq!(y.data.as_i64().unwrap(), &want[1..]);

    // Tokens must be below the vocabulary size.
    let err = tokens(&path, Split::Train, 8, 1000).err().unwrap();
    assert!(
        matches!(err, DataError::OutOfRange { what: "token", .. }),
        "{err}"
    );
    names_file(&err, &path);
}

#[test]
fn token_directory_uses_llm_c_names() {
    let dir = tempfile::tempdir().unwrap();
    write_tokens(dir.path().join("shakes_train_000002.bin"), &[3, 4, 5]).unwrap();
    write_tokens(dir.path().join("shakes_train_000001.bin"), &[0, 1, 2]).unwrap();
    write_tokens(dir.path().join("shakes_val_000000.bin"), &[9, 8, 7, 6]).unwrap();
    std::fs::write(dir.path().join("README.txt"), "not data").unwrap();
    let train = tokens(dir.path(), Split::Train, 2, 10).unwrap();
    assert_eq!(train.tokens(), &[0, 1, 2, 3, 4, 5]);
    assert_eq!(train.len(), 4);
    let val = tokens(dir.path(), Split::Validation, 2, 10).unwrap();
    assert_eq!(val.tokens(), &[9, 8, 7, 6]);

    let empty = tempfile::tempdir().unwrap();
    let err = tokens(empty.path(), Split::Validation, 2, 10)
        .err()
        .unwrap();
    assert!(matches!(err, DataError::NotFound { .. }), "{err}");
    assert!(names_file(&err, empty.path()).contains("*val*.bin"));
}

#[test]
fn token_file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.bin");
    write_tokens(&path, &[1, 2, 3, 4, 5]).unwrap();
    let good = std::fs::read(&path).unwrap();

    // Truncated data.
    std::fs::write(&path, &good[..good.len() - 3]).unwrap();
    let err = read_tokens(&path).unwrap_err();
    assert!(matches!(err, DataError::Truncated { .. }), "{err}");
    let msg = names_file(&err, &path);
    assert!(
        msg.contains("5 tokens (1034 bytes)") && msg.contains("1031 bytes"),
        "{msg}"
    );

    // Truncated header.
    std::fs::write(&path, &good[..100]).unwrap();
    let err = read_tokens(&path).unwrap_err();
    assert!(matches!(err, DataError::Truncated { .. }), "{err}");

    // Bad magic.
    let mut bad = good.clone();
    bad[0] ^= 1;
    std::fs::write(&path, &bad).unwrap();
    let err = read_tokens(&path).unwrap_err();
    assert!(matches!(err, DataError::BadMagic { .. }), "{err}");
    names_file(&err, &path);

    // Unsupported version.
    let mut bad = good.clone();
    bad[4] = 2;
    std::fs::write(&path, &bad).unwrap();
    let err = read_tokens(&path).unwrap_err();
    assert!(matches!(err, DataError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("version 2"), "{err}");

    // Trailing garbage.
    let mut bad = good.clone();
    bad.extend_from_slice(&[0, 0]);
    std::fs::write(&path, &bad).unwrap();
    let err = read_tokens(&path).unwrap_err();
    assert!(matches!(err, DataError::Malformed { .. }), "{err}");

    // Writing into a missing directory fails cleanly.
    let err = write_tokens(dir.path().join("no/such/dir/x.bin"), &[1]).unwrap_err();
    assert!(matches!(err, DataError::Write { .. }), "{err}");
}

// ---------------------------------------------------------------- specs

#[test]
fn specs_open_datasets() {
    let d = DataSpec::parse("digits").unwrap();
    assert_eq!(d.kind(), DataKind::Classification);
    let ds = sinter_data::open(&d, Split::Validation, 0).unwrap();
    assert_eq!(ds.len(), 360);
    assert_eq!(ds.num_classes(), Some(10));

    let s = DataSpec::parse("shakespeare").unwrap();
    assert_eq!(s.kind(), DataKind::LanguageModel);
    let ds = s.open(Split::Train, 32).unwrap();
    assert_eq!(ds.input_shape(), vec![32]);
    assert_eq!(ds.num_classes(), Some(256));
    let opts = OpenOptions {
        windows: Windows::Strided,
        ..OpenOptions::new(32)
    };
    let strided = s.open_with(Split::Train, &opts).unwrap();
    assert_eq!(strided.len(), ds.len().div_ceil(32));
    assert!(matches!(
        s.open(Split::Train, 0).err().unwrap(),
        DataError::Config(_)
    ));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.bin");
    write_tokens(&path, &(0..100).collect::<Vec<u16>>()).unwrap();
    let spec = DataSpec::parse(&format!("tokens:{}", path.display())).unwrap();
    let ds = spec.open(Split::Train, 4).unwrap();
    assert_eq!(ds.num_classes(), Some(50257));
    let small = spec
        .open_with(
            Split::Train,
            &OpenOptions {
                vocab_size: Some(100),
                ..OpenOptions::new(4)
            },
        )
        .unwrap();
    assert_eq!(small.num_classes(), Some(100));

    let missing = dir.path().join("mnist");
    let spec = DataSpec::parse(&format!("mnist:{}", missing.display())).unwrap();
    let err = spec.open(Split::Train, 0).err().unwrap();
    names_file(&err, &missing);

    let err = DataSpec::parse("imagenet:/data").unwrap_err();
    let msg = err.to_string();
    for form in [
        "digits",
        "shakespeare",
        "mnist:",
        "cifar10:",
        "text:",
        "tokens:",
    ] {
        assert!(msg.contains(form), "{msg}");
    }
}

#[test]
fn token_ids_past_16_bits_are_kept() {
    // Llama 3 and Qwen vocabularies (128k, 152k) exceed u16: ids pass through unchanged.
    let vocab = 151_936;
    let toks: Vec<u32> = (0..200u32)
        .map(|i| (i * 7_919 + 65_000) % 151_936)
        .collect();
    let train =
        sinter_data::split_dataset(toks.clone(), Split::Train, 4, vocab, Path::new("<test>"))
            .unwrap();
    assert_eq!(train.num_classes(), Some(vocab));
    let (x, y) = train.get(7);
    let want =
        |from: usize| -> Vec<i64> { toks[from..from + 4].iter().map(|&t| t as i64).collect() };
    assert_eq!(x.data.as_i64().unwrap(), &want(7)[..]);
    assert_eq!(y.data.as_i64().unwrap(), &want(8)[..]);
    assert!(toks[7..12].iter().any(|&t| t > 65_535));
    // An id at or past the vocabulary is refused.
    let mut bad = toks;
    bad[3] = vocab as u32;
    assert!(sinter_data::split_dataset(bad, Split::Train, 4, vocab, Path::new("<test>")).is_err());
}
