#!/usr/bin/env python3
"""PyTorch's side of bench/vs-torch: the twin of each `sinter bench cpu` case, same JSON.

Usage: torch_side.py CASE [CASE ...] [--json] [--secs S] [--threads N] [--checkpoint DIR]
                     [--init DIR] [--tokens N] [--compile] [--int8] [--numpy] [--cache DIR]

Cases (as in crates/sinter/src/bench_cpu.rs): gemm:N, conv, cnn-step, gpt-step, llama-step, gpt-forward,
cnn-infer:B, generate[:T], train, plus eval (validation loss and accuracy of --checkpoint, as
`sinter eval` computes them) and linear:R (a 768→3072 Linear, GPT-2's MLP shape, on R rows).

--init DIR: a step-0 checkpoint from `sinter bench cpu … --save-init DIR`; cnn-step, gpt-step,
llama-step and train start from its weights with its run config (learning rate, weight decay, clipping,
batch, context, seed, schedule), on batches in sinter's order. --checkpoint DIR: the trained
sinter checkpoint that gpt-forward, cnn-infer, generate and eval load. --compile: the model
under torch.compile (gpt-step, llama-step, gpt-forward). --int8: torch.ao.quantization.quantize_dynamic
(qint8 Linear layers) on the model (cnn-infer, generate, eval, linear). --numpy: gemm through
numpy's matmul (numpy's wheels bundle OpenBLAS), the OpenBLAS rows of the table.
"""

import argparse
import json
import math
import statistics
import sys
import time
import warnings

import torch
import torch.nn as nn

import sinter_twin as twin


def time_it(warmup, budget, min_reps, f):
    """Seconds per call: `warmup` untimed calls, then calls until `budget` seconds have passed
    and at least `min_reps` were made (the loop of sinter's benches)."""
    for _ in range(warmup):
        f()
    times, start = [], time.perf_counter()
    while len(times) < min_reps or time.perf_counter() - start < budget:
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return times


def figure(case, what, value, unit, times, **extra):
    fig = dict(extra)
    fig.update(case=case, what=what, value=value, unit=unit, better="lower" if unit in ("ms", "µs", "s") else "higher",
               median_s=statistics.median(times), best_s=min(times), reps=len(times))
    return fig


def peak_rss_bytes():
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def need(path, flag, case):
    if not path:
        sys.exit(f"torch_side: case {case} needs {flag} DIR")
    return path


