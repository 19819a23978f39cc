#!/usr/bin/env python3
"""Cross-check llama_ref.py against transformers (needs torch + transformers; accelerate and
gguf for GGUF files).

  python bench/llm/hf_compare.py --model FILE.gguf|HF_DIR --ids PROMPTS.json --greedy 32 \
      [--ref DIR]  [--out DIR]

Runs the prompts through transformers in float32 and through llama_ref.py in float64 (or
reads llama_ref.py's output from --ref DIR), then prints per prompt the max over positions of
max_v|a - b| / max_v|b| (a = transformers' logits, b = llama_ref's) and whether the greedy
continuations are identical. --out DIR also writes transformers' logits and greedy tokens in
llama_ref.py's format (ref.json + p{i}.f32). Exits 1 when a greedy continuation differs or a
relative error exceeds --tolerance.
"""
import argparse
import math
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402


def load_transformers_model(path):
    import torch
    from transformers import AutoModelForCausalLM

    if os.path.isdir(path):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        # transformers reads a GGUF by directory + file name and dequantizes it to float32.
        model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
            dtype=torch.float32)
    return model.eval()


def transformers_reference(model, prompts, greedy):
    """float32 logits [T, V] of every prompt position, `greedy` argmax tokens per prompt (no
    stop at end-of-sequence, continued from transformers' own KV cache) and the smallest
    top-1 minus top-2 gap among those choices."""
    import inspect

    import torch

    # transformers 5.2x renamed the forward's past_key_values argument to cache.
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def cache_of(output):
        return getattr(output, "cache", None) or output.past_key_values

    all_logits, all_greedy, gaps = [], [], []
    with torch.no_grad():
        for ids in prompts:
            out = model(input_ids=torch.tensor([ids]), use_cache=True)
            all_logits.append(out.logits[0].float().numpy().copy())
            past, last = cache_of(out), out.logits[0, -1].double()
            tokens, gap = [], math.inf
            for step in range(greedy):
                top2 = torch.topk(last, 2).values
                gap = min(gap, float(top2[0] - top2[1]))
                tokens.append(int(torch.argmax(last)))
                if step + 1 < greedy:
                    out = model(input_ids=torch.tensor([[tokens[-1]]]), use_cache=True,
                                **{cache_arg: past})
                    past, last = cache_of(out), out.logits[0, -1].double()
            all_greedy.append(tokens)
            gaps.append(gap)
    return all_logits, all_greedy, gaps


def relative_errors(candidate, reference):
    """Per prompt: max over positions t of max_v|a[t] - b[t]| / max_v|b[t]|."""
    errors = []
    for a, b in zip(candidate, reference):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        per_position = np.abs(a - b).max(axis=-1) / np.abs(b).max(axis=-1)
        errors.append(float(per_position.max()))
    return errors


def report(label, prompts, errors, greedy_a, greedy_b, tolerance):
    """Prints one line per prompt; returns whether everything agreed."""
    ok = True
    for i, (ids, err, ga, gb) in enumerate(zip(prompts, errors, greedy_a, greedy_b)):
        same = ga == gb
        first_diff = next((k for k, (x, y) in enumerate(zip(ga, gb)) if x != y), None)
        ok &= same and err <= tolerance
        print(f"{label} prompt {i}: {len(ids)} tokens, max rel err {err:.3e}, greedy "
              + ("identical" if same else f"DIFFERS from token {first_diff}: {ga} vs {gb}")
              + f" ({len(ga)} tokens)")
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="GGUF file or Hugging Face directory")
    parser.add_argument("--ids", required=True, help="JSON prompts file (token ids)")
    parser.add_argument("--greedy", type=int, default=32)
    parser.add_argument("--ref", help="llama_ref.py output directory (else run it here)")
    parser.add_argument("--out", help="write transformers' reference here")
    parser.add_argument("--tolerance", type=float, default=1e-4,
                        help="largest accepted relative error (default 1e-4)")
    args = parser.parse_args()

    prompts = llama_ref.read_prompts(args.ids)
    if not os.path.isdir(args.model):
        import gguf

        if any(t.name == "rope_freqs.weight" for t in gguf.GGUFReader(args.model).tensors):
            # Seen with transformers 5.24: its GGUF loader drops the llama3 rope factors and
            # builds a default rope, so from the first rotated position on its logits differ.
            print("hf_compare: note: this GGUF has rope_freqs.weight (llama3 rope scaling), "
                  "which transformers' GGUF loader ignores")
    started = time.time()
    model = load_transformers_model(args.model)
    hf_logits, hf_greedy, hf_gaps = transformers_reference(model, prompts, args.greedy)
    print(f"transformers: {time.time() - started:.1f} s")
    if args.out:
        llama_ref.write_reference(args.out, prompts, hf_logits, hf_greedy, hf_gaps,
                                  extra={"model": os.path.basename(os.path.normpath(args.model)),
                                         "source": "transformers (float32)"})
    if args.ref:
        doc, ref_logits = llama_ref.read_reference(args.ref)
        if [p["ids"] for p in doc["prompts"]] != prompts:
            sys.exit(f"hf_compare: {args.ref} holds other prompts than {args.ids}")
        ref_greedy = [p["greedy"][:args.greedy] for p in doc["prompts"]]
    else:
        started = time.time()
        config, weights = llama_ref.load_model(args.model)
        ref_logits, ref_greedy, _ = llama_ref.LlamaReference(config, weights).run(prompts, args.greedy)
        print(f"llama_ref: {time.time() - started:.1f} s")
    errors = relative_errors(hf_logits, ref_logits)
    ok = report("transformers vs llama_ref:", prompts, errors, hf_greedy, ref_greedy, args.tolerance)
    print("hf_compare: " + ("agree" if ok else "DISAGREE") + f" (tolerance {args.tolerance:g})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
