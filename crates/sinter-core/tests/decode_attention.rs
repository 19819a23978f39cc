//! `fused::decode_attention` (one decoding step of attention for sequences of different
//! lengths, each with its own KV cache) against its composite reference and against plain
//! causal attention over each whole sequence.

use sinter_core::{fused, no_grad, DType, Device, Rng, Tensor};

fn randn(shape: &[usize], rng: &mut Rng) -> Tensor {
    Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu).unwrap()
}

fn r(v: &[Tensor]) -> Vec<&Tensor> {
    v.iter().collect()
}

/// max |a − b|; infinite where either side is NaN (f32::max would drop a NaN).
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let (a, b) = (a.to_vec_f32().unwrap(), b.to_vec_f32().unwrap());
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

/// Caches [1, h, cap, d] whose first `len` positions hold random keys/values.
fn caches(lens: &[usize], h: usize, cap: usize, d: usize, rng: &mut Rng) -> Vec<(Tensor, Tensor)> {
    lens.iter()
        .map(|&len| {
            let k = Tensor::zeros(&[1, h, cap, d], DType::F32, Device::Cpu).unwrap();
            let v = Tensor::zeros(&[1, h, cap, d], DType::F32, Device::Cpu).unwrap();
            if len > 0 {
                k.narrow(2, 0, len)
                    .unwrap()
                    .assign(&randn(&[1, h, len, d], rng))
                    .unwrap();
                v.narrow(2, 0, len)
                    .unwrap()
                    .assign(&randn(&[1, h, len, d], rng))
                    .unwrap();
            }
            (k, v)
        })
        .collect()
}

#[test]
fn kernel_matches_the_composite_and_whole_sequence_attention() {
    let _g = no_grad();
    let mut rng = Rng::new(3);
    // Lengths 0 (a first token), short, long (several rayon tasks' worth), and the cache's
    // last free position.
    let lens = [0usize, 5, 63, 200, 255];
    let (n, h, d, cap) = (lens.len(), 4, 24, 256);
    // q, k, v as thirds of a packed [n, 3, h, d] projection: strided views, read in place.
    let qkv = randn(&[n, 3, h, d], &mut rng);
    let part = |i: usize| qkv.narrow(1, i, 1).unwrap().squeeze(1).unwrap();
    let (q, k, v) = (part(0), part(1), part(2));
    let scale = 0.3f32;
    let fast = caches(&lens, h, cap, d, &mut Rng::new(9));
    let slow = caches(&lens, h, cap, d, &mut Rng::new(9));
    let refs = |c: &[(Tensor, Tensor)]| -> (Vec<Tensor>, Vec<Tensor>) {
        (
            c.iter().map(|x| x.0.clone()).collect(),
            c.iter().map(|x| x.1.clone()).collect(),
        )
    };
    let (fk, fv) = refs(&fast);
    let (sk, sv) = refs(&slow);
    let got = fused::decode_attention(&q, &k, &v, &r(&fk), &r(&fv), &lens, scale).unwrap();
    let want =
        fused::decode_attention_reference(&q, &k, &v, &r(&sk), &r(&sv), &lens, scale).unwrap();
    assert_eq!(got.shape(), &[n, h, d]);
    let e = max_diff(&got, &want);
    assert!(e < 1e-5, "kernel vs composite: {e}");
    // Both appended this step's keys and values at each sequence's length.
    for i in 0..n {
        assert_eq!(max_diff(&fk[i], &sk[i]), 0.0);
        assert_eq!(max_diff(&fv[i], &sv[i]), 0.0);
        let row = k.narrow(0, i, 1).unwrap().unsqueeze(2).unwrap();
        assert_eq!(max_diff(&fk[i].narrow(2, lens[i], 1).unwrap(), &row), 0.0);
    }
    // And each row is the last row of causal attention over that whole sequence.
    for i in 0..n {
        let len = lens[i] + 1;
        let qs = randn(&[1, h, len, d], &mut rng);
        qs.narrow(2, len - 1, 1)
            .unwrap()
            .assign(&q.narrow(0, i, 1).unwrap().unsqueeze(2).unwrap())
            .unwrap();
        let full = fused::attention(
            &qs,
            &fk[i].narrow(2, 0, len).unwrap(),
            &fv[i].narrow(2, 0, len).unwrap(),
            true,
            scale,
        )
        .unwrap();
        let last = full
            .narrow(2, len - 1, 1)
            .unwrap()
            .reshape(&[1, h, d])
            .unwrap();
        let e = max_diff(&got.narrow(0, i, 1).unwrap(), &last);
        assert!(e < 1e-5, "sequence {i}: {e}");
    }
}

#[test]
fn bad_calls_are_errors() {
    let _g = no_grad();
    let mut rng = Rng::new(1);
    let q = randn(&[2, 2, 8], &mut rng);
    let c = caches(&[3, 4], 2, 4, 8, &mut rng);
    let (k0, v0, k1, v1) = (&c[0].0, &c[0].1, &c[1].0, &c[1].1);
    let f = |ks: &[&Tensor], vs: &[&Tensor], lens: &[usize]| {
        fused::decode_attention(&q, &q, &q, ks, vs, lens, 1.0)
            .unwrap_err()
            .to_string()
    };
    // A full cache (length 4 of capacity 4).
    assert!(f(&[k0, k1], &[v0, v1], &[3, 4]).contains("all filled"));
    // Counts that disagree.
    assert!(f(&[k0], &[v0], &[3]).contains("2 sequences"));
    // A key cache that is its own value cache.
    assert!(f(&[k0, k1], &[k0, v1], &[1, 1]).contains("shares storage"));
    // A cache of the wrong head width.
    let wide = Tensor::zeros(&[1, 2, 4, 9], DType::F32, Device::Cpu).unwrap();
    assert!(f(&[k0, &wide], &[v0, v1], &[1, 1]).contains("do not fit"));
}

#[test]
fn views_of_one_pool_work_one_sequence_at_a_time() {
    let _g = no_grad();
    let mut rng = Rng::new(2);
    let (n, h, d, cap) = (3, 4, 32, 300);
    let pool_k = Tensor::zeros(&[n, h, cap, d], DType::F32, Device::Cpu).unwrap();
    let pool_v = Tensor::zeros(&[n, h, cap, d], DType::F32, Device::Cpu).unwrap();
    let lens = [250, 10, 299];
    for (i, &l) in lens.iter().enumerate() {
        for pool in [&pool_k, &pool_v] {
            let rows = pool.narrow(0, i, 1).unwrap().narrow(2, 0, l).unwrap();
            rows.assign(&randn(&[1, h, l, d], &mut rng)).unwrap();
        }
    }
    let own = |p: &Tensor| -> Vec<Tensor> {
        (0..n)
            .map(|i| p.narrow(0, i, 1).unwrap().contiguous().unwrap())
            .collect()
    };
    let (ok, ov) = (own(&pool_k), own(&pool_v));
    let views =
        |p: &Tensor| -> Vec<Tensor> { (0..n).map(|i| p.narrow(0, i, 1).unwrap()).collect() };
    let (vk, vv) = (views(&pool_k), views(&pool_v));
    let q = randn(&[n, h, d], &mut rng);
    let a = fused::decode_attention(&q, &q, &q, &r(&vk), &r(&vv), &lens, 0.25).unwrap();
    let b = fused::decode_attention(&q, &q, &q, &r(&ok), &r(&ov), &lens, 0.25).unwrap();
    assert!(max_diff(&a, &b) == 0.0);
}
