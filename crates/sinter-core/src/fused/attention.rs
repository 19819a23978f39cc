//! Flash attention on the CPU (FlashAttention-2's algorithm).
//!
//! Reads: q [b, h, tq, d], k and v [b, h, tk, d] (f32 views whose last dimension is
//! contiguous are read in place, e.g. heads narrowed out of a packed qkv projection; other
//! layouts and dtypes are gathered to f32 once).
//! Writes: o [b, h, tq, d] and one log-sum-exp per query row (b·h·tq floats), which is all the
//! backward pass keeps besides its inputs. Backward reads q, k, v, o, dO and the log-sum-exp
//! and writes dq, dk, dv.
//! Why it is fast: scores are produced one tile at a time (64 query rows × 64 keys, small
//! enough to stay in cache) and folded into the output with an online softmax (a running
//! max and sum per row rescale the accumulator), so the t×t score and probability matrices
//! are never materialised, forward or backward: memory is O(b·h·t·d) instead of O(b·h·t²).
//! Backward recomputes each tile's probabilities from the saved log-sum-exp (P = exp(S −
//! lse)) and uses D = rowsum(dO∘O) for dS = P∘(dP − D). Tile products run through `gemm`,
//! (batch·head, query block) tasks run on all cores, and causal attention skips the key
//! blocks above the diagonal entirely (half the work).
//!
//! Causal masking is aligned bottom-right: query row i sits at position tk − tq + i and sees
//! keys 0..=tk − tq + i. With tq = tk that is the usual lower triangle; with tq < tk it is
//! decoding against a KV cache that holds the earlier positions.
//!
//! The kernels are the backends' (`cpu::attention`; on CUDA, f16/bf16 with head dim 64 or 128
//! run sinter-cuda's `kernels/flash_attention.cu`, the same algorithm on tensor cores, views
//! read in place). Where a backend has no kernel for the operands (CUDA: f32, other head dims)
//! the op runs as [`attention_reference`], the composite, with the same values and gradients.

use super::float_input;
use crate::backend::AttnGeom;
use crate::tensor::output;
use crate::{bail, DType, Device, Error, Result, Tensor};

fn geom(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f32) -> Result<AttnGeom> {
    for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
        if t.rank() != 4 {
            bail!(
                "attention: {what} must be [batch, heads, time, head_dim], got {:?}",
                t.shape()
            );
        }
        float_input("attention", t)?;
        if t.device() != q.device() {
            return Err(Error::DeviceMismatch {
                op: "attention",
                lhs: q.device(),
                rhs: t.device(),
            });
        }
    }
    let (qs, ks) = (q.shape(), k.shape());
    if k.shape() != v.shape() || qs[0] != ks[0] || qs[1] != ks[1] || qs[3] != ks[3] {
        bail!("attention: q {:?}, k {:?} and v {:?} do not agree (k and v [b, h, tk, d], q [b, h, tq, d])", qs, ks, v.shape());
    }
    if q.dtype() != k.dtype() || q.dtype() != v.dtype() {
        return Err(Error::DTypeMismatch {
            op: "attention",
            expected: q.dtype(),
            got: if k.dtype() != q.dtype() {
                k.dtype()
            } else {
                v.dtype()
            },
        });
    }
    if qs[3] == 0 {
        bail!("attention: head dimension is 0");
    }
    Ok(AttnGeom {
        b: qs[0],
        h: qs[1],
        tq: qs[2],
        tk: ks[2],
        d: qs[3],
        causal,
        scale,
    })
}

/// softmax(scale · q kᵀ [+ causal mask]) v for q [b, h, tq, d], k and v [b, h, tk, d], as one
/// fused, differentiable op that never builds the [tq, tk] matrices (see the module docs).
/// `causal` masks future keys, aligned bottom-right (query i is position tk − tq + i).
/// Under autocast q, k and v are cast to the region's dtype first (PyTorch's rule for
/// scaled_dot_product_attention), which is also what lets CUDA's f16/bf16 kernel run.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, causal: bool, scale: f32) -> Result<Tensor> {
    if let Some(c) = crate::amp::autocast_inputs(&[q, k, v])? {
        return attention(&c[0], &c[1], &c[2], causal, scale);
    }
    let g = geom(q, k, v, causal, scale)?;
    let fused = q.storage().attention(
        q.layout(),
        &k.storage(),
        k.layout(),
        &v.storage(),
        v.layout(),
        &g,
    )?;
    let Some((o, lse)) = fused else {
        // No kernel for these operands on this device: the composite.
        return attention_reference(q, k, v, causal, scale);
    };
    let (qt, kt, vt) = (q.clone(), k.clone(), v.clone());
    Ok(output(
        o,
        &[g.b, g.h, g.tq, g.d],
        "flash_attention",
        &[q, k, v],
        move |grad, y| {
            let (dq, dk, dv) = qt.storage().attention_backward(
                qt.layout(),
                &kt.storage(),
                kt.layout(),
                &vt.storage(),
                vt.layout(),
                &y.storage(),
                y.layout(),
                &grad.storage(),
                grad.layout(),
                &lse,
                &g,
            )?;
            let t = |s, like: &Tensor| Tensor::from_storage(s, like.shape());
            Ok(vec![Some(t(dq, &qt)), Some(t(dk, &kt)), Some(t(dv, &vt))])
        },
    ))
}

