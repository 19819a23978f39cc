//! The launch plans of `flash_attention.cu` (this folder): FlashAttention-2 forward (O and the
//! per-row log-sum-exp) and backward (D = rowsum(dO∘O), then dK/dV per key block and dQ per query
//! block: two kernels, one writer per output, no atomics), multi-head or grouped-query (a kv
//! head's dK/dV block sums over its query heads). f16/bf16, head dims 32, 64 and 128;
//! `cuda.rs` runs the composite for anything else ([`supported`]). Each plan is pure (checked
//! without a device); [`flash_forward`] and [`flash_backward`] queue them on a device.

use std::sync::OnceLock;

use sinter_cuda::alloc::{DevSlice, Pool};
use sinter_cuda::emulated::cost::{OpClass, Traffic};
use sinter_cuda::launch::Arg;
use sinter_cuda::user_kernel::{KernelSource, UserLaunch};
use sinter_cuda::{CudaDevice, CudaError, DType, Result};

/// The CUDA C++ of the kernels (compiled by NVRTC at the first launch on a device).
pub(super) const FLASH_ATTENTION_CU: &str = include_str!("flash_attention.cu");

/// The kernels' source, made once per process.
pub(super) fn source() -> Result<&'static KernelSource> {
    static SOURCE: OnceLock<KernelSource> = OnceLock::new();
    if let Some(s) = SOURCE.get() {
        return Ok(s);
    }
    let s = KernelSource::new("flash_attention.cu", FLASH_ATTENTION_CU)?;
    Ok(SOURCE.get_or_init(|| s))
}

/// Query rows per forward block (4 warps × 16).
const FWD_ROWS: usize = 64;
/// Keys per dK/dV block and query rows per dQ block (2 warps × 16).
const BWD_ROWS: usize = 32;
/// Threads of the forward, backward and row-dot kernels.
const FWD_THREADS: u32 = 128;
const BWD_THREADS: u32 = 64;
const DOT_THREADS: u32 = 256;

/// True when the kernels cover this dtype and head dimension.
pub(super) fn supported(dtype: DType, head_dim: usize) -> bool {
    matches!(dtype, DType::F16 | DType::BF16) && matches!(head_dim, 32 | 64 | 128)
}

/// The problem: q [b, h, tq, d], k and v [b, kv_h, tk, d] (query head i reads kv head
/// i / (h / kv_h)); the causal mask is aligned bottom-right.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AttnShape {
    pub(super) b: usize,
    pub(super) h: usize,
    pub(super) kv_h: usize,
    pub(super) tq: usize,
    pub(super) tk: usize,
    pub(super) d: usize,
    pub(super) causal: bool,
    pub(super) scale: f32,
}

/// A [b, h, t, d] operand read in place: `data` starts at element (0, 0, 0, 0); `strides` are the
/// batch, head and row strides in elements (the last dim is contiguous).
#[derive(Clone, Copy, Debug)]
pub(super) struct AttnView<'a> {
    pub(super) data: DevSlice<'a>,
    pub(super) strides: [usize; 3],
}

impl AttnShape {
    /// Query heads per kv head.
    fn group(&self) -> usize {
        self.h / self.kv_h
    }
}

/// Which heads a view holds: the query heads (q, o, dout, dq) or the kv heads (k, v, dk, dv).
#[derive(Clone, Copy, PartialEq)]
enum Heads {
    Query,
    Kv,
}

impl Heads {
    fn of(self, s: &AttnShape) -> usize {
        match self {
            Heads::Query => s.h,
            Heads::Kv => s.kv_h,
        }
    }
}

