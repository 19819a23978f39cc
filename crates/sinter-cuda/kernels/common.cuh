// common.cuh — the prelude that sinter-cuda prepends to every kernel file before NVRTC compiles it
// (each .cu file is compiled as its own program; NVRTC gets no include path for our own files).
//
// Holds: fixed-width typedefs (NVRTC has no <stdint.h>), f32 <-> f16/bf16/int conversions, a
// 128-bit "pack" for vectorised loads and stores, warp and row reductions whose summation order is
// fixed (so results are bit-identical run to run), and the strided-index helper shared by the
// broadcast/strided kernels. Nothing here launches; it is all __device__ inline code.
#include <cuda_fp16.h>
#include <cuda_bf16.h>

typedef long long i64;
typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef __nv_bfloat16 bf16;

#define SINTER_INF __int_as_float(0x7f800000)
#define SINTER_NAN __int_as_float(0x7fffffff)
#define SINTER_MAX_DIMS 6

// ---------------------------------------------------------------------------------------------
// Conversions. All arithmetic happens in f32 registers; storage types convert on load/store.
template <typename T> struct Cvt;
template <> struct Cvt<float> {
    static __device__ __forceinline__ float to(float x) { return x; }
    static __device__ __forceinline__ float from(float x) { return x; }
};
template <> struct Cvt<__half> {
    static __device__ __forceinline__ float to(__half x) { return __half2float(x); }
    static __device__ __forceinline__ __half from(float x) { return __float2half_rn(x); }
};
template <> struct Cvt<bf16> {
    static __device__ __forceinline__ float to(bf16 x) { return __bfloat162float(x); }
    static __device__ __forceinline__ bf16 from(float x) { return __float2bfloat16_rn(x); }
};
template <> struct Cvt<i64> {
    static __device__ __forceinline__ float to(i64 x) { return (float)x; }
    static __device__ __forceinline__ i64 from(float x) { return (i64)x; }  // truncates toward 0
};
template <> struct Cvt<int> {
    static __device__ __forceinline__ float to(int x) { return (float)x; }
    static __device__ __forceinline__ int from(float x) { return (int)x; }
};
template <> struct Cvt<u8> {
    static __device__ __forceinline__ float to(u8 x) { return (float)x; }
    static __device__ __forceinline__ u8 from(float x) { return (u8)(int)x; }
};

