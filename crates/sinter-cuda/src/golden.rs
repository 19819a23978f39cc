//! Launches as text, pinned in golden files: the tests that prove a rewrite of launch plans
//! leaves every launch as it was (sinter-cuda's `tests/launch_table.rs` for the kernel table's
//! rows, the kernel folders of sinter-core for theirs) write one line per planned launch and
//! compare the lines with a recorded file. `SINTER_BLESS=1` rewrites the file instead (only on
//! purpose, reviewing its diff).

use std::path::Path;

use crate::launch::{Arg, Launch};
use crate::user_kernel::UserLaunch;

/// One argument as the golden files spell it (f32 as bits, so the text is exact).
pub fn arg_text(a: &Arg) -> String {
    match a {
        Arg::Ptr(p) => format!("ptr {p:#x}"),
        Arg::I64(v) => format!("i64 {v}"),
        Arg::U64(v) => format!("u64 {v}"),
        Arg::I32(v) => format!("i32 {v}"),
        Arg::F32(v) => format!("f32 {:#010x}", v.to_bits()),
        Arg::Strided(m) => format!("strided {m:?}"),
        Arg::Bytes(b) => {
            let hex: String = b.as_slice().iter().map(|x| format!("{x:02x}")).collect();
            format!("bytes {hex}")
        }
    }
}

fn args_text(args: &[Arg]) -> String {
    args.iter().map(arg_text).collect::<Vec<_>>().join(", ")
}

/// Every field of a launch of a built-in kernel file.
pub fn launch_text(l: &Launch) -> String {
    let file = match l.file {
        Some(f) => format!("{f:?}"),
        None => "given".into(),
    };
    format!(
        "{file} {} grid {:?} block {:?} smem {} args [{}] traffic {:?}",
        l.name,
        l.grid,
        l.block,
        l.shared_mem,
        args_text(&l.args),
        l.traffic
    )
}

/// Every field of a launch of a kernel source that lives beside its op.
pub fn user_launch_text(l: &UserLaunch) -> String {
    format!(
        "{} grid {:?} block {:?} smem {} args [{}] declared {:?}",
        l.kernel,
        l.grid,
        l.block,
        l.shared_mem,
        args_text(&l.args),
        l.declared
    )
}

/// Panics (naming the first differing line) unless `lines` are the lines of the golden file
/// `path`; with `SINTER_BLESS=1`, writes them there instead.
pub fn check(path: &Path, lines: &[String]) {
    let got = lines.join("\n") + "\n";
    if std::env::var("SINTER_BLESS").is_ok_and(|v| v == "1") {
        std::fs::write(path, &got).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    let want = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (record it with SINTER_BLESS=1)", path.display()));
    let (got, want): (Vec<&str>, Vec<&str>) = (got.lines().collect(), want.lines().collect());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "line {} of {} differs", k + 1, path.display());
    }
    assert_eq!(
        got.len(),
        want.len(),
        "number of lines of {}",
        path.display()
    );
}
