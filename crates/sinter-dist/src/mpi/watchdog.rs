//! Deadlines of blocking calls that cannot be cancelled: one thread watches every armed call
//! and, when one overruns, prints why and runs its abort (which ends the process).

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Instant;

struct Call {
    deadline: Instant,
    why: String,
    abort: fn(),
}

#[derive(Default)]
struct Calls {
    next: u64,
    armed: BTreeMap<u64, Call>,
}

struct Watch {
    calls: Mutex<Calls>,
    wake: Condvar,
}

fn watch() -> &'static Watch {
    static W: OnceLock<&'static Watch> = OnceLock::new();
    W.get_or_init(|| {
        let w: &'static Watch = Box::leak(Box::new(Watch {
            calls: Mutex::new(Calls::default()),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("sinter-mpi-watchdog".into())
            .spawn(move || run(w))
            .expect("spawn the MPI watchdog thread");
        w
    })
}

fn run(w: &'static Watch) {
    let mut calls = w.calls.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let first = calls
            .armed
            .values()
            .min_by_key(|c| c.deadline)
            .map(|c| (c.deadline, c.why.clone(), c.abort));
        match first {
            None => calls = w.wake.wait(calls).unwrap_or_else(|e| e.into_inner()),
            Some((deadline, why, abort)) => {
                let now = Instant::now();
                if now >= deadline {
                    drop(calls);
                    eprintln!("error: {why} (MPI cannot cancel the call: ending the job)");
                    abort();
                    // An abort that returned leaves nothing better to do.
                    std::process::exit(1);
                }
                calls = w
                    .wake
                    .wait_timeout(calls, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

/// Disarms its call when dropped (the call returned in time).
pub(crate) struct Armed(u64);

impl Drop for Armed {
    fn drop(&mut self) {
        let w = watch();
        w.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .armed
            .remove(&self.0);
    }
}

/// Arms a call: unless the returned guard is dropped by `deadline`, `why` is printed and
/// `abort` runs.
pub(crate) fn arm(deadline: Instant, why: String, abort: fn()) -> Armed {
    let w = watch();
    let mut calls = w.calls.lock().unwrap_or_else(|e| e.into_inner());
    calls.next += 1;
    let id = calls.next;
    calls.armed.insert(
        id,
        Call {
            deadline,
            why,
            abort,
        },
    );
    w.wake.notify_one();
    Armed(id)
}
