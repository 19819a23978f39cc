#!/usr/bin/env python3
"""Attention fwd+bwd beside PyTorch's SDPA backends, as a Markdown table.

Reads, in DIR: ``sinter_attention_cudnn.json`` / ``sinter_attention_flash.json``
(``SINTER_ATTENTION=cudnn|flash sinter bench gpu attention --out DIR/sinter_attention_<b>.md``)
and ``sdpa_cudnn.jsonl`` / ``sdpa_flash.jsonl`` (``torch_sdpa.py --backend cudnn|flash``);
prints TFLOP/s for each T and head dim, per backend, and the ratio of sinter's faster backend to
SDPA's faster one. A missing file or shape prints as a dash, so a failed part still leaves a
table.

    python3 bench/gpu/attention_table.py DIR
"""

import json
import os
import sys

BACKENDS = ("cudnn", "flash")


def load(d):
    mine = {}
    for b in BACKENDS:
        path = os.path.join(d, f"sinter_attention_{b}.json")
        if os.path.exists(path):
            mine[b] = json.load(open(path)).get("attention", {})
    theirs = {}
    for b in BACKENDS:
        path = os.path.join(d, f"sdpa_{b}.jsonl")
        if not os.path.exists(path):
            continue
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                theirs[(r["seq"], r["head_dim"], b)] = r.get("fwd_bwd_tflops")
    return mine, theirs


def cell(x, spec=".1f"):
    return "—" if x is None else format(x, spec)


def main():
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__)
    mine, theirs = load(sys.argv[1])
    print("## Attention fwd+bwd, causal bf16, TFLOP/s: sinter's cudnn and flash backends beside SDPA's\n")
    print("| T | head dim | sinter cudnn | sinter flash | SDPA cudnn | SDPA flash | faster sinter / faster SDPA |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for t in (1024, 4096):
        for hd in (64, 128):
            mc, mf = (mine.get(b, {}).get(f"t{t}_d{hd}", {}).get("fwd_bwd_tflops") for b in BACKENDS)
            c, f = (theirs.get((t, hd, b)) for b in BACKENDS)
            best = max((x for x in (c, f) if x), default=None)
            m = max((x for x in (mc, mf) if x), default=None)
            ratio = m / best if m and best else None
            print(f"| {t} | {hd} | {cell(mc)} | {cell(mf)} | {cell(c)} | {cell(f)} | {cell(ratio, '.2f')} |")


if __name__ == "__main__":
    main()
