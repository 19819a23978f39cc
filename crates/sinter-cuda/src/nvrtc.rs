//! NVRTC kernel compilation with an on-disk cache.
//!
//! Kernels are CUDA C files in `kernels/*.cu`, embedded with `include_str!`. Each is compiled as
//! its own NVRTC program (with `kernels/common.cuh` prepended) at first use, for the device's own
//! architecture (`sm_XY`), to a CUBIN that the driver loads without a JIT step (PTX for tests and
//! on request). Results are cached at `$SINTER_CACHE_DIR/kernels/` (default
//! `~/.cache/sinter/kernels/`), keyed by a hash of (source, arch, output kind, options, driver
//! version, NVRTC version), and written atomically (temporary file + rename), so concurrent
//! processes never see a torn file. `SINTER_NO_KERNEL_CACHE=1` disables the disk cache.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nr, sys as ns};

use crate::error::{guard, CudaError, Result};

/// The prelude prepended to every kernel file.
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// One kernel source file (one concern per file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelFile {
    Unary,
    Binary,
    Copy,
    Reduce,
    Embedding,
    Conv,
    Dropout,
    Int,
    Bool,
}

impl KernelFile {
    /// Every kernel file.
    pub const ALL: [KernelFile; 9] = [
        KernelFile::Unary,
        KernelFile::Binary,
        KernelFile::Copy,
        KernelFile::Reduce,
        KernelFile::Embedding,
        KernelFile::Conv,
        KernelFile::Dropout,
        KernelFile::Int,
        KernelFile::Bool,
    ];

    /// File name under `kernels/`.
    pub const fn file_name(self) -> &'static str {
        match self {
            KernelFile::Unary => "unary.cu",
            KernelFile::Binary => "binary.cu",
            KernelFile::Copy => "copy.cu",
            KernelFile::Reduce => "reduce.cu",
            KernelFile::Embedding => "embedding.cu",
            KernelFile::Conv => "conv.cu",
            KernelFile::Dropout => "dropout.cu",
            KernelFile::Int => "int.cu",
            KernelFile::Bool => "bool.cu",
        }
    }

    /// The file's own text.
    pub const fn source(self) -> &'static str {
        match self {
            KernelFile::Unary => include_str!("../kernels/unary.cu"),
            KernelFile::Binary => include_str!("../kernels/binary.cu"),
            KernelFile::Copy => include_str!("../kernels/copy.cu"),
            KernelFile::Reduce => include_str!("../kernels/reduce.cu"),
            KernelFile::Embedding => include_str!("../kernels/embedding.cu"),
            KernelFile::Conv => include_str!("../kernels/conv.cu"),
            KernelFile::Dropout => include_str!("../kernels/dropout.cu"),
            KernelFile::Int => include_str!("../kernels/int.cu"),
            KernelFile::Bool => include_str!("../kernels/bool.cu"),
        }
    }

    /// What NVRTC compiles: the prelude, then the file with `#line` so errors point into it.
    pub fn program_source(self) -> String {
        format!(
            "{COMMON}\n#line 1 \"{}\"\n{}",
            self.file_name(),
            self.source()
        )
    }
}

/// What NVRTC should produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Output {
    /// PTX text (portable to newer GPUs through the driver JIT).
    Ptx,
    /// Machine code for exactly the requested `sm_XY` (no JIT at load).
    Cubin,
}

impl Output {
    fn ext(self) -> &'static str {
        match self {
            Output::Ptx => "ptx",
            Output::Cubin => "cubin",
        }
    }
}

/// True when `libnvrtc` can be loaded (checked without risking cudarc's loader panic).
pub fn nvrtc_present() -> bool {
    crate::libs::libraries().nvrtc
}

/// Check an architecture name: `sm_XY` or `sm_XYZ` with an optional `a`/`f` suffix.
pub fn validate_arch(arch: &str) -> Result<()> {
    let rest = arch.strip_prefix("sm_").unwrap_or("");
    let digits = rest.trim_end_matches(['a', 'f']);
    if digits.len() >= 2 && digits.len() <= 3 && digits.chars().all(|c| c.is_ascii_digit()) {
        Ok(())
    } else {
        Err(CudaError::invalid(
            "nvrtc",
            format!("architecture `{arch}` is not of the form sm_XY"),
        ))
    }
}

