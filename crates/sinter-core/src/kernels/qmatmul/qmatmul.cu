// qmatmul.cu — the int8 kind of the qmatmul kernel: y = act(dequantize(A·Wᵀ) + bias) with u8
// activations A [m, k] (each row quantized at run time, in one or two terms) and i8 weights
// W [n, k] (row j = output channel j, symmetric per channel), exact i32 accumulation with dp4a,
// and the CPU int8 GEMM's epilogue (sinter_cpu::int8). Launched through the custom-op mechanism:
// the inputs' pointers, the outputs' pointers, then the scalars.
//
// Bytes live in i64 tensors (sinter's tensors hold no u8): a row of A or W is `ld` bytes, a
// multiple of 8 (the tensor's last dimension × 8), holding k values then zeros. A kernel reads
// ⌈ld/4⌉ 32-bit words of a row; W's zero padding makes the words beyond k contribute nothing.
//
// qmatmul_weight_sums(w, sums; n, k4, ldw)               sums[j] = Σ_k w[j, k], one warp each
// qmatmul_quantize_rows(x, a, scale, zero; m, k, lda, terms)
//     row i of x (f32) → u8 row i of A with its mapping (scale, zero point), exactly as the CPU's
//     `quantize_rows_terms`; with terms = 2, row m + i quantizes the first term's rounding error.
//     A row holding NaN or ±∞ gets scale NaN (its outputs are NaN; the CPU reports an error).
// qmatmul_i32(a, w, sums, out; m, n, k4, lda, ldw)        out[i, j] = Σ_k a[i, k]·w[j, k] exactly
// qconv_im2col_u8(x, a; n, c, h, w, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, words, inv, zp)
//     the int8 convolution's columns (conv.rs): row (image, oy, ox) of A holds the window of
//     x (f32 NCHW) at that output pixel, k in the weight's (c, ky, kx) order, each value
//     quantized with the layer's static mapping (q_byte with inv = 1/scale, zp), a tap in the
//     padding the zero point (the real value 0), bytes beyond k zero. One thread per 8-byte word.
// ggml_dequantize_rows(w, ids, out; ty, k, row_bytes, count, block_elems, block_bytes)
//     the GGML kinds (ggml.rs): out[i, c] = value c of row ids[i] of a matrix in a GGML block
//     format (`ty`: ggml's type id, one of Q8_0, Q4_0, Q4_1, Q4_K, Q6_K; rows `row_bytes` apart
//     in w's bytes), computed exactly as
//     sinter_cpu::ggml_quant's blocks dequantize it: f16 scales widened, each product and sum
//     rounded once (__fmul_rn / __fadd_rn, never contracted into an FMA). One thread a value.
// qmatmul_f32[_bias](a, w, sums, row_scale, row_zero, w_scale, [bias,] out;
//                    m, n, k4, lda, ldw, row_step, act)
//     out[i, j] = act((acc − z_i·sums[j])·(s_i·w_scale[j]) + bias[j]), row i's mapping at
//     i·row_step (1: per row; 0: one static mapping); act 0 none, 1 ReLU, 2 GELU (tanh),
//     3 GELU (erf).
//
// u8 × s8 with dp4a: dp4a multiplies signed × signed (or unsigned × unsigned) bytes. a − 128
// fits s8, so each word of A is xor'ed with 0x80808080 (a − 128 in every byte), and
// Σ (a − 128)·w + 128·Σ w = Σ a·w — the re-centring the CPU's AVX2 kernel also uses. Every
// product and partial sum fits i32 for k ≤ 65,536, so the result is exact, as on the CPU.
//
// Why it is fast: a 64×64 output tile per block of 256 threads, 4×4 outputs per thread held in
// registers; k advances 32 bytes at a time through shared memory (each A and W word is loaded
// from global memory once per tile and read from shared memory by 16 threads); one dp4a does
// four multiply-adds. Rows of the shared tiles are padded to 9 words so the 16 channels a warp
// reads fall in distinct banks.
//
// The quantization's f32 steps use explicitly rounded operations (__fmul_rn, __fadd_rn, q_sub):
// NVRTC would otherwise contract x·inv + z into one FMA and round differently from the CPU.

