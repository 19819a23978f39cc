//! The device itself: creation on the device, transfers (with autograd across devices), moving
//! parameters in place, index errors (host ids at the op; device-resident ids at the next read),
//! and whole training graphs (a CNN step with AdamW, a Transformer block) against the composed
//! reference.

use crate::harness::*;
use crate::reference::{self as r, Arr, Conv, Pool};
use sinter_core::{cuda, AdamWParams, Conv2dParams, DType, Device, Pool2dParams, Rng, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("creation", ALL, creation),
        case("random_creation", FLOATS, random_creation),
        case("transfer_and_cross_device_autograd", F32, transfer).cuda_only(),
        case("move_to_device_in_place", F32, move_in_place).cuda_only(),
        case("host_index_errors", F32, host_index_errors),
        case("bad_device_indices", F32, bad_device_indices)
            .cuda_only()
            .exclusive(),
        case("cnn_training_step", FLOATS, cnn_training_step),
        case("transformer_block", FLOATS, transformer_block),
    ]
}

/// zeros / ones / full / arange / empty / from_vec / little-endian bytes made on the device.
fn creation(t: &Target) {
    let dt = t.dtype;
    let same = |got: Tensor, want: Arr, what: &str| {
        assert_eq!((got.device(), got.dtype()), (t.dev, dt), "{what}");
        assert_eq!(arr(&got), want, "{what}");
    };
    same(
        Tensor::zeros(&[3, 4], dt, t.dev).unwrap(),
        Arr::new(&[3, 4], vec![0.0; 12]),
        "zeros",
    );
    same(
        Tensor::ones(&[5], dt, t.dev).unwrap(),
        Arr::new(&[5], vec![1.0; 5]),
        "ones",
    );
    same(
        Tensor::full(-2.5, &[2, 2, 2], dt, t.dev).unwrap(),
        Arr::new(&[2, 2, 2], vec![r::round_to(dt, -2.5); 8]),
        "full",
    );
    same(
        Tensor::zeros(&[0, 3], dt, t.dev).unwrap(),
        Arr::new(&[0, 3], vec![]),
        "empty",
    );
    for (start, end, step) in [
        (0.0, 10.0, 1.0f64),
        (-3.0, 4.0, 2.5),
        (5.0, -2.0, -0.75),
        (-3.0, 7.0, 0.5),
    ] {
        let n = ((end - start) / step).ceil() as usize;
        let want = Arr::from_fn(&[n], |i| r::round_to(dt, start + i[0] as f64 * step));
        same(
            Tensor::arange(start, end, step, dt, t.dev).unwrap(),
            want,
            &format!("arange({start}, {end}, {step})"),
        );
    }
    for v in [0.0, 1.0, -5.0, 123456789.0] {
        same(
            Tensor::full(v, &[2, 3], dt, t.dev).unwrap(),
            Arr::new(&[2, 3], vec![r::round_to(dt, v); 6]),
            &format!("full({v})"),
        );
    }
    let v: Vec<f32> = (0..24).map(|i| i as f32 * 0.25 - 3.0).collect();
    let d = Tensor::from_vec(v.clone(), &[2, 3, 4], t.dev).unwrap();
    assert_eq!(d.to_vec_f32().unwrap(), v);
    let bytes = Tensor::from_vec(v.clone(), &[2, 3, 4], Device::Cpu)
        .unwrap()
        .to_le_bytes()
        .unwrap();
    assert_eq!(d.to_le_bytes().unwrap(), bytes);
    assert_eq!(
        Tensor::from_le_bytes(&bytes, DType::F32, &[2, 3, 4], t.dev)
            .unwrap()
            .to_vec_f32()
            .unwrap(),
        v
    );
    assert_eq!(
        Tensor::from_vec(vec![5i64, -100, 7], &[3], t.dev)
            .unwrap()
            .to_vec_i64()
            .unwrap(),
        vec![5, -100, 7]
    );
    assert_eq!(
        Tensor::from_vec(vec![4.5f32], &[], t.dev)
            .unwrap()
            .to_scalar_f32()
            .unwrap(),
        4.5
    );
}

