// residual_layernorm.cu — the pre-LN Transformer's "h = x + r; y = LayerNorm(h)·γ + β" in one pass.
//
// resln_fwd_<t>(const T* x, const T* r, const T* gamma, const T* beta, T* h, T* y, float* mean,
//               float* rstd, i64 rows, i64 n, float eps)
//     Reads x, r [rows, n] and gamma, beta [n]; writes h = x + r (rounded to T: the new residual
//     stream), y = (h - mean)·rstd·γ + β, and mean/rstd (f32, [rows]) for the backward pass.
//     The statistics are taken over the rounded h, so y equals LayerNorm applied to the stored h
//     (the composite's value).
//
// The backward pass needs no kernel of its own: dh = LayerNorm-backward(h, dy) + d(h) reaches x
// and r unchanged (dx = dr = dh), and dγ/dβ are LayerNorm's column sums over h; the wrappers run
// layernorm.cu's deterministic dx and two-pass dγ/dβ kernels (no atomics) on the saved h.
//
// Why it is fast: the composite reads x and r and writes h (one kernel), then LayerNorm reads h
// from HBM twice more (statistics, normalisation). Here one row group adds, reduces and
// normalises each row while it sits in L1/L2: x and r are read once from HBM, h and y written
// once. Row groups sized to the row (warp-sized for short rows), 128-bit stores on aligned rows,
// two-pass mean/variance in f32.

template <typename T>
__device__ __forceinline__ void resln_fwd(const T* x, const T* r, const T* gamma, const T* beta, T* h, T* y,
                                          float* mean, float* rstd, i64 rows, i64 n, float eps) {
    __shared__ float scratch[32];
    const float inv_n = 1.f / (float)n;
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 row = r0 + threadIdx.y;
        const bool live = row < rows;
        const i64 at = (live ? row : 0) * n;
        const T* xr = x + at;
        const T* rr = r + at;
        T* hr = h + at;
        float acc = 0.f;
        if (live)
            row_write(hr, n, [&](i64 j) {
                const float s = to_f32(from_f32<T>(to_f32(xr[j]) + to_f32(rr[j])));
                acc += s;
                return s;
            });
        const float mu = row_sum(acc, scratch) * inv_n;
        // The re-reads of h below may split the row differently from the writes above (when y's
        // alignment differs from h's): make the block's writes visible first.
        __syncthreads();
        acc = 0.f;
        if (live) row_visit(hr, n, [&](i64, float v) { const float d = v - mu; acc += d * d; });
        const float var = row_sum(acc, scratch) * inv_n;
        const float rs = rsqrtf(var + eps);
        if (live) {
            row_write(y + at, n, [&](i64 j) {
                return (to_f32(hr[j]) - mu) * rs * to_f32(gamma[j]) + to_f32(beta[j]);
            });
            if (threadIdx.x == 0) {
                mean[row] = mu;
                rstd[row] = rs;
            }
        }
    }
}

#define RESLN_T(sfx, T)                                                                              \
    extern "C" __global__ void resln_fwd_##sfx(const T* x, const T* r, const T* gamma, const T* beta, \
                                               T* h, T* y, float* mean, float* rstd, i64 rows, i64 n, \
                                               float eps) {                                           \
        resln_fwd<T>(x, r, gamma, beta, h, y, mean, rstd, rows, n, eps);                              \
    }
RESLN_T(f32, float)
RESLN_T(f16, __half)
RESLN_T(bf16, bf16)
