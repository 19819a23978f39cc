#!/usr/bin/env python3
"""bench/gpu/ncu_summary.py — GPU time per kernel from an Nsight Compute CSV log.

    ncu --metrics gpu__time_duration.sum --csv --log-file ncu.csv PROGRAM ARGS...
    python3 bench/gpu/ncu_summary.py ncu.csv [--top 40] [--divide STEPS]

Groups the launches by kernel name (template arguments and parameter lists cut off), and prints
each group's total GPU time, launch count and share, largest first. ncu serialises kernels, so the
sum is pure kernel time: the gap to a step's wall time is launch and host overhead.
"""
import argparse
import csv
import collections
import re
import sys

UNIT = {"nsecond": 1e-9, "usecond": 1e-6, "msecond": 1e-3, "second": 1.0}


def short(name):
    name = re.sub(r"\(.*$", "", name)  # parameter list
    name = re.sub(r"^void ", "", name)
    depth, out = 0, []
    for ch in name:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--divide", type=float, default=1.0, help="divide the totals (e.g. by the step count)")
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prefixes its own messages with ==PROF==
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        value = float(r["Metric Value"].replace(",", ""))
        rows.append((short(r["Kernel Name"]), value * UNIT.get(r["Metric Unit"], 1e-9)))
    if not rows:
        sys.exit(f"ncu_summary: no gpu__time_duration.sum rows in {a.csv}")
    total = collections.defaultdict(float)
    count = collections.Counter()
    for name, t in rows:
        total[name] += t
        count[name] += 1
    all_t = sum(total.values())
    print(f"{len(rows)} launches, {all_t * 1e3 / a.divide:.2f} ms of kernel time (per {a.divide:g})")
    print(f"{'ms':>10} {'share':>6} {'launches':>9} {'µs each':>9}  kernel")
    for name, t in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"{t * 1e3 / a.divide:10.3f} {100 * t / all_t:5.1f}% {count[name] / a.divide:9.0f} "
              f"{t * 1e6 / count[name]:9.1f}  {name}")


if __name__ == "__main__":
    main()
