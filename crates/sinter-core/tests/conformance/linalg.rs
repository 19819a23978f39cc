//! matmul (plain, batched, broadcast batch, transposed and narrowed operands; TF32), conv2d
//! (every geometry; cuDNN and im2col on CUDA) and 2-D pooling.

use crate::harness::*;
use crate::reference::{self as r, Arr, Conv, Pool};
use sinter_core::cuda;
use sinter_core::{Conv2dParams, Hw, Pool2dParams, Result, Rng, Tensor};

pub fn cases() -> Vec<Case> {
    vec![
        case("matmul", FLOATS, matmul),
        case("matmul_integer", I64, matmul_integer),
        case("matmul_large", FLOATS, matmul_large),
        case("matmul_tf32", F32, matmul_tf32).cuda_only().exclusive(),
        case("matmul_padded", FLOATS, matmul_padded).cuda_only().exclusive(),
        case("conv2d", FLOATS, conv2d),
        case("conv2d_random", FLOATS, conv2d_random),
        case("conv2d_one_side", FLOATS, conv2d_one_side),
        case("conv2d_cudnn_and_im2col", FLOATS, conv2d_cudnn_and_im2col).cuda_only().exclusive(),
        case("conv2d_chunked", F32, conv2d_chunked)
            .cuda_only()
            .real_gpu("its im2col column matrix must exceed 32M elements to split; far too large for the emulator"),
        case("pool2d", FLOATS, pool2d),
    ]
}

type Graph = fn(&[Tensor]) -> Result<Tensor>;
type RefGraph = fn(&[Arr]) -> Arr;

/// (name, operand shapes, op, reference).
fn matmul_cases() -> Vec<(&'static str, [&'static [usize]; 2], Graph, RefGraph)> {
    let mm: Graph = |t| t[0].matmul(&t[1]);
    let rm: RefGraph = |x| r::matmul(&x[0], &x[1]);
    vec![
        ("2-D", [&[3, 4], &[4, 5]], mm, rm),
        ("1x1", [&[1, 1], &[1, 1]], mm, rm),
        ("batched", [&[2, 3, 4], &[2, 4, 5]], mm, rm),
        (
            "batched × shared (one tall GEMM)",
            [&[2, 5, 7], &[7, 3]],
            mm,
            rm,
        ),
        ("shared × batched", [&[5, 7], &[3, 7, 2]], mm, rm),
        ("broadcast batch dims", [&[2, 1, 3, 4], &[5, 4, 2]], mm, rm),
        (
            "broadcast batch dims 2",
            [&[3, 1, 4, 6], &[2, 6, 5]],
            mm,
            rm,
        ),
        ("one of a batch", [&[1, 3, 4], &[2, 4, 5]], mm, rm),
        ("column", [&[2, 3, 7], &[7, 1]], mm, rm),
        ("vector-like", [&[1, 9], &[9, 1]], mm, rm),
        (
            "aᵀ · bᵀ",
            [&[7, 5], &[3, 7]],
            |t| t[0].t()?.matmul(&t[1].t()?),
            |x| r::matmul(&x[0].t(), &x[1].t()),
        ),
        (
            "x · Wᵀ (linear)",
            [&[2, 3, 8], &[6, 8]],
            |t| t[0].matmul(&t[1].t()?),
            |x| r::matmul(&x[0], &x[1].t()),
        ),
        (
            "narrowed views",
            [&[5, 10], &[9, 4]],
            |t| t[0].narrow(1, 2, 7)?.matmul(&t[1].narrow(0, 1, 7)?),
            |x| r::matmul(&x[0].narrow(1, 2, 7), &x[1].narrow(0, 1, 7)),
        ),
        (
            "narrow · batched bᵀ",
            [&[3, 8], &[2, 5, 4]],
            |t| t[0].narrow(1, 3, 4)?.matmul(&t[1].transpose(1, 2)?),
            |x| r::matmul(&x[0].narrow(1, 3, 4), &x[1].transpose(1, 2)),
        ),
        (
            "attention scores",
            [&[2, 3, 4, 8], &[2, 3, 6, 8]],
            |t| t[0].matmul(&t[1].t()?),
            |x| r::matmul(&x[0], &x[1].t()),
        ),
        (
            "permuted batch",
            [&[3, 2, 4, 5], &[2, 3, 5, 4]],
            |t| t[0].permute(&[1, 0, 2, 3])?.matmul(&t[1]),
            |x| r::matmul(&x[0].permute(&[1, 0, 2, 3]), &x[1]),
        ),
        (
            "permuted · b",
            [&[4, 2, 3], &[4, 5]],
            |t| t[0].permute(&[1, 2, 0])?.matmul(&t[1]),
            |x| r::matmul(&x[0].permute(&[1, 2, 0]), &x[1]),
        ),
        ("larger", [&[64, 96], &[96, 80]], mm, rm),
        // 1-D operands (torch.matmul): a row on the left, a column on the right, squeezed out.
        ("vector · matrix", [&[4], &[4, 5]], mm, |x| {
            r::matmul(&x[0].reshape(&[1, 4]), &x[1]).reshape(&[5])
        }),
        ("matrix · vector", [&[3, 4], &[4]], mm, |x| {
            r::matmul(&x[0], &x[1].reshape(&[4, 1])).reshape(&[3])
        }),
        ("vector · vector", [&[6], &[6]], mm, |x| {
            r::matmul(&x[0].reshape(&[1, 6]), &x[1].reshape(&[6, 1])).reshape(&[])
        }),
        ("vector · batch", [&[4], &[2, 4, 3]], mm, |x| {
            r::matmul(&x[0].reshape(&[1, 4]), &x[1]).reshape(&[2, 3])
        }),
        ("batch · vector", [&[2, 3, 4], &[4]], mm, |x| {
            r::matmul(&x[0], &x[1].reshape(&[4, 1])).reshape(&[2, 3])
        }),
    ]
}

