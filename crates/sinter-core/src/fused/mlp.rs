//! A GELU MLP as one op: y = gelu(x W_fcᵀ + b_fc) W_projᵀ + b_proj (GPT-2's block MLP).
//!
//! Reads x [..., in], W_fc [hid, in], b_fc [hid], W_proj [out, hid], b_proj [out]; writes y
//! [..., out] and keeps what its backward needs: x, the pre-activation u = x W_fcᵀ + b_fc and
//! h = gelu(u) (what the two Linears would keep).
//!
//! Why it is one op: the gradient of h comes out of the projection's backward GEMM
//! (dh = dy W_proj), and the GELU's backward and the fc bias gradient are elementwise work on
//! it. As separate ops they are a GEMM, a GELU-backward pass over [rows, hid] and a reduction;
//! here the GEMM's DGELU_BGRAD epilogue applies gelu'(u) to the product as it is written and
//! reduces the bias gradient beside it (llm.c fuses the same way), and each weight gradient
//! carries its bias gradient (BGRADB, `linear::weight_bias_grad`). That needs both Linears'
//! backward in one place, so the op exists only where those epilogues run (CUDA, f16/bf16, hid
//! a multiple of 8); everywhere else it is [`mlp_gelu_reference`]'s two fused Linears, the
//! path the layers took before.

use super::linear::{check, linear, weight_bias_grad};
use crate::op::UnaryOp;
use crate::storage::Storage;
use crate::tensor::output_of;
use crate::{bail, no_grad, Device, Result, Tensor};

/// gelu(x W_fcᵀ + b_fc) W_projᵀ + b_proj over the last dimension of x, differentiable in all
/// five inputs.
pub fn mlp_gelu(
    x: &Tensor,
    (w_fc, b_fc): (&Tensor, &Tensor),
    (w_proj, b_proj): (&Tensor, &Tensor),
) -> Result<Tensor> {
    if let Some(c) = crate::amp::autocast_inputs(&[x, w_fc, b_fc, w_proj, b_proj])? {
        return mlp_gelu(&c[0], (&c[1], &c[2]), (&c[3], &c[4]));
    }
    let (rows, inp, hid) = check("mlp_gelu", x, w_fc, Some(b_fc))?;
    let out = match w_proj.shape() {
        &[out, proj_in] if proj_in == hid && b_proj.shape() == [out] => out,
        _ => bail!(
            "mlp_gelu: the projection must be [out, {hid}] with a bias [out] (the fc layer has {hid} outputs), got weight {:?} and bias {:?}",
            w_proj.shape(),
            b_proj.shape()
        ),
    };
    let same = [w_fc, b_fc, w_proj, b_proj]
        .iter()
        .all(|t| t.dtype() == x.dtype() && t.device() == x.device());
    let applies = same
        && x.device() != Device::Cpu
        && crate::cuda::matmul::grad_epilogues_apply(x.dtype())
        && crate::cuda::matmul::linear_gelu_applies(x.dtype(), hid);
    let x2 = x.reshape(&[rows, inp])?;
    let forward = if applies {
        fc_forward(&x2, w_fc, b_fc, (rows, inp, hid))?
    } else {
        None
    };
    let Some((h, pre)) = forward else {
        return mlp_gelu_reference(x, (w_fc, b_fc), (w_proj, b_proj));
    };
    let y = {
        let _g = no_grad();
        linear(&h, &w_proj.detach(), Some(&b_proj.detach()))?
    };
    let (xt, wf, bf, wp, bp) = (
        x2.clone(),
        w_fc.clone(),
        b_fc.clone(),
        w_proj.clone(),
        b_proj.clone(),
    );
    let y = output_of(
        &y,
        "mlp_gelu",
        &[&x2, w_fc, b_fc, w_proj, b_proj],
        move |g, _| {
            let g = g.reshape(&[rows, out])?;
            let (dwp, dbp) = proj_weight_grads(&g, &h, (&wp, &bp))?;
            let (du, dbf) = gelu_input_grad(&g, &wp, &pre, hid)?;
            let dx = xt.tracks_grad().then(|| du.matmul(&wf)).transpose()?;
            let dwf = wf.tracks_grad().then(|| du.t()?.matmul(&xt)).transpose()?;
            Ok(vec![dx, dwf, dbf.filter(|_| bf.tracks_grad()), dwp, dbp])
        },
    );
    let mut shape = x.shape().to_vec();
    *shape.last_mut().expect("rank checked") = out;
    y.reshape(&shape)
}

/// The reference: Linear + bias + GELU, then a Linear (each the fused op of its own).
pub fn mlp_gelu_reference(
    x: &Tensor,
    (w_fc, b_fc): (&Tensor, &Tensor),
    (w_proj, b_proj): (&Tensor, &Tensor),
) -> Result<Tensor> {
    linear(
        &crate::fused::linear_bias_gelu(x, w_fc, b_fc)?,
        w_proj,
        Some(b_proj),
    )
}

