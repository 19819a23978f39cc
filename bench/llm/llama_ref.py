#!/usr/bin/env python3
"""Independent float64 numpy reference for Llama-family decoders (Llama, Mistral, Qwen2, Qwen3).

Written from the architecture's definition, not from any engine's code, so that sinter's
implementation and transformers can both be checked against it. Needs only numpy and gguf
(gguf-py); safetensors files (f32/f16/bf16) are read by a few lines here, since numpy has no
bf16 and the safetensors package cannot hand bf16 to numpy.

  python3 bench/llm/llama_ref.py --model FILE.gguf|HF_DIR --ids PROMPTS.json --greedy 32 --out DIR

PROMPTS.json is a list of prompts, each a list of token ids, or an object
{"prompts": [{"ids": [...], ...}, ...]}. Writes DIR/ref.json =
{"prompts": [{"ids", "logits_file": "p{i}.f32", "shape": [T, V], "greedy": [...],
"greedy_min_gap"}]} and DIR/p{i}.f32: the logits of every prompt position as raw
little-endian float32, row-major [T, V]. "greedy" is N tokens chosen by argmax with no stop at
end-of-sequence; "greedy_min_gap" is the smallest top-1 minus top-2 logit gap over those N
choices (a small gap means a float32 engine may legitimately pick the other token).
"""
import argparse
import json
import math
import os
import struct
import sys
import time

# Single-threaded OpenBLAS unless the caller says otherwise: the decode matmuls have 4 rows, and
# on a loaded 2-core machine (load ~5) OpenBLAS's threads made the SmolLM2 run 2.6x slower
# (forward 54 s vs 21 s, 2026-11-28).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

# ----------------------------------------------------------------------------------------
# Configuration


class Config:
    """The hyper-parameters the forward pass needs, normalised from either source."""

    def __init__(self, **kw):
        self.vocab_size = kw["vocab_size"]
        self.hidden_size = kw["hidden_size"]
        self.intermediate_size = kw["intermediate_size"]
        self.num_layers = kw["num_layers"]
        self.num_heads = kw["num_heads"]
        self.num_kv_heads = kw["num_kv_heads"]
        self.head_dim = kw["head_dim"]
        self.rms_norm_eps = kw["rms_norm_eps"]
        self.rope_theta = kw["rope_theta"]
        # None, or a dict with "rope_type" in {"linear", "llama3"} and its parameters.
        self.rope_scaling = kw.get("rope_scaling")
        # GGUF files from llama.cpp carry llama3 scaling as per-frequency divisors instead.
        self.rope_freq_divisors = kw.get("rope_freq_divisors")
        self.sliding_window = kw.get("sliding_window")
        # The first layers attend fully even with a sliding window (Qwen's max_window_layers).
        self.full_attention_layers = kw.get("full_attention_layers", 0)
        self.model_type = kw.get("model_type", "llama")
        # The gate's activation: "silu" (SwiGLU) or "gelu_pytorch_tanh" (GeGLU).
        self.hidden_act = kw.get("hidden_act", "silu")

    def __repr__(self):
        return "Config(" + ", ".join(f"{k}={v!r}" for k, v in vars(self).items()
                                     if not isinstance(v, np.ndarray)) + ")"


def rope_scaling_from_hf(config):
    """The rope scaling dict of an HF config: transformers 5 writes rope_parameters (with
    rope_type "default" when unscaled), older files rope_scaling (with "type" or "rope_type")."""
    params = config.get("rope_parameters") or config.get("rope_scaling")
    if not params:
        return None
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type not in ("linear", "llama3"):
        raise NotImplementedError(f"rope_type {rope_type!r} is not supported")
    return dict(params, rope_type=rope_type)


