//! The launches the op wrappers plan, pinned: for a set of sample calls, every field of each
//! `Launch` (kernel file and name, grid, block, shared memory, argument bytes, declared traffic)
//! is compared with `tests/golden/launches.txt`, recorded from the hand-written plans before
//! the kernel table replaced them. A difference means a launch changed: the emulated results
//! and the GPU cost model's figures would move with it.
//!
//! After an intended change, rewrite the file with `SINTER_BLESS=1` and review its diff. The
//! kernels whose sources live beside their ops in sinter-core are pinned the same way there.

use sinter_cuda::alloc::DevSlice;
use sinter_cuda::golden::{self, launch_text};
use sinter_cuda::launch::{Launch, LaunchTarget, Step};
use sinter_cuda::ops::binary::{plan_binary, plan_binary_strided, BinaryOp, StridedIn};
use sinter_cuda::ops::boolean::{
    bool_reduce_dtype, plan_bool_binary, plan_bool_reduce, plan_fill_bool, plan_where_bool, BoolOp,
    DTYPES as BOOL_DTYPES,
};
use sinter_cuda::ops::conv::{
    plan_avgpool2d_backward, plan_avgpool2d_forward, plan_batchnorm_apply,
    plan_batchnorm_backward_dx, plan_batchnorm_backward_reduce, plan_batchnorm_stats, plan_col2im,
    plan_im2col, plan_maxpool2d_backward, plan_maxpool2d_forward, BnShape, Window2d,
};
use sinter_cuda::ops::copy::{plan_cast, plan_strided_copy};
use sinter_cuda::ops::dropout::{plan_dropout, plan_random};
use sinter_cuda::ops::embedding::{
    backward_scratch_len, plan_embedding_backward, plan_embedding_forward,
};
use sinter_cuda::ops::int::{
    plan_arange, plan_fill_i64, plan_gather_rows_i64, plan_index_check, plan_index_flat,
    plan_int_binary, plan_int_matmul, plan_int_reduce, IntReduce,
};
use sinter_cuda::ops::reduce::{
    plan_arg_last, plan_arg_mid, plan_sum_last, plan_sum_mid, sum_mid_scratch_len, ArgReduce,
};
use sinter_cuda::ops::unary::{plan_fill, plan_unary, plan_unary_backward, UnaryOp};
use sinter_cuda::DType;

/// Deterministic fake device slices: operand `k` of a call at its own address (never
/// dereferenced), so the recorded pointers do not depend on test order.
fn slice(k: u64, dtype: DType, len: usize) -> DevSlice<'static> {
    // SAFETY: only used to build launch plans, never dereferenced.
    unsafe { DevSlice::from_raw(0x7000_0000_0000 + k * 0x100_0000, len, dtype) }
}

fn step_text(s: &Step) -> String {
    match s {
        Step::Kernel(l) => launch_text(l),
        Step::Zero { ptr, bytes } => format!("zero {ptr:#x} {bytes}"),
        Step::Copy { src, dst, bytes } => format!("copy {src:#x} -> {dst:#x} {bytes}"),
    }
}

/// Collects one line per planned launch (or `none` / the error) under a call's label.
struct Record(Vec<String>);

impl Record {
    fn launch(&mut self, label: String, r: sinter_cuda::Result<Option<Launch>>) {
        let text = match r {
            Ok(Some(l)) => launch_text(&l),
            Ok(None) => "none".into(),
            Err(e) => format!("error {e}"),
        };
        self.0.push(format!("{label}: {text}"));
    }

    fn steps(&mut self, label: String, r: sinter_cuda::Result<Vec<Step>>) {
        match r {
            Ok(steps) if steps.is_empty() => self.0.push(format!("{label}: none")),
            Ok(steps) => {
                for (k, s) in steps.iter().enumerate() {
                    self.0.push(format!("{label} [{k}]: {}", step_text(s)));
                }
            }
            Err(e) => self.0.push(format!("{label}: error {e}")),
        }
    }

    fn step(&mut self, label: String, r: sinter_cuda::Result<Option<Step>>) {
        let text = match r {
            Ok(Some(s)) => step_text(&s),
            Ok(None) => "none".into(),
            Err(e) => format!("error {e}"),
        };
        self.0.push(format!("{label}: {text}"));
    }
}

fn strided<'a>(data: DevSlice<'a>, strides: &'a [i64]) -> StridedIn<'a> {
    StridedIn { data, strides }
}

