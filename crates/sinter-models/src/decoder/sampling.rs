//! One position's logits → the next token: greedy, or a seeded sample from
//! softmax(logits / temperature) restricted to the top-k tokens and to the smallest set whose
//! probability reaches top-p (nucleus sampling), in that order, as Hugging Face and vLLM do.
//!
//! Cost: greedy and plain sampling are one pass over the vocabulary; top-k selects in linear
//! time and sorts only the k kept; top-p sorts a short head of candidates and the whole
//! vocabulary only when that head does not hold the requested mass. Candidates are ordered
//! by (logit descending, id ascending), so a seed always gives the same token.

use sinter_core::Rng;
use sinter_cpu::math::Unary;

/// How to pick tokens. `temperature` ≤ 0 is greedy (then `top_k` and `top_p` don't matter);
/// `top_k` 0 keeps every token; `top_p` 1 keeps every token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f64,
    pub top_k: usize,
    pub top_p: f64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
        }
    }
}

impl SamplingParams {
    /// Checks the values a caller can get wrong; the error says which and why.
    pub fn validate(&self) -> Result<(), String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be a finite number ≥ 0 (0 is greedy), got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!(
                "top_p must be in (0, 1] (1 keeps every token), got {}",
                self.top_p
            ));
        }
        Ok(())
    }
}

/// Picks the next token from one position's logits: greedy when `temperature` ≤ 0, else a
/// sample from softmax(logits / temperature) over the `top_k` most likely tokens (0: all).
pub fn sample_token(logits: &[f32], temperature: f64, top_k: usize, rng: &mut Rng) -> usize {
    SamplingParams {
        temperature,
        top_k,
        top_p: 1.0,
    }
    .sample(logits, rng)
}

/// The index of the largest logit (the first one among equals).
fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in logits.iter().enumerate() {
        if x.total_cmp(&logits[best]).is_gt() {
            best = i;
        }
    }
    best
}

/// Candidates in canonical order: larger logit first, then smaller id.
fn by_rank(logits: &[f32]) -> impl Fn(&usize, &usize) -> std::cmp::Ordering + '_ {
    |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b))
}

/// The `n` best candidates, sorted.
fn best(logits: &[f32], n: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    let order = by_rank(logits);
    if n < idx.len() {
        idx.select_nth_unstable_by(n, &order);
        idx.truncate(n);
    }
    idx.sort_unstable_by(order);
    idx
}

/// How many of the first sorted `weights` reach `p` of `total`, or None when all of them
/// don't.
fn nucleus_len(weights: &[f64], p: f64, total: f64) -> Option<usize> {
    let mut acc = 0.0;
    for (i, w) in weights.iter().enumerate() {
        acc += w;
        if acc >= p * total {
            return Some(i + 1);
        }
    }
    None
}

/// A head of this many candidates is sorted first when only top-p restricts the choice.
const NUCLEUS_HEAD: usize = 256;

impl SamplingParams {
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// The next token for one position's `logits` (a draw from `rng` unless greedy).
    pub fn sample(&self, logits: &[f32], rng: &mut Rng) -> usize {
        let v = logits.len();
        let top = logits[argmax(logits)];
        if self.is_greedy() || v <= 1 || !top.is_finite() {
            return argmax(logits);
        }
        let w = Weights {
            logits,
            top,
            inv_t: (1.0 / self.temperature) as f32,
        };
        let k = if self.top_k == 0 {
            v
        } else {
            self.top_k.min(v)
        };
        let mut cand: Option<Vec<usize>> = (k < v).then(|| best(logits, k));
        if self.top_p < 1.0 {
            let (ids, ws, total) = match cand.take() {
                Some(ids) => {
                    let ws = w.of(&ids);
                    let total = ws.iter().sum::<f64>();
                    (ids, ws, total)
                }
                None => {
                    let total = w.all().iter().sum::<f64>();
                    let ids = best(logits, NUCLEUS_HEAD.min(v));
                    let ws = w.of(&ids);
                    (ids, ws, total)
                }
            };
            cand = Some(match nucleus_len(&ws, self.top_p, total) {
                Some(n) => ids[..n].to_vec(),
                None => {
                    // The head holds less than top_p: rank the whole vocabulary.
                    let all = best(logits, v);
                    let ws = w.of(&all);
                    let n = nucleus_len(&ws, self.top_p, total).unwrap_or(v);
                    all[..n].to_vec()
                }
            });
        }
        match cand {
            Some(ids) => ids[draw(&w.of(&ids), rng)],
            None => draw(&w.all(), rng),
        }
    }
}

/// The unnormalised probabilities e^((logit − top) / temperature), computed a candidate set
/// at a time with sinter-cpu's vectorised exp (one polynomial for every ISA and lane, so a
/// seed gives the same token everywhere; a scalar libm exp per token and per pass was most
/// of a serving step's sampling).
struct Weights<'l> {
    logits: &'l [f32],
    top: f32,
    inv_t: f32,
}

