// softmax.cu — softmax and log-softmax over the last dim of a [rows, n] view, forward and backward
// (sinter-core's kernels/softmax/; launched by its cuda.rs).
//
// softmax_<t>(const T* x, T* y, i64 rows, i64 n)          y = softmax(x)
// log_softmax_<t>(const T* x, T* y, i64 rows, i64 n)      y = log_softmax(x)
//     = (x - max) - log1p(rest), rest the sum of exp(x - max) but one max's
// softmax_bwd_<t>(const T* y, const T* gy, T* gx, i64 rows, i64 n)
//     gx = y * (gy - Σ gy*y)
// log_softmax_bwd_<t>(const T* y, const T* gy, T* gx, i64 rows, i64 n)
//     gx = gy - exp(y) * Σ gy
//
// Why it is fast: one row per row group (a warp for short rows, up to 1024 threads for long ones,
// chosen by the host); the forward makes a single pass for the statistics with the online max /
// rescaled sum (Milakov & Gimelshein), merges (max, sum) pairs across threads with a fixed order,
// then one write pass — x is read twice (the second read mostly from L1/L2) and y written once.
// 128-bit loads/stores when rows are aligned. No atomics: deterministic.

template <typename T, bool LOG>
__device__ __forceinline__ void softmax_fwd(const T* x, T* y, i64 rows, i64 n) {
    __shared__ float scratch[64];
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        float m = -SINTER_INF, s = 0.f;  // for LOG, s is the rest of mr_push
        if (LOG) {
            if (live) row_visit(x + r * n, n, [&](i64, float v) { mr_push(m, s, v); });
            row_mr(m, s, scratch);
        } else {
            if (live) row_visit(x + r * n, n, [&](i64, float v) { ms_push(m, s, v); });
            row_ms(m, s, scratch);
        }
        if (live) {
            const T* xr = x + r * n;
            if (LOG) {
                // (x - max) - ln Σ, never x - (max + ln Σ): that sum rounds at the max's scale
                // (off by 3.3e-4 of a confident class's -3.0e-3 at [88, 80 x 9], issue 30).
                const float log_sum = log1pf(s);
                row_write(y + r * n, n, [&](i64 j) { return (to_f32(xr[j]) - m) - log_sum; });
            } else {
                const float inv = 1.f / s;
                row_write(y + r * n, n, [&](i64 j) { return expf(to_f32(xr[j]) - m) * inv; });
            }
        }
    }
}

template <typename T, bool LOG>
__device__ __forceinline__ void softmax_bwd(const T* y, const T* gy, T* gx, i64 rows, i64 n) {
    __shared__ float scratch[32];
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        float acc = 0.f;
        if (live) {
            if (LOG) row_visit(gy + r * n, n, [&](i64, float g) { acc += g; });
            else row_visit2(y + r * n, gy + r * n, n, [&](i64, float yv, float g) { acc += yv * g; });
        }
        acc = row_sum(acc, scratch);
        if (live) {
            const T* yr = y + r * n;
            const T* gr = gy + r * n;
            if (LOG)
                row_write(gx + r * n, n, [&](i64 j) { return to_f32(gr[j]) - expf(to_f32(yr[j])) * acc; });
            else
                row_write(gx + r * n, n, [&](i64 j) { return to_f32(yr[j]) * (to_f32(gr[j]) - acc); });
        }
    }
}

#define SOFTMAX_T(sfx, T)                                                                               \
    extern "C" __global__ void softmax_##sfx(const T* x, T* y, i64 rows, i64 n) {                       \
        softmax_fwd<T, false>(x, y, rows, n);                                                           \
    }                                                                                                   \
    extern "C" __global__ void log_softmax_##sfx(const T* x, T* y, i64 rows, i64 n) {                   \
        softmax_fwd<T, true>(x, y, rows, n);                                                            \
    }                                                                                                   \
    extern "C" __global__ void softmax_bwd_##sfx(const T* y, const T* gy, T* gx, i64 rows, i64 n) {     \
        softmax_bwd<T, false>(y, gy, gx, rows, n);                                                      \
    }                                                                                                   \
    extern "C" __global__ void log_softmax_bwd_##sfx(const T* y, const T* gy, T* gx, i64 rows, i64 n) { \
        softmax_bwd<T, true>(y, gy, gx, rows, n);                                                       \
    }
SOFTMAX_T(f32, float)
SOFTMAX_T(f16, __half)
SOFTMAX_T(bf16, bf16)