/// The NVRTC options sinter compiles with.
pub fn compile_options(arch: &str, include_dir: &Path) -> Vec<String> {
    vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        format!("--include-path={}", include_dir.display()),
        // Precise division/sqrt and no flush-to-zero: the kernels are memory-bound, so exact math
        // is free and keeps results comparable with the CPU backend.
        "--fmad=true".into(),
    ]
}

/// Folders that may hold `cuda_fp16.h`, in search order: `$SINTER_CUDA_INCLUDE`,
/// `$CUDA_HOME/include`, `$CUDA_PATH/include`, `/usr/local/cuda/include`, `/usr/local/cuda-*/include`
/// (newest first), pip's `nvidia/cu13/include` (and `nvidia/cuda_runtime/include`) under the usual
/// site-packages folders, and the cache of `.ci/nvrtc-setup`.
pub fn include_candidates() -> Vec<PathBuf> {
    let mut c = Vec::new();
    for var in ["SINTER_CUDA_INCLUDE"] {
        if let Some(v) = std::env::var_os(var) {
            c.push(PathBuf::from(v));
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(v) = std::env::var_os(var) {
            c.push(PathBuf::from(v).join("include"));
        }
    }
    c.push(PathBuf::from("/usr/local/cuda/include"));
    let mut versioned: Vec<PathBuf> = std::fs::read_dir("/usr/local")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("cuda-"))
                })
                .map(|p| p.join("include"))
                .collect()
        })
        .unwrap_or_default();
    versioned.sort();
    versioned.reverse();
    c.extend(versioned);
    for root in ["/usr/lib", "/usr/local/lib", "/opt/conda/lib"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            let mut pys: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("python3"))
                })
                .collect();
            pys.sort();
            pys.reverse();
            for py in pys {
                for sp in ["site-packages", "dist-packages"] {
                    c.push(py.join(sp).join("nvidia/cu13/include"));
                    c.push(py.join(sp).join("nvidia/cuda_runtime/include"));
                }
            }
        }
    }
    if let Some(home) = std::env::var_os("HOME") {
        let base = PathBuf::from(home).join(".cache/sinter-nvrtc");
        if let Ok(rd) = std::fs::read_dir(&base) {
            let mut dirs: Vec<PathBuf> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.path().join("nvidia/cu13/include"))
                .collect();
            dirs.sort();
            dirs.reverse();
            c.extend(dirs);
        }
    }
    c
}

/// The first candidate folder holding `cuda_fp16.h` and `cuda_bf16.h`.
pub fn find_cuda_include() -> Result<PathBuf> {
    let cands = include_candidates();
    cands
        .iter()
        .find(|p| p.join("cuda_fp16.h").is_file() && p.join("cuda_bf16.h").is_file())
        .cloned()
        .ok_or_else(|| CudaError::HeadersNotFound {
            searched: cands
                .iter()
                .take(6)
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
}

struct Program(ns::nvrtcProgram);
impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram and destroyed only here; errors are ignored.
        let _ = unsafe { nr::destroy_program(self.0) };
    }
}

