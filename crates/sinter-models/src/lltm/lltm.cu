// lltm.cu — the LLTM cell's pointwise part as two CUDA kernels (a custom op's forward, and the
// custom op its backward calls). One thread per (batch row, state unit), grid-stride; each thread
// reads its three gate pre-activations and writes everything that unit needs, so the forward is
// one read of the gates and the old cell and one write of h, c and the three activations — the
// composite's ten elementwise passes over memory become one (why it is fast).
//
// gates [batch, 3·state] = (input, output, candidate) pre-activations; act [batch, 3·state] =
// (sigmoid(input), sigmoid(output), elu(candidate)), saved for the backward.

__device__ __forceinline__ float lltm_sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

extern "C" __global__ void lltm_cell_forward(const float* gates, const float* old_cell,
                                             float* new_h, float* new_cell, float* act,
                                             int batch, int state) {
    const i64 n = (i64)batch * state;
    for (i64 k = global_tid(); k < n; k += global_stride()) {
        const i64 b = k / state, j = k - b * state;
        const float* g = gates + b * 3 * state;
        const float i = lltm_sigmoid(g[j]);
        const float o = lltm_sigmoid(g[state + j]);
        const float z = g[2 * state + j];
        const float c = z > 0.0f ? z : expm1f(z);  // ELU, alpha = 1 (NaN stays NaN)
        const float nc = old_cell[k] + c * i;
        new_cell[k] = nc;
        new_h[k] = tanhf(nc) * o;
        float* a = act + b * 3 * state;
        a[j] = i;
        a[state + j] = o;
        a[2 * state + j] = c;
    }
}

// From the gradients of h and c, the saved activations and the new cell: the gradient of the
// gate pre-activations and of the old cell.
extern "C" __global__ void lltm_cell_backward(const float* grad_h, const float* grad_cell,
                                              const float* new_cell, const float* act,
                                              float* d_gates, float* d_old_cell,
                                              int batch, int state) {
    const i64 n = (i64)batch * state;
    for (i64 k = global_tid(); k < n; k += global_stride()) {
        const i64 b = k / state, j = k - b * state;
        const float* a = act + b * 3 * state;
        const float i = a[j], o = a[state + j], c = a[2 * state + j];
        const float t = tanhf(new_cell[k]);
        const float gh = grad_h[k];
        const float d_nc = (1.0f - t * t) * o * gh + grad_cell[k];
        float* d = d_gates + b * 3 * state;
        d[j] = c * d_nc * i * (1.0f - i);
        d[state + j] = t * gh * o * (1.0f - o);
        d[2 * state + j] = i * d_nc * (c > 0.0f ? 1.0f : c + 1.0f);
        d_old_cell[k] = d_nc;
    }
}
