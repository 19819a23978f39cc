//! The tensor: shared storage, a strided layout over it, and (when gradients are tracked) the
//! node that made it. Cloning a tensor is cheap (an `Arc`).

mod cuda_buffers;
mod host_view;
mod storage_cell;
pub use host_view::{HostF32, HostF32Mut, HostValues};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLockReadGuard, RwLockWriteGuard};
pub(crate) use storage_cell::StorageCell;
pub use storage_cell::StorageStamp;

use crate::cpu::CpuStorage;
use crate::dtype::check_tensor_dtype;
use crate::graph::{self, Tracked};
use crate::layout::{numel, resolve_dim};
use crate::storage::Storage;
use crate::{bail, DType, Device, Element, Error, Layout, Result, Rng};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// The node that made a tensor: its inputs and backward rule.
pub(crate) type Node = graph::Node<Tensor>;

pub(crate) struct Inner {
    pub(crate) id: TensorId,
    pub(crate) storage: Arc<StorageCell>,
    pub(crate) layout: Layout,
    // The dtype and device are read from `storage` (not cached here), so that replacing the
    // storage in place (`move_to_device_`) moves every holder of this tensor with it.
    pub(crate) node: Option<Node>,
    pub(crate) is_variable: bool,
    /// Set by `freeze`: a variable that no longer collects gradients (a frozen base weight).
    pub(crate) frozen: std::sync::atomic::AtomicBool,
    pub(crate) grad: Mutex<Option<Tensor>>,
}

#[derive(Clone)]
pub struct Tensor(pub(crate) Arc<Inner>);

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Tensor[{:?}, {}, {}]",
            self.shape(),
            self.dtype(),
            self.device()
        )
    }
}

impl Tracked for Tensor {
    fn tracks_grad(&self) -> bool {
        Tensor::tracks_grad(self)
    }
}

fn check_device(device: Device) -> Result<()> {
    Storage::check_device(device)
}