fn elementwise(t: &LaunchTarget, r: &mut Record) {
    for d in DType::FLOATS {
        for n in [0usize, 1, 1000, 1 << 22] {
            for op in UnaryOp::all() {
                let (x, y, g) = (slice(0, d, n), slice(1, d, n), slice(2, d, n));
                r.launch(format!("unary {op:?} {d} {n}"), plan_unary(t, op, x, y));
                r.launch(
                    format!("unary_backward {op:?} {d} {n}"),
                    plan_unary_backward(t, op, x, y, g),
                );
            }
            r.launch(format!("fill {d} {n}"), plan_fill(t, slice(0, d, n), 0.25));
            for op in BinaryOp::ALL {
                let (a, b, o) = (slice(0, d, n), slice(1, d, n), slice(2, d, n));
                r.launch(
                    format!("binary {op:?} {d} {n}"),
                    plan_binary(t, op, a, b, o),
                );
            }
        }
        for op in BinaryOp::ALL {
            let (a, bias, o) = (slice(0, d, 32), slice(1, d, 8), slice(2, d, 32));
            let label = format!("binary_strided {op:?} {d}");
            let sa = strided(a, &[8, 1]);
            r.launch(
                label.clone() + " bias",
                plan_binary_strided(t, op, sa, strided(bias, &[0, 1]), o, &[4, 8]),
            );
            r.launch(
                label.clone() + " contiguous",
                plan_binary_strided(t, op, sa, strided(o, &[8, 1]), a, &[4, 8]),
            );
            r.launch(
                label + " transposed",
                plan_binary_strided(t, op, strided(a, &[1, 4]), sa, o, &[4, 8]),
            );
        }
    }
    r.launch(
        "unary mismatched".into(),
        plan_unary(
            t,
            UnaryOp::Exp,
            slice(0, DType::F32, 4),
            slice(1, DType::BF16, 4),
        ),
    );
}

fn boolean(t: &LaunchTarget, r: &mut Record) {
    let shape = [4usize, 8];
    for d in BOOL_DTYPES {
        let (sa, sb) = (
            strided(slice(0, d, 32), &[8, 1]),
            strided(slice(1, d, 8), &[0, 1]),
        );
        let out = slice(2, DType::Bool, 32);
        for op in BoolOp::ALL {
            r.launch(
                format!("bool_binary {op:?} {d}"),
                plan_bool_binary(t, op, sa, sb, out, &shape),
            );
        }
        let c = strided(slice(3, DType::Bool, 8), &[0, 1]);
        r.launch(
            format!("where {d}"),
            plan_where_bool(t, c, sa, sb, slice(4, d, 32), &shape),
        );
    }
    for n in [0usize, 5, 100_000] {
        r.launch(
            format!("fill_bool {n}"),
            plan_fill_bool(t, slice(0, DType::Bool, n), true),
        );
    }
    for op in [
        IntReduce::Sum,
        IntReduce::Max,
        IntReduce::Min,
        IntReduce::ArgMax,
    ] {
        let out = slice(1, bool_reduce_dtype(op), 8);
        r.launch(
            format!("bool_reduce {op:?}"),
            plan_bool_reduce(t, op, slice(0, DType::Bool, 32), out, 2, 4, 4),
        );
    }
}

fn copy(t: &LaunchTarget, r: &mut Record) {
    for d in DType::ALL {
        let (s, o) = (slice(0, d, 12), slice(1, d, 12));
        r.step(
            format!("strided_copy {d} transpose"),
            plan_strided_copy(t, s, &[1, 3], o, &[4, 1], &[3, 4]),
        );
        r.step(
            format!("strided_copy {d} wide rows"),
            plan_strided_copy(t, slice(2, d, 40), &[10, 1], o, &[4, 1], &[3, 4]),
        );
        r.step(
            format!("strided_copy {d} contiguous"),
            plan_strided_copy(t, s, &[4, 1], o, &[4, 1], &[3, 4]),
        );
    }
    for a in DType::ALL {
        for b in DType::ALL {
            for n in [0usize, 100, 1 << 20] {
                r.step(
                    format!("cast {a} {b} {n}"),
                    plan_cast(t, slice(0, a, n), slice(1, b, n)),
                );
            }
        }
    }
}

