//! The kernels of `optimizer.cu` (AdamW, SGD, the step control block) run through the kernel
//! emulator from their launch plans, against f64 references, threads in both orders; NVRTC's
//! check of every kernel of the source against the plans' argument lists; and the host's
//! constants against the kernel's.
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

// The emulated-kernel tests' guarded buffers, tolerances and emulator (one harness for both
// crates' kernel tests).
#[path = "../../../../sinter-cuda/tests/emu/harness.rs"]
mod harness;

use std::collections::HashSet;
use std::sync::Arc;

use harness::*;
use sinter_cuda::emu::{EmuLibrary, Emulator};
use sinter_cuda::launch::{Arg, LaunchTarget};
use sinter_cuda::ops::table::Call;
use sinter_cuda::user_kernel::UserLaunch;
use sinter_cuda::{DType, DevSlice};

use super::control::{ctl, ScalerCfg};
use super::plans::{self, AdamW, Sgd, OPTIMIZER_CU};

/// `optimizer.cu` built by the kernel emulator (once per emulator).
fn library(e: &Emulator) -> Arc<EmuLibrary> {
    let src = plans::OPTIMIZER.source().unwrap();
    e.library_from_source(&src.emu_stem(), src.program_source())
        .unwrap_or_else(|err| panic!("{err}"))
}

