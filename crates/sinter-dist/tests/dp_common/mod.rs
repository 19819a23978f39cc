//! Helpers shared by the data-parallel and ZeRO tests: a small MLP, synthetic batches, a
//! collective-counting communicator, and comparisons.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sinter_core::{Device, Result as CoreResult, Rng, Tensor};
use sinter_dist::{Communicator, ReduceOp};
use sinter_nn::Module;

pub const T: Duration = Duration::from_secs(30);
pub const IN: usize = 12;
pub const CLASSES: usize = 5;

/// The test model; every rank may start from a different seed (data parallel broadcasts
/// rank 0's weights).
pub fn model(seed: u64) -> Box<dyn Module> {
    let mut rng = Rng::new(seed);
    Box::new(sinter_models::Mlp::new(IN, &[32, 24, 16], CLASSES, &mut rng).unwrap())
}

fn val(step: usize, i: usize) -> f32 {
    let mut x = (step as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 31;
    x = x.wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 29;
    ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
}

/// Rows `rows` of the global batch of step `step`: inputs [n, IN], targets [n].
pub fn batch(step: usize, rows: std::ops::Range<usize>) -> (Tensor, Tensor) {
    let n = rows.len();
    let mut x = Vec::with_capacity(n * IN);
    let mut y = Vec::with_capacity(n);
    for r in rows {
        for j in 0..IN {
            x.push(val(step, r * IN + j));
        }
        y.push(((val(step + 1000, r) + 1.0) * 2.5) as i64 % CLASSES as i64);
    }
    (
        Tensor::from_vec(x, &[n, IN], Device::Cpu).unwrap(),
        Tensor::from_vec(y, &[n], Device::Cpu).unwrap(),
    )
}

/// Mean cross-entropy of `m` on rows `rows` of step `step`'s batch.
pub fn loss(m: &dyn Module, step: usize, rows: std::ops::Range<usize>) -> CoreResult<Tensor> {
    let (x, y) = batch(step, rows);
    m.forward(&x)?.cross_entropy(&y, -100)
}

pub fn weights(m: &dyn Module) -> Vec<Vec<f32>> {
    m.parameters()
        .iter()
        .map(|(_, t)| t.to_vec_f32().unwrap())
        .collect()
}

/// Largest |a − b| / max(|b|, 1e-3) over all weights; asserts it is below `tol`.
pub fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: parameter count");
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.len(), w.len());
        for (a, b) in g.iter().zip(w) {
            let rel = (*a as f64 - *b as f64).abs() / (b.abs() as f64).max(1e-3);
            worst = worst.max(rel);
        }
    }
    assert!(
        worst <= tol,
        "{what}: worst relative difference {worst:e} > {tol:e}"
    );
}

/// Forwards every call, counting the collectives that reach the transport.
pub struct Counting<C: Communicator> {
    pub inner: C,
    pub count: Arc<AtomicUsize>,
}

impl<C: Communicator> Counting<C> {
    fn tick(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
    }
}

impl<C: Communicator> Communicator for Counting<C> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn all_reduce(&mut self, buf: &mut [f32], op: ReduceOp) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.all_reduce(buf, op)
    }
    fn reduce_scatter(
        &mut self,
        input: &[f32],
        output: &mut [f32],
        op: ReduceOp,
    ) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.reduce_scatter(input, output, op)
    }
    fn all_gather(&mut self, input: &[f32], output: &mut [f32]) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.all_gather(input, output)
    }
    fn broadcast(&mut self, buf: &mut [f32], root: usize) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.broadcast(buf, root)
    }
    fn send(&mut self, buf: &[f32], dst: usize) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.send(buf, dst)
    }
    fn recv(&mut self, buf: &mut [f32], src: usize) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.recv(buf, src)
    }
    fn barrier(&mut self) -> sinter_dist::Result<()> {
        self.tick();
        self.inner.barrier()
    }
    fn new_group(&mut self, ranks: &[usize]) -> sinter_dist::Result<Box<dyn Communicator>> {
        self.inner.new_group(ranks)
    }
    fn timeout(&self) -> Duration {
        self.inner.timeout()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.inner.set_timeout(timeout)
    }
}
