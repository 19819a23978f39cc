//! What a run prints: notes on stderr (above the progress bar while it is drawn) and the
//! progress bar itself; where stderr is not a terminal (a log file, the ranks of `sinter
//! launch`), which hides the bar, a plain progress line after the first step and then every
//! [`PLAIN_EVERY`] instead, so a run is never silent for long. Only rank 0 talks, and nothing
//! at all with `--quiet`.

use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often a run whose stderr is not a terminal prints a progress line.
pub const PLAIN_EVERY: Duration = Duration::from_secs(10);

/// The plain progress lines: when the bar started, and when the last line was printed.
#[derive(Default)]
struct Plain {
    started: Option<Instant>,
    last: Option<Instant>,
}

/// The terminal side of a run. Cloning it shares the bar.
#[derive(Clone)]
pub struct Console {
    bar: ProgressBar,
    quiet: bool,
    /// Some when progress goes out as plain lines (stderr is not a terminal).
    plain: Option<Arc<Mutex<Plain>>>,
}

impl Console {
    /// A console whose bar is not drawn until [`Console::start_bar`].
    pub fn new(quiet: bool) -> Console {
        let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg} ETA {eta}",
            )
            .expect("valid template"),
        );
        let plain = (!quiet && !std::io::stderr().is_terminal())
            .then(|| Arc::new(Mutex::new(Plain::default())));
        Console { bar, quiet, plain }
    }

    /// Prints a line on stderr, above the bar when it is drawn.
    pub fn note(&self, line: impl std::fmt::Display) {
        if !self.quiet {
            self.bar.suspend(|| crate::term::say(&line));
        }
    }

    /// Starts drawing the bar (stderr, when it is a terminal) at `pos` of `len` steps. Lines
    /// printed before this are never drawn over.
    pub fn start_bar(&self, pos: u64, len: u64) {
        self.bar.set_length(len);
        self.bar.set_position(pos);
        if !self.quiet {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        if let Some(p) = &self.plain {
            p.lock().unwrap_or_else(|e| e.into_inner()).started = Some(Instant::now());
        }
    }

    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
        self.plain_line(pos);
    }

    /// Without a drawn bar: a progress line after the first step, then every PLAIN_EVERY.
    fn plain_line(&self, pos: u64) {
        let Some(p) = &self.plain else { return };
        let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
        let (Some(started), now) = (p.started, Instant::now()) else {
            return;
        };
        if p.last.is_some_and(|t| now - t < PLAIN_EVERY) {
            return;
        }
        p.last = Some(now);
        let msg = self.bar.message();
        let msg = if msg.is_empty() {
            String::new()
        } else {
            format!(", {msg}")
        };
        crate::say!(
            "step {pos}/{} after {:.1} s{msg}",
            self.bar.length().unwrap_or(0),
            (now - started).as_secs_f64()
        );
    }

    pub fn set_message(&self, msg: String) {
        self.bar.set_message(msg);
    }

    /// Leaves the bar as it is (a failed run).
    pub fn abandon(&self) {
        self.bar.abandon();
    }

    /// Removes the bar (a finished run).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
