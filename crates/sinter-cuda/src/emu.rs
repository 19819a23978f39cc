//! A CPU emulator for sinter's CUDA kernels, so tests can run every kernel without a GPU.
//!
//! What it is: each kernel file (`kernels/*.cu` with `kernels/common.cuh` prepended, exactly the
//! text NVRTC compiles) is built by the host C++ compiler (`g++ -std=c++20 -O1`) into a shared
//! library against `emu/cuda_emu.h`, which defines the CUDA qualifiers, built-in index variables,
//! `__syncthreads`, warp shuffles and votes, `__half`/`__nv_bfloat16` with round-to-nearest-even
//! conversions, math intrinsics, atomics, vector types and the `nvcuda::wmma` API. The file is
//! preprocessed once to find every `extern "C" __global__` kernel; a trampoline per kernel takes
//! `void** args` (like `cuLaunchKernel`) and a table records each parameter's size, checked
//! against the plan's [`Arg`]s before anything runs. Libraries are cached under the cache folder
//! by a hash of (emulator headers, kernel source, compiler, flags), written atomically.
//!
//! [`Emulator::run`] executes a [`Launch`] produced by an op's pure `plan_*` function on host
//! memory: build the plan with slices from [`DevSlice::from_raw`](crate::DevSlice::from_raw)
//! over host buffers and a small [`LaunchTarget`](crate::launch::LaunchTarget) (1 or 2 SMs, so
//! grid-stride loops iterate). Blocks run one after another; the threads of a block are fibers
//! scheduled cooperatively (each runs to its next barrier or warp operation), in forward or reverse
//! thread order ([`Order`]): a kernel that lacks a barrier usually gives different results in the
//! two orders.
//!
//! What it reports: divergent `__syncthreads`, warp operations whose mask names exited or
//! missing lanes, lanes of a warp at different warp operations, deadlocks, and WMMA loads/stores
//! whose pointer is not 32-byte aligned or whose leading dimension is not a multiple of 16 bytes —
//! all undefined on the hardware — as [`CudaError::Emulator`]. Shared memory (static and dynamic) is filled with
//! NaN bytes before every block, so reads of shared memory nobody wrote show up in results.
//!
//! What it cannot show: timing and occupancy; memory-model races beyond a missing barrier (there
//! is no real concurrency); shared-memory bank conflicts; the reduced precision of approximate
//! intrinsics (`__expf`, `rsqrtf`, `__fdividef` are exact here); FMA contraction differences
//! between nvcc and g++; out-of-bounds accesses (they touch host memory; the tests guard their
//! buffers with canaries, which catches writes but not reads); resource limits (registers,
//! occupancy); float-to-integer conversion of NaN or out-of-range values (C++ casts follow the
//! host, x86 gives INT_MIN; the GPU saturates and maps NaN to 0). Results are therefore compared with tolerances, not bit for bit, against the GPU.

use std::collections::HashMap;
use std::ffi::c_void;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, Step};
use crate::nvrtc::KernelFile;

/// The emulator's headers, written next to the cached libraries.
const HEADERS: [(&str, &str); 5] = [
    ("cuda_emu.h", include_str!("../emu/cuda_emu.h")),
    ("cuda_fp16.h", include_str!("../emu/cuda_fp16.h")),
    ("cuda_bf16.h", include_str!("../emu/cuda_bf16.h")),
    ("mma.h", include_str!("../emu/mma.h")),
    ("cuda_runtime.h", include_str!("../emu/cuda_runtime.h")),
];

/// Flags of every emulator build. -O1 keeps compile time low; strict aliasing is off because the
/// kernels reinterpret packs of halves as int4, which is fine on the GPU but not in ISO C++.
const FLAGS: [&str; 7] = [
    "-std=c++20",
    "-O1",
    "-fPIC",
    "-shared",
    "-fno-strict-aliasing",
    "-fvisibility=hidden",
    "-w",
];

/// The order in which the threads of a block run between synchronisation points.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Forward,
    Reverse,
}

