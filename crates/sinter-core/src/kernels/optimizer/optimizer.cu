// optimizer.cu — the optimizer folder's device kernels: fused AdamW and SGD over flat fp32 buffers,
// the step control block's two kernels, and the global gradient norm in one pass. Launched by
// plans.rs (the updates and the step control block) and cuda.rs (the gradient norm).
//
// adamw_f32(float* p, const float* g, float* m, float* v, i64 n, AdamArgs a)
// adamw_copy_bf16(float* p, const float* g, float* m, float* v, bf16* copy, i64 n, AdamArgs a)
// adamw_copy_f16(float* p, const float* g, float* m, float* v, __half* copy, i64 n, AdamArgs a)
//     PyTorch's AdamW (torch.optim.AdamW, decoupled weight decay), its arithmetic included:
//     g' = g * grad_scale (unscale and/or clip in the same pass); p = p * (1 - lr wd);
//     m = m + (1 - b1) (g' - m) (lerp); v = b2 v + (1 - b2) g'^2;
//     p = p - step_size * m / (sqrt(v) / sqrt(bc2) + eps), step_size = lr / bc1,
//     bc1 = 1 - b1^t, bc2 = 1 - b2^t. The hyper-parameters arrive as f64 and the scalar factors
//     (1 - b1, 1 - b2, 1 - lr wd, step_size, sqrt(bc2)) are computed in f64 and rounded to f32
//     once, as PyTorch computes them from Python floats: 1 - b2 in f32 is 1.3e-5 off (issue 14).
//     the *_copy_* variants also write the updated p in bf16/f16 for the compute copy of the model.
//     If a.found_inf is non-null and *found_inf != 0 the step is skipped on the device (dynamic
//     loss scaling without a host round trip). If a.ctl is non-null it points at the step control
//     block (below): lr = ctl[LR], t = ctl[STEPS] + 1 (bias corrections computed here, so a skipped
//     step does not advance them), and the gradient is also multiplied by ctl[GRAD_FACTOR].
// adamw_multi_f32(AdamArgs a, i64 count, <ADAMW_SLOTS slots: float* p, const float* g, float* m,
//                 float* v, i64 n, u64 wd, u64 lr, float lr_scale>)
//     The same update for up to ADAMW_SLOTS parameters in one launch (PyTorch's multi_tensor_apply
//     shape: the tensors travel in the kernel's parameters, so nothing is uploaded and a captured
//     CUDA graph replays it as is). Slot i has its own weight decay and learning rate (f64 bits,
//     replacing a.weight_decay and a.lr) and, with a control block, its learning rate is
//     ctl[LR] * lr_scale in f32 (a parameter group's factor). The first `count` slots are used;
//     blocks walk fixed chunks of all of them, so each element gets exactly adamw_f32's arithmetic.
// sgd_f32(float* p, const float* g, float* buf, i64 n, SgdArgs a)
//     PyTorch SGD: g' = g*grad_scale + wd p; buf = first ? g' : momentum buf + (1 - dampening) g';
//     step = nesterov ? g' + momentum buf : buf; p -= lr step. buf may be null when momentum == 0.
//     found_inf / ctl as for AdamW (lr and the gradient factor come from ctl).
// step_prepare(float* ctl, const float* sumsq, float max_norm, int dynamic)
//     After backward, from the squared global norm of the (loss-scaled) gradients: found_inf
//     (dynamic scaling only), the unscaled norm, and the gradient factor
//     min(1, max_norm / (norm + 1e-6)) / scale that the optimizer kernels fold into their pass.
// step_finish(float* ctl, const float* lr_table, i64 n_lr, float growth, float backoff,
//             float interval, int dynamic)
//     After the optimizer: skipped step (found_inf) → scale *= backoff, good = 0, skipped += 1;
//     else steps += 1 and, after `interval` good steps, scale *= growth. Then iter += 1 and
//     lr = lr_table[min(iter, n_lr - 1)] (the schedule lives on the device, so a replayed CUDA
//     graph sees the right learning rate). One thread.
//
// Why it is fast: each optimizer reads p, g, m, v and writes p, m, v (+ the copy) exactly once, with
// 128-bit accesses when aligned — the minimum traffic for the update — instead of the ~10 passes of
// an unfused implementation.
//
// sumsq_multi_<t>(float* partial, i64 count, <SUMSQ_SLOTS slots: const T* x, i64 n>)
//     Σ x² of up to SUMSQ_SLOTS tensors in one launch (PyTorch's multi_tensor_apply shape: the
//     tensors travel in the kernel's parameters, nothing is uploaded, a captured CUDA graph
//     replays it as is). Slot s owns sumsq_blocks(n_s) consecutive blocks (a function of n_s
//     only, the same on every GPU); block b of slot s writes partial[b] = Σ x² over its
//     grid-stride share of that slot (stride = the slot's blocks × blockDim, f32 accumulation).
//     Each partial is what a launch over that tensor alone would give, so the grouping of
//     tensors into launches never changes a result. The first `count` slots are used.
// sumsq_finish(const float* partial, i64 count, float* out, int accumulate)
//     out[0] (+)= Σ partial, one block, fixed order. A non-finite result doubles as the "found
//     inf" flag; sqrt on the host (or in step_prepare).
//
// Why it is fast: every gradient is read once, with 128-bit loads where aligned, in one launch for
// a whole model (GPT-2's 148 tensors) plus the finish, instead of one launch per tensor. It is
// deterministic: fixed grids chosen from the sizes, fixed-order trees, no atomics.

