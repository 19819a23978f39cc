//! Writing to the terminal without panicking: a closed pipe (`sinter train … | head -c1`)
//! is not an error worth dying for. The first failed write asks a running trainer to stop
//! cleanly (checkpoint, summary) and silences later output.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static CLOSED: AtomicBool = AtomicBool::new(false);

/// Whether a write to stderr or stdout has failed (the reader went away).
pub fn output_closed() -> bool {
    CLOSED.load(Ordering::SeqCst)
}

fn write_line(mut w: impl Write, line: &dyn std::fmt::Display) {
    if output_closed() {
        return;
    }
    if writeln!(w, "{line}").and_then(|_| w.flush()).is_err() {
        CLOSED.store(true, Ordering::SeqCst);
    }
}

/// A line on stderr (notes, progress, errors).
pub fn say(line: &dyn std::fmt::Display) {
    write_line(std::io::stderr().lock(), line);
}

/// A line on stdout (a command's result).
pub fn out(line: &dyn std::fmt::Display) {
    write_line(std::io::stdout().lock(), line);
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! say {
    ($($t:tt)*) => { $crate::term::say(&format_args!($($t)*)) };
}

/// `println!` that never panics.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::term::out(&format_args!($($t)*)) };
}
