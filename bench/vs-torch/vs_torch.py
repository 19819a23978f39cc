#!/usr/bin/env python3
"""sinter beside PyTorch on the CPU: the driver of bench/vs-torch/run (see there for setup).

It prepares the checkpoints both sides use, checks that PyTorch's twins compute what sinter
computes, then runs every row for both engines, interleaved round by round, each measurement in
a process of its own (under `chrt -f 1` when permitted), and prints a markdown table with the
ratios; results.md and results.json (stable keys and order, for diffing) go to --out.

sinter's side is `sinter bench cpu CASE --json` (crates/sinter/src/bench_cpu.rs); PyTorch's is
torch_side.py with the same case names. A row whose command fails says so and the others go on;
a failed equivalence check makes the exit status 1 (after everything is written).
"""

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# ---- what is measured --------------------------------------------------------------------------

# A job is one process: (engine, case, options). Options: checkpoint / init name a prepared
# directory; compile and int8 are PyTorch switches.
# A row picks the figure `case` from the results of its jobs.
ROWS = [
    # id, group, sinter job, PyTorch job, torch.compile job
    ("gemm:256", "main", ("gemm:256", {}), ("gemm:256", {}), None),
    ("gemm:1024", "main", ("gemm:1024", {}), ("gemm:1024", {}), None),
    ("gemm:2048", "main", ("gemm:2048", {}), ("gemm:2048", {}), None),
    ("conv:forward", "main", ("conv", {}), ("conv", {}), None),
    ("conv:forward-backward", "main", ("conv", {}), ("conv", {}), None),
    ("cnn-step", "main", ("cnn-step", {}), ("cnn-step", {"init": "init-cnn"}), None),
    ("train", "main", ("train", {}), ("train", {"init": "init-cnn"}), None),
    ("gpt-step", "main", ("gpt-step", {}), ("gpt-step", {"init": "init-gpt"}), ("gpt-step", {"init": "init-gpt", "compile": True})),
    ("llama-step", "main", ("llama-step", {}), ("llama-step", {"init": "init-llama"}), ("llama-step", {"init": "init-llama", "compile": True})),
    ("gpt-forward", "main", ("gpt-forward", {"checkpoint": "gpt"}), ("gpt-forward", {"checkpoint": "gpt"}), None),
    ("generate:64", "main", ("generate", {"checkpoint": "gpt"}), ("generate:64", {"checkpoint": "gpt"}), None),
    ("generate:256", "main", ("generate", {"checkpoint": "gpt256"}), ("generate:256", {"checkpoint": "gpt256"}), None),
    ("cnn-infer:1", "main", ("cnn-infer:1", {"checkpoint": "cnn"}), ("cnn-infer:1", {"checkpoint": "cnn"}), None),
    ("cnn-infer:256", "main", ("cnn-infer:256", {"checkpoint": "cnn"}), ("cnn-infer:256", {"checkpoint": "cnn"}), None),
    ("linear:1", "main", ("linear:1", {}), ("linear:1", {}), None),
    ("linear:64", "main", ("linear:64", {}), ("linear:64", {}), None),
    # int8: sinter's quantized checkpoints (`sinter quantize`) beside PyTorch's dynamic
    # quantization (qint8 Linear layers) of the same f32 checkpoint.
    ("int8 generate:64", "int8", ("generate", {"checkpoint": "gpt-int8"}), ("generate:64", {"checkpoint": "gpt", "int8": True}), None),
    ("int8 cnn-infer:256", "int8", ("cnn-infer:256", {"checkpoint": "cnn-int8"}), ("cnn-infer:256", {"checkpoint": "cnn", "int8": True}), None),
    ("int8 linear:1", "int8", ("linear-int8:1", {}), ("linear:1", {"int8": True}), None),
    ("int8 linear:64", "int8", ("linear-int8:64", {}), ("linear:64", {"int8": True}), None),
    # OpenBLAS (issue 28 asks for ≥ 1.0× it): numpy's matmul, whose wheels bundle OpenBLAS, in
    # the "torch" column's place, in a process of its own. sinter's figure is the same round's
    # `gemm:N` job as the f32 row above (one process serves both rows).
    ("openblas gemm:256", "openblas", ("gemm:256", {}), ("gemm:256", {"numpy": True}), None),
    ("openblas gemm:1024", "openblas", ("gemm:1024", {}), ("gemm:1024", {"numpy": True}), None),
    ("openblas gemm:2048", "openblas", ("gemm:2048", {}), ("gemm:2048", {"numpy": True}), None),
]

