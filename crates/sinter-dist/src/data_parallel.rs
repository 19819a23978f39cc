//! Data parallelism: every rank holds the whole model, reads its own shard of the data, and
//! the gradients are averaged across ranks before each optimizer step.
//!
//! * [`DataParallel::new`] broadcasts the parameters (and buffers passed to
//!   [`broadcast_tensors`]) from rank 0, so every replica starts identical.
//! * Gradients are grouped into buckets ([`FlatLayout`], 25 MB by default, reverse parameter
//!   order). [`DataParallel::backward`] runs backward with a hook that copies each
//!   parameter's gradient into its bucket the moment it is final, and submits the bucket's
//!   all-reduce (average) to the [`AsyncCommunicator`] as soon as the bucket is complete —
//!   while backward continues with earlier layers. Buckets are submitted strictly in bucket
//!   order, so every rank issues the same collectives in the same order even if its graph
//!   finishes parameters in a different order. After backward it waits for all buckets and
//!   writes the averaged gradients back with `set_grad`, ready for any optimizer.
//! * Gradient accumulation: [`DataParallel::backward_no_sync`] (or `backward_with(loss,
//!   false)`) only accumulates locally; no collective is issued. The next synchronising
//!   backward reduces the accumulated sum.
//!
//! Every submission is recorded in a [`StepTrace`] (time relative to the start of backward,
//! and whether backward was still running), which is how the tests check the overlap.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sinter_core::{Device, Tensor, TensorId};

use crate::checkpoint_layout::FlatLayout;
use crate::comm::{AsyncCommunicator, Communicator, ReduceOp, Work};
use crate::error::DistError;

/// Default gradient bucket size in MiB (PyTorch DDP's `bucket_cap_mb`).
pub const DEFAULT_BUCKET_MB: f64 = 25.0;

/// Bytes of a bucket of `mb` MiB.
pub fn bucket_bytes(mb: f64) -> usize {
    (mb.max(0.0) * 1024.0 * 1024.0).round() as usize
}

/// A communicator shared by the parallel wrappers of one rank (data parallel, ZeRO, the
/// trainer's own small collectives). All calls go through one background thread in
/// submission order.
pub type SharedComm = Arc<AsyncCommunicator>;

/// Moves `comm` onto a background thread, shareable.
pub fn shared<C: Communicator + 'static>(comm: C) -> SharedComm {
    Arc::new(AsyncCommunicator::new(comm))
}

pub(crate) fn dist_err(e: DistError) -> sinter_core::Error {
    sinter_core::Error::Msg(e.to_string())
}

/// Blocks on `w` and turns a communication error into a tensor-layer error.
pub(crate) fn wait(w: Work) -> sinter_core::Result<Vec<f32>> {
    w.wait().map_err(dist_err)
}

/// Runs one collective on the concatenation of `tensors` (as f32) and writes its result back
/// into them, each in its own dtype and on its own device.
fn collective_over(
    tensors: &[&Tensor],
    run: impl FnOnce(Vec<f32>) -> Work,
) -> sinter_core::Result<()> {
    let mut flat = Vec::with_capacity(tensors.iter().map(|t| t.numel()).sum());
    for t in tensors {
        flat.extend(t.to_vec_f32()?);
    }
    let flat = wait(run(flat))?;
    let mut off = 0;
    for t in tensors {
        let n = t.numel();
        let v = Tensor::from_slice(&flat[off..off + n], t.shape(), Device::Cpu)?
            .to_dtype(t.dtype())?
            .to_device(t.device())?;
        t.assign(&v)?;
        off += n;
    }
    Ok(())
}

/// Copies `root`'s values of `tensors` to every rank (one broadcast of their concatenation).
/// Every rank calls it with tensors of the same shapes.
pub fn broadcast_tensors(
    comm: &AsyncCommunicator,
    tensors: &[Tensor],
    root: usize,
) -> sinter_core::Result<()> {
    if comm.world_size() <= 1 || tensors.is_empty() {
        return Ok(());
    }
    let all: Vec<&Tensor> = tensors.iter().collect();
    collective_over(&all, |flat| comm.broadcast(flat, root))
}

/// Replaces `tensors` (e.g. BatchNorm running statistics, which each rank updates from its
/// own batches) by their average over the ranks (one all-reduce of their concatenation), so
/// every rank evaluates and checkpoints the same values. Every rank calls it with tensors of
/// the same shapes; non-float tensors (counters) are left alone.
pub fn average_tensors(comm: &AsyncCommunicator, tensors: &[Tensor]) -> sinter_core::Result<()> {
    let floats: Vec<&Tensor> = tensors.iter().filter(|t| t.dtype().is_float()).collect();
    if comm.world_size() <= 1 || floats.is_empty() {
        return Ok(());
    }
    collective_over(&floats, |flat| comm.all_reduce(flat, ReduceOp::Avg))
}

