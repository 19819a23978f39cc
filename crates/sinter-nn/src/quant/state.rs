//! A quantized model as named tensors, and back.
//!
//! For each layer with an int8 form, its weight `<layer>.weight` is replaced by
//! - `<layer>.weight.q`: i8, the weight's shape (Linear [out, in], Conv2d [out, in, kh, kw],
//!   Embedding [rows, dim]);
//! - `<layer>.weight.scale`: f32 [out], so that weight[j, …] ≈ scale[j] · q[j, …];
//! - for an embedding table or Linear with a second plane (`residual`), also
//!   `<layer>.weight.q2` (i8, the weight's shape) and `<layer>.weight.scale2` (f32 [out]):
//!   weight[j, …] ≈ scale[j] · q[j, …] + scale2[j] · q2[j, …];
//! - for a Conv2d, its calibrated input mapping `<layer>.input.scale` (f32 [1]) and
//!   `<layer>.input.zero_point` (i32 [1]): x ≈ scale · (u8 − zero_point).
//!
//! Every other tensor (biases, norms, BatchNorm statistics, layers left in f32) keeps its name
//! and dtype.

use std::collections::HashMap;
use std::sync::Arc;

use sinter_core::{bail, Device, Result, Tensor};
use sinter_cpu::int8::QParams;

use super::slot::{Int8Layer, LayerKind, QuantState};
use super::{Int8Weight, QuantizedConv2d, QuantizedLinear};
use crate::module::Module;

/// A tensor of a quantized model's state.
#[derive(Clone, Debug)]
pub enum StateTensor {
    /// A float tensor, kept as it is.
    Float(Tensor),
    I8 {
        values: Vec<i8>,
        shape: Vec<usize>,
    },
    I32 {
        values: Vec<i32>,
        shape: Vec<usize>,
    },
}

impl StateTensor {
    pub fn shape(&self) -> Vec<usize> {
        match self {
            StateTensor::Float(t) => t.shape().to_vec(),
            StateTensor::I8 { shape, .. } | StateTensor::I32 { shape, .. } => shape.clone(),
        }
    }
}

/// The named tensors of a (partly) quantized model.
pub fn export(model: &dyn Module) -> Result<Vec<(String, StateTensor)>> {
    let mut out = Vec::new();
    for t in model.named_tensors() {
        let form = t.layer.as_ref().and_then(|h| h.slot.int8());
        let Some(form) = form else {
            out.push((t.name, StateTensor::Float(t.tensor)));
            continue;
        };
        let layer = t
            .name
            .strip_suffix(".weight")
            .unwrap_or(&t.name)
            .to_string();
        let (w, input) = match int8_parts(form.as_ref()) {
            Some(parts) => parts,
            None => bail!("export: {layer} holds an int8 form this format does not know"),
        };
        // Each plane as `<weight>.q{suffix}` (i8) and `<weight>.scale{suffix}` (f32 [out]).
        let planes = std::iter::once((w.values(), w.scales(), ""))
            .chain(w.residual().map(|r| (r.values(), r.scales(), "2")));
        for (values, scales, suffix) in planes {
            let shape = w.shape().to_vec();
            out.push((
                format!("{}.q{suffix}", t.name),
                StateTensor::I8 { values, shape },
            ));
            let scales = Tensor::from_vec(scales.to_vec(), &[w.n()], Device::Cpu)?;
            out.push((
                format!("{}.scale{suffix}", t.name),
                StateTensor::Float(scales),
            ));
        }
        if let Some(q) = input {
            let s = Tensor::from_vec(vec![q.scale], &[1], Device::Cpu)?;
            out.push((format!("{layer}.input.scale"), StateTensor::Float(s)));
            out.push((
                format!("{layer}.input.zero_point"),
                StateTensor::I32 {
                    values: vec![q.zero_point],
                    shape: vec![1],
                },
            ));
        }
    }
    Ok(out)
}

fn int8_parts(form: &dyn Int8Layer) -> Option<(&Int8Weight, Option<QParams>)> {
    let any = form.as_any();
    if let Some(l) = any.downcast_ref::<QuantizedLinear>() {
        return Some((l.weight(), None));
    }
    any.downcast_ref::<QuantizedConv2d>()
        .map(|c| (c.weight(), Some(c.input_quant())))
}

