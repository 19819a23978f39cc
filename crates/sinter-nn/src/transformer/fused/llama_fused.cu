// llama_fused.cu — the Llama family's pointwise ops on CUDA: RMSNorm (and the residual add +
// RMSNorm), rotary positions (heads and packed projections) and SwiGLU, forward and backward.
// The CUDA side of the custom ops in this folder (rms_norm.rs, rope.rs, swiglu.rs), which run
// sinter-cpu's kernels on the CPU: the same values, in f32 arithmetic whatever the storage type.
//
// <t> is the activations' type T (f32, f16, bf16); the kernels that read the RMSNorm weight take
// it as T, or as f32 in the `<t>_pf32` variants (autocast: half-precision activations, f32 master
// weights, whose gradient then comes out of the f32 finish kernel).
//
// rmsnorm_fwd_<t>(const T* x, const P* w, T* y, i64 rows, i64 n, float eps)
//     y = x * rstd * w, rstd = 1 / sqrt(mean(x²) + eps) per row of n.
// resrms_fwd_<t>(const T* x, const T* a, const P* w, T* s, T* y, i64 rows, i64 n, float eps)
//     s = x + a (rounded to T), y = rmsnorm(s): the pre-norm block's residual add and the next
//     norm in one pass.
// rmsnorm_bwd_dx_<t>(const T* dy, const T* x, const P* w, T* dx, float* rstd, i64 rows, i64 n,
//                    float eps)
// resrms_bwd_dx_<t>(const T* ds, const T* dy, const T* x, const P* w, T* dx, float* rstd, ...)
//     dx = rstd * (g - x * rstd² * mean(g * x)), g = dy * w (+ ds, the sum's own gradient, in the
//     residual form); rstd [rows] (f32) is recomputed and written for the dw kernels.
// rmsnorm_bwd_dw_<t>(const T* dy, const T* x, const float* rstd, float* part, i64 rows, i64 n,
//                    i64 chunk)
//     part[z][j] = Σ_{rows r of chunk z} dy[r][j] * x[r][j] * rstd[r]; block (32, 8), grid
//     (ceil(n / 32), chunks): coalesced columns, no atomics.
// rmsnorm_bwd_finish_<p>(const float* part, P* dw, i64 chunks, i64 n)
//     dw[j] = Σ_z part[z][j] in z order: deterministic.
// rope_<t>(const T* x, const T* cos, const T* sin, T* y, i64 rows, i64 t, i64 w, i64 d,
//          i64 rotated, float sign)
//     x [rows, w], row r at position r % t: its first `rotated` heads of d are rotated by the
//     tables [t, d] (y₁ = x₁·c₁ − x₂·s₁, y₂ = x₂·c₂ + x₁·s₂ with s = sign·sin, Hugging Face's
//     rotate_half), the other columns copied. Heads [b, h, t, d] are rows b·h·t of one head;
//     the packed projection [b, t, w] rotates its q and k heads in place of a split. sign −1 is
//     the inverse rotation: the backward.
// swiglu_fwd_<t>(const T* h, T* y, i64 rows, i64 n)       y = silu(gate) * up, h = [gate | up]
// swiglu_bwd_<t>(const T* dy, const T* h, T* dh, i64 rows, i64 n)
//     dgate = dy·up·s·(1 + gate·(1 − s)), dup = dy·silu(gate), s = sigmoid(gate).
//
// RMSNorm runs one 32-thread row group per row (row_visit / row_write: 128-bit accesses on
// aligned rows), 8 rows a block; rope and SwiGLU one thread per output element.

template <typename T, typename P>
__device__ __forceinline__ void rms_fwd(const T* x, const T* a, const P* w, T* s, T* y, i64 rows, i64 n,
                                        float eps) {
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;  // blockDim.x = 32: a row group is one warp, no block barrier
    const T* xr = x + r * n;
    const float inv_n = 1.f / (float)n;
    if (a) {
        // The sum is rounded to T first: y normalises the s that is stored, as the composite does.
        const T* ar = a + r * n;
        T* sr = s + r * n;
        row_write(sr, n, [&](i64 j) { return to_f32(xr[j]) + to_f32(ar[j]); });
        __syncwarp();
        xr = sr;
    }
    float acc = 0.f;
    row_visit(xr, n, [&](i64, float v) { acc += v * v; });
    const float rs = rsqrtf(warp_sum(acc) * inv_n + eps);
    row_write(y + r * n, n, [&](i64 j) { return to_f32(xr[j]) * rs * to_f32(w[j]); });
}

