//! What a run prints: notes on stderr (above the progress bar while it is drawn) and the
//! progress bar itself. Only rank 0 talks, and nothing at all with `--quiet`.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// The terminal side of a run. Cloning it shares the bar.
#[derive(Clone)]
pub struct Console {
    bar: ProgressBar,
    quiet: bool,
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
        Console { bar, quiet }
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
    }

    pub fn set_position(&self, pos: u64) {
        self.bar.set_position(pos);
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