// Must match AdamArgs / SgdArgs in plans.rs.
struct AdamArgs {
    double lr, beta1, beta2, eps, weight_decay;
    double step;  // 1-based (the step control block's count replaces it)
    float grad_scale;
    int pad_;
    const float* found_inf;
    const float* ctl;
};
struct SgdArgs {
    float lr, momentum, dampening, weight_decay, grad_scale;
    int nesterov, first_step, pad_;
    const float* found_inf;
    const float* ctl;
};

// The step control block (f32 slots); must match `ctl` in step_ctl.rs.
#define CTL_FOUND_INF 0
#define CTL_LR 1
#define CTL_STEPS 2
#define CTL_GRAD_FACTOR 3
#define CTL_SCALE 4
#define CTL_GOOD_STEPS 5
#define CTL_ITER 6
#define CTL_SKIPPED 7
#define CTL_GRAD_NORM 8

// The f32 factors of one step, computed once per thread in f64 (see the header).
struct AdamFactors {
    float decay, one_minus_beta1, beta2, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
};
__device__ __forceinline__ AdamFactors adam_factors(const AdamArgs& a) {
    double lr = a.lr, t = a.step;
    float grad_scale = a.grad_scale;
    if (a.ctl) {
        lr = a.ctl[CTL_LR];
        t = (double)a.ctl[CTL_STEPS] + 1.0;
        grad_scale *= a.ctl[CTL_GRAD_FACTOR];
    }
    AdamFactors f;
    f.decay = (float)(1.0 - lr * a.weight_decay);
    f.one_minus_beta1 = (float)(1.0 - a.beta1);
    f.beta2 = (float)a.beta2;
    f.one_minus_beta2 = (float)(1.0 - a.beta2);
    f.step_size = (float)(lr / (1.0 - pow(a.beta1, t)));
    f.bc2_sqrt = (float)sqrt(1.0 - pow(a.beta2, t));
    f.eps = (float)a.eps;
    f.grad_scale = grad_scale;
    return f;
}

// One element, with explicit fmas so that every compiler rounds alike (the CPU's order).
__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, const AdamFactors& f) {
    g *= f.grad_scale;
    p *= f.decay;
    m = fmaf(f.one_minus_beta1, g - m, m);
    v = fmaf(f.one_minus_beta2, g * g, v * f.beta2);
    const float denom = sqrtf(v) / f.bc2_sqrt + f.eps;
    p = fmaf(-f.step_size, m / denom, p);
}