/// The AdamW launch with a half `copy` of the new parameters and the kernel arguments `a` (e.g.
/// a found_inf flag that skips the step when set): what the kernels offer beyond the plans,
/// planned from the rows directly.
fn adamw_launch(
    t: &LaunchTarget,
    [p, g, m, v]: [DevSlice<'_>; 4],
    copy: Option<DevSlice<'_>>,
    a: plans::AdamArgs,
) -> sinter_cuda::Result<Option<UserLaunch>> {
    let scalars = [Arg::bytes(&a)];
    let (row, operands) = match copy {
        None => (&plans::ADAMW, vec![p, g, m, v]),
        Some(c) => (&plans::ADAMW_COPY, vec![p, g, m, v, c]),
    };
    let dtype2 = copy.map_or(DType::F32, |c| c.dtype());
    let call = Call::new(DType::F32, p.len(), &operands)
        .dtype2(dtype2)
        .scalars(&scalars);
    row.plan_user(t, &call)
}

/// Runs `l` once (threads in forward order), then checks the canaries of `bufs`.
fn run1(e: &Emulator, l: &UserLaunch, bufs: &[&Buf]) {
    let lib = library(e);
    // SAFETY: every pointer in the launch comes from a live `Buf` of the calling test.
    run_once(&l.kernel, |o| unsafe { e.run_in(&lib, &l.plan(), o) }, bufs);
}

/// Runs `l` in both thread orders from the same inputs; the results must be bit-identical.
fn run_both(e: &Emulator, l: &UserLaunch, bufs: &mut [&mut Buf]) {
    let lib = library(e);
    // SAFETY: as in `run1`.
    run_twice(&l.kernel, |o| unsafe { e.run_in(&lib, &l.plan(), o) }, bufs);
}

#[test]
fn adamw_sgd_and_grad_norm() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(25);
    for (n, shift) in [(32 * 256 * 4 + 4 * 3 + 2, 0usize), (999, 1)] {
        let pv = rng.vec(n, -1.0, 1.0);
        let gv = rng.vec(n, -1.0, 1.0);
        let mv = rng.vec(n, -0.1, 0.1);
        let vv = rng.vec(n, 0.0, 0.01);
        let cfg = AdamW {
            hyper: sinter_types::AdamW {
                lr: 1e-2,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.1,
                step: 3,
            },
            grad_scale: 0.5,
        };
        for copy in [None, Some(DType::BF16), Some(DType::F16)] {
            for skip in [false, true] {
                let p = Buf::from_f64(DType::F32, &pv, shift);
                let g = Buf::from_f64(DType::F32, &gv, shift);
                let m = Buf::from_f64(DType::F32, &mv, shift);
                let v = Buf::from_f64(DType::F32, &vv, shift);
                let c = copy.map(|d| Buf::zeros(d, n, shift));
                let fi = Buf::from_f64(DType::F32, &[skip as i32 as f64], 0);
                let l = adamw_launch(
                    &T1,
                    [p.slice(), g.slice(), m.slice(), v.slice()],
                    c.as_ref().map(|c| c.slice()),
                    cfg.args(fi.slice().ptr()).unwrap(),
                )
                .unwrap()
                .unwrap();
                run1(e, &l, &[&p, &g, &m, &v, &fi]);
                let mut want = (vec![0.0; n], vec![0.0; n], vec![0.0; n]);
                let t = cfg.hyper.step as i32;
                let (bc1, bc2) = (1.0 - cfg.hyper.beta1.powi(t), 1.0 - cfg.hyper.beta2.powi(t));
                for i in 0..n {
                    let gg = gv[i] as f32 as f64 * cfg.grad_scale as f64;
                    let mm = cfg.hyper.beta1 * mv[i] as f32 as f64 + (1.0 - cfg.hyper.beta1) * gg;
                    let v2 =
                        cfg.hyper.beta2 * vv[i] as f32 as f64 + (1.0 - cfg.hyper.beta2) * gg * gg;
                    let pp = pv[i] as f32 as f64 * (1.0 - cfg.hyper.lr * cfg.hyper.weight_decay)
                        - cfg.hyper.lr * (mm / bc1) / ((v2 / bc2).sqrt() + cfg.hyper.eps);
                    if skip {
                        want = (p.get(), m.get(), v.get());
                        want.0 = pv.iter().map(|&x| x as f32 as f64).collect();
                        want.1 = mv.iter().map(|&x| x as f32 as f64).collect();
                        want.2 = vv.iter().map(|&x| x as f32 as f64).collect();
                        break;
                    }
                    want.0[i] = pp;
                    want.1[i] = mm;
                    want.2[i] = v2;
                }
                let what = format!("adamw copy {copy:?} skip {skip} n {n}");
                assert_close(&format!("{what} p"), &p.get(), &want.0, (1e-5, 1e-6));
                assert_close(&format!("{what} m"), &m.get(), &want.1, (1e-5, 1e-7));
                assert_close(&format!("{what} v"), &v.get(), &want.2, (1e-5, 1e-8));
                if let (Some(c), Some(d)) = (&c, copy) {
                    c.check_guards(&what);
                    let wc: Vec<f64> = if skip {
                        vec![f64::NAN; n] // skipped step: the copy keeps its (NaN-filled) contents
                    } else {
                        p.get().iter().map(|&x| q(d, x)).collect()
                    };
                    assert_close(&format!("{what} copy"), &c.get(), &wc, (0.0, 0.0));
                }
            }
        }

        for (momentum, nesterov, first) in [
            (0.0f32, false, false),
            (0.9, false, true),
            (0.9, true, false),
        ] {
            let cfg = Sgd {
                lr: 0.1,
                momentum,
                dampening: 0.1,
                weight_decay: 0.01,
                nesterov,
                first_step: first,
                grad_scale: 2.0,
            };
            let bv = rng.vec(n, -0.5, 0.5);
            let p = Buf::from_f64(DType::F32, &pv, shift);
            let g = Buf::from_f64(DType::F32, &gv, shift);
            let b = Buf::from_f64(DType::F32, &bv, shift);
            let l = plans::plan_sgd(
                &T1,
                p.slice(),
                g.slice(),
                (momentum != 0.0).then(|| b.slice()),
                &cfg,
            )
            .unwrap()
            .unwrap();
            run1(e, &l, &[&p, &g, &b]);
            let (mut wp, mut wb) = (
                vec![0.0; n],
                bv.iter().map(|&x| x as f32 as f64).collect::<Vec<_>>(),
            );
            for i in 0..n {
                let p0 = pv[i] as f32 as f64;
                let mut dd = gv[i] as f32 as f64 * 2.0 + 0.01f32 as f64 * p0;
                if momentum != 0.0 {
                    let m = momentum as f64;
                    let buf = if first {
                        dd
                    } else {
                        m * wb[i] + (1.0 - 0.1f32 as f64) * dd
                    };
                    wb[i] = buf;
                    dd = if nesterov { dd + m * buf } else { buf };
                }
                wp[i] = p0 - 0.1f32 as f64 * dd;
            }
            let what = format!("sgd momentum {momentum} nesterov {nesterov} first {first}");
            assert_close(&format!("{what} p"), &p.get(), &wp, (1e-5, 1e-6));
            assert_close(&format!("{what} buf"), &b.get(), &wb, (1e-5, 1e-6));
        }
    }
}

