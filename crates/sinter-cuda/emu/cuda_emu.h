// cuda_emu.h — lets the host C++ compiler (g++ -std=c++20) build sinter's CUDA C kernels unchanged
// and run them on the CPU, so tests can execute every kernel without a GPU (see src/emu.rs).
//
// Execution model:
// - A launch runs its blocks one after another. The threads of a block are fibers (ucontext) run
//   cooperatively on the calling OS thread: each fiber runs until it reaches a synchronisation
//   point (__syncthreads, a warp shuffle/vote, __syncwarp) or returns. A barrier completes when
//   every live (not yet returned) thread of the block (or warp) has reached it, so threads that
//   return early drop out, as on the hardware. Fibers make the schedule deterministic and cheap on
//   a machine with few cores. Between block barriers the warps run one after another, each as far
//   as it can; the order (forward, or warps and lanes reversed) is selectable, so a missing
//   barrier shows up as a difference between the two orders.
// - `__shared__` is `static` (blocks run one at a time, so one copy is enough), placed in a section
//   that is filled with 0xFF bytes (NaN as floats) before every block; dynamic (`extern
//   __shared__`) memory is rewritten by the Rust side into a call to emu::dyn_shared(), a buffer
//   filled the same way. Reads of shared memory that no thread of the block wrote show up.
// - Errors the hardware leaves undefined are reported instead of guessed: a warp operation whose
//   mask names a lane that has exited or does not exist, lanes of one warp waiting at different
//   warp operations, threads of a block at different __syncthreads, and deadlocks.
// - Not modelled: timing, the memory model (there is no real concurrency, so no races), the
//   reduced precision of approximate intrinsics (__expf, rsqrtf, __fdividef are exact here), and
//   FMA contraction differences.
// - Headers <cuda_fp16.h>, <cuda_bf16.h>, <mma.h> in this folder just include this file.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <type_traits>
#include <vector>
#include <sys/mman.h>
#include <ucontext.h>

// ------------------------------------------------------------------------------------------------
// Qualifiers. EMU_SCAN is defined only when the Rust side preprocesses a file to find its kernels.
#ifdef EMU_SCAN
#define __global__ __emu_global_marker
#else
#define __global__
#endif
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
// Static shared memory lives in its own section, so the runtime can fill all of it with 0xFF bytes
// (NaN as floats) before every block: reads of shared memory no thread of the block wrote show up.
#define __shared__ static __attribute__((section("emu_shared")))
#define __constant__ static
#define __managed__
#define __restrict__ __restrict
// The GNU spelling: it may stand anywhere among the decl-specifiers (`__shared__ __align__(16) T
// x[n]`), where C++'s alignas may not.
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __CUDACC__ 1
#define __CUDA_ARCH__ 900