impl AttnView<'_> {
    /// Every element of the [s.b, heads, t, s.d] view lies inside `data`.
    fn check(
        &self,
        op: &'static str,
        (what, heads): (&str, Heads),
        d: DType,
        s: &AttnShape,
        t: usize,
    ) -> Result<()> {
        let (b, h, hd) = (s.b, heads.of(s), s.d);
        need_dtype(op, what, &self.data, d)?;
        if b == 0 || h == 0 || t == 0 {
            return Ok(());
        }
        let [sb, sh, st] = self.strides;
        let last = (b - 1)
            .checked_mul(sb)
            .and_then(|x| x.checked_add((h - 1).checked_mul(sh)?))
            .and_then(|x| x.checked_add((t - 1).checked_mul(st)?))
            .and_then(|x| x.checked_add(hd));
        match last {
            Some(end) if end <= self.data.len() && end <= i64::MAX as usize => Ok(()),
            _ => Err(CudaError::invalid(
                op,
                format!(
                    "{what} view [{b}, {h}, {t}, {hd}] with strides {:?} reaches past its {} elements",
                    self.strides,
                    self.data.len()
                ),
            )),
        }
    }
    /// An output view: like `check`, and no two of its elements share memory (each stride,
    /// in increasing order, clears the span of the dims below it), or the kernels' writes race.
    fn check_out(
        &self,
        op: &'static str,
        (what, heads): (&str, Heads),
        d: DType,
        s: &AttnShape,
        t: usize,
    ) -> Result<()> {
        self.check(op, (what, heads), d, s, t)?;
        let h = heads.of(s);
        if s.b * h * t * s.d == 0 {
            return Ok(());
        }
        let [sb, sh, st] = self.strides;
        let mut dims: Vec<(usize, usize)> = [(sb, s.b), (sh, h), (st, t), (1, s.d)]
            .into_iter()
            .filter(|&(_, n)| n > 1)
            .collect();
        dims.sort_unstable();
        let mut span = 1usize;
        for (stride, n) in dims {
            if stride < span {
                return Err(CudaError::invalid(
                    op,
                    format!(
                        "{what} view [{}, {h}, {t}, {}] with strides {:?} writes some elements twice",
                        s.b, s.d, self.strides
                    ),
                ));
            }
            span += stride * (n - 1);
        }
        Ok(())
    }
    fn args(&self) -> [Arg; 3] {
        self.strides.map(|s| Arg::I64(s as i64))
    }
}

/// `s` holds `d` elements (an error naming `op` and `what` otherwise).
fn need_dtype(op: &'static str, what: &str, s: &DevSlice<'_>, d: DType) -> Result<()> {
    if s.dtype() == d {
        return Ok(());
    }
    Err(CudaError::invalid(
        op,
        format!("{what} must be {d}, got {}", s.dtype()),
    ))
}

/// `s` holds `n` elements of `d`.
fn need(op: &'static str, what: &str, s: &DevSlice<'_>, d: DType, n: usize) -> Result<()> {
    need_dtype(op, what, s, d)?;
    if s.len() == n {
        return Ok(());
    }
    Err(CudaError::invalid(
        op,
        format!("{what} has {} elements, expected {n}", s.len()),
    ))
}

/// A launch of one of the kernels, with the traffic and FLOPs the cost model records for it.
fn launch(
    kernel: String,
    grid: (u32, u32, u32),
    block: u32,
    args: Vec<Arg>,
    t: Traffic,
) -> UserLaunch {
    UserLaunch {
        kernel,
        grid,
        block: (block, 1, 1),
        shared_mem: 0,
        args,
        declared: Some((OpClass::Attention, t)),
    }
}

fn check_shape(op: &'static str, s: &AttnShape, d: DType) -> Result<()> {
    if !supported(d, s.d) {
        return Err(CudaError::invalid(
            op,
            format!(
                "the kernels cover f16/bf16 with head dim 32, 64 or 128, got {d} with head dim {}; use the composite",
                s.d
            ),
        ));
    }
    if s.kv_h == 0 || !s.h.is_multiple_of(s.kv_h) {
        return Err(CudaError::invalid(
            op,
            format!(
                "{} query heads cannot share {} kv heads (a whole number of query heads per kv head)",
                s.h, s.kv_h
            ),
        ));
    }
    let bh = s.b.checked_mul(s.h).filter(|&x| x <= i32::MAX as usize);
    if bh.is_none() || s.tq.div_ceil(BWD_ROWS) > 65535 || s.tk.div_ceil(BWD_ROWS) > 65535 {
        return Err(CudaError::invalid(
            op,
            format!(
                "batch·heads {}·{} or sequence lengths tq {} / tk {} exceed the launch grid",
                s.b, s.h, s.tq, s.tk
            ),
        ));
    }
    Ok(())
}

