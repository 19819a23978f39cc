// unary.cu — elementwise maps y = f(x; p0, p1), their backward, and fill.
//
// Reads:  forward: x[n];  backward: s[n] (the saved input x or output y, whichever that op's
//         derivative needs — see `UnaryOp::saves` in src/ops/unary.rs) and gy[n].
// Writes: forward: y[n];  backward: gx[n];  fill: y[n] = value.
// Why it is fast: one pass over memory (these ops are bandwidth-bound), 128-bit loads and stores on
// the aligned path (4 f32 or 8 f16/bf16 per instruction), math in f32 registers, grid-stride loops
// so the grid is sized to the GPU rather than to n. In-place (y == x) is allowed.
//
// Every kernel has the same signature, so one Rust launcher serves them all:
//   <op>_<t>(const T* x, T* y, i64 n, float p0, float p1)
//   <op>_bwd_<t>(const T* s, const T* gy, T* gx, i64 n, float p0, float p1)
// with t in {f32, f16, bf16}. p0/p1 are op parameters (powf: p0 = exponent; affine: y = x*p0 + p1).

#define K_SQRT_2_OVER_PI 0.7978845608028654f
#define K_GELU_C 0.044715f
#define K_INV_SQRT_2 0.7071067811865476f
#define K_INV_SQRT_2PI 0.3989422804014327f

__device__ __forceinline__ float sigmoidf_(float x) {
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    const float e = expf(x);
    return e / (1.f + e);
}

// Each op: f(x, p0, p1) forward; b(s, gy, p0, p1) backward where s is x or y (see header).
struct OpNeg     { static __device__ __forceinline__ float f(float x, float, float) { return -x; }
                   static __device__ __forceinline__ float b(float, float g, float, float) { return -g; } };
struct OpExp     { static __device__ __forceinline__ float f(float x, float, float) { return expf(x); }
                   static __device__ __forceinline__ float b(float y, float g, float, float) { return g * y; } };
struct OpLog     { static __device__ __forceinline__ float f(float x, float, float) { return logf(x); }
                   static __device__ __forceinline__ float b(float x, float g, float, float) { return g / x; } };
struct OpSqrt    { static __device__ __forceinline__ float f(float x, float, float) { return sqrtf(x); }
                   static __device__ __forceinline__ float b(float y, float g, float, float) { return 0.5f * g / y; } };
struct OpPowf    { static __device__ __forceinline__ float f(float x, float p, float) { return powf(x, p); }
                   static __device__ __forceinline__ float b(float x, float g, float p, float) {
                       return p == 0.f ? 0.f : g * p * powf(x, p - 1.f); } };
struct OpTanh    { static __device__ __forceinline__ float f(float x, float, float) { return tanhf(x); }
                   static __device__ __forceinline__ float b(float y, float g, float, float) { return g * (1.f - y * y); } };
struct OpSigmoid { static __device__ __forceinline__ float f(float x, float, float) { return sigmoidf_(x); }
                   static __device__ __forceinline__ float b(float y, float g, float, float) { return g * y * (1.f - y); } };
// PyTorch's relu: NaN and -0 pass through; the gradient is 0 only where x <= 0 (so 1 at NaN).
struct OpRelu    { static __device__ __forceinline__ float f(float x, float, float) { return x < 0.f ? 0.f : x; }
                   static __device__ __forceinline__ float b(float x, float g, float, float) { return x <= 0.f ? 0.f : g; } };
struct OpGeluTanh {
    static __device__ __forceinline__ float f(float x, float, float) {
        const float u = K_SQRT_2_OVER_PI * (x + K_GELU_C * x * x * x);
        return 0.5f * x * (1.f + tanhf(u));
    }
    static __device__ __forceinline__ float b(float x, float g, float, float) {
        const float u = K_SQRT_2_OVER_PI * (x + K_GELU_C * x * x * x);
        const float t = tanhf(u);
        const float du = K_SQRT_2_OVER_PI * (1.f + 3.f * K_GELU_C * x * x);
        return g * (0.5f * (1.f + t) + 0.5f * x * (1.f - t * t) * du);
    }
};
struct OpGeluErf {
    static __device__ __forceinline__ float f(float x, float, float) { return 0.5f * x * (1.f + erff(x * K_INV_SQRT_2)); }
    static __device__ __forceinline__ float b(float x, float g, float, float) {
        const float cdf = 0.5f * (1.f + erff(x * K_INV_SQRT_2));
        const float pdf = K_INV_SQRT_2PI * expf(-0.5f * x * x);
        return g * (cdf + x * pdf);
    }
};
struct OpSilu {
    static __device__ __forceinline__ float f(float x, float, float) { return x * sigmoidf_(x); }
    static __device__ __forceinline__ float b(float x, float g, float, float) {
        const float s = sigmoidf_(x);
        return g * s * (1.f + x * (1.f - s));
    }
};
struct OpAbs     { static __device__ __forceinline__ float f(float x, float, float) { return fabsf(x); }
                   static __device__ __forceinline__ float b(float x, float g, float, float) {
                       return x > 0.f ? g : (x < 0.f ? -g : 0.f); } };
