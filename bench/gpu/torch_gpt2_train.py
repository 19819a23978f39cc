#!/usr/bin/env python3
"""PyTorch's GPT-2 (124M) training throughput: the baseline for sinter's GPU training bench.

GPT-2 small (12 layers, 12 heads, 768 wide, vocabulary 50257, tied head) as nanoGPT / llm.c
train it, on random tokens (no data set, no downloads), sequence 1024, the given batch size;
bf16 autocast, fused AdamW (lr 6e-4, weight decay 0.1 on matrices), gradient clipping at 1.0.
Modes: ``eager`` and ``compile`` (``torch.compile`` of the model). Attention is
``scaled_dot_product_attention`` (flash / cuDNN kernels) unless ``--attention manual``.

After ``--warmup`` steps, times ``--steps`` steps (CUDA-synchronised) and prints one JSON line:

  {"bench": "torch_gpt2_train", "mode": "compile", "batch_size": 16, "seq": 1024,
   "tokens_per_s": ..., "step_ms": ..., "mfu": ..., "flops_per_token": ..., "peak_tflops": 989,
   "peak_mem_gib": ..., "loss": ..., "params": ..., "torch": "2.11.0", "gpu": "NVIDIA H200"}

FLOPs per token = 6·N + 6·L·C·T, N the parameters without the position table (the tied
embedding counted once, as the head's matmul), L layers, C width, T sequence: the
attention matmuls counted causally (half of PaLM's 12·L·C·T). MFU = tokens/s × that / peak,
the peak being dense BF16 on H100/H200 SXM (989 TFLOP/s; --peak-tflops to change).

Examples:
  python3 bench/gpu/torch_gpt2_train.py --batch-size 16 --mode eager
  python3 bench/gpu/torch_gpt2_train.py --batch-size 16 --mode compile
  python3 bench/gpu/torch_gpt2_train.py --preset tiny --device cpu --steps 2 --warmup 1   # smoke test
"""

import argparse
import json
import os
import sys
import time

PRESETS = {
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, block_size=1024),
    "tiny": dict(n_layer=2, n_head=2, n_embd=128, vocab_size=50257, block_size=128),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=16, help="sequences per step (default 16)")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the preset's context, 1024 for gpt2)")
    p.add_argument("--mode", choices=["eager", "compile"], default="eager")
    p.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa", help="scaled_dot_product_attention or softmax(QK^T)V")
    p.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16", help="bf16 autocast (default) or plain fp32 (TF32 matmuls)")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="peak dense TFLOP/s for MFU (H100/H200 SXM BF16: 989)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main():
    a = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch

    from torch_models import GPT2

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch_gpt2_train: CUDA is not available (use --device cpu --preset tiny for a smoke test)")
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    cfg = PRESETS[a.preset]
    seq = a.seq or cfg["block_size"]
    if seq > cfg["block_size"]:
        sys.exit(f"--seq {seq} is longer than the preset's context {cfg['block_size']}")
    dev = torch.device(a.device)
    model = GPT2(cfg["vocab_size"], cfg["block_size"], cfg["n_embd"], cfg["n_layer"], cfg["n_head"], sdpa=a.attention == "sdpa").to(dev)
    params = sum(p.numel() for p in model.parameters())
    n_flops = params - model.wpe.weight.numel()
    flops_per_token = 6 * n_flops + 6 * cfg["n_layer"] * cfg["n_embd"] * seq

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}], lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=fused)
    step_model = torch.compile(model) if a.mode == "compile" else model
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16")

    g = torch.Generator(device=dev).manual_seed(a.seed)
    x = torch.randint(cfg["vocab_size"], (a.batch_size, seq), device=dev, generator=g)
    y = torch.randint(cfg["vocab_size"], (a.batch_size, seq), device=dev, generator=g)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        with amp:
            loss = step_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t_compile = time.time()
    for _ in range(a.warmup):
        loss = step()
    sync()
    warmup_s = time.time() - t_compile
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    sync()
    secs = time.time() - t0
    tokens_per_s = a.batch_size * seq * a.steps / secs
    out = {
        "bench": "torch_gpt2_train", "mode": a.mode, "attention": a.attention, "dtype": a.dtype, "preset": a.preset,
        "batch_size": a.batch_size, "seq": seq, "steps": a.steps, "tokens_per_s": round(tokens_per_s, 1),
        "step_ms": round(1000 * secs / a.steps, 3), "mfu": round(tokens_per_s * flops_per_token / (a.peak_tflops * 1e12), 4),
        "flops_per_token": flops_per_token, "peak_tflops": a.peak_tflops,
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if dev.type == "cuda" else None,
        "loss": round(loss.item(), 4), "params": params, "warmup_s": round(warmup_s, 2), "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
