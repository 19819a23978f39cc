"""PyTorch's side of sinter's `benches/attention.rs` (sinter-core): causal
scaled_dot_product_attention from a packed qkv projection [b, t, 3·h·d], forward alone and
forward + backward, median µs per call over `--secs` seconds each.

    chrt -f 1 python3 bench/vs-torch/attention_torch.py --shape 12x4x64x32 --threads 2

Run it beside `chrt -f 1 cargo bench -p sinter-core --bench attention` (same shape and
threads, ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 to cap
it as `SINTER_CPU_ISA=avx2` caps sinter), alternating the two.
"""
import argparse
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="12x4x64x32", help="batch x heads x tokens x head dim")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--secs", type=float, default=2.0)
    a = ap.parse_args()
    b, h, t, d = (int(v) for v in a.shape.split("x"))
    torch.set_num_threads(a.threads)
    qkv = torch.randn(b, t, 3 * h * d, requires_grad=True)

    def call(backward):
        q, k, v = (x.view(b, t, h, d).transpose(1, 2) for x in qkv.split(h * d, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h * d)
        if backward:
            y.sum().backward()
            qkv.grad = None

    for backward, name in [(False, "forward"), (True, "forward + backward")]:
        ctx = torch.enable_grad() if backward else torch.no_grad()
        with ctx:
            for _ in range(20):
                call(backward)
            times, start = [], time.perf_counter()
            while time.perf_counter() - start < a.secs:
                t0 = time.perf_counter()
                call(backward)
                times.append(time.perf_counter() - t0)
        times.sort()
        print(f"| {a.shape} | {name} | {times[len(times) // 2] * 1e6:.1f} | {times[0] * 1e6:.1f} | {len(times)} |")


if __name__ == "__main__":
    main()
