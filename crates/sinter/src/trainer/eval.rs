//! Validation: loss (and accuracy for classifiers) over the validation data, in order.

use anyhow::Result;
use sinter_core::cpu::hot_workers::HotWorkers;
use sinter_core::no_grad;
use sinter_data::DataLoader;

use super::batch::{batch_seed, prepare, EVAL_STEP};
use super::Setup;

#[derive(Clone, Copy, Debug)]
pub struct EvalResult {
    pub loss: f64,
    pub accuracy: Option<f64>,
    /// Examples evaluated.
    pub examples: usize,
    /// Batches evaluated, of `total_batches` in the validation data.
    pub batches: usize,
    pub total_batches: usize,
}

impl EvalResult {
    /// ", val accuracy 97.50%" for classifiers, else "".
    pub fn accuracy_text(&self) -> String {
        self.accuracy
            .map(|a| format!(", val accuracy {:.2}%", a * 100.0))
            .unwrap_or_default()
    }

    /// "all 45 validation batches", "40 of 1,742 validation batches" or "the only
    /// validation batch".
    pub fn coverage(&self) -> String {
        match (self.batches, self.total_batches) {
            (1, 1) => "the only validation batch".into(),
            (b, t) if b == t => format!("all {} validation batches", thousands(t)),
            (b, t) => format!("{} of {} validation batches", thousands(b), thousands(t)),
        }
    }
}

/// 1742 → "1,742".
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Number of correct predictions in a batch of classifier logits.
fn count_correct(logits: &sinter_core::Tensor, targets: &sinter_core::Tensor) -> Result<usize> {
    // eq gives bools; their sum is the i64 count, reduced where the logits live.
    Ok(logits
        .argmax(-1, false)?
        .eq(targets)?
        .sum_all()?
        .to_vec_i64()?[0] as usize)
}

/// Validation loss (and accuracy) over up to `max_batches` batches (0 = all), in order.
pub fn evaluate(s: &Setup, max_batches: usize) -> Result<EvalResult> {
    Ok(evaluate_until(s, max_batches, || false)?.expect("never interrupted"))
}

/// [`evaluate`], asking `stop` before each batch: `None` when it said yes (a run asked to stop
/// writes its checkpoint now instead of after a pass over all the validation data, which
/// can take minutes; a partial loss is not comparable with the others, so none is returned).
pub fn evaluate_until(
    s: &Setup,
    max_batches: usize,
    stop: impl Fn() -> bool,
) -> Result<Option<EvalResult>> {
    let device = sinter_nn::module_device(s.model.as_ref())?;
    let _g = no_grad();
    let _hot = HotWorkers::engage();
    s.model.set_training(false);
    let bs = s.config.batch_size.max(1);
    let mut loader = DataLoader::new(s.val.clone(), bs, false, false, 0);
    let total_batches = loader.batches_per_epoch() as usize;
    let n = match max_batches {
        0 => total_batches,
        m => total_batches.min(m),
    };
    let (mut total, mut correct, mut count) = (0f64, 0usize, 0usize);
    for i in 0..n {
        if stop() {
            s.model.set_training(true);
            return Ok(None);
        }
        let b = loader.next_batch()?;
        let rows = b.inputs.shape[0];
        let host = prepare(s, b, batch_seed(s.config.seed, EVAL_STEP, i as u64, 0))?;
        let (x, y) = s.model.place_batch(&host, device)?;
        let out = {
            let _autocast =
                sinter_nn::PrecisionMode::parse(&s.config.precision).and_then(|m| m.autocast());
            s.model.loss(&x, &y)?
        };
        total += out.loss.to_scalar_f32()? as f64 * rows as f64;
        if let Some(logits) = &out.logits {
            correct += count_correct(logits, &y)?;
        }
        count += rows;
    }
    s.model.set_training(true);
    let count_f = count.max(1) as f64;
    Ok(Some(EvalResult {
        loss: total / count_f,
        accuracy: (s.task == sinter_models::Task::Classification).then(|| correct as f64 / count_f),
        examples: count,
        batches: n,
        total_batches,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coverage_reads_like_english() {
        let of = |batches, total_batches| {
            EvalResult {
                loss: 1.0,
                accuracy: None,
                examples: 1,
                batches,
                total_batches,
            }
            .coverage()
        };
        assert_eq!(of(40, 1742), "40 of 1,742 validation batches");
        assert_eq!(of(1742, 1742), "all 1,742 validation batches");
        assert_eq!(of(1, 1), "the only validation batch");
        assert_eq!(of(2, 6), "2 of 6 validation batches");
        assert_eq!(
            of(1_000_000, 2_000_000),
            "1,000,000 of 2,000,000 validation batches"
        );
    }
}