/// One bucket submission.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketEvent {
    pub bucket: usize,
    /// Elements sent (padded bucket length).
    pub numel: usize,
    /// Time from the start of backward to the submission.
    pub submitted: Duration,
    /// True when submitted from inside backward (overlapping the rest of it).
    pub during_backward: bool,
}

/// What one gradient synchronisation did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepTrace {
    /// Whether this backward synchronised (false: local accumulation only).
    pub synced: bool,
    /// Duration of backward itself.
    pub backward: Duration,
    /// Time spent after backward waiting for the remaining collectives.
    pub wait: Duration,
    pub events: Vec<BucketEvent>,
    /// Largest number of bucket elements in flight at once (submitted, not yet collected).
    pub peak_in_flight: usize,
}

impl StepTrace {
    /// Buckets whose collective was submitted before backward returned.
    pub fn submitted_during_backward(&self) -> usize {
        self.events.iter().filter(|e| e.during_backward).count()
    }
}

/// Which collective a bucket goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BucketOp {
    /// All-reduce (average): every rank gets the whole averaged bucket.
    AllReduce,
    /// Reduce-scatter (average): rank r gets chunk r of the averaged bucket.
    ReduceScatter,
}

/// One pass of bucket filling and submission, shared by data parallel (all-reduce) and
/// ZeRO (reduce-scatter).
pub(crate) struct BucketPass<'a> {
    layout: &'a FlatLayout,
    params: &'a [(String, Tensor)],
    comm: &'a AsyncCommunicator,
    op: BucketOp,
    /// Keep a copy of each full local bucket (ZeRO-1's unpartitioned gradient buffer).
    keep_local: bool,
    bufs: Vec<Option<Vec<f32>>>,
    filled: Vec<usize>,
    /// Per parameter: a gradient was found (locally) for it.
    pub got: Vec<bool>,
    next: usize,
    works: Vec<Option<Work>>,
    kept: Vec<Option<Vec<f32>>>,
    t0: Instant,
    in_backward: bool,
    in_flight: usize,
    pub trace: StepTrace,
    pub collectives: u64,
}

impl<'a> BucketPass<'a> {
    pub fn new(
        layout: &'a FlatLayout,
        params: &'a [(String, Tensor)],
        comm: &'a AsyncCommunicator,
        op: BucketOp,
        keep_local: bool,
    ) -> Self {
        let nb = layout.buckets.len();
        BucketPass {
            layout,
            params,
            comm,
            op,
            keep_local,
            bufs: (0..nb).map(|_| None).collect(),
            filled: vec![0; nb],
            got: vec![false; params.len()],
            next: 0,
            works: (0..nb).map(|_| None).collect(),
            kept: (0..nb).map(|_| None).collect(),
            t0: Instant::now(),
            in_backward: true,
            in_flight: 0,
            trace: StepTrace {
                synced: true,
                ..Default::default()
            },
            collectives: 0,
        }
    }

    fn buf(&mut self, b: usize) -> &mut Vec<f32> {
        let padded = self.layout.buckets[b].padded;
        self.bufs[b].get_or_insert_with(|| vec![0.0; padded])
    }

    /// Parameter `p`'s gradient is final: copy it into its bucket and submit every bucket
    /// that is complete and next in order.
    pub fn add(&mut self, p: usize, grad: &Tensor) -> sinter_core::Result<()> {
        if self.got[p] {
            return Ok(());
        }
        let slot = &self.layout.slots[p];
        let (b, off, n) = (slot.bucket, slot.offset_in_bucket, slot.numel);
        let g = grad.to_vec_f32()?;
        if g.len() != n {
            sinter_core::bail!(
                "gradient of {} has {} values, expected {n}",
                slot.name,
                g.len()
            );
        }
        self.buf(b)[off..off + n].copy_from_slice(&g);
        self.got[p] = true;
        self.filled[b] += 1;
        self.submit_ready();
        Ok(())
    }

    fn submit_ready(&mut self) {
        while self.next < self.layout.buckets.len()
            && self.filled[self.next] == self.layout.buckets[self.next].params.len()
        {
            self.submit(self.next);
            self.next += 1;
        }
    }

    fn submit(&mut self, b: usize) {
        self.buf(b);
        let local = self.bufs[b].take().expect("allocated by buf()");
        let buf = if self.keep_local {
            let copy = local.clone();
            self.kept[b] = Some(local);
            copy
        } else {
            local
        };
        let numel = buf.len();
        let w = match self.op {
            BucketOp::AllReduce => self.comm.all_reduce(buf, ReduceOp::Avg),
            BucketOp::ReduceScatter => self.comm.reduce_scatter(buf, ReduceOp::Avg),
        };
        self.collectives += 1;
        self.works[b] = Some(w);
        self.in_flight += numel;
        self.trace.peak_in_flight = self.trace.peak_in_flight.max(self.in_flight);
        self.trace.events.push(BucketEvent {
            bucket: b,
            numel,
            submitted: self.t0.elapsed(),
            during_backward: self.in_backward,
        });
    }

