//! The op conformance suite: every case is written once, backend-blind, and runs on every
//! device × dtype it applies to — the CPU, and the CUDA device (the real GPU when present, else
//! the emulated CUDA device, which CI requires) — against one f64 reference per op
//! (`reference.rs`). Gradients are checked against the reference's derivative.
//!
//! Test names are `<device>::<dtype>::<group>::<case>`, device `cpu`, `cuda` or `cuda-emu`, so
//! `cargo test -p sinter-core --test conformance -- cuda-emu::bf16` runs one slice and the log
//! counts tests per device. A table-driven runner (libtest-mimic) instead of `#[test]`
//! functions, because the device of a run is only known at run time (real or emulated).

// Tables of cases read best inline.
#![allow(clippy::type_complexity)]

mod harness;
mod reference;

mod autocast;
mod autograd;
mod device;
mod elementwise;
mod errors;
mod fused;
mod linalg;
mod logical;
mod nn;
mod optim;
mod reduce;
mod views;

use harness::{lock_device, Case, Dut, On, Target};
use libtest_mimic::{Arguments, Failed, Trial};

fn all_cases() -> Vec<Case> {
    let groups: Vec<(&str, Vec<Case>)> = vec![
        ("elementwise", elementwise::cases()),
        ("reduce", reduce::cases()),
        ("linalg", linalg::cases()),
        ("logical", logical::cases()),
        ("nn", nn::cases()),
        ("views", views::cases()),
        ("fused", fused::cases()),
        ("optim", optim::cases()),
        ("autocast", autocast::cases()),
        ("autograd", autograd::cases()),
        ("errors", errors::cases()),
        ("device", device::cases()),
    ];
    groups
        .into_iter()
        .flat_map(|(g, cs)| cs.into_iter().map(move |c| c.in_group(g)))
        .collect()
}

/// Trials slower than this are named on stderr (CI time is budgeted; small shapes).
const SLOW_SECS: f64 = 5.0;

fn trial(case: &Case, dut: Dut, dtype: sinter_core::DType) -> Trial {
    let name = format!("{}::{}::{}", dut.label, dtype, case.name);
    let (run, exclusive) = (case.run, case.exclusive);
    let name_again = name.clone();
    let runnable = dut.device.is_some() && !(dut.emulated && case.real_gpu.is_some());
    let finding = case.ignore.is_some_and(|(d, _)| dut.label.starts_with(d));
    Trial::test(name, move || {
        let Some(dev) = dut.device else {
            return Err(Failed::from("no such device here"));
        };
        let _guard = lock_device(&dut, exclusive);
        let start = std::time::Instant::now();
        run(&Target {
            dev,
            dtype,
            emulated: dut.emulated,
        });
        let secs = start.elapsed().as_secs_f64();
        if secs > SLOW_SECS {
            eprintln!("slow: {name_again} took {secs:.1} s");
        }
        Ok(())
    })
    .with_ignored_flag(finding || !runnable)
}

fn main() {
    let args = Arguments::from_args();
    let devices = harness::devices();
    let cases = all_cases();
    let mut trials = Vec::new();
    for dut in &devices {
        for case in &cases {
            let applies = match case.on {
                On::All => true,
                On::CpuOnly => dut.label == "cpu",
                On::CudaOnly => dut.label != "cpu",
            };
            if applies {
                trials.extend(case.dtypes.iter().map(|&dt| trial(case, *dut, dt)));
            }
        }
    }
    let mut counts: Vec<(String, usize)> = Vec::new();
    for t in &trials {
        let dev = t.name().split("::").next().unwrap_or("").to_string();
        match counts.iter_mut().find(|(d, _)| *d == dev) {
            Some((_, n)) => *n += 1,
            None => counts.push((dev, 1)),
        }
    }
    let counts: Vec<String> = counts.iter().map(|(d, n)| format!("{d} {n}")).collect();
    eprintln!("conformance trials per device: {}", counts.join(", "));
    for c in &cases {
        if let Some((dev, why)) = c.ignore {
            eprintln!("ignored on {dev} (finding being fixed): {}: {why}", c.name);
        }
        if let Some(why) = c.real_gpu {
            eprintln!("real GPU only: {}: {why}", c.name);
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
