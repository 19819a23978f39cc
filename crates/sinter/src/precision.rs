//! Trainer hooks for devices and numeric precision: `--device` resolution, `--precision`
//! (fp32 | tf32 | bf16 | fp16, with fp32 master weights and dynamic loss scaling for fp16),
//! device memory peaks, and the text of `sinter info`.
//!
//! The training loop enters `precision.enter_autocast()` around the forward pass and gives
//! `precision.scaler()` (fp16: the scale to start from and the scaler's settings) to a
//! `sinter_nn::StepControl`, which scales the loss, skips overflowing steps and grows or shrinks
//! the scale on the device; at checkpoints it hands the scale read back from the device to
//! `set_scaler_state`, so `state` saves it. ZeRO, which keeps its own step, uses
//! `scale_loss`, `set_should_step` (with the overflow verdict agreed over the ranks) and
//! `end_step` instead.

use anyhow::{anyhow, bail, Context, Result};
use sinter_core::{amp::AutocastGuard, Device, Tensor};
use sinter_nn::{LossScaler, LossScalerState, PrecisionMode};

/// The values `--precision` accepts, for messages.
pub const VALID_PRECISIONS: &str = "fp32, tf32, bf16, fp16";

/// Parses `--precision`: fp32, tf32, bf16 or fp16 (see [`Precision`]).
pub fn parse_precision(s: &str) -> Result<Precision> {
    let mode = PrecisionMode::parse(s).ok_or_else(|| {
        anyhow!(
            "unknown precision '{s}'; valid precisions: {VALID_PRECISIONS} \
             (fp32: full f32; tf32: f32 with TF32 tensor-core matrix products on CUDA; \
             bf16 / fp16: f32 master weights, matrix products in bf16 / fp16 with f32 \
             accumulation, fp16 with dynamic loss scaling)"
        )
    })?;
    Ok(Precision::new(mode))
}

/// How the training loop computes: the autocast region for the forward pass and, for fp16,
/// the loss scaler around backward and the optimizer step.
#[derive(Clone, Debug)]
pub struct Precision {
    mode: PrecisionMode,
    scaler: Option<LossScaler>,
    /// The step's overflow verdict (true: gradients finite, take the step).
    step_ok: bool,
}

impl Precision {
    pub fn new(mode: PrecisionMode) -> Precision {
        Precision {
            mode,
            scaler: mode.needs_loss_scaling().then(LossScaler::default),
            step_ok: true,
        }
    }

    /// Sets up the process for this precision on `device` (call once, after resolving the
    /// device): tf32 turns on TF32 matrix products for CUDA. Returns a line for the user when
    /// the mode means something different there (tf32 on the CPU is plain fp32; bf16 and fp16
    /// on the CPU round to those types but compute in f32, so they are not faster).
    pub fn activate(&self, device: Device) -> Option<String> {
        if device.is_cuda() {
            sinter_core::cuda::set_allow_tf32(self.mode == PrecisionMode::Tf32);
            return None;
        }
        match self.mode {
            PrecisionMode::Fp32 => None,
            PrecisionMode::Tf32 => Some("precision tf32 on the CPU: TF32 is a GPU tensor-core format; computing in fp32".into()),
            m => Some(format!(
                "precision {m} on the CPU: matrix products round their operands to {m} but compute in f32 (for checking numerics; no speed-up without a GPU)"
            )),
        }
    }

    /// Enters the autocast region for the forward pass (and the loss): bf16 / fp16 matrix
    /// products; None (nothing to do) for fp32 and tf32. Keep the guard alive over the forward
    /// pass and drop it before `backward`.
    pub fn enter_autocast(&self) -> Option<AutocastGuard> {
        self.mode.autocast()
    }

    /// The loss to call `backward` on: multiplied by the loss scale for fp16, else as is.
    pub fn scale_loss(&self, loss: &Tensor) -> Result<Tensor> {
        Ok(match &self.scaler {
            Some(s) => s.scale_loss(loss)?,
            None => loss.clone(),
        })
    }

    /// Whether the optimizer should step: false after fp16 gradients overflowed (under ZeRO,
    /// the verdict of all ranks).
    pub fn set_should_step(&mut self, ok: bool) {
        self.step_ok = ok;
    }

    /// After the (possibly skipped) step: the loss scaler backs off after an overflow and grows
    /// after a run of good steps. Returns a line to report when the step was skipped.
    pub fn end_step(&mut self) -> Option<String> {
        let ok = self.step_ok;
        self.step_ok = true;
        let s = self.scaler.as_mut()?;
        s.update(!ok);
        (!ok).then(|| {
            format!(
                "fp16 gradients overflowed: step skipped, loss scale lowered to {}",
                s.scale
            )
        })
    }

