// conv.cu — the pieces of a GEMM-based conv2d and of 2-D pooling / batch norm, all NCHW.
//
// im2col_<t>(const T* x, T* col, ConvMeta m)
//     Reads x[n, c, h, w] (image n at x + n * m.img_stride, so a channel group is "pointer offset
//     + img_stride of the full tensor"); writes col[n][(c*kh + i)*kw + j][oh*ow] — per image a
//     [C*KH*KW, OH*OW] matrix, so conv = W[Cout, C*KH*KW] x col (one batched GEMM). Zero padding.
// col2im_<t>(const T* col, T* x, ConvMeta m, int accumulate)
//     The adjoint: dx[n, c, h, w] (+)= Σ of the col entries that read it. Gather form — one thread
//     per input pixel loops over the (kh, kw) taps that touch it — so no atomics: deterministic.
// maxpool2d_fwd_<t>(const T* x, T* y, i64* argmax, PoolMeta m)   argmax = h*W + w in its plane (may be null)
// maxpool2d_bwd_<t>(const T* gy, const i64* argmax, T* gx, PoolMeta m)   gather form, deterministic
// avgpool2d_fwd_<t>(const T* x, T* y, PoolMeta m)
// avgpool2d_bwd_<t>(const T* gy, T* gx, PoolMeta m)                      gather form, deterministic
// batchnorm_stats_<t>(const T* x, float* mean, float* var, i64 n, i64 c, i64 hw)
//     per channel, over N*H*W: mean and biased variance (two-pass in f32).
// batchnorm_apply_<t>(const T* x, const float* mean, const float* invstd, const T* gamma, const T* beta,
//                     T* y, i64 n, i64 c, i64 hw)          y = (x - mean) * invstd * gamma + beta
// batchnorm_bwd_reduce_<t>(const T* x, const T* gy, const float* mean, const float* invstd,
//                          float* sum_gy, float* sum_gy_xhat, i64 n, i64 c, i64 hw)
// batchnorm_bwd_dx_<t>(const T* x, const T* gy, const float* mean, const float* invstd, const T* gamma,
//                      const float* sum_gy, const float* sum_gy_xhat, T* dx, i64 n, i64 c, i64 hw)
//     training-mode dx = gamma * invstd * (gy - sum_gy/M - xhat * sum_gy_xhat/M), M = N*H*W.
//
// Why it is fast: every kernel is one pass with a thread per output element and coalesced writes;
// index decoding uses 32-bit math inside an image/plane. The batch-norm reductions use one block
// per channel with a fixed-order tree (deterministic). cuDNN is the fast path for convolution when
// present; these kernels are the always-available fall-back.

// Must match ConvMeta in src/ops/conv.rs (15 x i64).
struct ConvMeta {
    i64 n, c, h, w, img_stride;
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
    i64 oh, ow;
};
// Must match PoolMeta in src/ops/conv.rs (14 x i64). planes = N*C, planes are contiguous h*w.
struct PoolMeta {
    i64 planes, h, w;
    i64 kh, kw, sh, sw, ph, pw, dh, dw;
    i64 oh, ow;
    i64 count_include_pad;
};

template <typename T>
__device__ __forceinline__ void im2col_impl(const T* x, T* col, const ConvMeta m) {
    const u32 ohw = (u32)(m.oh * m.ow);
    const u32 per_img = (u32)(m.c * m.kh * m.kw) * ohw;
    const i64 total = m.n * (i64)per_img;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 img = i / per_img;
        u32 r = (u32)(i - img * per_img);
        const u32 p = r % ohw;  r /= ohw;
        const u32 kj = r % (u32)m.kw;  r /= (u32)m.kw;
        const u32 ki = r % (u32)m.kh;
        const u32 ch = r / (u32)m.kh;
        const int oy = (int)(p / (u32)m.ow), ox = (int)(p % (u32)m.ow);
        const int iy = oy * (int)m.sh - (int)m.ph + (int)ki * (int)m.dh;
        const int ix = ox * (int)m.sw - (int)m.pw + (int)kj * (int)m.dw;
        T v = from_f32<T>(0.f);
        if (iy >= 0 && iy < (int)m.h && ix >= 0 && ix < (int)m.w)
            v = x[img * m.img_stride + ((i64)ch * m.h + iy) * m.w + ix];
        col[i] = v;
    }
}