template <typename T> __device__ __forceinline__ float to_f32(T x) { return Cvt<T>::to(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x) { return Cvt<T>::from(x); }

// ---------------------------------------------------------------------------------------------
// 128-bit packs: 4 x f32 or 8 x f16/bf16 moved with one ld.global.v4 / st.global.v4.
template <typename T> struct __align__(16) Pack128 {
    static constexpr int N = 16 / sizeof(T);
    T v[16 / sizeof(T)];
};
template <typename T> __device__ __forceinline__ Pack128<T> load128(const T* p) {
    Pack128<T> r;
    *reinterpret_cast<int4*>(&r) = *reinterpret_cast<const int4*>(p);
    return r;
}
template <typename T> __device__ __forceinline__ void store128(T* p, const Pack128<T>& r) {
    *reinterpret_cast<int4*>(p) = *reinterpret_cast<const int4*>(&r);
}
__device__ __forceinline__ bool aligned16(const void* p) {
    return (reinterpret_cast<u64>(p) & 15ull) == 0;
}

__device__ __forceinline__ i64 global_tid() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 global_stride() { return (i64)blockDim.x * gridDim.x; }

// ---------------------------------------------------------------------------------------------
// Reductions. The xor-butterfly leaves the same value in every lane and always adds in the same
// order, so results do not depend on timing: every reduction in sinter is deterministic.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// "Row groups": a block is blockDim.y groups of blockDim.x threads (blockDim.x a multiple of 32,
// blockDim.x * blockDim.y <= 1024); group threadIdx.y owns one row. `scratch` is 32 floats of
// shared memory. Every thread of the block must call this (it synchronises the block); every
// thread of the group gets the group's sum.
__device__ __forceinline__ float row_sum(float v, float* scratch) {
    v = warp_sum(v);
    const int warps = blockDim.x >> 5;
    if (warps == 1) return v;  // uniform across the block
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float* s = scratch + threadIdx.y * warps;
    __syncthreads();  // the previous use of scratch is finished
    if (lane == 0) s[w] = v;
    __syncthreads();
    return warp_sum(lane < warps ? s[lane] : 0.f);
}
__device__ __forceinline__ float row_max(float v, float* scratch) {
    v = warp_max(v);
    const int warps = blockDim.x >> 5;
    if (warps == 1) return v;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float* s = scratch + threadIdx.y * warps;
    __syncthreads();
    if (lane == 0) s[w] = v;
    __syncthreads();
    return warp_max(lane < warps ? s[lane] : -SINTER_INF);
}

// Online softmax statistics: (m, s) = (running max, sum of exp(x - m)).
__device__ __forceinline__ void ms_push(float& m, float& s, float x) {
    if (x > m) {
        s = (m == -SINTER_INF ? 0.f : s * expf(m - x)) + 1.f;
        m = x;
    } else if (x == x) {
        if (x != -SINTER_INF) s += expf(x - m);  // exp(-inf) = 0; avoids (-inf) - (-inf)
    } else {  // NaN poisons the row, as in PyTorch
        m = x;
    }
}
__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
    if (m != m || m2 != m2) { m = SINTER_NAN; s = SINTER_NAN; return; }
    const float mx = fmaxf(m, m2);
    if (mx == -SINTER_INF) { m = mx; s = 0.f; return; }
    s = (m == -SINTER_INF ? 0.f : s * expf(m - mx)) + (m2 == -SINTER_INF ? 0.f : s2 * expf(m2 - mx));
    m = mx;
}
// Online (max, rest) of a row: rest = Σ exp(x - max) over every element but one maximum, so that
// ln Σ exp(x - max) = log1pf(rest) keeps rest's digits when the max dominates (cross-entropy,
// log-softmax).
__device__ __forceinline__ void mr_push(float& m, float& rest, float x) {
    if (x > m) {
        // The old maximum becomes one of the rest.
        rest = m == -SINTER_INF ? 0.f : (rest + 1.f) * expf(m - x);
        m = x;
    } else if (x == x) {
        if (x != -SINTER_INF) rest += expf(x - m);  // exp(-inf) = 0; avoids (-inf) - (-inf)
    } else {  // NaN poisons the row, as in PyTorch
        m = x;
    }
}
__device__ __forceinline__ void mr_merge(float& m, float& rest, float m2, float rest2) {
    if (m != m || m2 != m2) { m = SINTER_NAN; rest = SINTER_NAN; return; }
    if (m2 == -SINTER_INF) return;  // nothing on the other side (or only -inf)
    if (m == -SINTER_INF) { m = m2; rest = rest2; return; }
    // The larger maximum stays the max; the other side's maximum joins the rest.
    if (m >= m2) rest += (rest2 + 1.f) * expf(m2 - m);
    else { rest = rest2 + (rest + 1.f) * expf(m - m2); m = m2; }
}

// Row-group reduction of a pair of statistics (a, b) with `merge(a, b, a2, b2)`: a warp's
// butterfly, then across the warps of the row group; lanes past the warps start from (a0, b0),
// merge's identity. `scratch` is 64 floats of shared memory.
template <typename Merge>
__device__ __forceinline__ void row_pair(float& a, float& b, float a0, float b0, float* scratch, Merge merge) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, a, o);
        const float b2 = __shfl_xor_sync(0xffffffffu, b, o);
        merge(a, b, a2, b2);
    }
    const int warps = blockDim.x >> 5;
    if (warps == 1) return;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float* sa = scratch + threadIdx.y * warps;
    float* sb = scratch + 32 + threadIdx.y * warps;
    __syncthreads();
    if (lane == 0) { sa[w] = a; sb[w] = b; }
    __syncthreads();
    a = lane < warps ? sa[lane] : a0;
    b = lane < warps ? sb[lane] : b0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, a, o);
        const float b2 = __shfl_xor_sync(0xffffffffu, b, o);
        merge(a, b, a2, b2);
    }
}
// Row-group reduction of (m, rest) (see mr_push); `scratch` is 64 floats of shared memory.
__device__ __forceinline__ void row_mr(float& m, float& rest, float* scratch) {
    row_pair(m, rest, -SINTER_INF, 0.f, scratch,
             [](float& m1, float& r1, float m2, float r2) { mr_merge(m1, r1, m2, r2); });
}
// Row-group reduction of (m, s); `scratch` is 64 floats of shared memory.
__device__ __forceinline__ void row_ms(float& m, float& s, float* scratch) {
    row_pair(m, s, -SINTER_INF, 0.f, scratch,
             [](float& m1, float& s1, float m2, float s2) { ms_merge(m1, s1, m2, s2); });
}

