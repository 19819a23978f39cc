// classifier.cu — llm.c's fused classifier: the mean cross-entropy of logits [rows, n] against
// class indices, and in the same pass its gradient, written over the logits.
//
// fused_classifier_<t>(const T* logits, const i64* target, const float* scale, float* loss,
//                      T* dlogits, i64 rows, i64 n, i64 valid, i64 ignore_index)
//     Columns valid..n are padding (the vocabulary rounded up for the GEMMs): they count as
//     -inf in the softmax and get gradient 0. Per row r with t = target[r]:
//       loss[r]       = ln Σ_{j<valid} exp(x_j - max) - (x_t - max), 0 where t == ignore_index,
//                       NaN when t is out of [0, valid) (the host checks targets first);
//       dlogits[r, j] = (softmax(x)_j - [j == t]) * scale[0]   (0 for ignored rows),
//     scale[0] being dloss_scale (1 / the number of counted rows for the mean). dlogits may be
//     the logits' own memory: every thread of a row group reads the whole row (pass 1) before
//     the group's reduction, and in pass 2 each thread reads x_j just before writing j.
//     The loss of a counted row is written by the thread that visits its target in pass 2,
//     from its own read (no other thread may have overwritten x_t yet).
// classifier_grad_scale_<t>(const T* d, const float* g, T* out, i64 count)
//     out = d * g[0], out being d's memory; nothing is read or written when g[0] == 1 (the
//     seed of loss.backward()), so the usual step pays no second pass over the logits.
//
// Why it is fast: one read and one write of the logits in the compute dtype for loss and
// gradient together (the unfused pair reads them twice and writes the gradient once), no fp32
// probabilities, and no second [rows, n] buffer.

template <typename T>
__device__ __forceinline__ void fused_cls(const T* logits, const i64* target, const float* scale,
                                          float* loss, T* dlogits, i64 rows, i64 n, i64 valid,
                                          i64 ignore_index) {
    __shared__ float scratch[64];
    const float s = scale[0];
    for (i64 r0 = (i64)blockIdx.x * blockDim.y; r0 < rows; r0 += (i64)gridDim.x * blockDim.y) {
        const i64 r = r0 + threadIdx.y;
        const bool live = r < rows;
        float m = -SINTER_INF, rest = 0.f;
        if (live) row_visit(logits + r * n, valid, [&](i64, float v) { mr_push(m, rest, v); });
        row_mr(m, rest, scratch);  // every thread of the block: the loop bound is uniform
        if (!live) continue;
        const i64 t = target[r];
        const bool ignored = t == ignore_index;
        if (threadIdx.x == 0 && (ignored || t < 0 || t >= valid)) loss[r] = ignored ? 0.f : SINTER_NAN;
        const float log_sum = log1pf(rest);  // ln Σ exp(x - m)
        const T* xr = logits + r * n;
        row_write(dlogits + r * n, n, [&](i64 j) {
            if (ignored || j >= valid) return 0.f;
            const float z = (to_f32(xr[j]) - m) - log_sum;  // log p_j
            if (j == t) {
                loss[r] = -z;
                return expm1f(z) * s;  // p - 1 kept exact when p is within an ulp of 1
            }
            return expf(z) * s;
        });
    }
}

template <typename T>
__device__ __forceinline__ void cls_grad_scale(const T* d, const float* g, T* out, i64 count) {
    const float k = g[0];
    if (k == 1.f) return;
    for (i64 i = global_tid(); i < count; i += global_stride()) out[i] = from_f32<T>(to_f32(d[i]) * k);
}

#define CLS_T(sfx, T)                                                                                \
    extern "C" __global__ void fused_classifier_##sfx(const T* logits, const i64* target,           \
                                                      const float* scale, float* loss, T* dlogits,  \
                                                      i64 rows, i64 n, i64 valid, i64 ignore_index) { \
        fused_cls<T>(logits, target, scale, loss, dlogits, rows, n, valid, ignore_index);            \
    }                                                                                                \
    extern "C" __global__ void classifier_grad_scale_##sfx(const T* d, const float* g, T* out,      \
                                                           i64 count) {                             \
        cls_grad_scale<T>(d, g, out, count);                                                         \
    }
CLS_T(f32, float)
CLS_T(f16, __half)
CLS_T(bf16, bf16)
