//! The Llama family's fused ops on CUDA (`transformer/fused/llama_fused.cu`) against the CPU:
//! RMSNorm (and its residual form), rotary positions and SwiGLU on the CUDA device (the
//! emulated one without a GPU: the kernel emulator runs the kernels NVRTC compiled) in f32,
//! f16 and bf16 against the same layers on the CPU in f32 over the same (rounded) values —
//! outputs and every gradient — and a grouped-query Llama block on CUDA (flash attention
//! reading the packed heads, the fused norms, rotation and SwiGLU) against the CPU block.
//! Its own process: the emulated device must be chosen before anything touches CUDA.

use sinter_core::{amp, DType, Device, Rng, Tensor};

use sinter_nn::module::shared_rng;
use sinter_nn::{
    move_module, BlockConfig, MlpKind, Module, Norm, NormKind, RmsNorm, Rope, RopeConfig,
    RopeScaling, TransformerBlock,
};

/// The CUDA device: a real GPU when this process uses one, else the emulated one (None, test
/// skipped, when neither can run here; SINTER_REQUIRE_EMU=1 makes that a failure).
fn cuda() -> Option<Device> {
    let emulated = sinter_core::cuda::runtime::enable_emulation(1);
    if sinter_core::cuda::is_available() {
        return Some(Device::Cuda(0));
    }
    if std::env::var("SINTER_REQUIRE_EMU").is_ok_and(|v| v == "1") {
        panic!("SINTER_REQUIRE_EMU=1 but no emulated CUDA device: {emulated:?}");
    }
    eprintln!("skipped: no CUDA device and no emulated one ({emulated:?})");
    None
}

/// Relative to the largest reference magnitude: the kernels round once per output, the
/// references not at all.
fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::F32 => 2e-5,
        DType::F16 => 4e-3,
        _ => 2e-2,
    }
}

fn vals(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec_f32().unwrap()
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor, tol: f32) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes");
    let (a, b) = (vals(got), vals(want));
    let scale = b.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let (i, err) = a
        .iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, e)| if e > m.1 { (i, e) } else { m });
    assert!(
        err <= tol * scale && a.iter().all(|v| v.is_finite()),
        "{what}: max error {err} at {i} ({} vs {}; scale {scale})",
        a[i],
        b[i]
    );
}

