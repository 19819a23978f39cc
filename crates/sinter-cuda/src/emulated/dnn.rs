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
use crate::cudnn::{ConvProblem, Pass};
use crate::error::Result;

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
    /// Input coordinate read by output coordinate `out` at kernel tap `tap`, if inside.
    fn input(&self, out: usize, tap: usize, size: usize) -> Option<usize> {
        let v = (out * self.p.stride + tap * self.p.dilation) as isize - self.p.padding as isize;
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
                                let Some(h) = self.input(op, r, p.h) else {
                                    continue;
                                };
                                for oq in 0..self.ow {
                                    let Some(w) = self.input(oq, s, p.w) else {
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
