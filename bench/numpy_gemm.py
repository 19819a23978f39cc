#!/usr/bin/env python3
"""numpy's float32 matmul throughput on this machine, the reference for sinter's GEMM bench.

Usage: python3 bench/numpy_gemm.py [--secs=S] [--times] N [N ...]

For each N: C = A @ B with A, B float32 N×N (a fresh C each call, as plain `a @ b` does), two
warm-up calls, then timed repetitions until S seconds (default 1) have passed (at least 3,
at most 200). Prints one parseable line per size:

    numpy_gemm n=1024 median_gflops=123.4 best_gflops=130.1 reps=20 blas="scipy-openblas 0.3.31 (core Haswell, 2 threads)"

With --times the line ends with times_s=T1,T2,... (every repetition, seconds), which the
Rust bench pools across rounds.

All cores are used: no thread limit is set here (OPENBLAS_NUM_THREADS etc. are honoured if the
caller sets them). Exit status 2 if numpy is missing, with the install command on stderr.
"""

import ctypes
import glob
import os
import statistics
import sys
import time


def blas_name(np):
    """A short BLAS description: build name and version, and, for OpenBLAS, the core type and
    thread count it picked at run time. Best effort: never fails."""
    name = "unknown BLAS"
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        name = f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:
        return name
    extra = []
    try:
        libdir = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
        for path in glob.glob(os.path.join(libdir, "*openblas*")):
            lib = ctypes.CDLL(path)
            for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
                core = getattr(lib, f"{prefix}_get_corename{suffix}", None)
                threads = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                if core is not None:
                    core.restype = ctypes.c_char_p
                    extra.append(f"core {core().decode()}")
                if threads is not None:
                    threads.restype = ctypes.c_int
                    extra.append(f"{threads()} threads")
                if extra:
                    break
            if extra:
                break
    except Exception:
        pass
    return f"{name} ({', '.join(extra)})" if extra else name


def measure(np, n, budget_s, min_reps=3, max_reps=200):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    for _ in range(2):
        c = a @ b
    del c
    times = []
    start = time.perf_counter()
    while len(times) < max_reps and (len(times) < min_reps or time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        c = a @ b
        times.append(time.perf_counter() - t0)
        del c
    return times


def main():
    budget_s, show_times, sizes = 1.0, False, []
    try:
        for arg in sys.argv[1:]:
            if arg == "--times":
                show_times = True
            elif arg.startswith("--secs="):
                budget_s = float(arg.split("=", 1)[1])
            else:
                sizes.append(int(arg))
    except ValueError:
        print(f"numpy_gemm: bad argument {arg!r}\n\n{__doc__.strip()}", file=sys.stderr)
        return 1
    if not sizes:
        print(__doc__.strip(), file=sys.stderr)
        return 1
    try:
        import numpy as np
    except ImportError:
        print("numpy_gemm: numpy is not installed; install it with: python3 -m pip install numpy", file=sys.stderr)
        return 2
    blas = blas_name(np).replace('"', "'")
    for n in sizes:
        times = measure(np, n, budget_s)
        flops = 2.0 * n * n * n
        line = (
            f"numpy_gemm n={n} median_gflops={flops / statistics.median(times) / 1e9:.2f} "
            f'best_gflops={flops / min(times) / 1e9:.2f} reps={len(times)} blas="{blas}"'
        )
        if show_times:
            line += " times_s=" + ",".join(f"{t:.6g}" for t in times)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