/// The step control block's slots, named for the references below.
fn ctl_block(lr: f64, steps: f64, scale: f64, good: f64, iter: f64) -> Vec<f64> {
    let mut c = vec![0.0; ctl::LEN];
    c[ctl::FOUND_INF] = 1.0; // stale: step_prepare must overwrite it
    c[ctl::LR] = lr;
    c[ctl::STEPS] = steps;
    c[ctl::GRAD_FACTOR] = 123.0; // stale as well
    c[ctl::SCALE] = scale;
    c[ctl::GOOD_STEPS] = good;
    c[ctl::ITER] = iter;
    c[ctl::SKIPPED] = 2.0;
    c
}

#[test]
fn step_control_block_drives_adamw_and_sgd() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(26);
    let n = 2000 + 3;
    let pv = rng.vec(n, -1.0, 1.0);
    // Loss-scaled gradients (scale 1024).
    let gv: Vec<f64> = rng.vec(n, -1.0, 1.0).iter().map(|g| g * 1024.0).collect();
    let mv = rng.vec(n, -0.1, 0.1);
    let vv = rng.vec(n, 0.0, 0.01);
    let table = [0.5, 0.25, 0.125, 0.0625];
    let scaler = ScalerCfg {
        growth: 2.0,
        backoff: 0.5,
        interval: 2,
    };
    // (sumsq, max_norm, dynamic, scaler): clipped good step that grows the scale; overflow that
    // skips the step and backs off; no clipping and no dynamic scaling (found_inf stays 0 even
    // for an infinite norm, as on the CPU).
    let sumsq_good = gv.iter().map(|g| (g * g) as f32 as f64).sum::<f64>();
    for (sumsq, max_norm, dynamic, with_scaler) in [
        (sumsq_good, 1.0f32, true, true),
        (f64::INFINITY, 1.0, true, true),
        (sumsq_good, 0.0, false, false),
    ] {
        let c0 = ctl_block(0.01, 4.0, 1024.0, 1.0, 5.0);
        let mut c = Buf::from_f64(DType::F32, &c0, 0);
        let mut s = Buf::from_f64(DType::F32, &[sumsq], 0);
        let what = format!("sumsq {sumsq} max_norm {max_norm} dynamic {dynamic}");
        let l = plans::plan_step_prepare(&T1, c.slice(), s.slice(), max_norm, dynamic).unwrap();
        run_both(e, &l, &mut [&mut c, &mut s]);
        let s32 = sumsq as f32;
        let bad = !s32.is_finite();
        let norm = s32.sqrt() / 1024.0;
        let clip = if !bad && max_norm > 0.0 && norm > max_norm {
            max_norm / (norm + 1e-6)
        } else {
            1.0
        };
        let mut want_c = c0.clone();
        want_c[ctl::FOUND_INF] = (dynamic && bad) as i32 as f64;
        want_c[ctl::GRAD_NORM] = norm as f64;
        want_c[ctl::GRAD_FACTOR] = (clip / 1024.0) as f64;
        assert_close(
            &format!("{what}: step_prepare"),
            &c.get(),
            &want_c,
            (1e-6, 0.0),
        );
        if !bad {
            assert!(
                (norm as f64 - sumsq.sqrt() / 1024.0).abs() < 1e-3,
                "{what}: norm"
            );
        }
        let skip = dynamic && bad;
        let factor = c.get()[ctl::GRAD_FACTOR];

        // AdamW from the block: lr 0.01, t = steps + 1 = 5; cfg.hyper.lr / cfg.hyper.step are ignored.
        let cfg = AdamW {
            hyper: sinter_types::AdamW {
                lr: 99.0,
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                weight_decay: 0.1,
                step: 1,
            },
            grad_scale: 1.0,
        };
        let mut p = Buf::from_f64(DType::F32, &pv, 0);
        let mut g = Buf::from_f64(DType::F32, &gv, 0);
        let mut m = Buf::from_f64(DType::F32, &mv, 0);
        let mut v = Buf::from_f64(DType::F32, &vv, 0);
        let mut cp = Buf::from_f64(DType::BF16, &vec![7.0; n], 0);
        let l = adamw_launch(
            &T1,
            [p.slice(), g.slice(), m.slice(), v.slice()],
            Some(cp.slice()),
            plans::ctl_args(&cfg, c.slice()).unwrap(),
        )
        .unwrap()
        .unwrap();
        run_both(
            e,
            &l,
            &mut [&mut p, &mut g, &mut m, &mut v, &mut cp, &mut c],
        );
        let f32v = |x: &[f64]| x.iter().map(|&y| y as f32 as f64).collect::<Vec<_>>();
        let (mut wp, mut wm, mut wv) = (f32v(&pv), f32v(&mv), f32v(&vv));
        let mut wc = vec![7.0; n];
        if !skip {
            // The hyper-parameters are f64 (cfg); the learning rate is the block's f32.
            let (b1, b2, lr, wd) = (0.9f64, 0.999f64, 0.01f32 as f64, 0.1);
            let (bc1, bc2) = (1.0 - b1.powi(5), 1.0 - b2.powi(5));
            for i in 0..n {
                let gg = gv[i] as f32 as f64 * factor;
                wm[i] = b1 * wm[i] + (1.0 - b1) * gg;
                wv[i] = b2 * wv[i] + (1.0 - b2) * gg * gg;
                wp[i] =
                    wp[i] * (1.0 - lr * wd) - lr * (wm[i] / bc1) / ((wv[i] / bc2).sqrt() + 1e-8);
            }
            wc = p.get().iter().map(|&x| q(DType::BF16, x)).collect();
        }
        assert_close(&format!("{what}: adamw p"), &p.get(), &wp, (1e-5, 1e-6));
        assert_close(&format!("{what}: adamw m"), &m.get(), &wm, (1e-5, 1e-7));
        assert_close(&format!("{what}: adamw v"), &v.get(), &wv, (1e-5, 1e-9));
        assert_close(&format!("{what}: adamw copy"), &cp.get(), &wc, (0.0, 0.0));

        // SGD with momentum and nesterov from the block (cfg.hyper.lr ignored).
        let bv = rng.vec(n, -0.5, 0.5);
        let sgd = Sgd {
            lr: 99.0,
            momentum: 0.9,
            dampening: 0.0,
            weight_decay: 0.01,
            nesterov: true,
            first_step: false,
            grad_scale: 1.0,
        };
        let mut p = Buf::from_f64(DType::F32, &pv, 0);
        let mut b = Buf::from_f64(DType::F32, &bv, 0);
        let l = plans::plan_sgd_ctl(&T1, p.slice(), g.slice(), Some(b.slice()), &sgd, c.slice())
            .unwrap()
            .unwrap();
        run_both(e, &l, &mut [&mut p, &mut g, &mut b, &mut c]);
        let (mut wp, mut wb) = (f32v(&pv), f32v(&bv));
        if !skip {
            for i in 0..n {
                let d = gv[i] as f32 as f64 * factor + 0.01f32 as f64 * wp[i];
                wb[i] = 0.9f32 as f64 * wb[i] + d;
                wp[i] -= 0.01f32 as f64 * (d + 0.9f32 as f64 * wb[i]);
            }
        }
        assert_close(&format!("{what}: sgd p"), &p.get(), &wp, (1e-5, 1e-6));
        assert_close(&format!("{what}: sgd buf"), &b.get(), &wb, (1e-5, 1e-6));

        // step_finish: counters, loss scale and the next learning rate (iter 6 is past the end
        // of the table: its last entry).
        let mut t = Buf::from_f64(DType::F32, &table, 0);
        let before = c.get();
        let l = plans::plan_step_finish(&T1, c.slice(), t.slice(), with_scaler.then_some(scaler))
            .unwrap();
        run_both(e, &l, &mut [&mut c, &mut t]);
        let mut want = before.clone();
        if skip {
            want[ctl::SCALE] = 512.0;
            want[ctl::GOOD_STEPS] = 0.0;
            want[ctl::SKIPPED] = 3.0;
        } else {
            want[ctl::STEPS] = 5.0;
            if with_scaler {
                // good 1 + 1 reaches the interval of 2: the scale grows, the tracker restarts.
                want[ctl::SCALE] = 2048.0;
                want[ctl::GOOD_STEPS] = 0.0;
            }
        }
        want[ctl::FOUND_INF] = 0.0;
        want[ctl::ITER] = 6.0;
        want[ctl::LR] = 0.0625;
        assert_close(&format!("{what}: step_finish"), &c.get(), &want, (0.0, 0.0));
    }
}