// ------------------------------------------------------------------------------------------------
// Vector types.
struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
typedef dim3 uint3;
struct alignas(8) uint2 { unsigned int x, y; };
struct alignas(16) uint4 { unsigned int x, y, z, w; };
struct alignas(8) int2 { int x, y; };
struct int3 { int x, y, z; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct float3 { float x, y, z; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(16) double2 { double x, y; };
struct alignas(16) longlong2 { long long x, y; };
struct alignas(16) ulonglong2 { unsigned long long x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
inline int4 make_int4(int a, int b, int c, int d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }

// The built-in index variables. Plain globals: one launch at a time per library (see emu::launch).
inline dim3 threadIdx, blockIdx, blockDim, gridDim;
inline constexpr int warpSize = 32;

// ------------------------------------------------------------------------------------------------
// f16 / bf16 storage types with round-to-nearest-even conversions (bit-exact with the hardware).
namespace emu {
inline uint32_t f2u(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float u2f(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

inline uint16_t float_to_half_bits(float f) {
    uint32_t x = f2u(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return 0x7fffu;            // NaN: canonical, as the hardware
    if (x >= 0x477ff000u) return sign | 0x7c00u;    // >= 65520 rounds to inf
    if (x < 0x38800000u) {                          // below 2^-14: subnormal half or zero
        if (x < 0x33000000u) return sign;           // below 2^-25: rounds to zero
        const uint32_t e = x >> 23, m = (x & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126u - e;            // 14..24
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (r & 1u))) ++r;
        return (uint16_t)(sign | r);
    }
    const uint32_t r = x - 0x38000000u;  // rebias exponent 127 -> 15
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
}
inline float half_bits_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0) {
        const float v = (float)m * 5.9604644775390625e-8f;  // m * 2^-24, exact
        return sign ? -v : v;
    }
    if (e == 31) return u2f(sign | 0x7f800000u | (m << 13));
    return u2f(sign | ((e + 112u) << 23) | (m << 13));
}
inline uint16_t float_to_bf16_bits(float f) {
    const uint32_t x = f2u(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;
    return (uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return u2f((uint32_t)b << 16); }
}  // namespace emu

struct __half {
    unsigned short __x;
    __half() = default;
    __half(float f) : __x(emu::float_to_half_bits(f)) {}
    __half(double f) : __x(emu::float_to_half_bits((float)f)) {}
    __half(int i) : __x(emu::float_to_half_bits((float)i)) {}
    operator float() const { return emu::half_bits_to_float(__x); }
};
struct __nv_bfloat16 {
    unsigned short __x;
    __nv_bfloat16() = default;
    __nv_bfloat16(float f) : __x(emu::float_to_bf16_bits(f)) {}
    __nv_bfloat16(double f) : __x(emu::float_to_bf16_bits((float)f)) {}
    __nv_bfloat16(int i) : __x(emu::float_to_bf16_bits((float)i)) {}
    operator float() const { return emu::bf16_bits_to_float(__x); }
};
typedef __half half;
typedef __nv_bfloat16 nv_bfloat16;
struct alignas(4) __half2 { __half x, y; };
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

// Arithmetic computes in f32 and rounds once: identical to native f16/bf16 +,-,*,/ (f32 has more
// than twice the significand bits, so the double rounding is innocuous).
#define EMU_HALF_OPS(H)                                                                            \
    inline H operator+(H a, H b) { return H((float)a + (float)b); }                                \
    inline H operator-(H a, H b) { return H((float)a - (float)b); }                                \
    inline H operator*(H a, H b) { return H((float)a * (float)b); }                                \
    inline H operator/(H a, H b) { return H((float)a / (float)b); }                                \
    inline H operator-(H a) { H r = a; r.__x ^= 0x8000u; return r; }                               \
    inline H& operator+=(H& a, H b) { return a = a + b; }                                          \
    inline H& operator-=(H& a, H b) { return a = a - b; }                                          \
    inline H& operator*=(H& a, H b) { return a = a * b; }                                          \
    inline H& operator/=(H& a, H b) { return a = a / b; }                                          \
    inline bool operator==(H a, H b) { return (float)a == (float)b; }                              \
    inline bool operator!=(H a, H b) { return (float)a != (float)b; }                              \
    inline bool operator<(H a, H b) { return (float)a < (float)b; }                                \
    inline bool operator<=(H a, H b) { return (float)a <= (float)b; }                              \
    inline bool operator>(H a, H b) { return (float)a > (float)b; }                                \
    inline bool operator>=(H a, H b) { return (float)a >= (float)b; }
EMU_HALF_OPS(__half)
EMU_HALF_OPS(__nv_bfloat16)
#undef EMU_HALF_OPS

inline float __half2float(__half h) { return emu::half_bits_to_float(h.__x); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __hfma(__half a, __half b, __half c) { return __half(std::fma((float)a, (float)b, (float)c)); }
inline bool __hisnan(__half a) { return (a.__x & 0x7fffu) > 0x7c00u; }
inline bool __hisinf(__half a) { return (a.__x & 0x7fffu) == 0x7c00u; }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline short __half_as_short(__half h) { return (short)h.__x; }
inline __half __short_as_half(short u) { __half h; h.__x = (unsigned short)u; return h; }

inline float __bfloat162float(__nv_bfloat16 b) { return emu::bf16_bits_to_float(b.__x); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__nv_bfloat16(a), __nv_bfloat16(b)}; }
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }
inline __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) { return a + b; }
inline __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) { return a - b; }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return a * b; }
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
    return __nv_bfloat16(std::fma((float)a, (float)b, (float)c));
}
inline bool __hisnan(__nv_bfloat16 a) { return (a.__x & 0x7fffu) > 0x7f80u; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }

// ------------------------------------------------------------------------------------------------
// Math and bit intrinsics. The approximate ones are computed exactly (see the header comment).
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float exp10f_(float x) { return powf(10.f, x); }
inline float __exp10f(float x) { return powf(10.f, x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.f / a; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __saturatef(float x) { return x != x ? 0.f : (x < 0.f ? 0.f : (x > 1.f ? 1.f : x)); }
inline float rsqrtf(float x) { return 1.f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.f / cbrtf(x); }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
inline float exp2f_(float x) { return exp2f(x); }
// sin(pi x) and cos(pi x), computed in double so they round like the hardware's exact versions.
inline void sincospif(float x, float* s, float* c) {
    const double a = 3.14159265358979323846 * (double)x;
    *s = (float)sin(a);
    *c = (float)cos(a);
}
inline float sinpif(float x) { return (float)sin(3.14159265358979323846 * (double)x); }
inline float cospif(float x) { return (float)cos(3.14159265358979323846 * (double)x); }
inline void __sincosf(float x, float* s, float* c) { *s = sinf(x); *c = cosf(x); }

// CUDA declares the classification functions in the global namespace; <cmath> puts them in std.
using std::isfinite;
using std::isinf;
using std::isnan;
using std::signbit;

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double f; std::memcpy(&f, &i, 8); return f; }
inline long long __double_as_longlong(double f) { long long i; std::memcpy(&i, &f, 8); return i; }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
inline int __mulhi(int a, int b) { return (int)(((int64_t)a * b) >> 32); }
// dp4a: the four byte products of a and b (signed, or unsigned for the unsigned overload) added to
// c, in 32-bit wrapping arithmetic, as the instruction does (no saturation).
inline int __dp4a(int a, int b, int c) {
    uint32_t s = (uint32_t)c;
    for (int i = 0; i < 4; ++i) s += (uint32_t)((int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i)));
    return (int)s;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; ++i) c += ((a >> (8 * i)) & 0xffu) * ((b >> (8 * i)) & 0xffu);
    return c;
}
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
    return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
inline void __threadfence() {}
inline void __threadfence_block() {}

// CUDA's min/max accept any mix of integer types; the float versions ignore NaN like fminf/fmaxf.
template <typename A, typename B> inline auto min(A a, B b) {
    using R = std::common_type_t<A, B>;
    return (R)a < (R)b ? (R)a : (R)b;
}
template <typename A, typename B> inline auto max(A a, B b) {
    using R = std::common_type_t<A, B>;
    return (R)a > (R)b ? (R)a : (R)b;
}
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
inline double min(double a, double b) { return fmin(a, b); }
inline double max(double a, double b) { return fmax(a, b); }