/// A random tensor with values representable in `dtype`: (f32 on the CPU, `dtype` on `dev`),
/// both leaves that track gradients.
fn pair(shape: &[usize], rng: &mut Rng, dtype: DType, dev: Device) -> (Tensor, Tensor) {
    let x = Tensor::randn(shape, 0.0, 1.0, rng, DType::F32, Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    let cpu = x.to_dtype(DType::F32).unwrap().to_var().unwrap();
    (cpu, x.to_device(dev).unwrap().to_var().unwrap())
}

/// Σ w ∘ y's gradient into the leaves, w fixed per shape (the same on both devices).
fn backward(y: &Tensor, seed: u64) {
    let w = Tensor::randn(
        y.shape(),
        0.0,
        1.0,
        &mut Rng::new(seed),
        DType::F32,
        Device::Cpu,
    )
    .unwrap()
    .to_dtype(y.dtype())
    .unwrap()
    .to_device(y.device())
    .unwrap();
    y.mul(&w).unwrap().sum_all().unwrap().backward().unwrap();
}

/// RMSNorm and the residual form on CUDA against the CPU: rows across the dw chunks (300 =
/// two partial sums), a width with a vector tail and a power of two, the weight in x's dtype
/// and (half precision) in f32, autocast's master weight.
#[test]
fn cuda_rms_norm_equals_the_cpu() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(21);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, n) in [(3usize, 64usize), (300, 20)] {
            let mut params = vec![dtype];
            if dtype != DType::F32 {
                params.push(DType::F32);
            }
            for param in params {
                let what = format!("rms_norm {dtype} (weight {param}) {rows}×{n}");
                let (x, xd) = pair(&[rows, n], &mut rng, dtype, dev);
                let (a, ad) = pair(&[rows, n], &mut rng, dtype, dev);
                let (w, wd) = pair(&[n], &mut rng, param, dev);
                let norm = |w: &Tensor| RmsNorm {
                    weight: w.clone(),
                    eps: 1e-5,
                };
                let y = norm(&w).forward(&x).unwrap();
                let yd = norm(&wd).forward(&xd).unwrap();
                assert_eq!(yd.dtype(), dtype);
                assert_close(&format!("{what}: y"), &yd, &y, tol(dtype));
                backward(&y, 1);
                backward(&yd, 1);
                let t = 2.0 * tol(dtype);
                assert_close(
                    &format!("{what}: dx"),
                    &xd.grad().unwrap(),
                    &x.grad().unwrap(),
                    t,
                );
                let dw = wd.grad().unwrap();
                assert_eq!(dw.dtype(), param, "{what}: dw in the weight's dtype");
                assert_close(&format!("{what}: dw"), &dw, &w.grad().unwrap(), t);

                // The residual form, with a loss on both outputs.
                for t in [&x, &xd, &a, &ad, &w, &wd] {
                    t.zero_grad();
                }
                let run = |x: &Tensor, a: &Tensor, w: &Tensor| {
                    let n = Norm::from_weights(NormKind::RmsNorm, w.clone(), None, 1e-5).unwrap();
                    let (s, y) = n.residual(x, a).unwrap();
                    backward(&s.add(&y).unwrap(), 2);
                    (s, y)
                };
                let ((s, y), (sd, yd)) = (run(&x, &a, &w), run(&xd, &ad, &wd));
                assert_close(&format!("{what}: residual s"), &sd, &s, tol(dtype));
                assert_close(&format!("{what}: residual y"), &yd, &y, 2.0 * tol(dtype));
                for (name, got, want) in [("dx", &xd, &x), ("da", &ad, &a), ("dw", &wd, &w)] {
                    let (g, e) = (got.grad().unwrap(), want.grad().unwrap());
                    assert_close(
                        &format!("{what}: residual {name}"),
                        &g,
                        &e,
                        3.0 * tol(dtype),
                    );
                }
            }
        }
    }
}

/// Rotary positions on CUDA against the CPU: heads [b, h, t, d] from a start position, head
/// dims 64 and 40 (not a power of two), and the packed projection with grouped heads (4 query
/// and 2 key heads rotated, 2 value heads passed through untouched).
#[test]
fn cuda_rope_equals_the_cpu() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(22);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (d, t, start) in [(64usize, 37usize, 3usize), (40, 5, 0)] {
            let what = format!("rope {dtype} d {d} t {t} from {start}");
            let rope = Rope::new(
                RopeConfig {
                    theta: 10_000.0,
                    scaling: RopeScaling::None,
                },
                d,
            )
            .unwrap();
            let (x, xd) = pair(&[2, 3, t, d], &mut rng, dtype, dev);
            let y = rope.apply(&x, start).unwrap();
            let yd = rope.apply(&xd, start).unwrap();
            assert_close(&format!("{what}: y"), &yd, &y, 2.0 * tol(dtype));
            backward(&y, 3);
            backward(&yd, 3);
            let (g, e) = (xd.grad().unwrap(), x.grad().unwrap());
            assert_close(&format!("{what}: dx"), &g, &e, 2.0 * tol(dtype));

            let (q, qd) = pair(&[2, t, 8 * d], &mut rng, dtype, dev);
            let y = rope.apply_packed(&q, start, 6).unwrap();
            let yd = rope.apply_packed(&qd, start, 6).unwrap();
            assert_close(&format!("{what}: packed y"), &yd, &y, 2.0 * tol(dtype));
            let v = |x: &Tensor| x.narrow(2, 6 * d, 2 * d).unwrap();
            assert_eq!(vals(&v(&yd)), vals(&v(&qd)), "{what}: v untouched");
            backward(&y, 4);
            backward(&yd, 4);
            let (g, e) = (qd.grad().unwrap(), q.grad().unwrap());
            assert_close(&format!("{what}: packed dx"), &g, &e, 2.0 * tol(dtype));
        }
    }
}