fn geometry_args(s: &AttnShape, q: &AttnView, k: &AttnView, v: &AttnView) -> Vec<Arg> {
    let mut a = vec![
        Arg::I64(s.h as i64),
        Arg::I64(s.group() as i64),
        Arg::I64(s.tq as i64),
        Arg::I64(s.tk as i64),
    ];
    a.extend(q.args());
    a.extend(k.args());
    a.extend(v.args());
    a
}

/// The tensor-core FLOPs of one pass of the two attention products (Q·Kᵀ and P·V, 2 FLOPs per
/// multiply-add each): 4·b·h·tq·tk·d, about half of it under a causal mask.
fn attention_flops(s: &AttnShape) -> usize {
    let full = 4 * s.b * s.h * s.tq * s.tk * s.d;
    if s.causal {
        full / 2
    } else {
        full
    }
}

/// Bytes of one [b, heads, t, d] operand.
fn view_bytes(s: &AttnShape, heads: Heads, t: usize, d: DType) -> usize {
    s.b * heads.of(s) * t * s.d * d.size()
}

fn kernel_name(base: &str, d: DType, head_dim: usize) -> String {
    format!("{base}_{}_d{head_dim}", d.suffix())
}

/// Plan the forward: o (a [b, h, tq, d] view, e.g. the heads of a [b, tq, h·d] output) and lse
/// (contiguous f32 [b, h, tq]). None when empty.
pub(super) fn plan_flash_forward(
    s: &AttnShape,
    q: AttnView<'_>,
    k: AttnView<'_>,
    v: AttnView<'_>,
    o: AttnView<'_>,
    lse: DevSlice<'_>,
) -> Result<Option<UserLaunch>> {
    let op = "flash_attention_forward";
    let d = q.data.dtype();
    check_shape(op, s, d)?;
    q.check(op, ("q", Heads::Query), d, s, s.tq)?;
    k.check(op, ("k", Heads::Kv), d, s, s.tk)?;
    v.check(op, ("v", Heads::Kv), d, s, s.tk)?;
    o.check_out(op, ("o", Heads::Query), d, s, s.tq)?;
    let rows = s.b * s.h * s.tq;
    need(op, "lse", &lse, DType::F32, rows)?;
    if rows == 0 {
        return Ok(None);
    }
    let mut args = vec![
        Arg::Ptr(q.data.ptr()),
        Arg::Ptr(k.data.ptr()),
        Arg::Ptr(v.data.ptr()),
        Arg::Ptr(o.data.ptr()),
        Arg::Ptr(lse.ptr()),
    ];
    args.extend(geometry_args(s, &q, &k, &v));
    args.extend(o.args());
    args.push(Arg::F32(s.scale));
    args.push(Arg::I32(s.causal as i32));
    // q, k, v in; o and the f32 log-sum-exp out.
    let (qb, kb) = (
        view_bytes(s, Heads::Query, s.tq, d),
        view_bytes(s, Heads::Kv, s.tk, d),
    );
    let t = Traffic::bytes(qb + 2 * kb, qb + rows * 4).with_tensor_flops(attention_flops(s));
    Ok(Some(launch(
        kernel_name("fa_fwd", d, s.d),
        ((s.b * s.h) as u32, s.tq.div_ceil(FWD_ROWS) as u32, 1),
        FWD_THREADS,
        args,
        t,
    )))
}

