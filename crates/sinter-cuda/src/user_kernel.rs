//! Kernels that come from outside sinter (custom ops): CUDA C++ text handed over at run time
//! instead of a [`KernelFile`](crate::nvrtc::KernelFile), launched on a device's one stream like
//! every other kernel.
//!
//! A [`KernelSource`] is compiled by NVRTC to PTX once per process and architecture (and cached
//! on disk like the kernel files, keyed by its text); [`kernels/common.cuh`](crate::nvrtc::COMMON)
//! is prepended, so the typedefs and helpers of sinter's own kernels are there. Before a launch
//! runs, [`CudaDevice::launch_user`](crate::CudaDevice::launch_user) checks it against the compiled PTX: the kernel must be an
//! `extern "C" __global__` entry of the source, and the launch's arguments must match its
//! parameters in number and kind (pointer or 64-bit integer, 32-bit integer, f32). On a real
//! GPU the PTX is loaded (the driver finishes it for the device); on the emulated device the
//! same text runs in the kernel emulator (built once by the host C++ compiler), after the same
//! NVRTC check when NVRTC is present.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use crate::emulated::cost::{Call, OpClass};
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, Traffic};
use crate::nvrtc::{self, KernelCache, Output, PtxEntry};

/// CUDA C++ source of one or more `extern "C" __global__` kernels.
#[derive(Debug)]
pub struct KernelSource {
    name: String,
    program: String,
    id: u128,
    /// PTX per architecture, compiled on first use.
    ptx: Mutex<HashMap<String, Arc<CompiledPtx>>>,
}

/// NVRTC's output for one architecture, with the kernels it declares.
#[derive(Debug)]
pub struct CompiledPtx {
    pub ptx: String,
    pub entries: Vec<PtxEntry>,
}

impl KernelSource {
    /// `text` under the file name `name` (letters, digits, `_`, `-` and `.`; it names the
    /// source in compiler errors and in the kernel caches, e.g. `lltm.cu`).
    pub fn new(name: &str, text: &str) -> Result<KernelSource> {
        let ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        if !ok {
            return Err(CudaError::invalid(
                "custom kernel",
                format!("source name `{name}` must be 1 to 64 letters, digits, `_`, `-` or `.` (e.g. `my_op.cu`)"),
            ));
        }
        let program = format!("{}\n#line 1 \"{name}\"\n{text}", nvrtc::COMMON);
        let mut h = nvrtc::Fnv128::default();
        h.field(program.as_bytes());
        Ok(KernelSource {
            name: name.to_string(),
            program,
            id: h.finish(),
            ptx: Mutex::default(),
        })
    }

    /// The file name given to [`KernelSource::new`].
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A hash of the program text (what the compiled modules are cached by).
    pub fn id(&self) -> u128 {
        self.id
    }

    /// What NVRTC compiles: the prelude, then the text with `#line` so errors point into it.
    pub fn program_source(&self) -> &str {
        &self.program
    }

    /// The name of the kernel emulator's build of this source (one per text).
    pub fn emu_stem(&self) -> String {
        format!(
            "user-{}-{:016x}",
            self.name.trim_end_matches(".cu"),
            self.id as u64
        )
    }

    /// The PTX for `arch` (`sm_XY`), compiled by NVRTC at the first call for that architecture
    /// (or read from the disk cache). A compile error is `CudaError::Compile` with NVRTC's log.
    pub fn ptx(&self, arch: &str) -> Result<Arc<CompiledPtx>> {
        let mut cache = self.ptx.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(arch) {
            return Ok(p.clone());
        }
        // PTX does not depend on the driver: no driver version in the key.
        let (bytes, _hit) = nvrtc::load_or_compile_source(
            &KernelCache::from_env(),
            &self.name,
            &self.program,
            arch,
            Output::Ptx,
            (0, 0),
        )?;
        let ptx = String::from_utf8_lossy(&bytes).into_owned();
        let compiled = Arc::new(CompiledPtx {
            entries: nvrtc::ptx_entries(&ptx),
            ptx,
        });
        cache.insert(arch.to_string(), compiled.clone());
        Ok(compiled)
    }

