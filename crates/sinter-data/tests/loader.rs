//! DataLoader behaviour: coverage, shuffling, sharding, resuming, shutdown, errors.

use std::collections::HashSet;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use sinter_data::{
    digits, Batch, DataError, DataLoader, Dataset, HostArray, LoaderPosition, Split,
};

/// Example `i` has input `[i, 2i]` (f32) and target `i` (i64), so batches can be checked
/// against their indices.
struct Counting {
    n: usize,
    delay: Duration,
    panic_at: Option<usize>,
}

impl Counting {
    fn arc(n: usize) -> Arc<dyn Dataset> {
        Arc::new(Counting {
            n,
            delay: Duration::ZERO,
            panic_at: None,
        })
    }
}

impl Dataset for Counting {
    fn len(&self) -> usize {
        self.n
    }
    fn get(&self, index: usize) -> (HostArray, HostArray) {
        assert!(index < self.n);
        if Some(index) == self.panic_at {
            panic!("example {index} is cursed");
        }
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
        (
            HostArray::f32(vec![2], vec![index as f32, 2.0 * index as f32]),
            HostArray::i64(vec![], vec![index as i64]),
        )
    }
    fn input_shape(&self) -> Vec<usize> {
        vec![2]
    }
    fn target_shape(&self) -> Vec<usize> {
        vec![]
    }
    fn num_classes(&self) -> Option<usize> {
        None
    }
}

fn take(loader: &mut DataLoader, k: usize) -> Vec<Batch> {
    (0..k).map(|_| loader.next_batch().unwrap()).collect()
}

fn check_contents(b: &Batch) {
    let x = b.inputs.data.as_f32().unwrap();
    let y = b.targets.data.as_i64().unwrap();
    assert_eq!(b.inputs.shape, vec![b.len(), 2]);
    assert_eq!(b.targets.shape, vec![b.len()]);
    for (j, &i) in b.indices.iter().enumerate() {
        assert_eq!(x[2 * j], i as f32);
        assert_eq!(x[2 * j + 1], 2.0 * i as f32);
        assert_eq!(y[j], i as i64);
    }
}

#[test]
fn each_example_once_per_epoch_without_drop_last() {
    let mut loader = DataLoader::new(Counting::arc(103), 10, true, false, 1);
    assert_eq!(loader.batches_per_epoch(), 11);
    for epoch in 0..3u64 {
        let batches = take(&mut loader, 11);
        let mut seen = Vec::new();
        for (k, b) in batches.iter().enumerate() {
            check_contents(b);
            assert_eq!(b.position, LoaderPosition::new(epoch, k as u64));
            assert_eq!(b.len(), if k == 10 { 3 } else { 10 });
            seen.extend_from_slice(&b.indices);
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..103).collect::<Vec<_>>(), "epoch {epoch}");
        assert_eq!(loader.position(), LoaderPosition::new(epoch + 1, 0));
    }
}

#[test]
fn each_example_at_most_once_with_drop_last() {
    let mut loader = DataLoader::new(Counting::arc(103), 10, true, true, 2);
    assert_eq!(loader.batches_per_epoch(), 10);
    let batches = take(&mut loader, 10);
    let mut seen = HashSet::new();
    for b in &batches {
        check_contents(b);
        assert_eq!(b.len(), 10);
        for &i in &b.indices {
            assert!(seen.insert(i), "index {i} twice in one epoch");
        }
    }
    assert_eq!(seen.len(), 100);
    // The next batch belongs to epoch 1.
    assert_eq!(
        loader.next_batch().unwrap().position,
        LoaderPosition::new(1, 0)
    );
}

#[test]
fn without_shuffle_order_is_sequential() {
    let mut loader = DataLoader::new(Counting::arc(25), 10, false, false, 0);
    let b = take(&mut loader, 4);
    assert_eq!(b[0].indices, (0..10).collect::<Vec<_>>());
    assert_eq!(b[2].indices, (20..25).collect::<Vec<_>>());
    assert_eq!(b[3].indices, (0..10).collect::<Vec<_>>());
}

