//! Wrappers for `kernels/residual_layernorm.cu`: h = x + r and y = LayerNorm(h)·γ + β in one
//! pass (saving mean and rstd). The backward pass is LayerNorm's on the saved h (dx = dr = dh),
//! run by `layernorm.cu`'s deterministic kernels: [`plan_residual_layernorm_backward`].

use super::layernorm::plan_layernorm_backward;
use super::{fake_slice, kname, need, need_float, rows_times_n};
use crate::alloc::DevSlice;
use crate::device::CudaDevice;
use crate::dtype::DType;
use crate::error::Result;
use crate::launch::{row_block, rows_grid, Arg, Launch, LaunchTarget, Step, Traffic};
use crate::nvrtc::KernelFile;

/// Plan h = x + r, y = LayerNorm(h)·gamma + beta over rows of length n, with mean and rstd (f32,
/// [rows]) saved. x, r, gamma, beta, h and y share one float dtype; all are contiguous.
#[allow(clippy::too_many_arguments)]
pub fn plan_residual_layernorm_forward(
    t: &LaunchTarget,
    x: DevSlice<'_>,
    r: DevSlice<'_>,
    gamma: DevSlice<'_>,
    beta: DevSlice<'_>,
    h: DevSlice<'_>,
    y: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<Option<Launch>> {
    let op = "residual_layernorm_forward";
    let d = x.dtype();
    need_float(op, d)?;
    let total = rows_times_n(op, rows, n)?;
    for (what, s) in [("x", &x), ("residual", &r), ("h", &h), ("y", &y)] {
        need(op, what, s, d, total)?;
    }
    need(op, "gamma", &gamma, d, n)?;
    need(op, "beta", &beta, d, n)?;
    need(op, "mean", &mean, DType::F32, rows)?;
    need(op, "rstd", &rstd, DType::F32, rows)?;
    if total == 0 {
        return Ok(None);
    }
    let (bx, by) = row_block(n);
    Ok(Some(Launch {
        file: KernelFile::ResidualLayerNorm,
        name: kname("resln_fwd", d),
        grid: (rows_grid(t, rows, by, bx * by), 1, 1),
        block: (bx, by, 1),
        shared_mem: 0,
        traffic: Some(
            Traffic::bytes(
                x.num_bytes() + r.num_bytes() + gamma.num_bytes() + beta.num_bytes(),
                h.num_bytes() + y.num_bytes() + mean.num_bytes() + rstd.num_bytes(),
            )
            .with_flops(9 * total),
        ),
        args: vec![
            Arg::Ptr(x.ptr()),
            Arg::Ptr(r.ptr()),
            Arg::Ptr(gamma.ptr()),
            Arg::Ptr(beta.ptr()),
            Arg::Ptr(h.ptr()),
            Arg::Ptr(y.ptr()),
            Arg::Ptr(mean.ptr()),
            Arg::Ptr(rstd.ptr()),
            Arg::I64(rows as i64),
            Arg::I64(n as i64),
            Arg::F32(eps),
        ],
    }))
}

/// Plan the backward from gy = ∂L/∂y: dh (the gradient both x and r receive, not counting any
/// gradient that reaches h directly), dgamma and dbeta (each optional). `scratch` is f32 of
/// `layernorm::backward_scratch_len` when a parameter gradient is wanted.
#[allow(clippy::too_many_arguments)]
pub fn plan_residual_layernorm_backward(
    t: &LaunchTarget,
    h: DevSlice<'_>,
    gamma: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    dh: Option<DevSlice<'_>>,
    dgamma: Option<DevSlice<'_>>,
    dbeta: Option<DevSlice<'_>>,
    scratch: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
) -> Result<Vec<Step>> {
    plan_layernorm_backward(
        t,
        h,
        Some(gamma),
        gy,
        mean,
        rstd,
        dh,
        dgamma,
        dbeta,
        scratch,
        rows,
        n,
        false,
    )
}

/// Residual add + LayerNorm forward on the device.
#[allow(clippy::too_many_arguments)]
pub fn residual_layernorm_forward(
    dev: &CudaDevice,
    x: DevSlice<'_>,
    r: DevSlice<'_>,
    gamma: DevSlice<'_>,
    beta: DevSlice<'_>,
    h: DevSlice<'_>,
    y: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    rows: usize,
    n: usize,
    eps: f32,
) -> Result<()> {
    dev.run_opt(plan_residual_layernorm_forward(
        &dev.target(),
        x,
        r,
        gamma,
        beta,
        h,
        y,
        mean,
        rstd,
        rows,
        n,
        eps,
    )?)
}

/// The backward on the device: LayerNorm's backward on the saved h (see
/// [`plan_residual_layernorm_backward`]).
#[allow(clippy::too_many_arguments)]
pub fn residual_layernorm_backward(
    dev: &CudaDevice,
    h: DevSlice<'_>,
    gamma: DevSlice<'_>,
    gy: DevSlice<'_>,
    mean: DevSlice<'_>,
    rstd: DevSlice<'_>,
    dh: Option<DevSlice<'_>>,
    dgamma: Option<DevSlice<'_>>,
    dbeta: Option<DevSlice<'_>>,
    rows: usize,
    n: usize,
) -> Result<()> {
    super::layernorm::layernorm_backward(
        dev,
        h,
        Some(gamma),
        gy,
        mean,
        rstd,
        dh,
        dgamma,
        dbeta,
        rows,
        n,
        false,
    )
}

pub(crate) fn samples(t: &LaunchTarget) -> Vec<Launch> {
    let (rows, n) = (64, 768);
    DType::FLOATS
        .into_iter()
        .filter_map(|d| {
            let s = |len| fake_slice(d, len);
            let f = |len| fake_slice(DType::F32, len);
            plan_residual_layernorm_forward(
                t,
                s(rows * n),
                s(rows * n),
                s(n),
                s(n),
                s(rows * n),
                s(rows * n),
                f(rows),
                f(rows),
                rows,
                n,
                1e-5,
            )
            .unwrap()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_plan() {
        let t = LaunchTarget { sm_count: 132 };
        let d = DType::BF16;
        let (x, r, h, y) = (
            fake_slice(d, 6 * 100),
            fake_slice(d, 6 * 100),
            fake_slice(d, 6 * 100),
            fake_slice(d, 6 * 100),
        );
        let (g, b) = (fake_slice(d, 100), fake_slice(d, 100));
        let (m, s) = (fake_slice(DType::F32, 6), fake_slice(DType::F32, 6));
        let l = plan_residual_layernorm_forward(&t, x, r, g, b, h, y, m, s, 6, 100, 1e-5)
            .unwrap()
            .unwrap();
        assert_eq!(l.name, "resln_fwd_bf16");
        assert_eq!(l.block, (32, 8, 1), "a warp per row of 100");
        assert_eq!(l.grid, (1, 1, 1), "6 rows fit one block of 8 row groups");
        assert_eq!(l.args[4], Arg::Ptr(h.ptr()));
        assert_eq!(l.args[5], Arg::Ptr(y.ptr()));
        assert_eq!(l.args[8], Arg::I64(6));
        assert_eq!(l.args[10], Arg::F32(1e-5));
        // A residual of the wrong dtype or size is refused.
        let e = plan_residual_layernorm_forward(
            &t,
            x,
            fake_slice(DType::F32, 600),
            g,
            b,
            h,
            y,
            m,
            s,
            6,
            100,
            1e-5,
        )
        .unwrap_err();
        assert!(e.to_string().contains("residual"), "{e}");
        let (e0, f0) = (fake_slice(d, 0), fake_slice(DType::F32, 0));
        assert!(
            plan_residual_layernorm_forward(&t, e0, e0, g, b, e0, e0, f0, f0, 0, 100, 1e-5)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn backward_is_layernorm_backward_on_h() {
        let t = LaunchTarget { sm_count: 16 };
        let d = DType::F16;
        let (h, gy, dh) = (
            fake_slice(d, 512 * 64),
            fake_slice(d, 512 * 64),
            fake_slice(d, 512 * 64),
        );
        let (g, dg, db) = (fake_slice(d, 64), fake_slice(d, 64), fake_slice(d, 64));
        let (m, s) = (fake_slice(DType::F32, 512), fake_slice(DType::F32, 512));
        let sc = fake_slice(
            DType::F32,
            super::super::layernorm::backward_scratch_len(&t, 512, 64),
        );
        let steps = super::super::kernels_of(
            plan_residual_layernorm_backward(
                &t,
                h,
                g,
                gy,
                m,
                s,
                Some(dh),
                Some(dg),
                Some(db),
                Some(sc),
                512,
                64,
            )
            .unwrap(),
        );
        let names: Vec<&str> = steps.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "layernorm_bwd_dx_f16",
                "layernorm_bwd_params_f16",
                "layernorm_bwd_finish_f16"
            ]
        );
        assert_eq!(steps[0].args[0], Arg::Ptr(h.ptr()), "reads the saved h");
        assert_eq!(steps[0].args[8], Arg::I32(0), "dh is overwritten");
    }
}