/// Two steps of `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)`
/// on f32, plain and driven by the step control block: bit for bit the shared rule
/// (`sinter_types::AdamW`: the f64 hyper-parameters, each scalar factor rounded to f32 once, as
/// PyTorch computes them from Python floats). PyTorch's own values for these two steps are
/// checked on the CPU and the CUDA device by sinter-core's tests/semantics.rs.
#[test]
fn adamw_follows_the_shared_rule_step_by_step() {
    let Some(e) = emu() else { return };
    let grads = [[0.1, -0.2, 3.0, 1e-3], [-0.3, 0.05, 2.5, 0.0]];
    for with_ctl in [false, true] {
        let p = Buf::from_f64(DType::F32, &[0.5, -1.25, 2.0, 0.0], 0);
        let m = Buf::from_f64(DType::F32, &[0.0; 4], 0);
        let v = Buf::from_f64(DType::F32, &[0.0; 4], 0);
        for (step, gv) in grads.iter().enumerate() {
            let cfg = AdamW {
                hyper: sinter_types::AdamW {
                    lr: 1e-3,
                    beta1: 0.9,
                    beta2: 0.999,
                    eps: 1e-8,
                    weight_decay: 0.01,
                    step: step as u64 + 1,
                },
                grad_scale: 1.0,
            };
            let g = Buf::from_f64(DType::F32, gv, 0);
            let (l, c) = if with_ctl {
                // lr and the step count from the block (its lr is f32: 1e-3 within 1e-11).
                let mut block = vec![0.0; ctl::LEN];
                block[ctl::LR] = 1e-3;
                block[ctl::STEPS] = step as f64;
                block[ctl::GRAD_FACTOR] = 1.0;
                let c = Buf::from_f64(DType::F32, &block, 0);
                let cfg = AdamW {
                    hyper: sinter_types::AdamW {
                        lr: 99.0,
                        ..cfg.hyper
                    },
                    ..cfg
                }
                .at_step(1);
                let l = plans::plan_adamw_ctl(
                    &T1,
                    p.slice(),
                    g.slice(),
                    m.slice(),
                    v.slice(),
                    &cfg,
                    c.slice(),
                );
                (l, Some(c))
            } else {
                let l = plans::plan_adamw(&T1, p.slice(), g.slice(), m.slice(), v.slice(), &cfg);
                (l, None)
            };
            let before = (p.get(), m.get(), v.get());
            let mut bufs = vec![&p, &g, &m, &v];
            bufs.extend(c.as_ref());
            run1(e, &l.unwrap().unwrap(), &bufs);
            // The host reference (`AdamW::reference`) is the kernel's arithmetic, bit for bit
            // (with the block's f32 learning rate when the block drives the step).
            let lr = if with_ctl {
                1e-3f32 as f64
            } else {
                cfg.hyper.lr
            };
            let cfg = AdamW {
                hyper: sinter_types::AdamW { lr, ..cfg.hyper },
                ..cfg
            };
            for (i, &gi) in gv.iter().enumerate() {
                let f = |x: f64| x as f32;
                let (rp, rm, rv) =
                    cfg.reference(f(before.0[i]), f(gi), f(before.1[i]), f(before.2[i]));
                let got = (f(p.get()[i]), f(m.get()[i]), f(v.get()[i]));
                assert_eq!(got, (rp, rm, rv), "adamw (ctl {with_ctl}) element {i}");
            }
        }
    }
}

