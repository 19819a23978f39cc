//! Moving a whole model between devices in place, PyTorch's `module.to(device)`.
//!
//! Each parameter and buffer keeps its identity (modules hold their tensors as fields, and the
//! optimizer and data-parallel wrappers hold clones of them): only the storage behind it is
//! replaced by a copy on the new device ([`Tensor::move_to_device_`]). Move the model before
//! creating its optimizer, whose state is allocated beside the parameters.

use sinter_core::{Device, Result, Tensor};

use crate::module::Module;

/// Moves every named tensor of `module` (parameters and buffers, with their gradients) to
/// `device`, in place. Tensors that share storage (tied weights) move once.
///
/// All or nothing: if any tensor cannot be moved (the device is unavailable, out of memory),
/// the ones already moved are moved back and the error is returned, so the module stays usable
/// where it was.
pub fn move_module(module: &dyn Module, device: Device) -> Result<()> {
    let tensors: Vec<Tensor> = module
        .named_tensors()
        .into_iter()
        .map(|t| t.tensor)
        .collect();
    move_tensors(&tensors, device)
}

/// [`move_module`] for a list of tensors (e.g. an optimizer's state).
pub fn move_tensors(tensors: &[Tensor], device: Device) -> Result<()> {
    let mut moved: Vec<(&Tensor, Device)> = Vec::new();
    let mut deferred: Vec<&Tensor> = Vec::new();
    let mut result = Ok(());
    // First pass: tensors that own their storage. A view of another tensor's storage (a tied,
    // transposed weight) fails here and follows once its owner has moved.
    for t in tensors {
        let from = t.device();
        if from == device {
            continue;
        }
        match t.move_to_device_(device) {
            Ok(()) => moved.push((t, from)),
            // Nothing moved yet and nothing will: report the device's problem as is.
            Err(e @ sinter_core::Error::DeviceUnavailable(..)) if moved.is_empty() => {
                return Err(e)
            }
            Err(_) => deferred.push(t),
        }
    }
    for t in deferred {
        if t.device() != device {
            if let Err(e) = t.move_to_device_(device) {
                result = Err(e);
                break;
            }
        }
    }
    if result.is_err() {
        for (t, from) in moved.iter().rev() {
            // Best effort: the original device worked a moment ago.
            let _ = t.move_to_device_(*from);
        }
    }
    result
}

/// The device of a module's tensors: the CPU for a module without tensors, an error when they
/// are spread over several devices.
pub fn module_device(module: &dyn Module) -> Result<Device> {
    let mut found: Option<Device> = None;
    for t in module.named_tensors() {
        let d = t.tensor.device();
        match found {
            None => found = Some(d),
            Some(f) if f != d => sinter_core::bail!(
                "module_device: tensors live on both {f} and {d} (e.g. {}); move the whole module with move_module",
                t.name
            ),
            _ => {}
        }
    }
    Ok(found.unwrap_or(Device::Cpu))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Linear, Module, Relu, Sequential};
    use sinter_core::{DType, Rng};

    fn mlp() -> Sequential {
        let mut rng = Rng::new(0);
        Sequential::new()
            .add(Linear::new(4, 8, true, &mut rng).unwrap())
            .add(Relu)
            .add(Linear::new(8, 2, true, &mut rng).unwrap())
    }

    #[test]
    fn cpu_to_cpu_is_a_no_op_and_unavailable_cuda_is_an_error() {
        let m = mlp();
        let before: Vec<Vec<f32>> = m
            .parameters()
            .iter()
            .map(|(_, p)| p.to_vec_f32().unwrap())
            .collect();
        move_module(&m, Device::Cpu).unwrap();
        assert_eq!(module_device(&m).unwrap(), Device::Cpu);
        if !sinter_core::cuda::is_available() {
            let e = move_module(&m, Device::Cuda(0)).unwrap_err();
            assert!(
                matches!(e, sinter_core::Error::DeviceUnavailable(..)),
                "{e}"
            );
        }
        // Still on the CPU, unchanged, and trainable.
        assert_eq!(module_device(&m).unwrap(), Device::Cpu);
        let after: Vec<Vec<f32>> = m
            .parameters()
            .iter()
            .map(|(_, p)| p.to_vec_f32().unwrap())
            .collect();
        assert_eq!(before, after);
        let x = Tensor::ones(&[3, 4], DType::F32, Device::Cpu).unwrap();
        m.forward(&x)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(m.parameters().iter().all(|(_, p)| p.grad().is_some()));
    }
}
