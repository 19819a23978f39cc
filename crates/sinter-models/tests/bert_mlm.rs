//! BERT (masked LM): parameter count and names, bidirectional attention, the padding mask,
//! the masked-only loss, BERT's masking recipe, and that training lowers the loss.

use sinter_core::{DType, Device, Rng, Tensor};
use sinter_models::bert::{special, IGNORE_INDEX};
use sinter_models::{
    mask_batch, mask_tokens, Bert, BertConfig, Decoder, DecoderConfig, MlmMasking,
};
use sinter_nn::module::shared_rng;
use sinter_nn::{AdamW, Module, Optimizer};

fn small_config() -> BertConfig {
    BertConfig {
        vocab_size: 64,
        hidden: 32,
        n_layer: 2,
        n_head: 2,
        intermediate: 64,
        max_position: 32,
        type_vocab_size: 2,
        dropout: 0.0,
        attention_dropout: 0.0,
        ..BertConfig::preset("bert-tiny").unwrap()
    }
}

fn small_bert(seed: u64) -> Bert {
    Bert::new(small_config(), &mut Rng::new(seed), &shared_rng(seed)).unwrap()
}

fn ids(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn bert_base_has_bert_for_masked_lm_parameters() {
    let cfg = BertConfig::preset("bert-base").unwrap();
    // Hugging Face's BertForMaskedLM (bert-base-uncased): 109,514,298 trainable parameters,
    // the decoder weight being the word embedding.
    assert_eq!(cfg.num_parameters(), 109_514_298);
    let m = Bert::new(cfg, &mut Rng::new(0), &shared_rng(0)).unwrap();
    assert_eq!(m.num_parameters(), 109_514_298);
    // Each encoder layer is the one Transformer block: 12 tensors, q, k and v packed.
    assert_eq!(m.parameters().len(), 5 + 12 * 12 + 5);
    // Under Hugging Face's names (what save_hf_bert writes and load_hf_bert reads), 16.
    let named: std::collections::HashMap<String, Vec<usize>> = sinter_models::hf_bert_tensors(&m)
        .unwrap()
        .into_iter()
        .map(|(n, t)| (n, t.shape().to_vec()))
        .collect();
    assert_eq!(named.len(), 5 + 12 * 16 + 5);
    for (n, s) in [
        ("bert.embeddings.word_embeddings.weight", vec![30522, 768]),
        ("bert.embeddings.position_embeddings.weight", vec![512, 768]),
        ("bert.embeddings.token_type_embeddings.weight", vec![2, 768]),
        ("bert.embeddings.LayerNorm.weight", vec![768]),
        (
            "bert.encoder.layer.0.attention.self.query.weight",
            vec![768, 768],
        ),
        ("bert.encoder.layer.11.attention.self.value.bias", vec![768]),
        (
            "bert.encoder.layer.3.attention.output.dense.weight",
            vec![768, 768],
        ),
        (
            "bert.encoder.layer.3.attention.output.LayerNorm.bias",
            vec![768],
        ),
        (
            "bert.encoder.layer.5.intermediate.dense.weight",
            vec![3072, 768],
        ),
        ("bert.encoder.layer.5.output.dense.weight", vec![768, 3072]),
        ("bert.encoder.layer.5.output.LayerNorm.weight", vec![768]),
        ("cls.predictions.transform.dense.weight", vec![768, 768]),
        ("cls.predictions.transform.LayerNorm.bias", vec![768]),
        ("cls.predictions.bias", vec![30522]),
    ] {
        assert_eq!(named.get(n), Some(&s), "{n}");
    }
    assert!(!named.contains_key("cls.predictions.decoder.weight"));
    let tiny = BertConfig::preset("bert-tiny").unwrap();
    assert_eq!((tiny.n_layer, tiny.n_head, tiny.hidden), (2, 2, 128));
    assert_eq!(
        Bert::new(tiny.clone(), &mut Rng::new(0), &shared_rng(0))
            .unwrap()
            .num_parameters(),
        tiny.num_parameters()
    );
}

#[test]
fn attention_is_bidirectional_unlike_gpt() {
    let m = small_bert(1);
    m.set_training(false);
    let a: Vec<i64> = vec![5, 9, 13, 20, 33, 7, 8, 40];
    let mut b = a.clone();
    *b.last_mut().unwrap() = 41;
    let first = |m: &dyn Module, v: &[i64]| {
        m.forward(&ids(v, &[1, 8]))
            .unwrap()
            .narrow(1, 0, 1)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    };
    let d = max_abs_diff(&first(&m, &a), &first(&m, &b));
    assert!(
        d > 1e-4,
        "changing the last token left position 0 unchanged ({d})"
    );
    // The same probe on GPT: causal, so position 0 cannot see the last token.
    let gcfg = DecoderConfig {
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
        block_size: 16,
        vocab_size: 64,
        ..DecoderConfig::preset("gpt-tiny").unwrap()
    };
    let g = Decoder::new(gcfg, &mut Rng::new(1), &shared_rng(1)).unwrap();
    g.set_training(false);
    assert_eq!(max_abs_diff(&first(&g, &a), &first(&g, &b)), 0.0);
}

#[test]
fn padding_mask_hides_padded_positions() {
    let m = small_bert(2);
    m.set_training(false);
    let a: Vec<i64> = vec![1, 10, 11, 12, 2, 0, 0, 0, 1, 20, 21, 22, 23, 24, 25, 2];
    let mask: Vec<i64> = vec![1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    let mut b = a.clone();
    b[5] = 50;
    b[7] = 60;
    let mask = ids(&mask, &[2, 8]);
    let run = |v: &[i64]| m.forward_with(&ids(v, &[2, 8]), None, Some(&mask)).unwrap();
    let (ya, yb) = (run(&a), run(&b));
    // Real tokens of sequence 0 do not see the padding, whatever it holds.
    let real = |y: &Tensor| {
        y.narrow(0, 0, 1)
            .unwrap()
            .narrow(1, 0, 5)
            .unwrap()
            .to_vec_f32()
            .unwrap()
    };
    assert!(max_abs_diff(&real(&ya), &real(&yb)) < 1e-6);
    // Without the mask they do.
    let ua = m.forward_with(&ids(&a, &[2, 8]), None, None).unwrap();
    let ub = m.forward_with(&ids(&b, &[2, 8]), None, None).unwrap();
    assert!(max_abs_diff(&real(&ua), &real(&ub)) > 1e-4);
    // A fully padded row gives finite outputs (uniform attention), not NaN.
    let none = ids(&[0; 16], &[2, 8]);
    assert!(m
        .forward_with(&ids(&a, &[2, 8]), None, Some(&none))
        .unwrap()
        .to_vec_f32()
        .unwrap()
        .iter()
        .all(|x| x.is_finite()));
    // Token types change the embedding.
    let tt = ids(&[0, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0], &[2, 8]);
    let yt = m.forward_with(&ids(&a, &[2, 8]), Some(&tt), None).unwrap();
    assert!(max_abs_diff(&yt.to_vec_f32().unwrap(), &ua.to_vec_f32().unwrap()) > 1e-4);
}

#[test]
fn mlm_loss_counts_only_masked_positions() {
    let m = small_bert(3);
    m.set_training(false);
    let x: Vec<i64> = (0..16).map(|i| 4 + (i * 7) % 60).collect();
    let labels: Vec<i64> = (0..16)
        .map(|i| {
            if i % 5 == 1 {
                4 + (i * 3) % 60
            } else {
                IGNORE_INDEX
            }
        })
        .collect();
    let (xt, lt) = (ids(&x, &[2, 8]), ids(&labels, &[2, 8]));
    let loss = m
        .mlm_loss(&xt, &lt, None, None)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    // Reference: -log softmax at the labelled positions of the full logits, averaged.
    let logits = m.forward(&xt).unwrap().to_vec_f32().unwrap();
    let v = 64;
    let (mut total, mut n) = (0f64, 0);
    for (p, &l) in labels.iter().enumerate() {
        if l == IGNORE_INDEX {
            continue;
        }
        let row = &logits[p * v..(p + 1) * v];
        let max = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let lse = max
            + row
                .iter()
                .map(|&z| (z as f64 - max).exp())
                .sum::<f64>()
                .ln();
        total += lse - row[l as usize] as f64;
        n += 1;
    }
    assert_eq!(n, 3);
    assert!(
        (loss as f64 - total / n as f64).abs() < 1e-5,
        "{loss} vs {}",
        total / n as f64
    );
    // Same as cross-entropy over all logits with ignore_index.
    let full = m
        .forward(&xt)
        .unwrap()
        .reshape(&[16, v])
        .unwrap()
        .cross_entropy(&lt.reshape(&[16]).unwrap(), IGNORE_INDEX)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    assert!((loss - full).abs() < 1e-5);
    // Unlabelled positions' inputs still matter (context), but not as targets: a loss with
    // no labels is 0, and its gradients are 0 — for every parameter, so that data-parallel
    // ranks, whose gradient buckets wait for every parameter, stay in step.
    let none = ids(&[IGNORE_INDEX; 16], &[2, 8]);
    let z = m.mlm_loss(&xt, &none, None, None).unwrap();
    assert_eq!(z.to_scalar_f32().unwrap(), 0.0);
    z.backward().unwrap();
    for (name, p) in m.parameters() {
        let g = p.grad().unwrap_or_else(|| panic!("{name} got no gradient"));
        assert!(g.to_vec_f32().unwrap().iter().all(|&x| x == 0.0), "{name}");
    }
    assert!(m
        .mlm_loss(&xt, &ids(&[70; 16], &[2, 8]), None, None)
        .unwrap_err()
        .to_string()
        .contains("70"));
}

#[test]
fn masking_follows_bert_recipe() {
    let cfg = MlmMasking::bert(30522);
    let mut tokens: Vec<i64> = (0..200_000).map(|i| 1000 + (i % 20000)).collect();
    for i in (0..tokens.len()).step_by(50) {
        tokens[i] = special::CLS;
        tokens[i + 1] = special::SEP;
        tokens[i + 2] = special::PAD;
    }
    let (inp, lab) = mask_tokens(&tokens, &cfg, &mut Rng::new(7));
    let eligible = tokens
        .iter()
        .filter(|t| !cfg.special_tokens.contains(t))
        .count() as f64;
    let selected: Vec<usize> = (0..tokens.len())
        .filter(|&i| lab[i] != IGNORE_INDEX)
        .collect();
    let frac = selected.len() as f64 / eligible;
    assert!((frac - 0.15).abs() < 0.005, "{frac}");
    let masked = selected
        .iter()
        .filter(|&&i| inp[i] == special::MASK)
        .count() as f64
        / selected.len() as f64;
    let kept =
        selected.iter().filter(|&&i| inp[i] == tokens[i]).count() as f64 / selected.len() as f64;
    assert!((masked - 0.8).abs() < 0.01, "{masked}");
    assert!((kept - 0.1).abs() < 0.01, "{kept}");
    for i in 0..tokens.len() {
        if lab[i] == IGNORE_INDEX {
            assert_eq!(inp[i], tokens[i]);
        } else {
            assert_eq!(lab[i], tokens[i]);
            assert!(!cfg.special_tokens.contains(&tokens[i]));
            assert!(inp[i] >= 0 && inp[i] < 30522);
        }
    }
    assert_eq!(
        mask_tokens(&tokens[..500], &cfg, &mut Rng::new(7)),
        mask_tokens(&tokens[..500], &cfg, &mut Rng::new(7))
    );
    assert_ne!(
        mask_tokens(&tokens[..500], &cfg, &mut Rng::new(7)).1,
        mask_tokens(&tokens[..500], &cfg, &mut Rng::new(8)).1
    );
}

/// Sequences [CLS]=1, s, s, …, s, [SEP]=2 with s drawn from tokens 4..64: every token is
/// uniform on its own (ln 60 ≈ 4.09 nats), but a masked one is given away by its context.
fn corpus_batch(rng: &mut Rng, batch: usize, t: usize) -> Vec<i64> {
    let mut v = Vec::with_capacity(batch * t);
    for _ in 0..batch {
        let s = 4 + rng.below(60) as i64;
        v.push(1);
        v.extend(std::iter::repeat_n(s, t - 2));
        v.push(2);
    }
    v
}

#[test]
fn training_lowers_the_mlm_loss() {
    let m = small_bert(4);
    let masking = MlmMasking {
        mask_prob: 0.15,
        replace_prob: 0.8,
        mask_token: 3,
        vocab_size: 64,
        special_tokens: vec![0, 1, 2],
    };
    let (b, t) = (16, 16);
    // A fixed held-out batch, masked once.
    let held = ids(&corpus_batch(&mut Rng::new(99), b, t), &[b, t]);
    let (held_in, held_lab) = mask_batch(&held, &masking, &mut Rng::new(100)).unwrap();
    let eval = |m: &Bert| {
        let _g = sinter_core::no_grad();
        m.mlm_loss(&held_in, &held_lab, None, None)
            .unwrap()
            .to_scalar_f32()
            .unwrap()
    };
    let before = eval(&m);
    let mut opt = AdamW::new(m.parameters(), 3e-3, 0.0).unwrap();
    let (mut data_rng, mut mask_rng) = (Rng::new(5), Rng::new(6));
    for _ in 0..200 {
        let x = ids(&corpus_batch(&mut data_rng, b, t), &[b, t]);
        let (inp, lab) = mask_batch(&x, &masking, &mut mask_rng).unwrap();
        let loss = m.mlm_loss(&inp, &lab, None, None).unwrap();
        assert!(loss.to_scalar_f32().unwrap().is_finite());
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
    }
    let after = eval(&m);
    assert!(
        before > 3.5,
        "an untrained model should be near ln 64 = 4.16, got {before}"
    );
    // Below what token frequencies alone allow (ln 60): the model reads the context.
    assert!(
        after < 2.5,
        "held-out MLM loss went from {before} to {after}"
    );
    assert_eq!(held.dtype(), DType::I64);
}

#[test]
fn hugging_face_weights_round_trip_and_are_checked() {
    use safetensors::tensor::{Dtype, SafeTensors, TensorView};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    let a = small_bert(10);
    a.set_training(false);
    sinter_models::save_hf_bert(&a, &path).unwrap();
    let x = ids(&[1, 5, 6, 7, 8, 9, 10, 2], &[1, 8]);
    let b = small_bert(11);
    b.set_training(false);
    assert_ne!(
        a.forward(&x).unwrap().to_vec_f32().unwrap(),
        b.forward(&x).unwrap().to_vec_f32().unwrap()
    );
    sinter_models::load_hf_bert(&path, &b).unwrap();
    assert_eq!(
        a.forward(&x).unwrap().to_vec_f32().unwrap(),
        b.forward(&x).unwrap().to_vec_f32().unwrap()
    );

    // A BertForPreTraining-style file: TF-era gamma/beta names, a pooler, the NSP head, the
    // position_ids buffer and the tied decoder, all accepted.
    let bytes = std::fs::read(&path).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut entries: Vec<(String, Vec<usize>, Vec<u8>, Dtype)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            let n = n
                .replace("LayerNorm.weight", "LayerNorm.gamma")
                .replace("LayerNorm.bias", "LayerNorm.beta");
            (n, v.shape().to_vec(), v.data().to_vec(), Dtype::F32)
        })
        .collect();
    let word = a.embeddings.word_embeddings.weight.clone();
    let zeros = |s: &[usize]| {
        Tensor::zeros(s, DType::F32, Device::Cpu)
            .unwrap()
            .to_le_bytes()
            .unwrap()
    };
    entries.push((
        "cls.predictions.decoder.weight".into(),
        vec![64, 32],
        word.to_le_bytes().unwrap(),
        Dtype::F32,
    ));
    entries.push((
        "bert.pooler.dense.weight".into(),
        vec![32, 32],
        zeros(&[32, 32]),
        Dtype::F32,
    ));
    entries.push((
        "cls.seq_relationship.bias".into(),
        vec![2],
        zeros(&[2]),
        Dtype::F32,
    ));
    entries.push((
        "bert.embeddings.position_ids".into(),
        vec![1, 32],
        Tensor::arange(0.0, 32.0, 1.0, DType::I64, Device::Cpu)
            .unwrap()
            .to_le_bytes()
            .unwrap(),
        Dtype::I64,
    ));
    let write = |entries: &[(String, Vec<usize>, Vec<u8>, Dtype)], name: &str| {
        let views: Vec<(String, TensorView)> = entries
            .iter()
            .map(|(n, s, b, d)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
            .collect();
        let p = dir.path().join(name);
        std::fs::write(&p, safetensors::serialize(views, &None).unwrap()).unwrap();
        p
    };
    let c = small_bert(12);
    c.set_training(false);
    sinter_models::load_hf_bert(write(&entries, "pretraining.safetensors"), &c).unwrap();
    assert_eq!(
        a.forward(&x).unwrap().to_vec_f32().unwrap(),
        c.forward(&x).unwrap().to_vec_f32().unwrap()
    );

    // One wrong shape and one missing tensor: both named, the model untouched.
    let mut bad = entries.clone();
    let i = bad
        .iter()
        .position(|e| e.0 == "bert.encoder.layer.1.intermediate.dense.weight")
        .unwrap();
    bad[i] = (bad[i].0.clone(), vec![63, 32], zeros(&[63, 32]), Dtype::F32);
    bad.retain(|e| e.0 != "cls.predictions.transform.dense.bias");
    let d = small_bert(13);
    let before: Vec<Vec<f32>> = d
        .parameters()
        .iter()
        .map(|(_, t)| t.to_vec_f32().unwrap())
        .collect();
    let err = sinter_models::load_hf_bert(write(&bad, "bad.safetensors"), &d)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("bert.encoder.layer.1.intermediate.dense.weight")
            && err.contains("[63, 32]")
            && err.contains("[64, 32]"),
        "{err}"
    );
    assert!(
        err.contains("cls.predictions.transform.dense.bias is missing"),
        "{err}"
    );
    assert_eq!(
        before,
        d.parameters()
            .iter()
            .map(|(_, t)| t.to_vec_f32().unwrap())
            .collect::<Vec<_>>()
    );
    // An untied decoder is refused.
    let i = entries
        .iter()
        .position(|e| e.0 == "cls.predictions.decoder.weight")
        .unwrap();
    entries[i].2 = zeros(&[64, 32]);
    let err = sinter_models::load_hf_bert(write(&entries, "untied.safetensors"), &d)
        .unwrap_err()
        .to_string();
    assert!(err.contains("decoder"), "{err}");
}