template <typename T, typename P>
__device__ __forceinline__ void rms_bwd_dx(const T* ds, const T* dy, const T* x, const P* w, T* dx,
                                           float* rstd, i64 rows, i64 n, float eps) {
    const i64 r = (i64)blockIdx.x * blockDim.y + threadIdx.y;
    if (r >= rows) return;
    const T* xr = x + r * n;
    const T* gr = dy + r * n;
    const float inv_n = 1.f / (float)n;
    float sq = 0.f, dot = 0.f;
    row_visit2(xr, gr, n, [&](i64 j, float xv, float gv) {
        sq += xv * xv;
        dot += __fmul_rn(gv, to_f32(w[j])) * xv;
    });
    const float rs = rsqrtf(warp_sum(sq) * inv_n + eps);
    const float c = rs * rs * rs * warp_sum(dot) * inv_n;
    const T* sr = ds ? ds + r * n : nullptr;
    row_write(dx + r * n, n, [&](i64 j) {
        const float g = __fmul_rn(to_f32(gr[j]), to_f32(w[j]));
        const float v = rs * g - c * to_f32(xr[j]);
        return sr ? v + to_f32(sr[j]) : v;
    });
    if (threadIdx.x == 0) rstd[r] = rs;
}

template <typename T>
__device__ __forceinline__ void rms_bwd_dw(const T* dy, const T* x, const float* rstd, float* part, i64 rows,
                                           i64 n, i64 chunk) {
    __shared__ float acc[8][33];
    const i64 j = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 r0 = (i64)blockIdx.y * chunk, r1 = min(rows, r0 + chunk);
    float v = 0.f;
    if (j < n)
        for (i64 r = r0 + threadIdx.y; r < r1; r += blockDim.y)
            v += to_f32(dy[r * n + j]) * to_f32(x[r * n + j]) * rstd[r];
    acc[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
    if (threadIdx.y == 0 && j < n) {
        float s = 0.f;
        for (int k = 0; k < (int)blockDim.y; ++k) s += acc[k][threadIdx.x];
        part[blockIdx.y * n + j] = s;
    }
}

template <typename P>
__device__ __forceinline__ void rms_bwd_finish(const float* part, P* dw, i64 chunks, i64 n) {
    const i64 j = global_tid();
    if (j >= n) return;
    float s = 0.f;
    for (i64 z = 0; z < chunks; ++z) s += part[z * n + j];
    dw[j] = from_f32<P>(s);
}

template <typename T>
__device__ __forceinline__ void rope_rotate(const T* x, const T* cs, const T* sn, T* y, i64 rows, i64 t, i64 w,
                                            i64 d, i64 rotated, float sign) {
    const i64 i = global_tid();
    if (i >= rows * w) return;
    const i64 r = i / w, c = i % w;
    if (c >= rotated * d) {
        y[i] = x[i];
        return;
    }
    const i64 e = c % d, half = d / 2, at = (r % t) * d + e;
    const float xv = to_f32(x[i]), cv = to_f32(cs[at]), sv = sign * to_f32(sn[at]);
    // The partner element of rotate_half: −x₂ for the first half, x₁ for the second.
    const float other = e < half ? -to_f32(x[i + half]) : to_f32(x[i - half]);
    y[i] = from_f32<T>(xv * cv + other * sv);
}

__device__ __forceinline__ float swiglu_sigmoid(float g) { return 1.f / (1.f + __expf(-g)); }

template <typename T>
__device__ __forceinline__ void swiglu_fwd(const T* h, T* y, i64 rows, i64 n) {
    const i64 i = global_tid();
    if (i >= rows * n) return;
    const i64 r = i / n, j = i % n;
    const float g = to_f32(h[r * 2 * n + j]), u = to_f32(h[r * 2 * n + n + j]);
    y[i] = from_f32<T>(g * swiglu_sigmoid(g) * u);
}

template <typename T>
__device__ __forceinline__ void swiglu_bwd(const T* dy, const T* h, T* dh, i64 rows, i64 n) {
    const i64 i = global_tid();
    if (i >= rows * n) return;
    const i64 r = i / n, j = i % n;
    const float g = to_f32(h[r * 2 * n + j]), u = to_f32(h[r * 2 * n + n + j]), d = to_f32(dy[i]);
    const float s = swiglu_sigmoid(g);
    dh[r * 2 * n + j] = from_f32<T>(d * u * s * (1.f + g * (1.f - s)));
    dh[r * 2 * n + n + j] = from_f32<T>(d * g * s);
}

#define LLAMA_RMS(sfx, T, P)                                                                          \
    extern "C" __global__ void rmsnorm_fwd_##sfx(const T* x, const P* w, T* y, i64 rows, i64 n,        \
                                                 float eps) {                                          \
        rms_fwd<T, P>(x, nullptr, w, nullptr, y, rows, n, eps);                                       \
    }                                                                                                 \
    extern "C" __global__ void resrms_fwd_##sfx(const T* x, const T* a, const P* w, T* s, T* y,        \
                                                i64 rows, i64 n, float eps) {                          \
        rms_fwd<T, P>(x, a, w, s, y, rows, n, eps);                                                   \
    }                                                                                                 \
    extern "C" __global__ void rmsnorm_bwd_dx_##sfx(const T* dy, const T* x, const P* w, T* dx,        \
                                                    float* rstd, i64 rows, i64 n, float eps) {         \
        rms_bwd_dx<T, P>(nullptr, dy, x, w, dx, rstd, rows, n, eps);                                  \
    }                                                                                                 \
    extern "C" __global__ void resrms_bwd_dx_##sfx(const T* ds, const T* dy, const T* x, const P* w,   \
                                                   T* dx, float* rstd, i64 rows, i64 n, float eps) {   \
        rms_bwd_dx<T, P>(ds, dy, x, w, dx, rstd, rows, n, eps);                                       \
    }