def config_from_hf(config):
    model_type = config.get("model_type", "llama")
    if model_type not in ("llama", "mistral", "qwen2", "qwen3"):
        raise NotImplementedError(f"model_type {model_type!r} is not supported")
    rope_params = config.get("rope_parameters") or {}
    theta = rope_params.get("rope_theta", config.get("rope_theta", 10000.0))
    heads = config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    sliding_window = config.get("sliding_window")
    # Qwen2/Qwen3 carry a sliding_window that only applies with use_sliding_window.
    full_attention_layers = 0
    if model_type in ("qwen2", "qwen3"):
        if not config.get("use_sliding_window", False):
            sliding_window = None
        elif config.get("layer_types"):
            types = config["layer_types"]
            full_attention_layers = next(
                (i for i, t in enumerate(types) if t == "sliding_attention"), len(types))
            if any(t != "sliding_attention" for t in types[full_attention_layers:]):
                raise NotImplementedError("layer_types other than full, then sliding")
        else:
            full_attention_layers = config.get("max_window_layers", 28)
    return Config(
        vocab_size=config["vocab_size"],
        hidden_size=config["hidden_size"],
        intermediate_size=config["intermediate_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=config.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_norm_eps=config.get("rms_norm_eps", 1e-6),
        rope_theta=float(theta),
        rope_scaling=rope_scaling_from_hf(config),
        sliding_window=sliding_window,
        full_attention_layers=full_attention_layers,
        model_type=model_type,
        hidden_act=config.get("hidden_act", "silu"),
    )


# ----------------------------------------------------------------------------------------
# Hugging Face directory: config.json + safetensors (single file or sharded)

_SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64}


def read_safetensors_file(path):
    """Tensors of one .safetensors file as float64 arrays. The format is an 8-byte header
    length, a JSON header (name → dtype, shape, data_offsets) and the raw data."""
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(header_len))
        blob = f.read()
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = blob[begin:end]
        dtype = info["dtype"]
        if dtype == "BF16":
            # bf16 is the top half of an f32: widen by shifting into the high 16 bits.
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            values = bits.view(np.float32)
        elif dtype in _SAFETENSORS_DTYPES:
            values = np.frombuffer(raw, dtype=np.dtype(_SAFETENSORS_DTYPES[dtype]).newbyteorder("<"))
        else:
            raise NotImplementedError(f"{path}: tensor {name} has dtype {dtype}")
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


def load_hf_dir(path):
    with open(os.path.join(path, "config.json")) as f:
        hf_config = json.load(f)
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    weights = {}
    for name in files:
        weights.update(read_safetensors_file(os.path.join(path, name)))
    # Some checkpoints prefix everything with "model." except lm_head; others have no prefix.
    weights = {k[len("model."):] if k.startswith("model.") else k: v for k, v in weights.items()}
    config = config_from_hf(hf_config)
    if "lm_head.weight" not in weights:
        if not hf_config.get("tie_word_embeddings", True):
            raise ValueError(f"{path}: no lm_head.weight and tie_word_embeddings is false")
    return config, weights


# ----------------------------------------------------------------------------------------
# GGUF file (llama.cpp naming)

# GGUF tensor name (after "blk.N.") → the Hugging Face name after "layers.N.".
_GGUF_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GGUF_GLOBAL_NAMES = {
    "token_embd.weight": "embed_tokens.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
}


def gguf_field_value(field):
    """A metadata value: a scalar, a str, or a list."""
    if hasattr(field, "contents"):
        return field.contents()
    import gguf  # older gguf-py without ReaderField.contents

    def one(index):
        part = field.parts[index]
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        return part.tolist()[0]

    if field.types[0] == gguf.GGUFValueType.ARRAY:
        return [one(i) for i in field.data]
    return one(field.data[0])


