// flash_attention.cu — FlashAttention-2 forward and backward on tensor cores (WMMA 16x16x16,
// f16/bf16 inputs, f32 accumulation), head dims 32, 64 and 128.
//
// Layouts: q, o, dout, dq [b, h, tq, D] and k, v, dk, dv [b, h / g, tk, D] are strided views
// (batch, head and row strides in elements; the last dim contiguous), read and written in place:
// e.g. q, k, v and dq, dk, dv as the head groups of one packed projection [b, t, h + 2·h/g, D]
// and its gradient, o and dout with the heads merged, [b, t, h, D]. dk and dv share one set of
// strides. Grouped-query attention: query head i reads kv head i / g (g = 1: multi-head).
// lse and dvec are contiguous f32 [b, h, tq]. The causal mask is aligned bottom-right: query i
// sees keys 0 .. tk - tq + i (tq <= tk is decoding against a KV cache). A query row that sees no
// key (causal with tq > tk) gets o = 0 and lse = -inf, as on the CPU.
//
// fa_fwd_<t>_d<D>(q, k, v, o, lse, h, g, tq, tk, q strides[3], k strides[3], v strides[3],
//                 o strides[3], scale, causal)           grid (b*h, ceil(tq/64)), block 128
//     Reads q, k, v; writes o and lse = log Σ_j exp(scale q·k_j) per query row.
// fa_bwd_dot_<t>(o, dout, dvec, rows, D, h, tq, o strides[3], dout strides[3])  one warp per row
//     dvec = rowsum(dout ∘ o), the D_i of FlashAttention-2's backward.
// fa_bwd_dkdv_<t>_d<D>(q, k, v, dout, lse, dvec, dk, dv, h, g, tq, tk, q/k/v strides,
//                      dout strides[3], dk/dv strides[3], scale, causal)
//                                                        grid (b*h/g, ceil(tk/32)), block 64
//     Per block of 32 keys of one kv head, loops over the query blocks of its g query heads
//     that see them (the group's sum in one block: no atomics): recomputes
//     P = exp(scale q kᵀ - lse), dV += Pᵀ dO, dS = P ∘ (dO vᵀ - D), dK += scale dSᵀ Q.
// fa_bwd_dq_<t>_d<D>(q, k, v, dout, lse, dvec, dq, h, g, tq, tk, q/k/v strides, dout strides[3],
//                    dq strides[3], scale, causal)
//                                                        grid (b*h, ceil(tq/32)), block 64
//     Per block of 32 queries, loops over the visible key blocks: dQ += scale dS K.
//
// Why it is fast: the [tq, tk] score/probability matrices never exist in memory, forward or
// backward (O(t·D) traffic instead of O(t²)): each block keeps its query (or key) tile in shared
// memory, streams the other operand through shared memory one 32-row tile at a time, multiplies
// on tensor cores, and folds the scores into the output with an online softmax (running max and
// sum per row; the accumulator rows are rescaled in registers). Causal blocks stop at the
// diagonal. The backward is split into a dK/dV kernel and a dQ kernel so that each output has
// exactly one writer: no atomics, bit-identical results run to run. Shared memory stays under the
// 48 KiB static limit for D = 128 (several blocks per SM).
//
// WMMA accumulator fragments do not expose which row an element belongs to, so each warp loads a
// 16x16 matrix whose element (r, c) is r into an accumulator fragment once: element e of any
// accumulator fragment then belongs to row rowid.x[e], which is what the per-row rescaling needs.
#include <mma.h>
using namespace nvcuda;

#define FA_WARP 16  // rows of a tile owned by one warp (one WMMA row of fragments)

template <typename T>
using FaFragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <typename T>
using FaFragBc = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
template <typename T>
using FaFragBr = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> FaFragC;

// Keys query row i may see: 0 .. fa_limit(i) (bottom-right causal alignment).
__device__ __forceinline__ i64 fa_limit(i64 i, i64 tq, i64 tk, int causal) {
    if (!causal) return tk;
    const i64 l = i + tk - tq + 1;
    return l < 0 ? 0 : (l > tk ? tk : l);
}

