//! `sinter bench int8`: the int8 model beside the f32 one, in one process, timings interleaved.
//!
//!     sinter bench int8 --checkpoint DIR      # a trained model: accuracy, speed, size
//!     sinter bench int8 --model gpt2          # random weights (no data): speed and agreement
//!     sinter bench int8 --linear              # nn::Linear vs QuantizedLinear, GPT-2 shapes
//!
//! Rows: nn::Linear (f32) against QuantizedLinear at GPT-2 124M's shapes (768→2304, 768→3072,
//! 3072→768) for 1, 8 and 64 rows; for classifiers, validation accuracy and loss and forward
//! throughput at batch 1 and 256; for language models, validation loss, greedy generation speed
//! with the KV cache, the share of greedy tokens the two models agree on (free running, and
//! teacher-forced on the f32 model's text; averaged over `--prompts` prompts, as one prompt's
//! figure is only where its first near-tie fell) and how close the logits are; and the bytes of the
//! weights. The int8 model is quantized in memory from the same weights (as `sinter quantize`
//! would write it). Each timing is the median of `--rounds` rounds of about `--secs` seconds,
//! f32 and int8 alternating; `--json FILE` writes the numbers for scripts (bench/vs-torch).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::{json, Value};
use sinter_core::{no_grad, DType, Device, Rng, Tensor};
use sinter_models::{DataShape, Decoder, Task};
use sinter_nn::module::shared_rng;
use sinter_nn::quant::{self, ActTerms, QuantizeOptions, QuantizedLinear};
use sinter_nn::{Linear, Module};

use crate::quantize_cmd::{self, QuantizeChoices};
use crate::trainer;

#[derive(Args)]
pub struct Int8BenchArgs {
    /// A trained f32 checkpoint (run directory or file).
    #[arg(long, conflicts_with = "model")]
    pub checkpoint: Option<PathBuf>,
    /// Or a model with random weights and no data (gpt-tiny, gpt2, mlp, cnn, resnet18, …).
    #[arg(long)]
    pub model: Option<String>,
    /// The Linear layer rows (nn::Linear vs QuantizedLinear at GPT-2 124M's shapes).
    #[arg(long)]
    pub linear: bool,
    /// Validation batches for accuracy (0: all).
    #[arg(long, default_value_t = 0)]
    pub eval_batches: usize,
    /// Tokens generated per measurement (language models).
    #[arg(long, default_value_t = 50)]
    pub tokens: usize,
    /// Prompts (8 random tokens each) over which greedy agreement is averaged (language
    /// models; the speed rows use the first).
    #[arg(long, default_value_t = 16)]
    pub prompts: usize,
    /// How layers are quantized, as `sinter quantize` does (a random model, `--model`, is
    /// calibrated for GPTQ on random inputs drawn apart from the measured ones).
    #[command(flatten)]
    pub choices: QuantizeChoices,
    /// u8 terms per activation row of the int8 Linear layers: one, two, or auto (two for
    /// calls of a few rows, i.e. generation steps).
    #[arg(long, value_enum, default_value_t = Terms::Auto)]
    pub act_terms: Terms,
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 1.0)]
    pub secs: f64,
    #[arg(long, default_value_t = 16)]
    pub calibration_batches: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the numbers here as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl Int8BenchArgs {
    fn options(&self) -> QuantizeOptions {
        self.choices.options()
    }
    fn terms(&self) -> ActTerms {
        match self.act_terms {
            Terms::One => ActTerms::One,
            Terms::Two => ActTerms::Two,
            Terms::Auto => ActTerms::Auto,
        }
    }
}

/// `--act-terms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Terms {
    One,
    Two,
    Auto,
}

/// Seconds per call of `f`: the median over rounds of (time / calls) with ≥ `secs` each.
struct Timer {
    rounds: usize,
    secs: f64,
}

