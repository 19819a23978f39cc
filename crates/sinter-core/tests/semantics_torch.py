#!/usr/bin/env python3
"""Prints PyTorch's values for sinter's semantics tests (issue 14).

The expected values in crates/sinter-core/tests/semantics.rs, crates/sinter-types/src/op.rs,
crates/sinter-cuda/tests/emulated_numerics.rs, crates/sinter-nn/tests/pytorch_layers.rs and
crates/sinter-models/tests/hf_bert_config.rs were copied from this script's output
(PyTorch 2.15.0, CPU). Run it with any Python that has torch:

    python3 crates/sinter-core/tests/semantics_torch.py

Not run by CI (CI has no torch); a changed expectation must come from a new run of this script.
"""

import torch

F = torch.nn.functional
nan, inf = float("nan"), float("inf")


def show(name, value):
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    print(f"{name}: {value!r}")


def error(name, f):
    try:
        f()
        show(name, "no error")
    except Exception as e:  # noqa: BLE001 - the message is what we record
        show(name, f"{type(e).__name__}: {str(e).splitlines()[0]}")


print("torch", torch.__version__)

print("\n# cross-entropy precision (float64)")
x = torch.tensor([[88.0] + [80.0] * 9], dtype=torch.float64)
show("ce target 0", F.cross_entropy(x, torch.tensor([0])).item())
show("ce target 1", F.cross_entropy(x, torch.tensor([1])).item())
show("ce target 0, float32", F.cross_entropy(x.float(), torch.tensor([0])).item())

print("\n# NaN")
show("relu([nan, -1, 2, -0.0])", torch.relu(torch.tensor([nan, -1.0, 2.0, -0.0])))
xr = torch.tensor([nan, -1.0, 2.0], requires_grad=True)
torch.relu(xr).sum().backward()
show("relu grad at [nan, -1, 2]", xr.grad)
a, b = torch.tensor([nan, 1.0, 2.0]), torch.tensor([1.0, nan, 1.0])
show("maximum", torch.maximum(a, b))
show("minimum", torch.minimum(a, b))
show("max([1, nan, 3])", torch.tensor([1.0, nan, 3.0]).max(0))
show("min([nan, 1, 0.5])", torch.tensor([nan, 1.0, 0.5]).min(0))
m32 = torch.tensor([1.0, 3.0, 3.0, nan, 3.0, 5.0]).reshape(3, 2)
show("[3,2] max(0)", m32.max(0).values)
show("[3,2] min(0)", m32.min(0).values)
show("argmax([1, nan, 3])", torch.tensor([1.0, nan, 3.0]).argmax())
show("argmax([1, nan, 3, nan])", torch.tensor([1.0, nan, 3.0, nan]).argmax())
show("argmax([1, 3, 3])", torch.tensor([1.0, 3.0, 3.0]).argmax())
for w in ([1.0, 2.0, nan, 0.0], [nan, 1.0, nan, 0.0], [nan, 5.0, 1.0, 0.0]):
    t = torch.tensor(w).reshape(1, 1, 2, 2).requires_grad_()
    y, i = F.max_pool2d(t, 2, return_indices=True)
    y.sum().backward()
    show(f"max_pool2d {w}", (y.item(), i.item(), t.grad.flatten().tolist()))

print("\n# i64")
show("sum([16777217, 0, 1])", torch.tensor([16777217, 0, 1]).sum().item())
show("max([2^53 + 1, 2^53])", torch.tensor([2**53 + 1, 2**53]).max().item())
show("argmax([100000001, 100000002, 100000003])", torch.tensor([100000001, 100000002, 100000003]).argmax().item())
error("softmax(i64)", lambda: torch.softmax(torch.tensor([1, 2]), 0))
error("log_softmax(i64)", lambda: torch.log_softmax(torch.tensor([1, 2]), 0))
show("[[1, 2], [3, 4]] @ [[5], [2^40]]", torch.tensor([[1, 2], [3, 4]]) @ torch.tensor([[5], [2**40]]))
show("[[2^62, 2^62]] @ [[2], [1]]", torch.tensor([[2**62, 2**62]]) @ torch.tensor([[2], [1]]))

