#!/usr/bin/env python3
"""sinter beside PyTorch + transformers on a pretrained Llama-family model (CPU, f32).

Rounds alternate engine order (sinter, transformers, then transformers, sinter, ...), each
figure from its own process, both with the same thread count (RAYON_NUM_THREADS /
torch.set_num_threads) and under `chrt -f 1` when permitted. Two figures per engine:
prompt processing (one forward over --prompt tokens, no cache before it) and greedy
generation (--gen tokens after a 16-token prompt, KV cache, prompt included in the time).
Both engines see the same ids (bench_ids, as sinter's `bench llm`). Prints medians and
ratios, and the CPU model and flags; writes --out as JSON.

  python3 bench/llm/vs_transformers.py --sinter target/release/sinter --python VENV/bin/python \
      --model SmolLM2.gguf [--prompt 512 --gen 128 --rounds 5 --threads 2 --out FILE]

This file is also the transformers side: `--side transformers` runs one round in-process.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time


def bench_ids(n, vocab):
    skip, span = (100, vocab - 100) if vocab > 200 else (0, vocab)
    return [(i * 7919 + 13) % span + skip for i in range(n)]


def transformers_side(a):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    t = time.perf_counter()
    if a.model.endswith(".gguf"):
        m = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(os.path.abspath(a.model)), gguf_file=os.path.basename(a.model),
            dtype=torch.float32)
    else:
        m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    m.eval()
    print(f"transformers: loaded in {time.perf_counter() - t:.2f} s", file=sys.stderr)
    vocab = m.config.vocab_size
    with torch.inference_mode():
        ids = torch.tensor([bench_ids(a.prompt, vocab)])
        m(ids)  # warm-up: the first call allocates
        t = time.perf_counter()
        m(ids)
        pp = time.perf_counter() - t
        short = torch.tensor([bench_ids(16, vocab)])
        kw = dict(max_new_tokens=a.gen, min_new_tokens=a.gen, do_sample=False, use_cache=True,
                  pad_token_id=0)
        m.generate(short, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0)
        t = time.perf_counter()
        out = m.generate(short, **kw)
        tg = time.perf_counter() - t
        assert out.shape[1] == 16 + a.gen, out.shape
    print(json.dumps({"engine": "transformers", "prompt_tokens": a.prompt, "prompt_s": pp,
                      "prompt_tok_s": a.prompt / pp, "gen_tokens": a.gen, "gen_s": tg,
                      "gen_tok_s": a.gen / tg}))


def rt_prefix():
    chrt = shutil.which("chrt")
    if chrt and subprocess.run([chrt, "-f", "1", "true"], capture_output=True).returncode == 0:
        return [chrt, "-f", "1"]
    return []


def one(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"vs-transformers: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


def cpu_facts():
    model, flags = "?", []
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and model == "?":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = [x for x in line.split(":", 1)[1].split()
                         if x.startswith(("avx", "fma", "amx"))]
    return model, flags


def driver(a):
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    rt = rt_prefix()
    # f32 on both sides (transformers dequantizes a GGUF): the engines, not the formats.
    sinter = rt + [a.sinter, "bench", "llm", "--model", a.model, "--prompt", str(a.prompt),
                   "--gen", str(a.gen), "--rounds", "1", "--dequantize"]
    torch = rt + [a.python, os.path.abspath(__file__), "--side", "transformers", "--model",
                  a.model, "--prompt", str(a.prompt), "--gen", str(a.gen), "--threads",
                  str(a.threads)]
    runs = {"sinter": [], "transformers": []}
    for r in range(a.rounds):
        order = [("sinter", sinter), ("transformers", torch)]
        if r % 2:
            order.reverse()
        for name, cmd in order:
            res = one(cmd, env)
            runs[name].append(res)
            print(f"round {r} {name}: pp {res['prompt_tok_s']:.1f} tok/s, "
                  f"tg {res['gen_tok_s']:.2f} tok/s", file=sys.stderr)
    med = {n: {k: statistics.median(x[k] for x in v) for k in ("prompt_tok_s", "gen_tok_s")}
           for n, v in runs.items()}
    model, flags = cpu_facts()
    print(f"CPU: {model}; flags {' '.join(flags)}; {a.threads} threads each; "
          f"{'chrt -f 1' if rt else 'no realtime priority'}; {a.rounds} rounds, medians")
    print(f"| figure | sinter | transformers | ratio |\n|---|---:|---:|---:|")
    for k, label in (("prompt_tok_s", f"prompt processing, {a.prompt} tokens (tok/s)"),
                     ("gen_tok_s", f"greedy generation, {a.gen} tokens (tok/s)")):
        s, t = med["sinter"][k], med["transformers"][k]
        print(f"| {label} | {s:.2f} | {t:.2f} | {s / t:.2f}x |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": model, "flags": flags, "threads": a.threads, "realtime": bool(rt),
                       "runs": runs, "medians": med}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sinter", default="target/release/sinter")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--out")
    p.add_argument("--side", choices=["driver", "transformers"], default="driver")
    a = p.parse_args()
    transformers_side(a) if a.side == "transformers" else driver(a)


if __name__ == "__main__":
    main()