/// AdamW through the device functions on the test device (a real GPU when there is one, else
/// emulated): with a bf16 copy of the parameters against the host reference, then skipped for a
/// set found_inf flag.
#[test]
fn adamw_on_the_test_device_with_a_copy_and_a_skip() {
    use half::bf16;
    use sinter_cuda::{CudaDevice, Pool};
    if sinter_cuda::testing::gpu_tests(1).is_none() {
        return;
    }
    let d = CudaDevice::get(0).unwrap();
    let n = 1003;
    let vals = |seed| crate::kernels::test_support::values(seed, n, -1.0, 1.0);
    let (pv, gv, mv) = (vals(22), vals(23), vals(24));
    let vv: Vec<f32> = vals(25).iter().map(|x| x.abs() * 0.01).collect();
    let up = |v: &[f32]| d.htod(v, Pool::Temporary).unwrap();
    let (p, g, m, v) = (up(&pv), up(&gv), up(&mv), up(&vv));
    let copy = d.alloc_zeros(n, DType::BF16, Pool::Temporary).unwrap();
    let cfg = AdamW {
        hyper: sinter_types::AdamW {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 3,
        },
        grad_scale: 0.5,
    };
    let (ps, gs, ms, vs) = (p.as_slice(), g.as_slice(), m.as_slice(), v.as_slice());
    let run = |copy, found_inf: Option<sinter_cuda::DevSlice<'_>>| {
        let a = cfg.args(found_inf.map_or(0, |f| f.ptr())).unwrap();
        let l = adamw_launch(&d.target(), [ps, gs, ms, vs], copy, a);
        let src = plans::OPTIMIZER.source().unwrap();
        d.launch_user(src, &l.unwrap().unwrap()).unwrap();
    };
    run(Some(copy.as_slice()), None);
    let want: Vec<(f32, f32, f32)> = (0..n)
        .map(|i| cfg.reference(pv[i], gv[i], mv[i], vv[i]))
        .collect();
    let got_p = d.dtoh::<f32>(ps).unwrap();
    let got_m = d.dtoh::<f32>(ms).unwrap();
    let got_copy = d.dtoh::<bf16>(copy.as_slice()).unwrap();
    for i in 0..n {
        let (wp, wm, _) = want[i];
        assert!((got_p[i] - wp).abs() <= 1e-5 * wp.abs().max(1.0), "p[{i}]");
        assert!((got_m[i] - wm).abs() <= 1e-5 * wm.abs().max(1.0), "m[{i}]");
        assert_eq!(got_copy[i], bf16::from_f32(got_p[i]), "copy[{i}]");
    }
    // A set found_inf flag skips the step on the device.
    let inf = up(&[1.0]);
    run(None, Some(inf.as_slice()));
    assert_eq!(d.dtoh::<f32>(ps).unwrap(), got_p);
}