/// Loads `tensors` (as [`export`] names them) into a freshly built f32 `model`: float tensors
/// are copied in, and each layer whose weight comes as `.q` + `.scale` gets its int8 form (its
/// f32 weight receives the dequantized values, so no path reads stale weights). Every model
/// tensor must be present with the model's shape; errors name the tensor and both shapes.
pub fn import(model: &dyn Module, tensors: &HashMap<String, StateTensor>) -> Result<()> {
    let named = model.named_tensors();
    let known: std::collections::HashSet<&str> = named.iter().map(|t| t.name.as_str()).collect();
    for k in tensors.keys() {
        if let Some(base) = k.strip_suffix(".q").or_else(|| k.strip_suffix(".q2")) {
            if !known.contains(base) {
                bail!("the checkpoint's int8 tensor {k} matches no weight of this model (was it quantized from a different model?)");
            }
        }
    }
    let mut pending = Vec::new();
    for t in &named {
        let q_name = format!("{}.q", t.name);
        if let Some(q) = tensors.get(&q_name) {
            pending.push((t, q));
            continue;
        }
        match tensors.get(&t.name) {
            Some(StateTensor::Float(src)) => {
                if src.shape() != t.tensor.shape() {
                    bail!("checkpoint tensor {} has shape {:?} but the model needs {:?} (was it saved from a different model or config?)", t.name, src.shape(), t.tensor.shape());
                }
                t.tensor.assign(src)?;
            }
            Some(_) => bail!("checkpoint tensor {} should be a float tensor", t.name),
            None => bail!(
                "the checkpoint has no tensor {} (nor {q_name}), which the model needs",
                t.name
            ),
        }
    }
    // Biases are in place now; build the int8 forms.
    let mut forms: Vec<(&crate::module::NamedTensor, Arc<dyn Int8Layer>, Tensor)> = Vec::new();
    for (t, q) in pending {
        let h = t.layer.as_ref().ok_or_else(|| {
            sinter_core::Error::Msg(format!(
                "the checkpoint holds an int8 weight for {}, which is not the weight of a Linear, Conv2d or Embedding in this model",
                t.name
            ))
        })?;
        let layer = t.name.strip_suffix(".weight").unwrap_or(&t.name);
        let StateTensor::I8 { values, shape } = q else {
            bail!("checkpoint tensor {}.q should be i8", t.name);
        };
        if shape.as_slice() != t.tensor.shape() {
            bail!(
                "checkpoint tensor {}.q has shape {shape:?} but the model needs {:?}",
                t.name,
                t.tensor.shape()
            );
        }
        let scales = float_values(tensors, &format!("{}.scale", t.name), &[shape[0]])?;
        let mut w = Int8Weight::from_int8(values, shape, scales)
            .map_err(|e| sinter_core::Error::Msg(format!("checkpoint tensor {}.q: {e}", t.name)))?;
        if let Some(q2) = tensors.get(&format!("{}.q2", t.name)) {
            if matches!(h.kind, LayerKind::Conv2d(_)) {
                bail!(
                    "checkpoint tensor {}.q2: a Conv2d has no second int8 plane (only Linear layers and embedding tables do)",
                    t.name
                );
            }
            let StateTensor::I8 {
                values,
                shape: shape2,
            } = q2
            else {
                bail!("checkpoint tensor {}.q2 should be i8", t.name);
            };
            if shape2 != shape {
                bail!("checkpoint tensor {}.q2 has shape {shape2:?} but its first plane has {shape:?}", t.name);
            }
            let scales2 = float_values(tensors, &format!("{}.scale2", t.name), &[shape[0]])?;
            w = w.with_residual_int8(values.clone(), scales2).map_err(|e| {
                sinter_core::Error::Msg(format!("checkpoint tensor {}.q2: {e}", t.name))
            })?;
        }
        let dequantized = w.dequantized()?;
        let form: Arc<dyn Int8Layer> = match h.kind {
            LayerKind::Linear => Arc::new(QuantizedLinear::new(w, h.bias.as_ref())?),
            LayerKind::Embedding => Arc::new(QuantizedLinear::table(w)?),
            LayerKind::Conv2d(p) => {
                let scale = float_values(tensors, &format!("{layer}.input.scale"), &[1])?[0];
                let zp = match tensors.get(&format!("{layer}.input.zero_point")) {
                    Some(StateTensor::I32 { values, shape }) if shape.as_slice() == [1] => values[0],
                    _ => bail!("the checkpoint lacks {layer}.input.zero_point (i32 [1]), the calibrated input mapping of an int8 Conv2d"),
                };
                let input = QParams {
                    scale,
                    zero_point: zp,
                };
                Arc::new(
                    QuantizedConv2d::new(w, h.bias.as_ref(), p, input)
                        .map_err(|e| sinter_core::Error::Msg(format!("{layer}: {e}")))?,
                )
            }
        };
        forms.push((t, form, dequantized));
    }
    for (t, form, dequantized) in forms {
        t.tensor.assign(&dequantized)?;
        let h = t.layer.as_ref().expect("checked above");
        h.slot.set(QuantState::Int8(form));
    }
    Ok(())
}

fn float_values(
    tensors: &HashMap<String, StateTensor>,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>> {
    match tensors.get(name) {
        Some(StateTensor::Float(t)) if t.shape() == shape => t.to_vec_f32(),
        Some(other) => bail!(
            "checkpoint tensor {name} has shape {:?}, expected f32 {shape:?}",
            other.shape()
        ),
        None => bail!("the checkpoint lacks {name}, needed by its int8 weight"),
    }
}
