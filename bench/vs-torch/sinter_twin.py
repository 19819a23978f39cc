"""PyTorch twins of what sinter computes, for bench/vs-torch (imported, not run).

* sinter's seeded shuffles (crates/sinter-data/src/rng.rs: SplitMix64, xoshiro256**,
  Lemire's bounded integers, Fisher–Yates), so batches come in sinter's order;
* its bundled data: the digits split (fixed seeded permutation, 80 % train) and tiny
  Shakespeare as bytes (first 90 % train as sliding windows, last 10 % validation as
  non-overlapping windows);
* its models with its parameter names, so a sinter checkpoint loads with ``strict=True``:
  ``LeNet`` (crates/sinter-models/src/cnn.rs) and ``Gpt`` (gpt.rs with sinter-nn's
  attention.rs: pre-norm blocks, fused qkv split q|k|v then heads, causal attention scaled by
  1/√head_dim, GELU in its tanh form, LayerNorm eps 1e-5, head tied to the token embedding);
* its checkpoints: a dependency-free safetensors reader; ``model.<name>`` tensors and the run's
  config from the metadata;
* its optimizer and schedule: AdamW (β 0.9/0.999, eps 1e-8, decoupled decay on tensors of
  rank ≥ 2 only) and the cosine schedule with linear warm-up (sinter-nn/src/schedule.rs);
* its generation: greedy decoding with a KV cache over the last ``context`` tokens; once the
  sequence is longer than the context the window is recomputed (crates/sinter-models/src/gpt.rs,
  ``generate_with``), so both engines compute the same tokens.
"""

import gzip
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# ---- sinter's seeded shuffles ------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _splitmix(state):
    """One SplitMix64 step: (new state, output)."""
    state = (state + 0x9E3779B97F4A7C15) & _M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return state, z ^ (z >> 31)


def _rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & _M64


def shuffle(items, seed):
    """sinter_data::rng::shuffle: Fisher–Yates driven by xoshiro256** seeded by SplitMix64."""
    st, s = seed, []
    for _ in range(4):
        st, z = _splitmix(st)
        s.append(z)
    s0, s1, s2, s3 = s
    for i in range(len(items) - 1, 0, -1):
        bound = i + 1
        threshold = None
        while True:
            r = (_rotl((s1 * 5) & _M64, 7) * 9) & _M64
            t = (s1 << 17) & _M64
            s2 ^= s0
            s3 ^= s1
            s1 ^= s2
            s0 ^= s3
            s2 ^= t
            s3 = _rotl(s3, 45)
            m = r * bound
            if (m & _M64) >= bound:
                break
            if threshold is None:
                threshold = ((-bound) & _M64) % bound
            if (m & _M64) >= threshold:
                break
        j = m >> 64
        items[i], items[j] = items[j], items[i]
    return items


def epoch_seed(seed, epoch):
    """sinter_data::rng::epoch_seed."""
    _, base = _splitmix(seed ^ 0x7369_6E74_6572_2D44)
    return _splitmix(base ^ epoch)[1]


def epoch_order(n, seed, epoch):
    """The order in which a shuffled DataLoader over n examples visits epoch `epoch`."""
    return shuffle(list(range(n)), epoch_seed(seed, epoch))