template <typename T>
__device__ __forceinline__ void col2im_impl(const T* col, T* x, const ConvMeta m, int accumulate) {
    const u32 hw = (u32)(m.h * m.w);
    const u32 per_img = (u32)m.c * hw;
    const i64 total = m.n * (i64)per_img;
    const i64 ohw = m.oh * m.ow;
    const i64 col_img = m.c * m.kh * m.kw * ohw;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 img = i / per_img;
        const u32 r = (u32)(i - img * per_img);
        const u32 ch = r / hw, q = r % hw;
        const int iy = (int)(q / (u32)m.w), ix = (int)(q % (u32)m.w);
        float acc = 0.f;
        for (int ki = 0; ki < (int)m.kh; ++ki) {
            const int ty = iy + (int)m.ph - ki * (int)m.dh;
            if (ty < 0 || ty % (int)m.sh != 0) continue;
            const int oy = ty / (int)m.sh;
            if (oy >= (int)m.oh) continue;
            for (int kj = 0; kj < (int)m.kw; ++kj) {
                const int tx = ix + (int)m.pw - kj * (int)m.dw;
                if (tx < 0 || tx % (int)m.sw != 0) continue;
                const int ox = tx / (int)m.sw;
                if (ox >= (int)m.ow) continue;
                const i64 row = ((i64)ch * m.kh + ki) * m.kw + kj;
                acc += to_f32(col[img * col_img + row * ohw + (i64)oy * m.ow + ox]);
            }
        }
        T* dst = x + img * m.img_stride + (i64)r;
        if (accumulate) acc += to_f32(*dst);
        *dst = from_f32<T>(acc);
    }
}

template <typename T>
__device__ __forceinline__ void maxpool_fwd(const T* x, T* y, i64* argmax, const PoolMeta m) {
    const i64 ohw = m.oh * m.ow, total = m.planes * ohw;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 pl = i / ohw;
        const u32 p = (u32)(i - pl * ohw);
        const int oy = (int)(p / (u32)m.ow), ox = (int)(p % (u32)m.ow);
        const T* xp = x + pl * m.h * m.w;
        float best = -SINTER_INF;
        i64 bi = -1;
        for (int ki = 0; ki < (int)m.kh; ++ki) {
            const int iy = oy * (int)m.sh - (int)m.ph + ki * (int)m.dh;
            if (iy < 0 || iy >= (int)m.h) continue;
            for (int kj = 0; kj < (int)m.kw; ++kj) {
                const int ix = ox * (int)m.sw - (int)m.pw + kj * (int)m.dw;
                if (ix < 0 || ix >= (int)m.w) continue;
                const i64 at = (i64)iy * m.w + ix;
                const float v = to_f32(xp[at]);
                // PyTorch's rule (sinter_types::pool_max_replaces): a NaN makes the output NaN
                // and the gradient goes to the window's last NaN.
                if (bi < 0 || v > best || v != v) { best = v; bi = at; }
            }
        }
        y[i] = from_f32<T>(best);
        if (argmax) argmax[i] = bi;  // -1: a window of padding only (no gradient), as on the CPU
    }
}

template <typename T>
__device__ __forceinline__ void maxpool_bwd(const T* gy, const i64* argmax, T* gx, const PoolMeta m) {
    const i64 hw = m.h * m.w, total = m.planes * hw, ohw = m.oh * m.ow;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 pl = i / hw;
        const i64 at = i - pl * hw;
        const int iy = (int)(at / m.w), ix = (int)(at % m.w);
        float acc = 0.f;
        for (int ki = 0; ki < (int)m.kh; ++ki) {
            const int ty = iy + (int)m.ph - ki * (int)m.dh;
            if (ty < 0 || ty % (int)m.sh != 0) continue;
            const int oy = ty / (int)m.sh;
            if (oy >= (int)m.oh) continue;
            for (int kj = 0; kj < (int)m.kw; ++kj) {
                const int tx = ix + (int)m.pw - kj * (int)m.dw;
                if (tx < 0 || tx % (int)m.sw != 0) continue;
                const int ox = tx / (int)m.sw;
                if (ox >= (int)m.ow) continue;
                const i64 o = pl * ohw + (i64)oy * m.ow + ox;
                if (argmax[o] == at) acc += to_f32(gy[o]);
            }
        }
        gx[i] = from_f32<T>(acc);
    }
}