/// (h, pre-activation) [rows, hid] from the fc GEMM's GELU_AUX_BIAS epilogue, untracked.
fn fc_forward(
    x2: &Tensor,
    w: &Tensor,
    b: &Tensor,
    (rows, inp, hid): (usize, usize, usize),
) -> Result<Option<(Tensor, Tensor)>> {
    let (xs, ws, bs) = (x2.storage(), w.storage(), b.storage());
    let (Storage::Cuda(xc), Storage::Cuda(wc), Storage::Cuda(bc)) = (&*xs, &*ws, &*bs) else {
        return Ok(None);
    };
    let (xl, wl, bl) = (x2.layout(), w.layout(), b.layout());
    let fused = crate::cuda::matmul::linear_bias_gelu(xc, xl, wc, wl, bc, bl, rows, inp, hid)?;
    Ok(fused.map(|(h, pre)| {
        let t = |s| Tensor::from_storage(Storage::Cuda(s), &[rows, hid]);
        (t(h), t(pre))
    }))
}

/// The projection's (dW, db), one GEMM with the bias gradient where the epilogue runs.
fn proj_weight_grads(
    g: &Tensor,
    h: &Tensor,
    (w, b): (&Tensor, &Tensor),
) -> Result<(Option<Tensor>, Option<Tensor>)> {
    if w.tracks_grad() && b.tracks_grad() {
        if let Some((dw, db)) = weight_bias_grad(g, h)? {
            return Ok((Some(dw), Some(db)));
        }
    }
    let dw = w.tracks_grad().then(|| g.t()?.matmul(h)).transpose()?;
    let out = g.shape()[1];
    let db = b
        .tracks_grad()
        .then(|| g.sum_to_shape(&[out]))
        .transpose()?;
    Ok((dw, db))
}

