#!/usr/bin/env python3
"""Reference GPT-2 outputs for checking sinter's GPT against PyTorch / transformers.

Builds GPT-2 (``GPT2LMHeadModel`` from transformers when it is installed, else the same
model in plain PyTorch: bench/gpu/torch_models.py ``HFLayoutGPT2``) with seeded random
weights — every LayerNorm gain and every bias perturbed too, so that none is trivially 1 or
0 — and writes to ``--out`` (default bench/gpu/out/gpt2_ref):

  model.safetensors      the weights in Hugging Face's layout (``transformer.h.0.attn.c_attn.weight``
                         [768, 2304], Conv1D weights [in, out]; no ``lm_head.weight``: tied),
                         metadata format=pt and n_head
  config.json            the matching GPT2Config
  reference.safetensors  input_ids [B, T] (i64), logits [B, T, V] (f32), loss [1] (the
                         next-token cross-entropy: logits[:, :-1] against input_ids[:, 1:]) and
                         grad.<HF name> (d loss / d weight, HF layout) for a few weights

All in float32 (TF32 off), on the CPU by default. Then, from the repository root:

  cargo run --release -p sinter-models --example gpt2_compare -- bench/gpu/out/gpt2_ref

loads the weights into sinter's GPT, runs the same batch and reports the maximum relative
errors of logits, loss and gradients (goal: <= 1e-4).

Needs only torch (transformers optional; no downloads).
"""

import argparse
import json
import os
import sys
import time

GRAD_NAMES = [
    "transformer.wte.weight",
    "transformer.wpe.weight",
    "transformer.h.0.ln_1.weight",
    "transformer.h.0.attn.c_attn.weight",
    "transformer.h.0.attn.c_attn.bias",
    "transformer.h.0.attn.c_proj.weight",
    "transformer.h.{last}.mlp.c_fc.weight",
    "transformer.h.{last}.mlp.c_proj.weight",
    "transformer.h.{last}.ln_2.bias",
    "transformer.ln_f.weight",
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the files written.")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "gpt2_ref"), help="output directory")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--n-layer", type=int, default=12)
    p.add_argument("--n-head", type=int, default=12)
    p.add_argument("--n-embd", type=int, default=768)
    p.add_argument("--n-positions", type=int, default=1024)
    p.add_argument("--vocab-size", type=int, default=50257)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--device", default="cpu", help="cpu (default, exact fp32) or cuda")
    p.add_argument("--impl", choices=["auto", "transformers", "torch"], default="auto", help="auto: transformers if importable, else plain torch")
    return p.parse_args()


def build_transformers(a):
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=a.vocab_size, n_positions=a.n_positions, n_embd=a.n_embd, n_layer=a.n_layer, n_head=a.n_head,
        activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=True,
    )
    try:
        cfg._attn_implementation = "eager"  # the explicit softmax(QK^T)V, no fused kernel
    except Exception:
        pass
    m = GPT2LMHeadModel(cfg)
    return m, cfg.to_json_string()


def build_torch(a):
    from torch_models import HFLayoutGPT2

    m = HFLayoutGPT2(a.vocab_size, a.n_positions, a.n_embd, a.n_layer, a.n_head)
    cfg = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "vocab_size": a.vocab_size, "n_positions": a.n_positions, "n_ctx": a.n_positions, "n_embd": a.n_embd,
        "n_layer": a.n_layer, "n_head": a.n_head, "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.0,
        "embd_pdrop": 0.0, "attn_pdrop": 0.0, "tie_word_embeddings": True,
    }
    return m, json.dumps(cfg, indent=2) + "\n"


def logits_of(model, ids, use_transformers):
    if use_transformers:
        return model(input_ids=ids).logits
    return model(ids)


def main():
    a = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch
    import torch.nn.functional as F

    from torch_models import save_safetensors

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(a.seed)

    use_tf = a.impl == "transformers"
    if a.impl == "auto":
        try:
            import transformers  # noqa: F401

            use_tf = True
        except ImportError:
            use_tf = False
    model, config_json = build_transformers(a) if use_tf else build_torch(a)
    model = model.float().to(a.device).eval()

    # Perturb every parameter a little (biases and LayerNorm parameters start at exactly 0 / 1).
    g = torch.Generator().manual_seed(a.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g).to(p.device)
            if ".ln_" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.02 * noise)
            else:
                p.add_(0.002 * noise)

    ids = torch.randint(a.vocab_size, (a.batch, a.seq), generator=torch.Generator().manual_seed(a.seed + 2)).to(a.device)
    t0 = time.time()
    logits = logits_of(model, ids, use_tf)
    v = logits.shape[-1]
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, v), ids[:, 1:].reshape(-1))
    loss.backward()
    secs = time.time() - t0

    os.makedirs(a.out, exist_ok=True)
    # named_parameters() lists the tied lm_head once, as transformer.wte.weight.
    params = dict(model.named_parameters())
    weights = {n: p.detach().float() for n, p in params.items() if n != "lm_head.weight"}
    save_safetensors(os.path.join(a.out, "model.safetensors"), weights, {"format": "pt", "n_head": a.n_head})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        f.write(config_json)
    ref = {"input_ids": ids.detach().cpu().long(), "logits": logits.detach().float().cpu(), "loss": loss.detach().float().reshape(1).cpu()}
    for pattern in GRAD_NAMES:
        name = pattern.format(last=a.n_layer - 1)
        p = params.get(name)
        if p is None or p.grad is None:
            print(f"warning: no gradient for {name}", file=sys.stderr)
            continue
        ref["grad." + name[len("transformer."):]] = p.grad.detach().float().cpu()
    impl = "transformers " + __import__("transformers").__version__ if use_tf else "plain torch (HFLayoutGPT2)"
    save_safetensors(os.path.join(a.out, "reference.safetensors"), ref, {"impl": impl, "torch": torch.__version__, "seed": a.seed})
    print(json.dumps({
        "bench": "gpt2_reference", "impl": impl, "torch": torch.__version__, "device": a.device, "out": a.out,
        "parameters": sum(p.numel() for p in params.values()), "batch": a.batch, "seq": a.seq,
        "loss": loss.item(), "fwd_bwd_s": secs, "grads": sorted(k for k in ref if k.startswith("grad.")),
    }))


if __name__ == "__main__":
    main()
