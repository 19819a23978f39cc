//! The CPU kernel emulator itself: f16/bf16 conversions bit-exact with round-to-nearest-even,
//! warp shuffles and votes, barriers with early-exiting threads, dynamic shared memory, WMMA, and
//! the errors it must report (divergent barrier, shuffle naming an exited lane, missing barrier
//! visible as a thread-order difference).
// References index several arrays with the same loop counter; ranges read better there.
#![allow(clippy::needless_range_loop)]

#[path = "emu/harness.rs"]
mod harness;

use half::{bf16, f16};
use harness::*;
use sinter_cuda::emu::{EmuLibrary, Emulator, Order};
use sinter_cuda::launch::{Arg, Launch};
use sinter_cuda::nvrtc::KernelFile;
use sinter_cuda::DType;

const SRC: &str = r#"
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <mma.h>
using namespace nvcuda;

extern "C" __global__ void cvt(const float* x, unsigned short* h, unsigned short* b, float* hf, float* bf, long long n) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x) {
        const __half hv = __float2half_rn(x[i]);
        const __nv_bfloat16 bv = __float2bfloat16_rn(x[i]);
        h[i] = __half_as_ushort(hv);
        b[i] = __bfloat16_as_ushort(bv);
        hf[i] = __half2float(hv);
        bf[i] = __bfloat162float(bv);
    }
}

// out[t*5 + k]: xor 1, down 3, up 2, broadcast lane 7, ballot of odd lanes (as float bits).
extern "C" __global__ void shuffles(float* out) {
    const int t = threadIdx.x;
    const float v = (float)t;
    out[t * 5 + 0] = __shfl_xor_sync(0xffffffffu, v, 1);
    out[t * 5 + 1] = __shfl_down_sync(0xffffffffu, v, 3);
    out[t * 5 + 2] = __shfl_up_sync(0xffffffffu, v, 2);
    out[t * 5 + 3] = __shfl_sync(0xffffffffu, v, 7);
    out[t * 5 + 4] = (float)__ballot_sync(0xffffffffu, t & 1);
}

// Threads >= n leave before the barrier; the rest must still pass it.
extern "C" __global__ void early_exit(float* out, int n) {
    __shared__ float s[256];
    const int t = threadIdx.x;
    if (t >= n) return;
    s[t] = (float)t;
    __syncthreads();
    out[t] = s[n - 1 - t];
}

extern "C" __global__ void divergent(float* out) {
    if (threadIdx.x < 16) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1.f;
}

extern "C" __global__ void exited_lane(float* out) {
    if (threadIdx.x == 3) return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, 1.f, 1);
}

// Reverses a block's slice through dynamic shared memory.
extern "C" __global__ void dyn_reverse(const float* x, float* y) {
    extern __shared__ __align__(16) float sm[];
    const int t = threadIdx.x, n = blockDim.x;
    sm[t] = x[blockIdx.x * n + t];
    __syncthreads();
    y[blockIdx.x * n + t] = sm[n - 1 - t];
}

// Reads a static shared slot nobody wrote in this block (block 0 writes it, block 1 does not).
extern "C" __global__ void stale_shared(float* out) {
    __shared__ float s[32];
    if (blockIdx.x == 0) s[threadIdx.x] = 1.f;
    __syncthreads();
    out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x];
}

// Missing barrier: warp w reads what warp w+1 wrote, with no __syncthreads in between.
extern "C" __global__ void racy(float* out) {
    __shared__ float s[64];
    s[threadIdx.x] = (float)threadIdx.x + 1.f;
    out[threadIdx.x] = s[(threadIdx.x + 32) % 64];
}

// One warp: D = 2 * (A B) + C on a 16x16x16 tile; A row-major, B col-major (ldm 16).
template <typename T>
__device__ void mma_tile(const T* a, const T* b, const float* c, float* d) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc, fc;
    wmma::fill_fragment(acc, 0.0f);
    wmma::load_matrix_sync(fa, a, 16);
    wmma::load_matrix_sync(fb, b, 16);
    wmma::mma_sync(acc, fa, fb, acc);
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] *= 2.0f;
    wmma::load_matrix_sync(fc, c, 16, wmma::mem_row_major);
    for (int i = 0; i < acc.num_elements; ++i) acc.x[i] += fc.x[i];
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
extern "C" __global__ void mma_f16(const __half* a, const __half* b, const float* c, float* d) { mma_tile(a, b, c, d); }
extern "C" __global__ void mma_bf16(const __nv_bfloat16* a, const __nv_bfloat16* b, const float* c, float* d) { mma_tile(a, b, c, d); }