/// A fresh contiguous output of an op, with its node when gradients are tracked:
/// `backward(grad_of_output, output)` returns one gradient per input.
pub(crate) fn output(
    storage: Storage,
    shape: &[usize],
    name: &'static str,
    inputs: &[&Tensor],
    backward: impl Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Tensor {
    let node = graph::record(name, inputs, backward);
    Tensor::from_parts(
        Arc::new(StorageCell::new(storage)),
        Layout::contiguous(shape),
        node,
    )
}

/// [`output`] for a result already in a tensor (a custom op's, computed untracked): the same
/// memory, with the node when gradients are tracked.
pub(crate) fn output_of(
    result: &Tensor,
    name: &'static str,
    inputs: &[&Tensor],
    backward: impl Fn(&Tensor, &Tensor) -> Result<Vec<Option<Tensor>>> + Send + Sync + 'static,
) -> Tensor {
    let node = graph::record(name, inputs, backward);
    Tensor::from_parts(result.0.storage.clone(), result.layout().clone(), node)
}

impl Tensor {
    // ---- construction -------------------------------------------------------------------

    /// A tensor viewing `storage` through `layout` (its dtype and device are the storage's).
    pub(crate) fn from_parts(
        storage: Arc<StorageCell>,
        layout: Layout,
        node: Option<Node>,
    ) -> Tensor {
        Tensor(Arc::new(Inner {
            id: TensorId::new(),
            storage,
            layout,
            node,
            is_variable: false,
            frozen: Default::default(),
            grad: Mutex::new(None),
        }))
    }

    /// A new tensor owning `storage`, contiguous with `shape`, recording nothing.
    pub(crate) fn from_storage(storage: Storage, shape: &[usize]) -> Tensor {
        debug_assert_eq!(storage.len(), numel(shape));
        Tensor::from_parts(
            Arc::new(StorageCell::new(storage)),
            Layout::contiguous(shape),
            None,
        )
    }

    pub(crate) fn from_cpu(storage: CpuStorage, shape: &[usize]) -> Tensor {
        Tensor::from_storage(Storage::Cpu(storage), shape)
    }

    /// Host values placed on `device`.
    fn from_host(host: CpuStorage, shape: &[usize], device: Device) -> Result<Tensor> {
        Ok(Tensor::from_storage(
            Storage::from_host(device, host)?,
            shape,
        ))
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Self::full(0.0, shape, dtype, device)
    }
    pub fn ones(shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        Self::full(1.0, shape, dtype, device)
    }
    pub fn full(value: f64, shape: &[usize], dtype: DType, device: Device) -> Result<Tensor> {
        check_tensor_dtype("full", dtype)?;
        Ok(Tensor::from_storage(
            Storage::full(device, numel(shape), value, dtype)?,
            shape,
        ))
    }
    pub fn zeros_like(&self) -> Result<Tensor> {
        Self::zeros(self.shape(), self.dtype(), self.device())
    }
    pub fn ones_like(&self) -> Result<Tensor> {
        Self::ones(self.shape(), self.dtype(), self.device())
    }
    pub fn full_like(&self, value: f64) -> Result<Tensor> {
        Self::full(value, self.shape(), self.dtype(), self.device())
    }
    /// A scalar (rank-0) f32 tensor on the CPU.
    pub fn scalar(v: f32) -> Tensor {
        Tensor::from_cpu(CpuStorage::F32(vec![v]), &[])
    }

    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[usize], device: Device) -> Result<Tensor> {
        check_tensor_dtype("from_vec", T::DTYPE)?;
        check_device(device)?;
        if data.len() != numel(shape) {
            bail!(
                "from_vec: {} values cannot fill shape {shape:?} ({} elements)",
                data.len(),
                numel(shape)
            );
        }
        let any: Box<dyn std::any::Any> = Box::new(data);
        let s = match T::DTYPE {
            DType::F32 => CpuStorage::F32(*any.downcast().expect("dtype tag matches type")),
            DType::F16 => CpuStorage::F16(*any.downcast().expect("dtype tag matches type")),
            DType::BF16 => CpuStorage::BF16(*any.downcast().expect("dtype tag matches type")),
            DType::I64 => CpuStorage::I64(*any.downcast().expect("dtype tag matches type")),
            DType::Bool => CpuStorage::Bool(*any.downcast().expect("dtype tag matches type")),
            DType::I32 | DType::U8 => unreachable!("checked above"),
        };
        Tensor::from_host(s, shape, device)
    }
    pub fn from_slice<T: Element>(data: &[T], shape: &[usize], device: Device) -> Result<Tensor> {
        Self::from_vec(data.to_vec(), shape, device)
    }

    /// Values start, start+step, … below end.
    pub fn arange(start: f64, end: f64, step: f64, dtype: DType, device: Device) -> Result<Tensor> {
        if step == 0.0 || (end - start) / step < 0.0 {
            bail!("arange: step {step} never gets from {start} to {end}");
        }
        let n = ((end - start) / step).ceil() as usize;
        check_tensor_dtype("arange", dtype)?;
        if dtype == DType::Bool {
            // As PyTorch: a range of bools is not a range (use `full` or a comparison).
            return Err(Error::UnsupportedDType {
                op: "arange",
                dtype,
                supported: "f32, f16, bf16 or i64",
            });
        }
        Ok(Tensor::from_storage(
            Storage::arange(device, start, step, n, dtype)?,
            &[n],
        ))
    }

    /// Uniform values in [lo, hi) drawn from `rng`.
    pub fn rand_uniform(
        shape: &[usize],
        lo: f64,
        hi: f64,
        rng: &mut Rng,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        check_tensor_dtype("rand_uniform", dtype)?;
        check_device(device)?;
        let v: Vec<f32> = (0..numel(shape))
            .map(|_| rng.uniform(lo, hi) as f32)
            .collect();
        Tensor::from_host(CpuStorage::from_f32(v, dtype), shape, device)
    }
    /// Normal values with the given mean and standard deviation drawn from `rng`.
    pub fn randn(
        shape: &[usize],
        mean: f64,
        std: f64,
        rng: &mut Rng,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        check_tensor_dtype("randn", dtype)?;
        check_device(device)?;
        let v: Vec<f32> = (0..numel(shape))
            .map(|_| (mean + std * rng.normal()) as f32)
            .collect();
        Tensor::from_host(CpuStorage::from_f32(v, dtype), shape, device)
    }

    // ---- accessors ----------------------------------------------------------------------

    pub fn id(&self) -> TensorId {
        self.0.id
    }
    pub fn shape(&self) -> &[usize] {
        self.0.layout.shape()
    }
    pub fn dims(&self) -> &[usize] {
        self.shape()
    }
    pub fn rank(&self) -> usize {
        self.shape().len()
    }
    /// Size of dimension `d` (negative counts from the end).
    pub fn dim(&self, d: isize) -> Result<usize> {
        Ok(self.shape()[resolve_dim("dim", d, self.rank())?])
    }
    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }
    /// The element type (of the storage: it follows an in-place move or cast).
    pub fn dtype(&self) -> DType {
        self.storage().dtype()
    }
    /// Where the data lives (of the storage: it follows `move_to_device_`).
    pub fn device(&self) -> Device {
        self.storage().device()
    }
    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }
    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }
    /// True for a leaf whose gradient is collected (a parameter).
    pub fn is_variable(&self) -> bool {
        self.0.is_variable && !self.is_frozen()
    }
    /// True for a variable that `freeze` stopped from collecting gradients.
    pub fn is_frozen(&self) -> bool {
        self.0.frozen.load(std::sync::atomic::Ordering::Relaxed)
    }
    /// Stops this variable (and every clone of it) from collecting gradients, in place, as
    /// PyTorch's `requires_grad_(False)`: ops that read it record nothing for it from now on,
    /// and its gradient is dropped. A model holding it sees the change without being rebuilt
    /// (how a LoRA run freezes its base). A no-op on a tensor that is not a variable.
    pub fn freeze(&self) {
        if self.0.is_variable {
            self.0
                .frozen
                .store(true, std::sync::atomic::Ordering::Relaxed);
            self.set_grad(None);
        }
    }
    /// True when a backward pass through this tensor reaches some variable.
    pub fn tracks_grad(&self) -> bool {
        self.is_variable() || self.0.node.is_some()
    }
    pub(crate) fn storage(&self) -> RwLockReadGuard<'_, Storage> {
        self.0.storage.read().unwrap_or_else(|e| e.into_inner())
    }
    pub(crate) fn write_storage(&self) -> RwLockWriteGuard<'_, Storage> {
        self.0.storage.write().unwrap_or_else(|e| e.into_inner())
    }
    /// Which storage this tensor views and how many times it has been opened for writing:
    /// unchanged as long as the values are (see `StorageStamp`).
    pub fn storage_stamp(&self) -> StorageStamp {
        self.0.storage.stamp()
    }
    /// True when both tensors view the same storage (a view copies nothing).
    pub fn shares_storage_with(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.0.storage, &other.0.storage)
    }

    /// The accumulated gradient of a variable, if a backward pass has reached it.
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
    pub fn set_grad(&self, g: Option<Tensor>) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = g;
    }
    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// A leaf that collects gradients, sharing this tensor's storage.
    pub fn to_var(&self) -> Result<Tensor> {
        if !self.dtype().is_float() {
            bail!(
                "to_var: only float tensors can have gradients, this one is {}",
                self.dtype()
            );
        }
        let t = self.contiguous()?.detach();
        let inner = Arc::try_unwrap(t.0).unwrap_or_else(|arc| Inner {
            id: TensorId::new(),
            storage: arc.storage.clone(),
            layout: arc.layout.clone(),
            node: None,
            is_variable: false,
            frozen: Default::default(),
            grad: Mutex::new(None),
        });
        Ok(Tensor(Arc::new(Inner {
            is_variable: true,
            ..inner
        })))
    }

    /// The same values, cut off from the graph.
    pub fn detach(&self) -> Tensor {
        Tensor::from_parts(self.0.storage.clone(), self.0.layout.clone(), None)
    }

    // ---- reading values -------------------------------------------------------------------

    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        self.storage()
            .with_host(self.layout(), |h, l| h.f32_contiguous(l).into_owned())
    }
    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        self.storage()
            .with_host(self.layout(), |h, l| h.i64_contiguous(l).into_owned())
    }
    /// The values as bools: a bool tensor's own, or non-zero (NaN included) for other dtypes,
    /// as `to_dtype(DType::Bool)` converts.
    pub fn to_vec_bool(&self) -> Result<Vec<bool>> {
        self.storage()
            .with_host(self.layout(), |h, l| h.bool_contiguous(l).into_owned())
    }
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        self.storage().with_host(self.layout(), |h, l| {
            crate::with_cpu_vec!(h, v => crate::cpu::gather_strided(v, l).iter().map(|x| x.to_f64()).collect())
        })
    }
    /// The one value of a tensor with one element.
    pub fn to_scalar_f32(&self) -> Result<f32> {
        if self.numel() != 1 {
            bail!(
                "to_scalar: tensor of shape {:?} has {} elements, not one",
                self.shape(),
                self.numel()
            );
        }
        Ok(self.to_vec_f32()?[0])
    }
    /// Row-major little-endian bytes of the values, in this tensor's dtype (for checkpoints).
    pub fn to_le_bytes(&self) -> Result<Vec<u8>> {
        self.storage().with_host(self.layout(), |h, l| {
            crate::with_cpu_vec!(h, v => match l.contiguous_range() {
                Some(r) => bytemuck::cast_slice(&v[r]).to_vec(),
                None => bytemuck::cast_slice(&crate::cpu::gather_strided(v, l)).to_vec(),
            })
        })
    }
    pub fn from_le_bytes(
        bytes: &[u8],
        dtype: DType,
        shape: &[usize],
        device: Device,
    ) -> Result<Tensor> {
        check_tensor_dtype("from_le_bytes", dtype)?;
        let n = numel(shape);
        if bytes.len() != n * dtype.size_in_bytes() {
            bail!(
                "from_bytes: {} bytes do not hold {n} {dtype} values of shape {shape:?}",
                bytes.len()
            );
        }
        fn read<T: Element + bytemuck::AnyBitPattern>(b: &[u8]) -> Vec<T> {
            // Copy element by element: the byte buffer may be unaligned.
            b.chunks_exact(std::mem::size_of::<T>())
                .map(bytemuck::pod_read_unaligned)
                .collect()
        }
        match dtype {
            DType::F32 => Tensor::from_vec(read::<f32>(bytes), shape, device),
            DType::F16 => Tensor::from_vec(read::<half::f16>(bytes), shape, device),
            DType::BF16 => Tensor::from_vec(read::<half::bf16>(bytes), shape, device),
            DType::I64 => Tensor::from_vec(read::<i64>(bytes), shape, device),
            DType::Bool => {
                // torch.bool is one byte holding 0 or 1; any other byte is not a bool.
                if let Some(at) = bytes.iter().position(|&b| b > 1) {
                    bail!(
                        "from_bytes: byte {at} of a bool tensor of shape {shape:?} is {}, not 0 or 1 (corrupt data, or not a bool tensor)",
                        bytes[at]
                    );
                }
                Tensor::from_vec(bytes.iter().map(|&b| b == 1).collect(), shape, device)
            }
            DType::I32 | DType::U8 => unreachable!("checked above"),
        }
    }

    // ---- views (no copy) ------------------------------------------------------------------

    fn view(
        &self,
        layout: Layout,
        name: &'static str,
        backward: impl Fn(&Tensor) -> Result<Tensor> + Send + Sync + 'static,
    ) -> Tensor {
        let node = graph::record(name, &[self], move |g, _| Ok(vec![Some(backward(g)?)]));
        Tensor::from_parts(self.0.storage.clone(), layout, node)
    }

    /// A view with a new shape (one entry may be usize::MAX, meaning "the rest"); copies only
    /// when the data is not contiguous.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let mut shape = shape.to_vec();
        if let Some(pos) = shape.iter().position(|&d| d == usize::MAX) {
            let known: usize = shape.iter().filter(|&&d| d != usize::MAX).product();
            if known == 0 || !self.numel().is_multiple_of(known) {
                bail!(
                    "reshape: cannot infer a dimension to turn {:?} into {:?}",
                    self.shape(),
                    shape
                );
            }
            shape[pos] = self.numel() / known;
        }
        if numel(&shape) != self.numel() {
            return Err(Error::ShapeMismatch {
                op: "reshape",
                lhs: self.shape().to_vec(),
                rhs: shape,
            });
        }
        let src = if self.is_contiguous() {
            self.clone()
        } else {
            self.contiguous()?
        };
        let layout = src.layout().reshape(&shape).expect("contiguous");
        let orig = self.shape().to_vec();
        Ok(src.view(layout, "reshape", move |g| g.reshape(&orig)))
    }
    /// Merges dimensions from `start` to the end into one.
    pub fn flatten_from(&self, start: usize) -> Result<Tensor> {
        let mut s = self.shape()[..start].to_vec();
        s.push(self.shape()[start..].iter().product());
        self.reshape(&s)
    }
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let r = self.rank();
        let (a, b) = (
            resolve_dim("transpose", d0, r)?,
            resolve_dim("transpose", d1, r)?,
        );
        Ok(
            self.view(self.layout().transpose(a, b), "transpose", move |g| {
                g.transpose(a as isize, b as isize)
            }),
        )
    }
    /// Swaps the last two dimensions.
    pub fn t(&self) -> Result<Tensor> {
        self.transpose(-2, -1)
    }
    pub fn permute(&self, dims: &[usize]) -> Result<Tensor> {
        let layout = self.layout().permute(dims)?;
        let mut inverse = vec![0; dims.len()];
        for (i, &d) in dims.iter().enumerate() {
            inverse[d] = i;
        }
        Ok(self.view(layout, "permute", move |g| g.permute(&inverse)))
    }
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        let d = resolve_dim("narrow", dim, self.rank())?;
        let layout = self.layout().narrow(d, start, len)?;
        let full = self.shape()[d];
        Ok(self.view(layout, "narrow", move |g| {
            // Gradient flows back into the narrowed window; zeros elsewhere.
            let mut parts = Vec::new();
            if start > 0 {
                let mut s = g.shape().to_vec();
                s[d] = start;
                parts.push(Tensor::zeros(&s, g.dtype(), g.device())?);
            }
            parts.push(g.clone());
            if start + len < full {
                let mut s = g.shape().to_vec();
                s[d] = full - start - len;
                parts.push(Tensor::zeros(&s, g.dtype(), g.device())?);
            }
            Tensor::cat(&parts, d as isize)
        }))
    }
    pub fn broadcast_as(&self, shape: &[usize]) -> Result<Tensor> {
        if self.shape() == shape {
            return Ok(self.clone());
        }
        let layout = self.layout().broadcast_as(shape)?;
        let orig = self.shape().to_vec();
        Ok(self.view(layout, "broadcast", move |g| g.sum_to_shape(&orig)))
    }
    pub fn squeeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("squeeze", dim, self.rank())?;
        if self.shape()[d] != 1 {
            bail!(
                "squeeze: dimension {d} of {:?} has size {}, not 1",
                self.shape(),
                self.shape()[d]
            );
        }
        Ok(self.view(self.layout().squeeze(d), "squeeze", move |g| {
            g.unsqueeze(d as isize)
        }))
    }
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = resolve_dim("unsqueeze", dim, self.rank() + 1)?;
        Ok(
            self.view(self.layout().unsqueeze(d), "unsqueeze", move |g| {
                g.squeeze(d as isize)
            }),
        )
    }
    /// Contiguous row-major data: the same tensor if it already is, else a copy.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        let s = self.storage().copy_strided(self.layout())?;
        Ok(output(s, self.shape(), "contiguous", &[self], |g, _| {
            Ok(vec![Some(g.clone())])
        }))
    }

    // ---- dtype and device -------------------------------------------------------------------

    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        check_tensor_dtype("to_dtype", dtype)?;
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        let s = self.storage().cast(self.layout(), dtype)?;
        let from = self.dtype();
        let inputs: &[&Tensor] = if dtype.is_float() { &[self] } else { &[] };
        Ok(output(s, self.shape(), "to_dtype", inputs, move |g, _| {
            Ok(vec![Some(g.to_dtype(from)?)])
        }))
    }
    /// The same values on `device` (a copy unless already there). Differentiable: the backward
    /// moves the gradient back.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        let from = self.device();
        if from == device {
            return Ok(self.clone());
        }
        check_device(device)?;
        let s = self.storage().to_device(self.layout(), device)?;
        Ok(output(
            s,
            self.shape(),
            "to_device",
            &[self],
            move |g, _| Ok(vec![Some(g.to_device(from)?)]),
        ))
    }

    /// Moves this tensor's data to `device` in place: the storage behind it is replaced by a
    /// copy on `device` (the values of `to_device`), so every clone of this tensor — a module's
    /// parameter field, the optimizer's list, views over the same storage — now lives there.
    /// Its gradient, if any, moves too. Records nothing (parameters are leaves).
    ///
    /// Only for a tensor that covers its whole storage contiguously (a parameter or buffer as
    /// created), or that broadcasts a storage of one value (a stand-in weight whose layer runs
    /// a quantized form); a view into a larger storage is an error, as is a device that cannot
    /// be used (then nothing changes and the tensor stays usable where it was). Move a model
    /// before creating its optimizer, whose state is allocated beside the parameters.
    pub fn move_to_device_(&self, device: Device) -> Result<()> {
        let from = self.device();
        if from == device {
            return Ok(());
        }
        check_device(device)?;
        let storage_len = self.storage().len();
        let one_value = storage_len == 1
            && self.layout().offset() == 0
            && self.layout().strides().iter().all(|&s| s == 0);
        if !one_value && self.layout().contiguous_range() != Some(0..storage_len) {
            bail!(
                "move_to_device_: a tensor of shape {:?} that views part of a larger storage (or strides over it) cannot be moved in place; move the tensor that owns the storage, or use to_device",
                self.shape()
            );
        }
        let moved = {
            let _g = crate::no_grad();
            // One value: its storage is what moves; the layout keeps broadcasting it.
            let mut whole = self.detach();
            for d in 0..whole.rank() * one_value as usize {
                whole = whole.narrow(d as isize, 0, 1)?;
            }
            whole.to_device(device)?
        };
        // `moved` is a fresh tensor: take its storage without copying when we hold the only
        // reference (always, barring a concurrent reader), else clone it.
        let mut new_storage = match Arc::try_unwrap(moved.0) {
            Ok(inner) => match Arc::try_unwrap(inner.storage) {
                Ok(lock) => lock.into_inner().unwrap_or_else(|e| e.into_inner()),
                Err(shared) => shared.read().unwrap_or_else(|e| e.into_inner()).clone(),
            },
            Err(shared) => shared
                .storage
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
        };
        // Long-lived data belongs in the permanent pool where the device keeps one (the
        // optimizer would move it there on its first step anyway).
        new_storage.promote_to_permanent()?;
        let grad = self
            .grad()
            .map(|g| g.detach().to_device(device))
            .transpose()?;
        *self.0.storage.write().unwrap_or_else(|e| e.into_inner()) = new_storage;
        self.set_grad(grad);
        Ok(())
    }

    // ---- in-place updates (outside autograd: optimizers, running statistics) -----------------

    pub(crate) fn check_in_place(&self, op: &'static str, src: &Tensor) -> Result<()> {
        if self.shape() != src.shape() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape().to_vec(),
                rhs: src.shape().to_vec(),
            });
        }
        if self.device() != src.device() {
            return Err(Error::DeviceMismatch {
                op,
                lhs: self.device(),
                rhs: src.device(),
            });
        }
        Ok(())
    }
    /// Overwrites this tensor's elements with `src`'s (cast to this dtype).
    pub fn assign(&self, src: &Tensor) -> Result<()> {
        self.check_in_place("assign", src)?;
        if self.shares_storage_with(src) {
            // Reading and writing the same memory in different orders: copy the source first
            // (its read lock is released before the write lock is taken).
            let copy = src.storage().copy_strided(src.layout())?;
            let l = Layout::contiguous(src.shape());
            return self.write_storage().assign(self.layout(), &copy, &l);
        }
        let s = src.storage();
        self.write_storage().assign(self.layout(), &s, src.layout())
    }
}