#define I8_TILE 64
#define I8_KW 8  // words (32 bytes) of k per stage

__device__ __forceinline__ int i8_load_word(const unsigned char* base, i64 row, i64 rows, i64 ld, i64 word, i64 k4,
                                            int fill) {
    if (row < rows && word < k4) return *reinterpret_cast<const int*>(base + row * ld + word * 4);
    return fill;
}

// acc[r][c] = Σ (a − 128)·w over k for rows ty + 16r and channels tx + 16c of the block's tile.
__device__ __forceinline__ void i8_tile(const unsigned char* a, const signed char* w, i64 m, i64 n, i64 k4, i64 lda,
                                        i64 ldw, int acc[4][4]) {
    __shared__ int as[I8_TILE][I8_KW + 1];
    __shared__ int ws[I8_TILE][I8_KW + 1];
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const i64 row0 = (i64)blockIdx.y * I8_TILE, col0 = (i64)blockIdx.x * I8_TILE;
    const unsigned char* wb = reinterpret_cast<const unsigned char*>(w);
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 4; ++c) acc[r][c] = 0;
    for (i64 k0 = 0; k0 < k4; k0 += I8_KW) {
        // 64 rows × 8 words of each operand: two words per thread. Out-of-range A words hold
        // 0x80808080 (0 after re-centring), W words 0.
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int e = t + 256 * h, rr = e / I8_KW, kk = e % I8_KW;
            as[rr][kk] = i8_load_word(a, row0 + rr, m, lda, k0 + kk, k4, (int)0x80808080) ^ (int)0x80808080;
            ws[rr][kk] = i8_load_word(wb, col0 + rr, n, ldw, k0 + kk, k4, 0);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < I8_KW; ++kk) {
            int av[4], wv[4];
#pragma unroll
            for (int r = 0; r < 4; ++r) av[r] = as[ty + 16 * r][kk];
#pragma unroll
            for (int c = 0; c < 4; ++c) wv[c] = ws[tx + 16 * c][kk];
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = __dp4a(av[r], wv[c], acc[r][c]);
        }
        __syncthreads();
    }
}

// The exact Σ a·w from the re-centred sum (wrapping add: exact whenever the result fits).
__device__ __forceinline__ int i8_exact(int acc, int sum) { return (int)((u32)acc + ((u32)sum << 7)); }

__device__ __forceinline__ float i8_activate(float v, int act) {
    switch (act) {
        case 1: return fmaxf(v, 0.f);
        case 2: return 0.5f * v * (1.f + tanhf(0.7978845608028654f * (v + 0.044715f * v * v * v)));
        case 3: return 0.5f * v * (1.f + erff(v * 0.7071067811865476f));
        default: return v;
    }
}


extern "C" __global__ void qmatmul_weight_sums(const i64* w64, i64* sums, i64 n, i64 k4, i64 ldw) {
    const unsigned char* w = reinterpret_cast<const unsigned char*>(w64);
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (i64 j = (i64)blockIdx.x * warps + threadIdx.x / 32; j < n; j += (i64)gridDim.x * warps) {
        const int* row = reinterpret_cast<const int*>(w + j * ldw);
        int s = 0;
        for (i64 q = lane; q < k4; q += 32) s = __dp4a(row[q], 0x01010101, s);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) sums[j] = s;
    }
}

#define Q_BLOCK 256

// IEEE-rounded f32 subtraction and division, never contracted into an FMA (`/` is IEEE under
// NVRTC's defaults, which sinter keeps: no --use_fast_math, --prec-div=true).
__device__ __forceinline__ float q_sub(float a, float b) { return __fadd_rn(a, -b); }
__device__ __forceinline__ float q_div(float a, float b) { return a / b; }