// Visit this thread's share of a row (elements threadIdx.x, +blockDim.x, ...), 128 bits at a time
// when the row is 16-byte aligned. The visiting order is fixed, so sums stay deterministic.
template <typename T, typename F>
__device__ __forceinline__ void row_visit(const T* row, i64 n, F&& f) {
    constexpr int N = Pack128<T>::N;
    const int tx = threadIdx.x, bx = blockDim.x;
    i64 j0 = 0;
    if (aligned16(row)) {
        const i64 nv = n / N;
        for (i64 v = tx; v < nv; v += bx) {
            const Pack128<T> p = load128(row + v * N);
#pragma unroll
            for (int k = 0; k < N; ++k) f(v * N + k, to_f32(p.v[k]));
        }
        j0 = nv * N;
    }
    for (i64 j = j0 + tx; j < n; j += bx) f(j, to_f32(row[j]));
}
// Same, over two rows of the same length at once (both must be aligned for the vector path).
template <typename T, typename U, typename F>
__device__ __forceinline__ void row_visit2(const T* a, const U* b, i64 n, F&& f) {
    constexpr int N = Pack128<T>::N;
    const int tx = threadIdx.x, bx = blockDim.x;
    i64 j0 = 0;
    if constexpr (sizeof(T) == sizeof(U)) {
        if (aligned16(a) && aligned16(b)) {
            const i64 nv = n / N;
            for (i64 v = tx; v < nv; v += bx) {
                const Pack128<T> pa = load128(a + v * N);
                const Pack128<U> pb = load128(b + v * N);
#pragma unroll
                for (int k = 0; k < N; ++k) f(v * N + k, to_f32(pa.v[k]), to_f32(pb.v[k]));
            }
            j0 = nv * N;
        }
    }
    for (i64 j = j0 + tx; j < n; j += bx) f(j, to_f32(a[j]), to_f32(b[j]));
}
// Write out[j] = g(j) for this thread's share of a row, vectorised when out is aligned.
template <typename T, typename G>
__device__ __forceinline__ void row_write(T* out, i64 n, G&& g) {
    constexpr int N = Pack128<T>::N;
    const int tx = threadIdx.x, bx = blockDim.x;
    i64 j0 = 0;
    if (aligned16(out)) {
        const i64 nv = n / N;
        for (i64 v = tx; v < nv; v += bx) {
            Pack128<T> p;
#pragma unroll
            for (int k = 0; k < N; ++k) p.v[k] = from_f32<T>(g(v * N + k));
            store128(out + v * N, p);
        }
        j0 = nv * N;
    }
    for (i64 j = j0 + tx; j < n; j += bx) out[j] = from_f32<T>(g(j));
}

// ---------------------------------------------------------------------------------------------
// Strided / broadcast indexing: up to 6 dims, up to 3 operands; a broadcast dim has stride 0.
// Must match `StridedMeta` in src/launch.rs byte for byte (200 bytes, 8-aligned).
struct StridedMeta {
    i64 shape[SINTER_MAX_DIMS];
    i64 strides[3][SINTER_MAX_DIMS];
    int ndim;
    int pad_;
};

// Element offsets of logical (row-major) index i in K operands. 32-bit math when it fits,
// because 64-bit division costs several times more.
template <int K>
__device__ __forceinline__ void strided_offsets(const StridedMeta& m, i64 i, i64 n, i64* off) {
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = 0;
    if (n <= 0x7fffffffll) {
        u32 r = (u32)i;
        for (int d = m.ndim - 1; d >= 0; --d) {
            const u32 s = (u32)m.shape[d];
            const u32 q = r / s;
            const u32 c = r - q * s;
            r = q;
#pragma unroll
            for (int k = 0; k < K; ++k) off[k] += (i64)c * m.strides[k][d];
        }
    } else {
        i64 r = i;
        for (int d = m.ndim - 1; d >= 0; --d) {
            const i64 s = m.shape[d];
            const i64 q = r / s;
            const i64 c = r - q * s;
            r = q;
#pragma unroll
            for (int k = 0; k < K; ++k) off[k] += c * m.strides[k][d];
        }
    }
}