/// Random tensors come from the host generator: the same seed gives the same values on every
/// device.
fn random_creation(t: &Target) {
    let host = |f: &dyn Fn(Device) -> Tensor| (arr(&f(Device::Cpu)), arr(&f(t.dev)));
    let (a, b) = host(&|d| Tensor::randn(&[64], 0.5, 2.0, &mut Rng::new(9), t.dtype, d).unwrap());
    assert_eq!(a, b, "randn");
    let (a, b) =
        host(&|d| Tensor::rand_uniform(&[33], -1.0, 3.0, &mut Rng::new(4), t.dtype, d).unwrap());
    assert_eq!(a, b, "rand_uniform");
    assert!(b.data.iter().all(|&x| (-1.0..=3.0).contains(&x)));
}

fn transfer(t: &Target) {
    let mut rng = t.rng(100);
    let x = make(
        &uniform(&mut rng, &[4, 6], -1.0, 1.0),
        DType::F32,
        Device::Cpu,
    );
    // A strided view moves as its values.
    let tr = x.t().unwrap();
    let d = tr.to_device(t.dev).unwrap();
    assert_eq!((d.shape(), d.device()), (&[6usize, 4][..], t.dev));
    assert_eq!(arr(&d), arr(&tr));
    assert_eq!(arr(&d.to_device(Device::Cpu).unwrap()), arr(&tr));
    // CPU variable → device compute → CPU loss.
    let w = x.to_var().unwrap();
    w.to_device(t.dev)
        .unwrap()
        .sqr()
        .unwrap()
        .to_device(Device::Cpu)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let g = w.grad().unwrap();
    assert_eq!(g.device(), Device::Cpu);
    assert_close(
        "d Σx²/dx across devices",
        &arr(&g).data,
        &arr(&x).map(|v| 2.0 * v).data,
        tol(DType::F32, 1.0),
    );
    // A device variable → CPU compute.
    let wg = x.to_device(t.dev).unwrap().to_var().unwrap();
    wg.to_device(Device::Cpu)
        .unwrap()
        .mul_scalar(3.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    let gg = wg.grad().unwrap();
    assert_eq!(gg.device(), t.dev);
    assert!(arr(&gg).data.iter().all(|&v| v == 3.0));
}

/// A parameter moved in place: its clones, views and gradient follow; a partial view cannot move.
fn move_in_place(t: &Target) {
    let mut rng = t.rng(101);
    let w = make(
        &uniform(&mut rng, &[3, 4], -1.0, 1.0),
        DType::F32,
        Device::Cpu,
    )
    .to_var()
    .unwrap();
    let holder = w.clone();
    let view = w.t().unwrap();
    let before = arr(&w);
    w.move_to_device_(Device::Cpu).unwrap();
    w.set_grad(Some(w.ones_like().unwrap()));
    w.move_to_device_(t.dev).unwrap();
    assert_eq!(
        (holder.device(), view.device(), w.grad().unwrap().device()),
        (t.dev, t.dev, t.dev)
    );
    assert_eq!(arr(&holder), before);
    assert!(w.is_variable());
    assert!(w
        .narrow(0, 1, 2)
        .unwrap()
        .move_to_device_(Device::Cpu)
        .is_err());
    w.move_to_device_(Device::Cpu).unwrap();
    assert_eq!((holder.device(), arr(&holder)), (Device::Cpu, before));
}

/// Host ids out of range are errors at the op, naming the value, the position and the range.
fn host_index_errors(t: &Target) {
    let mut rng = t.rng(102);
    let logits = t.tensor(&uniform(&mut rng, &[6, 10], -3.0, 3.0));
    let host = |v: &[i64]| Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu).unwrap();
    for (tg, want) in [
        (vec![3, 1, 0, 10, 9, 2], "target 10 at position 3"),
        (vec![3, -1, 0, 1, 9, 2], "target -1 at position 1"),
    ] {
        let e = err_msg(logits.cross_entropy(&host(&tg), -100));
        assert!(e.contains(want) && e.contains("0..10"), "{e}");
    }
    let l = logits
        .cross_entropy(&host(&[3, -100, 0, 1, 9, 2]), -100)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    assert!(l.is_finite() && l > 0.0, "the ignore index is no error");
    let e = err_msg(logits.index_select(0, &host(&[0, 6])));
    assert!(e.contains("index 6 at position 1"), "{e}");
    let e = err_msg(logits.embedding(&host(&[1, 20])));
    assert!(e.contains("20"), "{e}");
}