def maybe_int8(model, args):
    if not args.int8:
        return model
    with warnings.catch_warnings():
        # torch.ao.quantization is deprecated in favour of torchao, which is not installed here.
        warnings.simplefilter("ignore", DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def first_batches(n, batch, seed, count, cache):
    """The first `count` batches of sinter's shuffled loader over n examples (into later epochs)."""
    out, epoch = [], 0
    while len(out) < count:
        out.extend(twin.loader_batches(n, batch, seed, epoch, cache))
        epoch += 1
    return out[:count]


def train_data(config, cache):
    """(n, make(indices) → (x, y)) of a run config's training split."""
    if config["data"] == "digits":
        x, y, _, _ = twin.digits()
        return len(x), lambda idx: (x[idx], y[idx])
    if config["data"] == "shakespeare":
        tokens, _ = twin.shakespeare()
        t = int(config["context"])
        return len(tokens) - t, lambda idx: twin.windows(tokens, idx, t)
    sys.exit(f"torch_side: no twin of sinter's data {config['data']!r}")


def val_data(config):
    if config["data"] == "digits":
        _, _, x, y = twin.digits()
        return x, y
    if config["data"] == "shakespeare":
        _, tokens = twin.shakespeare()
        return twin.strided_windows(tokens, int(config["context"]))
    sys.exit(f"torch_side: no twin of sinter's data {config['data']!r}")


# ---- cases ------------------------------------------------------------------------------------


def gemm(n, args):
    g = torch.Generator().manual_seed(n)
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    if args.numpy:
        # numpy's own BLAS (the wheels bundle OpenBLAS), on contiguous float32 arrays.
        import numpy as np
        a, b = a.numpy(), b.numpy()
        mm = lambda: np.matmul(a, b)  # noqa: E731
        exact = lambda i: a[i].astype(np.float64) @ b.astype(np.float64)  # noqa: E731
    else:
        mm = lambda: a @ b  # noqa: E731
        exact = lambda i: (a[i].double() @ b.double()).numpy()  # noqa: E731
    i = n // 3
    want = torch.from_numpy(exact(i))
    got = torch.as_tensor(mm()[i]).double()
    if not torch.all((got - want).abs() <= 1e-4 * math.sqrt(n) * (1 + want.abs())):
        sys.exit(f"torch_side: gemm {n}³ is wrong")
    times = time_it(2, args.secs, 5, mm)
    return [figure(f"gemm:{n}", f"f32 GEMM {n}³", 2 * n**3 / statistics.median(times) / 1e9, "GFLOP/s", times)]


def conv(args):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(64, 32, 16, 16, generator=g)
    w = torch.randn(64, 32, 3, 3, generator=g) * 0.1
    f = torch.nn.functional.conv2d
    passes = 2.0 * 64 * 64 * 16 * 16 * 32 * 9
    # As sinter's case: ten warm-up calls, a random output gradient.
    fwd = time_it(10, args.secs, 5, lambda: f(x, w, padding=1))
    xv, wv = x.clone().requires_grad_(), w.clone().requires_grad_()
    dy = torch.randn(64, 64, 16, 16, generator=g)

    def both():
        xv.grad = wv.grad = None
        f(xv, wv, padding=1).backward(dy)

    bwd = time_it(10, args.secs, 5, both)
    what = "conv2d 64×32×16×16 ∗ 64×32×3×3, pad 1"
    return [
        figure("conv:forward", f"{what}, forward", passes / statistics.median(fwd) / 1e9, "GFLOP/s", fwd),
        figure("conv:forward-backward", f"{what}, forward + backward", 3 * passes / statistics.median(bwd) / 1e9, "GFLOP/s", bwd),
    ]


def train_step(case, args):
    model, config = twin.load_model(need(args.init, "--init", case))
    model.train()
    opt = twin.adamw(model, config["lr"], config["weight_decay"])
    clip = config.get("grad_clip")
    n, make = train_data(config, args.cache)
    batch = int(config["batch_size"])
    data = [make(idx) for idx in first_batches(n, batch, int(config["seed"]), 32, args.cache)]
    run = torch.compile(model) if args.compile else model
    params = list(model.parameters())
    i = 0

    def step():
        nonlocal i
        x, y = data[i % len(data)]
        i += 1
        loss = twin.mean_loss(run, x, y)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    t0 = time.perf_counter()
    first = float(step())
    first_call_s = time.perf_counter() - t0
    times = time_it(2, args.secs, 5, step)
    last = float(step())
    lm = config["model"] != "cnn"
    items = batch * (int(config["context"]) if lm else 1)
    rate = items / statistics.median(times)
    extra = dict(loss_first=first, loss_last=last, items_per_s=rate, first_call_s=first_call_s,
                 parameters=sum(p.numel() for p in params), compiled=bool(args.compile))
    if lm:
        what = f"{config['model']} training step, {batch}×{config['context']}"
        return [figure(case, what, rate, "tokens/s", times, **extra)]
    what = f"{config['model']} training step on {config['data']}, batch {batch}"
    return [figure(case, what, statistics.median(times) * 1e3, "ms", times, **extra)]


def gpt_forward(args):
    model, config = twin.load_model(need(args.checkpoint, "--checkpoint", "gpt-forward"))
    model.eval()
    n, make = train_data(config, args.cache)
    x, _ = make(first_batches(n, int(config["batch_size"]), int(config["seed"]), 1, args.cache)[0])
    run = torch.compile(model) if args.compile else model
    with torch.inference_mode():
        times = time_it(3, args.secs, 5, lambda: run(x))
    b, t = x.shape
    return [figure("gpt-forward", f"{config['model']} forward only, {b}×{t}", statistics.median(times) * 1e3, "ms", times, compiled=bool(args.compile))]


def cnn_infer(batch, args):
    model, config = twin.load_model(need(args.checkpoint, "--checkpoint", "cnn-infer"))
    model = maybe_int8(model.eval(), args)
    x_val, y_val = val_data(config)
    if batch > len(x_val):
        sys.exit(f"torch_side: cnn-infer:{batch}: the validation split has only {len(x_val)} images")
    x, y = x_val[:batch], y_val[:batch]
    with torch.inference_mode():
        times = time_it(5, args.secs, 5, lambda: model(x))
        acc = float((model(x).argmax(-1) == y).float().mean())
    m = statistics.median(times)
    if batch == 1:
        what = f"{config['model']} inference on {config['data']}, batch 1 (latency)"
        return [figure("cnn-infer:1", what, m * 1e6, "µs", times, batch_accuracy=acc, int8=args.int8)]
    what = f"{config['model']} inference on {config['data']}, batch {batch} (throughput)"
    return [figure(f"cnn-infer:{batch}", what, batch / m, "samples/s", times, batch_accuracy=acc, int8=args.int8)]


def generate(context, args):
    model, config = twin.load_model(need(args.checkpoint, "--checkpoint", "generate"))
    ctx = int(config["context"])
    if context and context != ctx:
        sys.exit(f"torch_side: the checkpoint has context {ctx}, not {context}")
    model = maybe_int8(model.eval(), args)
    prompt, out = [ord("\n")], []

    def gen():
        out[:] = model.generate_greedy(prompt, args.tokens, ctx)

    times = time_it(1, args.secs, 3, gen)
    what = f"{config['model']} greedy generation of {args.tokens} tokens, context {ctx}, KV cache"
    return [figure(f"generate:{ctx}", what, args.tokens / statistics.median(times), "tokens/s", times,
                   context=ctx, tokens=list(out), int8=args.int8)]


def evaluate(args):
    model, config = twin.load_model(need(args.checkpoint, "--checkpoint", "eval"))
    model = maybe_int8(model, args)
    x, y = val_data(config)
    t0 = time.perf_counter()
    loss, acc = twin.evaluate(model, x, y, int(config["batch_size"]))
    dt = time.perf_counter() - t0
    return [figure("eval", f"{config['model']} on {config['data']}: validation loss", loss, "nats", [dt],
                   val_loss=loss, val_accuracy=acc, examples=len(x), int8=args.int8)]


def linear(rows, args):
    g = torch.Generator().manual_seed(rows)
    layer = nn.Linear(768, 3072)
    x = torch.randn(rows, 768, generator=g)
    layer = maybe_int8(layer.eval(), args)
    with torch.inference_mode():
        times = time_it(5, args.secs, 5, lambda: layer(x))
    kind = "int8 dynamic" if args.int8 else "f32"
    return [figure(f"linear:{rows}", f"Linear 768→3072 ({kind}), {rows} row(s)", statistics.median(times) * 1e6, "µs", times, int8=args.int8)]


def whole_train(args):
    """sinter's training loop on the twin: the init checkpoint's weights and config, batches in
    sinter's order epoch by epoch (drop_last), the schedule per step, the loss read every
    log_interval steps, an evaluation after every epoch (eval_interval 0)."""
    model, c = twin.load_model(need(args.init, "--init", "train"))
    if int(c.get("eval_interval", 0)) != 0 or c.get("grad_accum", 1) != 1 or c["optimizer"] != "adamw":
        sys.exit("torch_side: train mirrors the default run (adamw, evaluation per epoch, no accumulation)")
    if c["data"] != "digits":
        sys.exit(f"torch_side: train has a twin for the digits only, not {c['data']!r}")
    x_tr, y_tr, x_val, y_val = twin.digits()
    batch, seed = int(c["batch_size"]), int(c["seed"])
    per_epoch = len(x_tr) // batch
    total = int(c["epochs"]) * per_epoch if c.get("epochs") else int(c["steps"])
    orders = [twin.loader_batches(len(x_tr), batch, seed, e) for e in range(math.ceil(total / per_epoch))]
    opt = twin.adamw(model, c["lr"], c["weight_decay"])
    params, clip, log_every = list(model.parameters()), c.get("grad_clip"), int(c["log_interval"])
    model.train()
    first_window, window, evals = None, torch.zeros(()), []
    t0 = time.perf_counter()
    for step in range(total):
        for g in opt.param_groups:
            g["lr"] = twin.lr_at(c["lr_schedule"], c["lr"], step, total)
        idx = torch.tensor(orders[step // per_epoch][step % per_epoch])
        loss = twin.mean_loss(model, x_tr[idx], y_tr[idx])
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        window += loss.detach()
        done = step + 1
        if done % log_every == 0 or done == total:
            if first_window is None:
                first_window = float(window) / log_every
            window.zero_()
            last = float(loss)
        if done % per_epoch == 0 or done == total:
            evals.append(twin.evaluate(model, x_val, y_val, batch))
    wall = time.perf_counter() - t0
    val_loss, val_acc = evals[-1]
    what = f"default `sinter train` ({c['model']} on {c['data']}, {total} steps), in-process"
    return [figure("train", what, wall, "s", [wall], val_loss=val_loss, val_accuracy=val_acc, train_loss=last,
                   first_logged_loss=first_window, steps=total)]


def numpy_blas():
    """numpy's BLAS, as its build configuration and threadpool name it (for the report)."""
    import numpy as np
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"numpy {np.__version__}, {cfg.get('name')} {cfg.get('version')}"
    except Exception as e:  # older numpy: no mode="dicts"
        return f"numpy {np.__version__} (BLAS not named: {e})"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="+")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--secs", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--checkpoint")
    ap.add_argument("--init")
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--numpy", action="store_true", help="gemm through numpy's BLAS (OpenBLAS in the wheels) instead of torch")
    ap.add_argument("--cache", help="directory for cached shuffle orders")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []
    for case in args.cases:
        name, _, p = case.partition(":")
        param = int(p) if p else None
        if name == "gemm":
            results += [r for n in ([param] if param else [256, 1024, 2048]) for r in gemm(n, args)]
        elif name == "conv":
            results += conv(args)
        elif name in ("cnn-step", "gpt-step", "llama-step"):
            results += train_step(name, args)
        elif name == "gpt-forward":
            results += gpt_forward(args)
        elif name == "cnn-infer":
            results += [r for b in ([param] if param else [1, 256]) for r in cnn_infer(b, args)]
        elif name == "generate":
            results += generate(param, args)
        elif name == "train":
            results += whole_train(args)
        elif name == "eval":
            results += evaluate(args)
        elif name == "linear":
            results += [r for n in ([param] if param else [1, 64]) for r in linear(n, args)]
        else:
            sys.exit(f"torch_side: unknown case {case!r}")
    report = {
        "engine": f"PyTorch {torch.__version__}",
        "blas": numpy_blas() if args.numpy else None,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "quantized_engine": torch.backends.quantized.engine,
        "peak_rss_bytes": peak_rss_bytes(),
        "results": results,
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False))
    else:
        for r in results:
            print(f"{r['case']:24} {r['value']:12.4f} {r['unit']:10} {r['what']}")
        print(f"peak resident memory: {report['peak_rss_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