#[test]
fn shuffle_differs_between_epochs_and_is_reproducible() {
    let ds = Counting::arc(200);
    let order = |seed: u64| -> Vec<usize> {
        let mut l = DataLoader::new(ds.clone(), 50, true, false, seed);
        take(&mut l, 8)
            .iter()
            .flat_map(|b| b.indices.clone())
            .collect()
    };
    let a = order(7);
    assert_eq!(a, order(7), "same seed, same batches");
    assert_ne!(a, order(8), "different seed, different order");
    let (e0, e1) = a.split_at(200);
    assert_ne!(e0, e1, "epochs must be shuffled differently");
    assert_ne!(e0, (0..200).collect::<Vec<_>>().as_slice());
    let loader = DataLoader::new(ds, 50, true, false, 7);
    assert_eq!(loader.epoch_indices(0), e0);
    assert_eq!(loader.epoch_indices(1), e1);
}

#[test]
fn shards_are_disjoint_and_cover_the_epoch() {
    let world = 3;
    for (n, drop_last) in [(99, false), (99, true), (100, false), (100, true)] {
        let ds = Counting::arc(n);
        let mut per_rank = Vec::new();
        for rank in 0..world {
            let mut l = DataLoader::new(ds.clone(), 11, true, drop_last, 5).with_shard(rank, world);
            let bpe = l.batches_per_epoch() as usize;
            let idx: Vec<usize> = take(&mut l, bpe)
                .iter()
                .inspect(|b| check_contents(b))
                .flat_map(|b| b.indices.clone())
                .collect();
            assert_eq!(idx, l.epoch_indices(0));
            assert_eq!(l.position(), LoaderPosition::new(1, 0));
            per_rank.push(idx);
        }
        let lens: HashSet<usize> = per_rank.iter().map(|v| v.len()).collect();
        assert_eq!(lens.len(), 1, "ranks must get equal shares: {lens:?}");
        let all: Vec<usize> = per_rank.iter().flatten().copied().collect();
        let distinct: HashSet<usize> = all.iter().copied().collect();
        if n % world == 0 || drop_last {
            assert_eq!(distinct.len(), all.len(), "n={n}: shards overlap");
            assert_eq!(distinct.len(), n / world * world);
        } else {
            // Padded by wrapping: every example appears, at most W-1 twice.
            assert_eq!(distinct.len(), n);
            assert!(all.len() - n < world);
        }
        if n % world == 0 {
            assert_eq!(distinct, (0..n).collect::<HashSet<_>>());
        }
    }
}

#[test]
fn shard_batches_together_form_the_global_batch() {
    let ds = Counting::arc(96);
    let single = DataLoader::new(ds.clone(), 24, true, true, 9).epoch_indices(0);
    let mut ranks: Vec<DataLoader> = (0..4)
        .map(|r| DataLoader::new(ds.clone(), 6, true, true, 9).with_shard(r, 4))
        .collect();
    for k in 0..4 {
        let mut union: Vec<usize> = ranks
            .iter_mut()
            .flat_map(|l| l.next_batch().unwrap().indices)
            .collect();
        union.sort_unstable();
        let mut want = single[k * 24..(k + 1) * 24].to_vec();
        want.sort_unstable();
        assert_eq!(union, want, "global batch {k}");
    }
}

#[test]
fn resuming_from_a_position_matches_an_uninterrupted_run() {
    let ds = Counting::arc(50);
    for (shard, drop_last) in [((0, 1), false), ((1, 2), true), ((2, 3), false)] {
        let make =
            || DataLoader::new(ds.clone(), 8, true, drop_last, 11).with_shard(shard.0, shard.1);
        let mut full_loader = make();
        let full = take(&mut full_loader, 30);
        for cut in [0usize, 1, 3, 4, 7, 13, 22] {
            let mut first = make();
            let _ = take(&mut first, cut);
            let saved = first.position().to_u64s();
            drop(first);
            let mut resumed = make().with_position(LoaderPosition::from_u64s(saved));
            assert_eq!(resumed.position(), full[cut].position);
            let rest = take(&mut resumed, 30 - cut);
            assert_eq!(rest, full[cut..], "shard {shard:?} cut {cut}");
        }
    }
}

