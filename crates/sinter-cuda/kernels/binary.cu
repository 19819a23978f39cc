// binary.cu — elementwise float arithmetic out = a (op) b, on contiguous inputs and on
// strided/broadcast inputs (up to 6 dims, stride 0 = broadcast). Comparisons (bool outputs) and
// where (bool condition) are bool.cu's.
//
// Reads:  a[n], b[n], through strides on the *_strided variants.
// Writes: out[n], always contiguous (row-major over the broadcast shape).
// Why it is fast: the contiguous path moves 128 bits per load/store per operand with grid-stride
// loops; the strided path decodes the index with 32-bit division when n < 2^31 and the host first
// merges dims that are contiguous in every operand (src/launch.rs `coalesce`), so the common
// "bias over rows" broadcast becomes a 2-dim problem.
//
//   <op>_<t>(const T* a, const T* b, T* out, i64 n)     op: add sub mul div floor_div maximum minimum
//   <op>_strided_<t>(const T* a, const T* b, T* out, i64 n, StridedMeta m)   strides[0]=a, [1]=b

struct OpAdd { static __device__ __forceinline__ float f(float a, float b) { return a + b; } };
struct OpSub { static __device__ __forceinline__ float f(float a, float b) { return a - b; } };
struct OpMul { static __device__ __forceinline__ float f(float a, float b) { return a * b; } };
struct OpDiv { static __device__ __forceinline__ float f(float a, float b) { return a / b; } };
// torch.floor_divide (sinter_types::floor_div_f32): the quotient from the exact remainder, rounded
// toward -inf; a zero quotient keeps the true quotient's sign; b == 0 is IEEE division.
struct OpFloorDiv {
    static __device__ __forceinline__ float f(float a, float b) {
        if (b == 0.f) return a / b;
        const float rem = fmodf(a, b);
        float div = (a - rem) / b;
        if (rem != 0.f && ((b < 0.f) != (rem < 0.f))) div -= 1.f;
        if (div == 0.f) return copysignf(0.f, a / b);
        const float fl = floorf(div);
        return div - fl > 0.5f ? fl + 1.f : fl;
    }
};
// maximum/minimum propagate NaN (like torch.maximum), unlike fmaxf.
struct OpMaximum { static __device__ __forceinline__ float f(float a, float b) { return (a > b || a != a) ? a : b; } };
struct OpMinimum { static __device__ __forceinline__ float f(float a, float b) { return (a < b || a != a) ? a : b; } };

template <typename T, typename Op>
__device__ __forceinline__ void binary_contig(const T* a, const T* b, T* out, i64 n) {
    constexpr int N = Pack128<T>::N;
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    if (aligned16(a) && aligned16(b) && aligned16(out)) {
        const i64 nv = n / N;
        for (i64 v = tid; v < nv; v += stride) {
            const Pack128<T> pa = load128(a + v * N);
            const Pack128<T> pb = load128(b + v * N);
            Pack128<T> r;
#pragma unroll
            for (int k = 0; k < N; ++k) r.v[k] = from_f32<T>(Op::f(to_f32(pa.v[k]), to_f32(pb.v[k])));
            store128(out + v * N, r);
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) out[i] = from_f32<T>(Op::f(to_f32(a[i]), to_f32(b[i])));
}

template <typename T, typename Op>
__device__ __forceinline__ void binary_strided(const T* a, const T* b, T* out, i64 n, const StridedMeta& m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[2];
        strided_offsets<2>(m, i, n, off);
        out[i] = from_f32<T>(Op::f(to_f32(a[off[0]]), to_f32(b[off[1]])));
    }
}

#define BINARY_T(name, Op, sfx, T)                                                                   \
    extern "C" __global__ void name##_##sfx(const T* a, const T* b, T* out, i64 n) {                 \
        binary_contig<T, Op>(a, b, out, n);                                                          \
    }                                                                                                \
    extern "C" __global__ void name##_strided_##sfx(const T* a, const T* b, T* out, i64 n,           \
                                                    StridedMeta m) {                                 \
        binary_strided<T, Op>(a, b, out, n, m);                                                      \
    }
#define BINARY(name, Op) BINARY_T(name, Op, f32, float) BINARY_T(name, Op, f16, __half) BINARY_T(name, Op, bf16, bf16)

BINARY(add, OpAdd)
BINARY(sub, OpSub)
BINARY(mul, OpMul)
BINARY(div, OpDiv)
BINARY(floor_div, OpFloorDiv)
BINARY(maximum, OpMaximum)
BINARY(minimum, OpMinimum)