/// Plan the backward: dvec (f32 [b, h, tq], scratch) = rowsum(dout∘o), then dk, dv and dq,
/// every element of each view written (0 where no query or key reaches it). All five are
/// [b, h, t, d] views read or written in place (e.g. dq, dk and dv as the thirds of one packed
/// [b, t, 3, h, d] gradient); dk and dv share one set of strides.
#[allow(clippy::too_many_arguments)]
pub(super) fn plan_flash_backward(
    s: &AttnShape,
    q: AttnView<'_>,
    k: AttnView<'_>,
    v: AttnView<'_>,
    o: AttnView<'_>,
    dout: AttnView<'_>,
    lse: DevSlice<'_>,
    dvec: DevSlice<'_>,
    dq: AttnView<'_>,
    dk: AttnView<'_>,
    dv: AttnView<'_>,
) -> Result<Vec<UserLaunch>> {
    let op = "flash_attention_backward";
    let d = q.data.dtype();
    check_shape(op, s, d)?;
    let (query, kv) = (Heads::Query, Heads::Kv);
    q.check(op, ("q", query), d, s, s.tq)?;
    k.check(op, ("k", kv), d, s, s.tk)?;
    v.check(op, ("v", kv), d, s, s.tk)?;
    o.check(op, ("o", query), d, s, s.tq)?;
    dout.check(op, ("dout", query), d, s, s.tq)?;
    dq.check_out(op, ("dq", query), d, s, s.tq)?;
    dk.check_out(op, ("dk", kv), d, s, s.tk)?;
    dv.check_out(op, ("dv", kv), d, s, s.tk)?;
    if dk.strides != dv.strides {
        return Err(CudaError::invalid(
            op,
            format!(
                "dk and dv must share strides (one argument set), got {:?} and {:?}",
                dk.strides, dv.strides
            ),
        ));
    }
    let qrows = s.b * s.h * s.tq;
    need(op, "lse", &lse, DType::F32, qrows)?;
    need(op, "dvec", &dvec, DType::F32, qrows)?;
    let mut steps = Vec::new();
    if s.b * s.h == 0 {
        return Ok(steps);
    }
    if qrows > 0 {
        let rows_per_block = (DOT_THREADS / 32) as usize;
        let mut args = vec![
            Arg::Ptr(o.data.ptr()),
            Arg::Ptr(dout.data.ptr()),
            Arg::Ptr(dvec.ptr()),
            Arg::I64(qrows as i64),
            Arg::I64(s.d as i64),
            Arg::I64(s.h as i64),
            Arg::I64(s.tq as i64),
        ];
        args.extend(o.args());
        args.extend(dout.args());
        steps.push(launch(
            format!("fa_bwd_dot_{}", d.suffix()),
            (qrows.div_ceil(rows_per_block) as u32, 1, 1),
            DOT_THREADS,
            args,
            Traffic::bytes(2 * view_bytes(s, query, s.tq, d), qrows * 4),
        ));
    }
    let common = |outs: &[u64], out_view: &AttnView| {
        let mut a = vec![
            Arg::Ptr(q.data.ptr()),
            Arg::Ptr(k.data.ptr()),
            Arg::Ptr(v.data.ptr()),
            Arg::Ptr(dout.data.ptr()),
            Arg::Ptr(lse.ptr()),
            Arg::Ptr(dvec.ptr()),
        ];
        a.extend(outs.iter().map(|&p| Arg::Ptr(p)));
        a.extend(geometry_args(s, &q, &k, &v));
        a.extend(dout.args());
        a.extend(out_view.args());
        a.push(Arg::F32(s.scale));
        a.push(Arg::I32(s.causal as i32));
        a
    };
    // With no queries dk and dv are 0, with no keys dq is 0: the kernels write those zeros
    // (their loops run no tile), so a strided view is never cleared as a whole range. Each
    // kernel's grid: (b · its output's heads, blocks of BWD_ROWS rows of its output).
    // Both kernels read q, k, v, dout and the two f32 row vectors. dK/dV recomputes S and P
    // and forms dP, dV and dK (4 products); dQ recomputes S and P, forms dP and dQ (3).
    let (qb, kb) = (view_bytes(s, query, s.tq, d), view_bytes(s, kv, s.tk, d));
    let read = 2 * qb + 2 * kb + 2 * qrows * 4;
    let pass = attention_flops(s) / 2;
    let launches = [
        (
            "fa_bwd_dkdv",
            (s.kv_h, s.tk),
            vec![dk.data.ptr(), dv.data.ptr()],
            &dk,
            Traffic::bytes(read, 2 * kb).with_tensor_flops(4 * pass),
        ),
        (
            "fa_bwd_dq",
            (s.h, s.tq),
            vec![dq.data.ptr()],
            &dq,
            Traffic::bytes(read, qb).with_tensor_flops(3 * pass),
        ),
    ];
    for (base, (heads, rows), outs, view, traffic) in launches {
        if rows > 0 {
            steps.push(launch(
                kernel_name(base, d, s.d),
                ((s.b * heads) as u32, rows.div_ceil(BWD_ROWS) as u32, 1),
                BWD_THREADS,
                common(&outs, view),
                traffic,
            ));
        }
    }
    Ok(steps)
}

