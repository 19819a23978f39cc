"""Plain-PyTorch models and helpers shared by the scripts in bench/gpu (imported, not run).

Only torch is needed (no transformers, numpy or safetensors packages, no downloads):

* ``HFLayoutGPT2``: GPT-2 exactly as Hugging Face's ``GPT2LMHeadModel`` computes it, with HF's
  parameter names (``transformer.h.0.attn.c_attn.weight``, …) and its Conv1D layout (weights
  ``[in, out]``), so its ``state_dict`` *is* an HF checkpoint. The reference when
  ``transformers`` is not installed.
* ``GPT2``: GPT-2 for the training benchmark (nanoGPT-style ``nn.Linear`` layers, fused QKV,
  ``scaled_dot_product_attention`` or the explicit softmax(QKᵀ)V), tied head.
* ``BertForMaskedLM``: BERT with the MLM head, as in Hugging Face (post-norm, exact GELU,
  LayerNorm eps 1e-12, decoder tied to the word embeddings).
* ``save_safetensors``: a dependency-free safetensors writer (the format is an 8-byte
  little-endian header length, a JSON header, then the raw little-endian tensor bytes).
"""

import ctypes
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


# ---- safetensors ------------------------------------------------------------------------------

_ST_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
}


def _tensor_bytes(t):
    t = t.detach().to("cpu").contiguous()
    n = t.numel() * t.element_size()
    return ctypes.string_at(t.data_ptr(), n) if n else b""


def save_safetensors(path, tensors, metadata=None):
    """Writes ``{name: tensor}`` to ``path`` as safetensors, with string ``metadata``."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} is not supported here")
        b = _tensor_bytes(t)
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- GPT-2 in Hugging Face's layout (the reference) -----------------------------------------


def gelu_new(x):
    """GPT-2's GELU (tanh approximation), as transformers' NewGELUActivation."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Conv1D(nn.Module):
    """HF's Conv1D: y = x W + b with W stored [in, out]."""

    def __init__(self, n_out, n_in):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out).normal_(std=0.02))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        shape = x.shape[:-1] + (self.weight.shape[1],)
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(shape)


class _HFAttention(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.n_head = n_head
        self.c_attn = Conv1D(3 * c, c)
        self.c_proj = Conv1D(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hd = c // self.n_head
        q, k, v = (z.view(b, t, self.n_head, hd).transpose(1, 2) for z in (q, k, v))
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device))
        w = torch.softmax(w, dim=-1)
        y = torch.matmul(w, v).transpose(1, 2).reshape(b, t, c)
        return self.c_proj(y)