impl Timer {
    /// Times `a` and `b` alternately; returns (median a, median b) in seconds per call.
    fn pair(
        &self,
        mut a: impl FnMut() -> Result<()>,
        mut b: impl FnMut() -> Result<()>,
    ) -> Result<(f64, f64)> {
        let t = self.interleaved(&mut [&mut a, &mut b])?;
        Ok((t[0], t[1]))
    }
    /// Times each of `fs` in turn, round after round; the median seconds per call of each.
    fn interleaved(&self, fs: &mut [&mut dyn FnMut() -> Result<()>]) -> Result<Vec<f64>> {
        for f in fs.iter_mut() {
            f()?;
        }
        let mut times = vec![Vec::new(); fs.len()];
        for _ in 0..self.rounds.max(1) {
            for (f, t) in fs.iter_mut().zip(&mut times) {
                t.push(self.once(f)?);
            }
        }
        Ok(times.into_iter().map(median).collect())
    }
    fn once(&self, f: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
        let start = Instant::now();
        let mut n = 0u64;
        while n == 0 || start.elapsed().as_secs_f64() < self.secs {
            f()?;
            n += 1;
        }
        Ok(start.elapsed().as_secs_f64() / n as f64)
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

struct Report {
    md: String,
    rows: Vec<Value>,
}

impl Report {
    fn row(&mut self, what: &str, f32_v: String, int8_v: String, ratio: Option<f64>, raw: Value) {
        let r = ratio.map_or(String::new(), |r| format!("{r:.2}×"));
        let _ = writeln!(self.md, "| {what} | {f32_v} | {int8_v} | {r} |");
        self.rows.push(
            json!({ "what": what, "f32": f32_v, "int8": int8_v, "ratio": ratio, "raw": raw }),
        );
    }
}

pub fn run(a: &Int8BenchArgs) -> Result<()> {
    let timer = Timer {
        rounds: a.rounds,
        secs: a.secs,
    };
    let mut rep = Report {
        md: String::new(),
        rows: Vec::new(),
    };
    let _ = writeln!(
        rep.md,
        "## int8 vs f32 (CPU; int8 path {}, {} threads; {} rounds × {:.1} s, medians)\n",
        sinter_nn::quant::Int8Path::get(),
        rayon::current_num_threads(),
        a.rounds,
        a.secs
    );
    let _ = writeln!(
        rep.md,
        "| what | f32 | int8 | int8 / f32 |\n| --- | ---: | ---: | ---: |"
    );
    if a.linear {
        linear_rows(&timer, &mut rep)?;
    }
    match (&a.checkpoint, &a.model) {
        (Some(dir), _) => {
            let (f, _) = crate::inference::load_for_eval(dir)?;
            let (q, _) = crate::inference::load_for_eval(dir)?;
            quantize_cmd::quantize_setup(&q, a.calibration_batches, &a.options())?;
            quant::set_act_terms(q.model.as_ref(), a.terms());
            // Both as `eval` runs them: BatchNorm folded into the convolutions.
            sinter_nn::fold::fold_for_inference(f.model.as_ref())?;
            accuracy_rows(a, &mut rep, &f, &q)?;
            let pair = Pair {
                f32: f.model,
                int8: q.model,
                task: f.task,
                input: f.train.input_shape(),
                batch: f.config.batch_size,
            };
            size_row(&mut rep, &pair)?;
            speed_rows(a, &timer, &mut rep, &pair)?;
        }
        (None, Some(name)) => {
            let pair = random_pair(name, a)?;
            size_row(&mut rep, &pair)?;
            speed_rows(a, &timer, &mut rep, &pair)?;
        }
        (None, None) if a.linear => {}
        (None, None) => bail!("bench int8 needs --checkpoint DIR, --model NAME or --linear"),
    }
    println!("{}", rep.md);
    if let Some(p) = &a.json {
        let v = json!({ "int8_path": sinter_nn::quant::Int8Path::get().name(), "threads": rayon::current_num_threads(), "rows": rep.rows });
        std::fs::write(p, serde_json::to_string_pretty(&v)?)
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    Ok(())
}

fn randn(shape: &[usize], rng: &mut Rng) -> Result<Tensor> {
    Ok(Tensor::randn(
        shape,
        0.0,
        1.0,
        rng,
        DType::F32,
        Device::Cpu,
    )?)
}

/// nn::Linear in f32 against QuantizedLinear (dynamic rows, one and two u8 terms per row,
/// all three interleaved) at GPT-2 124M's shapes. (The default, `auto`, is two terms for up
/// to 4 rows and one above.)
fn linear_rows(timer: &Timer, rep: &mut Report) -> Result<()> {
    let mut rng = Rng::new(1);
    let _g = no_grad();
    for (k, n, name) in [(768, 2304, "qkv"), (768, 3072, "fc"), (3072, 768, "proj")] {
        let lin = Linear::new(k, n, true, &mut rng)?;
        let one = QuantizedLinear::from_f32(&lin.weight, lin.bias.as_ref())?
            .with_act_terms(ActTerms::One);
        let two = one.clone().with_act_terms(ActTerms::Two);
        for rows in [1, 8, 64] {
            let x = randn(&[rows, k], &mut rng)?;
            let t = timer.interleaved(&mut [
                &mut || lin.forward(&x).map(|_| ()).map_err(Into::into),
                &mut || one.forward(&x).map(|_| ()).map_err(Into::into),
                &mut || two.forward(&x).map(|_| ()).map_err(Into::into),
            ])?;
            let gops = |t: f64| 2.0 * (rows * n * k) as f64 / t / 1e9;
            for (terms, tq) in [("1 term", t[1]), ("2 terms", t[2])] {
                rep.row(
                    &format!("Linear {name} {k}→{n}, {rows} rows, {terms}"),
                    format!("{:.1} µs ({:.0} GOP/s)", t[0] * 1e6, gops(t[0])),
                    format!("{:.1} µs ({:.0} GOP/s)", tq * 1e6, gops(tq)),
                    Some(t[0] / tq),
                    json!({ "f32_s": t[0], "int8_s": tq, "act_terms": terms }),
                );
            }
        }
    }
    Ok(())
}

/// The same model in f32 and int8, with what its inputs look like.
struct Pair {
    f32: Box<dyn Module>,
    int8: Box<dyn Module>,
    task: Task,
    /// One example's shape.
    input: Vec<usize>,
    /// Sequences per batch in the forward-throughput row of sequence models.
    batch: usize,
}

/// Two copies of a named model with the same random weights, the second quantized.
fn random_pair(name: &str, a: &Int8BenchArgs) -> Result<Pair> {
    let (seed, calibration_batches) = (a.seed, a.calibration_batches);
    let task = sinter_models::task_of(name).with_context(|| {
        format!(
            "unknown model '{name}'; valid: {}",
            sinter_models::MODEL_NAMES.join(", ")
        )
    })?;
    let data = match (task, name) {
        (Task::Classification, "resnet18") => DataShape {
            input: vec![3, 32, 32],
            classes: 10,
        },
        (Task::Classification, _) => DataShape {
            input: vec![1, 8, 8],
            classes: 10,
        },
        (_, "gpt2") => DataShape {
            input: vec![1024],
            classes: 50257,
        },
        _ => DataShape {
            input: vec![64],
            classes: 256,
        },
    };
    let build = || sinter_models::build(name, &data, &mut Rng::new(seed), &shared_rng(seed));
    let (f, q) = (build()?, build()?);
    f.set_training(false);
    q.set_training(false);
    let input = data.input.clone();
    // Calibration inputs from their own generator: random examples (token ids for
    // language models), never the prompts or inputs that the rows below measure.
    quant::quantize_with(q.as_ref(), &a.options(), &mut |m: &dyn Module| {
        let _g = no_grad();
        let mut rng = Rng::new(seed ^ 7);
        for _ in 0..calibration_batches.max(1) {
            let x = match task {
                Task::Classification => {
                    let mut shape = vec![16];
                    shape.extend(&input);
                    Tensor::randn(&shape, 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)?
                }
                // 4 sequences of up to 128 tokens: 16 batches give 8192 input rows per
                // layer, more than the widest Linear's 3072 inputs (GPTQ's Gram matrix).
                Task::LanguageModel | Task::MaskedLm => {
                    let (seqs, len) = (4, input[0].min(128));
                    let ids: Vec<i64> = (0..seqs * len)
                        .map(|_| rng.below(data.classes as u64) as i64)
                        .collect();
                    Tensor::from_vec(ids, &[seqs, len], Device::Cpu)?
                }
            };
            m.forward(&x)?;
        }
        Ok(())
    })?;
    quant::set_act_terms(q.as_ref(), a.terms());
    for m in [&f, &q] {
        sinter_nn::fold::fold_for_inference(m.as_ref())?;
    }
    Ok(Pair {
        f32: f,
        int8: q,
        task,
        input: data.input,
        batch: 8,
    })
}

fn size_row(rep: &mut Report, p: &Pair) -> Result<()> {
    let f32_bytes = quantize_cmd::weight_bytes(p.f32.as_ref());
    let int8_bytes: usize = quant::export(p.int8.as_ref())?
        .iter()
        .map(|(_, t)| match t {
            quant::StateTensor::Float(t) => t.numel() * t.dtype().size_in_bytes(),
            quant::StateTensor::I8 { values, .. } => values.len(),
            quant::StateTensor::I32 { values, .. } => 4 * values.len(),
        })
        .sum();
    rep.row(
        "weights",
        format!("{:.2} MB", f32_bytes as f64 / 1e6),
        format!("{:.2} MB", int8_bytes as f64 / 1e6),
        Some(f32_bytes as f64 / int8_bytes as f64),
        json!({ "f32_bytes": f32_bytes, "int8_bytes": int8_bytes }),
    );
    Ok(())
}

fn accuracy_rows(
    a: &Int8BenchArgs,
    rep: &mut Report,
    f: &trainer::Setup,
    q: &trainer::Setup,
) -> Result<()> {
    let (ef, eq) = (
        trainer::evaluate(f, a.eval_batches)?,
        trainer::evaluate(q, a.eval_batches)?,
    );
    rep.row(
        &format!("validation loss ({} examples)", ef.examples),
        format!("{:.4}", ef.loss),
        format!("{:.4}", eq.loss),
        None,
        json!({ "f32": ef.loss, "int8": eq.loss, "relative_change": (eq.loss - ef.loss) / ef.loss }),
    );
    if let (Some(af), Some(aq)) = (ef.accuracy, eq.accuracy) {
        rep.row(
            "validation accuracy",
            format!("{:.2}%", af * 100.0),
            format!("{:.2}%", aq * 100.0),
            None,
            json!({ "f32": af, "int8": aq, "points": (aq - af) * 100.0 }),
        );
    }
    Ok(())
}

fn speed_rows(a: &Int8BenchArgs, timer: &Timer, rep: &mut Report, p: &Pair) -> Result<()> {
    let (f, q, input, batch) = (p.f32.as_ref(), p.int8.as_ref(), &p.input, p.batch);
    let _g = no_grad();
    let mut rng = Rng::new(a.seed ^ 3);
    match p.task {
        Task::Classification => {
            for b in [1, 256] {
                let mut shape = vec![b];
                shape.extend(input);
                let x = randn(&shape, &mut rng)?;
                let what = format!("forward, batch {b}");
                forward_row(timer, rep, (f, q), &x, &what, (b, "samples"))?;
            }
        }
        Task::LanguageModel => {
            let (gf, gq) = (as_gpt(f)?, as_gpt(q)?);
            // f32 at its best, as `sinter generate` runs it: weights packed for the GEMMs.
            gf.pack_weights()?;
            let vocab = gf.config.vocab_size as u64;
            let ctx = input
                .first()
                .copied()
                .unwrap_or(64)
                .min(gf.config.block_size);
            let prompt: Vec<i64> = (0..8).map(|_| rng.below(vocab) as i64).collect();
            let n = a.tokens.min(gf.config.block_size - prompt.len());
            let gen =
                |m: &Decoder| m.generate_with(&prompt, n, 0.0, 0, ctx, true, &mut Rng::new(0));
            let (tf, tq) = timer.pair(
                || gen(gf).map(|_| ()).map_err(Into::into),
                || gen(gq).map(|_| ()).map_err(Into::into),
            )?;
            rep.row(
                &format!("generate {n} tokens (greedy, KV cache)"),
                format!("{:.1} tokens/s", n as f64 / tf),
                format!("{:.1} tokens/s", n as f64 / tq),
                Some(tf / tq),
                json!({ "f32_s": tf, "int8_s": tq, "tokens": n }),
            );
            // More prompts, drawn after the first from the same generator.
            let mut prompts = vec![prompt];
            while prompts.len() < a.prompts.max(1) {
                prompts.push((0..8).map(|_| rng.below(vocab) as i64).collect());
            }
            agreement_rows(rep, (gf, gq), &prompts, n, ctx)?;
            let ids = Tensor::from_slice(&vec![1i64; batch * ctx], &[batch, ctx], Device::Cpu)?;
            let what = format!("forward {batch}×{ctx} tokens");
            forward_row(timer, rep, (f, q), &ids, &what, (batch * ctx, "tokens"))?;
        }
        Task::MaskedLm => {
            let ctx = input.first().copied().unwrap_or(64);
            let ids = Tensor::from_slice(&vec![1i64; batch * ctx], &[batch, ctx], Device::Cpu)?;
            let what = format!("forward {batch}×{ctx} tokens");
            forward_row(timer, rep, (f, q), &ids, &what, (batch * ctx, "tokens"))?;
        }
    }
    Ok(())
}

/// Greedy agreement of the int8 model with the f32 one over `prompts`, `n` new tokens each:
/// free running (both generate; the share of positions with the same token, whose mean over
/// prompts is the figure, and where they first differ) and teacher-forced (both read the f32
/// model's text; the share of positions whose top-1 agrees), with what decides it: the f32
/// model's top-1/top-2 logit gaps and the int8 error in that gap.
fn agreement_rows(
    rep: &mut Report,
    (gf, gq): (&Decoder, &Decoder),
    prompts: &[Vec<i64>],
    n: usize,
    ctx: usize,
) -> Result<()> {
    let v = gf.config.vocab_size;
    let (mut free, mut first, mut flips, mut positions) = (Vec::new(), Vec::new(), 0, 0);
    let (mut gaps, mut gap_err, mut err2, mut ref2) = (Vec::new(), Vec::new(), 0f64, 0f64);
    for prompt in prompts {
        let gen = |m: &Decoder| m.generate_with(prompt, n, 0.0, 0, ctx, true, &mut Rng::new(0));
        let (sf, sq) = (gen(gf)?, gen(gq)?);
        let (new_f, new_q) = (&sf[prompt.len()..], &sq[prompt.len()..]);
        let same = new_f.iter().zip(new_q).filter(|(x, y)| x == y).count();
        free.push(same as f64 / n.max(1) as f64);
        first.push(
            new_f
                .iter()
                .zip(new_q)
                .position(|(x, y)| x != y)
                .unwrap_or(n),
        );
        let ids = Tensor::from_slice(&sf[..sf.len() - 1], &[1, sf.len() - 1], Device::Cpu)?;
        let (lf, lq) = (
            gf.forward(&ids)?.to_vec_f32()?,
            gq.forward(&ids)?.to_vec_f32()?,
        );
        for p in prompt.len() - 1..sf.len() - 1 {
            let (rf, rq) = (&lf[p * v..(p + 1) * v], &lq[p * v..(p + 1) * v]);
            let (t1, t2) = top2(rf);
            flips += usize::from(top2(rq).0 != t1);
            positions += 1;
            gaps.push(rf[t1] - rf[t2]);
            gap_err.push(((rq[t1] - rq[t2]) - (rf[t1] - rf[t2])).abs());
        }
        for (x, y) in lf.iter().zip(&lq) {
            err2 += ((x - y) as f64).powi(2);
            ref2 += (*x as f64).powi(2);
        }
    }
    let mean_free = free.iter().sum::<f64>() / free.len() as f64;
    let forced = 1.0 - flips as f64 / positions.max(1) as f64;
    let rel_l2 = (err2 / ref2).sqrt();
    let near = |limit: f32| gaps.iter().filter(|&&g| g < limit).count() as f64 / gaps.len() as f64;
    let (gap_med, err_med) = (median_f32(&gaps), median_f32(&gap_err));
    rep.row(
        &format!(
            "greedy agreement over {n} tokens, {} prompts (free running: mean, prompt 1 / teacher-forced)",
            prompts.len()
        ),
        "—".into(),
        format!(
            "{:.1}%, {:.0}% / {:.1}%",
            100.0 * mean_free,
            100.0 * free[0],
            100.0 * forced
        ),
        None,
        json!({
            "free_running": mean_free, "free_running_per_prompt": free, "first_divergence": first,
            "teacher_forced": forced, "positions": positions, "logits_relative_l2": rel_l2,
            "f32_top_gap_median": gap_med, "gap_error_median": err_med,
        }),
    );
    let _ = writeln!(
        rep.md,
        "\nlogits relative L2 error (teacher-forced): {rel_l2:.4}; f32 top-1/top-2 gap: median {gap_med:.3}, \
         {:.1}% of positions below 0.02; int8 error in that gap: median {err_med:.4}; first divergence per prompt: {first:?}",
        100.0 * near(0.02)
    );
    Ok(())
}

/// The indices of the largest and second largest values (v.len() ≥ 2).
fn top2(v: &[f32]) -> (usize, usize) {
    let (mut a, mut b) = if v[1] > v[0] { (1, 0) } else { (0, 1) };
    for (i, x) in v.iter().enumerate().skip(2) {
        if *x > v[a] {
            (a, b) = (i, a);
        } else if *x > v[b] {
            b = i;
        }
    }
    (a, b)
}

/// NaN when empty (`--tokens 0`).
fn median_f32(v: &[f32]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    median(v.iter().map(|&x| x as f64).collect())
}

/// One row: forward throughput of the f32 and int8 models on `x`, as `items` `unit`s (samples,
/// tokens) per second.
fn forward_row(
    timer: &Timer,
    rep: &mut Report,
    (f, q): (&dyn Module, &dyn Module),
    x: &Tensor,
    what: &str,
    (items, unit): (usize, &str),
) -> Result<()> {
    let items = items as f64;
    let (tf, tq) = timer.pair(
        || f.forward(x).map(|_| ()).map_err(Into::into),
        || q.forward(x).map(|_| ()).map_err(Into::into),
    )?;
    rep.row(
        what,
        format!("{:.0} {unit}/s", items / tf),
        format!("{:.0} {unit}/s", items / tq),
        Some(tf / tq),
        json!({ "f32_s": tf, "int8_s": tq, "shape": x.shape() }),
    );
    Ok(())
}

fn as_gpt(m: &dyn Module) -> Result<&Decoder> {
    m.as_any()
        .and_then(|a| a.downcast_ref::<Decoder>())
        .context("expected a GPT model")
}
