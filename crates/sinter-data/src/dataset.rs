//! What every data set is: the [`Dataset`] trait and the host arrays its examples come in.

/// Which part of a data set: the training part or the held-out validation part.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Split {
    /// The training examples.
    Train,
    /// The held-out examples.
    Validation,
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Split::Train => "train",
            Split::Validation => "validation",
        })
    }
}

/// The element type of a [`HostData`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HostDType {
    /// 32-bit float.
    F32,
    /// 64-bit signed integer (class labels, token ids).
    I64,
}

/// The elements of a host array.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    /// Floats (image pixels).
    F32(Vec<f32>),
    /// Integers (class labels, token ids).
    I64(Vec<i64>),
}

impl HostData {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::I64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type.
    pub fn dtype(&self) -> HostDType {
        match self {
            HostData::F32(_) => HostDType::F32,
            HostData::I64(_) => HostDType::I64,
        }
    }

    /// The floats, if this is `F32`.
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self {
            HostData::F32(v) => Some(v),
            HostData::I64(_) => None,
        }
    }

    /// The integers, if this is `I64`.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self {
            HostData::I64(v) => Some(v),
            HostData::F32(_) => None,
        }
    }

    /// Appends `other`'s elements. Returns `false` (and appends nothing) if the element
    /// types differ.
    pub fn extend_from(&mut self, other: &HostData) -> bool {
        match (self, other) {
            (HostData::F32(a), HostData::F32(b)) => a.extend_from_slice(b),
            (HostData::I64(a), HostData::I64(b)) => a.extend_from_slice(b),
            _ => return false,
        }
        true
    }

    /// Reserves room for `additional` more elements.
    pub fn reserve(&mut self, additional: usize) {
        match self {
            HostData::F32(v) => v.reserve(additional),
            HostData::I64(v) => v.reserve(additional),
        }
    }
}

/// A row-major array in host memory: a shape and its elements.
#[derive(Clone, Debug, PartialEq)]
pub struct HostArray {
    /// The dimensions; `[]` is a scalar.
    pub shape: Vec<usize>,
    /// The elements, `shape.iter().product()` of them.
    pub data: HostData,
}

impl HostArray {
    /// An f32 array.
    pub fn f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        HostArray {
            shape,
            data: HostData::F32(data),
        }
    }

    /// An i64 array.
    pub fn i64(shape: Vec<usize>, data: Vec<i64>) -> Self {
        HostArray {
            shape,
            data: HostData::I64(data),
        }
    }

    /// The number of elements the shape calls for.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// How raw inputs become a dataset's example inputs, so a model trained on it can be run on
/// new inputs (an image file, a prompt) without the data set.
#[derive(Clone, Debug, PartialEq)]
pub enum InputEncoding {
    /// Images `[c, h, w]`: `x = (pixel / pixel_max − mean[c]) / std[c]`.
    Image {
        /// The largest raw pixel value (16 for the bundled digits, 255 for 8-bit images).
        pixel_max: f32,
        /// Per-channel mean subtracted (after scaling to 0–1).
        mean: Vec<f32>,
        /// Per-channel standard deviation divided out.
        std: Vec<f32>,
    },
    /// Text as bytes: one token per byte (vocabulary 256).
    Bytes,
    /// Text as GPT-2 BPE token ids ([`Gpt2Tokenizer`](crate::Gpt2Tokenizer)).
    Gpt2Tokens,
    /// Not known (token files of another tokenizer).
    Unspecified,
}

/// A random-access collection of `(input, target)` examples.
///
/// Implementations must be cheap to call from a background thread (`Send + Sync`) and
/// every example of one dataset must have the same shapes and element types.
pub trait Dataset: Send + Sync {
    /// Number of examples.
    fn len(&self) -> usize;

    /// Whether there are no examples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `index` as `(input, target)`, shaped [`input_shape`](Self::input_shape) and
    /// [`target_shape`](Self::target_shape).
    ///
    /// # Panics
    /// If `index >= self.len()` (a caller bug, not bad data).
    fn get(&self, index: usize) -> (HostArray, HostArray);

    /// The shape of one example's input.
    fn input_shape(&self) -> Vec<usize>;

    /// The shape of one example's target (`[]` for a class label).
    fn target_shape(&self) -> Vec<usize>;

    /// For classifiers the number of classes; for language models the vocabulary size.
    fn num_classes(&self) -> Option<usize>;

    /// How raw inputs become this dataset's inputs.
    fn input_encoding(&self) -> InputEncoding {
        InputEncoding::Unspecified
    }

    /// The classes' names, by class id, where the data names them.
    fn class_names(&self) -> Option<Vec<String>> {
        None
    }

    /// Appends example `index`'s elements to `inputs` and `targets` (used to build batches
    /// without per-example allocation). The default calls [`get`](Self::get); datasets
    /// override it to write in place.
    ///
    /// # Panics
    /// If `index >= self.len()`.
    fn append_example(&self, index: usize, inputs: &mut HostData, targets: &mut HostData) {
        let (x, y) = self.get(index);
        inputs.extend_from(&x.data);
        targets.extend_from(&y.data);
    }
}

/// Pushes `values` onto an `F32` buffer (no-op on the wrong type; the loader's size check
/// then reports the mismatch).
pub(crate) fn push_f32(buf: &mut HostData, values: impl Iterator<Item = f32>) {
    if let HostData::F32(v) = buf {
        v.extend(values);
    }
}

/// Pushes `values` onto an `I64` buffer (no-op on the wrong type).
pub(crate) fn push_i64(buf: &mut HostData, values: impl Iterator<Item = i64>) {
    if let HostData::I64(v) = buf {
        v.extend(values);
    }
}
