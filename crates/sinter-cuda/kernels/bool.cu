// bool.cu — torch.bool on the device: comparisons that write bools, where/masked_fill with a bool
// condition, the two-bool ops (or, and), a bool fill, and the reductions of bools (count, any,
// all, first true) read straight from the bytes. A bool is one byte holding 0 or 1.
//
// Reads:  a[n], b[n] (and the condition c[n] for where) through strides (stride 0 = broadcast).
// Writes: out[n], contiguous (row-major over the broadcast shape), bytes 0/1 for bool outputs.
// Why it is fast enough: the ops are bandwidth-bound; the host merges dims that are contiguous in
// every operand first (src/launch.rs `coalesce`), so contiguous operands are a 1-dim problem and a
// row broadcast a 2-dim one, and index decoding uses 32-bit division when n < 2^31.
//
//   cmp_<op>_<t>(const T* a, const T* b, u8* out, i64 n, StridedMeta m)
//        op: eq ne lt le gt ge; t: f32 f16 bf16 i64 bool. NaN != NaN; every other comparison
//        with NaN is false (IEEE, as torch). Floats compare as f32 (exact for f16/bf16), i64
//        exactly, bools as 0 < 1.
//   bool_or(const u8* a, const u8* b, u8* out, i64 n, StridedMeta m)    a | b (+ and maximum)
//   bool_and(const u8* a, const u8* b, u8* out, i64 n, StridedMeta m)   a & b (* and minimum)
//   where_cond_<t>(const u8* c, const T* a, const T* b, T* out, i64 n, StridedMeta m)
//        out = c ? a : b, elements moved (never converted); t: f32 f16 bf16 i64 bool.
//   fill_bool(u8* out, i64 n, int v)                                    out = v != 0
//   bool_reduce_i64(const u8* x, i64* out, i64 outer, i64 n, i64 inner, int op)
//   bool_reduce_bool(const u8* x, u8* out, i64 outer, i64 n, i64 inner, int op)
//        over the middle dim of a contiguous [outer, n, inner] (n >= 1), one thread per output
//        (as int.cu's int_reduce_i64, whose op codes these share): op 0 sum = the count of true
//        values, 1 max = any, 2 min = all, 3 argmax = the index of the first true (0 when none
//        is: the first of equal maxima). Sums and argmax write i64, max and min bools.

// What a comparison compares: f32 for floats (f16/bf16 widen exactly), the integer itself else.
__device__ __forceinline__ float cmp_key(float x) { return x; }
__device__ __forceinline__ float cmp_key(__half x) { return __half2float(x); }
__device__ __forceinline__ float cmp_key(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ i64 cmp_key(i64 x) { return x; }
__device__ __forceinline__ int cmp_key(u8 x) { return x; }

struct CmpEq { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a == b; } };
struct CmpNe { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a != b; } };
struct CmpLt { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a < b; } };
struct CmpLe { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a <= b; } };
struct CmpGt { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a > b; } };
struct CmpGe { template <typename K> static __device__ __forceinline__ bool f(K a, K b) { return a >= b; } };

template <typename T, typename Op>
__device__ __forceinline__ void compare_strided(const T* a, const T* b, u8* out, i64 n, const StridedMeta& m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[2];
        strided_offsets<2>(m, i, n, off);
        out[i] = Op::f(cmp_key(a[off[0]]), cmp_key(b[off[1]])) ? 1 : 0;
    }
}

#define CMP_T(name, Op, sfx, T)                                                                      \
    extern "C" __global__ void cmp_##name##_##sfx(const T* a, const T* b, u8* out, i64 n,            \
                                                  StridedMeta m) {                                   \
        compare_strided<T, Op>(a, b, out, n, m);                                                     \
    }
#define CMP(name, Op)                                                                                \
    CMP_T(name, Op, f32, float) CMP_T(name, Op, f16, __half) CMP_T(name, Op, bf16, bf16)             \
    CMP_T(name, Op, i64, i64) CMP_T(name, Op, bool, u8)

CMP(eq, CmpEq)
CMP(ne, CmpNe)
CMP(lt, CmpLt)
CMP(le, CmpLe)
CMP(gt, CmpGt)
CMP(ge, CmpGe)

// Two bools: the operands are 0/1 bytes, so | and & give 0/1 again.
extern "C" __global__ void bool_or(const u8* a, const u8* b, u8* out, i64 n, StridedMeta m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[2];
        strided_offsets<2>(m, i, n, off);
        out[i] = (u8)((a[off[0]] | b[off[1]]) != 0);
    }
}
extern "C" __global__ void bool_and(const u8* a, const u8* b, u8* out, i64 n, StridedMeta m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[2];
        strided_offsets<2>(m, i, n, off);
        out[i] = (u8)((a[off[0]] & b[off[1]]) != 0);
    }
}

template <typename T>
__device__ __forceinline__ void where_cond_strided(const u8* c, const T* a, const T* b, T* out, i64 n,
                                                   const StridedMeta& m) {
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        i64 off[3];
        strided_offsets<3>(m, i, n, off);
        out[i] = c[off[0]] ? a[off[1]] : b[off[2]];
    }
}
#define WHERE_COND_T(sfx, T)                                                                         \
    extern "C" __global__ void where_cond_##sfx(const u8* c, const T* a, const T* b, T* out, i64 n,  \
                                                StridedMeta m) {                                     \
        where_cond_strided<T>(c, a, b, out, n, m);                                                   \
    }
WHERE_COND_T(f32, float)
WHERE_COND_T(f16, __half)
WHERE_COND_T(bf16, bf16)
WHERE_COND_T(i64, i64)
WHERE_COND_T(bool, u8)

extern "C" __global__ void fill_bool(u8* out, i64 n, int v) {
    const u8 b = v != 0 ? 1 : 0;
    for (i64 i = global_tid(); i < n; i += global_stride()) out[i] = b;
}

template <typename Out>
__device__ __forceinline__ void bool_reduce(const u8* x, Out* out, i64 outer, i64 n, i64 inner, int op) {
    const i64 m = outer * inner;
    for (i64 t = global_tid(); t < m; t += global_stride()) {
        const i64 o = t / inner, in = t - o * inner;
        const u8* p = x + o * n * inner + in;
        i64 count = 0, first = -1;
        for (i64 k = 0; k < n; ++k) {
            if (p[k * inner]) {
                ++count;
                if (first < 0) first = k;
            }
        }
        const i64 r = op == 0 ? count : op == 1 ? count > 0 : op == 2 ? count == n : (first < 0 ? 0 : first);
        out[t] = (Out)r;
    }
}
extern "C" __global__ void bool_reduce_i64(const u8* x, i64* out, i64 outer, i64 n, i64 inner, int op) {
    bool_reduce<i64>(x, out, outer, n, inner, op);
}
extern "C" __global__ void bool_reduce_bool(const u8* x, u8* out, i64 outer, i64 n, i64 inner, int op) {
    bool_reduce<u8>(x, out, outer, n, inner, op);
}