// Atomics: fibers of a block never run at the same time, so plain read-modify-writes are atomic.
template <typename T> inline T atomicAdd(T* p, T v) { const T o = *p; *p = o + v; return o; }
template <typename T> inline T atomicSub(T* p, T v) { const T o = *p; *p = o - v; return o; }
template <typename T> inline T atomicExch(T* p, T v) { const T o = *p; *p = v; return o; }
template <typename T> inline T atomicMax(T* p, T v) { const T o = *p; if (v > o) *p = v; return o; }
template <typename T> inline T atomicMin(T* p, T v) { const T o = *p; if (v < o) *p = v; return o; }
template <typename T> inline T atomicAnd(T* p, T v) { const T o = *p; *p = o & v; return o; }
template <typename T> inline T atomicOr(T* p, T v) { const T o = *p; *p = o | v; return o; }
template <typename T> inline T atomicXor(T* p, T v) { const T o = *p; *p = o ^ v; return o; }
template <typename T> inline T atomicCAS(T* p, T cmp, T v) { const T o = *p; if (o == cmp) *p = v; return o; }
inline unsigned atomicInc(unsigned* p, unsigned lim) { const unsigned o = *p; *p = o >= lim ? 0 : o + 1; return o; }

// ------------------------------------------------------------------------------------------------
// The scheduler: fibers, barriers, warp exchange.
namespace emu {

enum State : int { Runnable = 0, AtBlockBarrier = 1, AtWarpOp = 2, Done = 3 };

struct Fiber {
    ucontext_t ctx;
    char* stack = nullptr;
    dim3 tid;
    int state = Runnable;
    int line = 0;          // source line of the barrier or warp op it waits at
    unsigned mask = 0;     // warp op: participating lanes
    uint64_t post = 0;     // warp op: the value this lane contributes
};

constexpr size_t kStack = 256 * 1024;
constexpr int kMaxThreads = 1024;

struct Runtime {
    std::mutex lock;  // one launch at a time in this library
    Fiber fibers[kMaxThreads];
    int nthreads = 0;
    int cur = -1;
    ucontext_t sched;
    void (*fn)(void**) = nullptr;
    void** args = nullptr;
    uint64_t snapshot[kMaxThreads / 32][32];  // values of the last completed exchange, per warp
    // Dynamic shared memory: fixed, so a pointer taken once stays valid (227 KiB, the sm_90 limit).
    alignas(128) unsigned char dyn[232448];
    char err[1024] = {0};
    bool failed = false;
};
inline Runtime& rt() {
    static Runtime r;
    return r;
}

inline void fail(const char* msg) {
    Runtime& r = rt();
    if (!r.failed) {
        r.failed = true;
        std::snprintf(r.err, sizeof r.err, "block (%u,%u,%u): %s", blockIdx.x, blockIdx.y, blockIdx.z, msg);
    }
}

inline void* dyn_shared() { return rt().dyn; }

// Bounds of the static shared memory section (defined by the linker when the section exists).
extern "C" char __start_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_emu_shared[] __attribute__((weak, visibility("hidden")));
inline void poison_static_shared() {
    if (__start_emu_shared && __stop_emu_shared > __start_emu_shared)
        std::memset(__start_emu_shared, 0xff, (size_t)(__stop_emu_shared - __start_emu_shared));
}

inline int linear_tid() { return (int)(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)); }

// Suspend the current fiber in `state`; returns once the scheduler resumes it.
inline void wait(int state, int line) {
    Runtime& r = rt();
    Fiber& f = r.fibers[r.cur];
    f.state = state;
    f.line = line;
    swapcontext(&f.ctx, &r.sched);
    threadIdx = f.tid;  // restore (the scheduler set it for the fibers it ran meanwhile)
}

inline void syncthreads(int line) { wait(AtBlockBarrier, line); }

// Every lane of `mask` posts a value; once all have, each gets the warp's 32 posted values.
inline const uint64_t* warp_exchange(unsigned mask, uint64_t v, int line) {
    Runtime& r = rt();
    Fiber& f = r.fibers[r.cur];
    f.mask = mask;
    f.post = v;
    wait(AtWarpOp, line);
    return r.snapshot[linear_tid() / 32];
}