/// Device-resident ids: the op does not wait for the device; the first read reports the first
/// bad value with its position (once), and the gathers stay in bounds meanwhile.
fn bad_device_indices(t: &Target) {
    let g = t.dev;
    let mut rng = t.rng(103);
    let ids = |v: &[i64], s: &[usize]| Tensor::from_vec(v.to_vec(), s, g).unwrap();
    let logits = make(&uniform(&mut rng, &[6, 10], -3.0, 3.0), DType::F32, g);
    let loss = logits
        .cross_entropy(&ids(&[3, 1, 0, 10, 9, 12], &[6]), -100)
        .unwrap();
    let e = loss.to_scalar_f32().unwrap_err().to_string();
    assert!(e.contains("cross_entropy: target 10 at position 3"), "{e}");
    let l = logits
        .cross_entropy(&ids(&[3, -100, 0, 9, 9, 1], &[6]), -100)
        .unwrap()
        .to_scalar_f32()
        .unwrap();
    assert!(l.is_finite(), "reported once: the next reads work");
    let _ = logits
        .cross_entropy(&ids(&[3, -1, 0, 1, 2, -7], &[6]), -100)
        .unwrap();
    let Device::Cuda(ordinal) = g else {
        unreachable!()
    };
    let e = cuda::synchronize(ordinal).unwrap_err().to_string();
    assert!(e.contains("target -1 at position 1"), "{e}");
    cuda::synchronize(ordinal).unwrap();
    let table = make(&uniform(&mut rng, &[20, 8], -1.0, 1.0), DType::F32, g);
    let e = table
        .index_select(0, &ids(&[3, 19, 25, 0], &[4]))
        .unwrap()
        .to_vec_f32()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index_select: index 25 at position 2"), "{e}");
    let e = table
        .embedding(&ids(&[1, -2], &[1, 2]))
        .unwrap()
        .to_vec_f32()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index -2 at position 1"), "{e}");
    let src = Tensor::ones(&[2, 8], DType::F32, g).unwrap();
    let e = table
        .index_add(0, &ids(&[0, 20], &[2]), &src)
        .unwrap()
        .to_vec_f32()
        .unwrap_err()
        .to_string();
    assert!(e.contains("index_add: index 20 at position 1"), "{e}");
    assert_eq!(table.to_vec_f32().unwrap().len(), 160);
}

// ---- whole graphs ------------------------------------------------------------------------------

const CONV: Conv2dParams = Conv2dParams::square(1, 1, 1, 1);
const RCONV: Conv = Conv::square(1, 1, 1, 1);
const POOL: Pool2dParams = Pool2dParams::square(2, 2, 0);
const RPOOL: Pool = Pool {
    kernel: [2, 2],
    stride: [2, 2],
    padding: [0, 0],
    dilation: [1, 1],
    ceil_mode: false,
    count_include_pad: true,
};

/// conv → bias → relu → max-pool → linear → cross-entropy; params [w, b, W, B].
fn cnn(x: &Tensor, labels: &Tensor, p: &[Tensor]) -> sinter_core::Result<Tensor> {
    let h = x
        .conv2d(&p[0], CONV)?
        .add(&p[1])?
        .relu()?
        .max_pool2d(POOL)?
        .flatten_from(1)?;
    h.matmul(&p[2])?.add(&p[3])?.cross_entropy(labels, -100)
}

fn cnn_ref(x: &Arr, labels: &Arr, p: &[Arr], rd: &Rd) -> Arr {
    let h = rd.r(r::conv2d(x, &p[0], RCONV));
    let h = rd.r(h.add(&p[1])).map(r::relu);
    let h = r::pool2d(&h, RPOOL, true);
    let n = h.shape[0];
    let h = h.reshape(&[n, h.numel() / n]);
    let y = rd.r(rd.r(r::matmul(&h, &p[2])).add(&p[3]));
    r::cross_entropy(&y, labels, -100)
}

