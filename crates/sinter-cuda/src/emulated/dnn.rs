//! The emulated device's cuDNN: 2-D cross-correlation forward, backward-data and
//! backward-filter on host memory, for the same [`ConvProblem`] descriptors (NCHW, square
//! stride / padding / dilation, groups, f32/f16/bf16 with f32 accumulation, output rounded once
//! to the dtype, beta = 0 as sinter calls cuDNN):
//!
//! ```text
//! y[n, o, p, q]   = Σ_{c in group(o), r, s} x[n, c, p·S − P + r·D, q·S − P + s·D] · w[o, c − g·Cg, r, s]
//! dx[n, c, h, w]  = Σ over every (o, p, q, r, s) whose window reads x[n, c, h, w] of dy · w
//! dw[o, c', r, s] = Σ_{n, p, q} x[n, g·Cg + c', p·S − P + r·D, q·S − P + s·D] · dy[n, o, p, q]
//! ```
//!
//! (padding reads zeros). A reference, written for clarity, not speed.

use super::blas::{load, store};
use super::cost::{Call, OpClass, Traffic};
use crate::cudnn::{ConvProblem, Pass};
use crate::error::Result;
use sinter_types::Hw;

/// A validated convolution pass with raw addresses, as the emulated device queues it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ConvJob {
    p: ConvProblem,
    pass: Pass,
    a: u64,
    b: u64,
    out: u64,
}

/// The index arithmetic of one problem.
struct Geometry {
    p: ConvProblem,
    oh: usize,
    ow: usize,
    cg: usize,
    og: usize,
}