fn c_chars_to_string(v: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = v
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Compile one source string with NVRTC. `name` appears in error messages.
pub fn compile_source(
    name: &str,
    src: &str,
    options: &[String],
    output: Output,
) -> Result<Vec<u8>> {
    if !nvrtc_present() {
        return Err(CudaError::LibraryNotFound {
            lib: "libnvrtc.so.13",
            hint:
                "add the folder holding libnvrtc.so.13 to LD_LIBRARY_PATH, or run .ci/nvrtc-setup"
                    .into(),
        });
    }
    let arch = options
        .iter()
        .find_map(|o| o.strip_prefix("--gpu-architecture="))
        .unwrap_or("default")
        .to_string();
    let src_c =
        CString::new(src).map_err(|_| CudaError::invalid("nvrtc", "source contains a NUL byte"))?;
    let name_c =
        CString::new(name).map_err(|_| CudaError::invalid("nvrtc", "name contains a NUL byte"))?;
    guard(|| {
        let prog =
            Program(
                nr::create_program(&src_c, Some(&name_c)).map_err(|e| CudaError::Nvrtc {
                    op: "nvrtcCreateProgram",
                    msg: format!("{e:?}"),
                })?,
            );
        // SAFETY: `prog` is a live program; options are plain strings.
        if let Err(e) = unsafe { nr::compile_program(prog.0, options) } {
            // SAFETY: as above.
            let log = unsafe { nr::get_program_log(prog.0) }
                .map(|l| c_chars_to_string(&l))
                .unwrap_or_default();
            return Err(CudaError::Compile {
                file: name.to_string(),
                arch,
                log: format!("{e:?}\n{log}"),
            });
        }
        match output {
            Output::Ptx => {
                // SAFETY: compiled program.
                let ptx = unsafe { nr::get_ptx(prog.0) }.map_err(|e| CudaError::Nvrtc {
                    op: "nvrtcGetPTX",
                    msg: format!("{e:?}"),
                })?;
                Ok(c_chars_to_string(&ptx).into_bytes())
            }
            Output::Cubin => {
                let mut size = 0usize;
                // SAFETY: compiled program; NVRTC writes `size` bytes into the buffer.
                unsafe { ns::nvrtcGetCUBINSize(prog.0, &mut size) }
                    .result()
                    .map_err(|e| CudaError::Nvrtc {
                        op: "nvrtcGetCUBINSize",
                        msg: format!("{e:?}"),
                    })?;
                let mut buf = vec![0u8; size];
                unsafe { ns::nvrtcGetCUBIN(prog.0, buf.as_mut_ptr().cast()) }
                    .result()
                    .map_err(|e| CudaError::Nvrtc {
                        op: "nvrtcGetCUBIN",
                        msg: format!("{e:?}"),
                    })?;
                Ok(buf)
            }
        }
    })
}

/// Compile one kernel file for `arch` (no cache).
pub fn compile_file(file: KernelFile, arch: &str, output: Output) -> Result<Vec<u8>> {
    validate_arch(arch)?;
    let inc = find_cuda_include()?;
    compile_source(
        file.file_name(),
        &file.program_source(),
        &compile_options(arch, &inc),
        output,
    )
}

/// Compile every kernel file to PTX for `arch`; returns (file name, PTX length). Files compile in
/// parallel. Used by the CI test; does not touch the disk cache.
pub fn compile_all(arch: &str) -> Result<Vec<(String, usize)>> {
    Ok(compile_all_ptx(arch)?
        .into_iter()
        .map(|(f, ptx)| (f.file_name().to_string(), ptx.len()))
        .collect())
}

/// Like [`compile_all`] but returns the PTX text of each file.
pub fn compile_all_ptx(arch: &str) -> Result<Vec<(KernelFile, String)>> {
    validate_arch(arch)?;
    let inc = find_cuda_include()?;
    let opts = compile_options(arch, &inc);
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(1, 8);
    let files = KernelFile::ALL;
    let results: Vec<Result<(KernelFile, String)>> = std::thread::scope(|s| {
        let chunks: Vec<Vec<KernelFile>> = (0..threads)
            .map(|t| files.iter().copied().skip(t).step_by(threads).collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                let opts = &opts;
                s.spawn(move || {
                    chunk
                        .into_iter()
                        .map(|f| {
                            let bytes = compile_source(
                                f.file_name(),
                                &f.program_source(),
                                opts,
                                Output::Ptx,
                            )?;
                            Ok((f, String::from_utf8_lossy(&bytes).into_owned()))
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec![Err(CudaError::Panicked("compile thread".into()))])
            })
            .collect()
    });
    let mut out = results.into_iter().collect::<Result<Vec<_>>>()?;
    out.sort_by_key(|(f, _)| *f);
    Ok(out)
}

// ------------------------------------------------------------------------------------- cache

/// 128-bit FNV-1a: stable across Rust versions and platforms (unlike `DefaultHasher`), which is
/// what an on-disk cache key needs. Not cryptographic; 128 bits make accidental collisions moot.
#[derive(Clone, Debug)]
pub struct Fnv128(u128);

impl Default for Fnv128 {
    fn default() -> Self {
        Fnv128(0x6c62272e07bb014262b821756295c58d)
    }
}

impl Fnv128 {
    const PRIME: u128 = 0x0000000001000000000000000000013B;
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u128;
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }
    /// Hash a field with its length first, so ("ab","c") and ("a","bc") differ.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }
    pub fn finish(&self) -> u128 {
        self.0
    }
}

/// Everything the compiled bytes depend on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey<'a> {
    pub source: &'a str,
    pub arch: &'a str,
    pub output: Output,
    pub options: &'a [String],
    pub driver_version: (u32, u32),
    pub nvrtc_version: (u32, u32),
}

impl CacheKey<'_> {
    /// 32 hex digits.
    pub fn hash_hex(&self) -> String {
        let mut h = Fnv128::default();
        h.field(b"sinter-kernel-cache-v1");
        h.field(env!("CARGO_PKG_VERSION").as_bytes());
        h.field(self.source.as_bytes());
        h.field(self.arch.as_bytes());
        h.field(self.output.ext().as_bytes());
        for o in self.options {
            // The include path is where the headers are, not what they say: leave it out so a
            // moved toolkit does not invalidate the cache (the NVRTC version covers the headers).
            if !o.starts_with("--include-path=") {
                h.field(o.as_bytes());
            }
        }
        h.field(&self.driver_version.0.to_le_bytes());
        h.field(&self.driver_version.1.to_le_bytes());
        h.field(&self.nvrtc_version.0.to_le_bytes());
        h.field(&self.nvrtc_version.1.to_le_bytes());
        format!("{:032x}", h.finish())
    }
}

