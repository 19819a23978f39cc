#!/usr/bin/env python3
"""torch.matmul TFLOP/s for the sizes and dtypes of `sinter bench gpu gemm` / `tc`.

Prints a markdown table and, with --json FILE, writes the numbers with the same keys as the
"gemm" and "tc" sections of sinter's JSON (bf16_4096, bf16_8192; fp32, tf32, bf16, fp16 at
8192^3), so that bench/gpu/sinter_gpu_bench.sh can print the ratio sinter / torch.

Timing: CUDA events around `iters` back-to-back products after warm-up, operands uniform in
[-1, 1), output allocated by torch (as sinter allocates its own). Needs only torch and a GPU.
"""

import argparse
import json
import sys


def tflops(torch, n, dtype, tf32, warmup=5, min_ms=1000.0):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    g = torch.Generator(device="cuda").manual_seed(0)
    a = (torch.rand((n, n), device="cuda", generator=g) * 2 - 1).to(dtype)
    b = (torch.rand((n, n), device="cuda", generator=g) * 2 - 1).to(dtype)
    for _ in range(warmup):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.matmul(a, b)
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    iters = max(3, min(1000, int(min_ms / one)))
    start.record()
    for _ in range(iters):
        torch.matmul(a, b)
    end.record()
    torch.cuda.synchronize()
    s = start.elapsed_time(end) / 1e3 / iters
    torch.backends.cuda.matmul.allow_tf32 = False
    return 2.0 * n**3 / s / 1e12


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write the numbers here")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("torch_gemm.py: PyTorch is not installed")
    if not torch.cuda.is_available():
        sys.exit("torch_gemm.py: no CUDA device visible to PyTorch")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    rows = []
    for n in (4096, 8192):
        t = tflops(torch, n, torch.bfloat16, False)
        out[f"bf16_{n}"] = t
        rows.append((f"bf16 {n}^3", t))
    for key, dtype, tf32 in (("fp32", torch.float32, False), ("tf32", torch.float32, True),
                             ("bf16", torch.bfloat16, False), ("fp16", torch.float16, False)):
        t = tflops(torch, 8192, dtype, tf32)
        out[f"{key}_8192"] = t
        rows.append((f"{key} 8192^3", t))
    print(f"## torch.matmul on {out['device']} (torch {out['torch']})\n")
    print("| GEMM | TFLOP/s |\n|---|---:|")
    for name, t in rows:
        print(f"| {name} | {t:.1f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
