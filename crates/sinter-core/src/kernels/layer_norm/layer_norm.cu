// layer_norm.cu — LayerNorm over the last dim of a [rows, n] view, forward and backward, and the
// residual add + LayerNorm forward (below).
//
// <t> is the activations' type T (f32, f16, bf16); the kernels that read gamma take them as T, or
// as f32 in the `<t>_pf32` variants (autocast: half-precision activations, f32 master parameters,
// whose gradients then come from the f32 finish kernel).
//
// layernorm_fwd_<t>(const T* x, const P* gamma, const P* beta, T* y, float* mean, float* rstd,
//                   i64 rows, i64 n, float eps)
//     y = (x - mean) * rstd * gamma + beta. gamma/beta may be null (no affine); mean/rstd (f32,
//     [rows]) may be null (inference) — the backward needs them.
// layernorm_bwd_dx_<t>(const T* x, const P* gamma, const T* gy, const float* mean, const float* rstd,
//                      T* dx, i64 rows, i64 n)
//     dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat)), g = gy * gamma.
// layernorm_bwd_<t>(const T* x, const P* gamma, const T* gy, const float* mean, const float* rstd,
//                   T* dx, float* part_dgamma, float* part_dbeta, i64 rows, i64 n)
//     dx and the partial column sums in one pass, one partial row per block (part: [gridDim.x, n]);
//     dynamic shared memory blockDim.y * 2n floats. The two kernels below serve where that does
//     not fit, or where dx is not wanted.
// layernorm_bwd_params_<t>(const T* x, const T* gy, const float* mean, const float* rstd,
//                          float* part_dgamma, float* part_dbeta, i64 rows, i64 n, i64 chunk)
//     partial column sums over row chunk z = blockIdx.y: part[z][j] = Σ_{rows in chunk} gy*xhat | gy
// layernorm_bwd_finish_<p>(const float* part_dgamma, const float* part_dbeta, P* dgamma, P* dbeta,
//                          i64 chunks, i64 n)
//     dgamma[j] = Σ_z part_dgamma[z][j] (in order), same for dbeta; either output may be null.
//
// Why it is fast: forward and dx use one row group per row (warp-sized groups for short rows) with
// the row re-read from L1/L2 rather than HBM, 128-bit loads on aligned rows, statistics in f32 with
// a two-pass mean/variance (no catastrophic cancellation). dgamma/dbeta avoid atomics: a 32x8 block
// sums 32 adjacent columns over a chunk of rows (coalesced), the chunks are then summed in a fixed
// order by the finish kernel — deterministic, and the chunk count is chosen to fill the GPU.

template <typename T, typename P>
__device__ __forceinline__ void ln_fwd(const T* x, const P* gamma, const P* beta, T* y, float* mean, float* rstd,
                                       i64 rows, i64 n, float eps) {
    __shared__ float scratch[32];
    const float inv_n = 1.f / (float)n;
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        const T* xr = x + (live ? r : 0) * n;
        float acc = 0.f;
        if (live) row_visit(xr, n, [&](i64, float v) { acc += v; });
        const float mu = row_sum(acc, scratch) * inv_n;
        acc = 0.f;
        if (live) row_visit(xr, n, [&](i64, float v) { const float d = v - mu; acc += d * d; });
        const float var = row_sum(acc, scratch) * inv_n;
        const float rs = rsqrtf(var + eps);
        if (live) {
            row_write(y + r * n, n, [&](i64 j) {
                float v = (to_f32(xr[j]) - mu) * rs;
                if (gamma) v *= to_f32(gamma[j]);
                if (beta) v += to_f32(beta[j]);
                return v;
            });
            if (threadIdx.x == 0) {
                if (mean) mean[r] = mu;
                if (rstd) rstd[r] = rs;
            }
        }
    }
}

// g = gy * gamma (gy where there is no gamma). __fmul_rn: never fused into a later add
// (NVRTC's --fmad=true would turn `g - a` in the dx formula into fma(gv, gamma, -a), keeping the
// product's rounding error, so a one-element row's dx came out 1e-6, not 0: g must be the same
// rounded value in the sums and in dx).
template <typename P>
__device__ __forceinline__ float ln_scaled_grad(float gv, const P* gamma, i64 j) {
    return gamma ? __fmul_rn(gv, to_f32(gamma[j])) : gv;
}

// The two row means every dx element of a row needs: a = mean of g, b = mean of g * xhat.
struct LnRowSums {
    float a, b;
};

// LnRowSums of one row (all threads of the row group take part in the sums; `live` false for a
// group past the last row, which adds nothing).
template <typename T, typename P>
__device__ __forceinline__ LnRowSums ln_bwd_row_sums(const T* xr, const T* gr, const P* gamma, float mu,
                                                     float rs, bool live, i64 n, float inv_n,
                                                     float* scratch) {
    float a = 0.f, b = 0.f;
    if (live)
        row_visit2(xr, gr, n, [&](i64 j, float xv, float gv) {
            const float g = ln_scaled_grad(gv, gamma, j);
            a += g;
            b += g * (xv - mu) * rs;
        });
    return LnRowSums{row_sum(a, scratch) * inv_n, row_sum(b, scratch) * inv_n};
}

