// dropout.cu — counter-based random numbers: dropout, uniform and normal fills.
//
// dropout_<t>(const T* x, T* y, i64 n, float p, u64 seed, u64 offset)
//     y[i] = x[i] / (1 - p) if u(i) >= p else 0. The mask is never stored: the backward is the same
//     kernel applied to gy with the same (seed, offset), which regenerates the same mask.
// rand_uniform_<t>(T* y, i64 n, float lo, float hi, u64 seed, u64 offset)     y ~ U[lo, hi)
// rand_normal_<t>(T* y, i64 n, float mean, float std, u64 seed, u64 offset)   y ~ N(mean, std^2)
//
// Random numbers: Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"),
// key = seed, counter = (i / 4, offset). Element i always gets word i % 4 of block i / 4, so the
// stream depends only on (seed, offset, i) — not on the launch shape or the GPU. Between two calls
// with the same seed, advance offset by at least ceil(n / 4) (see `philox_offset_advance`).
// Why it is fast: 10 rounds of 32-bit multiply/xor per 4 elements is far below memory time; each
// thread owns 4 consecutive elements and moves them in one 64/128-bit access when aligned.

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

__device__ __forceinline__ uint4 philox4x32_10(uint4 c, uint2 k) {
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        const u32 hi0 = __umulhi(PHILOX_M0, c.x), lo0 = PHILOX_M0 * c.x;
        const u32 hi1 = __umulhi(PHILOX_M1, c.z), lo1 = PHILOX_M1 * c.z;
        c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
        k.x += PHILOX_W0;
        k.y += PHILOX_W1;
    }
    return c;
}
__device__ __forceinline__ uint4 philox_block(u64 seed, u64 offset, i64 g) {
    const uint4 ctr = make_uint4((u32)g, (u32)((u64)g >> 32), (u32)offset, (u32)(offset >> 32));
    return philox4x32_10(ctr, make_uint2((u32)seed, (u32)(seed >> 32)));
}
// [0, 1) with 24 random bits, and (0, 1] for logarithms.
__device__ __forceinline__ float u01(u32 r) { return (float)(r >> 8) * (1.0f / 16777216.0f); }
__device__ __forceinline__ float u01_open0(u32 r) { return ((float)(r >> 8) + 1.0f) * (1.0f / 16777216.0f); }

// Four consecutive elements, moved together when the group is aligned to 4 * sizeof(T).
template <typename T> struct __align__(4 * sizeof(T)) Quad { T v[4]; };

template <typename T, typename F>
__device__ __forceinline__ void quad_map(const T* x, T* y, i64 n, u64 seed, u64 offset, F&& f) {
    const i64 groups = (n + 3) / 4;
    const bool vec = ((reinterpret_cast<u64>(x) | reinterpret_cast<u64>(y)) % (4 * sizeof(T))) == 0;
    for (i64 g = global_tid(); g < groups; g += global_stride()) {
        const uint4 r = philox_block(seed, offset, g);
        const u32 rs[4] = {r.x, r.y, r.z, r.w};
        const i64 i = g * 4;
        if (vec && i + 4 <= n) {
            const Quad<T> in = x ? *reinterpret_cast<const Quad<T>*>(x + i) : Quad<T>();
            Quad<T> out;
#pragma unroll
            for (int k = 0; k < 4; ++k) out.v[k] = from_f32<T>(f(x ? to_f32(in.v[k]) : 0.f, rs[k], k));
            *reinterpret_cast<Quad<T>*>(y + i) = out;
        } else {
            for (int k = 0; k < 4 && i + k < n; ++k) y[i + k] = from_f32<T>(f(x ? to_f32(x[i + k]) : 0.f, rs[k], k));
        }
    }
}

template <typename T>
__device__ __forceinline__ void dropout_impl(const T* x, T* y, i64 n, float p, u64 seed, u64 offset) {
    const float scale = p < 1.f ? 1.f / (1.f - p) : 0.f;
    quad_map(x, y, n, seed, offset, [&](float v, u32 r, int) { return u01(r) >= p ? v * scale : 0.f; });
}

template <typename T>
__device__ __forceinline__ void uniform_impl(T* y, i64 n, float lo, float hi, u64 seed, u64 offset) {
    quad_map((const T*)nullptr, y, n, seed, offset, [&](float, u32 r, int) { return lo + (hi - lo) * u01(r); });
}

// Box-Muller on word pairs (0,1) and (2,3) of each Philox block.
template <typename T>
__device__ __forceinline__ void normal_impl(T* y, i64 n, float mean, float std, u64 seed, u64 offset) {
    const i64 groups = (n + 3) / 4;
    for (i64 g = global_tid(); g < groups; g += global_stride()) {
        const uint4 r = philox_block(seed, offset, g);
        float z[4];
        {
            const float rad = sqrtf(-2.f * logf(u01_open0(r.x)));
            float s, c;
            sincospif(2.f * u01(r.y), &s, &c);
            z[0] = rad * c;
            z[1] = rad * s;
        }
        {
            const float rad = sqrtf(-2.f * logf(u01_open0(r.z)));
            float s, c;
            sincospif(2.f * u01(r.w), &s, &c);
            z[2] = rad * c;
            z[3] = rad * s;
        }
        const i64 i = g * 4;
        for (int k = 0; k < 4 && i + k < n; ++k) y[i + k] = from_f32<T>(mean + std * z[k]);
    }
}

#define RNG_T(sfx, T)                                                                                \
    extern "C" __global__ void dropout_##sfx(const T* x, T* y, i64 n, float p, u64 seed, u64 offset) { \
        dropout_impl<T>(x, y, n, p, seed, offset);                                                   \
    }                                                                                                \
    extern "C" __global__ void rand_uniform_##sfx(T* y, i64 n, float lo, float hi, u64 seed,         \
                                                  u64 offset) {                                      \
        uniform_impl<T>(y, n, lo, hi, seed, offset);                                                 \
    }                                                                                                \
    extern "C" __global__ void rand_normal_##sfx(T* y, i64 n, float mean, float std, u64 seed,       \
                                                 u64 offset) {                                       \
        normal_impl<T>(y, n, mean, std, seed, offset);                                               \
    }
RNG_T(f32, float)
RNG_T(f16, __half)
RNG_T(bf16, bf16)
