// copy.cu — strided copies (what `contiguous()` and strided writes need) and dtype casts.
//
// strided_copy_<w>(const W* src, W* dst, i64 n, StridedMeta m)
//   Reads src through strides[0], writes dst through strides[1] (pass row-major strides for a
//   contiguous destination); n = product of m.shape. W is a plain word of the element's width
//   (u8/u16/u32/u64), so one kernel serves every dtype of that size: copies never need arithmetic.
// cast_<from>_<to>(const A* x, B* y, i64 n)
//   Contiguous dtype conversion among f32, f16, bf16, i64, i32, u8, bool. Float -> int truncates
//   toward zero (as PyTorch); float targets round to nearest even; int <-> int converts directly;
//   anything -> bool is `x != 0` (NaN is true, as torch), bool -> anything is 1 or 0.
// Why it is fast: copies are bandwidth-bound; the host merges dims that are contiguous in both
// operands first (so a transposed last-two-dims copy is a 2-dim problem, and a plain slice is 1
// dim), index decoding uses 32-bit division when n < 2^31, and casts use 128-bit loads of the
// source when aligned.

template <typename W>
__device__ __forceinline__ void strided_copy_impl(const W* src, W* dst, i64 n, const StridedMeta& m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[2];
        strided_offsets<2>(m, i, n, off);
        dst[off[1]] = src[off[0]];
    }
}
extern "C" __global__ void strided_copy_u8(const u8* src, u8* dst, i64 n, StridedMeta m) { strided_copy_impl<u8>(src, dst, n, m); }
extern "C" __global__ void strided_copy_u16(const u16* src, u16* dst, i64 n, StridedMeta m) { strided_copy_impl<u16>(src, dst, n, m); }
extern "C" __global__ void strided_copy_u32(const u32* src, u32* dst, i64 n, StridedMeta m) { strided_copy_impl<u32>(src, dst, n, m); }
extern "C" __global__ void strided_copy_u64(const u64* src, u64* dst, i64 n, StridedMeta m) { strided_copy_impl<u64>(src, dst, n, m); }

// torch.bool: a byte holding 0 or 1, its own type here so that casts to and from it are not the
// u8 (integer) casts. Through f32 a value is true when non-zero: no integer rounds to 0 in f32,
// and NaN != 0.
struct boolean { u8 v; };
template <> struct Cvt<boolean> {
    static __device__ __forceinline__ float to(boolean x) { return x.v ? 1.f : 0.f; }
    static __device__ __forceinline__ boolean from(float x) { boolean b; b.v = x != 0.f ? 1 : 0; return b; }
};

// Conversion rule: through f32 unless both ends are integers.
template <typename A, typename B> struct CastOp {
    static __device__ __forceinline__ B go(A x) { return from_f32<B>(to_f32<A>(x)); }
};
#define INT_CAST(A, B) \
    template <> struct CastOp<A, B> { static __device__ __forceinline__ B go(A x) { return (B)x; } };
INT_CAST(i64, int)
INT_CAST(int, i64)
INT_CAST(i64, u8)
INT_CAST(u8, i64)
INT_CAST(int, u8)
INT_CAST(u8, int)
// i64/i32 -> f32 directly (one rounding), f32 -> f32 identity is already exact.
template <> struct CastOp<i64, __half> { static __device__ __forceinline__ __half go(i64 x) { return __float2half_rn((float)x); } };

template <typename A, typename B>
__device__ __forceinline__ void cast_impl(const A* x, B* y, i64 n) {
    constexpr int N = Pack128<A>::N;
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    if (aligned16(x)) {
        const i64 nv = n / N;
        for (i64 v = tid; v < nv; v += stride) {
            const Pack128<A> p = load128(x + v * N);
#pragma unroll
            for (int k = 0; k < N; ++k) y[v * N + k] = CastOp<A, B>::go(p.v[k]);
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) y[i] = CastOp<A, B>::go(x[i]);
}

#define CAST(an, A, bn, B) \
    extern "C" __global__ void cast_##an##_##bn(const A* x, B* y, i64 n) { cast_impl<A, B>(x, y, n); }
#define CAST_FROM(an, A)                                                                             \
    CAST(an, A, f32, float) CAST(an, A, f16, __half) CAST(an, A, bf16, bf16) CAST(an, A, i64, i64)   \
    CAST(an, A, i32, int) CAST(an, A, u8, u8) CAST(an, A, bool, boolean)
CAST_FROM(f32, float)
CAST_FROM(f16, __half)
CAST_FROM(bf16, bf16)
CAST_FROM(i64, i64)
CAST_FROM(i32, int)
CAST_FROM(u8, u8)
CAST_FROM(bool, boolean)
