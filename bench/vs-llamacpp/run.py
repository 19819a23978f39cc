#!/usr/bin/env python3
"""sinter beside llama.cpp (npm's node-llama-cpp: prebuilt llama.cpp) on GGUF models, CPU.

For each model and thread count, rounds alternate engine order, each figure from its own
process, both under `chrt -f 1` when permitted and with the same threads (RAYON_NUM_THREADS
for sinter, the context's `threads` for llama.cpp). Two figures, as `sinter bench llm`
measures them: pp (one pass over --prompt tokens, empty cache) and tg (a 16-token prompt,
then single-token steps with greedy picks until --gen tokens, the prompt included in the
time). Both see the same ids (bench_ids). sinter runs the file kept quantized (its default
for GGUF); llama.cpp as it always does. Prints the CPU, medians and ratios; --out as JSON.

  (cd /tmp/nlc && npm install node-llama-cpp)
  python3 bench/vs-llamacpp/run.py --sinter target/release/sinter --nlc /tmp/nlc \
      --model Q4_1=SmolLM2.gguf --model Q8_0=q8.gguf [--threads 1,2 --rounds 3 --out FILE]

llama.cpp's side is llama_side.mjs beside this file. PyPI's llama-cpp-python would build
llama.cpp from source instead (CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python),
which took over an hour on the loaded 2-core machine this was written on.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def vocab_of(path):
    from gguf import GGUFReader  # system python3: pip install gguf

    t = next(t for t in GGUFReader(path).tensors if t.name == "token_embd.weight")
    return int(t.shape[1])


def rt_prefix():
    chrt = shutil.which("chrt")
    if chrt and subprocess.run([chrt, "-f", "1", "true"], capture_output=True).returncode == 0:
        return [chrt, "-f", "1"]
    return []


def one(cmd, env):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"vs-llamacpp: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
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
                         if x.startswith(("avx", "fma", "amx", "f16c"))]
    return model, flags


def driver(a):
    rt = rt_prefix()
    results = []
    for spec in a.model:
        label, _, path = spec.partition("=")
        for threads in [int(t) for t in a.threads.split(",")]:
            env = dict(os.environ, RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads),
                       NLC_DIR=a.nlc)
            common = ["--prompt", str(a.prompt), "--gen", str(a.gen)]
            sinter = rt + [a.sinter, "bench", "llm", "--model", path, "--rounds", "1"] + common
            llama = rt + ["node", os.path.join(HERE, "llama_side.mjs"), path, str(threads),
                          str(a.prompt), str(a.gen), str(vocab_of(path))]
            runs = {"sinter": [], "llama.cpp": []}
            for r in range(a.rounds):
                order = [("sinter", sinter), ("llama.cpp", llama)]
                if r % 2:
                    order.reverse()
                for name, cmd in order:
                    res = one(cmd, env)
                    runs[name].append(res)
                    print(f"{label} {threads}t round {r} {name}: pp {res['prompt_tok_s']:.1f}, "
                          f"tg {res['gen_tok_s']:.2f} tok/s", file=sys.stderr)
            med = {n: {k: statistics.median(x[k] for x in v)
                       for k in ("prompt_tok_s", "gen_tok_s")} for n, v in runs.items()}
            results.append({"model": label, "path": path, "threads": threads, "runs": runs,
                            "medians": med})
    model, flags = cpu_facts()
    print(f"CPU: {model}; flags {' '.join(flags)}; "
          f"{'chrt -f 1' if rt else 'no realtime priority'}; {a.rounds} rounds, medians (tok/s)")
    print("| model | threads | pp sinter | pp llama.cpp | pp ratio | tg sinter | tg llama.cpp "
          "| tg ratio |\n|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        s, l = r["medians"]["sinter"], r["medians"]["llama.cpp"]
        print(f"| {r['model']} | {r['threads']} | {s['prompt_tok_s']:.1f} | "
              f"{l['prompt_tok_s']:.1f} | {s['prompt_tok_s'] / l['prompt_tok_s']:.2f}x | "
              f"{s['gen_tok_s']:.1f} | {l['gen_tok_s']:.1f} | "
              f"{s['gen_tok_s'] / l['gen_tok_s']:.2f}x |")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"cpu": model, "flags": flags, "realtime": bool(rt), "prompt": a.prompt,
                       "gen": a.gen, "results": results}, f, indent=1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", action="append", required=True,
                   help="LABEL=FILE.gguf (repeat for several)")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--sinter", default="target/release/sinter")
    p.add_argument("--nlc", default="/tmp/nlc", help="the directory npm installed node-llama-cpp in")
    p.add_argument("--out")
    driver(p.parse_args())


if __name__ == "__main__":
    main()
