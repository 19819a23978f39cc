//! Where a load test's CPU time went: this process's threads, grouped by what they do (the
//! model's step, the HTTP server, the load generator's clients), read from Linux's
//! `/proc/self/task/*/stat` before and after a run.
//!
//! On a machine with few cores the server, the kernel's TCP work and the clients share the
//! same cores, so tokens/s at high concurrency is bounded by cores ÷ (CPU seconds per token,
//! all roles together): the split says which role's cost sets that bound.

use std::collections::HashMap;
use std::time::Duration;

/// What a thread does, from the name it was given (`comm`, cut to 15 bytes by the kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The scheduler and the model's step threads (`sinter-model-*`, `sinter-scheduler`).
    Engine,
    /// The HTTP runtime (`sinter-http*`), with the kernel's work in its system calls.
    Http,
    /// The load generator's clients (`sinter-bench-client`).
    Client,
    Other,
}

impl Role {
    pub const ALL: [Role; 4] = [Role::Engine, Role::Http, Role::Client, Role::Other];

    fn of(comm: &str) -> Role {
        if comm.starts_with("sinter-model") || comm.starts_with("sinter-schedule") {
            Role::Engine
        } else if comm.starts_with("sinter-http") {
            Role::Http
        } else if comm.starts_with("sinter-bench-cl") {
            Role::Client
        } else {
            Role::Other
        }
    }
}

/// CPU time (user + system) of every live thread of this process, by thread id.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    threads: HashMap<u64, (Role, Duration)>,
}

impl Snapshot {
    /// None where `/proc` cannot be read (not Linux).
    pub fn take() -> Option<Snapshot> {
        let tick = clock_tick()?;
        let mut threads = HashMap::new();
        for entry in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let Ok(tid) = entry.file_name().to_string_lossy().parse::<u64>() else {
                continue;
            };
            // A thread that ended since the listing is skipped (its time is lost either way).
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            if let Some((comm, ticks)) = parse_stat(&stat) {
                threads.insert(tid, (Role::of(comm), tick * ticks as u32));
            }
        }
        Some(Snapshot { threads })
    }

    /// CPU time per role spent between `before` and this snapshot (threads started since
    /// count from zero).
    pub fn since(&self, before: &Snapshot) -> CpuSplit {
        let mut split = CpuSplit::default();
        for (tid, &(role, t)) in &self.threads {
            let was = before
                .threads
                .get(tid)
                .map_or(Duration::ZERO, |&(_, t0)| t0);
            *split.slot(role) += t.saturating_sub(was);
        }
        split
    }
}

/// CPU time per role over a run.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuSplit {
    per_role: [Duration; 4],
}

impl CpuSplit {
    fn slot(&mut self, role: Role) -> &mut Duration {
        &mut self.per_role[role as usize]
    }

    pub fn get(&self, role: Role) -> Duration {
        self.per_role[role as usize]
    }

    pub fn total(&self) -> Duration {
        self.per_role.iter().sum()
    }
}

/// The length of a clock tick of `/proc`'s CPU times (None off Linux: no `/proc` to read).
fn clock_tick() -> Option<Duration> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sysconf only reads a configuration value.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (hz > 0).then(|| Duration::from_secs_f64(1.0 / hz as f64))
    }
    #[cfg(not(target_os = "linux"))]
    None
}

/// The thread's name and its user + system time in clock ticks, from a `stat` line
/// (`tid (comm) state …`, utime and stime the 14th and 15th fields). The name may hold
/// spaces and parentheses: it ends at the last ')'.
fn parse_stat(stat: &str) -> Option<(&str, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?;
    // After ") " come the fields from the 3rd (state) on: utime is the 12th of those.
    let mut rest = stat.get(close + 1..)?.split_whitespace().skip(11);
    let utime: u64 = rest.next()?.parse().ok()?;
    let stime: u64 = rest.next()?.parse().ok()?;
    Some((comm, utime + stime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_name_and_cpu_ticks() {
        let line = "4242 (sinter-model-1) R 1 2 3 4 5 6 7 8 9 10 250 31 0 0 20 0 3 0";
        assert_eq!(parse_stat(line), Some(("sinter-model-1", 281)));
        // A name with a space and a parenthesis.
        let odd = "7 (a) b) S 1 2 3 4 5 6 7 8 9 10 4 6 0";
        assert_eq!(parse_stat(odd), Some(("a) b", 10)));
        assert_eq!(parse_stat("7 (cut"), None);
        assert_eq!(parse_stat("7 (x) S 1 2"), None);
    }

    #[test]
    fn roles_follow_thread_names() {
        assert_eq!(Role::of("sinter-model-0"), Role::Engine);
        assert_eq!(Role::of("sinter-schedule"), Role::Engine);
        assert_eq!(Role::of("sinter-http-wor"), Role::Http);
        assert_eq!(Role::of("sinter-bench-cl"), Role::Client);
        assert_eq!(Role::of("tokio-runtime-w"), Role::Other);
    }

    /// This thread's CPU time by another interface of the kernel (getrusage), to check the
    /// snapshots against.
    #[cfg(target_os = "linux")]
    fn own_cpu() -> Duration {
        // SAFETY: getrusage writes the struct it is given.
        let mut u: libc::rusage = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) }, 0);
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
        };
        tv(u.ru_utime) + tv(u.ru_stime)
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_busy_thread_shows_in_its_role() {
        let before = Snapshot::take().unwrap();
        let busy = std::thread::Builder::new()
            .name("sinter-model-9".into())
            .spawn(|| {
                // 200 ms of this thread's own CPU time, however loaded the machine is.
                let mut x = 0u64;
                while own_cpu() < Duration::from_millis(200) {
                    for _ in 0..10_000 {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                }
                // Read while the thread still lives: an ended thread leaves /proc/self/task.
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() } as u64;
                (Snapshot::take().unwrap(), own_cpu(), tid)
            })
            .unwrap();
        let (after, spent, tid) = busy.join().unwrap();
        // This thread's entry (other tests' threads may run beside it): the role its name
        // gives, and its time within two clock ticks (10 ms on most kernels) of getrusage's.
        let (role, t) = after.threads[&tid];
        assert_eq!(role, Role::Engine);
        let tick2 = Duration::from_millis(20);
        assert!(
            t + tick2 >= spent && t <= spent + tick2,
            "{t:?} against {spent:?}"
        );
        // A thread started after `before` counts from zero.
        let split = after.since(&before);
        assert!(split.get(Role::Engine) >= t, "{split:?}");
        assert!(split.total() >= split.get(Role::Engine));
    }
}
