//! How a run is stopped from outside. SIGINT and SIGTERM ask the trainer to stop at the next
//! step it can (it writes a checkpoint, the summary and the plot, then exits with 128 + the
//! signal's number, so a preempted job resumes where it stopped); a second signal exits at
//! once. A rank started by `sinter launch` dies with its launcher, even one killed by
//! SIGKILL (Linux's parent-death signal), instead of training on as an orphan.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

static COUNT: AtomicUsize = AtomicUsize::new(0);
static LAST: AtomicI32 = AtomicI32::new(0);

/// The variable `sinter launch` gives its ranks: the launcher's process id.
pub const LAUNCHER_PID: &str = "SINTER_LAUNCHER_PID";

extern "C" fn on_signal(sig: libc::c_int) {
    LAST.store(sig, Ordering::SeqCst);
    if COUNT.fetch_add(1, Ordering::SeqCst) >= 1 {
        // Only async-signal-safe calls here.
        unsafe { libc::_exit(128 + sig) };
    }
}

/// Installs the SIGINT / SIGTERM handler (for `train`).
pub fn install() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a plain handler that only touches atomics and calls _exit.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// The signal that asked this process to stop, if one did.
pub fn requested() -> Option<i32> {
    (COUNT.load(Ordering::SeqCst) > 0).then(|| LAST.load(Ordering::SeqCst))
}

/// "SIGTERM", "SIGINT", or the number.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        n => format!("signal {n}"),
    }
}

/// In a rank started by `sinter launch`: die with the launcher. The kernel sends SIGKILL when
/// the parent goes; a launcher already gone before this call is caught by comparing the
/// parent's id with the one the launcher passed down.
pub fn die_with_launcher() {
    let Some(launcher) = std::env::var(LAUNCHER_PID)
        .ok()
        .and_then(|v| v.parse::<i32>().ok())
    else {
        return;
    };
    // SAFETY: prctl and getppid have no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != launcher {
            libc::_exit(128 + libc::SIGKILL);
        }
    }
}
