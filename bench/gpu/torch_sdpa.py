#!/usr/bin/env python3
"""PyTorch's attention throughput: ``scaled_dot_product_attention`` forward + backward.

Causal, bf16, q/k/v of shape [batch, heads, T, head_dim] with batch·T = --tokens (16384 by
default) and heads·head_dim = --width (2048), as in FlashAttention's benchmarks; for each T in
--seqs (1024, 4096) and head_dim in --head-dims (64, 128). Times forward, backward and both
(median of --reps CUDA-event-timed repetitions after warm-up) and prints one JSON line each:

  {"bench": "torch_sdpa", "seq": 1024, "head_dim": 64, "batch": 16, "heads": 32, "causal": true,
   "fwd_ms": ..., "bwd_ms": ..., "fwd_bwd_ms": ..., "fwd_tflops": ..., "bwd_tflops": ...,
   "fwd_bwd_tflops": ..., "backend": "default", "torch": "2.11.0", "gpu": "NVIDIA H200"}

FLOPs: forward 4·B·H·T²·D (QKᵀ and PV), halved when causal; backward 2.5 × forward
(five matmuls instead of two), as FlashAttention counts.

--backend picks the kernel (flash, efficient, cudnn, math) through torch.nn.attention.sdpa_kernel;
default: PyTorch's choice. Needs only torch and a CUDA GPU.
"""

import argparse
import json
import statistics
import sys


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seqs", default="1024,4096", help="comma-separated sequence lengths")
    p.add_argument("--head-dims", default="64,128", help="comma-separated head dims")
    p.add_argument("--tokens", type=int, default=16384, help="batch × sequence")
    p.add_argument("--width", type=int, default=2048, help="heads × head_dim")
    p.add_argument("--no-causal", action="store_true", help="full (non-causal) attention")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--backend", choices=["default", "flash", "efficient", "cudnn", "math"], default="default")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda")
    return p.parse_args()


def main():
    a = parse_args()
    import contextlib

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available() and a.device.startswith("cuda"):
        sys.exit("torch_sdpa: CUDA is not available")
    dev = torch.device(a.device)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    causal = not a.no_causal
    if a.backend == "default":
        kernel = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[a.backend]

        def kernel():
            return sdpa_kernel(b)

    def timed(fn):
        """Median milliseconds of fn over a.reps runs (CUDA events), after warm-up."""
        for _ in range(a.warmup):
            fn()
        times = []
        for _ in range(a.reps):
            if dev.type == "cuda":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            else:
                import time

                t0 = time.perf_counter()
                fn()
                times.append(1000 * (time.perf_counter() - t0))
        return statistics.median(times)

    for t in [int(s) for s in a.seqs.split(",")]:
        for d in [int(s) for s in a.head_dims.split(",")]:
            batch, heads = max(1, a.tokens // t), max(1, a.width // d)
            torch.manual_seed(0)
            q, k, v = (torch.randn(batch, heads, t, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
            dout = torch.randn(batch, heads, t, d, device=dev, dtype=dtype)
            with kernel():
                fwd_ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                def bwd():
                    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

                bwd_ms = timed(bwd)

                def both():
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch.autograd.grad(o, (q, k, v), dout)

                both_ms = timed(both)
            fwd_flops = 4 * batch * heads * t * t * d / (2 if causal else 1)
            bwd_flops = 2.5 * fwd_flops
            tf = lambda flops, ms: round(flops / (ms * 1e-3) / 1e12, 2)  # noqa: E731
            print(json.dumps({
                "bench": "torch_sdpa", "seq": t, "head_dim": d, "batch": batch, "heads": heads, "causal": causal, "dtype": a.dtype,
                "fwd_ms": round(fwd_ms, 4), "bwd_ms": round(bwd_ms, 4), "fwd_bwd_ms": round(both_ms, 4),
                "fwd_tflops": tf(fwd_flops, fwd_ms), "bwd_tflops": tf(bwd_flops, bwd_ms), "fwd_bwd_tflops": tf(fwd_flops + bwd_flops, both_ms),
                "backend": a.backend, "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            }), flush=True)
            del q, k, v, dout, out


if __name__ == "__main__":
    main()