impl Geometry {
    fn new(p: &ConvProblem) -> Result<Geometry> {
        let (oh, ow) = p.out_hw()?;
        Ok(Geometry {
            p: *p,
            oh,
            ow,
            cg: p.c / p.groups,
            og: p.o / p.groups,
        })
    }
    fn x_at(&self, n: usize, c: usize, h: usize, w: usize) -> usize {
        ((n * self.p.c + c) * self.p.h + h) * self.p.w + w
    }
    fn w_at(&self, o: usize, c: usize, r: usize, s: usize) -> usize {
        ((o * self.cg + c) * self.p.kh + r) * self.p.kw + s
    }
    fn y_at(&self, n: usize, o: usize, p: usize, q: usize) -> usize {
        ((n * self.p.o + o) * self.oh + p) * self.ow + q
    }
    /// Input row (`rows`) or column read by output coordinate `out` at kernel tap `tap`, if
    /// inside.
    fn input(&self, out: usize, tap: usize, rows: bool) -> Option<usize> {
        let p = &self.p;
        let pick = |v: Hw| if rows { v.h } else { v.w };
        let size = if rows { p.h } else { p.w };
        let v = (out * pick(p.stride) + tap * pick(p.dilation)) as isize - pick(p.padding) as isize;
        (v >= 0 && (v as usize) < size).then_some(v as usize)
    }
    /// Calls `f(x index, w index, y index)` for every product term x · w that feeds y.
    fn each_term(&self, mut f: impl FnMut(usize, usize, usize)) {
        let p = &self.p;
        for n in 0..p.n {
            for o in 0..p.o {
                let g = o / self.og;
                for cl in 0..self.cg {
                    let c = g * self.cg + cl;
                    for r in 0..p.kh {
                        for s in 0..p.kw {
                            for op in 0..self.oh {
                                let Some(h) = self.input(op, r, true) else {
                                    continue;
                                };
                                for oq in 0..self.ow {
                                    let Some(w) = self.input(oq, s, false) else {
                                        continue;
                                    };
                                    f(
                                        self.x_at(n, c, h, w),
                                        self.w_at(o, cl, r, s),
                                        self.y_at(n, o, op, oq),
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

impl ConvJob {
    /// Validate a pass as cuDNN would be called with it (`a`, `b`, `out` as in
    /// [`crate::cudnn`]: forward x, w → y; backward-data w, dy → dx; backward-filter x, dy → dw).
    pub(crate) fn new(p: &ConvProblem, pass: Pass, a: u64, b: u64, out: u64) -> ConvJob {
        ConvJob {
            p: *p,
            pass,
            a,
            b,
            out,
        }
    }

    /// Compute it.
    ///
    /// # Safety
    /// The addresses must be host memory holding the problem's operands (checked by the caller
    /// with `cudnn::check_operands`).
    pub(crate) unsafe fn run(&self) -> Result<()> {
        let geo = Geometry::new(&self.p)?;
        let d = self.p.dtype;
        let (nx, nw, ny) = self.p.numels()?;
        // SAFETY: sizes checked by the caller.
        let read = |base: u64, len: usize| -> Vec<f32> {
            (0..len).map(|i| unsafe { load(d, base, i) }).collect()
        };
        let acc = match self.pass {
            Pass::Forward => {
                let (x, w) = (read(self.a, nx), read(self.b, nw));
                let mut y = vec![0f32; ny];
                geo.each_term(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
                y
            }
            Pass::BackwardData => {
                let (w, dy) = (read(self.a, nw), read(self.b, ny));
                let mut dx = vec![0f32; nx];
                geo.each_term(|xi, wi, yi| dx[xi] += dy[yi] * w[wi]);
                dx
            }
            Pass::BackwardFilter => {
                let (x, dy) = (read(self.a, nx), read(self.b, ny));
                let mut dw = vec![0f32; nw];
                geo.each_term(|xi, wi, yi| dw[wi] += x[xi] * dy[yi]);
                dw
            }
        };
        for (i, v) in acc.into_iter().enumerate() {
            // SAFETY: as above.
            unsafe { store(d, self.out, i, v) };
        }
        Ok(())
    }
}

/// The cost of a cuDNN convolution pass: 2·N·O·(C/groups)·kh·kw·oh·ow FLOPs (tensor cores for
/// half types and TF32), every operand once.
pub(crate) fn conv_cost(p: &ConvProblem, pass: Pass) -> Call {
    let (oh, ow) = p.out_hw().unwrap_or((0, 0));
    let elem = p.dtype.size();
    let x = p.n * p.c * p.h * p.w;
    let w = p.o * (p.c / p.groups.max(1)) * p.kh * p.kw;
    let y = p.n * p.o * oh * ow;
    let flops = 2 * y * (p.c / p.groups.max(1)) * p.kh * p.kw;
    let (read, written, name) = match pass {
        Pass::Forward => (x + w, y, "fwd"),
        Pass::BackwardData => (y + w, x, "bwd-data"),
        Pass::BackwardFilter => (y + x, w, "bwd-filter"),
    };
    let t = Traffic::bytes(read * elem, written * elem);
    let tensor = p.dtype != crate::dtype::DType::F32 || p.allow_tf32;
    let t = if tensor {
        t.with_tensor_flops(flops)
    } else {
        t.with_flops(flops)
    };
    let key = format!(
        "conv {name} {} {}x{}x{}x{} k{}x{} o{}",
        p.dtype, p.n, p.c, p.h, p.w, p.kh, p.kw, p.o
    );
    Call::new(key, OpClass::Conv, t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;

    fn host(d: DType, v: &[f64]) -> Vec<u8> {
        let mut b = vec![0u8; v.len() * d.size()];
        for (i, &x) in v.iter().enumerate() {
            // SAFETY: `b` holds `v.len()` elements of `d`.
            unsafe { store(d, b.as_mut_ptr() as u64, i, x as f32) };
        }
        b
    }

    fn read(d: DType, b: &[u8]) -> Vec<f64> {
        // SAFETY: `b` holds whole elements of `d`.
        (0..b.len() / d.size())
            .map(|i| unsafe { load(d, b.as_ptr() as u64, i) } as f64)
            .collect()
    }

    /// Inputs exactly representable in `d` (so the f64 reference sees what the kernel saw).
    fn inputs(d: DType, n: usize, seed: u64) -> Vec<f64> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let v: Vec<f64> = (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
            })
            .collect();
        read(d, &host(d, &v))
    }

    /// The three passes in f64, each written in gather form from the definitions (independent
    /// of the scatter the implementation uses): (y, dx, dw) and, per element, the sum of the
    /// magnitudes of its terms (for the tolerance).
    #[allow(clippy::type_complexity)]
    fn reference(p: &ConvProblem, x: &[f64], w: &[f64], dy: &[f64]) -> [(Vec<f64>, Vec<f64>); 3] {
        let (oh, ow) = p.out_hw().unwrap();
        let (cg, og) = (p.c / p.groups, p.o / p.groups);
        let xi = |n: usize, c: usize, h: usize, ww: usize| ((n * p.c + c) * p.h + h) * p.w + ww;
        let wi = |o: usize, c: usize, r: usize, s: usize| ((o * cg + c) * p.kh + r) * p.kw + s;
        let yi = |n: usize, o: usize, a: usize, b: usize| ((n * p.o + o) * oh + a) * ow + b;
        // (stride, padding, dilation) of the rows (true) or the columns.
        let axis = |rows: bool| {
            let pick = |v: Hw| (if rows { v.h } else { v.w }) as i64;
            (pick(p.stride), pick(p.padding), pick(p.dilation))
        };
        // Input row/column read by output position `out` at tap `tap`.
        let at = |out: usize, tap: usize, size: usize, rows: bool| -> Option<usize> {
            let (s, pd, d) = axis(rows);
            let v = out as i64 * s + tap as i64 * d - pd;
            (0..size as i64).contains(&v).then_some(v as usize)
        };
        // Output position whose tap `tap` reads input `inp`.
        let from = |inp: usize, tap: usize, size: usize, rows: bool| -> Option<usize> {
            let (s, pd, d) = axis(rows);
            let v = inp as i64 + pd - tap as i64 * d;
            (v >= 0 && v % s == 0 && ((v / s) as usize) < size).then_some((v / s) as usize)
        };
        let mut y = (
            vec![0.0; p.n * p.o * oh * ow],
            vec![0.0; p.n * p.o * oh * ow],
        );
        let mut dx = (vec![0.0; x.len()], vec![0.0; x.len()]);
        let mut dw = (vec![0.0; w.len()], vec![0.0; w.len()]);
        for n in 0..p.n {
            for o in 0..p.o {
                let g = o / og;
                for a in 0..oh {
                    for b in 0..ow {
                        for cl in 0..cg {
                            for r in 0..p.kh {
                                for s in 0..p.kw {
                                    let (Some(h), Some(ww)) =
                                        (at(a, r, p.h, true), at(b, s, p.w, false))
                                    else {
                                        continue;
                                    };
                                    let t = x[xi(n, g * cg + cl, h, ww)] * w[wi(o, cl, r, s)];
                                    y.0[yi(n, o, a, b)] += t;
                                    y.1[yi(n, o, a, b)] += t.abs();
                                }
                            }
                        }
                    }
                }
            }
            for c in 0..p.c {
                let g = c / cg;
                for h in 0..p.h {
                    for ww in 0..p.w {
                        for ol in 0..og {
                            let o = g * og + ol;
                            for r in 0..p.kh {
                                for s in 0..p.kw {
                                    let (Some(a), Some(b)) =
                                        (from(h, r, oh, true), from(ww, s, ow, false))
                                    else {
                                        continue;
                                    };
                                    let t = dy[yi(n, o, a, b)] * w[wi(o, c - g * cg, r, s)];
                                    dx.0[xi(n, c, h, ww)] += t;
                                    dx.1[xi(n, c, h, ww)] += t.abs();
                                }
                            }
                        }
                    }
                }
            }
        }
        for o in 0..p.o {
            let g = o / og;
            for cl in 0..cg {
                for r in 0..p.kh {
                    for s in 0..p.kw {
                        for n in 0..p.n {
                            for a in 0..oh {
                                for b in 0..ow {
                                    let (Some(h), Some(ww)) =
                                        (at(a, r, p.h, true), at(b, s, p.w, false))
                                    else {
                                        continue;
                                    };
                                    let t = x[xi(n, g * cg + cl, h, ww)] * dy[yi(n, o, a, b)];
                                    dw.0[wi(o, cl, r, s)] += t;
                                    dw.1[wi(o, cl, r, s)] += t.abs();
                                }
                            }
                        }
                    }
                }
            }
        }
        [y, dx, dw]
    }

    #[test]
    fn host_conv_matches_f64_across_the_descriptor_space() {
        let base = ConvProblem {
            n: 2,
            c: 4,
            h: 7,
            w: 6,
            o: 6,
            kh: 3,
            kw: 3,
            stride: Hw::square(1),
            padding: Hw::square(1),
            dilation: Hw::square(1),
            groups: 1,
            dtype: DType::F32,
            allow_tf32: false,
        };
        let variants = [
            base,
            ConvProblem {
                stride: Hw::square(2),
                ..base
            },
            ConvProblem {
                padding: Hw::square(0),
                kw: 2,
                ..base
            },
            ConvProblem {
                dilation: Hw::square(2),
                padding: Hw::square(2),
                ..base
            },
            ConvProblem { groups: 2, ..base },
            ConvProblem {
                groups: 2,
                stride: Hw::square(2),
                dilation: Hw::square(2),
                padding: Hw::square(0),
                h: 9,
                w: 8,
                ..base
            },
            ConvProblem {
                c: 1,
                o: 1,
                kh: 1,
                kw: 1,
                padding: Hw::square(0),
                ..base
            },
            ConvProblem {
                kh: 5,
                kw: 1,
                stride: Hw::square(3),
                padding: Hw::square(2),
                n: 1,
                ..base
            },
            ConvProblem {
                kh: 3,
                kw: 2,
                stride: Hw::new(2, 1),
                padding: Hw::new(0, 1),
                dilation: Hw::new(1, 2),
                h: 8,
                w: 7,
                ..base
            },
        ];
        for v in variants {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                let p = ConvProblem { dtype, ..v };
                p.validate().unwrap();
                let (nx, nw, ny) = p.numels().unwrap();
                let (x, w, dy) = (
                    inputs(dtype, nx, 1),
                    inputs(dtype, nw, 2),
                    inputs(dtype, ny, 3),
                );
                let refs = reference(&p, &x, &w, &dy);
                let rtol = match dtype {
                    DType::F32 => 2e-6,
                    DType::F16 => 2e-3,
                    _ => 1.6e-2,
                };
                for (k, (pass, a, b, n_out)) in [
                    (Pass::Forward, &x, &w, ny),
                    (Pass::BackwardData, &w, &dy, nx),
                    (Pass::BackwardFilter, &x, &dy, nw),
                ]
                .into_iter()
                .enumerate()
                {
                    let (ha, hb) = (host(dtype, a), host(dtype, b));
                    let mut out = host(dtype, &vec![f64::NAN; n_out]);
                    let job = ConvJob::new(
                        &p,
                        pass,
                        ha.as_ptr() as u64,
                        hb.as_ptr() as u64,
                        out.as_mut_ptr() as u64,
                    );
                    // SAFETY: live host arrays of the problem's sizes.
                    unsafe { job.run().unwrap() };
                    let got = read(dtype, &out);
                    let (want, mag) = &refs[k];
                    for i in 0..n_out {
                        let tol = rtol * (mag[i] + want[i].abs()) + 1e-6;
                        assert!(
                            (got[i] - want[i]).abs() <= tol,
                            "{pass:?} {p:?}: element {i}: got {}, want {}",
                            got[i],
                            want[i]
                        );
                    }
                }
            }
        }
    }
}
