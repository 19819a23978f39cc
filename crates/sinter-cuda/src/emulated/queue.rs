//! The emulated device's work queue: one worker thread runs everything submitted to the device,
//! in submission order, while the host goes on (as a GPU runs its streams while the CPU
//! enqueues). Every stream of the device feeds this one queue, which is a legal schedule of
//! their work: an operation can only depend on work submitted before it.
//!
//! Completion is counted: the n-th submitted job is complete once `completed >= n`, so an event
//! is just the sequence number of the last job submitted before it was recorded. A job that
//! fails poisons the queue (like a kernel fault poisons a CUDA context): the jobs after it are
//! skipped and every later synchronisation reports the first failure.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::{CudaError, Result};

/// One unit of device work; `Err` describes a failure (a kernel the emulator rejected).
pub(crate) type Job = Box<dyn FnOnce() -> std::result::Result<(), String> + Send>;

#[derive(Default)]
struct State {
    jobs: VecDeque<Job>,
    submitted: u64,
    completed: u64,
    failed: Option<String>,
    closed: bool,
}

pub(crate) struct Queue {
    ordinal: usize,
    state: Mutex<State>,
    changed: Condvar,
}

impl Queue {
    /// A queue with its worker thread running.
    pub(crate) fn start(ordinal: usize) -> Result<Arc<Queue>> {
        let q = Arc::new(Queue {
            ordinal,
            state: Mutex::default(),
            changed: Condvar::new(),
        });
        let worker = q.clone();
        std::thread::Builder::new()
            .name(format!("sinter-emu-cuda{ordinal}"))
            .spawn(move || worker.work())
            .map_err(|e| CudaError::Emulator {
                op: "start",
                msg: format!("cannot start the emulated device's worker thread: {e}"),
            })?;
        Ok(q)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn failure(&self, why: &str) -> CudaError {
        CudaError::Emulator {
            op: "device",
            msg: format!(
                "emulated CUDA device {} is unusable after an earlier failure: {why}",
                self.ordinal
            ),
        }
    }

    fn work(&self) {
        loop {
            let job = {
                let mut s = self.lock();
                loop {
                    if let Some(j) = s.jobs.pop_front() {
                        break Some((j, s.failed.is_some()));
                    }
                    if s.closed {
                        break None;
                    }
                    s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
                }
            };
            let Some((job, skip)) = job else { return };
            let r = if skip {
                Ok(())
            } else {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).unwrap_or_else(|p| {
                    Err(p
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_else(|| "a job panicked".into()))
                })
            };
            let mut s = self.lock();
            s.completed += 1;
            if let Err(e) = r {
                s.failed.get_or_insert(e);
            }
            self.changed.notify_all();
        }
    }

    /// Queue `job`; returns its sequence number. A poisoned queue refuses new work.
    pub(crate) fn submit(&self, job: Job) -> Result<u64> {
        let mut s = self.lock();
        if let Some(why) = &s.failed {
            return Err(self.failure(why));
        }
        if s.closed {
            return Err(CudaError::Emulator {
                op: "submit",
                msg: format!("emulated CUDA device {} was shut down", self.ordinal),
            });
        }
        s.jobs.push_back(job);
        s.submitted += 1;
        self.changed.notify_all();
        Ok(s.submitted)
    }

    /// Sequence number of the last submitted job (0: none yet).
    pub(crate) fn last_submitted(&self) -> u64 {
        self.lock().submitted
    }

    /// Whether job `seq` (and everything before it) has finished.
    pub(crate) fn is_complete(&self, seq: u64) -> Result<bool> {
        let s = self.lock();
        if let Some(why) = &s.failed {
            return Err(self.failure(why));
        }
        Ok(s.completed >= seq)
    }

    /// Wait until job `seq` (and everything before it) has finished.
    pub(crate) fn wait_for(&self, seq: u64) -> Result<()> {
        let mut s = self.lock();
        // The worker drains the queue even after `close`, so this always ends.
        while s.completed < seq {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        match &s.failed {
            Some(why) => Err(self.failure(why)),
            None => Ok(()),
        }
    }

    /// Wait for everything submitted so far.
    pub(crate) fn synchronize(&self) -> Result<()> {
        let seq = self.last_submitted();
        self.wait_for(seq)
    }

    /// Let the worker finish what is queued and exit.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn runs_in_order_and_counts_completion() {
        let q = Queue::start(0).unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let g = gate.clone();
        let first = q
            .submit(Box::new(move || {
                let (m, c) = &*g;
                let mut open = m.lock().unwrap();
                while !*open {
                    open = c.wait(open).unwrap();
                }
                Ok(())
            }))
            .unwrap();
        for i in 0..5 {
            let l = log.clone();
            q.submit(Box::new(move || {
                l.lock().unwrap().push(i);
                Ok(())
            }))
            .unwrap();
        }
        // The host goes on while the device is busy: nothing after the gate has run.
        assert!(!q.is_complete(first).unwrap());
        assert!(log.lock().unwrap().is_empty());
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        q.synchronize().unwrap();
        assert_eq!(*log.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert!(q.is_complete(q.last_submitted()).unwrap());
        q.close();
    }

    #[test]
    fn a_failure_poisons_the_queue_and_is_reported() {
        let q = Queue::start(7).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        q.submit(Box::new(|| Err("kernel k: divergent barrier".into())))
            .unwrap();
        let r = ran.clone();
        let _ = q.submit(Box::new(move || {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }));
        let e = q.synchronize().unwrap_err().to_string();
        assert!(
            e.contains("divergent barrier") && e.contains("device 7"),
            "{e}"
        );
        assert_eq!(
            ran.load(Ordering::SeqCst),
            0,
            "work after a failure is skipped"
        );
        assert!(q.submit(Box::new(|| Ok(()))).is_err());
        q.submit(Box::new(|| panic!("boom"))).unwrap_err();
        q.close();
    }

    #[test]
    fn a_panicking_job_is_a_failure_not_a_crash() {
        let q = Queue::start(1).unwrap();
        q.submit(Box::new(|| panic!("host gemm bug"))).unwrap();
        let e = q.synchronize().unwrap_err().to_string();
        assert!(e.contains("host gemm bug"), "{e}");
        q.close();
    }
}