template <typename T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "warp shuffle of a type wider than 8 bytes");
    uint64_t u = 0;
    std::memcpy(&u, &v, sizeof(T));
    return u;
}
template <typename T> inline T from_bits(uint64_t u) {
    T v;
    std::memcpy(&v, &u, sizeof(T));
    return v;
}

inline void fiber_main() {
    Runtime& r = rt();
    r.fn(r.args);
    r.fibers[r.cur].state = Done;
    // returning resumes uc_link (the scheduler)
}

// Complete warp `w`'s pending warp operation if every live lane waits at it: 1 done, 0 not ready,
// -1 error (reported).
inline int resolve_warp(int w) {
    Runtime& r = rt();
    const int n = r.nthreads;
    const int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
    bool all = true, any = false;
    for (int i = lo; i < hi; ++i) {
        const int s = r.fibers[i].state;
        if (s == AtWarpOp) any = true;
        else if (s != Done) all = false;
    }
    if (!any || !all) return 0;
    int line = -1;
    unsigned mask = 0;
    for (int i = lo; i < hi; ++i) {
        const Fiber& f = r.fibers[i];
        if (f.state != AtWarpOp) continue;
        if (line < 0) { line = f.line; mask = f.mask; }
        if (f.line != line || f.mask != mask) {
            char m[160];
            std::snprintf(m, sizeof m, "lanes of warp %d wait at different warp operations (lines %d and %d)", w, line,
                          f.line);
            fail(m);
            return -1;
        }
    }
    for (int l = 0; l < 32; ++l) {
        if (!((mask >> l) & 1u)) continue;
        if (lo + l >= hi || r.fibers[lo + l].state != AtWarpOp) {
            char m[200];
            std::snprintf(m, sizeof m, "warp operation at line %d names lane %d of warp %d in its mask, but that lane %s",
                          line, l, w, lo + l >= hi ? "does not exist (partial warp)" : "has exited");
            fail(m);
            return -1;
        }
    }
    for (int l = 0; l < 32; ++l) r.snapshot[w][l] = lo + l < hi ? r.fibers[lo + l].post : 0;
    for (int i = lo; i < hi; ++i)
        if (r.fibers[i].state == AtWarpOp) r.fibers[i].state = Runnable;
    return 1;
}

// Run one block to completion; false on a reported error. Between block barriers the warps run
// one after another, each as far as it can go (warp operations complete as soon as the warp's
// lanes arrive), which is a legal schedule on the hardware and the one that exposes a missing
// __syncthreads: with `reverse` both the warps and the lanes run in reverse order.
inline bool run_block(bool reverse) {
    Runtime& r = rt();
    const int n = r.nthreads;
    const int warps = (n + 31) / 32;
    for (int i = 0; i < n; ++i) {
        Fiber& f = r.fibers[i];
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack;
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = &r.sched;
        makecontext(&f.ctx, fiber_main, 0);
        f.state = Runnable;
        f.tid = dim3{(unsigned)(i % blockDim.x), (unsigned)((i / blockDim.x) % blockDim.y),
                     (unsigned)(i / (blockDim.x * blockDim.y))};
    }
    for (;;) {
        for (int kw = 0; kw < warps; ++kw) {
            const int w = reverse ? warps - 1 - kw : kw;
            const int lo = w * 32, hi = lo + 32 < n ? lo + 32 : n;
            for (;;) {
                for (int k = lo; k < hi; ++k) {
                    const int i = reverse ? hi - 1 - (k - lo) : k;
                    if (r.fibers[i].state != Runnable) continue;
                    r.cur = i;
                    threadIdx = r.fibers[i].tid;
                    swapcontext(&r.sched, &r.fibers[i].ctx);
                    if (r.failed) return false;
                }
                const int res = resolve_warp(w);
                if (res < 0) return false;
                if (res == 0) break;
            }
        }
        // Block barrier: completes when every live thread waits at one.
        int live = 0, at_bar = 0, line = -1;
        for (int i = 0; i < n; ++i) {
            const Fiber& f = r.fibers[i];
            if (f.state == Done) continue;
            ++live;
            if (f.state == AtBlockBarrier) {
                ++at_bar;
                if (line < 0) line = f.line;
                else if (f.line != line) {
                    char m[160];
                    std::snprintf(m, sizeof m, "threads wait at different __syncthreads (lines %d and %d): divergent barrier",
                                  line, f.line);
                    fail(m);
                    return false;
                }
            }
        }
        if (live == 0) return true;
        if (at_bar == live) {
            for (int i = 0; i < n; ++i)
                if (r.fibers[i].state == AtBlockBarrier) r.fibers[i].state = Runnable;
            continue;
        }
        char m[200];
        std::snprintf(m, sizeof m,
                      "deadlock: %d live threads, %d at __syncthreads (line %d), the rest at warp operations that cannot "
                      "complete",
                      live, at_bar, line);
        fail(m);
        return false;
    }
}

}  // namespace emu