// Divisor of output window (oy, ox), PyTorch's rule: with count_include_pad the window clipped
// to the padded input (all of kh * kw, except a ceil_mode window hanging past the padding), else
// only its in-bounds taps.
__device__ __forceinline__ float avg_divisor(const PoolMeta& m, int oy, int ox) {
    const int y0 = oy * (int)m.sh - (int)m.ph, x0 = ox * (int)m.sw - (int)m.pw;
    const int y1 = min(y0 + (int)m.kh, (int)(m.h + m.ph)), x1 = min(x0 + (int)m.kw, (int)(m.w + m.pw));
    if (m.count_include_pad) return (float)((y1 - y0) * (x1 - x0));
    const int cnt = (min(y1, (int)m.h) - max(y0, 0)) * (min(x1, (int)m.w) - max(x0, 0));
    return cnt > 0 ? (float)cnt : 1.f;
}

template <typename T>
__device__ __forceinline__ void avgpool_fwd(const T* x, T* y, const PoolMeta m) {
    const i64 ohw = m.oh * m.ow, total = m.planes * ohw;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 pl = i / ohw;
        const u32 p = (u32)(i - pl * ohw);
        const int oy = (int)(p / (u32)m.ow), ox = (int)(p % (u32)m.ow);
        const T* xp = x + pl * m.h * m.w;
        float acc = 0.f;
        for (int ki = 0; ki < (int)m.kh; ++ki) {
            const int iy = oy * (int)m.sh - (int)m.ph + ki;
            if (iy < 0 || iy >= (int)m.h) continue;
            for (int kj = 0; kj < (int)m.kw; ++kj) {
                const int ix = ox * (int)m.sw - (int)m.pw + kj;
                if (ix < 0 || ix >= (int)m.w) continue;
                acc += to_f32(xp[(i64)iy * m.w + ix]);
            }
        }
        y[i] = from_f32<T>(acc / avg_divisor(m, oy, ox));
    }
}

template <typename T>
__device__ __forceinline__ void avgpool_bwd(const T* gy, T* gx, const PoolMeta m) {
    const i64 hw = m.h * m.w, total = m.planes * hw, ohw = m.oh * m.ow;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 pl = i / hw;
        const i64 at = i - pl * hw;
        const int iy = (int)(at / m.w), ix = (int)(at % m.w);
        float acc = 0.f;
        for (int ki = 0; ki < (int)m.kh; ++ki) {
            const int ty = iy + (int)m.ph - ki;
            if (ty < 0 || ty % (int)m.sh != 0) continue;
            const int oy = ty / (int)m.sh;
            if (oy >= (int)m.oh) continue;
            for (int kj = 0; kj < (int)m.kw; ++kj) {
                const int tx = ix + (int)m.pw - kj;
                if (tx < 0 || tx % (int)m.sw != 0) continue;
                const int ox = tx / (int)m.sw;
                if (ox >= (int)m.ow) continue;
                acc += to_f32(gy[pl * ohw + (i64)oy * m.ow + ox]) / avg_divisor(m, oy, ox);
            }
        }
        gx[i] = from_f32<T>(acc);
    }
}

// One block per channel (grid-stride over channels), 1-D blocks; element k of channel ch is
// x[(k / hw * c + ch) * hw + k % hw].
template <typename T>
__device__ __forceinline__ void bn_stats(const T* x, float* mean, float* var, i64 n, i64 c, i64 hw) {
    __shared__ float scratch[32];
    const i64 cnt = n * hw;
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        float acc = 0.f;
        for (i64 k = threadIdx.x; k < cnt; k += blockDim.x) {
            const i64 b = k / hw;
            acc += to_f32(x[(b * c + ch) * hw + (k - b * hw)]);
        }
        const float mu = row_sum(acc, scratch) / (float)cnt;
        acc = 0.f;
        for (i64 k = threadIdx.x; k < cnt; k += blockDim.x) {
            const i64 b = k / hw;
            const float d = to_f32(x[(b * c + ch) * hw + (k - b * hw)]) - mu;
            acc += d * d;
        }
        const float v = row_sum(acc, scratch) / (float)cnt;
        if (threadIdx.x == 0) { mean[ch] = mu; var[ch] = v; }
    }
}

template <typename T>
__device__ __forceinline__ void bn_apply(const T* x, const float* mean, const float* invstd, const T* gamma,
                                         const T* beta, T* y, i64 n, i64 c, i64 hw) {
    const i64 total = n * c * hw;
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 ch = (i / hw) % c;
        float v = (to_f32(x[i]) - mean[ch]) * invstd[ch];
        if (gamma) v *= to_f32(gamma[ch]);
        if (beta) v += to_f32(beta[ch]);
        y[i] = from_f32<T>(v);
    }
}