/// Every product of the table on i64 operands: exact (the values keep every sum far below
/// 2^53, so the f64 reference is exact too); integer products have no gradient.
fn matmul_integer(t: &Target) {
    let mut rng = t.rng(33);
    let ints = |rng: &mut Rng, s: &[usize]| uniform(rng, s, -60.0, 60.0).map(f64::round);
    for (name, [sa, sb], f, rf) in matmul_cases() {
        let inputs = [In::Fixed(ints(&mut rng, sa)), In::Fixed(ints(&mut rng, sb))];
        t.check_with(name, EXACT, &inputs, f, |x, _| rf(x));
    }
}

fn matmul(t: &Target) {
    let mut rng = t.rng(30);
    for (name, [sa, sb], f, rf) in matmul_cases() {
        let inputs = [
            In::Var(uniform(&mut rng, sa, -1.0, 1.0)),
            In::Var(uniform(&mut rng, sb, -1.0, 1.0)),
        ];
        t.check(name, &inputs, f, |x, _| rf(x));
    }
}

/// One large product (the CPU's gemm splits it across threads) and many medium ones.
fn matmul_large(t: &Target) {
    let mut rng = t.rng(31);
    let (a, b) = (
        uniform(&mut rng, &[96, 128], -1.0, 1.0),
        uniform(&mut rng, &[96, 112], -1.0, 1.0),
    );
    t.check(
        "aᵀ · b 128×96×112",
        &[In::Fixed(a), In::Fixed(b)],
        |x| x[0].t()?.matmul(&x[1]),
        |x, _| r::matmul(&x[0].t(), &x[1]),
    );
    let (a, b) = (
        uniform(&mut rng, &[4, 48, 64], -1.0, 1.0),
        uniform(&mut rng, &[4, 64, 40], -1.0, 1.0),
    );
    t.check(
        "batched 4×48×64×40",
        &[In::Fixed(a), In::Fixed(b)],
        |x| x[0].matmul(&x[1]),
        |x, _| r::matmul(&x[0], &x[1]),
    );
}