// The mapping of a row whose values span [lo, hi] (QParams::from_range): scale and zero point.
__device__ __forceinline__ void q_params(float lo, float hi, bool bad, float* scale, int* zero) {
    if (bad) {
        *scale = SINTER_NAN;
        *zero = 0;
        return;
    }
    lo = fminf(lo, 0.f);
    hi = fmaxf(hi, 0.f);
    const float s = q_div(q_sub(hi, lo), 255.f);
    if (!(s >= 1.17549435e-38f && s <= 3.40282347e38f)) {  // zero, subnormal or not finite
        *scale = 1.f;
        *zero = 0;
        return;
    }
    *scale = s;
    *zero = (int)fminf(fmaxf(rintf(q_div(-lo, s)), 0.f), 255.f);
}

__device__ __forceinline__ unsigned char q_byte(float x, float inv, float zp) {
    return (unsigned char)(int)fminf(fmaxf(rintf(__fadd_rn(__fmul_rn(x, inv), zp)), 0.f), 255.f);
}

// The block's min and max of v over the row (exact, so any order gives the CPU's), and whether
// any value is not finite; every thread gets the result.
__device__ __forceinline__ void q_block_range(float lo, float hi, bool bad, float* out_lo, float* out_hi,
                                              bool* out_bad) {
    __shared__ float s_lo[Q_BLOCK], s_hi[Q_BLOCK];
    __shared__ int s_bad[Q_BLOCK];
    const int t = threadIdx.x;
    s_lo[t] = lo;
    s_hi[t] = hi;
    s_bad[t] = bad;
    __syncthreads();
    for (int h = Q_BLOCK / 2; h > 0; h >>= 1) {
        if (t < h) {
            s_lo[t] = fminf(s_lo[t], s_lo[t + h]);
            s_hi[t] = fmaxf(s_hi[t], s_hi[t + h]);
            s_bad[t] |= s_bad[t + h];
        }
        __syncthreads();
    }
    *out_lo = s_lo[0];
    *out_hi = s_hi[0];
    *out_bad = s_bad[0] != 0;
    __syncthreads();
}

// Quantizes one row of k values (term 1 of x itself; term 2 of x − s₁(q₁ − z₁)) into `out`
// (lda bytes: k values, then zeros) and returns its mapping.
__device__ void q_row(const float* x, i64 k, i64 lda, float s1, int z1, bool second, unsigned char* out,
                      float* scale, int* zero) {
    const float inv1 = second ? q_div(1.f, s1) : 0.f;
    float lo = SINTER_INF, hi = -SINTER_INF;
    bool bad = false;
    for (i64 c = threadIdx.x; c < k; c += Q_BLOCK) {
        float v = x[c];
        if (second) v = q_sub(v, __fmul_rn(s1, (float)((int)q_byte(v, inv1, (float)z1) - z1)));
        bad |= !isfinite(v);
        lo = fminf(lo, v);
        hi = fmaxf(hi, v);
    }
    bool any_bad;
    q_block_range(lo, hi, bad, &lo, &hi, &any_bad);
    float s;
    int z;
    q_params(lo, hi, any_bad, &s, &z);
    const float inv = q_div(1.f, s), zp = (float)z;
    for (i64 c = threadIdx.x; c < lda; c += Q_BLOCK) {
        unsigned char q = 0;
        if (c < k) {
            float v = x[c];
            if (second) v = q_sub(v, __fmul_rn(s1, (float)((int)q_byte(v, inv1, (float)z1) - z1)));
            q = q_byte(v, inv, zp);
        }
        out[c] = q;
    }
    *scale = s;
    *zero = z;
}

extern "C" __global__ void qmatmul_quantize_rows(const float* x, i64* a64, float* scale, i64* zero, i64 m, i64 k,
                                                 i64 lda, i64 terms) {
    unsigned char* a = reinterpret_cast<unsigned char*>(a64);
    for (i64 i = blockIdx.x; i < m; i += gridDim.x) {
        float s1;
        int z1;
        q_row(x + i * k, k, lda, 0.f, 0, false, a + i * lda, &s1, &z1);
        if (threadIdx.x == 0) {
            scale[i] = s1;
            zero[i] = z1;
        }
        if (terms == 2) {
            float s2;
            int z2;
            q_row(x + i * k, k, lda, s1, z1, true, a + (m + i) * lda, &s2, &z2);
            if (threadIdx.x == 0) {
                scale[m + i] = s2;
                zero[m + i] = z2;
            }
        }
    }
}