/// The host C++ compiler: `$SINTER_EMU_CXX`, else the first of `g++`, `c++`, `clang++` that runs.
pub fn find_compiler() -> Option<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var_os("SINTER_EMU_CXX") {
        Some(c) if !c.is_empty() => vec![PathBuf::from(c)],
        _ => ["g++", "c++", "clang++"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    };
    candidates.into_iter().find(|c| {
        Command::new(c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// Where the emulated CUDA device caches its kernel libraries: `kernel-emu` beside the NVRTC
/// kernel cache (`$SINTER_CACHE_DIR`, `$XDG_CACHE_HOME/sinter` or `~/.cache/sinter`), or a
/// folder under the system's temporary directory when that cache is off.
pub fn default_cache_dir() -> PathBuf {
    match crate::nvrtc::default_cache_dir() {
        Some(d) => d.with_file_name("kernel-emu"),
        None => std::env::temp_dir().join("sinter-kernel-emu"),
    }
}

type LaunchFn = unsafe extern "C" fn(
    kernel: KernelFn,
    args: *mut *mut c_void,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shared_bytes: u32,
    reverse: i32,
    err: *mut u8,
    err_len: usize,
) -> i32;

/// One kernel file built for the host.
pub struct EmuLibrary {
    name: String,
    lib: libloading::Library,
    kernels: Vec<String>,
}

impl EmuLibrary {
    /// Names of the `extern "C" __global__` kernels found in the file.
    pub fn kernels(&self) -> &[String] {
        &self.kernels
    }
}

type KernelFn = unsafe extern "C" fn(*mut *mut c_void);

/// A kernel found in its library and checked against a launch plan ([`Emulator::resolve`]):
/// ready to run that plan (or one with the same name and argument sizes) any number of times.
pub struct ResolvedKernel {
    /// Keeps the library loaded while the function pointers are in use.
    lib: Arc<EmuLibrary>,
    kernel: KernelFn,
    launch: LaunchFn,
}

impl std::fmt::Debug for ResolvedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResolvedKernel")
            .field("library", &self.lib.name)
            .finish()
    }
}

impl ResolvedKernel {
    /// Run `l` (the plan this kernel was resolved for) with the threads of each block in `order`.
    ///
    /// # Safety
    /// As [`Emulator::run`].
    pub unsafe fn run(&self, l: &Launch, order: Order) -> Result<()> {
        let mut ptrs: Vec<*mut c_void> = l.args.iter().map(arg_ptr).collect();
        let mut err = vec![0u8; 1024];
        // SAFETY: argument count and sizes were checked by `resolve`; memory validity is the
        // caller's promise.
        let rc = unsafe {
            (self.launch)(
                self.kernel,
                ptrs.as_mut_ptr(),
                l.grid.0,
                l.grid.1,
                l.grid.2,
                l.block.0,
                l.block.1,
                l.block.2,
                l.shared_mem,
                (order == Order::Reverse) as i32,
                err.as_mut_ptr(),
                err.len(),
            )
        };
        if rc != 0 {
            let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
            return Err(emu_err(
                "launch",
                format!("{}: {}", l.name, String::from_utf8_lossy(&err[..end])),
            ));
        }
        Ok(())
    }
}

/// Builds kernel files for the host and runs launch plans on host memory.
pub struct Emulator {
    cache: PathBuf,
    cxx: PathBuf,
    cxx_version: String,
    libs: Mutex<HashMap<String, Arc<EmuLibrary>>>,
}

fn io_err(path: &Path, e: std::io::Error) -> CudaError {
    CudaError::Io {
        path: path.display().to_string(),
        source: e,
    }
}

fn emu_err(op: &'static str, msg: impl Into<String>) -> CudaError {
    CudaError::Emulator {
        op,
        msg: msg.into(),
    }
}

/// FNV-1a, 64 bit: stable across Rust versions (unlike `DefaultHasher`), enough for a cache key.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in p.iter().chain(&[0xffu8]) {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Rewrite `extern __shared__ T name[];` (dynamic shared memory) into a pointer to the
/// emulator's per-block buffer, because `__shared__` is `static` here and an `extern static`
/// array does not exist in C++.
pub fn rewrite_dynamic_shared(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    let mut rest = src;
    while let Some(at) = rest.find("extern __shared__") {
        out.push_str(&rest[..at]);
        let decl_start = at + "extern __shared__".len();
        let Some(semi) = rest[decl_start..].find(';') else {
            out.push_str(&rest[at..]);
            return out;
        };
        let mut decl = rest[decl_start..decl_start + semi].trim().to_string();
        // Drop __align__(n): the buffer is 128-byte aligned.
        if let Some(a) = decl.find("__align__(") {
            if let Some(close) = decl[a..].find(')') {
                decl.replace_range(a..a + close + 1, "");
            }
        }
        let decl = decl.trim().trim_end_matches("[]").trim_end();
        let name_start = decl
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let (ty, name) = (decl[..name_start].trim(), &decl[name_start..]);
        out.push_str(&format!(
            "{ty}* const {name} = reinterpret_cast<{ty}*>(::emu::dyn_shared())"
        ));
        rest = &rest[decl_start + semi..];
    }
    out.push_str(rest);
    out
}

/// One kernel signature found in preprocessed source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelDecl {
    pub name: String,
    /// Parameter types, as spelled after macro expansion.
    pub params: Vec<String>,
}

/// Find every `extern "C" __global__ void name(params)` in source preprocessed with `EMU_SCAN`
/// (where `__global__` expands to a marker).
pub fn scan_kernels(pre: &str) -> Result<Vec<KernelDecl>> {
    const MARK: &str = "__emu_global_marker";
    let mut out = Vec::new();
    let mut pos = 0;
    while let Some(off) = pre[pos..].find(MARK) {
        let at = pos + off;
        pos = at + MARK.len();
        if !pre[..at].trim_end().ends_with("extern \"C\"") {
            continue; // a template kernel cannot be launched by name
        }
        let rest = pre[pos..].trim_start();
        let Some(rest) = rest.strip_prefix("void") else {
            continue;
        };
        let Some(open) = rest.find('(') else { continue };
        let name = rest[..open].trim().to_string();
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(emu_err(
                "scan",
                format!(
                    "cannot parse the kernel declaration near `{}`",
                    &rest[..open.min(80)]
                ),
            ));
        }
        let body = &rest[open + 1..];
        let (mut depth, mut end) = (0i32, None);
        for (i, c) in body.char_indices() {
            match c {
                '(' | '<' | '[' => depth += 1,
                ')' if depth == 0 => {
                    end = Some(i);
                    break;
                }
                ')' | '>' | ']' => depth -= 1,
                _ => {}
            }
        }
        let Some(end) = end else {
            return Err(emu_err(
                "scan",
                format!("unclosed parameter list of {name}"),
            ));
        };
        let mut params = Vec::new();
        let (mut depth, mut start) = (0i32, 0usize);
        let list = &body[..end];
        let mut push = |p: &str| -> Result<()> {
            let p = p.trim();
            if p.is_empty() || p == "void" {
                return Ok(());
            }
            let name_start = p
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .map(|i| i + 1)
                .unwrap_or(0);
            let ty = p[..name_start].trim();
            if ty.is_empty() {
                return Err(emu_err(
                    "scan",
                    format!("parameter `{p}` of {name} has no name (name every kernel parameter)"),
                ));
            }
            params.push(ty.to_string());
            Ok(())
        };
        for (i, c) in list.char_indices() {
            match c {
                '(' | '<' | '[' => depth += 1,
                ')' | '>' | ']' => depth -= 1,
                ',' if depth == 0 => {
                    push(&list[start..i])?;
                    start = i + 1;
                }
                _ => {}
            }
        }
        push(&list[start..])?;
        out.push(KernelDecl { name, params });
    }
    Ok(out)
}