/// Default cache folder: `$SINTER_CACHE_DIR/kernels`, else `$XDG_CACHE_HOME/sinter/kernels`, else
/// `~/.cache/sinter/kernels`. None when disabled (`SINTER_NO_KERNEL_CACHE=1`) or no home is known.
pub fn default_cache_dir() -> Option<PathBuf> {
    if std::env::var("SINTER_NO_KERNEL_CACHE").is_ok_and(|v| v == "1") {
        return None;
    }
    if let Some(d) = std::env::var_os("SINTER_CACHE_DIR") {
        return Some(PathBuf::from(d).join("kernels"));
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(d).join("sinter/kernels"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sinter/kernels"))
}

/// The on-disk cache of compiled kernels.
#[derive(Clone, Debug)]
pub struct KernelCache {
    dir: Option<PathBuf>,
}

impl KernelCache {
    /// A cache in `dir` (None = no disk cache).
    pub fn new(dir: Option<PathBuf>) -> Self {
        KernelCache { dir }
    }

    /// The cache at [`default_cache_dir`].
    pub fn from_env() -> Self {
        Self::new(default_cache_dir())
    }

    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// File name of an entry: `<stem>-<arch>-<hash>.<ext>`.
    pub fn path_for(&self, file: &str, key: &CacheKey<'_>) -> Option<PathBuf> {
        let stem = file.trim_end_matches(".cu");
        self.dir.as_ref().map(|d| {
            d.join(format!(
                "{stem}-{}-{}.{}",
                key.arch,
                key.hash_hex(),
                key.output.ext()
            ))
        })
    }

    /// Read an entry; a missing, empty or malformed file is a miss (never an error).
    pub fn load(&self, file: &str, key: &CacheKey<'_>) -> Option<Vec<u8>> {
        let path = self.path_for(file, key)?;
        let bytes = std::fs::read(path).ok()?;
        looks_valid(&bytes, key.output).then_some(bytes)
    }

    /// Write an entry atomically: a uniquely named temporary file in the same folder, then rename.
    pub fn store(&self, file: &str, key: &CacheKey<'_>, bytes: &[u8]) -> Result<()> {
        let Some(path) = self.path_for(file, key) else {
            return Ok(());
        };
        let dir = path.parent().expect("cache path has a parent");
        let io = |e: std::io::Error, p: &Path| CudaError::Io {
            path: p.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(|e| io(e, dir))?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let tmp = dir.join(format!(
            ".{}.{}.{}.tmp",
            path.file_name().and_then(|n| n.to_str()).unwrap_or("k"),
            std::process::id(),
            nanos
        ));
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            io(e, &path)
        })
    }
}

fn looks_valid(bytes: &[u8], output: Output) -> bool {
    match output {
        Output::Cubin => bytes.len() > 16 && bytes.starts_with(b"\x7fELF"),
        Output::Ptx => {
            bytes.len() > 16 && std::str::from_utf8(bytes).is_ok_and(|s| s.contains(".entry"))
        }
    }
}

/// Compile `file` for `arch`, going through `cache`. Returns the bytes and whether it was a hit.
pub fn load_or_compile(
    cache: &KernelCache,
    file: KernelFile,
    arch: &str,
    output: Output,
    driver_version: (u32, u32),
) -> Result<(Vec<u8>, bool)> {
    load_or_compile_source(
        cache,
        file.file_name(),
        &file.program_source(),
        arch,
        output,
        driver_version,
    )
}

/// [`load_or_compile`] for any program text (`name` names it in errors and in the cache):
/// the kernel files, and the custom kernels of [`crate::user_kernel`].
pub fn load_or_compile_source(
    cache: &KernelCache,
    name: &str,
    src: &str,
    arch: &str,
    output: Output,
    driver_version: (u32, u32),
) -> Result<(Vec<u8>, bool)> {
    validate_arch(arch)?;
    let inc = find_cuda_include()?;
    let opts = compile_options(arch, &inc);
    let nvrtc_version = crate::libs::nvrtc_version()?;
    let key = CacheKey {
        source: src,
        arch,
        output,
        options: &opts,
        driver_version,
        nvrtc_version,
    };
    if let Some(bytes) = cache.load(name, &key) {
        return Ok((bytes, true));
    }
    let bytes = compile_source(name, src, &opts, output)?;
    // A failed cache write costs the next process a recompile, nothing more.
    let _ = cache.store(name, &key, &bytes);
    Ok((bytes, false))
}

// ------------------------------------------------------------------------------- PTX parsing

/// One parameter of a PTX entry, as the driver will read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PtxParam {
    /// `.u64`/`.s64`/`.b64` — pointers and 64-bit integers.
    B64,
    /// `.u32`/`.s32`/`.b32`.
    B32,
    /// `.f32`.
    F32,
    /// `.align A .b8 name[size]` — a struct passed by value.
    Bytes(usize),
    /// Anything else (the raw type text).
    Other(String),
}

