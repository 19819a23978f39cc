//! The DataLoader: shuffled, sharded, resumable mini-batches prepared on a background
//! thread. See [`DataLoader`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::error::{DataError, Result};
use crate::rng::EpochOrder;
use crate::{Dataset, HostArray};

/// How many prepared batches may wait in the channel between the loader thread and the
/// trainer.
const PREFETCH_DEPTH: usize = 2;

/// One mini-batch: inputs stacked along a new leading batch dimension, and targets likewise.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Shape `[b] + dataset.input_shape()`.
    pub inputs: HostArray,
    /// Shape `[b] + dataset.target_shape()`.
    pub targets: HostArray,
    /// The dataset indices of the `b` examples, in batch order.
    pub indices: Vec<usize>,
    /// Where this batch sits in the loader's stream (epoch, batch within the epoch).
    pub position: LoaderPosition,
}

impl Batch {
    /// The number of examples in the batch.
    pub fn len(&self) -> usize {
        self.indices.len()
    }

    /// Whether the batch has no examples (never true for batches from a [`DataLoader`]).
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty()
    }
}

/// Where a [`DataLoader`] is in its endless stream of batches: batch `batch` (0-based,
/// counted per rank) of epoch `epoch`. Stored in checkpoints as two u64s
/// ([`to_u64s`](Self::to_u64s) / [`from_u64s`](Self::from_u64s)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LoaderPosition {
    /// The epoch, from 0.
    pub epoch: u64,
    /// The batch within the epoch, from 0.
    pub batch: u64,
}

impl LoaderPosition {
    /// A position.
    pub fn new(epoch: u64, batch: u64) -> Self {
        LoaderPosition { epoch, batch }
    }

    /// `[epoch, batch]`, for checkpoints.
    pub fn to_u64s(self) -> [u64; 2] {
        [self.epoch, self.batch]
    }

    /// The inverse of [`to_u64s`](Self::to_u64s).
    pub fn from_u64s(v: [u64; 2]) -> Self {
        LoaderPosition {
            epoch: v[0],
            batch: v[1],
        }
    }
}

/// Everything that determines which examples go into which batch.
#[derive(Clone, Copy, Debug)]
struct Plan {
    n: usize,
    batch_size: usize,
    shuffle: bool,
    drop_last: bool,
    seed: u64,
    rank: usize,
    world_size: usize,
}

impl Plan {
    /// Examples per rank per epoch.
    fn shard_len(&self) -> usize {
        if self.world_size == 0 {
            return 0;
        }
        if self.drop_last {
            self.n / self.world_size
        } else {
            self.n.div_ceil(self.world_size)
        }
    }

    fn batches_per_epoch(&self) -> u64 {
        if self.batch_size == 0 {
            return 0;
        }
        let s = self.shard_len();
        (if self.drop_last {
            s / self.batch_size
        } else {
            s.div_ceil(self.batch_size)
        }) as u64
    }

    /// Checks that the plan can produce batches.
    fn validate(&self) -> Result<()> {
        if self.batch_size == 0 {
            return Err(DataError::Config(
                "batch size is 0; use a batch size of at least 1".into(),
            ));
        }
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(DataError::Config(format!(
                "shard rank {} of world size {} is invalid; ranks go from 0 to world size − 1",
                self.rank, self.world_size
            )));
        }
        if self.n == 0 {
            return Err(DataError::Config(
                "the dataset is empty; check the data source".into(),
            ));
        }
        if self.batches_per_epoch() == 0 {
            return Err(DataError::Config(format!(
                "the dataset has {} examples, {} per rank with {} rank(s), fewer than one \
                 batch of {}, and drop_last is set; use a smaller batch or turn drop_last off",
                self.n,
                self.shard_len(),
                self.world_size,
                self.batch_size
            )));
        }
        Ok(())
    }

    /// This rank's dataset indices for `epoch` that go into batches, in order (without the
    /// tail that `drop_last` drops).
    fn shard_indices(&self, epoch: u64) -> Vec<usize> {
        let order = EpochOrder::new(self.n, self.shuffle, self.seed, epoch);
        let count = if self.drop_last {
            self.batches_per_epoch() as usize * self.batch_size
        } else {
            self.shard_len()
        };
        (0..count)
            .map(|k| order.get((k * self.world_size + self.rank) % self.n))
            .collect()
    }

    /// Moves a position whose batch is past the end of its epoch into a later epoch.
    fn normalise(&self, pos: LoaderPosition) -> LoaderPosition {
        let bpe = self.batches_per_epoch();
        if bpe == 0 || pos.batch < bpe {
            return pos;
        }
        LoaderPosition {
            epoch: pos.epoch.saturating_add(pos.batch / bpe),
            batch: pos.batch % bpe,
        }
    }

    fn advance(&self, pos: LoaderPosition) -> LoaderPosition {
        self.normalise(LoaderPosition {
            epoch: pos.epoch,
            batch: pos.batch + 1,
        })
    }
}