def undo_llama_cpp_qk_permutation(weight, n_heads):
    """llama.cpp's convert_hf_to_gguf.py reorders each head's rows of Q and K from
    rotate-half order (first half, second half) to interleaved pairs, for its interleaved
    rope. Put them back so that the rotate-half rope applies: within each head, row 2i+j of
    the file is row j*half + i of the original."""
    rows = weight.shape[0]
    half = rows // n_heads // 2
    return (weight.reshape(n_heads, half, 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def load_gguf(path):
    import gguf

    reader = gguf.GGUFReader(path)
    meta = {name: gguf_field_value(field) for name, field in reader.fields.items()
            if not name.startswith("tokenizer.ggml.")}
    arch = meta["general.architecture"]
    if arch not in ("llama", "qwen2", "qwen3"):
        raise NotImplementedError(f"{path}: architecture {arch!r} is not supported")

    def key(name, default=None):
        value = meta.get(f"{arch}.{name}", default)
        if value is None:
            raise KeyError(f"{path}: metadata {arch}.{name} is missing")
        return value

    weights = {}
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        # Dequantized arrays come back in numpy order (rows = outermost GGUF dimension).
        shape = tuple(int(d) for d in reversed(tensor.shape))
        values = np.asarray(values, dtype=np.float64).reshape(shape)
        if tensor.name == "rope_freqs.weight":
            weights["rope_freqs"] = values
        elif tensor.name in _GGUF_GLOBAL_NAMES:
            weights[_GGUF_GLOBAL_NAMES[tensor.name]] = values
        else:
            parts = tensor.name.split(".")
            if parts[0] != "blk" or parts[2] not in _GGUF_LAYER_NAMES:
                raise NotImplementedError(f"{path}: tensor {tensor.name} is not understood")
            weights[f"layers.{parts[1]}.{_GGUF_LAYER_NAMES[parts[2]]}.{parts[3]}"] = values

    heads = int(key("attention.head_count"))
    kv_heads = int(key("attention.head_count_kv", heads))
    hidden = int(key("embedding_length"))
    head_dim = int(meta.get(f"{arch}.attention.key_length", hidden // heads))
    layers = int(key("block_count"))
    if arch == "llama":
        for i in range(layers):
            for proj, n in (("q_proj", heads), ("k_proj", kv_heads)):
                for suffix in ("weight", "bias"):
                    name = f"layers.{i}.self_attn.{proj}.{suffix}"
                    if name in weights:
                        weights[name] = undo_llama_cpp_qk_permutation(weights[name], n)

    rope_scaling = None
    scaling_type = meta.get(f"{arch}.rope.scaling.type", "none")
    if scaling_type == "linear":
        rope_scaling = {"rope_type": "linear", "factor": float(key("rope.scaling.factor"))}
    elif scaling_type not in ("none", None):
        raise NotImplementedError(f"{path}: rope scaling {scaling_type!r} is not supported")
    config = Config(
        vocab_size=weights["embed_tokens.weight"].shape[0],
        hidden_size=hidden,
        intermediate_size=int(key("feed_forward_length")),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(key("attention.layer_norm_rms_epsilon")),
        rope_theta=float(key("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        rope_freq_divisors=weights.pop("rope_freqs", None),
        sliding_window=None,
        model_type=arch,
    )
    return config, weights


def load_model(path):
    if os.path.isdir(path):
        return load_hf_dir(path)
    return load_gguf(path)


# ----------------------------------------------------------------------------------------
# Forward pass


def rope_inverse_frequencies(config):
    """θ_i = base^(-2i/d) for i < d/2, then the configured scaling."""
    d = config.head_dim
    inv_freq = config.rope_theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    scaling = config.rope_scaling
    if scaling is not None and scaling["rope_type"] == "linear":
        # Linear (position interpolation): positions are divided by the factor.
        inv_freq = inv_freq / scaling["factor"]
    elif scaling is not None and scaling["rope_type"] == "llama3":
        # Llama 3.1: wavelengths beyond original_context/low_freq_factor are stretched by
        # `factor`; those below original_context/high_freq_factor are kept; in between the
        # two are blended linearly in original_context/wavelength.
        factor = scaling["factor"]
        low = scaling.get("low_freq_factor", 1.0)
        high = scaling.get("high_freq_factor", 4.0)
        original = scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv_freq
        smooth = (original / wavelength - low) / (high - low)
        blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = np.where(wavelength > original / low, inv_freq / factor,
                            np.where(wavelength < original / high, inv_freq, blended))
    if config.rope_freq_divisors is not None:
        inv_freq = inv_freq / config.rope_freq_divisors
    return inv_freq


def rms_norm(x, weight, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def apply_rope(x, cos, sin):
    """Rotate-half convention: dimension i is paired with i + d/2. x: [T, heads, d]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def silu(x):
    return x / (1.0 + np.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


GATE_ACTIVATIONS = {"silu": silu, "gelu_pytorch_tanh": gelu_tanh, "gelu_new": gelu_tanh}


class KVCache:
    def __init__(self, config):
        self.keys = [None] * config.num_layers  # [T, kv_heads, d] per layer
        self.values = [None] * config.num_layers
        self.length = 0


class LlamaReference:
    def __init__(self, config, weights):
        self.config = config
        self.w = weights
        self.inv_freq = rope_inverse_frequencies(config)
        self.lm_head = weights.get("lm_head.weight", weights["embed_tokens.weight"])

    def linear(self, x, name):
        y = x @ self.w[name + ".weight"].T
        bias = self.w.get(name + ".bias")
        return y if bias is None else y + bias

    def attention(self, layer, x, spans, caches):
        """x: [N, hidden] holding the new tokens of several sequences one after the other;
        spans[s] = (start row, row count); caches[s] holds sequence s's earlier keys/values."""
        c, p = self.config, f"layers.{layer}.self_attn."
        n = x.shape[0]
        q = self.linear(x, p + "q_proj").reshape(n, c.num_heads, c.head_dim)
        k = self.linear(x, p + "k_proj").reshape(n, c.num_kv_heads, c.head_dim)
        v = self.linear(x, p + "v_proj").reshape(n, c.num_kv_heads, c.head_dim)
        if p + "q_norm.weight" in self.w:  # Qwen3: RMSNorm over each head, before rope
            q = rms_norm(q, self.w[p + "q_norm.weight"], c.rms_norm_eps)
            k = rms_norm(k, self.w[p + "k_norm.weight"], c.rms_norm_eps)
        group = c.num_heads // c.num_kv_heads
        out = np.empty((n, c.num_heads, c.head_dim))
        for (start, count), cache in zip(spans, caches):
            past = cache.length
            positions = np.arange(past, past + count, dtype=np.float64)
            angles = positions[:, None] * self.inv_freq[None, :]
            cos, sin = np.cos(angles), np.sin(angles)
            rows = slice(start, start + count)
            q_s = apply_rope(q[rows], cos, sin)
            k_new = apply_rope(k[rows], cos, sin)
            keys = k_new if past == 0 else np.concatenate([cache.keys[layer], k_new])
            values = v[rows] if past == 0 else np.concatenate([cache.values[layer], v[rows]])
            cache.keys[layer], cache.values[layer] = keys, values
            total = past + count
            # Query head h reads key/value head h // group.
            q_g = q_s.reshape(count, c.num_kv_heads, group, c.head_dim)
            scores = np.einsum("tkgd,skd->kgts", q_g, keys) / math.sqrt(c.head_dim)
            key_pos = np.arange(total)[None, :]
            query_pos = (past + np.arange(count))[:, None]
            hidden = key_pos > query_pos
            # Mistral: the last sliding_window positions; Qwen: so from its window layers on.
            if c.sliding_window is not None and layer >= c.full_attention_layers:
                hidden |= key_pos <= query_pos - c.sliding_window
            scores = np.where(hidden, -np.inf, scores)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            probs /= probs.sum(axis=-1, keepdims=True)
            ctx = np.einsum("kgts,skd->tkgd", probs, values)
            out[rows] = ctx.reshape(count, c.num_heads, c.head_dim)
        return self.linear(out.reshape(n, c.num_heads * c.head_dim), p + "o_proj")

    def forward(self, token_lists, caches, all_positions):
        """Runs the new tokens of each sequence (token_lists[s], appended to caches[s]).
        Returns per sequence the logits [T, V] of every new position, or only of the last
        one when all_positions is false."""
        c = self.config
        spans, start = [], 0
        for tokens in token_lists:
            spans.append((start, len(tokens)))
            start += len(tokens)
        ids = np.concatenate([np.asarray(t, dtype=np.int64) for t in token_lists])
        x = self.w["embed_tokens.weight"][ids]
        for layer in range(c.num_layers):
            p = f"layers.{layer}."
            h = rms_norm(x, self.w[p + "input_layernorm.weight"], c.rms_norm_eps)
            x = x + self.attention(layer, h, spans, caches)
            h = rms_norm(x, self.w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate = self.linear(h, p + "mlp.gate_proj")
            up = self.linear(h, p + "mlp.up_proj")
            act = GATE_ACTIVATIONS[c.hidden_act]
            x = x + self.linear(act(gate) * up, p + "mlp.down_proj")
        for (_, count), cache in zip(spans, caches):
            cache.length += count
        if not all_positions:
            x = x[[s + n - 1 for s, n in spans]]
            spans = [(i, 1) for i in range(len(spans))]
        x = rms_norm(x, self.w["norm.weight"], c.rms_norm_eps)
        logits = x @ self.lm_head.T
        return [logits[s:s + n] for s, n in spans]

    def run(self, prompts, greedy):
        """Logits of every prompt position and `greedy` argmax tokens per prompt, the
        continuation decoded for all prompts together, one token per step, from KV caches."""
        caches = [KVCache(self.config) for _ in prompts]
        prompt_logits = self.forward(prompts, caches, all_positions=True)
        last = [logits[-1] for logits in prompt_logits]
        chosen = [[] for _ in prompts]
        min_gap = [math.inf for _ in prompts]
        for step in range(greedy):
            for s, logits in enumerate(last):
                top2 = np.partition(logits, -2)[-2:]
                min_gap[s] = min(min_gap[s], float(top2[1] - top2[0]))
                chosen[s].append(int(np.argmax(logits)))
            if step + 1 < greedy:
                last = [l[0] for l in self.forward([[t[-1]] for t in chosen], caches, False)]
        return prompt_logits, chosen, min_gap


# ----------------------------------------------------------------------------------------
# Input / output shared with hf_compare.py and make_tiny.py


def read_prompts(path):
    with open(path) as f:
        data = json.load(f)
    if isinstance(data, dict):
        data = [p["ids"] for p in data["prompts"]]
    return [[int(t) for t in ids] for ids in data]


def write_reference(out_dir, prompts, logits, greedy, min_gaps, extra=None):
    """ref.json + p{i}.f32 (raw little-endian float32, row-major [T, V])."""
    os.makedirs(out_dir, exist_ok=True)
    entries = []
    for i, (ids, lg, tokens, gap) in enumerate(zip(prompts, logits, greedy, min_gaps)):
        lg = np.asarray(lg)
        name = f"p{i}.f32"
        lg.astype("<f4").tofile(os.path.join(out_dir, name))
        entry = {"ids": list(ids), "logits_file": name, "shape": list(lg.shape),
                 "greedy": list(tokens)}
        if gap is not None:
            entry["greedy_min_gap"] = round(gap, 6) if math.isfinite(gap) else None
        entries.append(entry)
    # One line per prompt keeps the file readable and its diffs small.
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in (extra or {}).items()]
    lines.append(' "prompts": [\n  ' + ",\n  ".join(json.dumps(e) for e in entries) + "\n ]")
    with open(os.path.join(out_dir, "ref.json"), "w") as f:
        f.write("{\n" + "\n".join(lines) + "\n}\n")


def read_reference(ref_dir):
    """(ref.json document, list of [T, V] float32 logits arrays)."""
    with open(os.path.join(ref_dir, "ref.json")) as f:
        doc = json.load(f)
    logits = [np.fromfile(os.path.join(ref_dir, p["logits_file"]), dtype="<f4").reshape(p["shape"])
              for p in doc["prompts"]]
    return doc, logits


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="GGUF file or Hugging Face directory")
    parser.add_argument("--ids", required=True, help="JSON prompts file (token ids)")
    parser.add_argument("--greedy", type=int, default=0, help="greedy tokens per prompt")
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args()

    started = time.time()
    config, weights = load_model(args.model)
    prompts = read_prompts(args.ids)
    for ids in prompts:
        if not ids or max(ids) >= config.vocab_size or min(ids) < 0:
            sys.exit(f"llama_ref: a prompt is empty or has ids outside [0, {config.vocab_size})")
    loaded = time.time()
    model = LlamaReference(config, weights)
    logits, greedy, gaps = model.run(prompts, args.greedy)
    write_reference(args.out, prompts, logits, greedy, gaps,
                    extra={"model": os.path.basename(os.path.normpath(args.model)),
                           "source": "llama_ref.py (float64 numpy)"})
    print(f"llama_ref: {config}")
    print(f"llama_ref: {len(prompts)} prompts, {sum(map(len, prompts))} prompt tokens, "
          f"{args.greedy} greedy tokens each; load {loaded - started:.1f} s, "
          f"forward {time.time() - loaded:.1f} s → {args.out}/ref.json")


if __name__ == "__main__":
    main()