template <typename TC, bool COPY>
__device__ __forceinline__ void adamw_impl(float* p, const float* g, float* m, float* v, TC* copy, i64 n,
                                           const AdamArgs& a0) {
    if (a0.found_inf && *a0.found_inf != 0.f) return;
    const AdamFactors a = adam_factors(a0);
    const i64 tid = global_tid(), stride = global_stride();
    i64 i0 = 0;
    const bool vec = aligned16(p) && aligned16(g) && aligned16(m) && aligned16(v) &&
                     (!COPY || (reinterpret_cast<u64>(copy) & 7ull) == 0);
    if (vec) {
        const i64 nv = n / 4;
        for (i64 q = tid; q < nv; q += stride) {
            float4 pp = reinterpret_cast<float4*>(p)[q];
            const float4 gg = reinterpret_cast<const float4*>(g)[q];
            float4 mm = reinterpret_cast<float4*>(m)[q];
            float4 vv = reinterpret_cast<float4*>(v)[q];
            adam_one(pp.x, gg.x, mm.x, vv.x, a);
            adam_one(pp.y, gg.y, mm.y, vv.y, a);
            adam_one(pp.z, gg.z, mm.z, vv.z, a);
            adam_one(pp.w, gg.w, mm.w, vv.w, a);
            reinterpret_cast<float4*>(p)[q] = pp;
            reinterpret_cast<float4*>(m)[q] = mm;
            reinterpret_cast<float4*>(v)[q] = vv;
            if (COPY) {
                TC* c = copy + q * 4;
                c[0] = from_f32<TC>(pp.x);
                c[1] = from_f32<TC>(pp.y);
                c[2] = from_f32<TC>(pp.z);
                c[3] = from_f32<TC>(pp.w);
            }
        }
        i0 = nv * 4;
    }
    for (i64 i = i0 + tid; i < n; i += stride) {
        float pp = p[i], mm = m[i], vv = v[i];
        adam_one(pp, g[i], mm, vv, a);
        p[i] = pp;
        m[i] = mm;
        v[i] = vv;
        if (COPY) copy[i] = from_f32<TC>(pp);
    }
}

extern "C" __global__ void adamw_f32(float* p, const float* g, float* m, float* v, i64 n, AdamArgs a) {
    adamw_impl<float, false>(p, g, m, v, (float*)nullptr, n, a);
}
extern "C" __global__ void adamw_copy_bf16(float* p, const float* g, float* m, float* v, bf16* copy, i64 n,
                                           AdamArgs a) {
    adamw_impl<bf16, true>(p, g, m, v, copy, n, a);
}
extern "C" __global__ void adamw_copy_f16(float* p, const float* g, float* m, float* v, __half* copy, i64 n,
                                          AdamArgs a) {
    adamw_impl<__half, true>(p, g, m, v, copy, n, a);
}

// ---- multi-tensor AdamW ----
#define ADAMW_SLOTS 32
#define ADAMW_CHUNK 4096  // elements per block task (a multiple of 4: chunks stay 16-byte aligned)

struct AdamSlot {
    float* p;
    const float* g;
    float* m;
    float* v;
    i64 n;
    double wd, lr;
    float lr_scale;
};

__device__ __forceinline__ double f64_from_bits(u64 b) {
    union { u64 u; double d; } x;
    x.u = b;
    return x.d;
}

