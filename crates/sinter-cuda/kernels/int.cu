// int.cu — i64 tensors on the device: integer arithmetic, fill, arange,
// reductions, row gathers, and the device-side index checks (cross-entropy targets, index_select
// ids) that record the first bad index without a host round trip.
//
// Integer math matches the CPU backend exactly: add/sub/mul wrap (two's complement), division
// truncates toward zero, x / 0 = 0 and i64::MIN / -1 = i64::MIN (Rust's wrapping_div).
// Why it is fast enough: these tensors are small (ids, masks, counts), so plain grid-stride
// loops through the strided-index helper (32-bit index math when it fits) and one thread per
// output for reductions are memory-bound already; what matters is that nothing goes through the
// host. The index check is one block and never synchronises the host.
//
//   int_<op>_i64(const i64* a, const i64* b, i64* out, i64 n, StridedMeta m)  op: add sub mul div
//        floor_div maximum minimum (floor_div rounds toward -inf, torch.floor_divide); i64
//        comparisons (bool outputs) are bool.cu's cmp_<op>_i64
//   int_fill_i64(i64* y, i64 n, i64 value)
//   arange_<t>(T* y, i64 n, u64 start_bits, u64 step_bits)   y[i] = start + i * step (f64 math,
//        then cast like the CPU: to f32 then T for floats, truncation for i64; the product and
//        the sum are rounded separately, as on the CPU: NVRTC would otherwise contract them
//        into one fma, and e.g. 0.1 + 3 * 0.3 truncates to 1 instead of the CPU's 0)
//   int_reduce_i64(const i64* x, i64* out, i64 outer, i64 n, i64 inner, int op)
//        over the middle dim of [outer, n, inner]; op 0 sum, 1 max, 2 min, 3 argmax (first max)
//   int_matmul_i64(const i64* a, const i64* b, i64* out, i64 batch, i64 m, i64 n, i64 k)
//        out[b] = a[b] @ b[b] for contiguous [batch, m, k] and [batch, k, n], exact and wrapping
//        (PyTorch's CPU integer matmul); one thread per output (integer products are rare and
//        small: ids, counts; no tensor cores for i64)
//   index_flat(const i64* idx, i64* flat, i64 k, i64 outer, i64 n)
//        flat[o * k + j] = o * n + idx[j]; an index outside [0, n) becomes o * n (row 0), so the
//        gathers that follow never touch memory outside the tensor; index_check reports it.
//   int_gather_rows_i64(const i64* x, const i64* rows, i64* out, i64 count, i64 inner)
//        out[r, :] = x[rows[r], :]
//   index_check(const i64* idx, i64 n, i64 bound, i64 ignore, int has_ignore, i64 tag, i64* slot)
//        one block: finds the smallest position p with idx[p] outside [0, bound) (and not the
//        ignore value when has_ignore) and, if slot[0] == 0 (no earlier error recorded), writes
//        slot = {p + 1, idx[p], bound, tag}. All work of a device is on one stream, so "earlier"
//        is program order and no atomics are needed.

struct IAdd { static __device__ __forceinline__ i64 f(i64 a, i64 b) { return (i64)((u64)a + (u64)b); } };
struct ISub { static __device__ __forceinline__ i64 f(i64 a, i64 b) { return (i64)((u64)a - (u64)b); } };
struct IMul { static __device__ __forceinline__ i64 f(i64 a, i64 b) { return (i64)((u64)a * (u64)b); } };
struct IDiv {
    static __device__ __forceinline__ i64 f(i64 a, i64 b) {
        if (b == 0) return 0;
        if (b == -1) return (i64)(0ull - (u64)a);  // wraps for i64::MIN like wrapping_div
        return a / b;
    }
};
// torch.floor_divide (sinter_types::floor_div_i64): rounds toward -inf; the tensor op refuses a
// zero divisor before launching, and 0 keeps the kernel total.
struct IFloorDiv {
    static __device__ __forceinline__ i64 f(i64 a, i64 b) {
        if (b == 0) return 0;
        if (b == -1) return (i64)(0ull - (u64)a);
        const i64 q = a / b;
        return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
    }
};
struct IMax { static __device__ __forceinline__ i64 f(i64 a, i64 b) { return a > b ? a : b; } };
struct IMin { static __device__ __forceinline__ i64 f(i64 a, i64 b) { return a < b ? a : b; } };

#define INT_BINARY(name, Op)                                                                         \
    extern "C" __global__ void int_##name##_i64(const i64* a, const i64* b, i64* out, i64 n,         \
                                                StridedMeta m) {                                     \
        for (i64 i = global_tid(); i < n; i += global_stride()) {                                    \
            i64 off[2];                                                                              \
            strided_offsets<2>(m, i, n, off);                                                        \
            out[i] = Op::f(a[off[0]], b[off[1]]);                                                    \
        }                                                                                            \
    }