print("\n# division")
ia, ib = torch.tensor([-7, 7]), torch.tensor([2, -2])
show("[-7, 7] / [2, -2]", (ia / ib, str((ia / ib).dtype)))
show("[-7, 7] // [2, -2]", ia // ib)
show("[1, 0, -1] / 0", torch.tensor([1, 0, -1]) / torch.tensor([0, 0, 0]))
error("[1, 0, -1] // 0", lambda: torch.tensor([1, 0, -1]) // torch.tensor([0, 0, 0]))
show("[6, -6, 5, -5, 0] // [-3, -3, 3, 3, -3]", torch.tensor([6, -6, 5, -5, 0]) // torch.tensor([-3, -3, 3, 3, -3]))
show("i64::MIN // -1", (torch.tensor([-(2**63)]) // torch.tensor([-1])).item())
fa = [-7.5, 7.0, 5.0, -0.0, 1e-30, 0.3, -0.3, 1.0, 0.0, -1.0, 1.0, -1.0]
fb = [2.0, -2.0, 0.1, 3.0, -1.0, 0.1, 0.1, 0.0, 0.0, 0.0, -0.0, -0.0]
for dt in (torch.float32, torch.float64):
    r = torch.floor_divide(torch.tensor(fa, dtype=dt), torch.tensor(fb, dtype=dt))
    show(f"floor_divide {dt}", [repr(float(v)) for v in r])

print("\n# empty tensors")
show("zeros(0, 3).mean(0)", torch.zeros(0, 3).mean(0))
show("zeros(0, 3).mean()", torch.zeros(0, 3).mean().item())
show("zeros(0, 3).sum(0)", torch.zeros(0, 3).sum(0))
for shape in ((0, 3), (3, 0)):
    for dim in (0, 1):
        show(f"softmax(zeros{shape}, {dim}).shape", tuple(torch.softmax(torch.zeros(shape), dim).shape))
error("sum((0, 0))", lambda: torch.ones(2, 3).sum((0, 0)))
error("sum((0, -2))", lambda: torch.ones(2, 3).sum((0, -2)))
bn = torch.nn.BatchNorm2d(3).train()
error("BatchNorm2d train [1, 3, 1, 1]", lambda: bn(torch.ones(1, 3, 1, 1)))

print("\n# AdamW (float32)")
p = torch.tensor([0.5, -1.25, 2.0, 0.0], requires_grad=True)
opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
for g in ([0.1, -0.2, 3.0, 1e-3], [-0.3, 0.05, 2.5, 0.0]):
    p.grad = torch.tensor(g)
    opt.step()
    st = opt.state[p]
    show("p", [float(v) for v in p.detach()])
    show("m", [float(v) for v in st["exp_avg"]])
    show("v", [float(v) for v in st["exp_avg_sq"]])

print("\n# matmul of vectors, promotion")
a = torch.tensor([1.0, 2.0, 3.0])
mat = torch.tensor([[1.0, 0.5], [-1.0, 2.0], [0.25, 4.0]])
show("vec @ mat", a @ mat)
show("mat.T @ vec", mat.T @ a)
show("vec @ vec", (a @ a).item())
show("vec @ batch", a @ torch.arange(24.0).reshape(2, 3, 4))
show("batch @ vec shape", tuple((torch.arange(24.0).reshape(2, 3, 4) @ torch.tensor([1.0, -1.0, 2.0, 0.5])).shape))
error("[3] @ [2]", lambda: a @ torch.tensor([1.0, 2.0]))
show("i64 + f32", torch.tensor([1, 2]) + torch.tensor([0.5, 0.25]))
show("f32 - i64", torch.tensor([0.5]) - torch.tensor([2]))
show("i64 * f16 dtype", str((torch.tensor([3]) * torch.tensor([0.5], dtype=torch.float16)).dtype))
show("i64 * bf16 dtype", str((torch.tensor([3]) * torch.tensor([0.5], dtype=torch.bfloat16)).dtype))
show("i64 < f32", torch.tensor([1, 2]) < torch.tensor([1.5, 1.5]))

print("\n# bool dtype")
x = torch.tensor([nan, 1.0, 2.0, nan])
y = torch.tensor([nan, 1.0, nan, 0.0])
show("eq dtype", str((x == y).dtype))
for name, op in [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt), ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)]:
    show(f"{name} nan", op(x, y))
v = torch.tensor([0.0, -0.0, 0.5, -2.0, nan, inf])
show("to bool", v.bool())
show("bool to f32", torch.tensor([True, False]).float())
m = torch.tensor([True, False, True, True])
n = torch.tensor([True, True, False, False])
show("bool + bool", m + n)
show("bool * bool", m * n)
error("bool - bool", lambda: m - n)
show("bool / bool dtype", str((m / n).dtype))
show("bool + i64", m + torch.tensor([1, 2, 3, 4]))
show("bool + i64 dtype", str((m + torch.tensor([1, 2, 3, 4])).dtype))
show("bool + f16 dtype", str((m + torch.tensor([0.5], dtype=torch.float16)).dtype))
show("bool sum", m.sum())
show("bool sum dtype", str(m.sum().dtype))
error("bool mean", lambda: m.mean())
show("logical_and", torch.logical_and(torch.tensor([0.0, nan, 2.0, 0.0]), torch.tensor([1, 1, 0, 0])))
show("logical_or", torch.logical_or(torch.tensor([0.0, nan, 2.0, 0.0]), torch.tensor([1, 1, 0, 0])))
show("logical_xor", torch.logical_xor(torch.tensor([0.0, nan, 2.0, 0.0]), torch.tensor([1, 1, 0, 0])))
show("logical_not", torch.logical_not(torch.tensor([0.0, nan, -0.0, 3.0])))
show("any([])", torch.tensor([], dtype=torch.bool).any())
show("all([])", torch.tensor([], dtype=torch.bool).all())
show("any dim of [2, 0]", torch.zeros(2, 0).any(1))
show("all dim of [2, 0]", torch.zeros(2, 0).all(1))
show("where", torch.where(m, torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor(-1.0)))
error("where with a float condition", lambda: torch.where(torch.tensor([1.0, 0.0]), torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])))
error("masked_fill with a float mask", lambda: torch.tensor([1.0, 2.0]).masked_fill(torch.tensor([1.0, 0.0]), 0.0))
show("where promotes", str(torch.where(m, torch.tensor([1, 2, 3, 4]), torch.tensor([0.5] * 4)).dtype))

print("\n# layers")
e = torch.nn.Embedding(4, 3, padding_idx=0)
show("Embedding padding row at init", e.weight[0])
with torch.no_grad():
    e.weight.copy_(torch.tensor([[0.5, -0.25, 1.0], [1.0, 2.0, 3.0], [-1.0, 0.0, 1.0], [0.1, 0.2, 0.3]]))
y = e(torch.tensor([[0, 2, 0, 1]]))
(y * torch.arange(12.0).reshape(1, 4, 3)).sum().backward()
show("Embedding lookup", y)
show("Embedding grad", e.weight.grad)
show("Embedding(padding_idx=-1).padding_idx", torch.nn.Embedding(4, 3, padding_idx=-1).padding_idx)
error("Embedding(padding_idx=4)", lambda: torch.nn.Embedding(4, 3, padding_idx=4))
xs = torch.tensor([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0], dtype=torch.float64)
show("GELU()", torch.nn.GELU()(xs))
show("GELU(tanh)", torch.nn.GELU(approximate="tanh")(xs))

print("\n# issue 30 (semantics.rs computes these references in f64 itself; this is PyTorch's word)")
x = torch.tensor([[1000.0, 990.0, 990.0, 990.0]], dtype=torch.float64, requires_grad=True)
F.cross_entropy(x, torch.tensor([0])).backward()
show("ce grad [1000, 990, 990, 990], target 0", x.grad)
x = torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.5, 4.0]], requires_grad=True)
loss = F.cross_entropy(x, torch.tensor([-100, -100]), label_smoothing=0.1)
loss.backward()
show("label smoothing 0.1, every target ignored: loss", loss.item())
show("label smoothing 0.1, every target ignored: grad", x.grad)
x = torch.tensor([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]], requires_grad=True)
x.std(1).sum().backward()
show("std(1) grad of [[2, 2, 2], [1, 2, 4]]", x.grad)
show("log_softmax [88, 80 x 9] (float64)", F.log_softmax(torch.tensor([[88.0] + [80.0] * 9], dtype=torch.float64), -1))
w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
w.grad = torch.tensor([1.0, nan])
error("clip_grad_norm_(error_if_nonfinite=True) of a NaN gradient", lambda: torch.nn.utils.clip_grad_norm_([w], 1.0, error_if_nonfinite=True))
