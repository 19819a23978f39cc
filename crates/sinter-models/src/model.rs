//! What a trainer needs from a model beyond `forward`: its task, how a loader batch becomes
//! the model's inputs and targets, and its loss. Each model implements [`Model`] once, so a
//! trainer never looks at the concrete type.

use sinter_core::{Device, Result, Tensor};
use sinter_nn::Module;

/// Label of positions a loss ignores (PyTorch's and Hugging Face's convention).
pub const IGNORE_INDEX: i64 = -100;

/// What a model consumes and produces, so the trainer knows how to feed and score it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Task {
    /// f32 images [n, c, h, w] → logits [n, classes].
    Classification,
    /// i64 tokens [n, t] → logits [n, t, vocab].
    LanguageModel,
    /// i64 tokens [n, t] with some replaced by a mask token → logits [n, t, vocab + 1],
    /// scored at the masked positions only (BERT's pre-training). It reads the same token
    /// data as `LanguageModel`; the mask token is the id one past the data's vocabulary.
    MaskedLm,
}

impl Task {
    /// Whether examples are token sequences (throughput is then counted in tokens).
    pub fn is_sequence(self) -> bool {
        matches!(self, Task::LanguageModel | Task::MaskedLm)
    }
}

/// The loss of one batch.
pub struct BatchLoss {
    /// The mean loss over the batch's scored positions (a scalar, differentiable).
    pub loss: Tensor,
    /// Classifiers: the logits `[n, classes]`, from which the trainer counts correct answers.
    pub logits: Option<Tensor>,
}

/// A trainable model: a [`Module`] that knows its task and computes its own loss. `Any`, so
/// that a loaded `Box<dyn Model>` can be taken back as its concrete type (`serve` owns a `Decoder`).
pub trait Model: Module + std::any::Any {
    /// What the model consumes and produces.
    fn task(&self) -> Task;

    /// Turns a host batch from the data loader (inputs, targets) into the model's inputs and
    /// targets, still on the host. `seed` seeds whatever the recipe draws at random (BERT's
    /// masks), so a resumed run prepares its batches exactly as an uninterrupted one did. The
    /// default keeps the batch as it is.
    fn prepare_batch(
        &self,
        inputs: Tensor,
        targets: Tensor,
        seed: u64,
    ) -> Result<(Tensor, Tensor)> {
        let _ = seed;
        Ok((inputs, targets))
    }

    /// Moves a prepared batch to `device`. The default moves both tensors.
    fn place_batch(&self, batch: &(Tensor, Tensor), device: Device) -> Result<(Tensor, Tensor)> {
        Ok((batch.0.to_device(device)?, batch.1.to_device(device)?))
    }

    /// The loss of a prepared, placed batch.
    fn loss(&self, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss>;
}

/// Cross-entropy of a classifier's logits `[n, classes]` against class labels `[n]`.
pub fn classifier_loss(model: &dyn Module, inputs: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
    let logits = model.forward(inputs)?;
    Ok(BatchLoss {
        loss: logits.cross_entropy(targets, IGNORE_INDEX)?,
        logits: Some(logits),
    })
}

/// Mean cross-entropy of sequence logits `[.., vocab]` against targets of the leading shape
/// (positions at [`IGNORE_INDEX`] are not scored).
pub fn sequence_loss(logits: &Tensor, targets: &Tensor) -> Result<BatchLoss> {
    let v = *logits.shape().last().unwrap_or(&1);
    let n = targets.numel();
    let targets = targets.reshape(&[n])?.to_device(logits.device())?;
    Ok(BatchLoss {
        loss: logits
            .reshape(&[n, v])?
            .cross_entropy(&targets, IGNORE_INDEX)?,
        logits: None,
    })
}