// One chunk [c0, c1) of one slot, with the factors of that slot.
__device__ __forceinline__ void adamw_chunk(const AdamSlot& s, i64 c0, i64 c1, const AdamFactors& a) {
    const bool vec = aligned16(s.p) && aligned16(s.g) && aligned16(s.m) && aligned16(s.v);
    i64 i0 = c0;
    if (vec) {
        const i64 q0 = c0 / 4, q1 = c1 / 4;
        for (i64 q = q0 + threadIdx.x; q < q1; q += blockDim.x) {
            float4 pp = reinterpret_cast<float4*>(s.p)[q];
            const float4 gg = reinterpret_cast<const float4*>(s.g)[q];
            float4 mm = reinterpret_cast<float4*>(s.m)[q];
            float4 vv = reinterpret_cast<float4*>(s.v)[q];
            adam_one(pp.x, gg.x, mm.x, vv.x, a);
            adam_one(pp.y, gg.y, mm.y, vv.y, a);
            adam_one(pp.z, gg.z, mm.z, vv.z, a);
            adam_one(pp.w, gg.w, mm.w, vv.w, a);
            reinterpret_cast<float4*>(s.p)[q] = pp;
            reinterpret_cast<float4*>(s.m)[q] = mm;
            reinterpret_cast<float4*>(s.v)[q] = vv;
        }
        i0 = q1 * 4;
    }
    for (i64 i = i0 + threadIdx.x; i < c1; i += blockDim.x) {
        float pp = s.p[i], mm = s.m[i], vv = s.v[i];
        adam_one(pp, s.g[i], mm, vv, a);
        s.p[i] = pp;
        s.m[i] = mm;
        s.v[i] = vv;
    }
}