/// TF32 products: inputs rounded to 10 mantissa bits (u = 2^-11) before an f32 accumulation,
/// so 1e-3 (about two TF32 units) instead of the f32 tolerance.
fn matmul_tf32(t: &Target) {
    cuda::set_allow_tf32(true);
    let mut rng = t.rng(32);
    let tf32 = Opts {
        f32_tol: Some(1e-3),
        ..Opts::default()
    };
    for (name, [sa, sb], f, rf) in matmul_cases() {
        let inputs = [
            In::Var(uniform(&mut rng, sa, -1.0, 1.0)),
            In::Var(uniform(&mut rng, sb, -1.0, 1.0)),
        ];
        t.check_with(&format!("tf32 {name}"), tf32, &inputs, f, |x, _| rf(x));
    }
    cuda::set_allow_tf32(false);
}

/// Products whose sizes or rows are not 16-byte aligned, forced onto zero-padded aligned copies
/// (`GemmPadding::Always`), values and gradients: odd m, n and k alone and together, transposed,
/// batched, shared, broadcast and offset operands, each checked to have taken the padded path;
/// then one product large enough for the default rule to pad, and a small one it leaves alone.
/// A padded k must be zero in A and B: the emulated device fills fresh memory with NaN, so
/// padding left as allocated fails every odd-k case here.
fn matmul_padded(t: &Target) {
    let mut rng = t.rng(34);
    let odd: Vec<(&str, [&[usize]; 2], Graph, RefGraph)> = vec![
        (
            "odd m only",
            [&[5, 8], &[8, 8]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "odd n only",
            [&[8, 8], &[8, 5]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "odd k only",
            [&[8, 7], &[7, 8]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "aᵀ · bᵀ odd k only",
            [&[7, 8], &[8, 7]],
            |t| t[0].t()?.matmul(&t[1].t()?),
            |x| r::matmul(&x[0].t(), &x[1].t()),
        ),
        (
            "batched odd k only",
            [&[3, 8, 7], &[3, 7, 8]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "odd m, n, k",
            [&[5, 7], &[7, 9]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "aᵀ · bᵀ odd",
            [&[7, 5], &[9, 7]],
            |t| t[0].t()?.matmul(&t[1].t()?),
            |x| r::matmul(&x[0].t(), &x[1].t()),
        ),
        (
            "batched odd",
            [&[3, 5, 7], &[3, 7, 9]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "batched · shared odd (one tall GEMM)",
            [&[2, 5, 7], &[7, 9]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "shared · batched odd",
            [&[5, 7], &[3, 7, 9]],
            |t| t[0].matmul(&t[1]),
            |x| r::matmul(&x[0], &x[1]),
        ),
        (
            "x · Wᵀ odd (LM head)",
            [&[2, 3, 7], &[11, 7]],
            |t| t[0].matmul(&t[1].t()?),
            |x| r::matmul(&x[0], &x[1].t()),
        ),
        (
            "batched aᵀ odd",
            [&[3, 7, 5], &[3, 7, 9]],
            |t| t[0].transpose(1, 2)?.matmul(&t[1]),
            |x| r::matmul(&x[0].transpose(1, 2), &x[1]),
        ),
        (
            "offset views",
            [&[5, 10], &[9, 8]],
            |t| t[0].narrow(1, 1, 7)?.matmul(&t[1].narrow(0, 1, 7)?),
            |x| r::matmul(&x[0].narrow(1, 1, 7), &x[1].narrow(0, 1, 7)),
        ),
    ];
    cuda::set_gemm_padding(cuda::GemmPadding::Always);
    for (name, [sa, sb], f, rf) in odd {
        let before = cuda::padded_gemms();
        let inputs = [
            In::Var(uniform(&mut rng, sa, -1.0, 1.0)),
            In::Var(uniform(&mut rng, sb, -1.0, 1.0)),
        ];
        t.check(&format!("padded {name}"), &inputs, f, |x, _| rf(x));
        assert!(
            cuda::padded_gemms() > before,
            "{name}: no GEMM took the padded path"
        );
    }
    // The whole table too (its aligned products take the plain path).
    matmul(t);
    cuda::set_gemm_padding(cuda::GemmPadding::Auto);
    // x · Wᵀ with 257 inputs: 1152 x 1152 x 257 is just over the default threshold (2^28
    // multiply-adds, 144 per copied f32 byte), and only k is misaligned: x and W are copied
    // with zero-filled columns.
    let (x, w) = (
        uniform(&mut rng, &[1152, 257], -1.0, 1.0),
        uniform(&mut rng, &[1152, 257], -1.0, 1.0),
    );
    let before = cuda::padded_gemms();
    t.check(
        "auto-padded x · Wᵀ 1152×257×1152",
        &[In::Fixed(x), In::Fixed(w)],
        |x| x[0].matmul(&x[1].t()?),
        |x, _| r::matmul(&x[0], &x[1].t()),
    );
    assert_eq!(cuda::padded_gemms(), before + 1, "the large GEMM is padded");
    let (a, b) = (
        uniform(&mut rng, &[64, 63], -1.0, 1.0),
        uniform(&mut rng, &[63, 65], -1.0, 1.0),
    );
    t.check(
        "auto small odd 64×63×65",
        &[In::Fixed(a), In::Fixed(b)],
        |x| x[0].matmul(&x[1]),
        |x, _| r::matmul(&x[0], &x[1]),
    );
    assert_eq!(
        cuda::padded_gemms(),
        before + 1,
        "a small GEMM is not padded"
    );
}

// ---- conv2d -----------------------------------------------------------------------------------

/// (n, c, h, w, o, kh, kw, stride h, stride w, padding h, padding w, dilation h, dilation w,
/// groups)
type ConvCase = [usize; 14];

/// A square geometry: (n, c, h, w, o, kh, kw, stride, padding, dilation, groups).
const fn sq(c: [usize; 11]) -> ConvCase {
    [
        c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[7], c[8], c[8], c[9], c[9], c[10],
    ]
}

const CONV_CASES: &[ConvCase] = &[
    sq([2, 3, 7, 6, 4, 3, 3, 1, 0, 1, 1]),
    sq([2, 3, 8, 8, 5, 3, 3, 2, 1, 1, 1]),
    sq([1, 2, 9, 7, 3, 3, 2, 1, 2, 2, 1]),
    sq([2, 4, 7, 7, 6, 3, 3, 2, 1, 1, 2]),
    sq([3, 4, 6, 5, 8, 3, 3, 1, 1, 1, 4]),
    sq([2, 6, 10, 9, 4, 2, 3, 3, 0, 2, 2]),
    sq([1, 2, 5, 5, 3, 1, 1, 1, 0, 1, 1]),
    sq([1, 2, 4, 4, 2, 4, 4, 1, 0, 1, 1]),
    sq([4, 8, 5, 5, 16, 1, 1, 1, 0, 1, 1]),
    sq([2, 16, 12, 12, 32, 3, 3, 2, 1, 1, 1]),
    // Several CPU blocks of about 256 output pixels, the last one partial.
    sq([37, 2, 8, 8, 3, 3, 3, 1, 1, 1, 1]),
    sq([66, 4, 4, 4, 6, 3, 3, 1, 1, 1, 2]),
    // "Same" stride-1 convolutions of planes above 64 pixels (the CPU's flat im2col path).
    sq([3, 2, 10, 10, 4, 3, 3, 1, 1, 1, 1]),
    sq([12, 2, 9, 12, 3, 5, 5, 1, 2, 1, 1]),
    // Per-axis geometry (issue 14): non-square kernels with unequal strides, paddings and
    // dilations, through the CPU's tap table (small planes), its row path (large planes, and
    // stride 1 along one axis only, where the flat path must not apply) and groups.
    [2, 3, 7, 9, 4, 3, 1, 2, 1, 1, 0, 1, 1, 1],
    [2, 2, 6, 11, 3, 1, 5, 1, 2, 0, 2, 1, 1, 1],
    [1, 2, 9, 8, 2, 3, 2, 1, 2, 2, 0, 1, 3, 1],
    [3, 4, 12, 10, 4, 3, 3, 1, 2, 1, 1, 2, 1, 2],
    [2, 2, 16, 14, 3, 2, 3, 1, 1, 0, 1, 1, 1, 1],
    [2, 2, 14, 13, 3, 5, 3, 1, 1, 2, 1, 1, 1, 1],
    [40, 1, 5, 6, 2, 3, 2, 2, 1, 1, 1, 1, 2, 1],
];

fn params(c: &ConvCase) -> (Conv2dParams, Conv) {
    let (stride, padding, dilation, groups) = ([c[7], c[8]], [c[9], c[10]], [c[11], c[12]], c[13]);
    let hw = |v: [usize; 2]| Hw::new(v[0], v[1]);
    (
        Conv2dParams {
            stride: hw(stride),
            padding: hw(padding),
            dilation: hw(dilation),
            groups,
        },
        Conv {
            stride,
            padding,
            dilation,
            groups,
        },
    )
}

/// A random geometry (independent per axis) whose input is always large enough.
fn random_conv_case(rng: &mut Rng) -> ConvCase {
    let r = |rng: &mut Rng, lo: usize, hi: usize| lo + rng.below((hi - lo + 1) as u64) as usize;
    let (groups, cg, og) = (r(rng, 1, 3), r(rng, 1, 3), r(rng, 1, 3));
    let axis = |rng: &mut Rng| {
        let (k, stride, padding, dilation) =
            (r(rng, 1, 3), r(rng, 1, 3), r(rng, 0, 2), r(rng, 1, 2));
        let size = (dilation * (k - 1) + 1).saturating_sub(2 * padding).max(1) + r(rng, 0, 4);
        (size, k, stride, padding, dilation)
    };
    let (h, kh, sh, ph, dh) = axis(rng);
    let (w, kw, sw, pw, dw) = axis(rng);
    [
        r(rng, 1, 3),
        groups * cg,
        h,
        w,
        groups * og,
        kh,
        kw,
        sh,
        sw,
        ph,
        pw,
        dh,
        dw,
        groups,
    ]
}

fn conv_inputs(rng: &mut Rng, c: &ConvCase) -> (Arr, Arr) {
    let &[n, ch, h, w, o, kh, kw, .., groups] = c;
    (
        uniform(rng, &[n, ch, h, w], -1.0, 1.0),
        uniform(rng, &[o, ch / groups, kh, kw], -0.5, 0.5),
    )
}

fn check_conv(t: &Target, what: &str, c: &ConvCase, x: Arr, w: Arr) {
    let (p, rp) = params(c);
    t.check(
        what,
        &[In::Var(x), In::Var(w)],
        move |v| v[0].conv2d(&v[1], p),
        move |v, _| r::conv2d(&v[0], &v[1], rp),
    );
}

fn conv2d(t: &Target) {
    let mut rng = t.rng(33);
    for c in CONV_CASES {
        let (x, w) = conv_inputs(&mut rng, c);
        check_conv(t, &format!("conv2d {c:?}"), c, x, w);
        // Channels-last data viewed as NCHW and a permuted weight: non-contiguous operands.
        let &[n, ch, h, wd, o, kh, kw, .., g] = c;
        let (p, rp) = params(c);
        t.check(
            &format!("conv2d strided {c:?}"),
            &[
                In::Var(uniform(&mut rng, &[n, h, wd, ch], -1.0, 1.0)),
                In::Var(uniform(&mut rng, &[kh, kw, o, ch / g], -0.5, 0.5)),
            ],
            move |v| {
                v[0].permute(&[0, 3, 1, 2])?
                    .conv2d(&v[1].permute(&[2, 3, 0, 1])?, p)
            },
            move |v, _| {
                r::conv2d(
                    &v[0].permute(&[0, 3, 1, 2]),
                    &v[1].permute(&[2, 3, 0, 1]),
                    rp,
                )
            },
        );
    }
}

fn conv2d_random(t: &Target) {
    let mut rng = t.rng(34);
    for _ in 0..8 {
        let c = random_conv_case(&mut rng);
        let (x, w) = conv_inputs(&mut rng, &c);
        check_conv(t, &format!("conv2d random {c:?}"), &c, x, w);
    }
    // A batch larger than the CPU backward's sample chunk (8): the weight gradient sums chunks.
    let c = sq([19, 2, 5, 5, 3, 3, 3, 2, 1, 1, 1]);
    let (x, w) = conv_inputs(&mut rng, &c);
    check_conv(t, "conv2d batch 19", &c, x, w);
}

/// Only the weight, or only the input, tracks gradients.
fn conv2d_one_side(t: &Target) {
    let mut rng = t.rng(35);
    let c = sq([2, 3, 6, 6, 2, 3, 3, 1, 1, 1, 1]);
    let (p, rp) = params(&c);
    let (x, w) = conv_inputs(&mut rng, &c);
    let f = move |v: &[Tensor]| v[0].conv2d(&v[1], p);
    let rf = move |v: &[Arr], _: &Rd| r::conv2d(&v[0], &v[1], rp);
    t.check(
        "weight only",
        &[In::Fixed(x.clone()), In::Var(w.clone())],
        f,
        rf,
    );
    t.check("input only", &[In::Var(x), In::Fixed(w)], f, rf);
}

/// Both CUDA convolution paths against the reference, and which one ran: cuDNN's three passes
/// under `Auto` (when cuDNN loads), none under `Im2col`.
fn conv2d_cudnn_and_im2col(t: &Target) {
    let mut rng = t.rng(36);
    for c in CONV_CASES {
        let (x, w) = conv_inputs(&mut rng, c);
        for backend in [cuda::ConvBackend::Im2col, cuda::ConvBackend::Auto] {
            cuda::set_conv_backend(backend);
            let before = cuda::cudnn_conv_passes();
            check_conv(t, &format!("{backend:?} {c:?}"), c, x.clone(), w.clone());
            let ran = cuda::cudnn_conv_passes() - before;
            let want = if backend == cuda::ConvBackend::Auto && cuda::cudnn_available() {
                3
            } else {
                0
            };
            assert_eq!(
                ran, want,
                "{backend:?} {c:?}: cuDNN passes (forward, backward-data, backward-filter)"
            );
        }
    }
    cuda::set_conv_backend(cuda::ConvBackend::Auto);
}

/// 96 images of a 64-channel 3×3 conv over 32×32: a column matrix larger than one chunk.
fn conv2d_chunked(t: &Target) {
    cuda::set_conv_backend(cuda::ConvBackend::Im2col);
    let mut rng = t.rng(37);
    let c = sq([96, 64, 32, 32, 8, 3, 3, 1, 1, 1, 1]);
    let (x, w) = conv_inputs(&mut rng, &c);
    let (p, rp) = params(&c);
    t.check(
        "conv2d chunked",
        &[In::Fixed(x), In::Fixed(w)],
        move |v| v[0].conv2d(&v[1], p),
        move |v, _| r::conv2d(&v[0], &v[1], rp),
    );
    cuda::set_conv_backend(cuda::ConvBackend::Auto);
}

// ---- pooling ----------------------------------------------------------------------------------

/// kernel, stride, padding, dilation ([rows, columns]), ceil mode, count_include_pad.
type PoolCase = ([usize; 2], [usize; 2], [usize; 2], [usize; 2], bool, bool);

const POOL_CASES: &[PoolCase] = &[
    ([2, 2], [2, 2], [0, 0], [1, 1], false, true),
    ([3, 3], [2, 2], [1, 1], [1, 1], false, true),
    ([3, 3], [1, 1], [1, 1], [1, 1], false, true),
    ([2, 2], [1, 1], [1, 1], [1, 1], false, true),
    ([4, 4], [3, 3], [2, 2], [1, 1], false, true),
    ([3, 3], [3, 3], [0, 0], [1, 1], false, true),
    // Per axis (issue 14), floor and ceil.
    ([3, 2], [2, 1], [1, 0], [1, 1], false, true),
    ([3, 2], [2, 1], [1, 0], [1, 1], true, true),
    // Ceil mode: a last window hanging past the input (6 and 8 wide: windows at 0, 2, 4 of
    // 3 taps), whose average divides by the taps inside the padded input only.
    ([3, 3], [2, 2], [0, 0], [1, 1], true, true),
    // Ceil mode where the extra window would start in the right padding: 7 rows, kernel 2,
    // stride 2, padding 1 give 4 windows either way (PyTorch drops the fifth).
    ([2, 2], [2, 2], [1, 1], [1, 1], true, true),
    // And along 8 columns with kernel 3, stride 3, padding 1 (a fourth window would start at
    // column 8, in the padding: dropped).
    ([3, 3], [3, 3], [1, 1], [1, 1], true, false),
    // count_include_pad off: the divisor counts input pixels only.
    ([2, 3], [1, 2], [1, 1], [1, 1], true, false),
    ([3, 3], [2, 2], [1, 1], [1, 1], false, false),
    // Dilation (max pooling only), with padding and ceil mode.
    ([2, 2], [1, 2], [0, 1], [2, 1], true, true),
    ([3, 2], [2, 1], [1, 1], [2, 3], false, true),
];

fn pool2d(t: &Target) {
    let mut rng = t.rng(38);
    for &(kernel, stride, padding, dilation, ceil_mode, count_include_pad) in POOL_CASES {
        let hw = |v: [usize; 2]| Hw::new(v[0], v[1]);
        let p = Pool2dParams {
            kernel: hw(kernel),
            stride: hw(stride),
            padding: hw(padding),
            dilation: hw(dilation),
            ceil_mode,
            count_include_pad,
        };
        let rp = Pool {
            kernel,
            stride,
            padding,
            dilation,
            ceil_mode,
            count_include_pad,
        };
        for shape in [[2, 3, 7, 6], [1, 2, 8, 8]] {
            let [n, c, h, w] = shape;
            // Distinct values (max-pool never ties), also all negative: padding is no zero.
            let inputs: [(&str, Arr, bool); 3] = [
                ("mixed", distinct(&mut rng, &shape), false),
                (
                    "negative",
                    distinct(&mut rng, &shape).map(|v| v - 20.0),
                    false,
                ),
                ("permuted", distinct(&mut rng, &[n, h, w, c]), true),
            ];
            for (what, x, permuted) in inputs {
                let view = move |v: &Tensor| {
                    if permuted {
                        v.permute(&[0, 3, 1, 2])
                    } else {
                        Ok(v.clone())
                    }
                };
                let rview = move |v: &Arr| {
                    if permuted {
                        v.permute(&[0, 3, 1, 2])
                    } else {
                        v.clone()
                    }
                };
                let tag = format!("{what} {shape:?} {p:?}");
                t.check_with(
                    &format!("max_pool2d {tag}"),
                    EXACT,
                    &[In::Var(x.clone())],
                    |v| view(&v[0])?.max_pool2d(p),
                    |v, _| r::pool2d(&rview(&v[0]), rp, true),
                );
                if dilation != [1, 1] {
                    continue; // average pooling takes no dilation (tests/errors)
                }
                t.check(
                    &format!("avg_pool2d {tag}"),
                    &[In::Var(x)],
                    |v| view(&v[0])?.avg_pool2d(p),
                    |v, _| r::pool2d(&rview(&v[0]), rp, false),
                );
            }
        }
    }
}