fn int(t: &LaunchTarget, r: &mut Record) {
    let i = DType::I64;
    for op in BinaryOp::ALL {
        let (sa, sb) = (
            strided(slice(0, i, 32), &[8, 1]),
            strided(slice(1, i, 8), &[0, 1]),
        );
        r.launch(
            format!("int_binary {op:?}"),
            plan_int_binary(t, op, sa, sb, slice(2, i, 32), &[4, 8]),
        );
    }
    for n in [0usize, 7, 1 << 20] {
        r.launch(
            format!("fill_i64 {n}"),
            plan_fill_i64(t, slice(0, i, n), -3),
        );
    }
    for d in [DType::F32, DType::F16, DType::BF16, DType::I64] {
        r.launch(
            format!("arange {d}"),
            plan_arange(t, slice(0, d, 50), 1.5, -0.25),
        );
    }
    for op in [
        IntReduce::Sum,
        IntReduce::Max,
        IntReduce::Min,
        IntReduce::ArgMax,
    ] {
        r.launch(
            format!("int_reduce {op:?}"),
            plan_int_reduce(t, op, slice(0, i, 60), slice(1, i, 12), 3, 5, 4),
        );
    }
    r.launch(
        "int_matmul".into(),
        plan_int_matmul(
            t,
            slice(0, i, 24),
            slice(1, i, 80),
            slice(2, i, 60),
            [2, 3, 10, 4],
        ),
    );
    r.launch(
        "index_flat".into(),
        plan_index_flat(t, slice(0, i, 6), slice(1, i, 18), 3, 9),
    );
    r.launch(
        "gather_rows_i64".into(),
        plan_gather_rows_i64(t, slice(0, i, 40), slice(1, i, 3), slice(2, i, 12), 10, 4),
    );
    for ignore in [None, Some(-100)] {
        r.launch(
            format!("index_check {ignore:?}"),
            plan_index_check(slice(0, i, 77), 50, ignore, 7, slice(1, i, 4)),
        );
    }
}

fn random(t: &LaunchTarget, r: &mut Record) {
    for d in DType::FLOATS {
        for n in [0usize, 1000] {
            r.launch(
                format!("dropout {d} {n}"),
                plan_dropout(t, slice(0, d, n), slice(1, d, n), 0.1, 42, 7),
            );
            for normal in [false, true] {
                r.launch(
                    format!("random {normal} {d} {n}"),
                    plan_random(t, normal, slice(0, d, n), 0.5, 2.0, 42, 7),
                );
            }
        }
    }
}

fn reduce(t: &LaunchTarget, r: &mut Record) {
    for d in DType::FLOATS {
        for (rows, n) in [(0usize, 5usize), (4, 1000), (3, 1), (1000, 50257), (7, 0)] {
            let (x, o, i) = (
                slice(0, d, rows * n),
                slice(1, d, rows),
                slice(2, DType::I64, rows),
            );
            r.launch(
                format!("sum_last {d} {rows}x{n}"),
                plan_sum_last(t, x, o, rows, n, 0.5),
            );
            for w in [ArgReduce::Max, ArgReduce::Min] {
                r.launch(
                    format!("arg_last {w:?} {d} {rows}x{n}"),
                    plan_arg_last(t, w, x, o, Some(i), rows, n),
                );
                r.launch(
                    format!("arg_last {w:?} {d} {rows}x{n} no idx"),
                    plan_arg_last(t, w, x, o, None, rows, n),
                );
            }
        }
        for [outer, n, inner] in [
            [0usize, 3, 4],
            [4, 10, 3],
            [4, 1000, 3],
            [1, 16384, 768],
            [5, 10, 1],
            [4096, 100, 64],
        ] {
            let oi = outer * inner;
            let (x, o) = (slice(0, d, oi * n), slice(1, d, oi));
            let part = sum_mid_scratch_len(t, outer, n, inner);
            let part = (part > 0).then(|| slice(3, DType::F32, part));
            r.steps(
                format!("sum_mid {d} {outer}x{n}x{inner}"),
                plan_sum_mid(t, x, o, part, outer, n, inner, 0.25),
            );
            for w in [ArgReduce::Max, ArgReduce::Min] {
                let i = slice(2, DType::I64, oi);
                r.launch(
                    format!("arg_mid {w:?} {d} {outer}x{n}x{inner}"),
                    plan_arg_mid(t, w, x, o, Some(i), outer, n, inner),
                );
            }
        }
    }
}

fn embedding(t: &LaunchTarget, r: &mut Record) {
    for d in DType::FLOATS {
        for (vocab, dim, count) in [
            (10usize, 8usize, 5usize),
            (50257, 768, 8192),
            (7, 3, 0),
            (5, 0, 4),
        ] {
            let (w, idx, out) = (
                slice(0, d, vocab * dim),
                slice(1, DType::I64, count),
                slice(2, d, count * dim),
            );
            r.launch(
                format!("embedding_forward {d} {vocab}x{dim} {count}"),
                plan_embedding_forward(t, w, idx, out, vocab, dim),
            );
            let scratch = slice(3, DType::I32, backward_scratch_len(vocab, count));
            for accumulate in [false, true] {
                r.steps(
                    format!("embedding_backward {d} {vocab}x{dim} {count} {accumulate}"),
                    plan_embedding_backward(t, out, idx, w, scratch, vocab, dim, accumulate),
                );
            }
        }
    }
}