/// The C++ appended to a kernel file: one trampoline and one parameter-size table per kernel.
pub fn trampolines(decls: &[KernelDecl]) -> String {
    let mut s = String::from("\n// ---- emulator trampolines (generated) ----\n");
    for d in decls {
        let call: Vec<String> = d
            .params
            .iter()
            .enumerate()
            .map(|(i, t)| format!("*({t}*)a[{i}]"))
            .collect();
        let sizes: Vec<String> = std::iter::once(d.params.len().to_string())
            .chain(d.params.iter().map(|t| format!("(unsigned)sizeof({t})")))
            .collect();
        s.push_str(&format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) void emu_k_{n}(void** a) {{ (void)a; {n}({c}); }}\n\
             extern \"C\" __attribute__((visibility(\"default\"))) const unsigned emu_sz_{n}[] = {{{z}}};\n",
            n = d.name,
            c = call.join(", "),
            z = sizes.join(", ")
        ));
    }
    s
}

/// Byte size of an argument as the kernel receives it.
fn arg_size(a: &Arg) -> usize {
    match a {
        Arg::Ptr(_) | Arg::I64(_) | Arg::U64(_) => 8,
        Arg::I32(_) | Arg::F32(_) => 4,
        Arg::Strided(m) => std::mem::size_of_val(m),
        Arg::Bytes(b) => b.as_slice().len(),
    }
}

