// embedding.cu — gather rows of a [vocab, dim] table by i64 index, and the deterministic
// scatter-add backward.
//
// embedding_fwd_<t>(const T* weight, const i64* idx, T* out, i64 num_idx, i64 vocab, i64 dim)
//     out[i, :] = weight[idx[i], :]; an index outside [0, vocab) yields a zero row.
// Backward, four launches, no floating-point atomics anywhere:
//   emb_bwd_count(const i64* idx, int* counts, i64 num_idx, i64 vocab)          counts[v] = #{i: idx[i] = v}
//   emb_bwd_scan(const int* counts, int* offsets, i64 vocab)                    offsets = exclusive scan, [vocab + 1]
//   emb_bwd_fill(const i64* idx, const int* offsets, int* cursor, int* pos, i64 num_idx, i64 vocab)
//       buckets the positions i by idx[i] (CSR)
//   embedding_bwd_<t>(const T* gy, const i64* idx, const int* offsets, const int* pos, T* gw,
//                     i64 num_idx, i64 vocab, i64 dim, int accumulate)
//       gw[v, :] (+)= Σ_{i in bucket v, in increasing i} gy[i, :]; untouched rows get 0 (or keep
//       their value when accumulate).
// The count and fill steps use *integer* atomics: counts are exact whatever the order, and the
// order in which fill places positions inside a bucket (which is timing dependent) is erased by
// the reduce kernel, which sorts each bucket (bitonic, shared memory) before summing — so the
// float sums always run in increasing i: bit-identical results run to run. Buckets larger than
// the sort capacity (a very frequent token, padding) are summed by scanning idx in order instead.
//
// Why it is fast: the forward is a pure row copy with 128-bit accesses; the backward reads each
// gy row once (CSR gather) instead of contending on atomics, and only touches rows that occur.

#define EMB_SORT_CAP 2048

template <typename T>
__device__ __forceinline__ void emb_fwd(const T* weight, const i64* idx, T* out, i64 num_idx, i64 vocab, i64 dim) {
    constexpr int N = Pack128<T>::N;
    for (i64 i = blockIdx.x; i < num_idx; i += gridDim.x) {
        const i64 v = idx[i];
        const bool ok = v >= 0 && v < vocab;
        const T* src = weight + (ok ? v : 0) * dim;
        T* dst = out + i * dim;
        i64 j0 = 0;
        if (aligned16(src) && aligned16(dst)) {
            const i64 nv = dim / N;
            Pack128<T> zero;
#pragma unroll
            for (int k = 0; k < N; ++k) zero.v[k] = from_f32<T>(0.f);
            for (i64 q = threadIdx.x; q < nv; q += blockDim.x) store128(dst + q * N, ok ? load128(src + q * N) : zero);
            j0 = nv * N;
        }
        for (i64 j = j0 + threadIdx.x; j < dim; j += blockDim.x) dst[j] = ok ? src[j] : from_f32<T>(0.f);
    }
}

extern "C" __global__ void emb_bwd_count(const i64* idx, int* counts, i64 num_idx, i64 vocab) {
    for (i64 i = global_tid(); i < num_idx; i += global_stride()) {
        const i64 v = idx[i];
        if (v >= 0 && v < vocab) atomicAdd(&counts[v], 1);  // integer: order-independent
    }
}

// One block of 1024 threads: thread t owns a contiguous slice of counts, the 1024 slice totals are
// scanned in shared memory (Hillis-Steele), then each thread writes its slice's offsets.
extern "C" __global__ void emb_bwd_scan(const int* counts, int* offsets, i64 vocab) {
    __shared__ int tot[1024];
    const int t = threadIdx.x, nt = blockDim.x;
    const i64 per = (vocab + nt - 1) / nt;
    const i64 b = min(vocab, (i64)t * per), e = min(vocab, b + per);
    int s = 0;
    for (i64 v = b; v < e; ++v) s += counts[v];
    tot[t] = s;
    __syncthreads();
    for (int o = 1; o < nt; o <<= 1) {
        const int add = t >= o ? tot[t - o] : 0;
        __syncthreads();
        tot[t] += add;
        __syncthreads();
    }
    int run = t == 0 ? 0 : tot[t - 1];
    for (i64 v = b; v < e; ++v) { offsets[v] = run; run += counts[v]; }
    if (t == nt - 1) offsets[vocab] = tot[nt - 1];
}