    /// The fp16 loss scaler (None for the other modes): settings and current scale.
    pub fn scaler(&self) -> Option<&LossScaler> {
        self.scaler.as_ref()
    }

    /// Takes the scale and growth tracker read back from a device `StepControl` (fp16 only;
    /// a no-op otherwise), so that [`Precision::state`] saves them.
    pub fn set_scaler_state(&mut self, scale: f64, good_steps: u64) -> Result<()> {
        match self.scaler.as_mut() {
            Some(s) => s
                .load_state(LossScalerState { scale, good_steps })
                .context("reading back the fp16 loss scale"),
            None => Ok(()),
        }
    }

    /// The current loss scale (fp16 only), e.g. for metrics.
    pub fn loss_scale(&self) -> Option<f64> {
        self.scaler.as_ref().map(|s| s.scale)
    }

    /// The checkpoint entry (a JSON string for the checkpoint metadata): mode, and for fp16 the
    /// loss scale and count of good steps.
    pub fn state(&self) -> String {
        let mut v = serde_json::json!({ "precision": self.mode.as_str() });
        if let Some(s) = &self.scaler {
            let st = s.state();
            v["loss_scale"] = serde_json::json!(st.scale);
            v["good_steps"] = serde_json::json!(st.good_steps);
        }
        v.to_string()
    }

    /// Restores what `state` saved. A checkpoint from another precision is fine (the scaler
    /// starts fresh); a corrupt entry is an error.
    pub fn load_state(&mut self, state: &str) -> Result<()> {
        let v: serde_json::Value =
            serde_json::from_str(state).context("the checkpoint's precision state is not JSON")?;
        let (Some(scaler), Some(scale)) = (
            self.scaler.as_mut(),
            v.get("loss_scale").and_then(|x| x.as_f64()),
        ) else {
            return Ok(());
        };
        let good_steps = v.get("good_steps").and_then(|x| x.as_u64()).unwrap_or(0);
        scaler
            .load_state(LossScalerState { scale, good_steps })
            .context("restoring the fp16 loss scale")?;
        Ok(())
    }
}

// ---- devices ----------------------------------------------------------------------------------

/// `--device cuda-emu`: the emulated CUDA device.
pub const EMULATED: &str = "cuda-emu";

/// Turns on the emulated CUDA device for `--device cuda-emu` (one emulated device per local
/// rank, so each rank of `sinter launch` gets its own, as on a real node). Call before any
/// CUDA use; other devices are left alone.
pub fn enable_emulation(device: &str, local_ranks: usize) -> Result<()> {
    if device == EMULATED {
        sinter_core::cuda::runtime::enable_emulation(local_ranks.max(1))
            .map_err(|e| anyhow!("--device cuda-emu: {e}"))?;
    }
    Ok(())
}

/// `auto` (CUDA device 0 when CUDA can be used here, else the CPU, with a line saying why),
/// `cpu`, `cuda` (= `cuda:0`), `cuda:N` or `cuda-emu` (after [`enable_emulation`]); a CUDA device that cannot be used is an error that
/// quotes the CUDA report (what loads, what is missing, how to fix it).
pub fn resolve_device_noted(name: &str) -> Result<(Device, Option<String>)> {
    if name == "auto" {
        if sinter_core::cuda::is_available() && sinter_core::cuda::device_count() > 0 {
            let label = sinter_core::cuda::runtime::device_info(0)
                .map(|i| format!(" ({})", i.name))
                .unwrap_or_default();
            return Ok((
                Device::Cuda(0),
                Some(format!("device auto: using cuda:0{label}")),
            ));
        }
        let why = cuda_unavailable_reason();
        return Ok((
            Device::Cpu,
            Some(format!(
                "device auto: using the CPU ({} threads); {why}",
                rayon::current_num_threads()
            )),
        ));
    }
    if name == EMULATED {
        return Ok((
            Device::Cuda(0),
            Some("device cuda-emu: the emulated CUDA device (sinter's real CUDA kernels run on the CPU by the kernel emulator; correct, not fast)".into()),
        ));
    }
    let d = Device::parse(name).ok_or_else(|| {
        anyhow!("unknown device '{name}'; valid devices: auto, cpu, cuda, cuda:N, cuda-emu")
    })?;
    if let Device::Cuda(n) = d {
        check_cuda(n)?;
    }
    Ok((d, None))
}