// The row-index accumulator (flash_attention.cu): load a matrix whose (r, c) is r into an
// accumulator, then scale each element of another accumulator by a per-row factor found
// through it. d(r, c) = r + 1.
extern "C" __global__ void rowid_scale(float* d) {
    __shared__ __align__(32) float srow[256];
    for (int e = threadIdx.x; e < 256; e += blockDim.x) srow[e] = (float)(e / 16);
    __syncthreads();
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> rowid, acc;
    wmma::load_matrix_sync(rowid, srow, 16, wmma::mem_row_major);
    wmma::fill_fragment(acc, 1.0f);
    static_assert(decltype(rowid)::num_elements == decltype(acc)::num_elements, "same shape, same count");
    for (int e = 0; e < acc.num_elements; ++e) acc.x[e] *= rowid.x[e] + 1.f;
    wmma::store_matrix_sync(d, acc, 16, wmma::mem_row_major);
}
"#;

fn lib(e: &Emulator) -> std::sync::Arc<EmuLibrary> {
    e.library_from_source("emulator_semantics", SRC)
        .unwrap_or_else(|err| panic!("{err}"))
}

fn launch(name: &str, grid: u32, block: u32, args: Vec<Arg>) -> Launch {
    // `file` is ignored by run_in.
    Launch::new(KernelFile::Unary, name, grid, block, args)
}

fn run(e: &Emulator, l: &Launch, order: Order) -> sinter_cuda::Result<()> {
    let lib = lib(e);
    // SAFETY: the tests pass pointers of live `Buf`s sized for each kernel.
    unsafe { e.run_in(&lib, l, order) }
}

#[test]
fn half_and_bf16_conversions_round_to_nearest_even() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(30);
    let mut xs: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MIN_POSITIVE,
        5.960_464_5e-8,
        2.980_232_2e-8,
        2.980_233e-8,
        8.940_697e-8,
        6.103_515_6e-5,
        6.1e-5,
        3.4e38,
        1.0 + 1.0 / 2048.0,
        1.0 + 3.0 / 2048.0,
        1.0 + 1.0 / 256.0,
        1.0 + 3.0 / 256.0,
    ];
    // Random bit patterns over the whole range, and values near the f16 range.
    xs.extend(
        (0..20_000)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .filter(|v| !v.is_nan()),
    );
    xs.extend(
        (0..20_000)
            .map(|_| rng.uniform(-70000.0, 70000.0) as f32 * 2f32.powi(-(rng.below(40) as i32))),
    );
    let n = xs.len();
    let x = Buf::from_f64(
        DType::F32,
        &xs.iter().map(|&v| v as f64).collect::<Vec<_>>(),
        0,
    );
    let h = Buf::zeros(DType::F16, n, 0);
    let b = Buf::zeros(DType::BF16, n, 0);
    let hf = Buf::zeros(DType::F32, n, 0);
    let bf = Buf::zeros(DType::F32, n, 0);
    let l = launch(
        "cvt",
        4,
        128,
        vec![
            Arg::Ptr(x.ptr()),
            Arg::Ptr(h.ptr()),
            Arg::Ptr(b.ptr()),
            Arg::Ptr(hf.ptr()),
            Arg::Ptr(bf.ptr()),
            Arg::I64(n as i64),
        ],
    );
    run(e, &l, Order::Forward).unwrap();
    let hb: Vec<u16> = h
        .bytes()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let bb: Vec<u16> = b
        .bytes()
        .chunks(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let (hfv, bfv) = (hf.get(), bf.get());
    for (i, &v) in xs.iter().enumerate() {
        assert_eq!(
            hb[i],
            f16::from_f32(v).to_bits(),
            "f16 of {v:e} ({:#x})",
            v.to_bits()
        );
        assert_eq!(
            bb[i],
            bf16::from_f32(v).to_bits(),
            "bf16 of {v:e} ({:#x})",
            v.to_bits()
        );
        assert_eq!(hfv[i], f16::from_f32(v).to_f64(), "f16 -> f32 of {v:e}");
        assert_eq!(bfv[i], bf16::from_f32(v).to_f64(), "bf16 -> f32 of {v:e}");
    }
}

