// reduce.cu — sum (times a scale, so mean is free) and max/min with arg-index, over the last dim of
// a [rows, n] view or over the middle dim of an [outer, n, inner] view.
//
// sum_last_<t>(const T* x, T* out, i64 rows, i64 n, float scale)                 out[r] = scale * Σ_j x[r, j]
// max_last_<t>(const T* x, T* out, i64* idx, i64 rows, i64 n)   (also min_last)  idx may be null
// sum_mid_<t>(const T* x, T* out, i64 outer, i64 n, i64 inner, i64 chunk, float scale)
// sum_mid_partial_<t>(const T* x, float* part, i64 outer, i64 n, i64 inner, i64 chunk, float scale)
// sum_mid_finish_<t>(const float* part, T* out, i64 outer, i64 n, i64 inner, i64 chunk, float scale)
// max_mid_<t>(const T* x, T* out, i64* idx, i64 outer, i64 n, i64 inner)        (also min_mid)
//
// Reads x once; writes one value (and index) per output. Accumulation is always f32.
// Why it is fast — last dim: a block is blockDim.y row groups of blockDim.x threads (the host
// picks blockDim.x from n: a warp per row for short rows, up to 1024 threads for long ones);
// 128-bit loads on aligned rows; xor-butterfly + shared-memory tree, so the result does not depend
// on timing (deterministic).
// Middle dim: a 32 x 8 block covers 32 adjacent `inner` columns (coalesced loads), the 8 thread
// rows stride over n, then a fixed-order shared-memory sum. When outer*inner is too small to fill
// the GPU the host splits n into gridDim.z chunks of `chunk`: *_partial writes f32 partial sums to
// part[z][outer][inner] and *_finish sums the chunks in order — two passes, still deterministic,
// no atomics. Max/min propagate NaN and break ties toward the smaller index (first occurrence).

// ------------------------------------------------------------------ last dim
template <typename T>
__device__ __forceinline__ void sum_last_impl(const T* x, T* out, i64 rows, i64 n, float scale) {
    __shared__ float scratch[32];
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        float acc = 0.f;
        if (r < rows) row_visit(x + r * n, n, [&](i64, float v) { acc += v; });
        acc = row_sum(acc, scratch);
        if (r < rows && threadIdx.x == 0) out[r] = from_f32<T>(acc * scale);
    }
}

// Argmax/argmin combine: NaN wins, then the better value, then the smaller index.
template <bool IS_MAX>
__device__ __forceinline__ void arg_combine(float& v, i64& i, float v2, i64 i2) {
    const bool nan1 = v != v, nan2 = v2 != v2;
    bool take;
    if (nan1 || nan2) take = nan2 && (!nan1 || i2 < i);
    else if (v2 == v) take = i2 < i;
    else take = IS_MAX ? (v2 > v) : (v2 < v);
    if (take) { v = v2; i = i2; }
}

template <typename T, bool IS_MAX>
__device__ __forceinline__ void arg_last_impl(const T* x, T* out, i64* idx, i64 rows, i64 n) {
    __shared__ float sv[32];
    __shared__ i64 si[32];
    const float init = IS_MAX ? -SINTER_INF : SINTER_INF;
    const int warps = blockDim.x >> 5, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        float best = init;
        i64 bi = 0x7fffffffffffffffll;
        if (r < rows) row_visit(x + r * n, n, [&](i64 j, float v) { arg_combine<IS_MAX>(best, bi, v, j); });
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
            const i64 i2 = __shfl_xor_sync(0xffffffffu, bi, o);
            arg_combine<IS_MAX>(best, bi, v2, i2);
        }
        if (warps > 1) {
            __syncthreads();
            if (lane == 0) { sv[threadIdx.y * warps + w] = best; si[threadIdx.y * warps + w] = bi; }
            __syncthreads();
            best = lane < warps ? sv[threadIdx.y * warps + lane] : init;
            bi = lane < warps ? si[threadIdx.y * warps + lane] : 0x7fffffffffffffffll;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) {
                const float v2 = __shfl_xor_sync(0xffffffffu, best, o);
                const i64 i2 = __shfl_xor_sync(0xffffffffu, bi, o);
                arg_combine<IS_MAX>(best, bi, v2, i2);
            }
        }
        if (r < rows && threadIdx.x == 0) {
            if (bi == 0x7fffffffffffffffll) bi = 0;  // n == 0 or all +-inf ties never set it: first index
            out[r] = from_f32<T>(best);
            if (idx) idx[r] = bi;
        }
    }
}