/// Ok when CUDA device `n` can be used here; else an error quoting the CUDA report.
pub fn check_cuda(n: usize) -> Result<()> {
    if !sinter_core::cuda::is_available() {
        bail!(
            "device cuda:{n} is not available: {}\n{}\nuse --device cpu (or auto)",
            cuda_unavailable_reason(),
            sinter_core::cuda::report().trim_end()
        );
    }
    let count = sinter_core::cuda::device_count();
    if n >= count {
        bail!(
            "device cuda:{n} does not exist: {count} CUDA device(s) visible (cuda:0 .. cuda:{}); check CUDA_VISIBLE_DEVICES",
            count.saturating_sub(1)
        );
    }
    Ok(())
}

/// One phrase on why CUDA cannot be used (the full story is `sinter_core::cuda::report()`).
fn cuda_unavailable_reason() -> String {
    let l = sinter_core::cuda::runtime::libraries();
    if !l.driver {
        return "no CUDA driver (libcuda.so.1) was found".into();
    }
    let missing: Vec<&str> = [
        (l.nvrtc, "NVRTC (libnvrtc.so.13)"),
        (l.cublaslt, "cuBLASLt (libcublasLt.so.13)"),
    ]
    .iter()
    .filter(|(ok, _)| !ok)
    .map(|(_, n)| *n)
    .collect();
    if !missing.is_empty() {
        return format!(
            "CUDA libraries missing: {} (see `sinter info`)",
            missing.join(", ")
        );
    }
    match sinter_core::cuda::runtime::visible_devices() {
        Ok(0) => "the CUDA driver loads but sees no GPU".into(),
        Ok(_) => "CUDA is available".into(),
        Err(e) => format!("the CUDA driver failed to start: {e}"),
    }
}

/// Peak device memory held by tensors on `device` since it was first used (the caching
/// allocator's high-water mark), in bytes; None on the CPU or when it cannot be read.
pub fn peak_device_memory_bytes(device: Device) -> Option<u64> {
    match device {
        Device::Cuda(n) => sinter_core::cuda::memory_stats(n)
            .ok()
            .map(|m| m.peak as u64),
        Device::Cpu => None,
    }
}

// ---- sinter info --------------------------------------------------------------------------------

fn v2(v: Option<(u32, u32)>) -> String {
    v.map_or_else(|| "missing".into(), |(a, b)| format!("{a}.{b}"))
}
fn v3(v: Option<(u32, u32, u32)>) -> String {
    v.map_or_else(|| "missing".into(), |(a, b, c)| format!("{a}.{b}.{c}"))
}