/// A kernel entry point found in PTX.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxEntry {
    pub name: String,
    pub params: Vec<PtxParam>,
}

/// Parse the `.entry` declarations (name and parameter types) of a PTX module.
pub fn ptx_entries(ptx: &str) -> Vec<PtxEntry> {
    let mut out = Vec::new();
    let mut rest = ptx;
    while let Some(pos) = rest.find(".entry ") {
        rest = &rest[pos + ".entry ".len()..];
        let name_end = rest
            .find(|c: char| c == '(' || c.is_whitespace())
            .unwrap_or(rest.len());
        let name = rest[..name_end].to_string();
        let open = rest.find('(');
        let close = rest.find(')');
        let mut params = Vec::new();
        if let (Some(o), Some(c)) = (open, close) {
            if o < c {
                for decl in rest[o + 1..c].split(',') {
                    let toks: Vec<&str> = decl.split_whitespace().collect();
                    if toks.is_empty() {
                        continue;
                    }
                    let p = if toks.contains(&".b8") {
                        let last = toks.last().copied().unwrap_or("");
                        let size = last
                            .split('[')
                            .nth(1)
                            .and_then(|s| s.trim_end_matches(']').parse().ok())
                            .unwrap_or(0);
                        PtxParam::Bytes(size)
                    } else if toks.iter().any(|t| matches!(*t, ".u64" | ".s64" | ".b64")) {
                        PtxParam::B64
                    } else if toks.iter().any(|t| matches!(*t, ".u32" | ".s32" | ".b32")) {
                        PtxParam::B32
                    } else if toks.contains(&".f32") {
                        PtxParam::F32
                    } else {
                        PtxParam::Other(toks.join(" "))
                    };
                    params.push(p);
                }
            }
        }
        out.push(PtxEntry { name, params });
    }
    out
}