// Synchronisation primitives. `__builtin_LINE()` as a default argument gives the caller's line,
// which the scheduler compares to report divergent barriers.
inline void __syncthreads(int line = __builtin_LINE()) { ::emu::syncthreads(line); }
inline void __syncwarp(unsigned mask = 0xffffffffu, int line = __builtin_LINE()) {
    (void)::emu::warp_exchange(mask, 0, line);
}
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32, int line = __builtin_LINE()) {
    const uint64_t* s = ::emu::warp_exchange(mask, ::emu::to_bits(v), line);
    const int lane = ::emu::linear_tid() & 31;
    int src = lane ^ lane_mask;
    if ((src & ~(width - 1)) != (lane & ~(width - 1))) src = lane;
    return ::emu::from_bits<T>(s[src]);
}
template <typename T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    const uint64_t* s = ::emu::warp_exchange(mask, ::emu::to_bits(v), line);
    const int lane = ::emu::linear_tid() & 31;
    const int src = (lane & (width - 1)) + (int)delta < width ? lane + (int)delta : lane;
    return ::emu::from_bits<T>(s[src]);
}
template <typename T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, int line = __builtin_LINE()) {
    const uint64_t* s = ::emu::warp_exchange(mask, ::emu::to_bits(v), line);
    const int lane = ::emu::linear_tid() & 31;
    const int src = (lane & (width - 1)) >= (int)delta ? lane - (int)delta : lane;
    return ::emu::from_bits<T>(s[src]);
}
template <typename T>
inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32, int line = __builtin_LINE()) {
    const uint64_t* s = ::emu::warp_exchange(mask, ::emu::to_bits(v), line);
    const int lane = ::emu::linear_tid() & 31;
    return ::emu::from_bits<T>(s[(lane & ~(width - 1)) + (src_lane & (width - 1))]);
}
inline unsigned __ballot_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    const uint64_t* s = ::emu::warp_exchange(mask, pred != 0, line);
    unsigned b = 0;
    for (int l = 0; l < 32; ++l)
        if (((mask >> l) & 1u) && s[l]) b |= 1u << l;
    return b;
}
inline int __any_sync(unsigned mask, int pred, int line = __builtin_LINE()) { return __ballot_sync(mask, pred, line) != 0u; }
inline int __all_sync(unsigned mask, int pred, int line = __builtin_LINE()) {
    return __ballot_sync(mask, pred, line) == mask;
}
inline unsigned __activemask() { return 0xffffffffu; }