// ------------------------------------------------------------------ middle dim
// Grid: x = ceil(inner / 32), y = min(outer, 65535) (grid-stride over outer), z = chunks of n.
template <typename Tin, typename Tout>
__device__ __forceinline__ void sum_mid_impl(const Tin* x, Tout* out, i64 outer, i64 n, i64 inner, i64 chunk,
                                             float scale) {
    __shared__ float sm[8][33];
    const i64 col = (i64)blockIdx.x * 32 + threadIdx.x;
    const i64 j0 = (i64)blockIdx.z * chunk;
    const i64 j1 = min(n, j0 + chunk);
    for (i64 o = blockIdx.y; o < outer; o += gridDim.y) {
        float acc = 0.f;
        if (col < inner)
            for (i64 j = j0 + threadIdx.y; j < j1; j += blockDim.y) acc += to_f32(x[(o * n + j) * inner + col]);
        sm[threadIdx.y][threadIdx.x] = acc;
        __syncthreads();
        if (threadIdx.y == 0 && col < inner) {
            float s = 0.f;
            for (int k = 0; k < (int)blockDim.y; ++k) s += sm[k][threadIdx.x];
            out[((i64)blockIdx.z * outer + o) * inner + col] = from_f32<Tout>(s * scale);
        }
        __syncthreads();
    }
}

// Thread per output (o, col), looping over n: coalesced across col.
template <typename T, bool IS_MAX>
__device__ __forceinline__ void arg_mid_impl(const T* x, T* out, i64* idx, i64 outer, i64 n, i64 inner) {
    const i64 total = outer * inner;
    for (i64 t = global_tid(); t < total; t += global_stride()) {
        const i64 o = t / inner, col = t - o * inner;
        float best = IS_MAX ? -SINTER_INF : SINTER_INF;
        i64 bi = 0;
        for (i64 j = 0; j < n; ++j) {
            const float v = to_f32(x[(o * n + j) * inner + col]);
            if (j == 0) { best = v; bi = 0; } else arg_combine<IS_MAX>(best, bi, v, j);
        }
        out[t] = from_f32<T>(best);
        if (idx) idx[t] = bi;
    }
}

#define REDUCE_T(sfx, T)                                                                             \
    extern "C" __global__ void sum_last_##sfx(const T* x, T* out, i64 rows, i64 n, float scale) {    \
        sum_last_impl<T>(x, out, rows, n, scale);                                                    \
    }                                                                                                \
    extern "C" __global__ void max_last_##sfx(const T* x, T* out, i64* idx, i64 rows, i64 n) {       \
        arg_last_impl<T, true>(x, out, idx, rows, n);                                                \
    }                                                                                                \
    extern "C" __global__ void min_last_##sfx(const T* x, T* out, i64* idx, i64 rows, i64 n) {       \
        arg_last_impl<T, false>(x, out, idx, rows, n);                                               \
    }                                                                                                \
    extern "C" __global__ void sum_mid_##sfx(const T* x, T* out, i64 outer, i64 n, i64 inner,        \
                                             i64 chunk, float scale) {                               \
        sum_mid_impl<T, T>(x, out, outer, n, inner, chunk, scale);                                   \
    }                                                                                                \
    extern "C" __global__ void sum_mid_partial_##sfx(const T* x, float* part, i64 outer, i64 n,      \
                                                     i64 inner, i64 chunk, float scale) {            \
        sum_mid_impl<T, float>(x, part, outer, n, inner, chunk, scale);                              \
    }                                                                                                \
    extern "C" __global__ void sum_mid_finish_##sfx(const float* part, T* out, i64 outer, i64 n,     \
                                                    i64 inner, i64 chunk, float scale) {             \
        sum_mid_impl<float, T>(part, out, outer, n, inner, chunk, scale);                            \
    }                                                                                                \
    extern "C" __global__ void max_mid_##sfx(const T* x, T* out, i64* idx, i64 outer, i64 n,         \
                                             i64 inner) {                                            \
        arg_mid_impl<T, true>(x, out, idx, outer, n, inner);                                         \
    }                                                                                                \
    extern "C" __global__ void min_mid_##sfx(const T* x, T* out, i64* idx, i64 outer, i64 n,         \
                                             i64 inner) {                                            \
        arg_mid_impl<T, false>(x, out, idx, outer, n, inner);                                        \
    }
REDUCE_T(f32, float)
REDUCE_T(f16, __half)
REDUCE_T(bf16, bf16)
