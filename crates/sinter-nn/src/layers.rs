//! The basic layers. Each owns its parameters as variables and names them like PyTorch.

use std::sync::atomic::{AtomicBool, Ordering};

use sinter_core::{bail, no_grad, Conv2dParams, Hw, Pool2dParams, Result, Rng, Tensor};

use crate::init;
use crate::lora::adapter::LoraSlot;
use crate::module::{buffer, join, layer_weight, param, Module, NamedTensor, SharedRng};
use crate::quant::slot::{Activation, LayerHandle, LayerKind, QuantSlot, QuantState};

/// y = x Wᵀ + b over the last dimension; weight [out, in].
pub struct Linear {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    /// An int8 form installed by `quant::quantize` runs instead of the f32 weights.
    pub quant: QuantSlot,
    /// A LoRA adapter (`crate::lora`) whose product is added to the output.
    pub lora: LoraSlot,
}

impl Linear {
    /// PyTorch's default initialisation (Kaiming-uniform with a = √5, i.e. U(±1/√in)).
    pub fn new(inp: usize, out: usize, bias: bool, rng: &mut Rng) -> Result<Self> {
        let b = 1.0 / (inp as f64).sqrt();
        let weight = Tensor::rand_uniform(
            &[out, inp],
            -b,
            b,
            rng,
            sinter_core::DType::F32,
            sinter_core::Device::Cpu,
        )?
        .to_var()?;
        let bias = if bias {
            Some(init::bias_uniform(out, inp, rng)?)
        } else {
            None
        };
        Ok(Linear::from_weights(weight, bias))
    }
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear {
            weight,
            bias,
            quant: QuantSlot::default(),
            lora: LoraSlot::default(),
        }
    }
    pub fn in_features(&self) -> usize {
        self.weight.shape()[1]
    }
    /// GELU(x Wᵀ + b) with the bias and GELU fused (one GEMM with a GELU epilogue where the
    /// backend has one; the int8 epilogue when quantized).
    pub fn forward_gelu(&self, x: &Tensor) -> Result<Tensor> {
        if self.lora.get().is_some() {
            // The adapter's delta goes in before the activation.
            return self.forward(x)?.gelu();
        }
        if let Some(y) = self.quant.forward(x, Activation::GeluTanh)? {
            return Ok(y);
        }
        match &self.bias {
            Some(b) => sinter_core::fused::linear_bias_gelu(x, &self.weight, b),
            None => self.forward(x)?.gelu(),
        }
    }
    /// True when the layer runs its own f32-master weights (no adapter, no int8 form, not
    /// calibrating): what an op fusing it with a neighbour may assume.
    pub fn is_plain(&self) -> bool {
        self.lora.get().is_none() && matches!(self.quant.state(), QuantState::F32)
    }
    fn handle(&self) -> LayerHandle {
        LayerHandle {
            kind: LayerKind::Linear,
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            slot: self.quant.clone(),
        }
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = self.forward_base(x)?;
        self.lora.apply(x, y)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        layer_weight(prefix, self.handle(), out);
        if let Some(b) = &self.bias {
            param(prefix, "bias", b, out);
        }
        self.lora.collect(prefix, out);
    }
    fn set_training(&self, training: bool) {
        self.lora.set_training(training);
    }
}

impl Linear {
    /// The layer without its LoRA adapter: x Wᵀ + b (or the quantized form's product).
    pub fn forward_base(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.quant.forward(x, Activation::None)? {
            return Ok(y);
        }
        let inp = self.in_features();
        if x.shape().last() != Some(&inp) {
            bail!(
                "Linear: expected inputs with last dimension {inp}, got shape {:?}",
                x.shape()
            );
        }
        // One op: leading dims folded into rows (one GEMM, and the weight gradient is one
        // product), the bias added in the GEMM's epilogue where the backend has one.
        sinter_core::fused::linear(x, &self.weight, self.bias.as_ref())
    }
}

pub struct Conv2d {
    pub weight: Tensor,
    pub bias: Option<Tensor>,
    pub params: Conv2dParams,
    /// An int8 form installed by `quant::quantize` runs instead of the f32 weights.
    pub quant: QuantSlot,
}