/// (du, db_fc): the gradient of the GELU's input, u, and Σ_rows du, from g = dy: one GEMM
/// with the DGELU_BGRAD epilogue where it runs, else dh = g W_proj, then GELU's backward
/// pass and the reduction.
fn gelu_input_grad(
    g: &Tensor,
    w_proj: &Tensor,
    pre: &Tensor,
    hid: usize,
) -> Result<(Tensor, Option<Tensor>)> {
    let rows = g.shape()[0];
    let out = g.shape()[1];
    if !crate::is_grad_enabled() {
        let (gs, ws, ps) = (g.storage(), w_proj.storage(), pre.storage());
        if let (Storage::Cuda(gc), Storage::Cuda(wc), Storage::Cuda(pc)) = (&*gs, &*ws, &*ps) {
            let fused = crate::cuda::matmul::linear_dgelu_bias_grad(
                gc,
                g.layout(),
                wc,
                w_proj.layout(),
                pc,
                pre.layout(),
                rows,
                out,
                hid,
            )?;
            if let Some((du, db)) = fused {
                return Ok((
                    Tensor::from_storage(Storage::Cuda(du), &[rows, hid]),
                    Some(Tensor::from_storage(Storage::Cuda(db), &[hid])),
                ));
            }
        }
    }
    let dh = g.matmul(w_proj)?;
    let du = Tensor::unary_backward(UnaryOp::GeluTanh, pre, pre, &dh)?;
    let db = du.sum_to_shape(&[hid])?;
    Ok((du, Some(db)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_support::{assert_close, devices, magnitude, values};
    use crate::DType;

    /// (rows, in, hid, out): hid 16 takes the epilogues on CUDA at f16/bf16, hid 12 does not
    /// (the aux matrix's leading dimension must be a multiple of 8).
    const SHAPES: [[usize; 4]; 2] = [[6, 9, 16, 5], [5, 7, 12, 4]];

    /// The inputs x, W_fc, b_fc, W_proj, b_proj and the output gradient, as f32 values that
    /// `d` holds exactly (so every run sees the same numbers).
    fn inputs([rows, inp, hid, out]: [usize; 4], d: DType) -> Vec<(Vec<f32>, Vec<usize>)> {
        let spec = [
            (vec![rows, inp], 1.0),
            (vec![hid, inp], 0.6),
            (vec![hid], 0.5),
            (vec![out, hid], 0.4),
            (vec![out], 0.5),
            (vec![rows, out], 1.0),
        ];
        spec.into_iter()
            .enumerate()
            .map(|(i, (shape, r))| {
                let n = shape.iter().product();
                let t = Tensor::from_vec(values(40 + i as u64, n, -r, r), &shape, Device::Cpu)
                    .unwrap()
                    .to_dtype(d)
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap();
                (t.to_vec_f32().unwrap(), shape)
            })
            .collect()
    }

    type Mlp = fn(&Tensor, (&Tensor, &Tensor), (&Tensor, &Tensor)) -> Result<Tensor>;

    /// y and the five gradients of Σ y·gy, with `f` on `dev` in `d`.
    fn run(f: Mlp, ins: &[(Vec<f32>, Vec<usize>)], d: DType, dev: Device) -> Vec<Vec<f32>> {
        let t: Vec<Tensor> = ins
            .iter()
            .map(|(v, s)| {
                let t = Tensor::from_vec(v.clone(), s, Device::Cpu).unwrap();
                t.to_dtype(d).unwrap().to_device(dev).unwrap()
            })
            .collect();
        let vars: Vec<Tensor> = t[..5].iter().map(|t| t.to_var().unwrap()).collect();
        let y = f(&vars[0], (&vars[1], &vars[2]), (&vars[3], &vars[4])).unwrap();
        assert_eq!(y.dtype(), d);
        y.mul(&t[5]).unwrap().sum_all().unwrap().backward().unwrap();
        std::iter::once(y)
            .chain(
                vars.iter()
                    .map(|v| v.grad().expect("every input has a gradient")),
            )
            .map(|t| t.to_dtype(DType::F32).unwrap().to_vec_f32().unwrap())
            .collect()
    }

    /// y and each gradient within `rel` of `want`'s, relative to the value plus the largest
    /// magnitude of that output (the kernels' one closeness rule, `test_support`).
    fn assert_all_close(what: &str, got: &[Vec<f32>], want: &[Vec<f32>], rel: f64) {
        let names = ["y", "dx", "dW_fc", "db_fc", "dW_proj", "db_proj"];
        assert_eq!(got.len(), names.len(), "{what}: outputs");
        for ((g, w), name) in got.iter().zip(want).zip(names) {
            let scale = magnitude(&w.iter().map(|&v| f64::from(v)).collect::<Vec<_>>());
            assert_close(&format!("{what} {name}"), g, w, (rel, rel * scale));
        }
    }

    #[test]
    fn the_fused_mlp_and_its_gradients_match_the_composite_and_the_cpu() {
        for dev in devices() {
            for d in [DType::F32, DType::BF16, DType::F16] {
                for shape in SHAPES {
                    let ins = inputs(shape, d);
                    let what = format!("mlp_gelu {dev} {d} {shape:?}");
                    // The CPU's f32 composite on the same (rounded) inputs: the reference.
                    let want = run(mlp_gelu_reference, &ins, DType::F32, Device::Cpu);
                    let rel = match d {
                        DType::F32 => 1e-5,
                        DType::BF16 => 3e-2,
                        _ => 4e-3,
                    };
                    let fused = run(mlp_gelu, &ins, d, dev);
                    assert_all_close(&what, &fused, &want, rel);
                    let composite = run(mlp_gelu_reference, &ins, d, dev);
                    assert_all_close(&format!("{what} vs composite"), &fused, &composite, rel);
                }
            }
        }
    }

    /// On the emulated device, the backward of the half-precision MLP is GEMMs with gradient
    /// epilogues (no GELU-backward pass, no bias-gradient reduction), and falls back to the
    /// GELU-backward pass where the width refuses the DGELU epilogue.
    #[test]
    fn the_half_mlp_backward_runs_in_gemm_epilogues_where_they_apply() {
        use sinter_cuda::emulated::cost;
        if !devices().contains(&Device::Cuda(0)) || !sinter_cuda::is_emulated() {
            return;
        }
        for shape in SHAPES {
            let ins = inputs(shape, DType::BF16);
            cost::start_recording();
            // (Reading the results back waits for the device's queue.)
            run(mlp_gelu, &ins, DType::BF16, Device::Cuda(0));
            let keys: Vec<String> = cost::stop_recording(0).into_iter().map(|c| c.key).collect();
            let [rows, _, hid, out] = shape;
            let has = |k: &str| keys.iter().any(|c| c == k);
            let dgelu = format!("gemm bf16 {rows}x{hid}x{out} +dgelu+bgrad");
            let bgrad = format!("gemm bf16 {out}x{hid}x{rows} Aᵀ +bgradA");
            let fused = hid % 8 == 0;
            assert_eq!(has(&dgelu), fused, "{shape:?}: {keys:?}");
            assert_eq!(has("gelu_tanh_bwd_bf16"), !fused, "{shape:?}: {keys:?}");
            // The projection's bias gradient rides on its weight gradient either way (the
            // fall-back's Linear backward takes the same epilogue).
            assert!(has(&bgrad), "{shape:?}: {keys:?}");
        }
    }
}