/// The loss and every parameter's gradient of one CNN step, then three AdamW steps.
fn cnn_training_step(t: &Target) {
    let mut rng = t.rng(104);
    let x = uniform(&mut rng, &[4, 3, 8, 8], -1.0, 1.0);
    let labels = Arr::ints(&[4], &[1, 0, 9, 4]);
    let params = [
        uniform(&mut rng, &[8, 3, 3, 3], -0.3, 0.3),
        uniform(&mut rng, &[8, 1, 1], -0.1, 0.1),
        uniform(&mut rng, &[8 * 4 * 4, 10], -0.1, 0.1),
        uniform(&mut rng, &[10], -0.1, 0.1),
    ];
    let inputs: Vec<In> = [In::Fixed(x.clone()), In::Ids(labels.clone())]
        .into_iter()
        .chain(params.iter().cloned().map(In::Var))
        .collect();
    // Half precision rounds after the conv, the bias, the linear and its bias.
    let o = Opts {
        out: Some(DType::F32),
        roundings: 4.0,
        ..Opts::default()
    };
    t.check_with(
        "CNN step",
        o,
        &inputs,
        |v| cnn(&v[0], &v[1], &v[2..]),
        |v, rd| cnn_ref(&v[0], &v[1], &v[2..], rd),
    );
    if t.dtype != DType::F32 {
        return;
    }
    // Three AdamW steps; a large eps keeps the update smooth in the gradient.
    let (xt, lt) = (t.tensor(&x), make(&labels, DType::I64, t.dev));
    let ps: Vec<Tensor> = params
        .iter()
        .map(|p| t.tensor(p).to_var().unwrap())
        .collect();
    let state: Vec<(Tensor, Tensor)> = ps
        .iter()
        .map(|p| (p.zeros_like().unwrap(), p.zeros_like().unwrap()))
        .collect();
    let mut want: Vec<(Arr, Arr, Arr)> = params
        .iter()
        .map(|p| {
            let p = t.round(p);
            (p.clone(), p.map(|_| 0.0), p.map(|_| 0.0))
        })
        .collect();
    let (xr, smooth) = (t.round(&x), Rd::smooth());
    for s in 1..=3u64 {
        for p in &ps {
            p.zero_grad();
        }
        cnn(&xt, &lt, &ps).unwrap().backward().unwrap();
        let h = AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-3,
            weight_decay: 0.01,
            step: s,
        };
        for (p, (m, v)) in ps.iter().zip(&state) {
            p.adamw_step(&p.grad().unwrap(), m, v, h).unwrap();
        }
        let cur: Vec<Arr> = want.iter().map(|w| w.0.clone()).collect();
        let loss = |ps: &[Arr]| cnn_ref(&xr, &labels, ps, &smooth);
        for (i, w) in want.iter_mut().enumerate() {
            let g = full_gradient(&cur, i, &loss);
            for j in 0..g.numel() {
                (w.0.data[j], w.1.data[j], w.2.data[j]) = r::adamw(
                    w.0.data[j],
                    g.data[j],
                    w.1.data[j],
                    w.2.data[j],
                    1e-3,
                    (0.9, 0.999),
                    1e-3,
                    0.01f32 as f64,
                    s as i32,
                );
            }
        }
    }
    for (i, (p, w)) in ps.iter().zip(&want).enumerate() {
        assert_close(
            &format!("CNN after 3 AdamW steps: parameter {i}"),
            &arr(p).data,
            &w.0.data,
            tol(DType::F32, 1.0),
        );
    }
}

/// d loss / d params[i], every element, by central differences of the reference.
fn full_gradient(params: &[Arr], i: usize, loss: &dyn Fn(&[Arr]) -> Arr) -> Arr {
    let mut g = params[i].map(|_| 0.0);
    for j in 0..g.numel() {
        let h = 1e-6 * params[i].data[j].abs().max(1.0);
        let at = |d: f64| {
            let mut ps = params.to_vec();
            ps[i].data[j] += d;
            loss(&ps).data[0]
        };
        g.data[j] = (at(h) - at(-h)) / (2.0 * h);
    }
    g
}