template <typename T, typename P>
__device__ __forceinline__ void ln_bwd_dx(const T* x, const P* gamma, const T* gy, const float* mean,
                                          const float* rstd, T* dx, i64 rows, i64 n) {
    __shared__ float scratch[32];
    const float inv_n = 1.f / (float)n;
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        const i64 rr = live ? r : 0;
        const T* xr = x + rr * n;
        const T* gr = gy + rr * n;
        const float mu = live ? mean[rr] : 0.f;
        const float rs = live ? rstd[rr] : 0.f;
        const LnRowSums s = ln_bwd_row_sums(xr, gr, gamma, mu, rs, live, n, inv_n, scratch);
        if (live) {
            T* dr = dx + r * n;
            row_write(dr, n, [&](i64 j) {
                const float gv = to_f32(gr[j]);
                const float xhat = (to_f32(xr[j]) - mu) * rs;
                return rs * (ln_scaled_grad(gv, gamma, j) - s.a - xhat * s.b);
            });
        }
    }
}

// dx and the partial dgamma/dbeta column sums in one pass over x and gy (the rows are read once
// from HBM instead of twice): as ln_bwd_dx, and each row group also adds gy*xhat and gy of its
// rows into its own [2][n] slice of dynamic shared memory (blockDim.y * 2n floats, so the caller
// launches it only where that fits). Each block then sums its row groups' slices in a fixed order
// into part[blockIdx.x][j]: ln_bwd_finish sums the gridDim.x partials. Deterministic: a slice
// element is added to row by row in order, the barrier after each row orders the adds of the
// threads that own column j (which thread owns it depends on the row's alignment).
template <typename T, typename P>
__device__ __forceinline__ void ln_bwd_fused(const T* x, const P* gamma, const T* gy, const float* mean,
                                             const float* rstd, T* dx, float* part_g, float* part_b,
                                             i64 rows, i64 n) {
    extern __shared__ float ln_part[];
    __shared__ float scratch[32];
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, threads = blockDim.x * blockDim.y;
    for (i64 i = tid; i < 2 * n * blockDim.y; i += threads) ln_part[i] = 0.f;
    __syncthreads();
    float* sg = ln_part + 2 * n * threadIdx.y;
    float* sb = sg + n;
    const float inv_n = 1.f / (float)n;
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        const i64 rr = live ? r : 0;
        const T* xr = x + rr * n;
        const T* gr = gy + rr * n;
        const float mu = live ? mean[rr] : 0.f;
        const float rs = live ? rstd[rr] : 0.f;
        const LnRowSums s = ln_bwd_row_sums(xr, gr, gamma, mu, rs, live, n, inv_n, scratch);
        if (live) {
            row_write(dx + r * n, n, [&](i64 j) {
                const float gv = to_f32(gr[j]);
                const float xhat = (to_f32(xr[j]) - mu) * rs;
                sg[j] += gv * xhat;
                sb[j] += gv;
                return rs * (ln_scaled_grad(gv, gamma, j) - s.a - xhat * s.b);
            });
        }
        __syncthreads();
    }
    for (i64 j = tid; j < n; j += threads) {
        float tg = 0.f, tb = 0.f;
        for (int y = 0; y < (int)blockDim.y; ++y) { tg += ln_part[2 * n * y + j]; tb += ln_part[2 * n * y + n + j]; }
        part_g[(i64)blockIdx.x * n + j] = tg;
        part_b[(i64)blockIdx.x * n + j] = tb;
    }
}

// Grid: x = ceil(n / 32), y = chunks (rows split into `chunk` rows each); block 32 x 8.
template <typename T>
__device__ __forceinline__ void ln_bwd_params(const T* x, const T* gy, const float* mean, const float* rstd,
                                              float* part_g, float* part_b, i64 rows, i64 n, i64 chunk) {
    __shared__ float sg[8][33];
    __shared__ float sb[8][33];
    const i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 r0 = (i64)blockIdx.y * chunk;
    const i64 r1 = min(rows, r0 + chunk);
    float ag = 0.f, ab = 0.f;
    if (col < n) {
        for (i64 r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
            const float g = to_f32(gy[r * n + col]);
            const float xhat = (to_f32(x[r * n + col]) - mean[r]) * rstd[r];
            ag += g * xhat;
            ab += g;
        }
    }
    sg[threadIdx.y][threadIdx.x] = ag;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && col < n) {
        float tg = 0.f, tb = 0.f;
        for (int k = 0; k < (int)blockDim.y; ++k) { tg += sg[k][threadIdx.x]; tb += sb[k][threadIdx.x]; }
        if (part_g) part_g[(i64)blockIdx.y * n + col] = tg;
        if (part_b) part_b[(i64)blockIdx.y * n + col] = tb;
    }
}