/// The `.target` line of a PTX module (e.g. `sm_90`).
pub fn ptx_target(ptx: &str) -> Option<&str> {
    ptx.lines()
        .find_map(|l| l.trim().strip_prefix(".target "))
        .map(|t| t.split([',', ' ']).next().unwrap_or(t))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key<'a>(src: &'a str, arch: &'a str, opts: &'a [String]) -> CacheKey<'a> {
        CacheKey {
            source: src,
            arch,
            output: Output::Cubin,
            options: opts,
            driver_version: (13, 0),
            nvrtc_version: (13, 0),
        }
    }

    #[test]
    fn cache_key_depends_on_every_input() {
        let opts = vec![
            "--gpu-architecture=sm_90".to_string(),
            "--std=c++17".to_string(),
        ];
        let base = key("src", "sm_90", &opts);
        let h = base.hash_hex();
        assert_eq!(h.len(), 32);
        assert_eq!(h, key("src", "sm_90", &opts).hash_hex(), "deterministic");
        assert_ne!(h, key("src2", "sm_90", &opts).hash_hex());
        assert_ne!(h, key("src", "sm_80", &opts).hash_hex());
        assert_ne!(
            h,
            CacheKey {
                output: Output::Ptx,
                ..base.clone()
            }
            .hash_hex()
        );
        assert_ne!(
            h,
            CacheKey {
                driver_version: (13, 1),
                ..base.clone()
            }
            .hash_hex()
        );
        assert_ne!(
            h,
            CacheKey {
                nvrtc_version: (12, 9),
                ..base.clone()
            }
            .hash_hex()
        );
        let opts2 = vec![
            "--gpu-architecture=sm_90".to_string(),
            "--std=c++20".to_string(),
        ];
        assert_ne!(h, key("src", "sm_90", &opts2).hash_hex());
        // The include path is not part of the key.
        let mut opts3 = opts.clone();
        opts3.push("--include-path=/somewhere".into());
        assert_eq!(h, key("src", "sm_90", &opts3).hash_hex());
    }

    #[test]
    fn fnv_fields_are_length_prefixed() {
        let mut a = Fnv128::default();
        a.field(b"ab");
        a.field(b"c");
        let mut b = Fnv128::default();
        b.field(b"a");
        b.field(b"bc");
        assert_ne!(a.finish(), b.finish());
        // Known FNV-1a-128 vector: empty input is the offset basis.
        assert_eq!(
            Fnv128::default().finish(),
            0x6c62272e07bb014262b821756295c58d
        );
    }

    #[test]
    fn cache_store_load_roundtrip_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let cache = KernelCache::new(Some(dir.path().join("k")));
        let opts = vec![];
        let k = key("x", "sm_90", &opts);
        assert!(cache.load("unary.cu", &k).is_none());
        let mut elf = b"\x7fELF".to_vec();
        elf.extend_from_slice(&[7u8; 64]);
        cache.store("unary.cu", &k, &elf).unwrap();
        assert_eq!(cache.load("unary.cu", &k).unwrap(), elf);
        let path = cache.path_for("unary.cu", &k).unwrap();
        assert!(path
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .starts_with("unary-sm_90-"));
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A truncated / corrupt entry is a miss, not an error.
        std::fs::write(&path, b"garbage").unwrap();
        assert!(cache.load("unary.cu", &k).is_none());
        // Disabled cache: store is a no-op, load misses.
        let off = KernelCache::new(None);
        off.store("unary.cu", &k, &elf).unwrap();
        assert!(off.load("unary.cu", &k).is_none());
    }

    #[test]
    fn arch_validation() {
        assert!(validate_arch("sm_80").is_ok());
        assert!(validate_arch("sm_90a").is_ok());
        assert!(validate_arch("sm_100").is_ok());
        assert!(validate_arch("compute_90").is_err());
        assert!(validate_arch("sm_9").is_err());
        assert!(validate_arch("sm_90; rm").is_err());
    }

    #[test]
    fn ptx_parsing() {
        let ptx = "//\n.version 9.0\n.target sm_90\n.address_size 64\n\
            .visible .entry add_f32(\n\t.param .u64 .ptr .align 1 add_f32_param_0,\n\t.param .u64 add_f32_param_1,\n\
            \t.param .f32 add_f32_param_2,\n\t.param .u32 add_f32_param_3,\n\t.param .align 8 .b8 add_f32_param_4[200]\n)\n{\n}\n\
            .visible .entry k2()\n{\n}\n";
        let e = ptx_entries(ptx);
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].name, "add_f32");
        assert_eq!(
            e[0].params,
            vec![
                PtxParam::B64,
                PtxParam::B64,
                PtxParam::F32,
                PtxParam::B32,
                PtxParam::Bytes(200)
            ]
        );
        assert_eq!(e[1].name, "k2");
        assert!(e[1].params.is_empty());
        assert_eq!(ptx_target(ptx), Some("sm_90"));
    }

    #[test]
    fn every_file_is_embedded_and_documented() {
        for f in KernelFile::ALL {
            let s = f.source();
            assert!(
                s.starts_with("// "),
                "{} must open with a comment",
                f.file_name()
            );
            assert!(
                s.contains("fast"),
                "{} must say why it is fast",
                f.file_name()
            );
            assert!(s.contains("extern \"C\""), "{}", f.file_name());
            assert!(f
                .program_source()
                .contains(&format!("#line 1 \"{}\"", f.file_name())));
        }
    }
}
