#!/usr/bin/env python3
"""PyTorch's BERT-base masked-LM training throughput: the baseline for sinter's BERT bench.

BERT-base with the MLM head (12 layers, 12 heads, 768 wide, FFN 3072, vocabulary 30522,
dropout 0.1; the same architecture and parameter count, 109,514,298, as Hugging Face's
BertForMaskedLM), sequence 128, on random tokens masked with BERT's recipe on the GPU each
step (15% selected: 80% [MASK], 10% random, 10% kept), loss over the masked positions
(cross-entropy, ignore_index -100), AdamW (lr 1e-4, weight decay 0.01), no padding.

Precisions: ``fp32`` (true FP32: TF32 off unless --tf32) and ``amp16`` (float16 autocast with
a GradScaler), or ``both`` (default: one JSON line each). After ``--warmup`` steps, times
``--steps`` steps (CUDA-synchronised) and prints per precision:

  {"bench": "torch_bert_train", "precision": "amp16", "batch_size": 32, "seq": 128,
   "sequences_per_s": ..., "tokens_per_s": ..., "step_ms": ..., "peak_mem_gib": ..., "loss": ...,
   "params": 109514298, "torch": "2.11.0", "gpu": "NVIDIA H200"}

The head runs on every position, like BertForMaskedLM, unless --masked-head (only the
masked ~15%). Needs only torch.

Examples:
  python3 bench/gpu/torch_bert_train.py --batch-size 32
  python3 bench/gpu/torch_bert_train.py --batch-size 64 --precision amp16 --compile
  python3 bench/gpu/torch_bert_train.py --preset tiny --device cpu --steps 2 --warmup 1   # smoke test
"""

import argparse
import json
import os
import sys
import time

PRESETS = {
    "bert-base": dict(hidden=768, n_layer=12, n_head=12, intermediate=3072),
    "tiny": dict(hidden=128, n_layer=2, n_head=2, intermediate=512),
}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per step (default 32)")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--precision", choices=["fp32", "amp16", "both"], default="both")
    p.add_argument("--tf32", action="store_true", help="let fp32 matmuls use TF32 (off: true FP32)")
    p.add_argument("--attention", choices=["sdpa", "manual"], default="sdpa", help="scaled_dot_product_attention or softmax(QK^T)V")
    p.add_argument("--masked-head", action="store_true", help="run the MLM head only on masked positions")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--preset", choices=sorted(PRESETS), default="bert-base")
    p.add_argument("--steps", type=int, default=30, help="timed steps")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--vocab-size", type=int, default=30522, help="vocabulary (30522: bert-base-uncased; sinter's bench passes its own)")
    return p.parse_args()


def bench(a, precision, torch, dev):
    from torch_models import BertForMaskedLM, mask_tokens

    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    model = BertForMaskedLM(sdpa=a.attention == "sdpa", **{**PRESETS[a.preset], "vocab_size": a.vocab_size}).to(dev).train()
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-4, fused=dev.type == "cuda")
    fwd = torch.compile(model) if a.compile else model
    amp16 = precision == "amp16"
    scaler = torch.amp.GradScaler(dev.type, enabled=amp16)
    autocast = torch.autocast(device_type=dev.type, dtype=torch.float16, enabled=amp16)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    vocab = a.vocab_size
    ids = torch.randint(1000, vocab, (a.batch_size, a.seq), device=dev, generator=g)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    def step():
        inputs, labels = mask_tokens(ids, vocab, generator=g)
        with autocast:
            loss = fwd(inputs, labels, masked_only=a.masked_head)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        loss = step()
    sync()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    for _ in range(a.steps):
        loss = step()
    sync()
    secs = time.time() - t0
    seq_per_s = a.batch_size * a.steps / secs
    return {
        "bench": "torch_bert_train", "precision": precision, "tf32": a.tf32, "attention": a.attention, "compile": a.compile,
        "masked_head": a.masked_head, "preset": a.preset, "batch_size": a.batch_size, "seq": a.seq, "steps": a.steps,
        "sequences_per_s": round(seq_per_s, 2), "tokens_per_s": round(seq_per_s * a.seq, 1), "step_ms": round(1000 * secs / a.steps, 3),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if dev.type == "cuda" else None,
        "loss": round(loss.item(), 4), "params": params, "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
    }


def main():
    a = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch

    if a.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("torch_bert_train: CUDA is not available (use --device cpu --preset tiny for a smoke test)")
    dev = torch.device(a.device)
    for precision in (["fp32", "amp16"] if a.precision == "both" else [a.precision]):
        if precision == "amp16" and dev.type == "cpu":
            print("torch_bert_train: skipping amp16 on the CPU", file=sys.stderr)
            continue
        print(json.dumps(bench(a, precision, torch, dev)), flush=True)
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
