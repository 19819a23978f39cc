//! MNIST in its original IDX format, raw or gzip-compressed.

use std::path::{Path, PathBuf};

use crate::error::{DataError, Result};
use crate::io::{be_u32, find_first, mul_u64, read_file, size_note};
use crate::{push_f32, push_i64, Dataset, HostArray, HostData, InputEncoding, Split};

/// The mean pixel value of the MNIST training set (after scaling to [0, 1]).
pub const MNIST_MEAN: f32 = 0.1307;
/// The standard deviation of the MNIST training pixels (after scaling to [0, 1]).
pub const MNIST_STD: f32 = 0.3081;

const IMAGES_MAGIC: u32 = 2051;
const LABELS_MAGIC: u32 = 2049;
const CLASSES: usize = 10;
const FORMAT: &str = "MNIST";
const HINT: &str = "download train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, \
     t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz into that directory";

/// One split of MNIST: inputs f32 `[1, rows, cols]` (`[1, 28, 28]` for MNIST itself)
/// normalised as `(x / 255 − 0.1307) / 0.3081`, targets i64 `[]` (class 0–9).
pub struct MnistDataset {
    /// The whole decompressed images file; pixels start at byte 16.
    images: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
    lut: Box<[f32; 256]>,
    images_path: PathBuf,
}

/// Reads MNIST from `dir`: `train-images-idx3-ubyte` / `train-labels-idx1-ubyte` for
/// [`Split::Train`], `t10k-…` for [`Split::Validation`], each optionally with `.gz` (the
/// content decides whether it is decompressed, not the name; the `…ubyte` ↔ `….idx3-ubyte`
/// spelling is accepted too).
pub fn mnist(dir: impl AsRef<Path>, split: Split) -> Result<MnistDataset> {
    let dir = dir.as_ref();
    let (prefix, role) = match split {
        Split::Train => ("train", "training"),
        Split::Validation => ("t10k", "test"),
    };
    let candidates = |kind: &str, idx: &str| -> Vec<String> {
        let mut v = Vec::new();
        for sep in ['-', '.'] {
            let base = format!("{prefix}-{kind}{sep}{idx}-ubyte");
            v.push(base.clone());
            v.push(format!("{base}.gz"));
        }
        v
    };
    let images_path = find_first(
        dir,
        &candidates("images", "idx3"),
        &format!("MNIST {role} images"),
        HINT,
    )?;
    let labels_path = find_first(
        dir,
        &candidates("labels", "idx1"),
        &format!("MNIST {role} labels"),
        HINT,
    )?;
    let (images, gz) = read_file(&images_path, &format!("MNIST {role} images"))?;
    let (n, rows, cols) = check_images(&images, &images_path, gz)?;
    let (labels_file, gz) = read_file(&labels_path, &format!("MNIST {role} labels"))?;
    let n_labels = check_labels(&labels_file, &labels_path, gz)?;
    if n_labels != n {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: labels_path.clone(),
            detail: format!(
                "it has {n_labels} labels but {} has {n} images; the two files come from \
                 different downloads: re-download both",
                images_path.display()
            ),
        });
    }
    let labels = labels_file[8..].to_vec();
    if let Some((i, &l)) = labels
        .iter()
        .enumerate()
        .find(|(_, &l)| l as usize >= CLASSES)
    {
        return Err(DataError::OutOfRange {
            format: FORMAT,
            path: labels_path,
            what: "label",
            index: i,
            value: l as u64,
            limit: CLASSES as u64,
            hint: "the file is corrupt or not an MNIST labels file: re-download it".into(),
        });
    }
    let mut lut = Box::new([0f32; 256]);
    for (v, slot) in lut.iter_mut().enumerate() {
        *slot = (v as f32 / 255.0 - MNIST_MEAN) / MNIST_STD;
    }
    Ok(MnistDataset {
        images,
        labels,
        rows,
        cols,
        lut,
        images_path,
    })
}

fn magic_hint(found: u32, expected: u32) -> String {
    match (found, expected) {
        (LABELS_MAGIC, IMAGES_MAGIC) => {
            "this is a labels file where an images file was expected: check the file names".into()
        }
        (IMAGES_MAGIC, LABELS_MAGIC) => {
            "this is an images file where a labels file was expected: check the file names".into()
        }
        _ => "the file is corrupt or not an MNIST IDX file: re-download it".into(),
    }
}