# The table's groups: (group, heading, the other engine's column, its short name in the ratio).
GROUPS = (
    ("main", "f32", "PyTorch eager", "PyTorch"),
    ("int8", "int8 (issue 12): sinter's quantized checkpoints beside PyTorch's quantize_dynamic", "PyTorch eager", "PyTorch"),
    ("openblas", "f32 GEMM beside OpenBLAS (numpy's matmul; the wheels bundle OpenBLAS)", "OpenBLAS (numpy)", "OpenBLAS"),
)

INT8_MISSING = "not available yet: `sinter quantize` is not in this build (issue 12)"


def fmt_value(v, unit):
    if v is None:
        return "–"
    if unit in ("GFLOP/s",):
        return f"{v:.1f} {unit}"
    if unit in ("tokens/s", "samples/s"):
        return f"{v:,.0f} {unit}"
    if unit == "s":
        return f"{v:.2f} s"
    if unit == "ms":
        return f"{v:.2f} ms"
    if unit == "µs":
        return f"{v:.1f} µs"
    return f"{v:.4g} {unit}"


def sig(x, digits=6):
    """x rounded to `digits` significant digits (stable JSON)."""
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    return x


def shown(path):
    """A path as the table shows it: relative to the repository when inside it."""
    rel = os.path.relpath(path, ROOT)
    return path if rel.startswith("..") else rel


# ---- processes ------------------------------------------------------------------------------------


