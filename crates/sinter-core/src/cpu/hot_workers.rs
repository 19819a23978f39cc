//! Keeping rayon's other workers awake through a burst of parallel ops (a training step).
//!
//! A step runs hundreds of short parallel ops. Between two of them rayon's idle workers
//! yield a few rounds (`sched_yield`) and then sleep on a futex, so the next op wakes them
//! with a system call and waits for the scheduler to run them: on 2 cores that showed as
//! ~7 % of a gpt-tiny step's samples in the kernel's futex, wake-up and yield paths.
//! OpenMP runtimes (PyTorch's) spin instead for a while after each region. [`HotWorkers`]
//! does the same for rayon: while it lives, each other worker runs a job that looks for
//! work in a loop (`rayon::yield_now`, which runs what it finds) and spins between looks,
//! so it is never asleep when an op splits. `SINTER_HOT_WORKERS=0` turns it off (a machine
//! whose cores are shared with other work, or for measuring).
//!
//! Engaged around each training step of a single-process run and each evaluation (the
//! trainer, `sinter bench cpu`'s steps). Not in multi-process runs: `sinter launch` may put
//! several ranks on one machine, sharing its cores, and a spinner would take a core from
//! another rank while its own rank waits in a collective. Measured on 2 Xeon cores
//! (2026-11-30, `sinter bench cpu`, off / on, interleaved): capped to AVX2, gpt-tiny step
//! 17.6–17.9k → 17.6–18.6k tokens/s, llama-tiny 19.0–20.3k → 20.0–21.1k, CNN step
//! 2.13–2.22 → 1.85–1.91 ms, the default `sinter train` 1.57–1.62 → 1.41–1.42 s; native
//! AVX-512, gpt 27.4–28.5k → 29.0–29.5k, llama 29.7–31.2k → 31.9–33.2k, CNN step 1.86–1.88 →
//! 1.49–1.59 ms. Not engaged for generation or one-image inference:
//! there a hot worker steals halves of ops too small to split, and decoding ran slower
//! (context 256: 6.2–7.2k → 5.4–5.7k tokens/s).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a worker spins without finding work before it gives up and lets rayon put it to
/// sleep: a step's serial stretches (the optimizer's bookkeeping, logging) are shorter, a
/// checkpoint write or the data loader's refill can be longer and then costs no spinning.
const IDLE_LIMIT: Duration = Duration::from_millis(2);

/// While alive, rayon's other workers spin for work instead of sleeping (see the module
/// docs). Dropping it lets them sleep again.
#[must_use = "the workers stay hot only while the guard lives"]
pub struct HotWorkers {
    stop: Arc<AtomicBool>,
}

impl HotWorkers {
    /// Keeps the pool's other workers hot when called from a worker of a rayon pool with
    /// more than one thread (the `sinter` binary's main thread is worker 0 of the global
    /// pool); elsewhere it does nothing: a thread outside the pool waits on a latch anyway.
    pub fn engage() -> HotWorkers {
        Self::engage_for(IDLE_LIMIT)
    }

    /// [`Self::engage`] with spinners that give up after `idle` without work.
    fn engage_for(idle: Duration) -> HotWorkers {
        let stop = Arc::new(AtomicBool::new(false));
        if !enabled() {
            return HotWorkers { stop };
        }
        if let Some(me) = rayon::current_thread_index() {
            for _ in 1..rayon::current_num_threads() {
                let stop = stop.clone();
                rayon::spawn(move || spin_for_work(&stop, me, idle));
            }
        }
        HotWorkers { stop }
    }
}

/// How many workers spin for work now (for tests and diagnostics).
pub fn spinning() -> usize {
    SPINNING.load(Ordering::Relaxed)
}

static SPINNING: AtomicUsize = AtomicUsize::new(0);

/// Takes a spinner off [`SPINNING`] however it leaves (a job run inside it may panic).
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        SPINNING.fetch_sub(1, Ordering::Relaxed);
    }
}

/// False when SINTER_HOT_WORKERS is 0 (read once).
fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("SINTER_HOT_WORKERS").map_or(true, |v| v.trim() != "0"))
}

impl Drop for HotWorkers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Runs whatever work the pool has until `stop` or `idle` without any. A spinner
/// picked up by the engaging worker itself (`owner`, e.g. while it waits inside a join)
/// returns at once: it would hold that worker until its own guard dropped.
fn spin_for_work(stop: &AtomicBool, owner: usize, idle: Duration) {
    if rayon::current_thread_index() == Some(owner) {
        return;
    }
    SPINNING.fetch_add(1, Ordering::Relaxed);
    let _count = Counted;
    let mut last_work = Instant::now();
    let mut spins = 0u32;
    while !stop.load(Ordering::Relaxed) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {
                last_work = Instant::now();
                spins = 0;
            }
            _ => {
                std::hint::spin_loop();
                spins += 1;
                // The clock is read every 256 idle looks, not on each.
                if spins.is_multiple_of(256) && last_work.elapsed() > idle {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// Polls `f` for up to a second.
    fn soon(f: impl Fn() -> bool) -> bool {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(1) {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        f()
    }

    // One test: the spinner count is process-wide, so the cases run in order.
    #[test]
    fn workers_spin_while_the_guard_lives_stop_after_it_and_after_idling_and_work_still_runs() {
        // Outside any pool: nothing spins.
        drop(HotWorkers::engage());
        assert_eq!(spinning(), 0);

        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        pool.install(|| {
            // An idle limit longer than the test: only the drop can stop them.
            let hot = HotWorkers::engage_for(Duration::from_secs(60));
            assert!(soon(|| spinning() == 2), "{} spinners, want 2", spinning());
            // Parallel work runs, on the spinners too, and gives the right answer.
            for _ in 0..200 {
                let sum: u64 = (0..10_000u64).into_par_iter().map(|x| x * x).sum();
                assert_eq!(sum, (0..10_000u64).map(|x| x * x).sum::<u64>());
            }
            drop(hot);
            assert!(
                soon(|| spinning() == 0),
                "{} still spin after the drop",
                spinning()
            );

            // With nothing to do they give up after the idle limit though the guard lives.
            let hot = HotWorkers::engage_for(Duration::from_millis(20));
            assert!(soon(|| spinning() == 2));
            assert!(
                soon(|| spinning() == 0),
                "{} spin past the idle limit",
                spinning()
            );
            drop(hot);
        });
    }
}