#[test]
fn nvrtc_compiles_every_kernel_and_the_plans_match_their_parameters() {
    if !crate::kernels::test_support::nvrtc_available() {
        return;
    }
    let src = plans::OPTIMIZER.source().unwrap();
    let samples = plans::samples(&LaunchTarget { sm_count: 132 });
    for arch in ["sm_80", "sm_90"] {
        let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
        for l in &samples {
            src.check_launch(&ptx, l)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
        }
        // No kernel of the source is left without a row.
        let planned: HashSet<&str> = samples.iter().map(|l| l.kernel.as_str()).collect();
        for e in &ptx.entries {
            assert!(
                planned.contains(e.name.as_str()),
                "{arch}: {} has no plan",
                e.name
            );
        }
    }
}

#[test]
fn the_control_block_slots_and_slot_counts_are_the_kernels() {
    for (name, slot) in [
        ("FOUND_INF", ctl::FOUND_INF),
        ("LR", ctl::LR),
        ("STEPS", ctl::STEPS),
        ("GRAD_FACTOR", ctl::GRAD_FACTOR),
        ("SCALE", ctl::SCALE),
        ("GOOD_STEPS", ctl::GOOD_STEPS),
        ("ITER", ctl::ITER),
        ("SKIPPED", ctl::SKIPPED),
        ("GRAD_NORM", ctl::GRAD_NORM),
    ] {
        let define = format!("#define CTL_{name} {slot}\n");
        assert!(
            OPTIMIZER_CU.contains(&define),
            "optimizer.cu lacks `{define}`"
        );
    }
    assert_eq!(ctl::LEN, 9);
    let slots = format!("#define ADAMW_SLOTS {}\n", plans::ADAMW_SLOTS);
    assert!(
        OPTIMIZER_CU.contains(&slots),
        "optimizer.cu lacks `{slots}`"
    );
    let chunk = format!("#define ADAMW_CHUNK {}", plans::ADAMW_CHUNK);
    assert!(
        OPTIMIZER_CU.contains(&chunk),
        "optimizer.cu lacks `{chunk}`"
    );
}