/// The text of `sinter info`: version, devices (each GPU's name, memory, compute capability and
/// the CUDA library versions it would run with, or what is missing), CPU threads, dtypes and
/// precisions, models and data sets.
pub fn info_report() -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(o, "sinter {}", env!("CARGO_PKG_VERSION"));
    let _ = writeln!(o, "devices:");
    // The main thread joins the pool at start-up (main.rs): say so, as `sinter info` runs on it.
    let main_in_pool = if rayon::current_thread_index().is_some() {
        ", the main thread one of them"
    } else {
        ""
    };
    let _ = writeln!(
        o,
        "  cpu: {} threads (rayon{main_in_pool}; set RAYON_NUM_THREADS to change)",
        rayon::current_num_threads()
    );
    let libs = sinter_core::cuda::runtime::libraries();
    let count = if libs.driver {
        sinter_core::cuda::runtime::visible_devices().ok()
    } else {
        None
    };
    match count {
        Some(n) if n > 0 => {
            for i in 0..n {
                match sinter_core::cuda::runtime::device_info(i) {
                    Ok(d) => {
                        let _ = writeln!(
                            o,
                            "  cuda:{i}: {} — {:.1} GiB, compute capability {}.{} ({}), {} SMs",
                            d.name,
                            d.total_memory as f64 / (1u64 << 30) as f64,
                            d.compute_capability.0,
                            d.compute_capability.1,
                            d.arch(),
                            d.multiprocessors
                        );
                        let _ = writeln!(
                            o,
                            "          driver CUDA {}, runtime (cuBLASLt build) {}, NVRTC {}, cuBLASLt {}, cuDNN {}, NCCL {}",
                            v2(d.driver_version),
                            v2(d.cuda_runtime_version),
                            v2(d.nvrtc_version),
                            v3(d.cublas_version),
                            v3(d.cudnn_version),
                            v3(d.nccl_version)
                        );
                    }
                    Err(e) => {
                        let _ = writeln!(o, "  cuda:{i}: cannot query: {e}");
                    }
                }
            }
            if !sinter_core::cuda::is_available() {
                let _ = writeln!(
                    o,
                    "  cuda: GPUs are visible but sinter cannot use them: {}",
                    cuda_unavailable_reason()
                );
                for l in sinter_core::cuda::report().lines() {
                    let _ = writeln!(o, "    {l}");
                }
            }
        }
        _ => {
            let _ = writeln!(o, "  cuda: not available ({})", cuda_unavailable_reason());
            for l in sinter_core::cuda::report().lines() {
                let _ = writeln!(o, "    {l}");
            }
        }
    }
    let _ = writeln!(o, "dtypes: f32, f16, bf16 (stored; CPU arithmetic in f32, CUDA with f32 accumulation), i64 (indices)");
    let _ = writeln!(
        o,
        "precisions (--precision): fp32, tf32 (CUDA tensor cores; fp32 on the CPU), bf16, fp16 (f32 master weights; fp16 with loss scaling)"
    );
    let _ = writeln!(
        o,
        "distributed backends (--dist-backend): host, nccl (CUDA), {}",
        sinter_dist::mpi::describe()
    );
    let _ = writeln!(o, "models: {}", sinter_models::MODEL_NAMES.join(", "));
    let _ = writeln!(
        o,
        "data: digits, shakespeare, mnist:DIR, cifar10:DIR, text:FILE, tokens:FILE_OR_DIR"
    );
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::DType;

    #[test]
    fn parses_precisions_with_a_clear_error() {
        for s in ["fp32", "tf32", "bf16", "fp16"] {
            assert!(parse_precision(s).unwrap().state().contains(s));
        }
        let e = parse_precision("fp8").unwrap_err().to_string();
        assert!(e.contains("fp8") && e.contains(VALID_PRECISIONS), "{e}");
        assert!(parse_precision("fp16").unwrap().loss_scale().is_some());
        assert!(parse_precision("bf16").unwrap().loss_scale().is_none());
    }

    #[test]
    fn devices_resolve_and_cuda_errors_quote_the_report() {
        assert_eq!(resolve_device_noted("cpu").unwrap(), (Device::Cpu, None));
        let e = resolve_device_noted("gpu").unwrap_err().to_string();
        assert!(e.contains("auto, cpu, cuda, cuda:N"), "{e}");
        let (auto, note) = resolve_device_noted("auto").unwrap();
        assert!(note.is_some());
        if sinter_core::cuda::is_available() {
            assert_eq!(auto, Device::Cuda(0));
            assert!(resolve_device_noted("cuda:999").is_err());
        } else {
            assert_eq!(auto, Device::Cpu);
            let e = resolve_device_noted("cuda").unwrap_err().to_string();
            assert!(
                e.contains("cuda:0") && e.contains("sinter CUDA report"),
                "{e}"
            );
            assert!(resolve_device_noted("cuda:1").is_err());
            assert_eq!(peak_device_memory_bytes(Device::Cpu), None);
        }
        let info = info_report();
        assert!(
            info.contains("cpu:") && info.contains("cuda") && info.contains("bf16"),
            "{info}"
        );
    }

    #[test]
    fn fp16_hooks_skip_an_overflowing_step_and_round_trip_their_state() {
        let mut p = parse_precision("fp16").unwrap();
        assert!(p.activate(Device::Cpu).is_some());
        let loss = Tensor::full(0.5, &[1], DType::F32, Device::Cpu).unwrap();
        assert_eq!(
            p.scale_loss(&loss).unwrap().to_vec_f32().unwrap(),
            [32768.0]
        );
        // A good step keeps the scale; an overflow (the agreed verdict) skips and halves it.
        p.set_should_step(true);
        assert!(p.end_step().is_none());
        p.set_should_step(false);
        assert!(p.end_step().unwrap().contains("skipped"));
        assert_eq!(p.loss_scale(), Some(32768.0));
        let saved = p.state();
        let mut q = parse_precision("fp16").unwrap();
        q.load_state(&saved).unwrap();
        assert_eq!(q.loss_scale(), Some(32768.0));
        // Other modes: no scaling, always step.
        let mut b = parse_precision("bf16").unwrap();
        assert_eq!(b.scale_loss(&loss).unwrap().to_vec_f32().unwrap(), [0.5]);
        assert!(b.load_state(&saved).is_ok());
        assert!(b.end_step().is_none());
    }
}
