#!/usr/bin/env python3
"""How far llama.cpp-style activation rounding alone moves a model's logits.

llama_ref.py's float64 model of FILE.gguf (weights dequantized), run as is and with every
Linear's input, and the output head's, rounded per block of 32 values to int8 as llama.cpp
(and sinter's GGML dot kernels) quantize activations: d = max|x|/127 stored as f16,
q = round(x/d). Prints, per prompt, the per-position relative error (largest |difference|
over the largest |logit|: worst and median), over all positions, and the share of positions
whose argmax agrees. The bounds of sinter's kept-quantized tests come from these numbers.

  python3 bench/llm/activation_rounding.py FILE.gguf PROMPTS.json [N_PROMPTS]
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref as L  # noqa: E402


def q8(x):
    b = x.reshape(-1, 32)
    d = (np.abs(b).max(axis=1, keepdims=True) / 127.0).astype(np.float16).astype(np.float64)
    safe = np.where(d == 0, 1, d)
    return (np.round(b / safe) * d).reshape(x.shape)


class RoundedHead:
    """`x @ head.T` with x rounded first (the tied head is a Linear too)."""

    class _T:
        __array_ufunc__ = None  # numpy defers `x @ self` to __rmatmul__

        def __init__(self, m):
            self.m = m

        def __rmatmul__(self, x):
            return q8(x) @ self.m

    def __init__(self, w):
        self.T = RoundedHead._T(w.T)


def main():
    path, prompts_file = sys.argv[1], sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else None
    config, weights = L.load_model(path)
    prompts = L.read_prompts(prompts_file)[:n]
    caches = lambda: [L.KVCache(config) for _ in prompts]  # noqa: E731
    base = L.LlamaReference(config, weights).forward(prompts, caches(), True)
    rounded = L.LlamaReference(config, weights)
    plain = L.LlamaReference.linear
    L.LlamaReference.linear = lambda self, x, name: plain(self, q8(x), name)
    rounded.lm_head = RoundedHead(rounded.lm_head)
    quant = rounded.forward(prompts, caches(), True)
    for i, (a, b) in enumerate(zip(base, quant)):
        rel = [np.abs(x - y).max() / np.abs(x).max() for x, y in zip(a, b)]
        same = np.mean(a.argmax(-1) == b.argmax(-1))
        print(f"prompt {i} ({len(prompts[i])} tokens): per position worst {max(rel):.3e}, "
              f"median {np.median(rel):.3e}; over all {np.abs(a - b).max() / np.abs(a).max():.3e}; "
              f"same argmax at {100 * same:.1f}%")


if __name__ == "__main__":
    main()