impl Conv2d {
    /// Kaiming-normal weights (fan-in, for ReLU networks) and PyTorch-style uniform bias.
    /// `kernel`: `3` for 3×3, `(3, 1)` for 3 rows × 1 column (PyTorch's `kernel_size`).
    pub fn new(
        cin: usize,
        cout: usize,
        kernel: impl Into<Hw>,
        params: Conv2dParams,
        bias: bool,
        rng: &mut Rng,
    ) -> Result<Self> {
        if params.groups == 0
            || !cin.is_multiple_of(params.groups)
            || !cout.is_multiple_of(params.groups)
        {
            bail!(
                "Conv2d: {cin} input and {cout} output channels do not split into {} groups",
                params.groups
            );
        }
        let kernel = kernel.into();
        if kernel.any_zero() {
            bail!("Conv2d: the kernel must be at least 1x1, got {kernel}");
        }
        let shape = [cout, cin / params.groups, kernel.h, kernel.w];
        let weight = init::kaiming_normal(&shape, rng)?;
        let bias = if bias {
            Some(init::bias_uniform(cout, init::fans(&shape).0, rng)?)
        } else {
            None
        };
        Ok(Conv2d::from_weights(weight, bias, params))
    }

    /// relu(self.forward(x)); with a bias, one fused conv + bias + ReLU op (the bias add and
    /// the ReLU happen as the convolution stores its output; see `fused::conv2d_bias_relu`).
    pub fn forward_relu(&self, x: &Tensor) -> Result<Tensor> {
        // An int8 form applies the ReLU in its GEMM epilogue, as it stores the output.
        if let Some(y) = self.quant.forward(x, Activation::Relu)? {
            return Ok(y);
        }
        match &self.bias {
            Some(b) => sinter_core::fused::conv2d_bias_relu(x, &self.weight, b, self.params, true),
            None => x.conv2d(&self.weight, self.params)?.relu(),
        }
    }

    /// A Conv2d with these tensors (f32, no int8 form).
    pub fn from_weights(weight: Tensor, bias: Option<Tensor>, params: Conv2dParams) -> Self {
        Conv2d {
            weight,
            bias,
            params,
            quant: QuantSlot::default(),
        }
    }
}

impl Module for Conv2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.quant.forward(x, Activation::None)? {
            return Ok(y);
        }
        let y = x.conv2d(&self.weight, self.params)?;
        match &self.bias {
            Some(b) => y.add(&b.reshape(&[1, b.numel(), 1, 1])?),
            None => Ok(y),
        }
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        let handle = LayerHandle {
            kind: LayerKind::Conv2d(self.params),
            weight: self.weight.clone(),
            bias: self.bias.clone(),
            slot: self.quant.clone(),
        };
        layer_weight(prefix, handle, out);
        if let Some(b) = &self.bias {
            param(prefix, "bias", b, out);
        }
    }
}

/// Batch norm over [n, c, h, w]: batch statistics while training (updating running averages),
/// running averages in evaluation.
pub struct BatchNorm2d {
    pub weight: Tensor,
    pub bias: Tensor,
    pub running_mean: Tensor,
    pub running_var: Tensor,
    pub momentum: f32,
    pub eps: f32,
    training: AtomicBool,
}

impl BatchNorm2d {
    pub fn new(c: usize) -> Result<Self> {
        Ok(BatchNorm2d {
            weight: init::ones(&[c])?,
            bias: init::zeros(&[c])?,
            running_mean: Tensor::zeros(&[c], sinter_core::DType::F32, sinter_core::Device::Cpu)?,
            running_var: Tensor::ones(&[c], sinter_core::DType::F32, sinter_core::Device::Cpu)?,
            momentum: 0.1,
            eps: 1e-5,
            training: AtomicBool::new(true),
        })
    }

    /// Whether the layer normalises with batch statistics (training) or running ones.
    pub fn is_training(&self) -> bool {
        self.training.load(Ordering::Relaxed)
    }

    /// Moves the running averages towards a batch's statistics: `mean` and biased `var`
    /// (any shape holding one value per channel) over `n` values per channel. The variance
    /// stored is the unbiased one, as PyTorch does. Not recorded for autograd.
    ///
    /// Fewer than 2 values per channel is an error, as in PyTorch: the batch variance of one
    /// value is 0 and its unbiased estimate undefined (every training path passes here).
    pub fn update_running_stats(&self, mean: &Tensor, var: &Tensor, n: usize) -> Result<()> {
        if n <= 1 {
            bail!(
                "BatchNorm2d: expected more than 1 value per channel when training, got {n} (batch × height × width); use a larger batch (or spatial size), or evaluation mode"
            );
        }
        let _g = no_grad();
        let c = self.weight.numel();
        let n = n as f32;
        let m = self.momentum;
        let unbiased = var.detach().mul_scalar(n / (n - 1.0))?.reshape(&[c])?;
        self.running_mean.assign(
            &self
                .running_mean
                .mul_scalar(1.0 - m)?
                .add(&mean.detach().reshape(&[c])?.mul_scalar(m)?)?,
        )?;
        self.running_var.assign(
            &self
                .running_var
                .mul_scalar(1.0 - m)?
                .add(&unbiased.mul_scalar(m)?)?,
        )
    }
}

