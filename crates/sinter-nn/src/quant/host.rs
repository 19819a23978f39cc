//! What the int8 layers and weights share at their edges: reading an input or a bias on the
//! host, the check of a stored plane's scales, and sinter-cpu's int8 errors as sinter's. Below
//! the layers, the weights and `quant/mod.rs`, so that each can use it without an import
//! circle.

use sinter_core::{bail, is_grad_enabled, Device, HostValues, Result, Tensor};

/// The f32 values of a CPU float input of an int8 layer, refusing what the int8 path cannot
/// honour: a CUDA tensor, a non-float one, or one whose gradient is being tracked. A
/// contiguous f32 tensor is read in place (no copy).
pub(crate) fn cpu_input<'a>(x: &'a Tensor, layer: &str) -> Result<HostValues<'a>> {
    if x.device() != Device::Cpu {
        bail!("{layer}: this int8 layer runs on the CPU only (int8 Linears, embeddings and convolutions run on CUDA too), and this input is on {}; run the quantized model with --device cpu (or use the f32 checkpoint on the GPU)", x.device());
    }
    if !x.dtype().is_float() {
        bail!("{layer}: expected a float input, got {}", x.dtype());
    }
    if is_grad_enabled() && x.tracks_grad() {
        bail!("{layer}: int8 layers are for inference and pass no gradient; run the model under no_grad (eval, predict and generate do)");
    }
    x.host_values()
}

/// A small CPU tensor's values (biases).
pub(crate) fn host_vec(t: &Tensor) -> Result<Vec<f32>> {
    if t.device() != Device::Cpu {
        bail!(
            "int8 layers keep their bias on the CPU; this one is on {}",
            t.device()
        );
    }
    t.to_vec_f32()
}

pub(crate) fn int8_err(e: sinter_cpu::int8::Int8Error) -> sinter_core::Error {
    sinter_core::Error::Msg(format!("int8: {e}"))
}

/// The largest scale a stored plane may have: any int8 value times it (|q| ≤ 127) stays a
/// finite f32.
const MAX_SCALE: f32 = f32::MAX / 127.0;

/// Checks the per-row `scales` of a stored int8 plane `q` (rows of `k` values) as the
/// quantizer writes them: finite, non-negative and at most [`MAX_SCALE`], and 0 only for a
/// row whose values are all 0 (an all-zero weight row). A file that breaks this was edited or
/// damaged; its weights would be silently zero or overflow to infinity.
pub(crate) fn check_scales(q: &[i8], k: usize, scales: &[f32]) -> std::result::Result<(), String> {
    for (j, &s) in scales.iter().enumerate() {
        if !(s.is_finite() && (0.0..=MAX_SCALE).contains(&s)) {
            return Err(format!("scale {s:e} of row {j} is not a number in 0..={MAX_SCALE:e} (an int8 value times it must stay a finite f32); the file was edited or is damaged"));
        }
        let row = q.get(j * k..(j + 1) * k).unwrap_or(&[]);
        if s == 0.0 && row.iter().any(|&v| v != 0) {
            return Err(format!("scale of row {j} is 0 while the row's int8 values are not all 0 (the quantizer gives scale 0 only to an all-zero row); the file was edited or is damaged"));
        }
    }
    Ok(())
}