    /// Backward has returned: fills what the hook did not see from the parameters' `grad()`
    /// (gradients accumulated earlier, or parameters this pass did not reach; zeros if none)
    /// and submits every remaining bucket, in order.
    pub fn finish_backward(&mut self, release: bool) -> sinter_core::Result<()> {
        if self.in_backward {
            self.trace.backward = self.t0.elapsed();
            self.in_backward = false;
        }
        for p in 0..self.params.len() {
            if !self.got[p] {
                if let Some(g) = self.params[p].1.grad() {
                    self.add(p, &g)?;
                    if release {
                        self.params[p].1.set_grad(None);
                    }
                } else {
                    // Counts as filled with zeros.
                    let b = self.layout.slots[p].bucket;
                    self.buf(b);
                    self.filled[b] += 1;
                }
            }
        }
        self.submit_ready();
        debug_assert_eq!(self.next, self.layout.buckets.len());
        Ok(())
    }

    /// Waits for every bucket in order; returns each bucket's result (the averaged bucket, or
    /// this rank's averaged chunk) and, with `keep_local`, the local unreduced bucket.
    pub fn wait_all(mut self) -> sinter_core::Result<PassResult> {
        let t = Instant::now();
        let mut out = Vec::with_capacity(self.works.len());
        for w in self.works.iter_mut() {
            let w = w.take().expect("every bucket was submitted");
            out.push(wait(w)?);
        }
        self.trace.wait = t.elapsed();
        Ok(PassResult {
            out,
            kept: self.kept,
            got: self.got,
            trace: self.trace,
            collectives: self.collectives,
        })
    }
}

/// What a [`BucketPass`] produced.
pub(crate) struct PassResult {
    /// Per bucket: the averaged bucket (all-reduce) or this rank's averaged chunk.
    pub out: Vec<Vec<f32>>,
    /// Per bucket, with `keep_local`: the local unreduced bucket.
    pub kept: Vec<Option<Vec<f32>>>,
    pub got: Vec<bool>,
    pub trace: StepTrace,
    pub collectives: u64,
}

/// Map from a parameter tensor to its index (duplicates — tied weights listed twice — keep
/// the first).
pub(crate) fn index_params(
    params: &[(String, Tensor)],
) -> (Vec<(String, Tensor)>, HashMap<TensorId, usize>) {
    let mut index = HashMap::new();
    let mut kept = Vec::new();
    for (n, t) in params {
        if let std::collections::hash_map::Entry::Vacant(e) = index.entry(t.id()) {
            e.insert(kept.len());
            kept.push((n.clone(), t.clone()));
        }
    }
    (kept, index)
}

/// Runs backward of `loss`, feeding each parameter's final gradient into `pass` (and
/// releasing the parameter's own gradient when `release`).
pub(crate) fn backward_into(
    loss: &Tensor,
    index: &HashMap<TensorId, usize>,
    pass: &mut BucketPass<'_>,
    release: bool,
) -> sinter_core::Result<()> {
    loss.backward_with_hook(|var, grad| {
        if let Some(&p) = index.get(&var.id()) {
            pass.add(p, grad)?;
            if release {
                var.set_grad(None);
            }
        }
        Ok(())
    })?;
    pass.finish_backward(release)
}

/// Data-parallel gradient synchronisation for one rank. See the module documentation.
pub struct DataParallel {
    comm: SharedComm,
    params: Vec<(String, Tensor)>,
    index: HashMap<TensorId, usize>,
    layout: FlatLayout,
    trace: StepTrace,
    collectives: u64,
    /// NCCL gradient buckets on the device (CUDA models with `--dist-backend nccl`).
    device: Option<crate::nccl::DeviceBuckets>,
}

impl DataParallel {
    /// Wraps the parameters of one replica: broadcasts them from rank 0 and plans buckets of
    /// `bucket_bytes`. Every rank calls it with the same parameter list.
    pub fn new(
        comm: SharedComm,
        params: Vec<(String, Tensor)>,
        bucket_bytes: usize,
    ) -> sinter_core::Result<Self> {
        let (params, index) = index_params(&params);
        let layout = FlatLayout::from_params(&params, bucket_bytes, 1).map_err(dist_err)?;
        let tensors: Vec<Tensor> = params.iter().map(|(_, t)| t.clone()).collect();
        broadcast_tensors(&comm, &tensors, 0)?;
        let collectives = u64::from(comm.world_size() > 1);
        Ok(DataParallel {
            comm,
            params,
            index,
            layout,
            trace: StepTrace::default(),
            collectives,
            device: None,
        })
    }