#[test]
fn warp_shuffles_and_ballot() {
    let Some(e) = emu() else { return };
    let out = Buf::zeros(DType::F32, 64 * 5, 0);
    run(
        e,
        &launch("shuffles", 1, 64, vec![Arg::Ptr(out.ptr())]),
        Order::Forward,
    )
    .unwrap();
    let o = out.get();
    for t in 0..64usize {
        let lane = t % 32;
        let base = t - lane;
        assert_eq!(o[t * 5], (t ^ 1) as f64, "xor lane {t}");
        assert_eq!(
            o[t * 5 + 1],
            if lane + 3 < 32 { t + 3 } else { t } as f64,
            "down lane {t}"
        );
        assert_eq!(
            o[t * 5 + 2],
            if lane >= 2 { t - 2 } else { t } as f64,
            "up lane {t}"
        );
        assert_eq!(o[t * 5 + 3], (base + 7) as f64, "idx lane {t}");
        assert_eq!(
            o[t * 5 + 4],
            0xaaaa_aaaau32 as f32 as f64,
            "ballot lane {t}"
        );
    }
}

#[test]
fn barriers_let_exited_threads_drop_out_and_dynamic_shared_memory_works() {
    let Some(e) = emu() else { return };
    let out = Buf::zeros(DType::F32, 256, 0);
    run(
        e,
        &launch(
            "early_exit",
            1,
            256,
            vec![Arg::Ptr(out.ptr()), Arg::I32(100)],
        ),
        Order::Reverse,
    )
    .unwrap();
    let o = out.get();
    for t in 0..256 {
        // Threads that left never wrote: their slots keep the buffer's NaN fill.
        let ok = if t < 100 {
            o[t] == (99 - t) as f64
        } else {
            o[t].is_nan()
        };
        assert!(ok, "thread {t}: {}", o[t]);
    }
    let xv: Vec<f64> = (0..3 * 96).map(|i| i as f64).collect();
    let x = Buf::from_f64(DType::F32, &xv, 0);
    let y = Buf::zeros(DType::F32, 3 * 96, 0);
    let mut l = launch(
        "dyn_reverse",
        3,
        96,
        vec![Arg::Ptr(x.ptr()), Arg::Ptr(y.ptr())],
    );
    l.shared_mem = 96 * 4;
    run(e, &l, Order::Forward).unwrap();
    let want: Vec<f64> = (0..3 * 96)
        .map(|i| (i / 96 * 96 + 95 - i % 96) as f64)
        .collect();
    assert_eq!(y.get(), want);
}

#[test]
fn undefined_behaviour_is_reported() {
    let Some(e) = emu() else { return };
    let out = Buf::zeros(DType::F32, 64, 0);
    let err = run(
        e,
        &launch("divergent", 1, 64, vec![Arg::Ptr(out.ptr())]),
        Order::Forward,
    )
    .unwrap_err();
    assert!(err.to_string().contains("divergent barrier"), "{err}");
    let err = run(
        e,
        &launch("exited_lane", 1, 32, vec![Arg::Ptr(out.ptr())]),
        Order::Forward,
    )
    .unwrap_err();
    assert!(err.to_string().contains("has exited"), "{err}");
    // A missing barrier shows up as a difference between the two thread orders.
    run(
        e,
        &launch("racy", 1, 64, vec![Arg::Ptr(out.ptr())]),
        Order::Forward,
    )
    .unwrap();
    let fwd = out.get();
    run(
        e,
        &launch("racy", 1, 64, vec![Arg::Ptr(out.ptr())]),
        Order::Reverse,
    )
    .unwrap();
    assert_ne!(fwd, out.get());
    // Shared memory starts undefined (NaN here) in every block, not with the last block's data.
    let out2 = Buf::zeros(DType::F32, 64, 0);
    run(
        e,
        &launch("stale_shared", 2, 32, vec![Arg::Ptr(out2.ptr())]),
        Order::Forward,
    )
    .unwrap();
    let o = out2.get();
    assert!(
        o[..32].iter().all(|&v| v == 1.0) && o[32..].iter().all(|v| v.is_nan()),
        "{o:?}"
    );
    // Argument checks: count and byte size against the kernel's declaration.
    let err = run(
        e,
        &launch("early_exit", 1, 32, vec![Arg::Ptr(out.ptr())]),
        Order::Forward,
    )
    .unwrap_err();
    assert!(err.to_string().contains("takes 2 parameters"), "{err}");
    let err = run(
        e,
        &launch("early_exit", 1, 32, vec![Arg::Ptr(out.ptr()), Arg::I64(1)]),
        Order::Forward,
    )
    .unwrap_err();
    assert!(err.to_string().contains("4 bytes"), "{err}");
    let err = run(e, &launch("no_such_kernel", 1, 32, vec![]), Order::Forward).unwrap_err();
    assert!(err.to_string().contains("no_such_kernel"), "{err}");
}