def loader_batches(n, batch, seed, epoch, cache_dir=None):
    """Index lists of the batches of one shuffled epoch with drop_last (one rank), as sinter's
    DataLoader makes them. Large orders (1M windows take seconds in Python) are cached."""
    path = None
    if cache_dir:
        path = os.path.join(cache_dir, f"order-n{n}-seed{seed}-epoch{epoch}.json")
        if os.path.exists(path):
            with open(path) as f:
                order = json.load(f)
            return [order[k * batch:(k + 1) * batch] for k in range(n // batch)]
    order = epoch_order(n, seed, epoch)
    if path:
        os.makedirs(cache_dir, exist_ok=True)
        with open(path + ".tmp", "w") as f:
            json.dump(order, f)
        os.replace(path + ".tmp", path)
    return [order[k * batch:(k + 1) * batch] for k in range(n // batch)]


# ---- bundled data ------------------------------------------------------------------------------

DIGITS_SPLIT_SEED = 0x0D16_1757_0001


def digits():
    """(x_train, y_train, x_val, y_val): [n, 1, 8, 8] f32 pixels/16 and i64 labels."""
    with gzip.open(os.path.join(ROOT, "data", "digits.csv.gz"), "rt") as f:
        rows = [[int(v) for v in line.split(",")] for line in f if line.strip()]
    pixels = torch.tensor([r[:64] for r in rows], dtype=torch.float32) / 16.0
    labels = torch.tensor([r[64] for r in rows], dtype=torch.int64)
    order = torch.tensor(shuffle(list(range(len(rows))), DIGITS_SPLIT_SEED))
    n_train = len(rows) * 4 // 5
    tr, va = order[:n_train], order[n_train:]
    x = pixels.view(-1, 1, 8, 8)
    return x[tr].contiguous(), labels[tr].contiguous(), x[va].contiguous(), labels[va].contiguous()


def shakespeare():
    """(train, val) byte tokens as i64 tensors: first 90 % and last 10 %."""
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), "rb") as f:
        data = f.read()
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(torch.int64)
    cut = len(data) * 9 // 10
    return tokens[:cut].clone(), tokens[cut:].clone()


def windows(tokens, starts, t):
    """(x, y) [len(starts), t]: tokens[s:s+t] and the next tokens."""
    idx = torch.as_tensor(starts, dtype=torch.int64)[:, None] + torch.arange(t)[None, :]
    return tokens[idx], tokens[idx + 1]


def strided_windows(tokens, t):
    """The validation windows: non-overlapping, (n − 1) // t of them."""
    return windows(tokens, [k * t for k in range((len(tokens) - 1) // t)], t)


# ---- checkpoints --------------------------------------------------------------------------------

_ST_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32, "I8": torch.int8, "U8": torch.uint8}


def read_safetensors(path):
    """({name: tensor}, metadata) of a safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, h in header.items():
        if h["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{path}: tensor {name} has dtype {h['dtype']}, which this reader does not know")
        a, b = h["data_offsets"]
        t = torch.frombuffer(bytearray(body[a:b]), dtype=_ST_DTYPES[h["dtype"]]) if b > a else torch.empty(0, dtype=_ST_DTYPES[h["dtype"]])
        out[name] = t.reshape(h["shape"])
    return out, meta


def load_checkpoint(path):
    """(model tensors without the ``model.`` prefix, config dict) of a sinter checkpoint (a run
    directory or the file)."""
    if os.path.isdir(path):
        path = os.path.join(path, "checkpoint.safetensors")
    tensors, meta = read_safetensors(path)
    if meta.get("format") != "sinter-checkpoint-1":
        raise ValueError(f"{path} is not a sinter checkpoint (format {meta.get('format')!r})")
    model = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    return model, json.loads(meta["config"])


# ---- models ---------------------------------------------------------------------------------------


class LeNet(nn.Module):
    """sinter's `cnn`: conv3×3(32)+ReLU+pool2, conv3×3(64)+ReLU+pool2, fc 128 + ReLU, fc."""

    def __init__(self, c=1, h=8, w=8, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(c, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * (h // 4) * (w // 4), 128)
        self.fc2 = nn.Linear(128, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2, 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class _Attention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x, cache=None):
        b, t, c = x.shape
        h, hd = self.n_head, c // self.n_head
        q, k, v = (z.view(b, t, h, hd).transpose(1, 2) for z in self.qkv(x).split(c, dim=2))
        if cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            start = cache.len
            cache.k[:, :, start:start + t] = k
            cache.v[:, :, start:start + t] = v
            k, v = cache.k[:, :, :start + t], cache.v[:, :, :start + t]
            if start == 0:
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                # Query i sits at position start + i and sees keys 0..=start + i.
                mask = torch.ones(t, start + t, dtype=torch.bool).tril(diagonal=start)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _Mlp(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


class _Block(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = _Attention(c, n_head)
        self.ln2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = _Mlp(c)

    def forward(self, x, cache=None):
        x = x + self.attn(self.ln1(x), cache)
        return x + self.mlp(self.ln2(x))


class _LayerCache:
    def __init__(self, batch, n_head, capacity, head_dim):
        self.k = torch.zeros(batch, n_head, capacity, head_dim)
        self.v = torch.zeros(batch, n_head, capacity, head_dim)
        self.len = 0


# sinter's presets (crates/sinter-models/src/gpt.rs).
GPT_PRESETS = {
    "gpt-tiny": dict(n_layer=4, n_head=4, n_embd=128, block_size=64, vocab_size=256),
    "gpt2": dict(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257),
}


class Gpt(nn.Module):
    """sinter's GPT (GPT-2's architecture, pre-norm, tied head), parameter names as sinter's."""

    def __init__(self, n_layer, n_head, n_embd, block_size, vocab_size):
        super().__init__()
        self.n_head, self.block_size = n_head, block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([_Block(n_embd, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)

    @staticmethod
    def for_config(config):
        """The model a sinter run config (model name, context) builds."""
        p = dict(GPT_PRESETS[config["model"]])
        p["block_size"] = max(p["block_size"], int(config["context"]))
        return Gpt(**p)

    def forward(self, ids, caches=None):
        start = caches[0].len if caches else 0
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(start, start + t))
        for i, blk in enumerate(self.blocks):
            x = blk(x, caches[i] if caches else None)
        if caches:
            for c in caches:
                c.len = start + t
        return F.linear(self.ln_f(x), self.wte.weight)

    def kv_caches(self, batch=1):
        c = self.wte.weight.shape[1]
        return [_LayerCache(batch, self.n_head, self.block_size, c // self.n_head) for _ in self.blocks]

    @torch.inference_mode()
    def generate_greedy(self, prompt, n, context):
        """sinter's generate_with at temperature 0 with the cache: the new tokens."""
        ctx = max(1, min(context, self.block_size))
        tokens = list(prompt)
        caches = self.kv_caches(1)
        for _ in range(n):
            if len(tokens) <= ctx:
                new = tokens[caches[0].len:]
            else:
                for c in caches:
                    c.len = 0
                new = tokens[-ctx:]
            logits = self.forward(torch.tensor([new]), caches)
            tokens.append(int(logits[0, -1].argmax()))
        return tokens[len(prompt):]


class _RmsNorm(nn.Module):
    def __init__(self, c, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(c))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x):
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class _LlamaAttention(nn.Module):
    """Grouped-query attention with rotary positions (Hugging Face's rotate-half convention);
    sinter packs q, k and v in one weight, rows q (n_head·d), k, v (n_kv_head·d each)."""

    def __init__(self, c, n_head, n_kv_head):
        super().__init__()
        self.h, self.kvh, self.d = n_head, n_kv_head, c // n_head
        self.qkv = nn.Linear(c, (n_head + 2 * n_kv_head) * self.d, bias=False)
        self.proj = nn.Linear(c, c, bias=False)

    def forward(self, x, cos, sin):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split([self.h * self.d, self.kvh * self.d, self.kvh * self.d], dim=2)
        q = q.view(b, t, self.h, self.d).transpose(1, 2)
        k = k.view(b, t, self.kvh, self.d).transpose(1, 2)
        v = v.view(b, t, self.kvh, self.d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kvh != self.h)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _SwiGlu(nn.Module):
    """sinter's gated MLP: one fc producing [gate | up], silu(gate)·up, then proj."""

    def __init__(self, c, hidden):
        super().__init__()
        self.fc = nn.Linear(c, 2 * hidden, bias=False)
        self.proj = nn.Linear(hidden, c, bias=False)

    def forward(self, x):
        gate, up = self.fc(x).chunk(2, dim=-1)
        return self.proj(F.silu(gate) * up)


class _LlamaBlock(nn.Module):
    def __init__(self, c, n_head, n_kv_head, hidden):
        super().__init__()
        self.ln1 = _RmsNorm(c)
        self.attn = _LlamaAttention(c, n_head, n_kv_head)
        self.ln2 = _RmsNorm(c)
        self.mlp = _SwiGlu(c, hidden)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.ln1(x), cos, sin)
        return x + self.mlp(self.ln2(x))


# sinter's Llama presets (crates/sinter-models/src/gpt.rs).
LLAMA_PRESETS = {
    "llama-tiny": dict(n_layer=4, n_head=4, n_kv_head=2, n_embd=128, hidden=344, block_size=64, vocab_size=256, theta=10000.0),
}


class Llama(nn.Module):
    """sinter's llama-tiny (RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied
    head), parameter names as sinter's."""

    def __init__(self, n_layer, n_head, n_kv_head, n_embd, hidden, block_size, vocab_size, theta):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.blocks = nn.ModuleList([_LlamaBlock(n_embd, n_head, n_kv_head, hidden) for _ in range(n_layer)])
        self.ln_f = _RmsNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        d = n_embd // n_head
        inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
        angles = torch.outer(torch.arange(block_size, dtype=torch.float64), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    @staticmethod
    def for_config(config):
        p = dict(LLAMA_PRESETS[config["model"]])
        p["block_size"] = max(p["block_size"], int(config["context"]))
        return Llama(**p)

    def forward(self, ids):
        t = ids.shape[1]
        cos, sin = self.cos[:t], self.sin[:t]
        x = self.wte(ids)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.lm_head(self.ln_f(x))


def build(config):
    """The twin of the model a sinter run config names (cnn on digits, gpt-tiny/gpt2, llama-tiny)."""
    if config["model"] == "cnn":
        if config["data"] != "digits":
            raise ValueError(f"the twin of cnn is built for digits, not {config['data']}")
        return LeNet()
    if config["model"] in GPT_PRESETS:
        return Gpt.for_config(config)
    if config["model"] in LLAMA_PRESETS:
        return Llama.for_config(config)
    raise ValueError(f"no PyTorch twin of sinter's {config['model']} model here")


def load_model(path):
    """(model with the checkpoint's weights, config)."""
    tensors, config = load_checkpoint(path)
    model = build(config)
    model.load_state_dict(tensors, strict=True)
    return model, config


# ---- optimizer and schedule ----------------------------------------------------------------------


def adamw(model, lr, weight_decay):
    """sinter's AdamW: decay on rank ≥ 2 tensors only; β 0.9/0.999, eps 1e-8 (PyTorch's defaults)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-8)


def lr_at(schedule, base, step, total):
    """sinter_nn::LrSchedule::parse(schedule, total).lr_at(base, step)."""
    if schedule == "constant":
        return base
    if schedule == "step":
        return base * 0.1 ** (step // max(total // 3, 1))
    if schedule == "cosine":
        warmup, min_factor = min(total // 20, 500), 0.1
        if step < warmup:
            return base * (step + 1) / warmup
        span = max(total - warmup, 1)
        progress = min((step - warmup) / span, 1.0)
        return base * (min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown schedule {schedule}")


def mean_loss(model, x, y):
    """Mean cross-entropy of the logits against classes or next tokens."""
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


@torch.inference_mode()
def evaluate(model, x_val, y_val, batch):
    """sinter's `evaluate`: in order, batches of `batch`, the loss weighted by rows; (loss,
    accuracy), the accuracy None for language models."""
    model.eval()
    total, correct, count, classifier = 0.0, 0, 0, False
    for i in range(0, len(x_val), batch):
        x, y = x_val[i:i + batch], y_val[i:i + batch]
        logits = model(x)
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))) * len(x)
        classifier = logits.dim() == 2
        if classifier:
            correct += int((logits.argmax(-1) == y).sum())
        count += len(x)
    model.train()
    return total / count, (correct / count if classifier else None)