/// Queues the launches on the device stream.
fn run(dev: &CudaDevice, launches: impl IntoIterator<Item = UserLaunch>) -> Result<()> {
    let src = source()?;
    launches
        .into_iter()
        .try_for_each(|l| dev.launch_user(src, &l))
}

/// Flash attention forward on the device.
pub(super) fn flash_forward(
    dev: &CudaDevice,
    s: &AttnShape,
    q: AttnView<'_>,
    k: AttnView<'_>,
    v: AttnView<'_>,
    o: AttnView<'_>,
    lse: DevSlice<'_>,
) -> Result<()> {
    run(dev, plan_flash_forward(s, q, k, v, o, lse)?)
}

/// Flash attention backward on the device; the row-dot scratch comes from the temporary pool.
#[allow(clippy::too_many_arguments)]
pub(super) fn flash_backward(
    dev: &CudaDevice,
    s: &AttnShape,
    q: AttnView<'_>,
    k: AttnView<'_>,
    v: AttnView<'_>,
    o: AttnView<'_>,
    dout: AttnView<'_>,
    lse: DevSlice<'_>,
    dq: AttnView<'_>,
    dk: AttnView<'_>,
    dv: AttnView<'_>,
) -> Result<()> {
    let dvec = dev.alloc(s.b * s.h * s.tq, DType::F32, Pool::Temporary)?;
    let steps = plan_flash_backward(s, q, k, v, o, dout, lse, dvec.as_slice(), dq, dk, dv)?;
    run(dev, steps)
}