extern "C" __global__ void emb_bwd_fill(const i64* idx, const int* offsets, int* cursor, int* pos, i64 num_idx,
                                        i64 vocab) {
    for (i64 i = global_tid(); i < num_idx; i += global_stride()) {
        const i64 v = idx[i];
        if (v >= 0 && v < vocab) pos[offsets[v] + atomicAdd(&cursor[v], 1)] = (int)i;
    }
}

// One block per table row (grid-stride). Block size is a power of two <= 1024.
template <typename T>
__device__ __forceinline__ void emb_bwd_reduce(const T* gy, const i64* idx, const int* offsets, const int* pos,
                                               T* gw, i64 num_idx, i64 vocab, i64 dim, int accumulate) {
    __shared__ int sp[EMB_SORT_CAP];
    __shared__ i64 tile[256];
    for (i64 v = blockIdx.x; v < vocab; v += gridDim.x) {
        const int b = offsets[v], c = offsets[v + 1] - b;  // uniform across the block
        T* dst = gw + v * dim;
        if (c == 0) {
            if (!accumulate)
                for (i64 j = threadIdx.x; j < dim; j += blockDim.x) dst[j] = from_f32<T>(0.f);
            continue;
        }
        if (c <= EMB_SORT_CAP) {
            int p2 = 1;
            while (p2 < c) p2 <<= 1;
            for (int k = threadIdx.x; k < p2; k += blockDim.x) sp[k] = k < c ? pos[b + k] : 0x7fffffff;
            __syncthreads();
            for (int kk = 2; kk <= p2; kk <<= 1) {
                for (int jj = kk >> 1; jj > 0; jj >>= 1) {
                    for (int k = threadIdx.x; k < p2; k += blockDim.x) {
                        const int o = k ^ jj;
                        if (o > k) {
                            const int a = sp[k], bb = sp[o];
                            const bool up = (k & kk) == 0;
                            if ((a > bb) == up) { sp[k] = bb; sp[o] = a; }
                        }
                    }
                    __syncthreads();
                }
            }
            for (i64 j = threadIdx.x; j < dim; j += blockDim.x) {
                float acc = accumulate ? to_f32(dst[j]) : 0.f;
                for (int k = 0; k < c; ++k) acc += to_f32(gy[(i64)sp[k] * dim + j]);
                dst[j] = from_f32<T>(acc);
            }
            __syncthreads();  // sp is reused by the next row
        } else {
            // Heavy bucket: walk idx in order, a tile at a time, adding the matching rows.
            for (i64 j0 = 0; j0 < dim; j0 += blockDim.x) {
                const i64 j = j0 + threadIdx.x;
                float acc = (accumulate && j < dim) ? to_f32(dst[j]) : 0.f;
                for (i64 t0 = 0; t0 < num_idx; t0 += 256) {
                    __syncthreads();
                    for (int k = threadIdx.x; k < 256; k += blockDim.x) tile[k] = t0 + k < num_idx ? idx[t0 + k] : -1;
                    __syncthreads();
                    const int tn = (int)min((i64)256, num_idx - t0);
                    if (j < dim)
                        for (int k = 0; k < tn; ++k)
                            if (tile[k] == v) acc += to_f32(gy[(t0 + k) * dim + j]);
                }
                if (j < dim) dst[j] = from_f32<T>(acc);
            }
            __syncthreads();
        }
    }
}

#define EMB_T(sfx, T)                                                                                \
    extern "C" __global__ void embedding_fwd_##sfx(const T* weight, const i64* idx, T* out,          \
                                                   i64 num_idx, i64 vocab, i64 dim) {                \
        emb_fwd<T>(weight, idx, out, num_idx, vocab, dim);                                           \
    }                                                                                                \
    extern "C" __global__ void embedding_bwd_##sfx(const T* gy, const i64* idx, const int* offsets,  \
                                                   const int* pos, T* gw, i64 num_idx, i64 vocab,    \
                                                   i64 dim, int accumulate) {                        \
        emb_bwd_reduce<T>(gy, idx, offsets, pos, gw, num_idx, vocab, dim, accumulate);               \
    }
EMB_T(f32, float)
EMB_T(f16, __half)
EMB_T(bf16, bf16)