/// Operand `k` of a golden sample at its own address (never dereferenced), so the recorded
/// pointers do not depend on test order.
fn at(k: u64, dtype: DType, len: usize) -> sinter_cuda::DevSlice<'static> {
    // SAFETY: only used to build launch plans, never dereferenced.
    unsafe { sinter_cuda::DevSlice::from_raw(0x7000_0000_0000 + k * 0x100_0000, len, dtype) }
}

/// The launches of sample calls of every plan, pinned against `launches.golden` (recorded from
/// the hand-written plans before the kernel table's rows replaced them; see
/// `sinter_cuda::golden`).
#[test]
fn planned_launches_match_the_recorded_ones() {
    use sinter_cuda::golden::user_launch_text;
    let mut lines = Vec::new();
    let mut rec = |label: String, r: sinter_cuda::Result<Vec<UserLaunch>>| match r {
        _ if label.starts_with('#') => lines.push(label),
        Ok(ls) if ls.is_empty() => lines.push(format!("{label}: none")),
        Ok(ls) => {
            for (k, l) in ls.iter().enumerate() {
                lines.push(format!("{label} [{k}]: {}", user_launch_text(l)));
            }
        }
        Err(e) => lines.push(format!("{label}: error {e}")),
    };
    let f = |k, n| at(k, DType::F32, n);
    let cfg = AdamW {
        hyper: sinter_types::AdamW {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step: 7,
        },
        grad_scale: 0.5,
    };
    let sgd = Sgd {
        lr: 0.1,
        momentum: 0.9,
        dampening: 0.1,
        weight_decay: 0.01,
        nesterov: true,
        first_step: false,
        grad_scale: 2.0,
    };
    let c = at(9, DType::F32, ctl::LEN);
    for sm_count in [1, 132] {
        let t = LaunchTarget { sm_count };
        let t = &t;
        rec(format!("# sm_count {sm_count}"), Ok(Vec::new()));
        for n in [0usize, 1, 1000, 1 << 22] {
            let (p, g, m, v) = (f(0, n), f(1, n), f(2, n), f(3, n));
            let l = plans::plan_adamw(t, p, g, m, v, &cfg);
            rec(format!("adamw {n}"), l.map(Vec::from_iter));
            let l = plans::plan_adamw_ctl(t, p, g, m, v, &cfg, c);
            rec(format!("adamw_ctl {n}"), l.map(Vec::from_iter));
            for d in [DType::BF16, DType::F16] {
                let (copy, fi) = (at(4, d, n), f(5, 1));
                let l = cfg.args(fi.ptr());
                let l = l.and_then(|a| adamw_launch(t, [p, g, m, v], Some(copy), a));
                rec(format!("adamw_copy {d:?} {n}"), l.map(Vec::from_iter));
            }
            for buf in [None, Some(f(6, n))] {
                let l = plans::plan_sgd(t, p, g, buf, &sgd);
                rec(format!("sgd {n} {}", buf.is_some()), l.map(Vec::from_iter));
                let l = plans::plan_sgd_ctl(t, p, g, buf, &sgd, c);
                rec(
                    format!("sgd_ctl {n} {}", buf.is_some()),
                    l.map(Vec::from_iter),
                );
            }
        }
        for count in [0usize, 3, 33, 70] {
            let slots: Vec<plans::AdamSlot> = (0..count)
                .map(|k| {
                    let n = [0, 10, 4096, 4097, 3 * 4096 + 1][k % 5];
                    let base = 16 + 4 * k as u64;
                    plans::AdamSlot {
                        param: f(base, n),
                        grad: f(base + 1, n),
                        m: f(base + 2, n),
                        v: f(base + 3, n),
                        weight_decay: 0.01 * k as f64,
                        lr: 1e-3 * (k + 1) as f64,
                        lr_scale: 0.5 + k as f32,
                    }
                })
                .collect();
            for ctl in [None, Some(c)] {
                let l = plans::plan_adamw_multi(t, &slots, &cfg, ctl);
                rec(format!("adamw_multi {count} {}", ctl.is_some()), l);
            }
        }
        for (max_norm, dynamic) in [(1.0, true), (0.0, false)] {
            let l = plans::plan_step_prepare(t, c, f(7, 1), max_norm, dynamic);
            rec(
                format!("step_prepare {max_norm} {dynamic}"),
                l.map(|l| vec![l]),
            );
        }
        let scaler = ScalerCfg {
            growth: 2.0,
            backoff: 0.5,
            interval: 2000,
        };
        for s in [None, Some(scaler)] {
            let l = plans::plan_step_finish(t, c, f(8, 100), s);
            rec(format!("step_finish {}", s.is_some()), l.map(|l| vec![l]));
        }
        let mixed = [
            (DType::F32, 1000),
            (DType::F32, 5000),
            (DType::BF16, 100),
            (DType::F16, 0),
            (DType::F32, 4096 * 300),
        ];
        let many: Vec<(DType, usize)> = (0..200).map(|k| (DType::F32, 7 * k)).collect();
        for (what, list) in [("mixed", &mixed[..]), ("many", &many[..])] {
            let xs: Vec<_> = (0..)
                .zip(list)
                .map(|(k, &(d, n))| at(300 + k, d, n))
                .collect();
            let total = xs.iter().map(|x| plans::sumsq_blocks(x.len())).sum();
            let l = plans::plan_sum_squares(t, &xs, f(10, total), f(11, 1));
            rec(format!("sum_squares {what}"), l);
        }
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/kernels/optimizer/launches.golden");
    sinter_cuda::golden::check(&path, &lines);
}
