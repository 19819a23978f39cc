//! [`CustomOp`]: the definition (outputs, one forward per backend, one backward) and `apply`,
//! which checks the inputs, runs the forward on their device through the seam, checks the
//! outputs and records the node.

use std::sync::Arc;

use super::backward::{record, BackwardCtx, BackwardFn};
use super::cpu::{CpuForwardFn, HostInput, HostOutput};
use super::cuda::CudaKernel;
use super::seam::ForwardCall;
use super::spec::{OutputSpec, TensorMeta};
use crate::storage::Storage;
use crate::{bail, DType, Error, Result, Tensor};

/// Computes an op's outputs (shapes, dtypes) from its inputs', or says why they do not fit.
pub(crate) type OutputsFn = dyn Fn(&[TensorMeta]) -> Result<Vec<OutputSpec>> + Send + Sync;

pub(crate) struct OpDef {
    pub name: &'static str,
    pub inputs: Option<usize>,
    pub dtypes: Vec<DType>,
    pub outputs: Box<OutputsFn>,
    pub cpu: Option<Box<CpuForwardFn>>,
    pub cuda: Option<CudaKernel>,
    pub backward: Option<Arc<BackwardFn>>,
}

impl OpDef {
    /// The devices this op has a forward for, for messages.
    fn forwards(&self) -> String {
        let mut v = Vec::new();
        if self.cpu.is_some() {
            v.push("cpu");
        }
        if self.cuda.is_some() {
            v.push("cuda");
        }
        v.join(" and ")
    }
}

/// A user-defined differentiable op (see the module docs). Cheap to clone; define it once and
/// apply it many times.
#[derive(Clone)]
pub struct CustomOp(Arc<OpDef>);

impl std::fmt::Debug for CustomOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CustomOp({}, forwards: {})",
            self.0.name,
            self.0.forwards()
        )
    }
}

/// Builds a [`CustomOp`]: `outputs` and at least one forward are required.
pub struct CustomOpBuilder {
    name: &'static str,
    inputs: Option<usize>,
    dtypes: Vec<DType>,
    outputs: Option<Box<OutputsFn>>,
    cpu: Option<Box<CpuForwardFn>>,
    cuda: Option<CudaKernel>,
    backward: Option<Arc<BackwardFn>>,
}