INT_BINARY(add, IAdd)
INT_BINARY(sub, ISub)
INT_BINARY(mul, IMul)
INT_BINARY(div, IDiv)
INT_BINARY(floor_div, IFloorDiv)
INT_BINARY(maximum, IMax)
INT_BINARY(minimum, IMin)

extern "C" __global__ void int_fill_i64(i64* y, i64 n, i64 value) {
    for (i64 i = global_tid(); i < n; i += global_stride()) y[i] = value;
}

template <typename T> __device__ __forceinline__ T arange_value(double v) { return from_f32<T>((float)v); }
template <> __device__ __forceinline__ i64 arange_value<i64>(double v) { return (i64)v; }

#define ARANGE(sfx, T)                                                                               \
    extern "C" __global__ void arange_##sfx(T* y, i64 n, u64 start_bits, u64 step_bits) {            \
        const double start = __longlong_as_double((long long)start_bits);                            \
        const double step = __longlong_as_double((long long)step_bits);                              \
        for (i64 i = global_tid(); i < n; i += global_stride()) y[i] = arange_value<T>(__dadd_rn(start, __dmul_rn((double)i, step))); \
    }
ARANGE(f32, float)
ARANGE(f16, __half)
ARANGE(bf16, bf16)
ARANGE(i64, i64)

extern "C" __global__ void int_reduce_i64(const i64* x, i64* out, i64 outer, i64 n, i64 inner, int op) {
    const i64 m = outer * inner;
    for (i64 t = global_tid(); t < m; t += global_stride()) {
        const i64 o = t / inner, in = t - o * inner;
        const i64* p = x + o * n * inner + in;
        i64 best = p[0], arg = 0, sum = 0;
        for (i64 k = 0; k < n; ++k) {
            const i64 v = p[k * inner];
            sum = (i64)((u64)sum + (u64)v);
            if ((op == 2 && v < best) || (op != 2 && v > best)) {
                best = v;
                arg = k;
            }
        }
        out[t] = op == 0 ? sum : op == 3 ? arg : best;
    }
}

extern "C" __global__ void int_matmul_i64(const i64* a, const i64* b, i64* out, i64 batch, i64 m, i64 n, i64 k) {
    const i64 total = batch * m * n;
    for (i64 t = global_tid(); t < total; t += global_stride()) {
        const i64 bi = t / (m * n), r = t - bi * m * n, i = r / n, j = r - i * n;
        const i64* pa = a + (bi * m + i) * k;
        const i64* pb = b + bi * k * n + j;
        u64 acc = 0;
        for (i64 p = 0; p < k; ++p) acc += (u64)pa[p] * (u64)pb[p * n];
        out[t] = (i64)acc;
    }
}

extern "C" __global__ void index_flat(const i64* idx, i64* flat, i64 k, i64 outer, i64 n) {
    const i64 total = k * outer;
    for (i64 t = global_tid(); t < total; t += global_stride()) {
        const i64 o = t / k, j = t - o * k;
        const i64 v = idx[j];
        flat[t] = o * n + ((v >= 0 && v < n) ? v : 0);
    }
}

extern "C" __global__ void int_gather_rows_i64(const i64* x, const i64* rows, i64* out, i64 count, i64 inner) {
    const i64 total = count * inner;
    for (i64 t = global_tid(); t < total; t += global_stride()) {
        const i64 r = t / inner, i = t - r * inner;
        out[t] = x[rows[r] * inner + i];
    }
}

extern "C" __global__ void index_check(const i64* idx, i64 n, i64 bound, i64 ignore, int has_ignore, i64 tag,
                                       i64* slot) {
    __shared__ i64 first[1024];
    i64 mine = n;  // n = none found
    for (i64 p = threadIdx.x; p < n; p += blockDim.x) {
        const i64 v = idx[p];
        const bool ok = (v >= 0 && v < bound) || (has_ignore && v == ignore);
        if (!ok) {
            mine = p;  // positions grow with the loop: the first hit is this thread's smallest
            break;
        }
    }
    first[threadIdx.x] = mine;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if ((int)threadIdx.x < s && first[threadIdx.x + s] < first[threadIdx.x]) first[threadIdx.x] = first[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0 && first[0] < n && slot[0] == 0) {
        const i64 p = first[0];
        slot[0] = p + 1;
        slot[1] = idx[p];
        slot[2] = bound;
        slot[3] = tag;
    }
}