#[test]
fn wmma_tile_matches_a_reference_gemm() {
    let Some(e) = emu() else { return };
    let mut rng = Rng::new(31);
    for d in [DType::F16, DType::BF16] {
        let av: Vec<f64> = (0..256).map(|_| q(d, rng.uniform(-1.0, 1.0))).collect();
        let bv: Vec<f64> = (0..256).map(|_| q(d, rng.uniform(-1.0, 1.0))).collect();
        let cv: Vec<f64> = (0..256)
            .map(|_| q(DType::F32, rng.uniform(-1.0, 1.0)))
            .collect();
        let (a, b, c) = (
            Buf::from_f64(d, &av, 0),
            Buf::from_f64(d, &bv, 0),
            Buf::from_f64(DType::F32, &cv, 0),
        );
        let out = Buf::zeros(DType::F32, 256, 0);
        let name = if d == DType::F16 {
            "mma_f16"
        } else {
            "mma_bf16"
        };
        let l = launch(
            name,
            1,
            32,
            vec![
                Arg::Ptr(a.ptr()),
                Arg::Ptr(b.ptr()),
                Arg::Ptr(c.ptr()),
                Arg::Ptr(out.ptr()),
            ],
        );
        run(e, &l, Order::Reverse).unwrap();
        // B is column-major: element (k, j) at b[j * 16 + k].
        let want: Vec<f64> = (0..256)
            .map(|ij| {
                let (i, j) = (ij / 16, ij % 16);
                2.0 * (0..16)
                    .map(|k| av[i * 16 + k] * bv[j * 16 + k])
                    .sum::<f64>()
                    + cv[ij]
            })
            .collect();
        assert_close(&format!("wmma {d}"), &out.get(), &want, (1e-5, 1e-5));
        out.check_guards("wmma");
    }
}

#[test]
fn wmma_row_index_accumulator_and_tile_preconditions() {
    let Some(e) = emu() else { return };
    let out = Buf::zeros(DType::F32, 256, 0);
    run(
        e,
        &launch("rowid_scale", 1, 64, vec![Arg::Ptr(out.ptr())]),
        Order::Reverse,
    )
    .unwrap();
    let want: Vec<f64> = (0..256).map(|i| (i / 16 + 1) as f64).collect();
    assert_eq!(out.get(), want);
    // A tile pointer that is not 32-byte aligned is undefined on the hardware: reported.
    let a = Buf::from_f64(DType::F16, &[0.0; 256], 1);
    let b = Buf::from_f64(DType::F16, &[0.0; 256], 0);
    let c = Buf::from_f64(DType::F32, &[0.0; 256], 0);
    let err = run(
        e,
        &launch(
            "mma_f16",
            1,
            32,
            vec![
                Arg::Ptr(a.ptr()),
                Arg::Ptr(b.ptr()),
                Arg::Ptr(c.ptr()),
                Arg::Ptr(out.ptr()),
            ],
        ),
        Order::Forward,
    )
    .unwrap_err();
    assert!(err.to_string().contains("32-byte aligned"), "{err}");
}
