// int8_gemm.cu — int8 GEMM for inference: C = A·Wᵀ with u8 activations A [m, k] and i8 weights
// W [n, k] (row j = output channel j), exact i32 accumulation with dp4a, and the same epilogue as
// the CPU's int8 GEMM (sinter_cpu::int8).
//
// int8_weight_sums(const signed char* w, int* sums, i64 n, i64 k4, i64 ldw)
//     sums[j] = Σ_k w[j, k]; one warp per channel. Run once per weight.
// int8_gemm_i32(const u8* a, const signed char* w, const int* sums, int* out,
//               i64 m, i64 n, i64 k4, i64 lda, i64 ldw, i64 ldo)
//     out[i, j] = Σ_k a[i, k]·w[j, k], exactly (the raw accumulators, for tests).
// int8_gemm_f32(const u8* a, const signed char* w, const int* sums, const float* row_scale,
//               const int* row_zero, i64 row_step, const float* w_scale, const float* bias,
//               int act, float* out, i64 m, i64 n, i64 k4, i64 lda, i64 ldw, i64 ldo)
//     out[i, j] = act((acc[i, j] − z_i·sums[j])·(s_i·w_scale[j]) + bias[j]), where row i's
//     mapping is s_i = row_scale[i·row_step], z_i = row_zero[i·row_step] (row_step 1: dynamic
//     per-row quantization; 0: one static mapping); bias may be null; act 0 none, 1 ReLU,
//     2 GELU (tanh), 3 GELU (erf).
// Rows are k4 32-bit words (k padded to a multiple of 4; W's padding bytes are zero, A's are
// ignored); lda and ldw count bytes and are multiples of 4; a and w are 4-byte aligned.
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

extern "C" __global__ void int8_weight_sums(const signed char* w, int* sums, i64 n, i64 k4, i64 ldw) {
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

extern "C" __global__ void int8_gemm_i32(const unsigned char* a, const signed char* w, const int* sums, int* out,
                                         i64 m, i64 n, i64 k4, i64 lda, i64 ldw, i64 ldo) {
    int acc[4][4];
    i8_tile(a, w, m, n, k4, lda, ldw, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const i64 i = (i64)blockIdx.y * I8_TILE + ty + 16 * r;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 j = (i64)blockIdx.x * I8_TILE + tx + 16 * c;
            if (i < m && j < n) out[i * ldo + j] = i8_exact(acc[r][c], sums[j]);
        }
    }
}

extern "C" __global__ void int8_gemm_f32(const unsigned char* a, const signed char* w, const int* sums,
                                         const float* row_scale, const int* row_zero, i64 row_step,
                                         const float* w_scale, const float* bias, int act, float* out, i64 m, i64 n,
                                         i64 k4, i64 lda, i64 ldw, i64 ldo) {
    int acc[4][4];
    i8_tile(a, w, m, n, k4, lda, ldw, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int r = 0; r < 4; ++r) {
        const i64 i = (i64)blockIdx.y * I8_TILE + ty + 16 * r;
        if (i >= m) continue;
        const float sa = row_scale[i * row_step];
        const int za = row_zero[i * row_step];
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const i64 j = (i64)blockIdx.x * I8_TILE + tx + 16 * c;
            if (j >= n) continue;
            const int exact = (int)((u32)i8_exact(acc[r][c], sums[j]) - (u32)za * (u32)sums[j]);
            float v = (float)exact * (sa * w_scale[j]);
            if (bias) v += bias[j];
            out[i * ldo + j] = i8_activate(v, act);
        }
    }
}
