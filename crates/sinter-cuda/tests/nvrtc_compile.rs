//! Compiles every kernel file with NVRTC for sm_80 and sm_90 — no GPU needed — and checks every
//! kernel the Rust wrappers launch against the compiled PTX: the entry exists, and its parameter
//! list has the same count and ABI classes (64-bit, 32-bit int, f32, by-value struct of the same
//! size) as the argument list the wrapper builds. Also checks that no compiled kernel is left
//! without a wrapper. This is the only verification the kernels get on a machine without a GPU.
//!
//! Without NVRTC it prints `skipped: NVRTC not found (run .ci/nvrtc-setup)` and passes, unless
//! `SINTER_REQUIRE_NVRTC=1`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use sinter_cuda::launch::LaunchTarget;
use sinter_cuda::nvrtc::{self, KernelFile, Output};

fn required() -> bool {
    std::env::var("SINTER_REQUIRE_NVRTC").is_ok_and(|v| v == "1")
}

/// Ok(true) when NVRTC and the headers are usable; Ok(false) = skip.
fn nvrtc_ready() -> bool {
    if !nvrtc::nvrtc_present() {
        assert!(!required(), "SINTER_REQUIRE_NVRTC=1 but libnvrtc could not be loaded: run .ci/nvrtc-setup and export its LD_LIBRARY_PATH");
        eprintln!("skipped: NVRTC not found (run .ci/nvrtc-setup)");
        return false;
    }
    if let Err(e) = nvrtc::find_cuda_include() {
        assert!(!required(), "SINTER_REQUIRE_NVRTC=1 but {e}");
        eprintln!("skipped: CUDA headers not found (run .ci/nvrtc-setup): {e}");
        return false;
    }
    true
}

#[test]
fn every_kernel_file_compiles_for_sm80_and_sm90() {
    if !nvrtc_ready() {
        return;
    }
    eprintln!(
        "NVRTC {:?}, headers at {}",
        sinter_cuda::runtime::nvrtc_version().unwrap(),
        nvrtc::find_cuda_include().unwrap().display()
    );

    // sm_80 through the public compile_all (names and PTX sizes).
    let t0 = Instant::now();
    let all = nvrtc::compile_all("sm_80").unwrap_or_else(|e| panic!("{e}"));
    eprintln!("sm_80: {} files in {:.1?}", all.len(), t0.elapsed());
    let names: BTreeSet<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    for f in KernelFile::ALL {
        assert!(names.contains(f.file_name()), "{} missing", f.file_name());
    }
    for (name, len) in &all {
        assert!(*len > 1000, "{name}: suspiciously small PTX ({len} bytes)");
    }

    // sm_90 with the PTX text, for the signature check.
    let t0 = Instant::now();
    let ptx = nvrtc::compile_all_ptx("sm_90").unwrap_or_else(|e| panic!("{e}"));
    eprintln!("sm_90: {} files in {:.1?}", ptx.len(), t0.elapsed());
    let mut entries: BTreeMap<(KernelFile, String), Vec<nvrtc::PtxParam>> = BTreeMap::new();
    for (file, text) in &ptx {
        assert_eq!(
            nvrtc::ptx_target(text),
            Some("sm_90"),
            "{}",
            file.file_name()
        );
        let es = nvrtc::ptx_entries(text);
        assert!(!es.is_empty(), "{}: no kernels", file.file_name());
        for e in es {
            entries.insert((*file, e.name), e.params);
        }
    }

    let plans = sinter_cuda::ops::sample_plans(&LaunchTarget { sm_count: 132 });
    let mut covered = BTreeSet::new();
    let mut problems = Vec::new();
    for p in &plans {
        let file = p.built_in_file().unwrap();
        match entries.get(&(file, p.name.clone())) {
            None => problems.push(format!(
                "{}: kernel `{}` is launched but not compiled",
                file.file_name(),
                p.name
            )),
            Some(params) => {
                covered.insert((file, p.name.clone()));
                if params.len() != p.args.len() {
                    problems.push(format!(
                        "{}: {} params in PTX, {} args from Rust",
                        p.name,
                        params.len(),
                        p.args.len()
                    ));
                    continue;
                }
                for (i, (a, q)) in p.args.iter().zip(params).enumerate() {
                    if !a.kind().matches(q) {
                        problems.push(format!(
                            "{} arg {i}: Rust {:?} vs PTX {:?}",
                            p.name,
                            a.kind(),
                            q
                        ));
                    }
                }
            }
        }
    }
    for key in entries.keys() {
        if !covered.contains(key) {
            problems.push(format!(
                "{}: kernel `{}` has no Rust wrapper plan",
                key.0.file_name(),
                key.1
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    eprintln!(
        "{} kernels checked against {} launch plans",
        entries.len(),
        plans.len()
    );
}

#[test]
fn cubin_output_and_disk_cache() {
    if !nvrtc_ready() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cache = nvrtc::KernelCache::new(Some(dir.path().to_path_buf()));
    let (bytes, hit) =
        nvrtc::load_or_compile(&cache, KernelFile::Dropout, "sm_90", Output::Cubin, (13, 0))
            .unwrap();
    assert!(!hit);
    assert!(bytes.starts_with(b"\x7fELF"), "a CUBIN is an ELF image");
    let (again, hit) =
        nvrtc::load_or_compile(&cache, KernelFile::Dropout, "sm_90", Output::Cubin, (13, 0))
            .unwrap();
    assert!(hit, "second load comes from the disk cache");
    assert_eq!(bytes, again);
    // Another driver version is another key.
    let (_, hit) =
        nvrtc::load_or_compile(&cache, KernelFile::Dropout, "sm_90", Output::Cubin, (13, 1))
            .unwrap();
    assert!(!hit);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
}

#[test]
fn compile_errors_carry_the_log() {
    if !nvrtc_ready() {
        return;
    }
    let inc = nvrtc::find_cuda_include().unwrap();
    let err = nvrtc::compile_source(
        "broken.cu",
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        &nvrtc::compile_options("sm_80", &inc),
        Output::Ptx,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("broken.cu") && err.contains("undefined_thing"),
        "{err}"
    );
}