/// [tq, tk] bool, true where query row i may not see key j under the bottom-right causal
/// alignment (j ≥ i + tk + 1 − tq), built from two aranges on `device`: no host upload, so a
/// step using it can be captured in a CUDA graph.
pub fn causal_mask(tq: usize, tk: usize, device: Device) -> Result<Tensor> {
    let cols = Tensor::arange(0.0, tk as f64, 1.0, DType::I64, device)?.reshape(&[1, tk])?;
    let first = tk as f64 + 1.0 - tq as f64;
    let rows =
        Tensor::arange(first, first + tq as f64, 1.0, DType::I64, device)?.reshape(&[tq, 1])?;
    cols.ge(&rows)
}

/// The composite reference: the same attention from unfused ops (materialises [tq, tk]); also
/// what `attention` runs where a backend has no kernel for the operands.
pub fn attention_reference(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f32,
) -> Result<Tensor> {
    let g = geom(q, k, v, causal, scale)?;
    let (dead, live) = (g.tq.saturating_sub(g.tk), g.tq.min(g.tk));
    if causal && dead > 0 && live > 0 {
        // The first tq − tk query rows see no key: their output is 0 (as the kernels give). A
        // softmax over an all −inf row would be NaN, forward and backward, so only the live
        // rows (the last tk, whose alignment is the square one) go through it.
        let o = attention_reference(&q.narrow(2, dead, live)?, k, v, true, scale)?;
        let zeros = Tensor::zeros(&[g.b, g.h, dead, g.d], o.dtype(), o.device())?;
        return Tensor::cat(&[zeros, o], 2);
    }
    let s = q.matmul(&k.t()?)?.mul_scalar(scale)?;
    if g.tk == 0 {
        // No keys at all: every output is 0 (a softmax over nothing has no value), still
        // differentiable (the gradients are 0).
        return s.matmul(v);
    }
    let s = if causal {
        s.masked_fill(&causal_mask(g.tq, g.tk, q.device())?, f32::NEG_INFINITY)?
    } else {
        s
    };
    s.softmax(-1)?.matmul(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn causal_mask_from_aranges_matches_the_bottom_right_rule() {
        for (tq, tk) in [(1, 1), (4, 4), (3, 7), (7, 3), (1, 9), (5, 0)] {
            let g = AttnGeom {
                b: 1,
                h: 1,
                tq,
                tk,
                d: 1,
                causal: true,
                scale: 1.0,
            };
            let want: Vec<bool> = (0..tq * tk).map(|x| (x % tk) >= g.limit(x / tk)).collect();
            let got = causal_mask(tq, tk, Device::Cpu).unwrap();
            assert_eq!(got.shape(), &[tq, tk]);
            assert_eq!(got.dtype(), DType::Bool);
            assert_eq!(got.to_vec_bool().unwrap(), want, "tq {tq}, tk {tk}");
        }
    }

    /// Causal with more queries than keys: the first tq − tk rows see no key. The composite
    /// (what CUDA runs for f32) must give them 0 like the kernel, with finite gradients, and
    /// match the kernel everywhere else; with no keys at all everything is 0.
    #[test]
    fn composite_rows_without_keys_are_zero_like_the_kernel() {
        let mut rng = crate::Rng::new(7);
        for (tq, tk) in [(5usize, 3usize), (4, 0)] {
            let mut mk = |t: usize| {
                Tensor::randn(&[1, 2, t, 4], 0.0, 1.0, &mut rng, DType::F32, Device::Cpu)
                    .unwrap()
                    .to_var()
                    .unwrap()
            };
            let (q, k, v) = (mk(tq), mk(tk), mk(tk));
            let run = |f: fn(&Tensor, &Tensor, &Tensor, bool, f32) -> Result<Tensor>| {
                let o = f(&q, &k, &v, true, 0.5).unwrap();
                o.sum_all().unwrap().backward().unwrap();
                let grads: Vec<Vec<f32>> = [&q, &k, &v]
                    .iter()
                    .map(|t| t.grad().unwrap().to_vec_f32().unwrap())
                    .collect();
                for t in [&q, &k, &v] {
                    t.zero_grad();
                }
                (o.to_vec_f32().unwrap(), grads)
            };
            let (o_ref, g_ref) = run(attention_reference);
            let (o_ker, g_ker) = run(attention);
            for head in o_ref.chunks(tq * 4) {
                // Each head's first tq − tk rows (of head dim 4).
                assert!(head[..(tq - tk) * 4].iter().all(|&x| x == 0.0), "{head:?}");
            }
            for (a, b) in o_ref
                .iter()
                .zip(&o_ker)
                .chain(g_ref.iter().flatten().zip(g_ker.iter().flatten()))
            {
                assert!(
                    a.is_finite() && (a - b).abs() < 1e-5,
                    "tq {tq} tk {tk}: {a} vs {b}"
                );
            }
        }
    }
}