type Message = (LoaderPosition, Result<Batch>);

/// The background thread and its channel.
struct Worker {
    rx: Option<Receiver<Message>>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(dataset: Arc<dyn Dataset>, plan: Plan, start: LoaderPosition) -> Result<Self> {
        let (tx, rx) = sync_channel(PREFETCH_DEPTH);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("sinter-data-loader".into())
            .spawn(move || produce(dataset, plan, start, tx, stop2))
            .map_err(|e| {
                DataError::LoaderStopped(format!("could not start the loader thread: {e}"))
            })?;
        Ok(Worker {
            rx: Some(rx),
            stop,
            handle: Some(handle),
        })
    }

    /// Stops the thread and returns its panic message, if it panicked.
    fn shut_down(&mut self) -> Option<String> {
        self.stop.store(true, Ordering::SeqCst);
        // Dropping the receiver makes a blocked or future `send` fail at once.
        drop(self.rx.take());
        let handle = self.handle.take()?;
        match handle.join() {
            Ok(()) => None,
            Err(payload) => Some(
                payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".to_string()),
            ),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// The loader thread: builds batches from `start` onwards until told to stop, the
/// receiver goes away, or a batch fails (the error is sent, then the thread ends).
fn produce(
    dataset: Arc<dyn Dataset>,
    plan: Plan,
    start: LoaderPosition,
    tx: SyncSender<Message>,
    stop: Arc<AtomicBool>,
) {
    let mut pos = plan.normalise(start);
    let mut cached: Option<(u64, Vec<usize>)> = None;
    while !stop.load(Ordering::SeqCst) {
        if cached.as_ref().map(|(e, _)| *e) != Some(pos.epoch) {
            cached = Some((pos.epoch, plan.shard_indices(pos.epoch)));
        }
        let shard = &cached.as_ref().expect("just filled").1;
        let from = pos.batch as usize * plan.batch_size;
        let to = (from + plan.batch_size).min(shard.len());
        let result = build_batch(dataset.as_ref(), &shard[from..to], pos);
        let failed = result.is_err();
        if tx.send((pos, result)).is_err() || failed {
            return;
        }
        pos = plan.advance(pos);
    }
}

/// Stacks the examples `indices` of `dataset` into one batch. Linear in the batch size.
pub(crate) fn build_batch(
    dataset: &dyn Dataset,
    indices: &[usize],
    position: LoaderPosition,
) -> Result<Batch> {
    let b = indices.len();
    let in_shape = dataset.input_shape();
    let t_shape = dataset.target_shape();
    let in_numel: usize = in_shape.iter().product();
    let t_numel: usize = t_shape.iter().product();
    let Some((&first, rest)) = indices.split_first() else {
        return Err(DataError::Config("empty batch requested".into()));
    };
    let (x0, y0) = dataset.get(first);
    let mut xs = x0.data;
    let mut ys = y0.data;
    xs.reserve(in_numel * (b - 1));
    ys.reserve(t_numel * (b - 1));
    for &i in rest {
        dataset.append_example(i, &mut xs, &mut ys);
    }
    if xs.len() != b * in_numel || ys.len() != b * t_numel {
        return Err(DataError::Config(format!(
            "the dataset's examples do not match its declared shapes (input {in_shape:?}, \
             target {t_shape:?}): a batch of {b} has {} input and {} target elements; \
             this is a bug in the Dataset implementation",
            xs.len(),
            ys.len()
        )));
    }
    let mut inputs_shape = vec![b];
    inputs_shape.extend_from_slice(&in_shape);
    let mut targets_shape = vec![b];
    targets_shape.extend_from_slice(&t_shape);
    Ok(Batch {
        inputs: HostArray {
            shape: inputs_shape,
            data: xs,
        },
        targets: HostArray {
            shape: targets_shape,
            data: ys,
        },
        indices: indices.to_vec(),
        position,
    })
}

/// Endless, shuffled, sharded, resumable mini-batches, prepared on a background thread.
///
/// The thread starts at the first [`next_batch`](Self::next_batch) and keeps up to two
/// batches ready; dropping the loader stops it (without waiting for more than the batch it
/// is building).
///
/// ## Order
///
/// Epoch `e` visits the dataset in an order that is a pure function of `(seed, e)`
/// (Fisher–Yates driven by xoshiro256**, seeded from [`epoch_seed`](crate::rng::epoch_seed)),
/// or in index order without shuffling.
///
/// ## Shards
///
/// With `world_size` ranks, rank `r` takes positions `r, r + W, r + 2W, …` of the epoch's
/// order, so the shards are disjoint and, batch for batch, the union of the ranks' batch `k`
/// is the slice `k·B·W .. (k+1)·B·W` of the order — what one process with batch size `B·W`
/// would see. Every rank gets the same number of examples (so data-parallel ranks take the
/// same number of steps): with `drop_last` the order is cut to a multiple of `W` (the last
/// `n mod W` examples of the epoch's order are skipped); without it, it is padded to a
/// multiple of `W` by wrapping around to the start of the order (up to `W − 1` examples
/// appear twice).
///
/// ## Batches
///
/// Each rank's shard is cut into batches of `batch_size`; with `drop_last` a final partial
/// batch is dropped, otherwise it is returned smaller. After the last batch of an epoch the
/// next epoch begins: [`DataLoader::next_batch`] never runs out.
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    plan: Plan,
    next: LoaderPosition,
    worker: Option<Worker>,
}

impl DataLoader {
    /// A loader over `dataset` yielding batches of `batch_size`, shuffled each epoch if
    /// `shuffle`, dropping each epoch's final partial batch if `drop_last`, with the
    /// shuffle order determined by `seed`. Invalid settings (batch size 0, …) are reported
    /// by [`next_batch`](Self::next_batch).
    pub fn new(
        dataset: Arc<dyn Dataset>,
        batch_size: usize,
        shuffle: bool,
        drop_last: bool,
        seed: u64,
    ) -> Self {
        let plan = Plan {
            n: dataset.len(),
            batch_size,
            shuffle,
            drop_last,
            seed,
            rank: 0,
            world_size: 1,
        };
        DataLoader {
            dataset,
            plan,
            next: LoaderPosition::default(),
            worker: None,
        }
    }

    /// Makes this loader read only rank `rank`'s shard of every epoch, out of `world_size`
    /// disjoint shards (all ranks must use the same seed, batch size and settings).
    pub fn with_shard(mut self, rank: usize, world_size: usize) -> Self {
        self.worker = None;
        self.plan.rank = rank;
        self.plan.world_size = world_size;
        self
    }

    /// Continues from `position` (from [`position`](Self::position) of an earlier run with
    /// the same dataset and settings): the batches that follow are exactly those the
    /// earlier run would have produced next.
    pub fn with_position(mut self, position: LoaderPosition) -> Self {
        self.worker = None;
        self.next = position;
        self
    }

    /// The position of the batch the next [`next_batch`](Self::next_batch) call returns.
    pub fn position(&self) -> LoaderPosition {
        self.plan.normalise(self.next)
    }

    /// Batches per epoch for this rank (0 if the settings are invalid).
    pub fn batches_per_epoch(&self) -> u64 {
        if self.plan.validate().is_err() {
            return 0;
        }
        self.plan.batches_per_epoch()
    }

    /// The batch size.
    pub fn batch_size(&self) -> usize {
        self.plan.batch_size
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<dyn Dataset> {
        &self.dataset
    }

    /// This rank's dataset indices for `epoch`, in the order they will be batched (the
    /// concatenation of the epoch's batches; empty if the settings are invalid).
    pub fn epoch_indices(&self, epoch: u64) -> Vec<usize> {
        if self.plan.validate().is_err() {
            return Vec::new();
        }
        self.plan.shard_indices(epoch)
    }

    /// The next batch. Never runs out: after an epoch's last batch comes the next epoch's
    /// first. Errors for invalid settings, a failing dataset, or a dead loader thread; the
    /// position does not advance on error.
    pub fn next_batch(&mut self) -> Result<Batch> {
        self.plan.validate()?;
        if self.worker.is_none() {
            self.worker = Some(Worker::spawn(
                self.dataset.clone(),
                self.plan,
                self.position(),
            )?);
        }
        let worker = self.worker.as_mut().expect("just started");
        let received = worker.rx.as_ref().expect("receiver lives").recv();
        match received {
            Ok((pos, Ok(batch))) => {
                self.next = self.plan.advance(pos);
                Ok(batch)
            }
            Ok((_, Err(e))) => {
                self.worker = None;
                Err(e)
            }
            Err(_) => {
                let mut worker = self.worker.take().expect("present");
                let why = worker
                    .shut_down()
                    .map(|m| format!("it panicked: {m}"))
                    .unwrap_or_else(|| "it exited without an error".to_string());
                Err(DataError::LoaderStopped(why))
            }
        }
    }
}

impl std::fmt::Debug for DataLoader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataLoader")
            .field("examples", &self.plan.n)
            .field("batch_size", &self.plan.batch_size)
            .field("shuffle", &self.plan.shuffle)
            .field("drop_last", &self.plan.drop_last)
            .field("seed", &self.plan.seed)
            .field("rank", &self.plan.rank)
            .field("world_size", &self.plan.world_size)
            .field("position", &self.position())
            .finish()
    }
}