/// One launch of each kernel instantiation the plans make (fake pointers): what the NVRTC test
/// checks against the compiled PTX.
#[cfg(test)]
pub(super) fn samples() -> Vec<UserLaunch> {
    use sinter_cuda::ops::fake_slice;
    let mut out = Vec::new();
    for dt in [DType::F16, DType::BF16] {
        for hd in [32, 64, 128] {
            let s = AttnShape {
                b: 2,
                h: 3,
                kv_h: 3,
                tq: 40,
                tk: 70,
                d: hd,
                causal: true,
                scale: 0.125,
            };
            let view = |t: usize| AttnView {
                data: fake_slice(dt, 2 * 3 * t * hd),
                strides: [3 * t * hd, t * hd, hd],
            };
            let (q, k, v) = (view(s.tq), view(s.tk), view(s.tk));
            let qn = 2 * 3 * s.tq;
            let (o, dout, dq) = (view(s.tq), view(s.tq), view(s.tq));
            let (lse, dvec) = (fake_slice(DType::F32, qn), fake_slice(DType::F32, qn));
            let (dk, dv) = (k, v);
            out.extend(plan_flash_forward(&s, q, k, v, o, lse).unwrap());
            out.extend(plan_flash_backward(&s, q, k, v, o, dout, lse, dvec, dq, dk, dv).unwrap());
        }
    }
    // fa_bwd_dot is planned once per dtype and head dim above; keep one per dtype.
    let mut seen = std::collections::HashSet::new();
    out.retain(|l| seen.insert(l.kernel.clone()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_cuda::ops::fake_slice;

    fn shape(tq: usize, tk: usize, d: usize) -> AttnShape {
        AttnShape {
            b: 2,
            h: 4,
            kv_h: 4,
            tq,
            tk,
            d,
            causal: true,
            scale: 0.1,
        }
    }

    fn packed(dt: DType, b: usize, h: usize, t: usize, d: usize) -> AttnView<'static> {
        AttnView {
            data: fake_slice(dt, b * h * t * d),
            strides: [h * t * d, t * d, d],
        }
    }

    #[test]
    fn coverage_and_fallback_choice() {
        assert!(supported(DType::BF16, 64) && supported(DType::F16, 128));
        assert!(!supported(DType::F32, 64), "f32 keeps the composite");
        assert!(supported(DType::BF16, 32), "llama-tiny's heads");
        assert!(!supported(DType::BF16, 96) && !supported(DType::F16, 16));
        let s = shape(8, 8, 96);
        let v = packed(DType::BF16, 2, 4, 8, 96);
        let e = plan_flash_forward(&s, v, v, v, v, fake_slice(DType::F32, 64)).unwrap_err();
        assert!(e.to_string().contains("head dim"), "{e}");
    }

    #[test]
    fn forward_grid_and_args() {
        let s = shape(100, 130, 128);
        let (q, k, v) = (
            packed(DType::F16, 2, 4, 100, 128),
            packed(DType::F16, 2, 4, 130, 128),
            packed(DType::F16, 2, 4, 130, 128),
        );
        // o with the heads merged: [b, tq, h, d] memory seen as [b, h, tq, d].
        let o = AttnView {
            data: fake_slice(DType::F16, 2 * 100 * 4 * 128),
            strides: [100 * 4 * 128, 128, 4 * 128],
        };
        let lse = fake_slice(DType::F32, 2 * 4 * 100);
        let l = plan_flash_forward(&s, q, k, v, o, lse).unwrap().unwrap();
        assert_eq!(l.kernel, "fa_fwd_f16_d128");
        assert_eq!(
            l.grid,
            (8, 2, 1),
            "b·h blocks × ceil(100 / 64) query blocks"
        );
        assert_eq!(l.block, (128, 1, 1));
        assert_eq!(l.args.len(), 5 + 4 + 9 + 3 + 2);
        assert_eq!(l.args[3], Arg::Ptr(o.data.ptr()));
        assert_eq!(l.args[6], Arg::I64(1), "query heads per kv head");
        assert_eq!(l.args[7], Arg::I64(100));
        assert_eq!(l.args[8], Arg::I64(130));
        assert_eq!(l.args[9], Arg::I64(4 * 100 * 128), "q batch stride");
        assert_eq!(l.args[14], Arg::I64(128), "k row stride");
        assert_eq!(l.args[18], Arg::I64(100 * 4 * 128), "o batch stride");
        assert_eq!(l.args[19], Arg::I64(128), "o head stride");
        assert_eq!(l.args[20], Arg::I64(4 * 128), "o row stride");
        assert_eq!(l.args[21], Arg::F32(0.1));
        assert_eq!(l.args[22], Arg::I32(1));
    }

    #[test]
    fn strided_views_are_bounds_checked() {
        let s = AttnShape {
            b: 1,
            h: 2,
            kv_h: 2,
            tq: 4,
            tk: 4,
            d: 64,
            causal: false,
            scale: 1.0,
        };
        // Heads narrowed out of a packed [b, t, 3·h·d] projection: row stride 3·2·64.
        let qkv = fake_slice(DType::BF16, 4 * 3 * 2 * 64);
        let view = |off: usize, len: usize| AttnView {
            data: qkv.slice(off, len).unwrap(),
            strides: [4 * 384, 64, 384],
        };
        let (q, k, v) = (
            view(0, qkv.len()),
            view(128, qkv.len() - 128),
            view(256, qkv.len() - 256),
        );
        let o = packed(DType::BF16, 1, 2, 4, 64);
        let lse = fake_slice(DType::F32, 8);
        assert!(plan_flash_forward(&s, q, k, v, o, lse).is_ok());
        let short = view(256, 3 * 384);
        let e = plan_flash_forward(&s, q, k, short, o, lse).unwrap_err();
        assert!(e.to_string().contains("v view"), "{e}");
    }

    #[test]
    fn backward_steps() {
        let s = shape(33, 65, 64);
        let dt = DType::BF16;
        let (q, k, v) = (
            packed(dt, 2, 4, 33, 64),
            packed(dt, 2, 4, 65, 64),
            packed(dt, 2, 4, 65, 64),
        );
        let qn = 2 * 4 * 33;
        let (o, g, dq) = (
            packed(dt, 2, 4, 33, 64),
            packed(dt, 2, 4, 33, 64),
            packed(dt, 2, 4, 33, 64),
        );
        let (lse, dvec) = (fake_slice(DType::F32, qn), fake_slice(DType::F32, qn));
        let (dk, dv) = (packed(dt, 2, 4, 65, 64), packed(dt, 2, 4, 65, 64));
        let steps = plan_flash_backward(&s, q, k, v, o, g, lse, dvec, dq, dk, dv).unwrap();
        let names: Vec<&str> = steps.iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(
            names,
            [
                "fa_bwd_dot_bf16",
                "fa_bwd_dkdv_bf16_d64",
                "fa_bwd_dq_bf16_d64"
            ]
        );
        assert_eq!(steps[0].grid.0 as usize, qn.div_ceil(8));
        assert_eq!(steps[1].grid, (8, 3, 1), "ceil(65 / 32) key blocks");
        assert_eq!(steps[2].grid, (8, 2, 1), "ceil(33 / 32) query blocks");
        assert_eq!(steps[1].args[6], Arg::Ptr(dk.data.ptr()));
        assert_eq!(steps[1].args[7], Arg::Ptr(dv.data.ptr()));
        assert_eq!(steps[2].args[6], Arg::Ptr(dq.data.ptr()));
        assert_eq!(steps[1].args.len(), steps[2].args.len() + 1);
        // A wrong-sized gradient view is refused, and dk/dv with different strides.
        let e = plan_flash_backward(&s, q, k, v, o, g, lse, dvec, dq, dq, dv).unwrap_err();
        assert!(e.to_string().contains("dk"), "{e}");
        let dv_t = AttnView {
            strides: [4 * 65 * 64, 64, 4 * 64],
            ..dv
        };
        let e = plan_flash_backward(&s, q, k, v, o, g, lse, dvec, dq, dk, dv_t).unwrap_err();
        assert!(e.to_string().contains("share strides"), "{e}");
        // Rows that overlap (row stride below the head dim) would race.
        let overlapping = AttnView {
            strides: [4 * 33 * 64, 33 * 64, 32],
            ..dq
        };
        let e = plan_flash_backward(&s, q, k, v, o, g, lse, dvec, overlapping, dk, dv).unwrap_err();
        assert!(e.to_string().contains("twice"), "{e}");
        // No keys: only the dq kernel runs (its key loop is empty, so it writes zeros), never a
        // whole-range clear that would reach past a strided view.
        let s0 = shape(33, 0, 64);
        let k0 = AttnView {
            data: fake_slice(dt, 0),
            strides: [0, 0, 64],
        };
        let st = plan_flash_backward(&s0, q, k0, k0, o, g, lse, dvec, dq, k0, k0).unwrap();
        let names: Vec<&str> = st.iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(names, ["fa_bwd_dot_bf16", "fa_bwd_dq_bf16_d64"]);
    }

    /// Grouped heads: 6 query heads over 2 kv heads. k, v, dk and dv are checked as 2 heads,
    /// the dK/dV grid has one block row per (batch, kv head) and every kernel gets the group;
    /// a group that does not divide is refused.
    #[test]
    fn grouped_heads_plans() {
        let s = AttnShape {
            h: 6,
            kv_h: 2,
            ..shape(40, 40, 64)
        };
        let dt = DType::F16;
        let (q, kv) = (packed(dt, 2, 6, 40, 64), packed(dt, 2, 2, 40, 64));
        let qn = 2 * 6 * 40;
        let (lse, dvec) = (fake_slice(DType::F32, qn), fake_slice(DType::F32, qn));
        let f = plan_flash_forward(&s, q, kv, kv, q, lse).unwrap().unwrap();
        assert_eq!(f.grid, (12, 1, 1), "b · query heads");
        assert_eq!(f.args[6], Arg::I64(3));
        let steps = plan_flash_backward(&s, q, kv, kv, q, q, lse, dvec, q, kv, kv).unwrap();
        assert_eq!(
            steps[1].grid,
            (4, 2, 1),
            "b · kv heads × ceil(40 / 32) key blocks"
        );
        assert_eq!(steps[2].grid, (12, 2, 1), "b · query heads × query blocks");
        // The group follows h: after 6 pointers and dk, dv (dK/dV) or dq (dQ).
        assert_eq!(steps[1].args[9], Arg::I64(3));
        assert_eq!(steps[2].args[8], Arg::I64(3));
        // kv views read as 6 heads reach past their memory.
        let e = plan_flash_forward(&AttnShape { kv_h: 6, ..s }, q, kv, kv, q, lse).unwrap_err();
        assert!(e.to_string().contains("k view"), "{e}");
        let e = plan_flash_forward(&AttnShape { kv_h: 4, ..s }, q, kv, kv, q, lse).unwrap_err();
        assert!(e.to_string().contains("cannot share"), "{e}");
    }

    /// Causal forward, b 2, h 3, T 128, d 64: 4·b·h·T²·d / 2 tensor FLOPs; q, k, v read and o
    /// written once (bf16), plus the f32 log-sum-exp.
    #[test]
    fn forward_declares_its_traffic() {
        let s = AttnShape {
            b: 2,
            h: 3,
            kv_h: 3,
            tq: 128,
            tk: 128,
            d: 64,
            causal: true,
            scale: 0.125,
        };
        let elems = 2 * 3 * 128 * 64;
        let view = || AttnView {
            data: fake_slice(DType::BF16, elems),
            strides: [3 * 128 * 64, 128 * 64, 64],
        };
        let lse = fake_slice(DType::F32, 2 * 3 * 128);
        let l = plan_flash_forward(&s, view(), view(), view(), view(), lse)
            .unwrap()
            .unwrap();
        let c = l.cost();
        assert!(c.declared);
        assert_eq!(c.class, OpClass::Attention);
        assert_eq!(
            c.traffic.tensor_flops,
            (4 * 2 * 3 * 128 * 128 * 64 / 2) as u64
        );
        assert_eq!(c.traffic.read, (3 * elems * 2) as u64);
        assert_eq!(c.traffic.written, (elems * 2 + 2 * 3 * 128 * 4) as u64);
    }

    /// flash_attention.cu compiles for sm_80 and sm_90, every planned launch matches its
    /// kernel's parameters in the PTX, and every compiled kernel has a plan.
    #[test]
    fn nvrtc_compiles_the_kernels_and_the_plans_match_them() {
        if !crate::kernels::test_support::nvrtc_available() {
            return;
        }
        let src = source().unwrap();
        let plans = samples();
        // Forward, dK/dV and dQ per dtype and head dim, one row dot per dtype.
        assert_eq!(plans.len(), 2 * 3 * 3 + 2);
        for arch in ["sm_80", "sm_90"] {
            let ptx = src.ptx(arch).unwrap_or_else(|e| panic!("{arch}: {e}"));
            for l in &plans {
                src.check_launch(&ptx, l)
                    .unwrap_or_else(|e| panic!("{arch}: {e}"));
            }
            for e in &ptx.entries {
                assert!(
                    plans.iter().any(|l| l.kernel == e.name),
                    "{arch}: kernel {} has no plan",
                    e.name
                );
            }
        }
    }
}