// ------------------------------------------------------------------------------------------------
// The launch entry point, called from Rust through the library (`emu_launch`).
extern "C" __attribute__((visibility("default"))) int emu_launch(void (*fn)(void**), void** args, unsigned gx,
                                                                  unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                                                  unsigned bz, unsigned shared_bytes, int reverse,
                                                                  char* err, size_t err_len) {
    emu::Runtime& r = emu::rt();
    std::lock_guard<std::mutex> g(r.lock);
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    if (threads == 0 || threads > (unsigned long long)emu::kMaxThreads || gx == 0 || gy == 0 || gz == 0) {
        std::snprintf(err, err_len, "invalid launch shape: grid (%u,%u,%u) block (%u,%u,%u)", gx, gy, gz, bx, by, bz);
        return 1;
    }
    for (unsigned i = 0; i < threads; ++i) {
        if (!r.fibers[i].stack) {
            void* p = mmap(nullptr, emu::kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                           -1, 0);
            if (p == MAP_FAILED) {
                std::snprintf(err, err_len, "cannot map a fiber stack");
                return 1;
            }
            r.fibers[i].stack = (char*)p;
        }
    }
    if (shared_bytes > sizeof r.dyn) {
        std::snprintf(err, err_len, "%u bytes of dynamic shared memory requested; at most %zu", shared_bytes, sizeof r.dyn);
        return 1;
    }
    r.nthreads = (int)threads;
    r.fn = fn;
    r.args = args;
    r.failed = false;
    r.err[0] = 0;
    gridDim = dim3{gx, gy, gz};
    blockDim = dim3{bx, by, bz};
    for (unsigned z = 0; z < gz; ++z)
        for (unsigned y = 0; y < gy; ++y)
            for (unsigned x = 0; x < gx; ++x) {
                blockIdx = dim3{x, y, z};
                std::memset(r.dyn, 0xff, shared_bytes);  // NaN-filled: reads of unwritten memory show
                emu::poison_static_shared();
                if (!emu::run_block(reverse != 0)) {
                    std::snprintf(err, err_len, "%s", r.err);
                    return 1;
                }
            }
    return 0;
}

// ------------------------------------------------------------------------------------------------
// WMMA (nvcuda::wmma) for 16x16x16-style tiles with f16/bf16 inputs. Every lane of the warp holds
// the whole tile (x[] is the tile in row-major order), so only uniform element-wise use of x[i]
// (the same operation on every element) means the same thing as on the hardware. Every fragment
// of one shape and use maps x[e] to the same tile element, so per-element lookups through another
// fragment (FlashAttention's row-index accumulator: load_matrix_sync of a matrix whose (r, c) is r
// into an accumulator, then x[e] of any accumulator belongs to row rowid.x[e]) work as on the
// hardware. Each operation is a warp synchronisation point, as the *_sync names promise.
namespace nvcuda {
namespace wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };
namespace precision { struct tf32 {}; }

template <typename Use, int M, int N, int K> struct tile_dims;
template <int M, int N, int K> struct tile_dims<matrix_a, M, N, K> { static constexpr int rows = M, cols = K; };
template <int M, int N, int K> struct tile_dims<matrix_b, M, N, K> { static constexpr int rows = K, cols = N; };
template <int M, int N, int K> struct tile_dims<accumulator, M, N, K> { static constexpr int rows = M, cols = N; };

template <typename Use, int M, int N, int K, typename T, typename Layout = void> struct fragment {
    static constexpr int rows = tile_dims<Use, M, N, K>::rows, cols = tile_dims<Use, M, N, K>::cols;
    static constexpr int num_elements = rows * cols;
    typedef T element_type;
    T x[rows * cols];
};

inline void warp_point(int line) { (void)::emu::warp_exchange(0xffffffffu, 0, line); }
template <typename T> inline float to_f(T v) { return (float)v; }
template <typename T> inline T from_f(float v) { return T(v); }