extern "C" __global__ void qmatmul_i32(const i64* a64, const i64* w64, const i64* sums, i64* out, i64 m, i64 n,
                                       i64 k4, i64 lda, i64 ldw) {
    const unsigned char* a = reinterpret_cast<const unsigned char*>(a64);
    const signed char* w = reinterpret_cast<const signed char*>(w64);
    int acc[4][4];
    i8_tile(a, w, m, n, k4, lda, ldw, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const i64 i = (i64)blockIdx.y * I8_TILE + ty + 16 * r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 j = (i64)blockIdx.x * I8_TILE + tx + 16 * c;
            if (i < m && j < n) out[i * n + j] = i8_exact(acc[r][c], (int)sums[j]);
        }
    }
}

__device__ __forceinline__ void qmatmul_f32_tile(const i64* a64, const i64* w64, const i64* sums,
                                                 const float* row_scale, const i64* row_zero, const float* w_scale,
                                                 const float* bias, float* out, i64 m, i64 n, i64 k4, i64 lda,
                                                 i64 ldw, i64 row_step, int act) {
    const unsigned char* a = reinterpret_cast<const unsigned char*>(a64);
    const signed char* w = reinterpret_cast<const signed char*>(w64);
    int acc[4][4];
    i8_tile(a, w, m, n, k4, lda, ldw, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const i64 i = (i64)blockIdx.y * I8_TILE + ty + 16 * r;
        if (i >= m) continue;
        const float sa = row_scale[i * row_step];
        const int za = (int)row_zero[i * row_step];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 j = (i64)blockIdx.x * I8_TILE + tx + 16 * c;
            if (j >= n) continue;
            const int sj = (int)sums[j];
            const int exact = (int)((u32)i8_exact(acc[r][c], sj) - (u32)za * (u32)sj);
            float v = __fmul_rn((float)exact, __fmul_rn(sa, w_scale[j]));
            v = __fadd_rn(v, bias ? bias[j] : 0.f);  // + 0 without one, as the CPU does
            out[i * n + j] = i8_activate(v, act);
        }
    }
}

extern "C" __global__ void qmatmul_f32(const i64* a, const i64* w, const i64* sums, const float* row_scale,
                                       const i64* row_zero, const float* w_scale, float* out, i64 m, i64 n, i64 k4,
                                       i64 lda, i64 ldw, i64 row_step, int act) {
    qmatmul_f32_tile(a, w, sums, row_scale, row_zero, w_scale, nullptr, out, m, n, k4, lda, ldw, row_step, act);
}

extern "C" __global__ void qmatmul_f32_bias(const i64* a, const i64* w, const i64* sums, const float* row_scale,
                                            const i64* row_zero, const float* w_scale, const float* bias, float* out,
                                            i64 m, i64 n, i64 k4, i64 lda, i64 ldw, i64 row_step, int act) {
    qmatmul_f32_tile(a, w, sums, row_scale, row_zero, w_scale, bias, out, m, n, k4, lda, ldw, row_step, act);
}

extern "C" __global__ void qconv_im2col_u8(const float* x, i64* a, i64 n, i64 c, i64 h, i64 w, i64 kh, i64 kw,
                                           i64 oh, i64 ow, i64 sh, i64 sw, i64 ph, i64 pw, i64 dh, i64 dw, i64 words,
                                           float inv, float zp) {
    const i64 k = c * kh * kw, pixels = oh * ow, total = n * pixels * words;
    const unsigned char pad = q_byte(0.f, inv, zp);
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < total; t += (i64)gridDim.x * blockDim.x) {
        const i64 row = t / words, word = t % words;
        const i64 img = row / pixels, pix = row % pixels, oy = pix / ow, ox = pix % ow;
        unsigned long long v = 0;
        for (int b = 0; b < 8; ++b) {
            const i64 kk = word * 8 + b;
            if (kk >= k) break;
            const i64 ch = kk / (kh * kw), tap = kk % (kh * kw), ky = tap / kw, kx = tap % kw;
            const i64 iy = oy * sh - ph + ky * dh, ix = ox * sw - pw + kx * dw;
            const unsigned char q = (iy >= 0 && iy < h && ix >= 0 && ix < w)
                                        ? q_byte(x[((img * c + ch) * h + iy) * w + ix], inv, zp)
                                        : pad;
            v |= (unsigned long long)q << (8 * b);
        }
        a[t] = (i64)v;
    }
}