template <typename T>
__device__ __forceinline__ void bn_bwd_reduce(const T* x, const T* gy, const float* mean, const float* invstd,
                                              float* sum_gy, float* sum_gy_xhat, i64 n, i64 c, i64 hw) {
    __shared__ float scratch[32];
    const i64 cnt = n * hw;
    for (i64 ch = blockIdx.x; ch < c; ch += gridDim.x) {
        const float mu = mean[ch], is = invstd[ch];
        float a = 0.f, b = 0.f;
        for (i64 k = threadIdx.x; k < cnt; k += blockDim.x) {
            const i64 bb = k / hw;
            const i64 at = (bb * c + ch) * hw + (k - bb * hw);
            const float g = to_f32(gy[at]);
            a += g;
            b += g * (to_f32(x[at]) - mu) * is;
        }
        a = row_sum(a, scratch);
        b = row_sum(b, scratch);
        if (threadIdx.x == 0) { sum_gy[ch] = a; sum_gy_xhat[ch] = b; }
    }
}

template <typename T>
__device__ __forceinline__ void bn_bwd_dx(const T* x, const T* gy, const float* mean, const float* invstd,
                                          const T* gamma, const float* sum_gy, const float* sum_gy_xhat, T* dx,
                                          i64 n, i64 c, i64 hw) {
    const i64 total = n * c * hw;
    const float inv_m = 1.f / (float)(n * hw);
    for (i64 i = global_tid(); i < total; i += global_stride()) {
        const i64 ch = (i / hw) % c;
        const float is = invstd[ch];
        const float xhat = (to_f32(x[i]) - mean[ch]) * is;
        const float g = gamma ? to_f32(gamma[ch]) : 1.f;
        dx[i] = from_f32<T>(g * is * (to_f32(gy[i]) - sum_gy[ch] * inv_m - xhat * sum_gy_xhat[ch] * inv_m));
    }
}

#define CONV_T(sfx, T)                                                                               \
    extern "C" __global__ void im2col_##sfx(const T* x, T* col, ConvMeta m) { im2col_impl<T>(x, col, m); } \
    extern "C" __global__ void col2im_##sfx(const T* col, T* x, ConvMeta m, int accumulate) {        \
        col2im_impl<T>(col, x, m, accumulate);                                                       \
    }                                                                                                \
    extern "C" __global__ void maxpool2d_fwd_##sfx(const T* x, T* y, i64* argmax, PoolMeta m) {      \
        maxpool_fwd<T>(x, y, argmax, m);                                                             \
    }                                                                                                \
    extern "C" __global__ void maxpool2d_bwd_##sfx(const T* gy, const i64* argmax, T* gx, PoolMeta m) { \
        maxpool_bwd<T>(gy, argmax, gx, m);                                                           \
    }                                                                                                \
    extern "C" __global__ void avgpool2d_fwd_##sfx(const T* x, T* y, PoolMeta m) { avgpool_fwd<T>(x, y, m); } \
    extern "C" __global__ void avgpool2d_bwd_##sfx(const T* gy, T* gx, PoolMeta m) { avgpool_bwd<T>(gy, gx, m); } \
    extern "C" __global__ void batchnorm_stats_##sfx(const T* x, float* mean, float* var, i64 n, i64 c, \
                                                     i64 hw) {                                       \
        bn_stats<T>(x, mean, var, n, c, hw);                                                         \
    }                                                                                                \
    extern "C" __global__ void batchnorm_apply_##sfx(const T* x, const float* mean, const float* invstd, \
                                                     const T* gamma, const T* beta, T* y, i64 n,     \
                                                     i64 c, i64 hw) {                                \
        bn_apply<T>(x, mean, invstd, gamma, beta, y, n, c, hw);                                      \
    }                                                                                                \
    extern "C" __global__ void batchnorm_bwd_reduce_##sfx(const T* x, const T* gy, const float* mean, \
                                                          const float* invstd, float* sum_gy,        \
                                                          float* sum_gy_xhat, i64 n, i64 c, i64 hw) { \
        bn_bwd_reduce<T>(x, gy, mean, invstd, sum_gy, sum_gy_xhat, n, c, hw);                        \
    }                                                                                                \
    extern "C" __global__ void batchnorm_bwd_dx_##sfx(const T* x, const T* gy, const float* mean,    \
                                                      const float* invstd, const T* gamma,           \
                                                      const float* sum_gy, const float* sum_gy_xhat, \
                                                      T* dx, i64 n, i64 c, i64 hw) {                 \
        bn_bwd_dx<T>(x, gy, mean, invstd, gamma, sum_gy, sum_gy_xhat, dx, n, c, hw);                 \
    }
CONV_T(f32, float)
CONV_T(f16, __half)
CONV_T(bf16, bf16)