template <typename Use, int M, int N, int K, typename T, typename L, typename V>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, const V& v, int line = __builtin_LINE()) {
    warp_point(line);
    for (int i = 0; i < f.num_elements; ++i) f.x[i] = T(v);
}
// The hardware's preconditions of load/store_matrix_sync (undefined behaviour otherwise): the
// pointer is 256-bit aligned and the leading dimension a multiple of 16 bytes. Reported before
// the warp synchronises, so the scheduler stops the launch there.
template <typename S> inline void check_tile_ptr(const S* p, unsigned ldm, const char* what, int line) {
    if (((uintptr_t)p & 31u) == 0 && ((size_t)ldm * sizeof(S)) % 16 == 0) return;
    char m[200];
    std::snprintf(m, sizeof m, "wmma::%s at line %d: pointer %p must be 32-byte aligned and ldm %u (x %zu bytes) a multiple of 16 bytes",
                  what, line, (const void*)p, ldm, sizeof(S));
    ::emu::fail(m);
}
template <typename Use, int M, int N, int K, typename T, typename L, typename S>
inline void load_impl(fragment<Use, M, N, K, T, L>& f, const S* p, unsigned ldm, bool col, int line) {
    check_tile_ptr(p, ldm, "load_matrix_sync", line);
    warp_point(line);
    for (int r = 0; r < f.rows; ++r)
        for (int c = 0; c < f.cols; ++c) f.x[r * f.cols + c] = T(col ? p[(size_t)c * ldm + r] : p[(size_t)r * ldm + c]);
}
template <int M, int N, int K, typename T, typename L, typename S>
inline void load_matrix_sync(fragment<matrix_a, M, N, K, T, L>& f, const S* p, unsigned ldm, int line = __builtin_LINE()) {
    load_impl(f, p, ldm, std::is_same_v<L, col_major>, line);
}
template <int M, int N, int K, typename T, typename L, typename S>
inline void load_matrix_sync(fragment<matrix_b, M, N, K, T, L>& f, const S* p, unsigned ldm, int line = __builtin_LINE()) {
    load_impl(f, p, ldm, std::is_same_v<L, col_major>, line);
}
template <int M, int N, int K, typename T, typename S>
inline void load_matrix_sync(fragment<accumulator, M, N, K, T, void>& f, const S* p, unsigned ldm, layout_t l,
                             int line = __builtin_LINE()) {
    load_impl(f, p, ldm, l == mem_col_major, line);
}
template <int M, int N, int K, typename T, typename S>
inline void store_matrix_sync(S* p, const fragment<accumulator, M, N, K, T, void>& f, unsigned ldm, layout_t l,
                              int line = __builtin_LINE()) {
    check_tile_ptr(p, ldm, "store_matrix_sync", line);
    warp_point(line);
    // Lane 0 alone writes (every lane holds the same tile), so a lane reading memory that another
    // lane overwrote earlier in program order still behaves as on the hardware.
    if ((::emu::linear_tid() & 31) != 0) return;
    for (int r = 0; r < f.rows; ++r)
        for (int c = 0; c < f.cols; ++c) {
            S* q = l == mem_col_major ? p + (size_t)c * ldm + r : p + (size_t)r * ldm + c;
            *q = S(to_f(f.x[r * f.cols + c]));
        }
}
// d = a * b + c; products and sums in f32, k in increasing order.
template <int M, int N, int K, typename TA, typename LA, typename TB, typename LB, typename TC, typename TD>
inline void mma_sync(fragment<accumulator, M, N, K, TD, void>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
                     const fragment<matrix_b, M, N, K, TB, LB>& b, const fragment<accumulator, M, N, K, TC, void>& c,
                     int line = __builtin_LINE()) {
    warp_point(line);
    float out[M * N];
    for (int i = 0; i < M; ++i)
        for (int j = 0; j < N; ++j) {
            float acc = to_f(c.x[i * N + j]);
            for (int k = 0; k < K; ++k) acc += to_f(a.x[i * K + k]) * to_f(b.x[k * N + j]);
            out[i * N + j] = acc;
        }
    for (int i = 0; i < M * N; ++i) d.x[i] = from_f<TD>(out[i]);
}
}  // namespace wmma
}  // namespace nvcuda