impl Module for BatchNorm2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let c = self.weight.numel();
        if x.rank() != 4 || x.shape()[1] != c {
            bail!(
                "BatchNorm2d: expected input [n, {c}, h, w], got {:?}",
                x.shape()
            );
        }
        let bc = [1, c, 1, 1];
        let (mean, var) = if self.training.load(Ordering::Relaxed) {
            let mean = x.mean(&[0, 2, 3], true)?;
            let var = x.sub(&mean)?.sqr()?.mean(&[0, 2, 3], true)?;
            self.update_running_stats(&mean, &var, x.numel() / c)?;
            (mean, var)
        } else {
            (
                self.running_mean.reshape(&bc)?,
                self.running_var.reshape(&bc)?,
            )
        };
        let xhat = x.sub(&mean)?.div(&var.add_scalar(self.eps)?.sqrt()?)?;
        xhat.mul(&self.weight.reshape(&bc)?)?
            .add(&self.bias.reshape(&bc)?)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        param(prefix, "weight", &self.weight, out);
        param(prefix, "bias", &self.bias, out);
        buffer(prefix, "running_mean", &self.running_mean, out);
        buffer(prefix, "running_var", &self.running_var, out);
    }
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}

pub struct LayerNorm {
    pub weight: Tensor,
    pub bias: Tensor,
    pub eps: f32,
}

impl LayerNorm {
    pub fn new(n: usize) -> Result<Self> {
        Ok(LayerNorm {
            weight: init::ones(&[n])?,
            bias: init::zeros(&[n])?,
            eps: 1e-5,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.layer_norm(&self.weight, &self.bias, self.eps)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        param(prefix, "weight", &self.weight, out);
        param(prefix, "bias", &self.bias, out);
    }
}

/// A [vocab, dim] table looked up by i64 ids.
///
/// With a padding index (PyTorch's `padding_idx`) that row never receives a gradient: Hugging
/// Face's BERT keeps its `[PAD]` row as loaded, and so does fine-tuning here. The lookup still
/// returns the row's values (zeros when the table was made here, as PyTorch initialises it).
pub struct Embedding {
    pub weight: Tensor,
    /// The row that receives no gradient, if any (a row index, already resolved).
    pub padding_idx: Option<usize>,
    /// An int8 table installed by `quant::quantize` serves the lookups and `linear`.
    pub quant: QuantSlot,
}

impl Embedding {
    pub fn new(vocab: usize, dim: usize, std: f64, rng: &mut Rng) -> Result<Self> {
        Ok(Embedding::from_weights(init::normal(
            &[vocab, dim],
            std,
            rng,
        )?))
    }
    /// x · tableᵀ over the last dimension: the table used as a tied output head.
    pub fn linear(&self, x: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.quant.forward(x, Activation::None)? {
            return Ok(y);
        }
        sinter_core::fused::linear(x, &self.weight, None)
    }
    /// A table of given weights, without a padding row.
    pub fn from_weights(weight: Tensor) -> Self {
        Embedding {
            weight,
            padding_idx: None,
            quant: QuantSlot::default(),
        }
    }
    /// This table with `padding_idx` (negative counts from the end, as in PyTorch) as its
    /// padding row, zero-filled.
    pub fn with_padding_idx(mut self, padding_idx: i64) -> Result<Self> {
        let row = resolve_padding_idx(padding_idx, self.weight.shape()[0])?;
        {
            let _g = no_grad();
            let r = self.weight.narrow(0, row, 1)?;
            r.assign(&r.zeros_like()?)?;
        }
        self.padding_idx = Some(row);
        Ok(self)
    }
}

/// PyTorch's rule: `padding_idx` in [-vocab, vocab), negative counting from the end.
fn resolve_padding_idx(idx: i64, vocab: usize) -> Result<usize> {
    let v = vocab as i64;
    if !(-v..v).contains(&idx) {
        bail!("Embedding: padding_idx {idx} is outside the table of {vocab} rows (must be in -{vocab}..{vocab})");
    }
    Ok(if idx < 0 { idx + v } else { idx } as usize)
}

impl Module for Embedding {
    fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        if let Some(y) = self.quant.lookup(ids)? {
            // A quantized table serves inference only: no gradient to withhold.
            return Ok(y);
        }
        let rows = self.weight.embedding(ids)?;
        let Some(pad) = self.padding_idx else {
            return Ok(rows);
        };
        if !rows.tracks_grad() {
            return Ok(rows);
        }
        // The same values; the gradient flows only where the id is not the padding row.
        let pad = Tensor::full(pad as f64, &[], ids.dtype(), ids.device())?;
        let keep = ids.ne(&pad)?.unsqueeze(-1)?;
        Tensor::where_cond(&keep, &rows, &rows.detach())
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        let handle = LayerHandle {
            kind: LayerKind::Embedding,
            weight: self.weight.clone(),
            bias: None,
            slot: self.quant.clone(),
        };
        layer_weight(prefix, handle, out);
    }
}

pub struct Dropout {
    pub p: f32,
    rng: SharedRng,
    training: AtomicBool,
}

impl Dropout {
    pub fn new(p: f32, rng: SharedRng) -> Self {
        Dropout {
            p,
            rng,
            training: AtomicBool::new(true),
        }
    }
}

impl Module for Dropout {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        if !self.training.load(Ordering::Relaxed) || self.p == 0.0 {
            return Ok(x.clone());
        }
        let mut rng = self.rng.lock().unwrap_or_else(|e| e.into_inner());
        x.dropout(self.p, &mut rng)
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
    fn set_training(&self, training: bool) {
        self.training.store(training, Ordering::Relaxed);
    }
}

/// A pooling window of this kernel and stride, PyTorch's other defaults.
fn window(kernel: Hw, stride: Hw) -> Pool2dParams {
    Pool2dParams {
        stride,
        ..Pool2dParams::new(kernel)
    }
}

/// 2-D max pooling (`torch.nn.MaxPool2d`); the full set of arguments (per-axis padding,
/// dilation, ceil mode) through `MaxPool2d(Pool2dParams { .. })`.
pub struct MaxPool2d(pub Pool2dParams);

impl MaxPool2d {
    /// `kernel` and `stride`: `2` for 2×2, `(2, 1)` per axis; no padding, floor mode.
    pub fn new(kernel: impl Into<Hw>, stride: impl Into<Hw>) -> Self {
        MaxPool2d(window(kernel.into(), stride.into()))
    }
}

impl Module for MaxPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.max_pool2d(self.0)
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
}