impl Weights<'_> {
    fn exp(&self, mut x: Vec<f32>) -> Vec<f64> {
        sinter_cpu::math::unary_in_place(Unary::Exp, &mut x);
        x.into_iter().map(f64::from).collect()
    }
    /// The weights of the listed tokens, in order.
    fn of(&self, ids: &[usize]) -> Vec<f64> {
        self.exp(
            ids.iter()
                .map(|&i| (self.logits[i] - self.top) * self.inv_t)
                .collect(),
        )
    }
    /// Every token's weight.
    fn all(&self) -> Vec<f64> {
        self.exp(
            self.logits
                .iter()
                .map(|&l| (l - self.top) * self.inv_t)
                .collect(),
        )
    }
}

/// A draw in proportion to `weights`: the index of the one picked.
fn draw(weights: &[f64], rng: &mut Rng) -> usize {
    let total: f64 = weights.iter().sum();
    let mut u = rng.next_f64() * total;
    for (i, &w) in weights.iter().enumerate() {
        if u < w {
            return i;
        }
        u -= w;
    }
    weights.len().saturating_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(p: SamplingParams, logits: &[f32], n: usize) -> Vec<usize> {
        let mut c = vec![0; logits.len()];
        let mut rng = Rng::new(5);
        for _ in 0..n {
            c[p.sample(logits, &mut rng)] += 1;
        }
        c
    }

    #[test]
    fn greedy_takes_the_first_largest() {
        let p = SamplingParams {
            temperature: 0.0,
            ..Default::default()
        };
        assert_eq!(p.sample(&[0.1, 2.0, -1.0, 2.0], &mut Rng::new(0)), 1);
    }

    #[test]
    fn sampling_follows_the_softmax() {
        // p = softmax([ln 1, ln 2, ln 3, ln 4]) = [0.1, 0.2, 0.3, 0.4].
        let logits: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|x| x.ln()).collect();
        let n = 40_000;
        let c = counts(SamplingParams::default(), &logits, n);
        for (i, want) in [0.1, 0.2, 0.3, 0.4].iter().enumerate() {
            let got = c[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
        // Temperature 0.5 squares the odds: [1, 4, 9, 16] / 30.
        let c = counts(
            SamplingParams {
                temperature: 0.5,
                ..Default::default()
            },
            &logits,
            n,
        );
        let got = c[3] as f64 / n as f64;
        assert!((got - 16.0 / 30.0).abs() < 0.01, "{got}");
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let logits: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|x| x.ln()).collect();
        let top2 = counts(
            SamplingParams {
                top_k: 2,
                ..Default::default()
            },
            &logits,
            5000,
        );
        assert_eq!(&top2[..2], &[0, 0]);
        assert!(top2[2] > 1500 && top2[3] > 1500, "{top2:?}");
        // top_p 0.65: 0.4 + 0.3 reaches it; 0.4 alone does not.
        let nucleus = counts(
            SamplingParams {
                top_p: 0.65,
                ..Default::default()
            },
            &logits,
            5000,
        );
        assert_eq!(&nucleus[..2], &[0, 0], "{nucleus:?}");
        assert!(nucleus[2] > 1500 && nucleus[3] > 1500);
        // top_p 0.35 keeps the best token only.
        let one = counts(
            SamplingParams {
                top_p: 0.35,
                ..Default::default()
            },
            &logits,
            500,
        );
        assert_eq!(one, vec![0, 0, 0, 500]);
    }

    #[test]
    fn top_p_past_the_sorted_head_ranks_everything() {
        // 1000 equal logits: the nucleus of 0.9 needs 900 tokens, more than the head.
        let logits = vec![0f32; 1000];
        let p = SamplingParams {
            top_p: 0.9,
            ..Default::default()
        };
        let c = counts(p, &logits, 20_000);
        assert!(c[900..].iter().all(|&x| x == 0), "tail sampled");
        assert!(c[..900].iter().filter(|&&x| x > 0).count() > 800);
    }

    #[test]
    fn a_seed_gives_the_same_tokens() {
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37) % 101) as f32 * 0.05).collect();
        for p in [
            SamplingParams::default(),
            SamplingParams {
                temperature: 0.7,
                top_k: 40,
                top_p: 0.9,
            },
        ] {
            let run = |seed| {
                let mut r = Rng::new(seed);
                (0..50)
                    .map(|_| p.sample(&logits, &mut r))
                    .collect::<Vec<_>>()
            };
            assert_eq!(run(3), run(3));
            assert_ne!(run(3), run(4));
        }
    }

    #[test]
    fn bad_values_are_named() {
        for (p, what) in [
            (
                SamplingParams {
                    temperature: f64::NAN,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: -1.0,
                    ..Default::default()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..Default::default()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: 1.5,
                    ..Default::default()
                },
                "top_p",
            ),
        ] {
            assert!(p.validate().unwrap_err().contains(what));
        }
        assert!(SamplingParams::default().validate().is_ok());
    }
}
