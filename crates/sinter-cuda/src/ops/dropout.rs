//! Wrappers for `kernels/dropout.cu`: Philox-based dropout and random fills, plus a CPU mirror of
//! the generator so the CPU backend and tests can reproduce the device's random stream exactly.

use super::table::{no_ops, Call, Cost, Grid, Kernel, Slot::*, Source};
use super::{need, need_float};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::{CudaError, Result};
use crate::launch::{Arg, Launch, LaunchTarget};
use crate::nvrtc::KernelFile;

/// Philox4x32-10 (same constants and rounds as dropout.cu).
pub fn philox4x32_10(mut c: [u32; 4], mut k: [u32; 2]) -> [u32; 4] {
    const M0: u32 = 0xD251_1F53;
    const M1: u32 = 0xCD9E_8D57;
    const W0: u32 = 0x9E37_79B9;
    const W1: u32 = 0xBB67_AE85;
    for _ in 0..10 {
        let p0 = (M0 as u64) * (c[0] as u64);
        let p1 = (M1 as u64) * (c[2] as u64);
        let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
        let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
        c = [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0];
        k[0] = k[0].wrapping_add(W0);
        k[1] = k[1].wrapping_add(W1);
    }
    c
}

/// The 32-bit random word element `i` gets from (seed, offset).
pub fn philox_word(seed: u64, offset: u64, i: u64) -> u32 {
    let g = i / 4;
    let r = philox4x32_10(
        [
            g as u32,
            (g >> 32) as u32,
            offset as u32,
            (offset >> 32) as u32,
        ],
        [seed as u32, (seed >> 32) as u32],
    );
    r[(i % 4) as usize]
}

/// Uniform [0, 1) from a word (24 bits), as on the device.
pub fn u01(r: u32) -> f32 {
    (r >> 8) as f32 * (1.0 / 16_777_216.0)
}

/// Does dropout keep element `i`? (CPU mirror of the device mask.)
pub fn dropout_keep(seed: u64, offset: u64, i: u64, p: f32) -> bool {
    u01(philox_word(seed, offset, i)) >= p
}

/// How far to advance `offset` after drawing `n` numbers with one seed.
pub fn philox_offset_advance(n: usize) -> u64 {
    n.div_ceil(4) as u64
}

/// y = dropout(x; p) with the mask from (seed, offset).
pub static DROPOUT: Kernel = Kernel {
    source: Source::File(KernelFile::Dropout),
    name: "dropout_{d}",
    ops: no_ops,
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        In("x"),
        Out("y"),
        Items,
        F32("p"),
        U64("seed"),
        U64("offset"),
    ],
    // Four numbers per Philox call.
    grid: Grid::Groups(4),
    traffic: Cost::Estimated,
};

/// y ~ U[a, b) or N(a, b^2).
pub static RANDOM: Kernel = Kernel {
    source: Source::File(KernelFile::Dropout),
    name: "rand_{op}_{d}",
    ops: || vec!["uniform", "normal"],
    dtypes: &DType::FLOATS,
    dtypes2: &[],
    args: &[
        Out("y"),
        Items,
        F32("a"),
        F32("b"),
        U64("seed"),
        U64("offset"),
    ],
    grid: Grid::Groups(4),
    traffic: Cost::Estimated,
};

/// The rows of `kernels/dropout.cu`.
pub static KERNELS: [&Kernel; 2] = [&DROPOUT, &RANDOM];

/// Plan y = dropout(x; p) with the mask from (seed, offset). The backward is the same plan on gy.
pub fn plan_dropout(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    p: f32,
    seed: u64,
    offset: u64,
) -> Result<Option<Launch>> {
    let d = x.dtype();
    need_float("dropout", d)?;
    need("dropout", "y", &y, d, x.len())?;
    if !(0.0..=1.0).contains(&p) {
        return Err(CudaError::invalid(
            "dropout",
            format!("p = {p} outside [0, 1]"),
        ));
    }
    let (operands, scalars) = ([x, y], [Arg::F32(p), Arg::U64(seed), Arg::U64(offset)]);
    DROPOUT.plan(t, &Call::new(d, x.len(), &operands).scalars(&scalars))
}

/// Plan y ~ U[lo, hi) (`normal = false`) or N(lo, hi^2) (`normal = true`: lo = mean, hi = std).
pub fn plan_random(
    t: &LaunchTarget,
    normal: bool,
    y: DevSlice<'_>,
    a: f32,
    b: f32,
    seed: u64,
    offset: u64,
) -> Result<Option<Launch>> {
    let d = y.dtype();
    need_float("random", d)?;
    let op = if normal { "normal" } else { "uniform" };
    let operands = [y];
    let scalars = [Arg::F32(a), Arg::F32(b), Arg::U64(seed), Arg::U64(offset)];
    let call = Call::new(d, y.len(), &operands).op(op).scalars(&scalars);
    RANDOM.plan(t, &call)
}

/// y = dropout(x; p); the mask is a function of (seed, offset, index) only.
pub fn dropout(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    y: DevSlice<'_>,
    p: f32,
    seed: u64,
    offset: u64,
) -> Result<()> {
    dev.run_opt(plan_dropout(&dev.target(), x, y, p, seed, offset)?)
}

/// gx = dropout backward: the same mask and scale applied to gy.
pub fn dropout_backward(
    dev: &CudaDevice,
    gy: DevSlice<'_>,
    gx: DevSlice<'_>,
    p: f32,
    seed: u64,
    offset: u64,
) -> Result<()> {
    dropout(dev, gy, gx, p, seed, offset)
}

/// y ~ U[lo, hi).
pub fn rand_uniform(
    dev: &CudaDevice,
    y: DevSlice<'_>,
    lo: f32,
    hi: f32,
    seed: u64,
    offset: u64,
) -> Result<()> {
    dev.run_opt(plan_random(&dev.target(), false, y, lo, hi, seed, offset)?)
}

/// y ~ N(mean, std^2).
pub fn rand_normal(
    dev: &CudaDevice,
    y: DevSlice<'_>,
    mean: f32,
    std: f32,
    seed: u64,
    offset: u64,
) -> Result<()> {
    dev.run_opt(plan_random(
        &dev.target(),
        true,
        y,
        mean,
        std,
        seed,
        offset,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_known_answer() {
        // Random123 known-answer tests for philox4x32-10.
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([0xffffffff; 4], [0xffffffff, 0xffffffff]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn dropout_rate_and_independence() {
        let n = 100_000u64;
        let kept = (0..n).filter(|&i| dropout_keep(42, 0, i, 0.3)).count() as f64 / n as f64;
        assert!((kept - 0.7).abs() < 0.01, "{kept}");
        let same = (0..1000u64)
            .filter(|&i| dropout_keep(42, 0, i, 0.5) == dropout_keep(42, 1000, i, 0.5))
            .count();
        assert!(
            (400..600).contains(&same),
            "offsets give independent masks: {same}"
        );
        assert_eq!(philox_offset_advance(1001), 251);
    }
}
