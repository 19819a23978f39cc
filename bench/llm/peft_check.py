#!/usr/bin/env python3
"""Checks a sinter LoRA adapter against PEFT itself.

Loads the base model (a Hugging Face directory) in transformers, applies the adapter that
`sinter train --lora-rank` wrote (adapter_config.json + adapter_model.safetensors) with
peft's PeftModel.from_pretrained, and compares its logits with those of the model that
`sinter merge` wrote from the same base and adapter. Equal logits mean that PEFT reads
sinter's tensor names, layout (q/k/v and gate/up split out of sinter's packed layers) and
scale (lora_alpha / r) as sinter meant them.

    /tmp/llmvenv/bin/python bench/llm/peft_check.py --base BASE_DIR --adapter ADAPTER_DIR \
        --merged MERGED_DIR [--json OUT.json]

Prints one JSON object; exits 1 when the logits differ by more than --tol.

BASE_DIR must hold the very weights sinter trained on. For a .gguf base (dequantized by
sinter), write it as Hugging Face with `sinter merge` of the adapter with every lora_B zeroed
(bench/RESULTS.md, 2026-11-29, has the commands; 4.96e-5 on SmolLM2-135M).
"""

import argparse
import json
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--base", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--merged", required=True)
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--json")
    a = p.parse_args()
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(a.base, torch_dtype=torch.float32).eval()
    vocab = base.config.vocab_size
    ids = [(i * 7 + 3) % vocab for i in range(24)]
    plain = logits(base, ids)
    peft_model = PeftModel.from_pretrained(base, a.adapter).eval()
    with_adapter = logits(peft_model, ids)
    merged = AutoModelForCausalLM.from_pretrained(a.merged, torch_dtype=torch.float32).eval()
    sinter_merged = logits(merged, ids)
    scale = with_adapter.abs().max().item()
    out = {
        "peft_version": __import__("peft").__version__,
        "adapted_modules": sorted(peft_model.peft_config["default"].target_modules),
        "r": peft_model.peft_config["default"].r,
        "lora_alpha": peft_model.peft_config["default"].lora_alpha,
        "max_abs_diff_peft_vs_sinter_merge": (with_adapter - sinter_merged).abs().max().item(),
        "max_abs_diff_peft_vs_base": (with_adapter - plain).abs().max().item(),
        "logit_scale": scale,
        "tol": a.tol,
    }
    out["ok"] = out["max_abs_diff_peft_vs_sinter_merge"] <= a.tol and out["max_abs_diff_peft_vs_base"] > 10 * a.tol
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    sys.exit(0 if out["ok"] else 1)


if __name__ == "__main__":
    main()