#define LLAMA_T(sfx, T)                                                                               \
    LLAMA_RMS(sfx, T, T)                                                                              \
    extern "C" __global__ void rmsnorm_bwd_dw_##sfx(const T* dy, const T* x, const float* rstd,        \
                                                    float* part, i64 rows, i64 n, i64 chunk) {         \
        rms_bwd_dw<T>(dy, x, rstd, part, rows, n, chunk);                                             \
    }                                                                                                 \
    extern "C" __global__ void rmsnorm_bwd_finish_##sfx(const float* part, T* dw, i64 chunks, i64 n) { \
        rms_bwd_finish<T>(part, dw, chunks, n);                                                       \
    }                                                                                                 \
    extern "C" __global__ void rope_##sfx(const T* x, const T* cs, const T* sn, T* y, i64 rows, i64 t, \
                                          i64 w, i64 d, i64 rotated, float sign) {                     \
        rope_rotate<T>(x, cs, sn, y, rows, t, w, d, rotated, sign);                                   \
    }                                                                                                 \
    extern "C" __global__ void swiglu_fwd_##sfx(const T* h, T* y, i64 rows, i64 n) {                   \
        swiglu_fwd<T>(h, y, rows, n);                                                                 \
    }                                                                                                 \
    extern "C" __global__ void swiglu_bwd_##sfx(const T* dy, const T* h, T* dh, i64 rows, i64 n) {     \
        swiglu_bwd<T>(dy, h, dh, rows, n);                                                            \
    }
LLAMA_T(f32, float)
LLAMA_T(f16, __half)
LLAMA_T(bf16, bf16)
LLAMA_RMS(f16_pf32, __half, float)
LLAMA_RMS(bf16_pf32, bf16, float)