#[test]
fn position_past_the_end_of_an_epoch_rolls_over() {
    let l = DataLoader::new(Counting::arc(20), 5, false, false, 0)
        .with_position(LoaderPosition::new(2, 9));
    assert_eq!(l.position(), LoaderPosition::new(4, 1));
}

/// Runs `f` on another thread and fails if it does not finish within `secs`.
fn finishes_within(secs: u64, f: impl FnOnce() + Send + 'static) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        f();
        let _ = tx.send(());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .expect("did not finish in time (hang?)");
}

#[test]
fn dropping_the_loader_mid_epoch_does_not_hang() {
    // Fast dataset: the background thread fills the channel and blocks on send.
    let mut fast = DataLoader::new(Counting::arc(1000), 4, true, false, 0);
    fast.next_batch().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    finishes_within(5, move || drop(fast));

    // Slow dataset: the thread is inside a batch when the loader is dropped.
    let slow: Arc<dyn Dataset> = Arc::new(Counting {
        n: 1000,
        delay: Duration::from_millis(5),
        panic_at: None,
    });
    let mut slow_loader = DataLoader::new(slow, 8, true, false, 0);
    slow_loader.next_batch().unwrap();
    finishes_within(5, move || drop(slow_loader));

    // Never started.
    let idle = DataLoader::new(Counting::arc(10), 4, true, false, 0);
    finishes_within(5, move || drop(idle));
}

#[test]
fn invalid_settings_are_errors_not_panics() {
    let cases = [
        DataLoader::new(Counting::arc(10), 0, true, false, 0),
        DataLoader::new(Counting::arc(10), 20, true, true, 0),
        DataLoader::new(Counting::arc(10), 2, true, false, 0).with_shard(3, 3),
        DataLoader::new(Counting::arc(10), 2, true, false, 0).with_shard(0, 0),
        DataLoader::new(Counting::arc(0), 2, true, false, 0),
    ];
    for mut l in cases {
        assert_eq!(l.batches_per_epoch(), 0);
        let err = l.next_batch().unwrap_err();
        assert!(matches!(err, DataError::Config(_)), "{err}");
    }
    // Small dataset without drop_last: one short batch per epoch.
    let mut l = DataLoader::new(Counting::arc(10), 20, true, false, 0);
    assert_eq!(l.next_batch().unwrap().len(), 10);
}

#[test]
fn a_panicking_dataset_gives_an_error() {
    let ds: Arc<dyn Dataset> = Arc::new(Counting {
        n: 10,
        delay: Duration::ZERO,
        panic_at: Some(4),
    });
    let mut l = DataLoader::new(ds, 4, false, false, 0);
    assert_eq!(l.next_batch().unwrap().indices, vec![0, 1, 2, 3]);
    let err = l.next_batch().unwrap_err();
    assert!(matches!(err, DataError::LoaderStopped(_)), "{err}");
    assert!(err.to_string().contains("cursed"), "{err}");
    assert_eq!(
        l.position(),
        LoaderPosition::new(0, 1),
        "no advance on error"
    );
}

#[test]
fn digits_batches_have_the_right_shapes() {
    let ds = Arc::new(digits(Split::Train).unwrap());
    let mut l = DataLoader::new(ds.clone(), 64, true, false, 3);
    assert_eq!(l.batches_per_epoch(), 1437u64.div_ceil(64));
    let b = l.next_batch().unwrap();
    assert_eq!(b.inputs.shape, vec![64, 1, 8, 8]);
    assert_eq!(b.targets.shape, vec![64]);
    // The batch is the stacked examples.
    let x = b.inputs.data.as_f32().unwrap();
    let y = b.targets.data.as_i64().unwrap();
    for (j, &i) in b.indices.iter().enumerate() {
        let (xi, yi) = ds.get(i);
        assert_eq!(&x[j * 64..(j + 1) * 64], xi.data.as_f32().unwrap());
        assert_eq!(y[j], yi.data.as_i64().unwrap()[0]);
    }
}