/// 2-D average pooling (`torch.nn.AvgPool2d`; padding counted in the divisor unless
/// `count_include_pad` is false); the full set of arguments through
/// `AvgPool2d(Pool2dParams { .. })`.
pub struct AvgPool2d(pub Pool2dParams);

impl AvgPool2d {
    /// `kernel` and `stride`: `2` for 2×2, `(2, 1)` per axis; no padding, floor mode.
    pub fn new(kernel: impl Into<Hw>, stride: impl Into<Hw>) -> Self {
        AvgPool2d(window(kernel.into(), stride.into()))
    }
}

impl Module for AvgPool2d {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.avg_pool2d(self.0)
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
}

pub struct Relu;
impl Module for Relu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.relu()
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
}

/// Which form of GELU (PyTorch's `approximate` argument).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GeluApproximate {
    /// The exact form, x·Φ(x) with erf: PyTorch's default (`approximate='none'`), BERT's
    /// (`hidden_act = "gelu"`).
    #[default]
    None,
    /// The tanh approximation (`approximate='tanh'`): GPT-2's (`gelu_new`).
    Tanh,
}

/// GELU, exact by default like `torch.nn.GELU()`; [`Gelu::tanh`] for the approximation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gelu {
    pub approximate: GeluApproximate,
}

impl Gelu {
    /// The exact (erf) GELU.
    pub fn new() -> Self {
        Gelu::default()
    }
    /// The tanh approximation (GPT-2's).
    pub fn tanh() -> Self {
        Gelu {
            approximate: GeluApproximate::Tanh,
        }
    }
}

impl Module for Gelu {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self.approximate {
            GeluApproximate::None => x.gelu_erf(),
            GeluApproximate::Tanh => x.gelu(),
        }
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
}

/// [n, ...] -> [n, product of the rest].
pub struct Flatten;
impl Module for Flatten {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        x.flatten_from(1)
    }
    fn collect(&self, _prefix: &str, _out: &mut Vec<NamedTensor>) {}
}

/// Layers applied in order; their tensors are named by position (`0.weight`, `3.bias`).
#[derive(Default)]
pub struct Sequential {
    pub layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    pub fn new() -> Self {
        Self::default()
    }
    #[allow(clippy::should_implement_trait)]
    pub fn add(mut self, m: impl Module + 'static) -> Self {
        self.layers.push(Box::new(m));
        self
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?;
        }
        Ok(h)
    }
    fn collect(&self, prefix: &str, out: &mut Vec<NamedTensor>) {
        for (i, l) in self.layers.iter().enumerate() {
            l.collect(&join(prefix, &i.to_string()), out);
        }
    }
    fn set_training(&self, training: bool) {
        for l in &self.layers {
            l.set_training(training);
        }
    }
    fn fold_batch_norm(&self) -> Result<usize> {
        self.layers.iter().map(|l| l.fold_batch_norm()).sum()
    }
}