/// A pre-LN Transformer block (LayerNorm, qkv projection, causal attention — composite or
/// fused — output projection, residual, GELU MLP, residual) and a mean-square loss; every
/// parameter's gradient.
fn transformer_block(t: &Target) {
    let mut rng = t.rng(105);
    let (b, n, c, h) = (2usize, 6usize, 16usize, 4usize);
    let x = uniform(&mut rng, &[b, n, c], -1.0, 1.0);
    let params = vec![
        uniform(&mut rng, &[c], 0.8, 1.2),
        uniform(&mut rng, &[c], -0.1, 0.1),
        uniform(&mut rng, &[3 * c, c], -0.3, 0.3),
        uniform(&mut rng, &[3 * c], -0.1, 0.1),
        uniform(&mut rng, &[c, c], -0.3, 0.3),
        uniform(&mut rng, &[4 * c, c], -0.3, 0.3),
        uniform(&mut rng, &[c, 4 * c], -0.3, 0.3),
    ];
    let scale = 1.0 / ((c / h) as f32).sqrt();
    let block =
        move |x: &Tensor, p: &[Tensor], fused_attention: bool| -> sinter_core::Result<Tensor> {
            let nx = x.layer_norm(&p[0], &p[1], 1e-5)?;
            let qkv = nx.matmul(&p[2].t()?)?.add(&p[3])?;
            let heads = |i: usize| {
                qkv.narrow(-1, i * c, c)?
                    .reshape(&[b, n, h, c / h])?
                    .permute(&[0, 2, 1, 3])
            };
            let (q, k, v) = (heads(0)?, heads(1)?, heads(2)?);
            let a = if fused_attention {
                sinter_core::fused::attention(&q, &k, &v, true, scale)?
            } else {
                let mask: Vec<bool> = (0..n * n).map(|i| (i % n) > (i / n)).collect();
                let mask = Tensor::from_vec(mask, &[n, n], x.device())?;
                q.matmul(&k.t()?)?
                    .mul_scalar(scale)?
                    .masked_fill(&mask, f32::NEG_INFINITY)?
                    .softmax(-1)?
                    .matmul(&v)?
            };
            let a = a.permute(&[0, 2, 1, 3])?.reshape(&[b, n, c])?;
            let x = x.add(&a.matmul(&p[4].t()?)?)?;
            let m = x.matmul(&p[5].t()?)?.gelu()?.matmul(&p[6].t()?)?;
            x.add(&m)?.sqr()?.mean_all()
        };
    let block_ref = move |x: &Arr, p: &[Arr], rd: &Rd| -> Arr {
        let nx = rd.r(r::layer_norm(x, &p[0], &p[1], 1e-5f32 as f64));
        let qkv = rd.r(rd.r(r::matmul(&nx, &p[2].t())).add(&p[3]));
        let heads = |i: usize| {
            qkv.narrow(-1, i * c, c)
                .reshape(&[b, n, h, c / h])
                .permute(&[0, 2, 1, 3])
        };
        let a = r::attention(&heads(0), &heads(1), &heads(2), true, scale as f64);
        let a = rd.r(a).permute(&[0, 2, 1, 3]).reshape(&[b, n, c]);
        let x = rd.r(x.add(&rd.r(r::matmul(&a, &p[4].t()))));
        let m = rd.r(rd.r(r::matmul(&x, &p[5].t())).map(r::gelu_tanh));
        let y = rd.r(x.add(&rd.r(r::matmul(&m, &p[6].t()))));
        Arr::scalar(r::mean(&y.data.iter().map(|v| v * v).collect::<Vec<_>>()))
    };
    let inputs: Vec<In> = std::iter::once(In::Fixed(x))
        .chain(params.into_iter().map(In::Var))
        .collect();
    // Half precision: about a dozen roundings in sequence through the block.
    let o = rounds(12.0);
    for fused_attention in [false, true] {
        t.check_with(
            &format!("block, fused attention {fused_attention}"),
            o,
            &inputs,
            |v| block(&v[0], &v[1..], fused_attention),
            |v, rd| block_ref(&v[0], &v[1..], rd),
        );
    }
}