/// Address of an argument's value (what `cuLaunchKernel` expects in its `void**` array).
fn arg_ptr(a: &Arg) -> *mut c_void {
    match a {
        Arg::Ptr(v) | Arg::U64(v) => v as *const u64 as *mut c_void,
        Arg::I64(v) => v as *const i64 as *mut c_void,
        Arg::I32(v) => v as *const i32 as *mut c_void,
        Arg::F32(v) => v as *const f32 as *mut c_void,
        Arg::Strided(m) => m as *const _ as *mut c_void,
        Arg::Bytes(b) => b.as_slice().as_ptr() as *mut c_void,
    }
}

impl Emulator {
    /// An emulator caching its libraries under `cache_dir`. Fails when no C++ compiler runs.
    pub fn new(cache_dir: impl Into<PathBuf>) -> Result<Self> {
        let cxx = find_compiler().ok_or_else(|| {
            emu_err(
                "setup",
                "no C++ compiler found (tried $SINTER_EMU_CXX, g++, c++, clang++); install g++",
            )
        })?;
        let v = Command::new(&cxx)
            .arg("--version")
            .output()
            .map_err(|e| emu_err("setup", format!("{}: {e}", cxx.display())))?;
        Ok(Emulator {
            cache: cache_dir.into(),
            cxx,
            cxx_version: String::from_utf8_lossy(&v.stdout).into_owned(),
            libs: Mutex::new(HashMap::new()),
        })
    }

    /// The compiler in use.
    pub fn compiler(&self) -> &Path {
        &self.cxx
    }

    /// The library of `file`, compiled on first use (or loaded from the cache).
    pub fn library(&self, file: KernelFile) -> Result<Arc<EmuLibrary>> {
        let stem = file.file_name().trim_end_matches(".cu");
        self.library_from_source(stem, &file.program_source())
    }

    /// A library built from CUDA C text that is not (yet) a [`KernelFile`], e.g. a new kernel
    /// file under review, or a test kernel. `stem` names it (one source per stem and emulator);
    /// `program_source` is what NVRTC would compile (prepend [`crate::nvrtc::COMMON`] if the
    /// code uses it).
    pub fn library_from_source(&self, stem: &str, program_source: &str) -> Result<Arc<EmuLibrary>> {
        // Held during a compile: with 2 cores, building files one at a time is as fast as in
        // parallel, and it keeps test threads from compiling the same file twice.
        let mut libs = self.libs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = libs.get(stem) {
            return Ok(l.clone());
        }
        let lib = Arc::new(self.build(stem, program_source)?);
        libs.insert(stem.to_string(), lib.clone());
        Ok(lib)
    }

    fn build(&self, stem: &str, program_source: &str) -> Result<EmuLibrary> {
        let source = format!(
            "#include \"cuda_emu.h\"\n{}",
            rewrite_dynamic_shared(program_source)
        );
        let mut parts: Vec<&[u8]> = HEADERS.iter().map(|(_, t)| t.as_bytes()).collect();
        parts.push(source.as_bytes());
        parts.push(self.cxx_version.as_bytes());
        let flags = FLAGS.join(" ");
        parts.push(flags.as_bytes());
        let key = format!("{:016x}", fnv1a(&parts));
        let dir = self.cache.join(&key);
        let so = dir.join(format!("{stem}.so"));
        let list = dir.join(format!("{stem}.kernels"));
        if !(so.exists() && list.exists()) {
            self.compile(&dir, stem, &source, &so, &list)?;
        }
        let kernels: Vec<String> = std::fs::read_to_string(&list)
            .map_err(|e| io_err(&list, e))?
            .lines()
            .map(str::to_string)
            .collect();
        // SAFETY: a library we just built from our own sources; its initialisers only set up
        // the emulator's runtime.
        let lib = unsafe { libloading::Library::new(&so) }
            .map_err(|e| emu_err("load", format!("{}: {e}", so.display())))?;
        Ok(EmuLibrary {
            name: stem.to_string(),
            lib,
            kernels,
        })
    }