    /// Ok when `l` names a kernel of this source and its arguments match the kernel's
    /// parameters (from the compiled PTX), else an error saying what differs.
    pub fn check_launch(&self, compiled: &CompiledPtx, l: &UserLaunch) -> Result<()> {
        let bad = |msg: String| CudaError::invalid("custom kernel launch", msg);
        let Some(entry) = compiled.entries.iter().find(|e| e.name == l.kernel) else {
            let names: Vec<&str> = compiled.entries.iter().map(|e| e.name.as_str()).collect();
            return Err(bad(format!(
                "{} has no extern \"C\" __global__ kernel `{}` (it has: {})",
                self.name,
                l.kernel,
                names.join(", ")
            )));
        };
        if entry.params.len() != l.args.len() {
            return Err(bad(format!(
                "kernel `{}` of {} takes {} parameters but the launch passes {} arguments",
                l.kernel,
                self.name,
                entry.params.len(),
                l.args.len()
            )));
        }
        for (i, (p, a)) in entry.params.iter().zip(&l.args).enumerate() {
            if !a.kind().matches(p) {
                return Err(bad(format!(
                    "parameter {i} of kernel `{}` in {} is {p:?} in the PTX, but the launch passes {a:?}",
                    l.kernel, self.name
                )));
            }
        }
        Ok(())
    }
}

/// A kernel source that lives beside its op (a `.cu` file of one of sinter-core's kernel
/// folders, `include_str!`-ed): what a kernel table row names as its source
/// ([`Source::User`](crate::ops::table::Source::User)). Made into a [`KernelSource`] once per
/// process, at the first launch.
pub struct UserFile {
    name: &'static str,
    text: &'static str,
    made: OnceLock<KernelSource>,
}

impl UserFile {
    /// `text` under the file name `name` (see [`KernelSource::new`]).
    pub const fn new(name: &'static str, text: &'static str) -> UserFile {
        UserFile {
            name,
            text,
            made: OnceLock::new(),
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The CUDA C++ text (without the prelude).
    pub fn text(&self) -> &'static str {
        self.text
    }

    /// The source, made at the first call (an error for a bad file name).
    pub fn source(&self) -> Result<&KernelSource> {
        if let Some(s) = self.made.get() {
            return Ok(s);
        }
        let s = KernelSource::new(self.name, self.text)?;
        Ok(self.made.get_or_init(|| s))
    }
}

impl std::fmt::Debug for UserFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "UserFile({})", self.name)
    }
}

/// One launch of a kernel of a [`KernelSource`].
#[derive(Clone, Debug, PartialEq)]
pub struct UserLaunch {
    pub kernel: String,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    /// Bytes of dynamic shared memory (`extern __shared__`); at most 48 KiB.
    pub shared_mem: u32,
    pub args: Vec<Arg>,
    /// The launch's traffic and kind of work for the cost model, as the op declares it from
    /// its shapes (None: `Launch::estimate`'s guess, an elementwise kernel).
    pub declared: Option<(OpClass, Traffic)>,
}

impl UserLaunch {
    /// The launch as the drivers take it (no built-in kernel file: the source is given beside).
    pub fn plan(&self) -> Launch {
        Launch {
            file: None,
            name: self.kernel.clone(),
            grid: self.grid,
            block: self.block,
            shared_mem: self.shared_mem,
            args: self.args.clone(),
            traffic: self.declared.map(|(_, t)| t),
        }
    }

    /// What the cost model records: the declared class and traffic, else the plan's estimate
    /// (an elementwise kernel).
    pub fn cost(&self) -> Call {
        match self.declared {
            None => self.plan().cost(),
            Some((class, t)) => Call {
                declared: true,
                ..Call::new(self.kernel.clone(), class, t)
            },
        }
    }
}
