#!/usr/bin/env python3
"""Reference BERT masked-LM outputs for checking sinter's BERT against transformers.

Builds transformers' ``BertForMaskedLM`` (needs the transformers package; no downloads) with
seeded random weights — LayerNorm gains and biases perturbed too — and writes to ``--out``
(default bench/gpu/out/bert_ref):

  model.safetensors      the weights under Hugging Face's names (the tied decoder weight and
                         bias appear once, as bert.embeddings.word_embeddings.weight and
                         cls.predictions.bias), metadata format=pt
  config.json            the BertConfig
  reference.safetensors  input_ids, token_type_ids, attention_mask (padding at the end of the
                         last sequence), labels (-100 except at masked positions), logits
                         [B, T, V], loss [1], grad.<name> for a few weights

All float32 (TF32 off), CPU by default, eager attention. Then, from the repository root:

  cargo run --release -p sinter-models --example bert_compare -- bench/gpu/out/bert_ref
"""

import argparse
import json
import os
import sys

GRAD_NAMES = [
    "bert.embeddings.word_embeddings.weight",
    "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight",
    "bert.embeddings.LayerNorm.weight",
    "bert.encoder.layer.0.attention.self.query.weight",
    "bert.encoder.layer.0.attention.self.value.bias",
    "bert.encoder.layer.0.attention.output.LayerNorm.bias",
    "bert.encoder.layer.{last}.intermediate.dense.weight",
    "bert.encoder.layer.{last}.output.dense.weight",
    "cls.predictions.transform.dense.weight",
    "cls.predictions.transform.LayerNorm.weight",
    "cls.predictions.bias",
]


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog="See the module docstring for the files written.")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "bert_ref"))
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--preset", choices=["bert-base", "bert-tiny"], default="bert-base")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--device", default="cpu")
    return p.parse_args()


def main():
    a = parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch

    from torch_models import save_safetensors

    try:
        from transformers import BertConfig, BertForMaskedLM
    except ImportError:
        sys.exit("bert_reference: needs the transformers package (pip install transformers)")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(a.seed)
    size = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    if a.preset == "bert-tiny":
        size = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512)
    cfg = BertConfig(vocab_size=a.vocab_size, max_position_embeddings=512, type_vocab_size=2, hidden_act="gelu",
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12, **size)
    try:
        cfg._attn_implementation = "eager"
    except Exception:
        pass
    model = BertForMaskedLM(cfg).float().to(a.device).eval()
    g = torch.Generator().manual_seed(a.seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g).to(p.device)
            if "LayerNorm.weight" in name:
                p.copy_(1.0 + 0.1 * noise)
            elif name.endswith("bias"):
                p.copy_(0.02 * noise)
            else:
                p.add_(0.002 * noise)

    gi = torch.Generator().manual_seed(a.seed + 2)
    b, t = a.batch, a.seq
    ids = torch.randint(1000, a.vocab_size, (b, t), generator=gi)
    ids[:, 0], ids[:, -1] = 101, 102
    token_types = torch.zeros(b, t, dtype=torch.long)
    token_types[:, t // 2:] = 1
    mask = torch.ones(b, t, dtype=torch.long)
    mask[-1, t - t // 4:] = 0  # the last sequence ends in padding
    ids[-1, t - t // 4:] = 0
    labels = torch.full((b, t), -100, dtype=torch.long)
    sel = (torch.rand(b, t, generator=gi) < 0.15) & (mask == 1)
    sel[:, 1] = True
    labels[sel] = ids[sel]
    ids[sel] = 103
    dev = lambda x: x.to(a.device)  # noqa: E731
    out = model(input_ids=dev(ids), attention_mask=dev(mask), token_type_ids=dev(token_types), labels=dev(labels))
    out.loss.backward()

    os.makedirs(a.out, exist_ok=True)
    params = dict(model.named_parameters())
    save_safetensors(os.path.join(a.out, "model.safetensors"), {n: p.detach().float() for n, p in params.items()}, {"format": "pt", "n_head": cfg.num_attention_heads})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        f.write(cfg.to_json_string())
    ref = {"input_ids": ids, "token_type_ids": token_types, "attention_mask": mask, "labels": labels,
           "logits": out.logits.detach().float().cpu(), "loss": out.loss.detach().float().reshape(1).cpu()}
    for pattern in GRAD_NAMES:
        name = pattern.format(last=cfg.num_hidden_layers - 1)
        if params.get(name) is not None and params[name].grad is not None:
            ref["grad." + name] = params[name].grad.detach().float().cpu()
        else:
            print(f"warning: no gradient for {name}", file=sys.stderr)
    import transformers

    save_safetensors(os.path.join(a.out, "reference.safetensors"), ref, {"impl": "transformers " + transformers.__version__, "seed": a.seed})
    print(json.dumps({"bench": "bert_reference", "impl": "transformers " + transformers.__version__, "torch": torch.__version__,
                      "parameters": sum(p.numel() for p in params.values()), "loss": out.loss.item(), "out": a.out,
                      "masked": int(sel.sum()), "grads": sorted(k for k in ref if k.startswith("grad."))}))


if __name__ == "__main__":
    main()
