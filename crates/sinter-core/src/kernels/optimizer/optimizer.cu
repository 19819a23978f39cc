// optimizer.cu — the optimizer folder's device kernels (the AdamW/SGD updates and the step control
// block still live in sinter-cuda's adamw.cu): the global gradient norm in one pass.
//
// sumsq_multi_<t>(float* partial, i64 count, <SUMSQ_SLOTS slots: const T* x, i64 n>)
//     Σ x² of up to SUMSQ_SLOTS tensors in one launch (PyTorch's multi_tensor_apply shape: the
//     tensors travel in the kernel's parameters, nothing is uploaded, a captured CUDA graph
//     replays it as is). Slot s owns sumsq_blocks(n_s) consecutive blocks (a function of n_s
//     only, the same on every GPU); block b of slot s writes partial[b] = Σ x² over its
//     grid-stride share of that slot (stride = the slot's blocks × blockDim, f32 accumulation).
//     Each partial is what a launch over that tensor alone would give, so the grouping of
//     tensors into launches never changes a result. The first `count` slots are used.
// sumsq_finish(const float* partial, i64 count, float* out, int accumulate)
//     out[0] (+)= Σ partial, one block, fixed order. A non-finite result doubles as the "found
//     inf" flag; sqrt on the host (or in step_prepare).
//
// Why it is fast: every gradient is read once, with 128-bit loads where aligned, in one launch for
// a whole model (GPT-2's 148 tensors) plus the finish, instead of one launch per tensor. It is
// deterministic: fixed grids chosen from the sizes, fixed-order trees, no atomics.

#define SUMSQ_SLOTS 192
// Elements per block of a slot: sumsq_blocks(n) = clamp(ceil(n / (blockDim.x * SUMSQ_PER_THREAD)), 1, 1024).
#define SUMSQ_PER_THREAD 16
#define SUMSQ_MAX_BLOCKS 1024

__device__ __forceinline__ i64 sumsq_blocks(i64 n) {
    const i64 span = (i64)blockDim.x * SUMSQ_PER_THREAD;
    const i64 b = (n + span - 1) / span;
    return b < 1 ? 1 : (b > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : b);
}

template <typename T>
__device__ __forceinline__ void sumsq_multi_impl(float* partial, i64 count, const T* const* xs, const i64* ns) {
    __shared__ float scratch[32];
    // The slot of this block (every thread walks the same table, so the branch is uniform).
    i64 slot = 0, first = 0;
    while (slot < count && (i64)blockIdx.x >= first + sumsq_blocks(ns[slot])) {
        first += sumsq_blocks(ns[slot]);
        ++slot;
    }
    if (slot >= count) return;
    const T* x = xs[slot];
    const i64 n = ns[slot];
    constexpr int N = Pack128<T>::N;
    const i64 tid = (blockIdx.x - first) * blockDim.x + threadIdx.x;
    const i64 stride = sumsq_blocks(n) * blockDim.x;
    float acc = 0.f;
    i64 i0 = 0;
    if (aligned16(x)) {
        const i64 nv = n / N;
        for (i64 q = tid; q < nv; q += stride) {
            const Pack128<T> pk = load128(x + q * N);
#pragma unroll
            for (int k = 0; k < N; ++k) { const float f = to_f32(pk.v[k]); acc += f * f; }
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) { const float f = to_f32(x[i]); acc += f * f; }
    acc = row_sum(acc, scratch);  // 1-D block: one row group = the block
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// 192 slots as kernel parameters: 3 × 64, each 8 × 8 (x, n) pairs.
#define SQ_PARAM(T, b, k) const T *x##b##k, i64 n##b##k
#define SQ_STORE(T, b, k) xs[at] = x##b##k, ns[at] = n##b##k, ++at
#define SQ_8(M, T, b) M(T, b, 0), M(T, b, 1), M(T, b, 2), M(T, b, 3), M(T, b, 4), M(T, b, 5), M(T, b, 6), M(T, b, 7)
#define SQ_64(M, T, a) \
    SQ_8(M, T, a##0), SQ_8(M, T, a##1), SQ_8(M, T, a##2), SQ_8(M, T, a##3), SQ_8(M, T, a##4), SQ_8(M, T, a##5), \
        SQ_8(M, T, a##6), SQ_8(M, T, a##7)
#define SQ_ALL(M, T) SQ_64(M, T, 1), SQ_64(M, T, 2), SQ_64(M, T, 3)

// The slots go to shared memory once per block (thread 0 stores them in parameter order), so the
// walk can index them; kernel parameters cannot be indexed at run time without a copy per thread.
#define SUMSQ_MULTI(T, sfx)                                                                 \
    extern "C" __global__ void sumsq_multi_##sfx(float* partial, i64 count, SQ_ALL(SQ_PARAM, T)) { \
        __shared__ const T* xs[SUMSQ_SLOTS];                                                \
        __shared__ i64 ns[SUMSQ_SLOTS];                                                     \
        if (threadIdx.x == 0) {                                                             \
            int at = 0;                                                                     \
            SQ_ALL(SQ_STORE, T);                                                            \
        }                                                                                   \
        __syncthreads();                                                                    \
        sumsq_multi_impl<T>(partial, count < SUMSQ_SLOTS ? count : SUMSQ_SLOTS, xs, ns);    \
    }
SUMSQ_MULTI(float, f32)
SUMSQ_MULTI(__half, f16)
SUMSQ_MULTI(bf16, bf16)

extern "C" __global__ void sumsq_finish(const float* partial, i64 count, float* out, int accumulate) {
    __shared__ float scratch[32];
    float acc = 0.f;
    for (i64 i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = row_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = accumulate ? out[0] + acc : acc;
}