// ---- GGML block formats (byte layouts of ggml-common.h; see sinter_cpu::ggml_quant::blocks) ----

__device__ __forceinline__ float g_f16(const unsigned char* p) {
    return __half2float(__ushort_as_half((unsigned short)(p[0] | (p[1] << 8))));
}

// d·q + m and d·q − m, each step rounded once, as the CPU's f32 expressions.
__device__ __forceinline__ float g_mad(float d, int q, float m) { return __fadd_rn(__fmul_rn(d, (float)q), m); }
__device__ __forceinline__ float g_msub(float d, int q, float m) { return __fadd_rn(__fmul_rn(d, (float)q), -m); }

// Scale and minimum of sub-block j of a Q4_K block from its 12 packed bytes.
__device__ __forceinline__ void g_scale_min_k4(int j, const unsigned char* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// Value e of the block at b (type ids: ggml's). The kinds a GGML weight holds: those sinter-cpu
// has dot kernels for (`DOT_TYPES`: Q8_0, Q4_0, Q4_1, Q4_K, Q6_K).
__device__ float ggml_value(int ty, const unsigned char* b, int e) {
    switch (ty) {
        case 2: {  // Q4_0: d, qs[16]; value j low nibble, j + 16 high
            const unsigned char q = b[2 + e % 16];
            return __fmul_rn(g_f16(b), (float)((e < 16 ? q & 0xF : q >> 4) - 8));
        }
        case 3: {  // Q4_1: d, m, qs[16]
            const unsigned char q = b[4 + e % 16];
            return g_mad(g_f16(b), e < 16 ? q & 0xF : q >> 4, g_f16(b + 2));
        }
        case 8: return __fmul_rn(g_f16(b), (float)(signed char)b[2 + e]);  // Q8_0: d, qs[32]
        case 12: {  // Q4_K: d, dmin, scales[12], qs[128]
            const int pair = e / 64, hi = (e % 64) / 32, l = e % 32, j = 2 * pair + hi;
            const unsigned char* qs = b + 16;
            const int q = hi ? qs[pair * 32 + l] >> 4 : qs[pair * 32 + l] & 0xF;
            int sc, m;
            g_scale_min_k4(j, b + 4, &sc, &m);
            return g_msub(__fmul_rn(g_f16(b), (float)sc), q, __fmul_rn(g_f16(b + 2), (float)m));
        }
        case 14: {  // Q6_K: ql[128], qh[64], scales[16] (i8), d
            const int half = e / 128, k = (e % 128) / 32, l = e % 32;
            const unsigned char lb = b[half * 64 + l + 32 * (k % 2)];
            const int low = k < 2 ? lb & 0xF : lb >> 4, high = (b[128 + half * 32 + l] >> (2 * k)) & 3;
            const float sc = (float)(signed char)b[192 + half * 8 + 2 * k + l / 16];
            return __fmul_rn(__fmul_rn(g_f16(b + 208), sc), (float)((low | (high << 4)) - 32));
        }
    }
    return SINTER_NAN;  // a type the host side does not send
}

extern "C" __global__ void ggml_dequantize_rows(const i64* w64, const i64* ids, float* out, i64 ty, i64 k,
                                                i64 row_bytes, i64 count, i64 block_elems, i64 block_bytes) {
    const unsigned char* w = reinterpret_cast<const unsigned char*>(w64);
    for (i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x; t < count * k; t += (i64)gridDim.x * blockDim.x) {
        const i64 i = t / k, c = t % k, row = ids[i];
        const unsigned char* blk = w + row * row_bytes + (c / block_elems) * block_bytes;
        out[t] = ggml_value((int)ty, blk, (int)(c % block_elems));
    }
}