class Runner:
    def __init__(self, args):
        self.args = args
        self.rt = []
        self.policy = "normal (SCHED_OTHER)"
        if not args.no_rt:
            if subprocess.run(["chrt", "-f", "1", "true"], capture_output=True).returncode == 0:
                self.rt = ["chrt", "-f", "1"]
                self.policy = "real-time, chrt -f 1 (SCHED_FIFO 1)"
            else:
                print("vs-torch: chrt -f 1 is not permitted here (needs root or CAP_SYS_NICE); running at normal priority", file=sys.stderr)
        self.env = dict(os.environ)
        t = str(args.threads)
        self.env.update(RAYON_NUM_THREADS=t, OMP_NUM_THREADS=t, MKL_NUM_THREADS=t, OPENBLAS_NUM_THREADS=t,
                        TORCHINDUCTOR_CACHE_DIR=os.path.join(args.out, "inductor-cache"), PYTHONHASHSEED="0")
        self.logs = os.path.join(args.out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        self.count = 0

    def run(self, argv, name, timeout=None, rt=True):
        """(returncode, stdout, last lines of stderr, log path, seconds) of one process. Each
        process reports its own peak resident set (VmHWM) in its JSON."""
        self.count += 1
        log = os.path.join(self.logs, f"{self.count:03d}-{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.log")
        cmd = (self.rt if rt else []) + argv
        t0 = time.perf_counter()
        with open(log, "w") as err:
            err.write("$ " + shlex.join(cmd) + "\n")
            err.flush()
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=self.env, cwd=ROOT, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=timeout or self.args.timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                return -9, "", f"timed out after {timeout or self.args.timeout} s", shown(log), time.perf_counter() - t0
        dt = time.perf_counter() - t0
        with open(log) as f:
            tail = "".join(f.readlines()[-6:]).strip()
        return p.returncode, out.decode(errors="replace"), tail, shown(log), dt


# ---- the driver -------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        self.runner = Runner(args)
        self.work = os.path.join(args.out, "work")
        # The prepared runs belong to one build of sinter: a second run into the same --out
        # prepares them afresh (sinter train refuses an --out that already holds a run).
        if os.path.isdir(self.work):
            print(f"vs-torch: removing the previous run's prepared checkpoints in {shown(self.work)}", file=sys.stderr)
            shutil.rmtree(self.work)
        os.makedirs(self.work)
        self.prepared = {}  # name → directory
        self.prep_log = []  # {step, ok, seconds, error}
        self.facts = {}  # eval results etc.
        self.checks = []
        self.quantize = False

    # -- commands --
    def sinter(self, *a):
        return [self.args.sinter, *a]

    def torch_cmd(self, *a):
        return [self.args.python, os.path.join(HERE, "torch_side.py"), *a, "--json", "--threads", str(self.args.threads),
                "--cache", os.path.join(self.work, "cache")]

    def step(self, name, argv, produces=None, rt=True, timeout=None):
        """A preparation step; records it; returns stdout or None."""
        print(f"vs-torch: prepare {name}: {shlex.join(argv)}", file=sys.stderr)
        rc, out, tail, log, dt = self.runner.run(argv, "prep-" + name, timeout=timeout, rt=rt)
        ok = rc == 0
        self.prep_log.append({"step": name, "ok": ok, "seconds": round(dt, 1), "error": None if ok else f"exit {rc} (log {log})", "detail": None if ok else tail})
        if not ok:
            print(f"vs-torch: prepare {name} FAILED (exit {rc}, log {log}):\n{tail}", file=sys.stderr)
            return None
        if produces:
            self.prepared[produces] = os.path.join(self.work, produces)
        return out

    def prepare(self):
        a, w = self.args, self.work
        d = lambda n: os.path.join(w, n)  # noqa: E731
        self.step("cnn", self.sinter("train", "--quiet", "--device", "cpu", "--out", d("cnn")), "cnn")
        self.step("gpt", self.sinter("train", "--quiet", "--device", "cpu", "--model", "gpt-tiny", "--steps", str(a.gpt_steps), "--out", d("gpt")), "gpt")
        self.step("gpt256", self.sinter("train", "--quiet", "--device", "cpu", "--model", "gpt-tiny", "--context", "256", "--steps", str(a.gpt256_steps),
                                         "--eval-interval", str(a.gpt256_steps), "--out", d("gpt256")), "gpt256")
        self.step("init-cnn", self.sinter("bench", "cpu", "cnn-step", "--secs", "0.01", "--json", "--save-init", d("init-cnn")), "init-cnn")
        self.step("init-gpt", self.sinter("bench", "cpu", "gpt-step", "--secs", "0.01", "--json", "--save-init", d("init-gpt")), "init-gpt")
        self.step("llama", self.sinter("train", "--quiet", "--device", "cpu", "--model", "llama-tiny", "--steps", str(a.gpt256_steps * 6),
                                        "--eval-interval", str(a.gpt256_steps * 6), "--out", d("llama")), "llama")
        self.step("init-llama", self.sinter("bench", "cpu", "llama-step", "--secs", "0.01", "--json", "--save-init", d("init-llama")), "init-llama")
        rc, *_ = self.runner.run(self.sinter("quantize", "--help"), "probe-quantize", rt=False)
        self.quantize = rc == 0
        if self.quantize:
            for m in ("cnn", "gpt"):
                if m in self.prepared:
                    self.step(f"{m}-int8", self.sinter("quantize", "--checkpoint", d(m), "--out", d(f"{m}-int8")), f"{m}-int8")
        # What each side says of each checkpoint: sinter's own and quantized ones; PyTorch's
        # twin of the f32 ones and its quantize_dynamic of them.
        for m in ("cnn", "gpt", "gpt256", "llama", "cnn-int8", "gpt-int8"):
            src = m.replace("-int8", "")
            if m in self.prepared:
                out = self.step(f"sinter-eval-{m}", self.sinter("eval", "--checkpoint", d(m)))
                hit = re.search(r"validation loss ([0-9.eE+-]+|NaN|inf)(?:, accuracy ([0-9.]+)%)?", out or "")
                if hit:
                    acc = float(hit.group(2)) / 100 if hit.group(2) else None
                    self.facts[f"sinter eval {m}"] = {"val_loss": float(hit.group(1)), "val_accuracy": acc, "line": out.strip()}
            if src in self.prepared and m != "gpt256-int8":
                extra = ["--int8"] if m.endswith("-int8") else []
                res = parse_results(self.step(f"torch-eval-{m}", self.torch_cmd("eval", "--checkpoint", d(src), *extra)))
                if res and "eval" in res:
                    self.facts[f"torch eval {m}"] = {"val_loss": res["eval"]["val_loss"], "val_accuracy": res["eval"]["val_accuracy"]}
        # The first logged training loss of the default run (steps 1..log_interval).
        try:
            with open(os.path.join(d("cnn"), "metrics.jsonl")) as f:
                first = next(json.loads(l) for l in f if '"train_loss"' in l)
            self.facts["sinter train first logged loss"] = first["train_loss"]
        except (OSError, StopIteration, ValueError):
            pass

    def job_argv(self, engine, case, opts):
        """argv of a job, or (None, why) when a prepared input is missing."""
        extra = []
        for key in ("checkpoint", "init"):
            if key in opts:
                name = opts[key]
                if name not in self.prepared:
                    if name.endswith("-int8") and not self.quantize:
                        return None, INT8_MISSING
                    return None, f"not measured: preparing {name} failed (see the preparation log)"
                extra += [f"--{key}", self.prepared[name]]
        secs = str(self.args.secs)
        if engine == "sinter":
            return self.sinter("bench", "cpu", case, "--json", "--secs", secs, *extra), None
        flags = [f"--{k}" for k in ("compile", "int8", "numpy") if opts.get(k)]
        return self.torch_cmd(case, "--secs", secs, *extra, *flags), None

    def measure(self):
        """{(row id, side): [per-round {value, rss, error}]} over interleaved rounds."""
        sides = ("sinter", "torch", "torch_compile")
        rows = [r for r in ROWS if not self.args.rows or any(re.search(p, r[0]) for p in self.args.rows)]
        data = {(r[0], s): [] for r in rows for s in sides}
        for rnd in range(self.args.rounds):
            print(f"vs-torch: round {rnd + 1} of {self.args.rounds}", file=sys.stderr)
            cache = {}
            for rid, _, sj, tj, cj in rows:
                order = [("sinter", sj), ("torch", tj), ("torch_compile", cj)]
                if rnd % 2 == 1:  # alternate who goes first, so drift does not favour one side
                    order = [order[1], order[0], order[2]]
                for side, job in order:
                    if side == "torch_compile" and (job is None or self.args.no_compile):
                        continue
                    data[(rid, side)].append(self.run_job(side, job, rid, cache))
        return rows, data

    def run_job(self, side, job, rid, cache):
        if job is None:
            return {"error": "not measured: this engine has no such case"}
        case, opts = job
        engine = "sinter" if side == "sinter" else "torch"
        key = (engine, case, json.dumps(opts, sort_keys=True))
        if key not in cache:
            argv, why = self.job_argv(engine, case, opts)
            if argv is None:
                cache[key] = {"error": why}
            else:
                rc, out, tail, log, dt = self.runner.run(argv, f"{engine}-{case}")
                report = parse_report(out)
                if rc != 0 or report is None:
                    why = "no JSON report" if rc == 0 else f"exit {rc}"
                    cache[key] = {"error": f"failed ({why}; log {log})", "detail": tail}
                    print(f"vs-torch: {engine} {case} FAILED ({why}, log {log}):\n{tail}", file=sys.stderr)
                else:
                    cache[key] = {"report": report, "seconds": dt}
        got = cache[key]
        if "error" in got:
            return {k: v for k, v in got.items() if k in ("error", "detail")}
        want = rid.split(" ", 1)[-1]  # "int8 generate:64" → "generate:64"
        res = {r["case"]: r for r in got["report"]["results"]}
        if want not in res and case in res:  # the engine's own name for it ("linear-int8:1")
            want = case
        if want not in res:
            return {"error": f"{engine} gave no figure {want} (gave {', '.join(res)})"}
        r = res[want]
        rss = got["report"].get("peak_rss_bytes")
        return {"value": r["value"], "unit": r["unit"], "better": r["better"], "what": r["what"], "rss_mib": rss / 2**20 if rss else None, "result": r}


def parse_report(out):
    try:
        start = out.index("{")
        return json.loads(out[start:])
    except (ValueError, AttributeError):
        return None


def parse_results(out):
    rep = parse_report(out) if out else None
    return {r["case"]: r for r in rep["results"]} if rep else None


# ---- summary ------------------------------------------------------------------------------------


def summarise(rounds):
    ok = [r for r in rounds if "value" in r]
    if not ok:
        return {k: v for k, v in rounds[0].items() if k in ("error", "detail")} if rounds else {"error": "not run"}
    vals = [r["value"] for r in ok]
    rss = [r["rss_mib"] for r in ok if r.get("rss_mib")]
    s = {"median": statistics.median(vals), "rounds": vals, "unit": ok[0]["unit"], "better": ok[0]["better"], "what": ok[0]["what"],
         "peak_rss_mib": max(rss) if rss else None}
    if len(ok) < len(rounds):
        s["failed_rounds"] = [r["error"] for r in rounds if "error" in r]
    return s


def spread(side):
    """How far the rounds' medians lie apart: max / min − 1, as a percentage."""
    vals = [v for v in side.get("rounds", []) if v]
    if len(vals) < 2:
        return "–"
    return f"{100 * (max(vals) / min(vals) - 1):.0f} %"


def speed_ratio(a, b):
    """sinter's speed over the other's (> 1: sinter is faster), from medians."""
    if "median" not in a or "median" not in b or not a["median"] or not b["median"]:
        return None
    return a["median"] / b["median"] if a["better"] == "higher" else b["median"] / a["median"]


def check(bench, name, sinter_v, torch_v, tol, relative=False):
    if sinter_v is None or torch_v is None:
        bench.checks.append({"check": name, "sinter": sinter_v, "torch": torch_v, "tolerance": tol, "ok": None, "note": "not measured"})
        return
    diff = abs(sinter_v - torch_v) / (abs(sinter_v) if relative else 1.0)
    bench.checks.append({"check": name, "sinter": sinter_v, "torch": torch_v, "difference": diff, "tolerance": tol, "relative": relative, "ok": diff <= tol})


def equivalence(bench, table):
    """PyTorch's twins against sinter: same checkpoint → same loss; same initial weights and
    first batch → same first training loss; greedy generation → same tokens."""
    f = bench.facts
    for m in ("cnn", "gpt", "gpt256", "llama"):
        s, t = f.get(f"sinter eval {m}"), f.get(f"torch eval {m}")
        # `sinter eval` prints 4 decimals.
        check(bench, f"{m} checkpoint: validation loss (sinter eval vs PyTorch)", s and s["val_loss"], t and t["val_loss"], 2e-4)
        if m == "cnn":
            check(bench, "cnn checkpoint: validation accuracy", s and s["val_accuracy"], t and t["val_accuracy"], 1 / 360 + 1e-9)

    def first_round(rid, side, key):
        rounds = table.get((rid, side)) or []
        for r in rounds:
            if "result" in r and key in r["result"]:
                return r["result"][key]
        return None

    for rid in ("cnn-step", "gpt-step", "llama-step"):
        check(bench, f"{rid}: first step's loss from the same initial weights and batch", first_round(rid, "sinter", "loss_first"),
              first_round(rid, "torch", "loss_first"), 1e-4, relative=True)
    check(bench, "train: mean loss of the first logged steps (same weights, batches, optimizer, schedule)",
          f.get("sinter train first logged loss"), first_round("train", "torch", "first_logged_loss"), 1e-3, relative=True)
    for rid in ("generate:64", "generate:256"):
        s, t = first_round(rid, "sinter", "tokens"), first_round(rid, "torch", "tokens")
        if s and t:
            same = next((i for i, (x, y) in enumerate(zip(s, t)) if x != y), min(len(s), len(t)))
            bench.checks.append({"check": f"{rid}: greedy tokens identical (first difference at)", "sinter": len(s), "torch": len(t),
                                 "first_difference": same, "ok": None if same < len(s) else True,
                                 "note": "report only: a near-tie in the logits may flip one token, after which the texts differ"})


def machine():
    info = {"nproc": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        get = lambda k: (re.search(rf"^{k}\s*:\s*(.*)$", text, re.M) or [None, "?"])[1]  # noqa: E731
        flags = set(get("flags").split())
        keep = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"]
        info.update(model=get("model name"), family=get("cpu family"), model_number=get(r"model"), flags=[k for k in keep if k in flags])
    except OSError:
        info["model"] = platform.processor() or "unknown"
    try:
        with open("/proc/meminfo") as f:
            info["mem_gib"] = round(int(re.search(r"MemTotal:\s+(\d+)", f.read()).group(1)) / 2**20, 1)
    except (OSError, AttributeError):
        pass
    return info


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "?"


def cmd_out(argv):
    try:
        return subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def render(meta, bench, rows, summary):
    md = ["# sinter vs PyTorch on the CPU", ""]
    m = meta["machine"]
    md += [f"- date: {meta['date']}", f"- command: `{meta['command']}`",
           f"- machine: {m.get('model')} (family {m.get('family')}, model {m.get('model_number')}; {' '.join(m.get('flags', []))}), "
           f"{m['nproc']} CPUs, {m.get('mem_gib', '?')} GiB",
           f"- sinter: {meta['sinter']} (git {meta['git']}); PyTorch: {meta['torch']}; OpenBLAS rows: {meta.get('numpy_blas', '?')}",
           f"- {meta['threads']} threads per side (RAYON_NUM_THREADS, torch.set_num_threads); scheduling: {meta['policy']}",
           f"- instruction sets: {'capped to AVX2/FMA on both sides (--isa avx2)' if meta.get('isa') == 'avx2' else 'each engine picks the widest this CPU has'}",
           f"- {meta['rounds']} round(s), interleaved, {meta['secs']} s of repetitions per figure; medians of the rounds' medians "
           "(round spread: how far the rounds' medians lie apart, max / min − 1; a large one means other load got in)",
           f"- load average before: {meta['loadavg_before']}; after: {meta['loadavg_after']}",
           "- ratio = sinter's speed / PyTorch's (> 1: sinter is faster); memory = peak resident set of each process (VmHWM)", ""]
    for group, title, other, short in GROUPS:
        if not any(g == group for _, g, *_ in rows):
            continue
        md += [f"## {title}", "", f"| measure | sinter | {other} | torch.compile | sinter / {short} | peak RSS MiB sinter / {short} | round spread sinter / {short} |",
               "|---|---:|---:|---:|---:|---:|---:|"]
        for rid, g, *_ in rows:
            if g != group:
                continue
            s = summary[rid]
            what = next((x["what"] for x in (s["sinter"], s["torch"]) if "what" in x), rid)
            cell = lambda x: fmt_value(x["median"], x["unit"]) if "median" in x else f"{x.get('error', 'not run')}"  # noqa: E731
            comp = s.get("torch_compile")
            comp_cell = "" if comp is None else cell(comp) + (f" (×{s['ratio_compile']:.2f})" if s.get("ratio_compile") else "")
            ratio = f"**{s['ratio']:.2f}×**" if s.get("ratio") else "–"
            mem = " / ".join(f"{x['peak_rss_mib']:.0f}" if x.get("peak_rss_mib") else "–" for x in (s["sinter"], s["torch"]))
            md.append(f"| {what} | {cell(s['sinter'])} | {cell(s['torch'])} | {comp_cell} | {ratio} | {mem} | {spread(s['sinter'])} / {spread(s['torch'])} |")
        md.append("")
    md += ["## Accuracy of what was measured", "", "| run | sinter | PyTorch |", "|---|---|---|"]
    for name, key in (("default `train` (digits CNN), final validation loss / accuracy", "train"),):
        s = summary.get(key, {})
        cells = []
        for side in ("sinter", "torch"):
            rs = [r for r in bench_rounds(bench, key, side)]
            if rs:
                cells.append(" · ".join(f"{r['val_loss']:.4f} / {100 * r['val_accuracy']:.2f} %" for r in rs))
            else:
                cells.append(s.get(side, {}).get("error", "–"))
        md.append(f"| {name} (each round) | {cells[0]} | {cells[1]} |")
    f = bench.facts
    for m, label in (("cnn", "digits CNN checkpoint"), ("gpt", "gpt-tiny checkpoint, context 64"), ("gpt256", "gpt-tiny checkpoint, context 256"),
                     ("llama", "llama-tiny checkpoint, context 64"), ("cnn-int8", "digits CNN, int8"), ("gpt-int8", "gpt-tiny, int8")):
        s = f.get(f"sinter eval {m}")
        t = f.get(f"torch eval {m}")
        if not s and not t:
            continue
        val = lambda x: "–" if not x else f"{x['val_loss']:.4f}" + (f" / {100 * x['val_accuracy']:.2f} %" if x.get("val_accuracy") is not None else "")  # noqa: E731
        note = " (PyTorch: quantize_dynamic of the f32 checkpoint)" if m.endswith("int8") else " (PyTorch: the twin on sinter's weights)"
        md.append(f"| {label}: validation loss{' / accuracy' if m.startswith('cnn') else ''}{note} | {val(s)} | {val(t)} |")
    if not bench.quantize:
        md.append(f"| int8 models | {INT8_MISSING} | quantize_dynamic measured above |")
    md += ["", "## Equivalence checks (PyTorch's twins compute sinter's functions)", "", "| check | sinter | PyTorch | difference | tolerance | result |", "|---|---:|---:|---:|---:|---|"]
    for c in bench.checks:
        res = {True: "ok", False: "**FAILED**", None: c.get("note", "–")}[c["ok"]]
        if "first_difference" in c:
            md.append(f"| {c['check']} | {c['sinter']} tokens | {c['torch']} tokens | first difference at token {c['first_difference']} | – | {res} |")
            continue
        num = lambda x: "–" if x is None else f"{x:.6g}"  # noqa: E731
        tol = f"{c['tolerance']:.0e}{' rel.' if c.get('relative') else ''}"
        md.append(f"| {c['check']} | {num(c['sinter'])} | {num(c['torch'])} | {num(c.get('difference'))} | {tol} | {res} |")
    md += ["", "## Preparation", "", "| step | result | seconds |", "|---|---|---:|"]
    for p in bench.prep_log:
        md.append(f"| {p['step']} | {'ok' if p['ok'] else p['error']} | {p['seconds']} |")
    return "\n".join(md) + "\n"


def bench_rounds(bench, rid, side):
    return [r["result"] for r in bench.table.get((rid, side), []) if "result" in r and r["result"].get("val_loss") is not None]


def user_args(argv):
    """The command line less the --sinter / --python paths that bench/vs-torch/run adds."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in ("--sinter", "--python"):
            skip = True
        elif not a.startswith(("--sinter=", "--python=")):
            out.append(shlex.quote(a))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sinter", required=True, help="the release sinter binary")
    ap.add_argument("--python", default=sys.executable, help="Python with torch (default: this one)")
    ap.add_argument("--out", default=os.path.join(HERE, "out"))
    ap.add_argument("--quick", action="store_true", help="1 round, 0.3 s per figure, short GPT training, no torch.compile")
    ap.add_argument("--rounds", type=int, help="rounds of every row (default 5; --quick 1)")
    ap.add_argument("--secs", type=float)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--isa", choices=["native", "avx2"], default="native",
                    help="avx2: cap the engines to AVX2/FMA (SINTER_CPU_ISA, ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS, ONEDNN_MAX_CPU_ISA, OPENBLAS_CORETYPE=Haswell)")
    ap.add_argument("--gpt-steps", type=int, help="training steps of the gpt-tiny checkpoint (default 2000; --quick 60)")
    ap.add_argument("--gpt256-steps", type=int, help="training steps of the context-256 checkpoint (default 100; --quick 10)")
    ap.add_argument("--rows", nargs="*", help="regular expressions: only rows whose id matches one")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile column")
    ap.add_argument("--compile", action="store_true", help="measure torch.compile even with --quick")
    ap.add_argument("--no-rt", action="store_true", help="do not use chrt -f 1")
    ap.add_argument("--timeout", type=float, default=900, help="seconds before one process is killed")
    args = ap.parse_args()
    q = args.quick
    args.rounds = args.rounds or (1 if q else 5)
    args.secs = args.secs or (0.3 if q else 1.0)
    args.gpt_steps = args.gpt_steps or (60 if q else 2000)
    args.gpt256_steps = args.gpt256_steps or (10 if q else 100)
    args.no_compile = args.no_compile or (q and not args.compile)
    args.out = os.path.abspath(args.out)
    args.sinter = os.path.abspath(args.sinter)
    os.makedirs(args.out, exist_ok=True)

    if args.isa == "avx2":
        # Both engines capped to AVX2/FMA (and AVX2 int8, no VNNI) for every process started from
        # here: the machine of issue 10's "≥ 0.9× on a machine with only AVX2", emulated.
        os.environ.update(SINTER_CPU_ISA="avx2", SINTER_CPU_INT8="avx2", ATEN_CPU_CAPABILITY="avx2",
                          MKL_ENABLE_INSTRUCTIONS="AVX2", ONEDNN_MAX_CPU_ISA="AVX2", OPENBLAS_CORETYPE="Haswell")
    torch_version = cmd_out([args.python, "-c", "import torch; print(torch.__version__, '(' + torch.backends.cpu.get_cpu_capability() + ')')"]) or "not importable"
    blas_probe = "import numpy as np; c = np.show_config(mode='dicts')['Build Dependencies']['blas']; print('numpy', np.__version__, c['name'], c['version'])"
    numpy_blas = cmd_out([args.python, "-c", blas_probe]) or "numpy not importable"
    git = cmd_out(["git", "rev-parse", "--short", "HEAD"]) + (" + uncommitted changes" if cmd_out(["git", "status", "--porcelain", "--untracked-files=no"]) else "")
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["bench/vs-torch/run", *user_args(sys.argv[1:])]),
        "machine": machine(), "git": git or "?", "sinter": cmd_out([args.sinter, "--version"]) or "?", "torch": torch_version, "numpy_blas": numpy_blas,
        "threads": args.threads, "isa": args.isa, "rounds": args.rounds, "secs": args.secs, "gpt_steps": args.gpt_steps, "loadavg_before": loadavg(),
    }
    bench = Bench(args)
    meta["policy"] = bench.runner.policy
    t0 = time.perf_counter()
    bench.prepare()
    rows, table = bench.measure()
    bench.table = table
    meta["loadavg_after"] = loadavg()
    meta["seconds"] = round(time.perf_counter() - t0)
    summary = {}
    for rid, *_ in rows:
        s = {side: summarise(table[(rid, side)]) for side in ("sinter", "torch")}
        if table[(rid, "torch_compile")]:
            s["torch_compile"] = summarise(table[(rid, "torch_compile")])
            s["ratio_compile"] = speed_ratio(s["sinter"], s["torch_compile"])
        elif any(r[0] == rid and r[4] for r in rows):
            s["torch_compile"] = {"error": "skipped (--no-compile or --quick)"}
        s["ratio"] = speed_ratio(s["sinter"], s["torch"])
        summary[rid] = s
    equivalence(bench, table)
    md = render(meta, bench, rows, summary)
    print(md)
    doc = {"meta": meta, "preparation": bench.prep_log, "facts": bench.facts, "equivalence": bench.checks,
           "rows": [{"id": rid, "group": g, **summary[rid]} for rid, g, *_ in rows]}
    doc = json.loads(json.dumps(doc), parse_float=lambda s: sig(float(s)))
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(doc, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(md)
    print(f"vs-torch: wrote {shown(args.out)}/results.md and results.json in {meta['seconds']} s", file=sys.stderr)
    failed = [c["check"] for c in bench.checks if c["ok"] is False]
    if failed:
        print("vs-torch: equivalence FAILED: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