impl CustomOpBuilder {
    /// How many inputs the op takes (checked before anything else runs, so the output and
    /// launch functions may index them); without it, any number of at least one.
    pub fn inputs(mut self, n: usize) -> Self {
        self.inputs = Some(n);
        self
    }
    /// The dtypes every input may have (default: f32 only).
    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = dtypes.to_vec();
        self
    }
    /// The outputs' shapes and dtypes from the inputs' (an error when the inputs do not fit).
    pub fn outputs(
        mut self,
        f: impl Fn(&[TensorMeta]) -> Result<Vec<OutputSpec>> + Send + Sync + 'static,
    ) -> Self {
        self.outputs = Some(Box::new(f));
        self
    }
    /// The CPU forward: contiguous host inputs in, one output per declared output out.
    pub fn cpu(
        mut self,
        f: impl Fn(&[HostInput<'_>]) -> Result<Vec<HostOutput>> + Send + Sync + 'static,
    ) -> Self {
        self.cpu = Some(Box::new(f));
        self
    }
    /// The CUDA forward.
    pub fn cuda(mut self, k: CudaKernel) -> Self {
        self.cuda = Some(k);
        self
    }
    /// The one backward, for every device (see [`BackwardCtx`]).
    pub fn backward(
        mut self,
        f: impl Fn(&BackwardCtx<'_>) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
    ) -> Self {
        self.backward = Some(Arc::new(f));
        self
    }
    pub fn build(self) -> Result<CustomOp> {
        let name = self.name;
        let Some(outputs) = self.outputs else {
            bail!("custom op `{name}`: declare its outputs with CustomOpBuilder::outputs");
        };
        if self.cpu.is_none() && self.cuda.is_none() {
            bail!("custom op `{name}`: give it a forward (CustomOpBuilder::cpu and/or ::cuda)");
        }
        if self.dtypes.is_empty() {
            bail!("custom op `{name}`: CustomOpBuilder::dtypes needs at least one dtype");
        }
        Ok(CustomOp(Arc::new(OpDef {
            name,
            inputs: self.inputs,
            dtypes: self.dtypes,
            outputs,
            cpu: self.cpu,
            cuda: self.cuda,
            backward: self.backward,
        })))
    }
}

impl CustomOp {
    /// A builder for an op called `name` (in errors and in the autograd graph).
    pub fn builder(name: &'static str) -> CustomOpBuilder {
        CustomOpBuilder {
            name,
            inputs: None,
            dtypes: vec![DType::F32],
            outputs: None,
            cpu: None,
            cuda: None,
            backward: None,
        }
    }

    pub fn name(&self) -> &'static str {
        self.0.name
    }

    /// Runs the op on `inputs` (at least one, all on one device) and returns its outputs that
    /// are not saved-only, in declared order. When an input tracks gradients (and grad mode is
    /// on), one node is recorded whose backward is the op's.
    pub fn apply(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let def = &*self.0;
        let name = def.name;
        if inputs.is_empty() {
            bail!("custom op `{name}`: needs at least one input (its device is theirs)");
        }
        if def.inputs.is_some_and(|n| n != inputs.len()) {
            bail!(
                "custom op `{name}`: takes {} inputs, got {}",
                def.inputs.unwrap_or(0),
                inputs.len()
            );
        }
        for (i, t) in inputs.iter().enumerate() {
            if !def.dtypes.contains(&t.dtype()) {
                bail!(
                    "custom op `{name}`: input {i} is {}, the op accepts {:?} (CustomOpBuilder::dtypes)",
                    t.dtype(),
                    def.dtypes
                );
            }
        }
        let metas: Vec<TensorMeta> = inputs
            .iter()
            .map(|t| TensorMeta {
                shape: t.shape().to_vec(),
                dtype: t.dtype(),
                device: t.device(),
            })
            .collect();
        let specs =
            (def.outputs)(&metas).map_err(|e| Error::Msg(format!("custom op `{name}`: {e}")))?;
        let returned = specs.iter().take_while(|s| !s.saved_only).count();
        if returned == 0 || specs[returned..].iter().any(|s| !s.saved_only) {
            bail!(
                "custom op `{name}`: declare at least one returned output, and the saved-only ones after every returned one"
            );
        }
        for (k, s) in specs.iter().enumerate() {
            let Some(i) = s.in_place_of else { continue };
            let fits = metas
                .get(i)
                .is_some_and(|m| m.shape == s.shape && m.dtype == s.dtype);
            if !fits {
                bail!(
                    "custom op `{name}`: output {k} is declared in place of input {i}, which must exist and have its shape {:?} and dtype {}",
                    s.shape,
                    s.dtype
                );
            }
        }
        let guards: Vec<_> = inputs.iter().map(|t| t.storage()).collect();
        let parts: Vec<_> = guards
            .iter()
            .zip(inputs)
            .map(|(g, t)| (&**g, t.layout()))
            .collect();
        let call = ForwardCall {
            name,
            cpu: def.cpu.as_deref(),
            cuda: def.cuda.as_ref(),
            metas: &metas,
            specs: &specs,
        };
        let Some(outs) = Storage::custom_forward(&call, &parts)? else {
            bail!(
                "custom op `{name}` has no forward for {} (it has one for {}): add it with CustomOpBuilder::{}, or move the inputs with to_device",
                inputs[0].device(),
                def.forwards(),
                if def.cpu.is_none() { "cpu" } else { "cuda" }
            );
        };
        drop(parts);
        drop(guards);
        let outputs = outs
            .into_iter()
            .zip(&specs)
            .map(|(s, spec)| Tensor::from_storage(s, &spec.shape))
            .collect();
        record(name, def.backward.clone(), inputs, outputs, returned)
    }
}