__device__ void adamw_multi_impl(const AdamArgs& a0, i64 count, const AdamSlot* slots) {
    if (a0.found_inf && *a0.found_inf != 0.f) return;
    i64 slot = 0, first = 0;  // the slot of the current chunk and its first chunk number
    i64 have = -1;            // the slot whose factors `f` hold
    AdamFactors f;
    for (i64 c = blockIdx.x;; c += gridDim.x) {
        while (slot < count && c >= first + (slots[slot].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK) {
            first += (slots[slot].n + ADAMW_CHUNK - 1) / ADAMW_CHUNK;
            ++slot;
        }
        if (slot >= count) return;  // uniform in the block: every thread sees the same c
        const AdamSlot& s = slots[slot];
        if (have != slot) {
            AdamArgs a = a0;
            a.lr = s.lr;
            a.weight_decay = s.wd;
            AdamFactors g = adam_factors(a);
            if (a0.ctl) {
                // A group's rate: the block's rate times its factor, rounded in f32.
                const double lr = (double)(a0.ctl[CTL_LR] * s.lr_scale);
                g.decay = (float)(1.0 - lr * s.wd);
                g.step_size = (float)(lr / (1.0 - pow(a0.beta1, (double)a0.ctl[CTL_STEPS] + 1.0)));
            }
            f = g;
            have = slot;
        }
        const i64 c0 = (c - first) * ADAMW_CHUNK;
        const i64 c1 = c0 + ADAMW_CHUNK < s.n ? c0 + ADAMW_CHUNK : s.n;
        adamw_chunk(s, c0, c1, f);
    }
}

#define ADAMW_SLOT_PARAMS(b, k) \
    float *p##b##k, const float *g##b##k, float *m##b##k, float *v##b##k, i64 n##b##k, u64 wd##b##k, u64 lr##b##k, \
        float ls##b##k
#define ADAMW_SLOT_STORE(b, k)                                                                                  \
    slots[b * 8 + k] = AdamSlot{p##b##k, g##b##k, m##b##k, v##b##k, n##b##k, f64_from_bits(wd##b##k),             \
                                f64_from_bits(lr##b##k), ls##b##k}
#define ADAMW_8(M, b) M(b, 0), M(b, 1), M(b, 2), M(b, 3), M(b, 4), M(b, 5), M(b, 6), M(b, 7)
#define ADAMW_8S(M, b) M(b, 0); M(b, 1); M(b, 2); M(b, 3); M(b, 4); M(b, 5); M(b, 6); M(b, 7)

// The slots go to shared memory once per block (one thread's 32 stores), so the chunk walk can
// index them; kernel parameters cannot be indexed at run time without a copy per thread.
extern "C" __global__ void adamw_multi_f32(AdamArgs a, i64 count, ADAMW_8(ADAMW_SLOT_PARAMS, 0),
                                           ADAMW_8(ADAMW_SLOT_PARAMS, 1), ADAMW_8(ADAMW_SLOT_PARAMS, 2),
                                           ADAMW_8(ADAMW_SLOT_PARAMS, 3)) {
    __shared__ AdamSlot slots[ADAMW_SLOTS];
    if (threadIdx.x == 0) {
        ADAMW_8S(ADAMW_SLOT_STORE, 0);
        ADAMW_8S(ADAMW_SLOT_STORE, 1);
        ADAMW_8S(ADAMW_SLOT_STORE, 2);
        ADAMW_8S(ADAMW_SLOT_STORE, 3);
    }
    __syncthreads();
    adamw_multi_impl(a, count < ADAMW_SLOTS ? count : ADAMW_SLOTS, slots);
}

extern "C" __global__ void sgd_f32(float* p, const float* g, float* buf, i64 n, SgdArgs a) {
    if (a.found_inf && *a.found_inf != 0.f) return;
    if (a.ctl) {
        a.lr = a.ctl[CTL_LR];
        a.grad_scale *= a.ctl[CTL_GRAD_FACTOR];
    }
    for (i64 i = global_tid(); i < n; i += global_stride()) {
        const float pv = p[i];
        float d = g[i] * a.grad_scale + a.weight_decay * pv;
        if (a.momentum != 0.f && buf) {
            const float b = a.first_step ? d : a.momentum * buf[i] + (1.f - a.dampening) * d;
            buf[i] = b;
            d = a.nesterov ? d + a.momentum * b : b;
        }
        p[i] = pv - a.lr * d;
    }
}

extern "C" __global__ void step_prepare(float* ctl, const float* sumsq, float max_norm, int dynamic) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const float s = sumsq[0];
    const float scale = ctl[CTL_SCALE];
    const bool bad = !isfinite(s);
    ctl[CTL_FOUND_INF] = (dynamic && bad) ? 1.f : 0.f;
    const float norm = sqrtf(s) / scale;
    ctl[CTL_GRAD_NORM] = norm;
    float clip = 1.f;
    if (!bad && max_norm > 0.f && norm > max_norm) clip = max_norm / (norm + 1e-6f);
    ctl[CTL_GRAD_FACTOR] = clip / scale;
}

extern "C" __global__ void step_finish(float* ctl, const float* lr_table, i64 n_lr, float growth, float backoff,
                                       float interval, int dynamic) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    if (dynamic && ctl[CTL_FOUND_INF] != 0.f) {
        ctl[CTL_SCALE] = fmaxf(ctl[CTL_SCALE] * backoff, 1.17549435e-38f);  // never zero (FLT_MIN)
        ctl[CTL_GOOD_STEPS] = 0.f;
        ctl[CTL_SKIPPED] += 1.f;
    } else {
        ctl[CTL_STEPS] += 1.f;
        if (dynamic) {
            const float good = ctl[CTL_GOOD_STEPS] + 1.f;
            if (good >= interval) {
                const float grown = ctl[CTL_SCALE] * growth;
                if (grown < 3.40282347e38f) ctl[CTL_SCALE] = grown;  // stays finite (FLT_MAX)
                ctl[CTL_GOOD_STEPS] = 0.f;
            } else {
                ctl[CTL_GOOD_STEPS] = good;
            }
        }
    }
    ctl[CTL_FOUND_INF] = 0.f;
    const float it = ctl[CTL_ITER] + 1.f;
    ctl[CTL_ITER] = it;
    i64 k = (i64)it;
    if (k > n_lr - 1) k = n_lr - 1;
    if (n_lr > 0) ctl[CTL_LR] = lr_table[k];
}

// ---- the global gradient norm ----
#define SUMSQ_SLOTS 192
// Elements per block of a slot: sumsq_blocks(n) = clamp(ceil(n / (blockDim.x * SUMSQ_PER_THREAD)), 1, 1024).
#define SUMSQ_PER_THREAD 16
#define SUMSQ_MAX_BLOCKS 1024

__device__ __forceinline__ i64 sumsq_blocks(i64 n) {
    const i64 span = (i64)blockDim.x * SUMSQ_PER_THREAD;
    const i64 b = (n + span - 1) / span;
    return b < 1 ? 1 : (b > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : b);
}

template <typename T>
__device__ __forceinline__ void sumsq_multi_impl(float* partial, i64 count, const T* const* xs, const i64* ns) {
    __shared__ float scratch[32];
    // The slot of this block (every thread walks the same table, so the branch is uniform).
    i64 slot = 0, first = 0;
    while (slot < count && (i64)blockIdx.x >= first + sumsq_blocks(ns[slot])) {
        first += sumsq_blocks(ns[slot]);
        ++slot;
    }
    if (slot >= count) return;
    const T* x = xs[slot];
    const i64 n = ns[slot];
    constexpr int N = Pack128<T>::N;
    const i64 tid = (blockIdx.x - first) * blockDim.x + threadIdx.x;
    const i64 stride = sumsq_blocks(n) * blockDim.x;
    float acc = 0.f;
    i64 i0 = 0;
    if (aligned16(x)) {
        const i64 nv = n / N;
        for (i64 q = tid; q < nv; q += stride) {
            const Pack128<T> pk = load128(x + q * N);
#pragma unroll
            for (int k = 0; k < N; ++k) { const float f = to_f32(pk.v[k]); acc += f * f; }
        }
        i0 = nv * N;
    }
    for (i64 i = i0 + tid; i < n; i += stride) { const float f = to_f32(x[i]); acc += f * f; }
    acc = row_sum(acc, scratch);  // 1-D block: one row group = the block
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// 192 slots as kernel parameters: 3 × 64, each 8 × 8 (x, n) pairs.
#define SQ_PARAM(T, b, k) const T *x##b##k, i64 n##b##k
#define SQ_STORE(T, b, k) xs[at] = x##b##k, ns[at] = n##b##k, ++at
#define SQ_8(M, T, b) M(T, b, 0), M(T, b, 1), M(T, b, 2), M(T, b, 3), M(T, b, 4), M(T, b, 5), M(T, b, 6), M(T, b, 7)
#define SQ_64(M, T, a) \
    SQ_8(M, T, a##0), SQ_8(M, T, a##1), SQ_8(M, T, a##2), SQ_8(M, T, a##3), SQ_8(M, T, a##4), SQ_8(M, T, a##5), \
        SQ_8(M, T, a##6), SQ_8(M, T, a##7)
#define SQ_ALL(M, T) SQ_64(M, T, 1), SQ_64(M, T, 2), SQ_64(M, T, 3)

// The slots go to shared memory once per block (thread 0 stores them in parameter order), so the
// walk can index them; kernel parameters cannot be indexed at run time without a copy per thread.
#define SUMSQ_MULTI(T, sfx)                                                                 \
    extern "C" __global__ void sumsq_multi_##sfx(float* partial, i64 count, SQ_ALL(SQ_PARAM, T)) { \
        __shared__ const T* xs[SUMSQ_SLOTS];                                                \
        __shared__ i64 ns[SUMSQ_SLOTS];                                                     \
        if (threadIdx.x == 0) {                                                             \
            int at = 0;                                                                     \
            SQ_ALL(SQ_STORE, T);                                                            \
        }                                                                                   \
        __syncthreads();                                                                    \
        sumsq_multi_impl<T>(partial, count < SUMSQ_SLOTS ? count : SUMSQ_SLOTS, xs, ns);    \
    }
SUMSQ_MULTI(float, f32)
SUMSQ_MULTI(__half, f16)
SUMSQ_MULTI(bf16, bf16)

extern "C" __global__ void sumsq_finish(const float* partial, i64 count, float* out, int accumulate) {
    __shared__ float scratch[32];
    float acc = 0.f;
    for (i64 i = threadIdx.x; i < count; i += blockDim.x) acc += partial[i];
    acc = row_sum(acc, scratch);
    if (threadIdx.x == 0) out[0] = accumulate ? out[0] + acc : acc;
}