fn conv(t: &LaunchTarget, r: &mut Record) {
    let windows = [
        Window2d {
            n: 2,
            c: 3,
            h: 8,
            w: 6,
            kernel: (3, 3),
            stride: (1, 1),
            padding: (1, 1),
            dilation: (1, 1),
            ceil_mode: false,
        },
        Window2d {
            n: 4,
            c: 64,
            h: 56,
            w: 56,
            kernel: (2, 3),
            stride: (2, 2),
            padding: (1, 0),
            dilation: (1, 2),
            ceil_mode: true,
        },
    ];
    for d in DType::FLOATS {
        for (k, g) in windows.iter().enumerate() {
            let (oh, ow) = g.out_hw().unwrap();
            let (nin, nout) = (g.n * g.c * g.h * g.w, g.n * g.c * oh * ow);
            let col = g.col_len().unwrap();
            let img = g.c * g.h * g.w;
            let (x, c, y) = (slice(0, d, nin), slice(1, d, col), slice(2, d, nout));
            let am = slice(3, DType::I64, nout);
            r.launch(format!("im2col {d} {k}"), plan_im2col(t, x, c, g, img));
            for acc in [false, true] {
                r.launch(
                    format!("col2im {d} {k} {acc}"),
                    plan_col2im(t, c, x, g, img, acc),
                );
            }
            r.launch(
                format!("maxpool {d} {k}"),
                plan_maxpool2d_forward(t, x, y, Some(am), g),
            );
            r.launch(
                format!("maxpool {d} {k} no argmax"),
                plan_maxpool2d_forward(t, x, y, None, g),
            );
            r.launch(
                format!("maxpool_backward {d} {k}"),
                plan_maxpool2d_backward(t, y, am, x, g),
            );
            for pad in [false, true] {
                r.launch(
                    format!("avgpool {d} {k} {pad}"),
                    plan_avgpool2d_forward(t, x, y, g, pad),
                );
                r.launch(
                    format!("avgpool_backward {d} {k} {pad}"),
                    plan_avgpool2d_backward(t, y, x, g, pad),
                );
            }
        }
        for s in [
            BnShape { n: 2, c: 3, hw: 10 },
            BnShape {
                n: 32,
                c: 256,
                hw: 196,
            },
            BnShape { n: 0, c: 3, hw: 4 },
        ] {
            let (nx, c) = (s.n * s.c * s.hw, s.c);
            let f = DType::F32;
            let (x, gy, dx, y) = (
                slice(0, d, nx),
                slice(1, d, nx),
                slice(2, d, nx),
                slice(3, d, nx),
            );
            let (mean, var, sg, sgx) = (
                slice(4, f, c),
                slice(5, f, c),
                slice(6, f, c),
                slice(7, f, c),
            );
            let (gamma, beta) = (slice(8, d, c), slice(9, d, c));
            let label = format!("{d} {}x{}x{}", s.n, s.c, s.hw);
            r.launch(
                format!("bn_stats {label}"),
                plan_batchnorm_stats(t, x, mean, var, &s),
            );
            r.launch(
                format!("bn_apply {label}"),
                plan_batchnorm_apply(t, x, mean, var, Some(gamma), Some(beta), y, &s),
            );
            r.launch(
                format!("bn_apply {label} affine-free"),
                plan_batchnorm_apply(t, x, mean, var, None, None, y, &s),
            );
            r.launch(
                format!("bn_bwd_reduce {label}"),
                plan_batchnorm_backward_reduce(t, x, gy, mean, var, sg, sgx, &s),
            );
            for gamma in [Some(gamma), None] {
                r.launch(
                    format!("bn_bwd_dx {label} {}", gamma.is_some()),
                    plan_batchnorm_backward_dx(t, x, gy, mean, var, gamma, sg, sgx, dx, &s),
                );
            }
        }
    }
}

#[test]
fn planned_launches_match_the_recorded_ones() {
    let mut r = Record(Vec::new());
    for sm_count in [1, 132] {
        let t = LaunchTarget { sm_count };
        r.0.push(format!("# sm_count {sm_count}"));
        elementwise(&t, &mut r);
        boolean(&t, &mut r);
        copy(&t, &mut r);
        int(&t, &mut r);
        random(&t, &mut r);
        reduce(&t, &mut r);
        embedding(&t, &mut r);
        conv(&t, &mut r);
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/launches.txt");
    golden::check(&path, &r.0);
}
