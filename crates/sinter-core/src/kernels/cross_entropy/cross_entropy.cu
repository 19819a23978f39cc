// cross_entropy.cu — fused log-softmax + negative log-likelihood over class indices, with
// ignore_index, forward and backward; the probabilities are never materialised in memory
// (sinter-core's kernels/cross_entropy/; launched by its cuda.rs).
//
// cross_entropy_fwd_<t>(const T* logits, const i64* target, float* loss, float* stats,
//                       i64 rows, i64 n, i64 ignore_index)
//     stats[2r] = max, stats[2r + 1] = ln Σ exp(x - max) of logits[r, :] (kept apart, not summed
//     into a log-sum-exp: that sum rounds at the max's scale, and at logits ~1000 moved every
//     probability of the backward by up to 6e-5 of itself, issue 30);
//     loss[r] = ln Σ exp(x - max) - (x_t - max), or 0 when
//     target[r] == ignore_index; NaN when the target is out of [0, n) (the host cannot see it).
//     Never lse - x_t: for a confident prediction both are large and nearly equal, and their
//     difference after rounding keeps few of the loss's digits (issue 14: logits [88, 80 x 9]
//     gave 3.3e-4 relative error). The sum is kept as 1 + rest, the max's own term apart, and
//     its log taken as log1p(rest), so a loss of 1e-9 keeps its digits too.
// cross_entropy_bwd_<t>(const T* logits, const i64* target, const float* stats, const float* dloss,
//                       T* dlogits, i64 rows, i64 n, i64 ignore_index)
//     dlogits[r, j] = (exp((x_j - max) - ln Σ) - [j == target[r]]) * dloss[r] (0 for ignored
//     rows), the target's p - 1 as expm1 (p is within an ulp of 1 when confident).
//
// Why it is fast: one read of the logits for the forward (online max/sum), one read + one write for
// the backward; the saved statistics (8 bytes per row) replace a saved [rows, n] probability
// tensor. Row groups sized by the host (warp per row for small vocabularies), 128-bit accesses.

template <typename T>
__device__ __forceinline__ void ce_fwd(const T* logits, const i64* target, float* loss, float* stats, i64 rows,
                                       i64 n, i64 ignore_index) {
    __shared__ float scratch[64];
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        float m = -SINTER_INF, rest = 0.f;
        if (live) row_visit(logits + r * n, n, [&](i64, float v) { mr_push(m, rest, v); });
        row_mr(m, rest, scratch);
        if (live && threadIdx.x == 0) {
            const float log_sum = log1pf(rest);  // ln Σ exp(x - m)
            const i64 t = target[r];
            float out;
            if (t == ignore_index) out = 0.f;
            else if (t < 0 || t >= n) out = SINTER_NAN;
            else out = log_sum - (to_f32(logits[r * n + t]) - m);
            loss[r] = out;
            stats[2 * r] = m;
            stats[2 * r + 1] = log_sum;
        }
    }
}

template <typename T>
__device__ __forceinline__ void ce_bwd(const T* logits, const i64* target, const float* stats, const float* dloss,
                                       T* dlogits, i64 rows, i64 n, i64 ignore_index) {
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        if (r >= rows) continue;  // no block-level sync below: safe to skip
        const i64 t = target[r];
        const T* xr = logits + r * n;
        if (t == ignore_index) {
            row_write(dlogits + r * n, n, [&](i64) { return 0.f; });
            continue;
        }
        const float m = stats[2 * r], log_sum = stats[2 * r + 1];
        const float g = dloss[r];
        row_write(dlogits + r * n, n, [&](i64 j) {
            const float z = (to_f32(xr[j]) - m) - log_sum;
            return (j == t ? expm1f(z) : expf(z)) * g;
        });
    }
}

#define CE_T(sfx, T)                                                                                 \
    extern "C" __global__ void cross_entropy_fwd_##sfx(const T* logits, const i64* target,           \
                                                       float* loss, float* stats, i64 rows, i64 n,   \
                                                       i64 ignore_index) {                           \
        ce_fwd<T>(logits, target, loss, stats, rows, n, ignore_index);                               \
    }                                                                                                \
    extern "C" __global__ void cross_entropy_bwd_##sfx(const T* logits, const i64* target,           \
                                                       const float* stats, const float* dloss,       \
                                                       T* dlogits, i64 rows, i64 n,                  \
                                                       i64 ignore_index) {                           \
        ce_bwd<T>(logits, target, stats, dloss, dlogits, rows, n, ignore_index);                     \
    }
CE_T(f32, float)
CE_T(f16, __half)
CE_T(bf16, bf16)