// dst[r][0..D) (row pitch LD) = src row r (row stride st) for r < valid, zeros for valid <= r < rows.
// 16-byte loads when the source row is aligned; the whole block takes part.
template <typename T, int D, int LD>
__device__ __forceinline__ void fa_load_tile(T* dst, const T* src, i64 st, int rows, int valid) {
    constexpr int C = D / 8;
    for (int idx = threadIdx.x; idx < rows * C; idx += blockDim.x) {
        const int r = idx / C, c = (idx % C) * 8;
        T* d = dst + r * LD + c;
        if (r < valid) {
            const T* s = src + (i64)r * st + c;
            if (aligned16(s)) {
                *reinterpret_cast<int4*>(d) = *reinterpret_cast<const int4*>(s);
            } else {
#pragma unroll
                for (int e = 0; e < 8; ++e) d[e] = s[e];
            }
        } else {
            *reinterpret_cast<int4*>(d) = make_int4(0, 0, 0, 0);
        }
    }
}

// The row-index fragment (see the header); `srow` is 256 floats of shared memory, filled by the
// caller's block before a __syncthreads.
__device__ __forceinline__ void fa_fill_rowids(float* srow) {
    for (int e = threadIdx.x; e < 256; e += blockDim.x) srow[e] = (float)(e / 16);
}

// Write a warp's 16 x D accumulators, times scale(row), to rows row0.. of out (row stride st),
// skipping rows >= limit; `scratch` is the warp's 16 x LS floats of shared memory.
template <typename T, int D, int LS>
__device__ __forceinline__ void fa_store_rows(FaFragC* acc, float* scratch, T* out, i64 st, i64 row0,
                                              i64 limit, float mul) {
    const int lane = threadIdx.x & 31;
    __syncwarp();
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
        wmma::store_matrix_sync(scratch, acc[f], LS, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < 256; e += 32) {
            const int r = e / 16, c = e % 16;
            if (row0 + r < limit) out[(row0 + r) * st + f * 16 + c] = from_f32<T>(scratch[r * LS + c] * mul);
        }
        __syncwarp();
    }
}