template <typename T>
__device__ __forceinline__ void ln_bwd_finish(const float* part_g, const float* part_b, T* dgamma, T* dbeta,
                                              i64 chunks, i64 n) {
    for (i64 j = global_tid(); j < n; j += global_stride()) {
        if (dgamma) {
            float s = 0.f;
            for (i64 z = 0; z < chunks; ++z) s += part_g[z * n + j];
            dgamma[j] = from_f32<T>(s);
        }
        if (dbeta) {
            float s = 0.f;
            for (i64 z = 0; z < chunks; ++z) s += part_b[z * n + j];
            dbeta[j] = from_f32<T>(s);
        }
    }
}

// LN_TP: the kernels whose parameters gamma/beta are of type P (x's own type, or f32 master
// parameters read directly under autocast: no cast kernels around the op). LN_T adds the
// kernels that do not read parameters.
#define LN_TP(sfx, T, P)                                                                             \
    extern "C" __global__ void layernorm_fwd_##sfx(const T* x, const P* gamma, const P* beta, T* y,  \
                                                   float* mean, float* rstd, i64 rows, i64 n,        \
                                                   float eps) {                                      \
        ln_fwd<T, P>(x, gamma, beta, y, mean, rstd, rows, n, eps);                                   \
    }                                                                                                \
    extern "C" __global__ void layernorm_bwd_dx_##sfx(const T* x, const P* gamma, const T* gy,       \
                                                      const float* mean, const float* rstd, T* dx,   \
                                                      i64 rows, i64 n) {                             \
        ln_bwd_dx<T, P>(x, gamma, gy, mean, rstd, dx, rows, n);                                      \
    }                                                                                                \
    extern "C" __global__ void layernorm_bwd_##sfx(const T* x, const P* gamma, const T* gy,          \
                                                   const float* mean, const float* rstd, T* dx,      \
                                                   float* part_g, float* part_b, i64 rows, i64 n) {  \
        ln_bwd_fused<T, P>(x, gamma, gy, mean, rstd, dx, part_g, part_b, rows, n);                   \
    }
#define LN_T(sfx, T)                                                                                 \
    LN_TP(sfx, T, T)                                                                                 \
    extern "C" __global__ void layernorm_bwd_params_##sfx(const T* x, const T* gy, const float* mean, \
                                                          const float* rstd, float* part_g,          \
                                                          float* part_b, i64 rows, i64 n,            \
                                                          i64 chunk) {                               \
        ln_bwd_params<T>(x, gy, mean, rstd, part_g, part_b, rows, n, chunk);                         \
    }                                                                                                \
    extern "C" __global__ void layernorm_bwd_finish_##sfx(const float* part_g, const float* part_b,  \
                                                          T* dgamma, T* dbeta, i64 chunks, i64 n) {  \
        ln_bwd_finish<T>(part_g, part_b, dgamma, dbeta, chunks, n);                                  \
    }
LN_T(f32, float)
LN_T(f16, __half)
LN_T(bf16, bf16)
LN_TP(f16_pf32, __half, float)
LN_TP(bf16_pf32, bf16, float)

// Residual add + LayerNorm — the pre-LN Transformer's "h = x + r; y = LayerNorm(h)·γ + β" in one pass.
//
// resln_fwd_<t>(const T* x, const T* r, const P* gamma, const P* beta, T* h, T* y, float* mean,
//               float* rstd, i64 rows, i64 n, float eps)
//     Reads x, r [rows, n] and gamma, beta [n]; writes h = x + r (rounded to T: the new residual
//     stream), y = (h - mean)·rstd·γ + β, and mean/rstd (f32, [rows]) for the backward pass.
//     The statistics are taken over the rounded h, so y equals LayerNorm applied to the stored h
//     (the composite's value).
//
// The backward pass needs no kernel of its own: dh = LayerNorm-backward(h, dy) + d(h) reaches x
// and r unchanged (dx = dr = dh), and dγ/dβ are LayerNorm's column sums over h: the kernels
// above (deterministic dx and two-pass dγ/dβ, no atomics) run on the saved h.
//
// Why it is fast: the composite reads x and r and writes h (one kernel), then LayerNorm reads h
// from HBM twice more (statistics, normalisation). Here one row group adds, reduces and
// normalises each row while it sits in L1/L2: x and r are read once from HBM, h and y written
// once. Row groups sized to the row (warp-sized for short rows), 128-bit stores on aligned rows,
// two-pass mean/variance in f32.

template <typename T, typename P>
__device__ __forceinline__ void resln_fwd(const T* x, const T* r, const P* gamma, const P* beta, T* h, T* y,
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

#define RESLN_TP(sfx, T, P)                                                                          \
    extern "C" __global__ void resln_fwd_##sfx(const T* x, const T* r, const P* gamma, const P* beta, \
                                               T* h, T* y, float* mean, float* rstd, i64 rows, i64 n, \
                                               float eps) {                                           \
        resln_fwd<T, P>(x, r, gamma, beta, h, y, mean, rstd, rows, n, eps);                           \
    }
RESLN_TP(f32, float, float)
RESLN_TP(f16, __half, __half)
RESLN_TP(bf16, bf16, bf16)
RESLN_TP(f16_pf32, __half, float)
RESLN_TP(bf16_pf32, bf16, float)