/// Validates an IDX3 images file; returns (count, rows, cols).
fn check_images(bytes: &[u8], path: &Path, gz: bool) -> Result<(usize, usize, usize)> {
    let magic = if bytes.len() >= 4 {
        be_u32(bytes, 0)
    } else {
        IMAGES_MAGIC
    };
    if magic != IMAGES_MAGIC {
        return Err(DataError::BadMagic {
            format: FORMAT,
            path: path.to_path_buf(),
            found: magic as u64,
            expected: IMAGES_MAGIC as u64,
            hint: magic_hint(magic, IMAGES_MAGIC),
        });
    }
    if bytes.len() < 16 {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "an images file needs a 16-byte header but it has {}",
                size_note(bytes.len(), gz)
            ),
        });
    }
    let (n, rows, cols) = (be_u32(bytes, 4), be_u32(bytes, 8), be_u32(bytes, 12));
    if rows == 0 || cols == 0 {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "the header says images are {rows}×{cols}; the file is corrupt: re-download it"
            ),
        });
    }
    let expected = mul_u64(n as u64, rows as u64)
        .and_then(|x| mul_u64(x, cols as u64))
        .and_then(|x| x.checked_add(16));
    let actual = bytes.len() as u64;
    match expected {
        Some(e) if e == actual => Ok((n as usize, rows as usize, cols as usize)),
        Some(e) if e > actual => Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {n} images of {rows}×{cols} ({e} bytes) but the file has {}",
                size_note(bytes.len(), gz)
            ),
        }),
        _ => Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {n} images of {rows}×{cols} ({} bytes) but the file has {}; \
                 it is corrupt: re-download it",
                expected.map_or("too many".to_string(), |e| e.to_string()),
                size_note(bytes.len(), gz)
            ),
        }),
    }
}

/// Validates an IDX1 labels file; returns the count.
fn check_labels(bytes: &[u8], path: &Path, gz: bool) -> Result<usize> {
    let magic = if bytes.len() >= 4 {
        be_u32(bytes, 0)
    } else {
        LABELS_MAGIC
    };
    if magic != LABELS_MAGIC {
        return Err(DataError::BadMagic {
            format: FORMAT,
            path: path.to_path_buf(),
            found: magic as u64,
            expected: LABELS_MAGIC as u64,
            hint: magic_hint(magic, LABELS_MAGIC),
        });
    }
    if bytes.len() < 8 {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "a labels file needs an 8-byte header but it has {}",
                size_note(bytes.len(), gz)
            ),
        });
    }
    let n = be_u32(bytes, 4) as u64;
    let expected = n + 8;
    let actual = bytes.len() as u64;
    if expected > actual {
        return Err(DataError::Truncated {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {n} labels ({expected} bytes) but the file has {}",
                size_note(bytes.len(), gz)
            ),
        });
    }
    if expected < actual {
        return Err(DataError::Malformed {
            format: FORMAT,
            path: path.to_path_buf(),
            detail: format!(
                "header says {n} labels ({expected} bytes) but the file has {}; \
                 it is corrupt: re-download it",
                size_note(bytes.len(), gz)
            ),
        });
    }
    Ok(n as usize)
}

impl MnistDataset {
    /// The images file this split was read from.
    pub fn images_path(&self) -> &Path {
        &self.images_path
    }

    fn pixels(&self, index: usize) -> &[u8] {
        let size = self.rows * self.cols;
        let start = 16 + index * size;
        &self.images[start..start + size]
    }
}

impl Dataset for MnistDataset {
    fn input_encoding(&self) -> InputEncoding {
        InputEncoding::Image {
            pixel_max: 255.0,
            mean: vec![MNIST_MEAN],
            std: vec![MNIST_STD],
        }
    }
    fn class_names(&self) -> Option<Vec<String>> {
        Some((0..10).map(|d| d.to_string()).collect())
    }

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> (HostArray, HostArray) {
        let x = self
            .pixels(index)
            .iter()
            .map(|&p| self.lut[p as usize])
            .collect();
        (
            HostArray::f32(self.input_shape(), x),
            HostArray::i64(vec![], vec![self.labels[index] as i64]),
        )
    }

    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        push_f32(
            inputs,
            self.pixels(index).iter().map(|&p| self.lut[p as usize]),
        );
        push_i64(targets, std::iter::once(self.labels[index] as i64));
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![1, self.rows, self.cols]
    }

    fn target_shape(&self) -> Vec<usize> {
        vec![]
    }

    fn num_classes(&self) -> Option<usize> {
        Some(CLASSES)
    }
}
