#!/usr/bin/env python3
"""`sinter serve` beside llama.cpp's `llama-server` on one GGUF model, CPU, loopback.

Each round starts one server, loads it with `sinter bench serve --url` (the same load
generator for both: N concurrent clients streaming /v1/completions of --max-tokens tokens,
every request checked to finish exactly once), stops it, then does the same with the other
server; rounds alternate which goes first. Servers and load generator run under `chrt -f 1`
when permitted and share the machine's cores, as a single-machine deployment does. Both
servers get the same threads (RAYON_NUM_THREADS for sinter, -t/-tb for llama.cpp), the same
number of parallel sequences (--max-batch / -np) and keep the GGUF quantized. Prints medians
of tokens/s per concurrency and the ratio; --out writes every round as JSON.

llama-server comes from building llama.cpp; here, from PyPI's llama-cpp-python source
package, which vendors llama.cpp (cmake -DGGML_NATIVE=ON, target llama-server):

  python3 bench/vs-llamacpp/serve.py --sinter target/release/sinter \\
      --llama-server PATH/llama-server --model SmolLM2.gguf [--concurrency 1,4,16 --rounds 2]
"""

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from run import cpu_facts, rt_prefix  # noqa: E402


def wait_ready(port, proc, what, limit=300):
    t0 = time.time()
    while time.time() - t0 < limit:
        if proc.poll() is not None:
            sys.exit(f"vs-llamacpp serve: {what} exited ({proc.returncode}) before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return time.time() - t0
        except Exception:
            pass
        time.sleep(0.2)
    proc.kill()
    sys.exit(f"vs-llamacpp serve: {what} was not ready within {limit} s")


def stop(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


ROW = re.compile(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
                 r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")


def load(a, port, name, env, rt):
    cmd = rt + [a.sinter, "bench", "serve", "--url", f"http://127.0.0.1:{port}",
                "--model-name", name, "--concurrency", a.concurrency,
                "--max-tokens", str(a.max_tokens), "--prompt", a.prompt,
                "--temperature", str(a.temperature), "--client-threads", "1"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    rows = {}
    for line in p.stdout.splitlines():
        m = ROW.match(line)
        if m:
            c, ok, err, wall = int(m[1]), int(m[2]), int(m[3]), float(m[4])
            rows[c] = {"ok": ok, "errors": err, "wall_s": wall, "tok_s": float(m[6]),
                       "ttft_p50_ms": float(m[7]), "ttft_p99_ms": float(m[8]),
                       "itl_p50_ms": float(m[9]), "itl_p99_ms": float(m[10])}
    # The load generator exits non-zero when a request failed; its table still holds what the
    # others measured, and the failures are kept in the results (`errors`, `failures`).
    if p.returncode != 0 and not rows:
        sys.exit(f"vs-llamacpp serve: {' '.join(cmd)} failed ({p.returncode}):\n"
                 f"{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    failures = [l for l in p.stderr.splitlines() if l.startswith("concurrency ")]
    return rows, p.stdout + "\n".join(failures)


def server_cmd(a, engine, port, name):
    slots = max(int(c) for c in a.concurrency.split(","))
    if engine == "sinter":
        return [a.sinter, "serve", "--model", a.model, "--port", str(port),
                "--model-name", name, "--max-batch", str(slots), "--max-queue", "256",
                "--device", "cpu"]
    return [a.llama_server, "-m", a.model, "--port", str(port), "--host", "127.0.0.1",
            "-t", str(a.threads), "-tb", str(a.threads), "-np", str(slots),
            "-c", str(slots * a.slot_context), "-a", name, "--no-webui", "-lv", "0"]


def driver(a):
    os.makedirs(a.logs, exist_ok=True)  # a fresh --logs folder is made, not an error
    rt = rt_prefix()
    env = dict(os.environ, RAYON_NUM_THREADS=str(a.threads), OMP_NUM_THREADS=str(a.threads))
    name = "bench-model"
    rounds = []
    for r in range(a.rounds):
        order = ["sinter", "llama-server"] if r % 2 == 0 else ["llama-server", "sinter"]
        for engine in order:
            port = a.port + (0 if engine == "sinter" else 1)
            log = open(os.path.join(a.logs, f"{engine}-{r}.log"), "w")
            proc = subprocess.Popen(rt + server_cmd(a, engine, port, name), env=env,
                                    stdout=log, stderr=subprocess.STDOUT)
            ready_s = wait_ready(port, proc, engine)
            try:
                rows, raw = load(a, port, name, env, rt)
            finally:
                stop(proc)
                log.close()
            print(f"round {r} {engine}: ready in {ready_s:.1f} s; "
                  + ", ".join(f"c{c} {v['tok_s']:.1f} tok/s"
                              + (f" ({v['errors']} failed)" if v["errors"] else "")
                              for c, v in sorted(rows.items())),
                  flush=True)
            rounds.append({"round": r, "engine": engine, "rows": rows, "table": raw})
    return rounds


def summarize(a, rounds):
    model, flags = cpu_facts()
    print(f"\nCPU: {model}; flags {' '.join(flags)}; {a.threads} threads each; "
          f"{a.max_tokens}-token streamed completions, prompt {a.prompt!r}, "
          f"temperature {a.temperature}")
    print("| concurrency | sinter tok/s | llama-server tok/s | ratio | sinter TTFT p50 ms | "
          "llama-server TTFT p50 ms |\n|---:|---:|---:|---:|---:|---:|")
    summary = []
    for c in [int(x) for x in a.concurrency.split(",")]:
        med = {}
        for engine in ["sinter", "llama-server"]:
            vals = [x["rows"][c] for x in rounds if x["engine"] == engine and c in x["rows"]]
            med[engine] = {k: statistics.median(v[k] for v in vals)
                           for k in ["tok_s", "ttft_p50_ms"]} if vals else None
        if not all(med.values()):
            continue
        ratio = med["sinter"]["tok_s"] / med["llama-server"]["tok_s"]
        print(f"| {c} | {med['sinter']['tok_s']:.1f} | {med['llama-server']['tok_s']:.1f} | "
              f"{ratio:.2f}x | {med['sinter']['ttft_p50_ms']:.0f} | "
              f"{med['llama-server']['ttft_p50_ms']:.0f} |")
        summary.append({"concurrency": c, "sinter": med["sinter"],
                        "llama_server": med["llama-server"], "ratio": ratio})
    return {"cpu": model, "flags": flags, "threads": a.threads, "model": a.model,
            "max_tokens": a.max_tokens, "summary": summary, "rounds": rounds}


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sinter", required=True)
    p.add_argument("--llama-server", required=True)
    p.add_argument("--model", required=True, help="a GGUF file both servers load")
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt", default="ROMEO:")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--slot-context", type=int, default=256,
                   help="llama-server's context per parallel sequence")
    p.add_argument("--port", type=int, default=18480)
    p.add_argument("--logs", default="/tmp", help="where the servers' logs go")
    p.add_argument("--out")
    a = p.parse_args()
    for exe in [a.sinter, a.llama_server]:
        if not (shutil.which(exe) or os.access(exe, os.X_OK)):
            sys.exit(f"vs-llamacpp serve: {exe} is not an executable")
    result = summarize(a, driver(a))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
