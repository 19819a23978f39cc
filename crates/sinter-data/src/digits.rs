//! The bundled 8×8 handwritten digits (UCI, as shipped with scikit-learn; see
//! `data/README.md`), embedded in the binary.

use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{DataError, Result};
use crate::{push_f32, push_i64, Dataset, HostArray, HostData, InputEncoding, Split};

/// The gzipped CSV: 1,797 lines of 64 pixel values 0–16 and a label 0–9.
static DIGITS_CSV_GZ: &[u8] = include_bytes!("../../../data/digits.csv.gz");

/// The fixed seed of the train/validation permutation. Never change it: results and
/// checkpoints refer to this split.
const SPLIT_SEED: u64 = 0x0D16_1757_0001;

const PIXELS: usize = 64;
const CLASSES: usize = 10;

/// The parsed CSV, shared by both splits.
struct DigitsTable {
    /// `n * 64` pixel values scaled to [0, 1].
    pixels: Vec<f32>,
    labels: Vec<i64>,
}

/// One split of the bundled digits: inputs f32 `[1, 8, 8]` in [0, 1] (pixel / 16),
/// targets i64 `[]` (class 0–9).
///
/// The split is a fixed seeded permutation of the 1,797 CSV lines: the first 1,437 are
/// training examples, the last 360 (20%) validation.
#[derive(Clone)]
pub struct DigitsDataset {
    table: Arc<DigitsTable>,
    /// CSV line (0-based) of each example.
    rows: Vec<usize>,
}

/// The bundled digits, training or validation split.
pub fn digits(split: Split) -> Result<DigitsDataset> {
    let table = Arc::new(parse_table()?);
    let n = table.labels.len();
    let order = crate::rng::permutation(n, SPLIT_SEED);
    let n_train = n * 4 / 5;
    let rows = match split {
        Split::Train => order[..n_train].to_vec(),
        Split::Validation => order[n_train..].to_vec(),
    };
    Ok(DigitsDataset { table, rows })
}

fn bundled_path() -> PathBuf {
    PathBuf::from("<bundled>/data/digits.csv.gz")
}

fn parse_table() -> Result<DigitsTable> {
    let path = bundled_path();
    let bytes = crate::io::maybe_gunzip(DIGITS_CSV_GZ.to_vec(), &path)?;
    let text = std::str::from_utf8(&bytes).map_err(|e| DataError::Malformed {
        format: "digits CSV",
        path: path.clone(),
        detail: format!("not UTF-8 text ({e}); the bundled copy is damaged: rebuild sinter"),
    })?;
    let mut pixels = Vec::with_capacity(1797 * PIXELS);
    let mut labels = Vec::with_capacity(1797);
    for (line_no, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |detail: String| DataError::Malformed {
            format: "digits CSV",
            path: path.clone(),
            detail: format!("line {}: {detail}", line_no + 1),
        };
        let mut count = 0;
        for (col, field) in line.split(',').enumerate() {
            count += 1;
            let v: u32 = field
                .trim()
                .parse()
                .map_err(|_| bad(format!("field {} is {field:?}, not an integer", col + 1)))?;
            if col < PIXELS {
                if v > 16 {
                    return Err(bad(format!("pixel {} is {v}, outside 0–16", col + 1)));
                }
                pixels.push(v as f32 / 16.0);
            } else if col == PIXELS {
                if v as usize >= CLASSES {
                    return Err(DataError::OutOfRange {
                        format: "digits CSV",
                        path: path.clone(),
                        what: "label",
                        index: labels.len(),
                        value: v as u64,
                        limit: CLASSES as u64,
                        hint: "the bundled copy is damaged: rebuild sinter".into(),
                    });
                }
                labels.push(v as i64);
            }
        }
        if count != PIXELS + 1 {
            return Err(bad(format!("{count} fields where 65 were expected")));
        }
    }
    if labels.is_empty() {
        return Err(DataError::Malformed {
            format: "digits CSV",
            path,
            detail: "no examples".into(),
        });
    }
    Ok(DigitsTable { pixels, labels })
}

impl DigitsDataset {
    /// The 0-based line of the bundled CSV that example `index` comes from.
    pub fn source_index(&self, index: usize) -> usize {
        self.rows[index]
    }
}

impl Dataset for DigitsDataset {
    fn input_encoding(&self) -> InputEncoding {
        InputEncoding::Image {
            pixel_max: 16.0,
            mean: vec![0.0],
            std: vec![1.0],
        }
    }
    fn class_names(&self) -> Option<Vec<String>> {
        Some((0..10).map(|d| d.to_string()).collect())
    }

    fn len(&self) -> usize {
        self.rows.len()
    }

    fn get(&self, index: usize) -> (HostArray, HostArray) {
        let r = self.rows[index];
        let x = self.table.pixels[r * PIXELS..(r + 1) * PIXELS].to_vec();
        (
            HostArray::f32(vec![1, 8, 8], x),
            HostArray::i64(vec![], vec![self.table.labels[r]]),
        )
    }

    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        let r = self.rows[index];
        push_f32(
            inputs,
            self.table.pixels[r * PIXELS..(r + 1) * PIXELS]
                .iter()
                .copied(),
        );
        push_i64(targets, std::iter::once(self.table.labels[r]));
    }

    fn input_shape(&self) -> Vec<usize> {
        vec![1, 8, 8]
    }

    fn target_shape(&self) -> Vec<usize> {
        vec![]
    }

    fn num_classes(&self) -> Option<usize> {
        Some(CLASSES)
    }
}
