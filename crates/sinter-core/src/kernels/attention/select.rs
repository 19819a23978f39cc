//! Which implementation the attention ops use: `SINTER_ATTENTION=cudnn|flash|composite` at
//! start-up, [`set_attention_backend`] process-wide, or [`with_attention_backend`] for one
//! scope of one thread (what tests use, so that tests running side by side do not switch each
//! other's kernels).

use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// An attention implementation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionBackend {
    /// cuDNN's fused attention where the loaded cuDNN takes the case, else sinter's flash
    /// kernel, else the composite (the default). On a real GPU, cuDNN only once asked for
    /// (`Cudnn`), until a GPU run has checked it (see `cudnn::takes`).
    Auto,
    /// As `Auto`, asked for by name: a case cuDNN cannot take says so once.
    Cudnn,
    /// sinter's flash kernels (CPU and CUDA), else the composite.
    Flash,
    /// The composite of unfused ops (materialises the [tq, tk] scores) on every device.
    Composite,
}

impl AttentionBackend {
    fn code(self) -> u8 {
        match self {
            AttentionBackend::Auto => 0,
            AttentionBackend::Cudnn => 1,
            AttentionBackend::Flash => 2,
            AttentionBackend::Composite => 3,
        }
    }
    fn of_code(c: u8) -> AttentionBackend {
        match c {
            1 => AttentionBackend::Cudnn,
            2 => AttentionBackend::Flash,
            3 => AttentionBackend::Composite,
            _ => AttentionBackend::Auto,
        }
    }

    /// `cudnn`, `flash`, `composite` or `auto` (or empty): the values `SINTER_ATTENTION` takes.
    pub fn parse(s: &str) -> Option<AttentionBackend> {
        Some(match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => AttentionBackend::Auto,
            "cudnn" => AttentionBackend::Cudnn,
            "flash" => AttentionBackend::Flash,
            "composite" => AttentionBackend::Composite,
            _ => return None,
        })
    }

    /// Whether cuDNN is tried first.
    pub fn tries_cudnn(self) -> bool {
        matches!(self, AttentionBackend::Auto | AttentionBackend::Cudnn)
    }
}

fn global() -> &'static AtomicU8 {
    static FLAG: OnceLock<AtomicU8> = OnceLock::new();
    FLAG.get_or_init(|| {
        let env = std::env::var("SINTER_ATTENTION").unwrap_or_default();
        let b = AttentionBackend::parse(&env).unwrap_or_else(|| {
            eprintln!(
                "sinter: SINTER_ATTENTION={env:?} is not one of cudnn, flash, composite; using \
                 the default (cudnn where supported, else flash)"
            );
            AttentionBackend::Auto
        });
        AtomicU8::new(b.code())
    })
}

thread_local! {
    static SCOPED: Cell<Option<AttentionBackend>> = const { Cell::new(None) };
}

/// Chooses the attention implementation for the following calls (process-wide; a scope of
/// [`with_attention_backend`] on a thread still wins there).
pub fn set_attention_backend(b: AttentionBackend) {
    global().store(b.code(), Ordering::Relaxed);
}

/// The implementation this thread's attention calls use now.
pub fn attention_backend() -> AttentionBackend {
    SCOPED
        .with(Cell::get)
        .unwrap_or_else(|| AttentionBackend::of_code(global().load(Ordering::Relaxed)))
}

/// Runs `f` with attention calls on this thread (forward and the backward it runs) using `b`.
pub fn with_attention_backend<R>(b: AttentionBackend, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<AttentionBackend>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(Some(b))));
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_scopes_nest_and_restore() {
        assert_eq!(
            AttentionBackend::parse("cuDNN"),
            Some(AttentionBackend::Cudnn)
        );
        assert_eq!(AttentionBackend::parse(""), Some(AttentionBackend::Auto));
        assert_eq!(
            AttentionBackend::parse("flash"),
            Some(AttentionBackend::Flash)
        );
        assert_eq!(
            AttentionBackend::parse("composite"),
            Some(AttentionBackend::Composite)
        );
        assert_eq!(AttentionBackend::parse("fa3"), None);
        let outer = attention_backend();
        with_attention_backend(AttentionBackend::Flash, || {
            assert_eq!(attention_backend(), AttentionBackend::Flash);
            with_attention_backend(AttentionBackend::Composite, || {
                assert_eq!(attention_backend(), AttentionBackend::Composite);
            });
            assert_eq!(attention_backend(), AttentionBackend::Flash);
        });
        assert_eq!(attention_backend(), outer);
        assert!(AttentionBackend::Auto.tries_cudnn() && !AttentionBackend::Flash.tries_cudnn());
    }
}