    /// All-reduces the gradients device to device through `nccl` (same bucket plan) instead
    /// of through the host communicator. Every parameter must live on `nccl`'s device.
    pub fn use_nccl(&mut self, nccl: crate::nccl::NcclCommunicator) -> sinter_core::Result<()> {
        let db = crate::nccl::DeviceBuckets::new(nccl, self.layout.clone());
        if !db.applies_to(&self.params) {
            sinter_core::bail!("NCCL gradient buckets need every parameter on the communicator's CUDA device; move the model there first");
        }
        self.device = Some(db);
        Ok(())
    }

    /// True when gradients go through NCCL on the device.
    pub fn uses_nccl(&self) -> bool {
        self.device.is_some()
    }

    pub fn rank(&self) -> usize {
        self.comm.rank()
    }
    pub fn world_size(&self) -> usize {
        self.comm.world_size()
    }
    /// The communicator (for the caller's own collectives, ordered with ours).
    pub fn comm(&self) -> &SharedComm {
        &self.comm
    }
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
    /// The bucket plan.
    pub fn layout(&self) -> &FlatLayout {
        &self.layout
    }
    /// Trace of the last backward.
    pub fn last_trace(&self) -> &StepTrace {
        &self.trace
    }
    /// Collectives this wrapper has submitted so far (the initial broadcast included).
    pub fn collectives_submitted(&self) -> u64 {
        self.collectives
    }

    /// Backward of `loss` (this rank's mean loss) with bucketed, overlapped all-reduce;
    /// returns once every parameter's `grad()` holds the average over ranks.
    pub fn backward(&mut self, loss: &Tensor) -> sinter_core::Result<()> {
        self.backward_with(loss, true)
    }

    /// Backward that only accumulates into the parameters' gradients (no communication), for
    /// the accumulating micro-steps of gradient accumulation.
    pub fn backward_no_sync(&mut self, loss: &Tensor) -> sinter_core::Result<()> {
        self.backward_with(loss, false)
    }

    /// `backward` when `sync`, else `backward_no_sync`.
    pub fn backward_with(&mut self, loss: &Tensor, sync: bool) -> sinter_core::Result<()> {
        if !sync {
            let t = Instant::now();
            loss.backward()?;
            self.trace = StepTrace {
                synced: false,
                backward: t.elapsed(),
                ..Default::default()
            };
            return Ok(());
        }
        if let Some(db) = &mut self.device {
            let t = Instant::now();
            db.sync(Some(loss), &self.params, &self.index)?;
            self.collectives += self.layout.buckets.len() as u64;
            self.trace = StepTrace {
                synced: true,
                backward: t.elapsed(),
                ..Default::default()
            };
            return Ok(());
        }
        let mut pass = BucketPass::new(
            &self.layout,
            &self.params,
            &self.comm,
            BucketOp::AllReduce,
            false,
        );
        backward_into(loss, &self.index, &mut pass, true)?;
        let r = pass.wait_all()?;
        self.write_back(r)
    }

    /// Averages the gradients the parameters already hold (after a plain `loss.backward()`),
    /// bucket by bucket, without overlap.
    pub fn sync_gradients(&mut self) -> sinter_core::Result<()> {
        if let Some(db) = &mut self.device {
            self.collectives += self.layout.buckets.len() as u64;
            return db.sync(None, &self.params, &self.index);
        }
        let mut pass = BucketPass::new(
            &self.layout,
            &self.params,
            &self.comm,
            BucketOp::AllReduce,
            false,
        );
        pass.finish_backward(true)?;
        let r = pass.wait_all()?;
        self.write_back(r)
    }

    fn write_back(&mut self, r: PassResult) -> sinter_core::Result<()> {
        let PassResult {
            out,
            got,
            trace,
            collectives,
            ..
        } = r;
        self.collectives += collectives;
        for (p, (_, t)) in self.params.iter().enumerate() {
            if !got[p] {
                continue;
            }
            let s = &self.layout.slots[p];
            let g = Tensor::from_slice(
                &out[s.bucket][s.offset_in_bucket..s.offset_in_bucket + s.numel],
                &s.shape,
                t.device(),
            )?;
            t.set_grad(Some(g));
        }
        self.trace = trace;
        Ok(())
    }

    /// All-reduces a few values through the same queue (e.g. the loss for logging).
    pub fn all_reduce(&mut self, values: Vec<f32>, op: ReduceOp) -> sinter_core::Result<Vec<f32>> {
        self.collectives += 1;
        wait(self.comm.all_reduce(values, op))
    }
}