class _HFMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = Conv1D(4 * c, c)
        self.c_proj = Conv1D(c, 4 * c)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class _HFBlock(nn.Module):
    def __init__(self, c, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(c, eps=1e-5)
        self.attn = _HFAttention(c, n_head)
        self.ln_2 = nn.LayerNorm(c, eps=1e-5)
        self.mlp = _HFMLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class _HFTransformer(nn.Module):
    def __init__(self, vocab, n_positions, c, n_layer, n_head):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(n_positions, c)
        self.h = nn.ModuleList([_HFBlock(c, n_head) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(c, eps=1e-5)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)


class HFLayoutGPT2(nn.Module):
    """GPT2LMHeadModel without transformers: same names (``transformer.*``), same math."""

    def __init__(self, vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12):
        super().__init__()
        self.n_head = n_head
        self.transformer = _HFTransformer(vocab_size, n_positions, n_embd, n_layer, n_head)

    def forward(self, ids):
        tr = self.transformer
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = tr.wte(ids) + tr.wpe(pos)
        for blk in tr.h:
            x = blk(x)
        return F.linear(tr.ln_f(x), tr.wte.weight)  # tied lm_head


# ---- GPT-2 for the training benchmark ---------------------------------------------------------


class _Attention(nn.Module):
    def __init__(self, c, n_head, sdpa):
        super().__init__()
        self.n_head, self.sdpa = n_head, sdpa
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            w = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.shape[-1]))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(w.masked_fill(mask, float("-inf")), dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class _Block(nn.Module):
    def __init__(self, c, n_head, sdpa):
        super().__init__()
        self.ln1 = nn.LayerNorm(c)
        self.attn = _Attention(c, n_head, sdpa)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.proj = nn.Linear(4 * c, c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    """GPT-2 (pre-norm, tied head) as trained by nanoGPT / llm.c."""

    def __init__(self, vocab_size=50257, block_size=1024, n_embd=768, n_layer=12, n_head=12, sdpa=True):
        super().__init__()
        self.n_layer, self.n_embd = n_layer, n_embd
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList([_Block(n_embd, n_head, sdpa) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias") and "ln" not in name:
                nn.init.zeros_(p)

    def forward(self, ids, targets=None):
        pos = torch.arange(ids.shape[1], device=ids.device)
        x = self.wte(ids) + self.wpe(pos)
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


# ---- BERT -----------------------------------------------------------------------------------------


class _BertLayer(nn.Module):
    def __init__(self, c, n_head, ffn, dropout, sdpa):
        super().__init__()
        self.n_head, self.sdpa, self.p = n_head, sdpa, dropout
        self.query, self.key, self.value = nn.Linear(c, c), nn.Linear(c, c), nn.Linear(c, c)
        self.attn_out = nn.Linear(c, c)
        self.attn_norm = nn.LayerNorm(c, eps=1e-12)
        self.intermediate = nn.Linear(c, ffn)
        self.output = nn.Linear(ffn, c)
        self.out_norm = nn.LayerNorm(c, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x, pad_mask):
        b, t, c = x.shape
        hd = c // self.n_head
        q, k, v = (l(x).view(b, t, self.n_head, hd).transpose(1, 2) for l in (self.query, self.key, self.value))
        # pad_mask: [b, 1, 1, t] bool, True = attend (None: attend everywhere).
        if self.sdpa:
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=pad_mask, dropout_p=self.p if self.training else 0.0)
        else:
            w = (q @ k.transpose(-2, -1)) / math.sqrt(hd)
            if pad_mask is not None:
                w = w.masked_fill(~pad_mask, torch.finfo(w.dtype).min)
            a = self.drop(torch.softmax(w, dim=-1)) @ v
        a = a.transpose(1, 2).reshape(b, t, c)
        x = self.attn_norm(x + self.drop(self.attn_out(a)))
        return self.out_norm(x + self.drop(self.output(F.gelu(self.intermediate(x)))))


class BertForMaskedLM(nn.Module):
    """BERT + MLM head (dense, GELU, LayerNorm, decoder tied to word embeddings, bias)."""

    def __init__(self, vocab_size=30522, hidden=768, n_layer=12, n_head=12, intermediate=3072, max_position=512, type_vocab_size=2, dropout=0.1, sdpa=True):
        super().__init__()
        self.word = nn.Embedding(vocab_size, hidden)
        self.position = nn.Embedding(max_position, hidden)
        self.token_type = nn.Embedding(type_vocab_size, hidden)
        self.emb_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList([_BertLayer(hidden, n_head, intermediate, dropout, sdpa) for _ in range(n_layer)])
        self.head_dense = nn.Linear(hidden, hidden)
        self.head_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.head_bias = nn.Parameter(torch.zeros(vocab_size))
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, ids, labels=None, attention_mask=None, masked_only=False):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        x = self.word(ids) + self.position(pos) + self.token_type.weight[0]
        x = self.drop(self.emb_norm(x))
        pad = None if attention_mask is None else attention_mask.bool()[:, None, None, :]
        for layer in self.layers:
            x = layer(x, pad)
        if labels is not None and masked_only:
            sel = labels.view(-1) != -100
            x = x.view(-1, x.shape[-1])[sel]
            labels = labels.view(-1)[sel]
        h = self.head_norm(F.gelu(self.head_dense(x)))
        logits = F.linear(h, self.word.weight, self.head_bias)
        if labels is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def mask_tokens(ids, vocab_size, mask_id=103, special=(0, 101, 102), prob=0.15, generator=None):
    """BERT's masking on a batch (on ids' device): 15% selected; 80% [MASK], 10% random, 10% kept."""
    sel = torch.rand(ids.shape, device=ids.device, generator=generator) < prob
    for s in special:
        sel &= ids != s
    labels = torch.where(sel, ids, torch.full_like(ids, -100))
    r = torch.rand(ids.shape, device=ids.device, generator=generator)
    inputs = torch.where(sel & (r < 0.8), torch.full_like(ids, mask_id), ids)
    rand_tok = torch.randint(vocab_size, ids.shape, device=ids.device, generator=generator)
    inputs = torch.where(sel & (r >= 0.8) & (r < 0.9), rand_tok, inputs)
    return inputs, labels