struct OpRecip   { static __device__ __forceinline__ float f(float x, float, float) { return 1.f / x; }
                   static __device__ __forceinline__ float b(float y, float g, float, float) { return -g * y * y; } };
struct OpAffine  { static __device__ __forceinline__ float f(float x, float a, float c) { return fmaf(x, a, c); }
                   static __device__ __forceinline__ float b(float, float g, float a, float) { return g * a; } };

template <typename T, typename Op>
__device__ __forceinline__ void unary_fwd(const T* x, T* y, i64 n, float p0, float p1) {
    constexpr int N = Pack128<T>::N;
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    if (aligned16(x) && aligned16(y)) {
        const i64 nv = n / N;
        for (i64 v = tid; v < nv; v += stride) {
            const Pack128<T> a = load128(x + v * N);
            Pack128<T> r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = from_f32<T>(Op::f(to_f32(a.v[k]), p0, p1));
            store128(y + v * N, r);
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) y[i] = from_f32<T>(Op::f(to_f32(x[i]), p0, p1));
}

template <typename T, typename Op>
__device__ __forceinline__ void unary_bwd(const T* s, const T* gy, T* gx, i64 n, float p0, float p1) {
    constexpr int N = Pack128<T>::N;
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    if (aligned16(s) && aligned16(gy) && aligned16(gx)) {
        const i64 nv = n / N;
        for (i64 v = tid; v < nv; v += stride) {
            const Pack128<T> a = load128(s + v * N);
            const Pack128<T> g = load128(gy + v * N);
            Pack128<T> r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = from_f32<T>(Op::b(to_f32(a.v[k]), to_f32(g.v[k]), p0, p1));
            store128(gx + v * N, r);
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride)
        gx[i] = from_f32<T>(Op::b(to_f32(s[i]), to_f32(gy[i]), p0, p1));
}

#define UNARY_T(name, Op, sfx, T)                                                                    \
    extern "C" __global__ void name##_##sfx(const T* x, T* y, i64 n, float p0, float p1) {           \
        unary_fwd<T, Op>(x, y, n, p0, p1);                                                           \
    }                                                                                                \
    extern "C" __global__ void name##_bwd_##sfx(const T* s, const T* gy, T* gx, i64 n, float p0,     \
                                                float p1) {                                          \
        unary_bwd<T, Op>(s, gy, gx, n, p0, p1);                                                      \
    }
#define UNARY(name, Op) UNARY_T(name, Op, f32, float) UNARY_T(name, Op, f16, __half) UNARY_T(name, Op, bf16, bf16)

UNARY(neg, OpNeg)
UNARY(exp, OpExp)
UNARY(log, OpLog)
UNARY(sqrt, OpSqrt)
UNARY(powf, OpPowf)
UNARY(tanh, OpTanh)
UNARY(sigmoid, OpSigmoid)
UNARY(relu, OpRelu)
UNARY(gelu_tanh, OpGeluTanh)
UNARY(gelu_erf, OpGeluErf)
UNARY(silu, OpSilu)
UNARY(abs, OpAbs)
UNARY(recip, OpRecip)
UNARY(affine, OpAffine)

// fill_<t>(T* y, i64 n, float value)
template <typename T>
__device__ __forceinline__ void fill_impl(T* y, i64 n, float value) {
    constexpr int N = Pack128<T>::N;
    const T v = from_f32<T>(value);
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    if (aligned16(y)) {
        Pack128<T> p;
#pragma unroll
        for (int k = 0; k < N; ++k) p.v[k] = v;
        const i64 nv = n / N;
        for (i64 i = tid; i < nv; i += stride) store128(y + i * N, p);
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) y[i] = v;
}
extern "C" __global__ void fill_f32(float* y, i64 n, float value) { fill_impl<float>(y, n, value); }
extern "C" __global__ void fill_f16(__half* y, i64 n, float value) { fill_impl<__half>(y, n, value); }
extern "C" __global__ void fill_bf16(bf16* y, i64 n, float value) { fill_impl<bf16>(y, n, value); }