// ---------------------------------------------------------------------------------------------
// Forward: 4 warps x 16 query rows, key tiles of 32.
template <typename T, int D>
__device__ __forceinline__ void fa_fwd(const T* q, const T* k, const T* v, T* o, float* lse, i64 H, i64 G,
                                       i64 tq, i64 tk, i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb,
                                       i64 vsh, i64 vst, i64 osb, i64 osh, i64 ost, float scale,
                                       int causal) {
    constexpr int BR = 64, BC = 32, LD = D + 8, LS = BC + 4, LP = BC + 8, HALF = BC / 2;
    __shared__ __align__(128) T sq[BR * LD];
    __shared__ __align__(128) T sk[BC * LD];
    __shared__ __align__(128) T sv[BC * LD];
    __shared__ __align__(128) float ss[4][FA_WARP * LS];
    __shared__ __align__(128) float srow[256];
    __shared__ float salpha[4][FA_WARP];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 bh = blockIdx.x, b = bh / H, hh = bh % H;
    const i64 i0 = (i64)blockIdx.y * BR;
    const int nr = (int)min((i64)BR, tq - i0);
    const T* kb = k + b * ksb + (hh / G) * ksh;  // the kv head of query head hh
    const T* vb = v + b * vsb + (hh / G) * vsh;
    fa_load_tile<T, D, LD>(sq, q + b * qsb + hh * qsh + i0 * qst, qst, BR, nr);
    fa_fill_rowids(srow);
    __syncthreads();
    FaFragC rowid;
    wmma::load_matrix_sync(rowid, srow, 16, wmma::mem_row_major);
    FaFragC acc[D / 16];
#pragma unroll
    for (int f = 0; f < D / 16; ++f) wmma::fill_fragment(acc[f], 0.f);
    // Lanes 2r and 2r+1 own row r of the warp's 16 rows, one half of the tile's columns each.
    const int my_r = lane >> 1, half = lane & 1;
    const i64 gi = i0 + warp * FA_WARP + my_r;
    const i64 lim = gi < tq ? fa_limit(gi, tq, tk, causal) : 0;
    float m = -SINTER_INF, l = 0.f;
    float* sw = ss[warp];
    T* pw = reinterpret_cast<T*>(sw);  // P (16 x LP) overwrites S once S is in registers
    const i64 kend = fa_limit(i0 + nr - 1, tq, tk, causal);
    for (i64 j0 = 0; j0 < kend; j0 += BC) {
        const int nc = (int)min((i64)BC, tk - j0);
        __syncthreads();  // every warp is done with the previous K/V tile
        fa_load_tile<T, D, LD>(sk, kb + j0 * kst, kst, BC, nc);
        fa_load_tile<T, D, LD>(sv, vb + j0 * vst, vst, BC, nc);
        __syncthreads();
        // S = Q_w Kᵀ (16 x BC)
#pragma unroll
        for (int n = 0; n < BC / 16; ++n) {
            FaFragC s;
            wmma::fill_fragment(s, 0.f);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                FaFragA<T> a;
                FaFragBc<T> bm;
                wmma::load_matrix_sync(a, sq + warp * FA_WARP * LD + kk * 16, LD);
                wmma::load_matrix_sync(bm, sk + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(s, a, bm, s);
            }
            wmma::store_matrix_sync(sw + n * 16, s, LS, wmma::mem_row_major);
        }
        __syncwarp();
        // Online softmax on this lane's half row.
        float x[HALF];
        float mx = -SINTER_INF;
#pragma unroll
        for (int c = 0; c < HALF; ++c) {
            const int col = half * HALF + c;
            const float val = (j0 + col < lim) ? sw[my_r * LS + col] * scale : -SINTER_INF;
            x[c] = val;
            mx = fmaxf(mx, val);
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        const float m_new = fmaxf(m, mx);
        const float alpha = m_new == -SINTER_INF ? 1.f : __expf(m - m_new);
        float sum = 0.f;
#pragma unroll
        for (int c = 0; c < HALF; ++c) {
            const float p = x[c] == -SINTER_INF ? 0.f : __expf(x[c] - m_new);
            x[c] = p;
            sum += p;
        }
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        l = l * alpha + sum;
        m = m_new;
        __syncwarp();  // all of S is read before P overwrites it
#pragma unroll
        for (int c = 0; c < HALF; ++c) pw[my_r * LP + half * HALF + c] = from_f32<T>(x[c]);
        if (half == 0) salpha[warp][my_r] = alpha;
        __syncwarp();
        // O = alpha O + P V
#pragma unroll
        for (int f = 0; f < D / 16; ++f)
            for (int e = 0; e < acc[f].num_elements; ++e) acc[f].x[e] *= salpha[warp][(int)rowid.x[e]];
#pragma unroll
        for (int kk = 0; kk < BC / 16; ++kk) {
            FaFragA<T> a;
            wmma::load_matrix_sync(a, pw + kk * 16, LP);
#pragma unroll
            for (int f = 0; f < D / 16; ++f) {
                FaFragBr<T> bm;
                wmma::load_matrix_sync(bm, sv + kk * 16 * LD + f * 16, LD);
                wmma::mma_sync(acc[f], a, bm, acc[f]);
            }
        }
        __syncwarp();
    }
    if (half == 0) {
        salpha[warp][my_r] = l > 0.f ? 1.f / l : 0.f;
        if (gi < tq) lse[bh * tq + gi] = l > 0.f ? m + logf(l) : -SINTER_INF;
    }
    __syncwarp();
#pragma unroll
    for (int f = 0; f < D / 16; ++f)
        for (int e = 0; e < acc[f].num_elements; ++e) acc[f].x[e] *= salpha[warp][(int)rowid.x[e]];
    fa_store_rows<T, D, LS>(acc, sw, o + b * osb + hh * osh, ost, i0 + warp * FA_WARP, tq, 1.f);
}

// ---------------------------------------------------------------------------------------------
// D = rowsum(dout ∘ o): one warp per row, 8 rows per block.
template <typename T>
__device__ __forceinline__ void fa_bwd_dot(const T* o, const T* dout, float* dvec, i64 rows, i64 d, i64 H,
                                           i64 tq, i64 osb, i64 osh, i64 ost, i64 gsb, i64 gsh, i64 gst) {
    const i64 r = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (r >= rows) return;
    const int lane = threadIdx.x & 31;
    const i64 bh = r / tq, i = r % tq, b = bh / H, hh = bh % H;
    const T* orow = o + b * osb + hh * osh + i * ost;
    const T* grow = dout + b * gsb + hh * gsh + i * gst;
    float acc = 0.f;
    for (i64 j = lane; j < d; j += 32) acc += to_f32(orow[j]) * to_f32(grow[j]);
    acc = warp_sum(acc);
    if (lane == 0) dvec[r] = acc;
}

// ---------------------------------------------------------------------------------------------
// dK, dV: 2 warps x 16 keys, query tiles of 32.
template <typename T, int D>
__device__ __forceinline__ void fa_bwd_dkdv(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                            const float* dvec, T* dk, T* dv, i64 H, i64 G, i64 tq, i64 tk, i64 qsb,
                                            i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh,
                                            i64 vst, i64 gsb, i64 gsh, i64 gst, i64 dsb, i64 dsh, i64 dst,
                                            float scale, int causal) {
    constexpr int BK = 32, BQ = 32, LD = D + 8, LS = BQ + 4, LP = BQ + 8, HALF = BQ / 2;
    __shared__ __align__(128) T sk[BK * LD];
    __shared__ __align__(128) T sv[BK * LD];
    __shared__ __align__(128) T sq[BQ * LD];
    __shared__ __align__(128) T sdo[BQ * LD];
    __shared__ __align__(128) float ss[2][FA_WARP * LS];
    __shared__ __align__(128) float sdp[2][FA_WARP * LS];
    __shared__ float slse[BQ], sdv[BQ];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    // One block per (batch, kv head): it sums over the G query heads that read the kv head.
    const i64 KV = H / G, bk = blockIdx.x, b = bk / KV, hk = bk % KV;
    const i64 j0 = (i64)blockIdx.y * BK;
    const int nk = (int)min((i64)BK, tk - j0);
    fa_load_tile<T, D, LD>(sk, k + b * ksb + hk * ksh + j0 * kst, kst, BK, nk);
    fa_load_tile<T, D, LD>(sv, v + b * vsb + hk * vsh + j0 * vst, vst, BK, nk);
    FaFragC adk[D / 16], adv[D / 16];
#pragma unroll
    for (int f = 0; f < D / 16; ++f) {
        wmma::fill_fragment(adk[f], 0.f);
        wmma::fill_fragment(adv[f], 0.f);
    }
    const int my_r = lane >> 1, half = lane & 1;
    const i64 gj = j0 + warp * FA_WARP + my_r;  // this lane's key
    float* sw = ss[warp];
    float* dw = sdp[warp];
    T* pw = reinterpret_cast<T*>(sw);   // Pᵀ over Sᵀ
    T* dsw = reinterpret_cast<T*>(dw);  // dSᵀ over dPᵀ
    // The first query row that sees key j0 (causal), rounded down to a tile.
    i64 qstart = causal ? j0 + tq - tk : 0;
    qstart = qstart < 0 ? 0 : (qstart / BQ) * BQ;
    // The group's query heads one after the other, into the same accumulators: each kv head's
    // gradient is its one block's sum, in a fixed order (no atomics, deterministic).
    const i64 qtiles = (tq - qstart + BQ - 1) / BQ;
    for (i64 it = 0; it < G * qtiles; ++it) {
        const i64 bh = b * H + hk * G + it / qtiles, hh = bh % H;
        const i64 q0 = qstart + (it % qtiles) * BQ;
        const T* qb = q + b * qsb + hh * qsh;
        const T* dob = dout + b * gsb + hh * gsh;
        const int nq = (int)min((i64)BQ, tq - q0);
        __syncthreads();
        fa_load_tile<T, D, LD>(sq, qb + q0 * qst, qst, BQ, nq);
        fa_load_tile<T, D, LD>(sdo, dob + q0 * gst, gst, BQ, nq);
        for (int t = threadIdx.x; t < BQ; t += blockDim.x) {
            slse[t] = t < nq ? lse[bh * tq + q0 + t] : -SINTER_INF;
            sdv[t] = t < nq ? dvec[bh * tq + q0 + t] : 0.f;
        }
        __syncthreads();
        // Sᵀ = K_w Qᵀ and dPᵀ = V_w dOᵀ (16 x BQ each)
#pragma unroll
        for (int n = 0; n < BQ / 16; ++n) {
            FaFragC s, dp;
            wmma::fill_fragment(s, 0.f);
            wmma::fill_fragment(dp, 0.f);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                FaFragA<T> a;
                FaFragBc<T> bm;
                wmma::load_matrix_sync(a, sk + warp * FA_WARP * LD + kk * 16, LD);
                wmma::load_matrix_sync(bm, sq + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(s, a, bm, s);
                wmma::load_matrix_sync(a, sv + warp * FA_WARP * LD + kk * 16, LD);
                wmma::load_matrix_sync(bm, sdo + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(dp, a, bm, dp);
            }
            wmma::store_matrix_sync(sw + n * 16, s, LS, wmma::mem_row_major);
            wmma::store_matrix_sync(dw + n * 16, dp, LS, wmma::mem_row_major);
        }
        __syncwarp();
        float p[HALF], ds[HALF];
#pragma unroll
        for (int c = 0; c < HALF; ++c) {
            const int col = half * HALF + c;
            const i64 qi = q0 + col;
            const bool seen = gj < tk && qi < tq && gj < fa_limit(qi, tq, tk, causal);
            const float pv = seen ? __expf(sw[my_r * LS + col] * scale - slse[col]) : 0.f;
            p[c] = pv;
            ds[c] = pv * (dw[my_r * LS + col] - sdv[col]);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < HALF; ++c) {
            pw[my_r * LP + half * HALF + c] = from_f32<T>(p[c]);
            dsw[my_r * LP + half * HALF + c] = from_f32<T>(ds[c]);
        }
        __syncwarp();
        // dV += Pᵀ dO, dK += dSᵀ Q (scaled at the end)
#pragma unroll
        for (int kk = 0; kk < BQ / 16; ++kk) {
            FaFragA<T> ap, ads;
            wmma::load_matrix_sync(ap, pw + kk * 16, LP);
            wmma::load_matrix_sync(ads, dsw + kk * 16, LP);
#pragma unroll
            for (int f = 0; f < D / 16; ++f) {
                FaFragBr<T> bm;
                wmma::load_matrix_sync(bm, sdo + kk * 16 * LD + f * 16, LD);
                wmma::mma_sync(adv[f], ap, bm, adv[f]);
                wmma::load_matrix_sync(bm, sq + kk * 16 * LD + f * 16, LD);
                wmma::mma_sync(adk[f], ads, bm, adk[f]);
            }
        }
        __syncwarp();
    }
    const i64 row0 = j0 + warp * FA_WARP;
    fa_store_rows<T, D, LS>(adk, sw, dk + b * dsb + hk * dsh, dst, row0, tk, scale);
    fa_store_rows<T, D, LS>(adv, sw, dv + b * dsb + hk * dsh, dst, row0, tk, 1.f);
}

// ---------------------------------------------------------------------------------------------
// dQ: 2 warps x 16 queries, key tiles of 32.
template <typename T, int D>
__device__ __forceinline__ void fa_bwd_dq(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                          const float* dvec, T* dq, i64 H, i64 G, i64 tq, i64 tk, i64 qsb, i64 qsh,
                                          i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst,
                                          i64 gsb, i64 gsh, i64 gst, i64 dsb, i64 dsh, i64 dst, float scale,
                                          int causal) {
    constexpr int BQ = 32, BK = 32, LD = D + 8, LS = BK + 4, LP = BK + 8, HALF = BK / 2;
    __shared__ __align__(128) T sq[BQ * LD];
    __shared__ __align__(128) T sdo[BQ * LD];
    __shared__ __align__(128) T sk[BK * LD];
    __shared__ __align__(128) T sv[BK * LD];
    __shared__ __align__(128) float ss[2][FA_WARP * LS];
    __shared__ __align__(128) float sdp[2][FA_WARP * LS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const i64 bh = blockIdx.x, b = bh / H, hh = bh % H;
    const i64 i0 = (i64)blockIdx.y * BQ;
    const int nq = (int)min((i64)BQ, tq - i0);
    fa_load_tile<T, D, LD>(sq, q + b * qsb + hh * qsh + i0 * qst, qst, BQ, nq);
    fa_load_tile<T, D, LD>(sdo, dout + b * gsb + hh * gsh + i0 * gst, gst, BQ, nq);
    const T* kb = k + b * ksb + (hh / G) * ksh;
    const T* vb = v + b * vsb + (hh / G) * vsh;
    FaFragC adq[D / 16];
#pragma unroll
    for (int f = 0; f < D / 16; ++f) wmma::fill_fragment(adq[f], 0.f);
    const int my_r = lane >> 1, half = lane & 1;
    const i64 gi = i0 + warp * FA_WARP + my_r;  // this lane's query row
    const i64 lim = gi < tq ? fa_limit(gi, tq, tk, causal) : 0;
    const float row_lse = gi < tq ? lse[bh * tq + gi] : 0.f;
    const float row_d = gi < tq ? dvec[bh * tq + gi] : 0.f;
    float* sw = ss[warp];
    float* dw = sdp[warp];
    T* dsw = reinterpret_cast<T*>(dw);
    const i64 kend = fa_limit(i0 + nq - 1, tq, tk, causal);
    for (i64 j0 = 0; j0 < kend; j0 += BK) {
        const int nc = (int)min((i64)BK, tk - j0);
        __syncthreads();
        fa_load_tile<T, D, LD>(sk, kb + j0 * kst, kst, BK, nc);
        fa_load_tile<T, D, LD>(sv, vb + j0 * vst, vst, BK, nc);
        __syncthreads();
        // S = Q_w Kᵀ and dP = dO_w Vᵀ (16 x BK each)
#pragma unroll
        for (int n = 0; n < BK / 16; ++n) {
            FaFragC s, dp;
            wmma::fill_fragment(s, 0.f);
            wmma::fill_fragment(dp, 0.f);
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                FaFragA<T> a;
                FaFragBc<T> bm;
                wmma::load_matrix_sync(a, sq + warp * FA_WARP * LD + kk * 16, LD);
                wmma::load_matrix_sync(bm, sk + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(s, a, bm, s);
                wmma::load_matrix_sync(a, sdo + warp * FA_WARP * LD + kk * 16, LD);
                wmma::load_matrix_sync(bm, sv + n * 16 * LD + kk * 16, LD);
                wmma::mma_sync(dp, a, bm, dp);
            }
            wmma::store_matrix_sync(sw + n * 16, s, LS, wmma::mem_row_major);
            wmma::store_matrix_sync(dw + n * 16, dp, LS, wmma::mem_row_major);
        }
        __syncwarp();
        float ds[HALF];
#pragma unroll
        for (int c = 0; c < HALF; ++c) {
            const int col = half * HALF + c;
            const float pv = j0 + col < lim ? __expf(sw[my_r * LS + col] * scale - row_lse) : 0.f;
            ds[c] = pv * (dw[my_r * LS + col] - row_d);
        }
        __syncwarp();
#pragma unroll
        for (int c = 0; c < HALF; ++c) dsw[my_r * LP + half * HALF + c] = from_f32<T>(ds[c]);
        __syncwarp();
        // dQ += dS K (scaled at the end)
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            FaFragA<T> a;
            wmma::load_matrix_sync(a, dsw + kk * 16, LP);
#pragma unroll
            for (int f = 0; f < D / 16; ++f) {
                FaFragBr<T> bm;
                wmma::load_matrix_sync(bm, sk + kk * 16 * LD + f * 16, LD);
                wmma::mma_sync(adq[f], a, bm, adq[f]);
            }
        }
        __syncwarp();
    }
    fa_store_rows<T, D, LS>(adq, sw, dq + b * dsb + hh * dsh, dst, i0 + warp * FA_WARP, tq, scale);
}

#define FA_STRIDES i64 qsb, i64 qsh, i64 qst, i64 ksb, i64 ksh, i64 kst, i64 vsb, i64 vsh, i64 vst
#define FA_STRIDE_ARGS qsb, qsh, qst, ksb, ksh, kst, vsb, vsh, vst
// (x)sb, (x)sh, (x)st: one more view's batch, head and row strides.
#define FA_VIEW(x) i64 x##sb, i64 x##sh, i64 x##st
#define FA_VIEW_ARGS(x) x##sb, x##sh, x##st
#define FA_T_D(sfx, T, D)                                                                              \
    extern "C" __global__ void __launch_bounds__(128) fa_fwd_##sfx##_d##D(                            \
        const T* q, const T* k, const T* v, T* o, float* lse, i64 h, i64 g, i64 tq, i64 tk,           \
        FA_STRIDES, FA_VIEW(o), float scale, int causal) {                                             \
        fa_fwd<T, D>(q, k, v, o, lse, h, g, tq, tk, FA_STRIDE_ARGS, FA_VIEW_ARGS(o), scale, causal);   \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(64) fa_bwd_dkdv_##sfx##_d##D(                        \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dvec, T* dk, \
        T* dv, i64 h, i64 grp, i64 tq, i64 tk, FA_STRIDES, FA_VIEW(g), FA_VIEW(d), float scale,       \
        int causal) {                                                                                  \
        fa_bwd_dkdv<T, D>(q, k, v, dout, lse, dvec, dk, dv, h, grp, tq, tk, FA_STRIDE_ARGS,            \
                          FA_VIEW_ARGS(g),                                                             \
                          FA_VIEW_ARGS(d), scale, causal);                                             \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(64) fa_bwd_dq_##sfx##_d##D(                          \
        const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* dvec, T* dq, \
        i64 h, i64 grp, i64 tq, i64 tk, FA_STRIDES, FA_VIEW(g), FA_VIEW(d), float scale, int causal) { \
        fa_bwd_dq<T, D>(q, k, v, dout, lse, dvec, dq, h, grp, tq, tk, FA_STRIDE_ARGS, FA_VIEW_ARGS(g),  \
                        FA_VIEW_ARGS(d), scale, causal);                                               \
    }
#define FA_T(sfx, T)                                                                                  \
    extern "C" __global__ void fa_bwd_dot_##sfx(const T* o, const T* dout, float* dvec, i64 rows,     \
                                                i64 d, i64 h, i64 tq, FA_VIEW(o), FA_VIEW(g)) {       \
        fa_bwd_dot<T>(o, dout, dvec, rows, d, h, tq, FA_VIEW_ARGS(o), FA_VIEW_ARGS(g));               \
    }                                                                                                 \
    FA_T_D(sfx, T, 32)                                                                                \
    FA_T_D(sfx, T, 64)                                                                                \
    FA_T_D(sfx, T, 128)
FA_T(f16, __half)
FA_T(bf16, bf16)
