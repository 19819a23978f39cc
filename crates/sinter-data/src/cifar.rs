//! CIFAR-10 in its binary format (`cifar-10-batches-bin`).

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::io::{check_dir, read_file, size_note};
use crate::{push_f32, push_i64, Dataset, HostArray, HostData, InputEncoding, Split};

/// Per-channel (R, G, B) mean of the CIFAR-10 training pixels scaled to [0, 1].
pub const CIFAR10_MEAN: [f32; 3] = [0.4914, 0.4822, 0.4465];
/// The CIFAR-10 classes, by label.
pub const CIFAR10_CLASSES: [&str; 10] = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
];
/// Per-channel (R, G, B) standard deviation of the CIFAR-10 training pixels.
pub const CIFAR10_STD: [f32; 3] = [0.2470, 0.2435, 0.2616];

const FORMAT: &str = "CIFAR-10";
const PIXELS: usize = 3 * 32 * 32;
const RECORD: usize = 1 + PIXELS;
const CLASSES: usize = 10;

/// One split of CIFAR-10: inputs f32 `[3, 32, 32]` (R, G, B planes) normalised per channel
/// with [`CIFAR10_MEAN`] / [`CIFAR10_STD`], targets i64 `[]` (class 0–9).
pub struct Cifar10Dataset {
    /// All records of all files, back to back: 1 label byte + 3072 pixel bytes each.
    records: Vec<u8>,
    len: usize,
    lut: Box<[[f32; 256]; 3]>,
    files: Vec<PathBuf>,
}

/// Reads CIFAR-10 from `dir`: `data_batch_1.bin` … `data_batch_5.bin` for [`Split::Train`],
/// `test_batch.bin` for [`Split::Validation`]. If `dir` holds a `cifar-10-batches-bin`
/// folder (as the archive unpacks), the files are read from there. Gzip-compressed files
/// are decompressed (detected by content).
pub fn cifar10(dir: impl AsRef<Path>, split: Split) -> Result<Cifar10Dataset> {
    let mut dir = dir.as_ref().to_path_buf();
    check_dir(&dir, "CIFAR-10")?;
    let nested = dir.join("cifar-10-batches-bin");
    if nested.is_dir() && !dir.join("test_batch.bin").exists() {
        dir = nested;
    }
    let names: Vec<String> = match split {
        Split::Train => (1..=5).map(|i| format!("data_batch_{i}.bin")).collect(),
        Split::Validation => vec!["test_batch.bin".to_string()],
    };
    let mut records = Vec::new();
    let mut files = Vec::new();
    for name in &names {
        let path = dir.join(name);
        if !path.is_file() {
            return Err(DataError::NotFound {
                what: format!("CIFAR-10 {split} file {name}"),
                path,
                hint: "download and unpack cifar-10-binary.tar.gz (the binary version) \
                       into that directory"
                    .into(),
            });
        }
        let (bytes, gz) = read_file(&path, &format!("CIFAR-10 {split} file"))?;
        check_file(&bytes, &path, gz)?;
        records.extend_from_slice(&bytes);
        files.push(path);
    }
    let len = records.len() / RECORD;
    let mut lut = Box::new([[0f32; 256]; 3]);
    for (c, table) in lut.iter_mut().enumerate() {
        for (v, slot) in table.iter_mut().enumerate() {
            *slot = (v as f32 / 255.0 - CIFAR10_MEAN[c]) / CIFAR10_STD[c];
        }
    }
    Ok(Cifar10Dataset {
        records,
        len,
        lut,
        files,
    })
}

fn check_file(bytes: &[u8], path: &Path, gz: bool) -> Result<()> {
    let len = bytes.len();
    if len == 0 {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: "the file is empty".into(),
        });
    }
    if !len.is_multiple_of(RECORD) {
        let cifar100 = if len.is_multiple_of(RECORD + 1) {
            " (its length fits CIFAR-100's 3074-byte records, which are not supported)"
        } else {
            ""
        };
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "it has {}, which is {} whole 3073-byte records (1 label + 3072 pixels) \
                 and {} stray bytes{cifar100}",
                size_note(len, gz),
                len / RECORD,
                len % RECORD
            ),
        });
    }
    for (i, rec) in bytes.chunks_exact(RECORD).enumerate() {
        if rec[0] as usize >= CLASSES {
            return Err(DataError::OutOfRange {
                format: FORMAT,
                path: path.to_path_buf(),
                what: "label",
                index: i,
                value: rec[0] as u64,
                limit: CLASSES as u64,
                hint: "the file is corrupt or not a CIFAR-10 binary batch: re-download it".into(),
            });
        }
    }
    Ok(())
}

impl Cifar10Dataset {
    /// The files this split was read from, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn record(&self, index: usize) -> &[u8] {
        assert!(
            index < self.len,
            "index {index} out of range ({})",
            self.len
        );
        &self.records[index * RECORD..(index + 1) * RECORD]
    }

    fn normalised<'a>(&'a self, rec: &'a [u8]) -> impl Iterator<Item = f32> + 'a {
        rec[1..]
            .iter()
            .enumerate()
            .map(move |(i, &p)| self.lut[i / 1024][p as usize])
    }
}

impl Dataset for Cifar10Dataset {
    fn input_encoding(&self) -> InputEncoding {
        InputEncoding::Image {
            pixel_max: 255.0,
            mean: CIFAR10_MEAN.to_vec(),
            std: CIFAR10_STD.to_vec(),
        }
    }
    fn class_names(&self) -> Option<Vec<String>> {
        Some(CIFAR10_CLASSES.iter().map(|c| c.to_string()).collect())
    }

    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> (HostArray, HostArray) {
        let rec = self.record(index);
        (
            HostArray::f32(vec![3, 32, 32], self.normalised(rec).collect()),
            HostArray::i64(vec![], vec![rec[0] as i64]),
        )
    }

    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        let rec = self.record(index);
        push_f32(inputs, self.normalised(rec));
        push_i64(targets, std::iter::once(rec[0] as i64));
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![3, 32, 32]
    }

    fn target_shape(&self) -> Vec<usize> {
        vec![]
    }

    fn num_classes(&self) -> Option<usize> {
        Some(CLASSES)
    }
}