    fn compile(&self, dir: &Path, stem: &str, source: &str, so: &Path, list: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        // A private work folder, so concurrent builds never see each other's half-written files:
        // other processes', and other emulators' of this process (a test's and a device's).
        static BUILDS: AtomicU64 = AtomicU64::new(0);
        let n = BUILDS.fetch_add(1, Ordering::Relaxed);
        let work = dir.join(format!("tmp-{stem}-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&work).map_err(|e| io_err(&work, e))?;
        for (name, text) in HEADERS {
            let p = work.join(name);
            std::fs::write(&p, text).map_err(|e| io_err(&p, e))?;
        }
        let src = work.join(format!("{stem}.cpp"));
        std::fs::write(&src, source).map_err(|e| io_err(&src, e))?;
        let run = |args: &[&std::ffi::OsStr], what: &'static str| -> Result<Vec<u8>> {
            let o = Command::new(&self.cxx)
                .args(args)
                .output()
                .map_err(|e| emu_err(what, format!("{}: {e}", self.cxx.display())))?;
            if !o.status.success() {
                let log: String = String::from_utf8_lossy(&o.stderr)
                    .chars()
                    .take(20000)
                    .collect();
                return Err(emu_err(
                    what,
                    format!(
                        "{} could not build {stem}.cu for the kernel emulator:\n{log}",
                        self.cxx.display()
                    ),
                ));
            }
            Ok(o.stdout)
        };
        let inc = work.clone().into_os_string();
        let pre = run(
            &[
                "-std=c++20".as_ref(),
                "-E".as_ref(),
                "-P".as_ref(),
                "-DEMU_SCAN".as_ref(),
                "-I".as_ref(),
                inc.as_os_str(),
                src.as_os_str(),
            ],
            "preprocess",
        )?;
        let decls = scan_kernels(&String::from_utf8_lossy(&pre))?;
        let full = format!("{source}\n{}", trampolines(&decls));
        std::fs::write(&src, full).map_err(|e| io_err(&src, e))?;
        let tmp_so = work.join(format!("{stem}.so"));
        let mut args: Vec<&std::ffi::OsStr> = FLAGS.iter().map(|f| f.as_ref()).collect();
        args.extend([
            "-I".as_ref(),
            inc.as_os_str(),
            "-o".as_ref(),
            tmp_so.as_os_str(),
            src.as_os_str(),
        ]);
        run(&args, "compile")?;
        let tmp_list = work.join(format!("{stem}.kernels"));
        let names: Vec<&str> = decls.iter().map(|d| d.name.as_str()).collect();
        std::fs::write(&tmp_list, names.join("\n")).map_err(|e| io_err(&tmp_list, e))?;
        // The list is renamed last: its presence marks a complete entry.
        std::fs::rename(&tmp_so, so).map_err(|e| io_err(so, e))?;
        std::fs::rename(&tmp_list, list).map_err(|e| io_err(list, e))?;
        let _ = std::fs::remove_dir_all(&work);
        Ok(())
    }

    /// Run one planned launch on host memory, threads in forward order.
    ///
    /// # Safety
    /// Every pointer argument of `l` must address host memory that is valid for everything the
    /// kernel reads and writes (the plan's slices built over live host buffers).
    pub unsafe fn run(&self, l: &Launch) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.run_ordered(l, Order::Forward) }
    }

    /// Run one planned launch with the threads of each block in `order`.
    ///
    /// # Safety
    /// As [`Emulator::run`].
    pub unsafe fn run_ordered(&self, l: &Launch, order: Order) -> Result<()> {
        let k = self.resolve(l)?;
        // SAFETY: forwarded to the caller.
        unsafe { k.run(l, order) }
    }

    /// Run `l` from `lib` (its `file` field is ignored): for libraries made with
    /// [`Emulator::library_from_source`].
    ///
    /// # Safety
    /// As [`Emulator::run`].
    pub unsafe fn run_in(&self, lib: &Arc<EmuLibrary>, l: &Launch, order: Order) -> Result<()> {
        let k = Self::resolve_in(lib, l)?;
        // SAFETY: forwarded to the caller.
        unsafe { k.run(l, order) }
    }

    /// Find `l`'s kernel (compiling its file on first use) and check the plan against it:
    /// launch limits, kernel name, parameter count and sizes. Nothing runs.
    pub fn resolve(&self, l: &Launch) -> Result<ResolvedKernel> {
        let lib = self.library(l.built_in_file()?)?;
        Self::resolve_in(&lib, l)
    }

    /// [`Emulator::resolve`] in a given library (its `file` field is ignored).
    pub fn resolve_in(lib: &Arc<EmuLibrary>, l: &Launch) -> Result<ResolvedKernel> {
        l.validate()?;
        let not_found = |msg: String| CudaError::KernelNotFound {
            file: "(emulator library)",
            name: l.name.clone(),
            msg,
        };
        if !lib.kernels.contains(&l.name) {
            return Err(not_found(format!(
                "no such extern \"C\" __global__ kernel in the emulator build of {}",
                lib.name
            )));
        }
        // SAFETY: symbols generated by `trampolines` with exactly these types; the library
        // stays loaded while the returned value holds it.
        let (kernel, sizes, launch) = unsafe {
            let k: libloading::Symbol<KernelFn> = lib
                .lib
                .get(format!("emu_k_{}\0", l.name).as_bytes())
                .map_err(|e| not_found(e.to_string()))?;
            let sz: libloading::Symbol<*const u32> = lib
                .lib
                .get(format!("emu_sz_{}\0", l.name).as_bytes())
                .map_err(|e| not_found(e.to_string()))?;
            let run: libloading::Symbol<LaunchFn> = lib
                .lib
                .get(b"emu_launch\0")
                .map_err(|e| emu_err("load", e.to_string()))?;
            let sz: *const u32 = *sz;
            let n = *sz as usize;
            (*k, std::slice::from_raw_parts(sz.add(1), n).to_vec(), *run)
        };
        if sizes.len() != l.args.len() {
            return Err(emu_err(
                "launch",
                format!(
                    "{} takes {} parameters but the plan passes {}",
                    l.name,
                    sizes.len(),
                    l.args.len()
                ),
            ));
        }
        for (i, (a, &s)) in l.args.iter().zip(&sizes).enumerate() {
            if arg_size(a) != s as usize {
                return Err(emu_err(
                    "launch",
                    format!(
                        "{} parameter {i} is {s} bytes but the plan passes {a:?} ({} bytes)",
                        l.name,
                        arg_size(a)
                    ),
                ));
            }
        }
        Ok(ResolvedKernel {
            lib: lib.clone(),
            kernel,
            launch,
        })
    }

    /// Run the steps of an op in order (memsets and copies act on host memory).
    ///
    /// # Safety
    /// As [`Emulator::run`], for every step.
    pub unsafe fn run_steps(&self, steps: &[Step], order: Order) -> Result<()> {
        for s in steps {
            match s {
                // SAFETY: the caller promises each step addresses valid host memory.
                Step::Kernel(l) => unsafe { self.run_ordered(l, order)? },
                Step::Zero { ptr, bytes } => unsafe {
                    std::ptr::write_bytes(*ptr as *mut u8, 0, *bytes)
                },
                Step::Copy { src, dst, bytes } => unsafe {
                    std::ptr::copy(*src as *const u8, *dst as *mut u8, *bytes)
                },
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_expanded_kernel_declarations() {
        let pre = "template <typename T> __emu_global_marker void t(T* x) {}\n\
                   extern \"C\" __emu_global_marker void add_f32(const float* a, const float* b, float* out, long long n) { }\n\
                   extern \"C\" __emu_global_marker void k2(StridedMeta m, Foo<int, 3> f) {}\n\
                   extern \"C\" __emu_global_marker void k3() {}";
        let d = scan_kernels(pre).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d[0].name, "add_f32");
        assert_eq!(
            d[0].params,
            vec!["const float*", "const float*", "float*", "long long"]
        );
        assert_eq!(d[1].params, vec!["StridedMeta", "Foo<int, 3>"]);
        assert!(d[2].params.is_empty());
        let t = trampolines(&d);
        assert!(t.contains("add_f32(*(const float**)a[0], *(const float**)a[1], *(float**)a[2], *(long long*)a[3])"));
        assert!(t.contains("emu_sz_k3[] = {0}"));
        assert!(scan_kernels("extern \"C\" __emu_global_marker void bad(float) {}").is_err());
    }

    #[test]
    fn rewrites_dynamic_shared_memory() {
        let s = "void k() { extern __shared__ __align__(16) float smem[]; smem[0] = 1; }";
        assert_eq!(
            rewrite_dynamic_shared(s),
            "void k() { float* const smem = reinterpret_cast<float*>(::emu::dyn_shared()); smem[0] = 1; }"
        );
        assert_eq!(rewrite_dynamic_shared("no shared"), "no shared");
    }
}