/// SwiGLU on CUDA against the CPU, with a branch width that is not a power of two.
#[test]
fn cuda_swiglu_equals_the_cpu() {
    let Some(dev) = cuda() else { return };
    let mut rng = Rng::new(23);
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        for (rows, n) in [(5usize, 96usize), (33, 13)] {
            let what = format!("swiglu {dtype} {rows}×{n}");
            let (h, hd) = pair(&[rows, 2 * n], &mut rng, dtype, dev);
            let act = |h: &Tensor| MlpKind::SwiGlu.activate(h).unwrap();
            let (y, yd) = (act(&h), act(&hd));
            assert_eq!(yd.shape(), &[rows, n]);
            assert_close(&format!("{what}: y"), &yd, &y, 2.0 * tol(dtype));
            backward(&y, 5);
            backward(&yd, 5);
            let (g, e) = (hd.grad().unwrap(), h.grad().unwrap());
            assert_close(&format!("{what}: dh"), &g, &e, 2.0 * tol(dtype));
        }
    }
}

/// A Llama block (RMSNorm, rotary positions, SwiGLU, 4 query heads of 64 over `kv` kv heads).
fn llama_block(kv: usize, seed: u64) -> TransformerBlock {
    let cfg = BlockConfig {
        n_kv_head: kv,
        head_dim: 64,
        mlp_hidden: 352,
        mlp: MlpKind::SwiGlu,
        norm: NormKind::RmsNorm,
        norm_eps: 1e-5,
        qkv_bias: false,
        out_bias: false,
        mlp_bias: false,
        rope: Some(RopeConfig {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        }),
        ..BlockConfig::gpt2(256, 4, 1, 0.0)
    };
    let b = TransformerBlock::new(&cfg, &mut Rng::new(seed), &shared_rng(seed)).unwrap();
    let mut rng = Rng::new(seed + 1);
    for (_, p) in b.parameters() {
        let r = Tensor::randn(p.shape(), 0.0, 0.06, &mut rng, DType::F32, Device::Cpu).unwrap();
        let r = if p.rank() == 1 {
            r.add_scalar(1.0).unwrap()
        } else {
            r
        };
        p.assign(&r).unwrap();
    }
    b
}

/// One training step's forward and backward of a grouped-query Llama block (kv groups 2 and
/// 4, t = 70, off the attention tiles) on CUDA — f32, and under bf16 autocast where the flash
/// kernels read the grouped packed heads — against the CPU block in f32: the output, the
/// input's gradient and every parameter's gradient.
#[test]
fn cuda_llama_block_step_equals_the_cpu() {
    let Some(dev) = cuda() else { return };
    for (kv, autocast) in [(2usize, true), (1, true), (2, false)] {
        let what = format!("kv {kv} autocast {autocast}");
        let run = |dev: Device, autocast: bool| {
            let b = llama_block(kv, 40);
            move_module(&b, dev).unwrap();
            let x = Tensor::randn(
                &[2, 70, 256],
                0.0,
                1.0,
                &mut Rng::new(41),
                DType::F32,
                Device::Cpu,
            )
            .unwrap()
            .to_device(dev)
            .unwrap()
            .to_var()
            .unwrap();
            let y = {
                let _ac = autocast.then(|| amp::autocast(DType::BF16));
                b.forward(&x).unwrap()
            };
            backward(&y, 42);
            let mut out = vec![("y".to_string(), y), ("dx".to_string(), x.grad().unwrap())];
            for (n, p) in b.parameters() {
                out.push((
                    n.clone(),
                    p.grad().unwrap_or_else(|| panic!("{n}: no gradient")),
                ));
            }
            out
        };
        let (got, want) = (run(dev, autocast), run(Device::Cpu, false));
        let t = if autocast { 4e-2 } else { 1e-4 };
        for ((n, g), (_, e)) in got.iter().zip(&want) {
            assert_close(&format!("{what}: {n}"), g, e, t);
        }
    }
}
