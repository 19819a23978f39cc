#!/usr/bin/env python3
"""Test fixtures for sinter's Llama-family models.

  python bench/llm/make_tiny.py tiny [--out DIR]     # needs torch, transformers, gguf
  python bench/llm/make_tiny.py check [--out DIR]    # needs numpy, gguf (no torch)
  python bench/llm/make_tiny.py smollm2-prompts --gguf-dir "$(.ci/fetch-weights smollm2)"

`tiny` writes small random models (DIR defaults to crates/sinter-models/tests/fixtures/tiny),
each in DIR/<name>/ as transformers' save_pretrained writes it (or model.gguf), with
DIR/<name>/prompts.json and transformers' float32 logits of every prompt position plus greedy
tokens in DIR/<name>/ref/ (ref.json + p{i}.f32, llama_ref.py's format). It then checks that
llama_ref.py agrees with transformers on every model, and that it stops agreeing when a piece
is deliberately broken (so the comparison can fail). `check` repeats the llama_ref.py
comparison against the stored references without torch.

`smollm2-prompts` writes crates/sinter-models/tests/fixtures/smollm2_prompts.json: four prompts,
their text and the ids from transformers' tokenizer for the SmolLM2 GGUF.
"""
import argparse
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_ref  # noqa: E402

REPO = os.path.dirname(os.path.dirname(HERE))
FIXTURES = os.path.join(REPO, "crates", "sinter-models", "tests", "fixtures")
TINY_DIR = os.path.join(FIXTURES, "tiny")

VOCAB = 96
PROMPT_LENGTHS = (1, 7, 20)  # a single token, a short prompt, and one that spans the rope range
GREEDY = 12
# Weights are N(0, WEIGHT_STD²) and norm gains 1 + N(0, NORM_STD²): large enough that the
# logits spread over several units and a wrong piece shows up in every position.
WEIGHT_STD = 0.3
NORM_STD = 0.25
# float32 transformers vs float64 llama_ref on these models agree to ~1e-6 relative.
TOLERANCE = 1e-4

COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, max_position_embeddings=128, bos_token_id=1,
              eos_token_id=2)

# name → (model_type, extra config, checkpoint dtype, max_shard_size or None, seed)
TINY_MODELS = {
    # GQA 4:2, tied head, Llama 3.1 rope scaling whose three wavelength bands all occur for
    # head_dim 8, theta 10000 and original context 64 (wavelengths 6.3, 63, 628, 6283).
    "llama-gqa-tied": ("llama", dict(
        num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                         "original_max_position_embeddings": 64}),
        "float32", None, 1),
    # q/k/v biases, untied head; saved in shards to exercise model.safetensors.index.json.
    "qwen2-bias-sharded": ("qwen2", dict(
        num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "float32", "40KB", 2),
    # per-head QK RMSNorm, head_dim 16 ≠ hidden/heads, one KV head (MQA), tied head.
    "qwen3-qknorm": ("qwen3", dict(
        num_key_value_heads=1, head_dim=16, tie_word_embeddings=True, rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "float32", None, 3),
    # bf16 checkpoint, untied head, no sliding window; its config.json is rewritten in the
    # pre-transformers-5 layout (top-level rope_theta, no rope_parameters).
    "mistral-bf16": ("mistral", dict(
        num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5, sliding_window=None,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "bfloat16", None, 4),
    # Mistral's sliding window, 5 positions: the 7- and 20-token prompts and the greedy
    # continuation all reach past it.
    "mistral-window": ("mistral", dict(
        num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-5, sliding_window=5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "float32", None, 5),
    # Qwen2's per-layer window: layer 0 attends fully, layer 1 to the last 5 positions
    # (use_sliding_window, max_window_layers 1; transformers writes layer_types).
    "qwen2-window": ("qwen2", dict(
        num_key_value_heads=2, tie_word_embeddings=False, rms_norm_eps=1e-6,
        use_sliding_window=True, sliding_window=5, max_window_layers=1,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "float32", None, 7),
    # A GeGLU MLP (hidden_act gelu_pytorch_tanh on the gate), multi-head, untied.
    "llama-geglu": ("llama", dict(
        num_key_value_heads=4, tie_word_embeddings=False, rms_norm_eps=1e-5,
        hidden_act="gelu_pytorch_tanh",
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
        "float32", None, 6),
}
GGUF_NAME = "llama-gqa-tied-gguf"
GGUF_SOURCE = "llama-gqa-tied"


# ----------------------------------------------------------------------------------------
# Building the models (torch + transformers)


def build_model(model_type, extra, seed):
    import torch
    import transformers

    config_class = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                    "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}
    config = config_class[model_type](**COMMON, **extra)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("norm.weight"):
                param.copy_(1.0 + NORM_STD * noise)
            else:
                param.copy_(WEIGHT_STD * noise)
    return model.eval()


def make_prompts(seed):
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, VOCAB, n)] for n in PROMPT_LENGTHS]


def write_prompts(path, prompts):
    with open(path, "w") as f:
        json.dump(prompts, f)
        f.write("\n")


def reference_from_transformers(model, prompts, ref_dir, source):
    import hf_compare

    logits, greedy, gaps = hf_compare.transformers_reference(model, prompts, GREEDY)
    llama_ref.write_reference(ref_dir, prompts, logits, greedy, gaps,
                              extra={"source": source, "greedy_tokens": GREEDY})
    return logits, greedy, gaps


# A greedy choice closer than this to the runner-up could flip on float32 rounding in a correct
# engine (~1e-5 of the logits here), and a continuation stuck on one token would let a broken
# engine pass by luck: seeds are tried in turn until neither happens.
MIN_GREEDY_GAP = 0.01
SEED_ATTEMPTS = 50


def describe(name, seed, logits, greedy, gaps):
    """Prints the reference's figures; returns whether it makes a fixture that can fail."""
    spread = max(float(np.std(l)) for l in logits)
    diverse = all(len(set(tokens)) > len(tokens) // 2 for tokens in greedy)
    usable = diverse and min(gaps) >= MIN_GREEDY_GAP
    print(f"{name} (seed {seed}): logits std up to {spread:.2f}; smallest top-2 gap "
          f"{min(gaps):.3f}; greedy {greedy}" + ("" if usable else " (rejected)"))
    return usable


LEGACY_CONFIG_MODEL = "mistral-bf16"


def rewrite_config_pre_transformers_5(model_dir):
    """config.json as transformers 4 wrote it: rope_theta at the top level (and rope_scaling
    when scaled) instead of rope_parameters; transformers 5 still reads it."""
    path = os.path.join(model_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    rope = dict(config.pop("rope_parameters"))
    config["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        config["rope_scaling"] = rope
    with open(path, "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")


def write_hf_model(out_dir, name, spec):
    import torch
    from transformers import AutoModelForCausalLM

    model_type, extra, dtype, shard_size, first_seed = spec
    model_dir = os.path.join(out_dir, name)
    for seed in range(first_seed, first_seed + 1000 * SEED_ATTEMPTS, 1000):
        model = build_model(model_type, extra, seed)
        shutil.rmtree(model_dir, ignore_errors=True)
        to_save = model.to(getattr(torch, dtype))
        kwargs = {"max_shard_size": shard_size} if shard_size else {}
        to_save.save_pretrained(model_dir, safe_serialization=True, **kwargs)
        if name == LEGACY_CONFIG_MODEL:
            rewrite_config_pre_transformers_5(model_dir)
        # The reference comes from the files as written (bf16 weights widened to float32).
        reloaded = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        prompts = make_prompts(seed)
        write_prompts(os.path.join(model_dir, "prompts.json"), prompts)
        logits, greedy, gaps = reference_from_transformers(
            reloaded, prompts, os.path.join(model_dir, "ref"),
            f"transformers (float32) on the {dtype} checkpoint")
        if describe(name, seed, logits, greedy, gaps):
            return reloaded
    raise SystemExit(f"{name}: no usable seed in {SEED_ATTEMPTS} attempts")


def permute_for_llama_cpp(weight, n_heads):
    """convert_hf_to_gguf.py's reordering of Q/K rows for llama.cpp's interleaved rope: within
    each head, original rows (i, i + d/2) become adjacent rows (2i, 2i + 1)."""
    rows = weight.shape[0]
    return (weight.reshape(n_heads, 2, rows // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2)
            .reshape(weight.shape))


def llama3_rope_factors(d, params):
    """The per-frequency divisors convert_hf_to_gguf.py stores as rope_freqs.weight for
    rope_type llama3 (llama.cpp divides each rope frequency by its factor)."""
    inv_freq = params["rope_theta"] ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    wavelength = 2 * np.pi / inv_freq
    original = params["original_max_position_embeddings"]
    low, high, factor = params["low_freq_factor"], params["high_freq_factor"], params["factor"]
    smooth = (original / wavelength - low) / (high - low)
    return np.where(wavelength < original / high, 1.0,
                    np.where(wavelength > original / low, factor,
                             1.0 / ((1 - smooth) / factor + smooth))).astype(np.float32)


# Hugging Face name after "layers.N." → llama.cpp's name after "blk.N.".
LLAMA_CPP_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"}


def write_llama_cpp_gguf(path, arch, hf_config, weights, quantize=lambda layer, name: False):
    """A GGUF as llama.cpp's convert_hf_to_gguf.py writes a Llama/Qwen2/Qwen3 checkpoint.
    weights: HF names without the "model." prefix → float arrays. For arch "llama" the Q/K
    rows are permuted for llama.cpp's interleaved rope (Qwen uses rotate-half: no permutation),
    and llama3 rope scaling becomes rope_freqs.weight. quantize(layer, gguf_suffix) picks the
    2-D tensors stored as Q8_0. Returns HF name → Q8_0-rounded values of those tensors."""
    import gguf

    heads, hidden = hf_config["num_attention_heads"], hf_config["hidden_size"]
    kv_heads = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or hidden // heads
    rope = hf_config.get("rope_parameters") or {"rope_theta": hf_config.get("rope_theta", 10000.0)}
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(f"tiny-{arch}")
    writer.add_custom_alignment(32)
    writer.add_context_length(hf_config["max_position_embeddings"])
    writer.add_embedding_length(hidden)
    writer.add_block_count(hf_config["num_hidden_layers"])
    writer.add_feed_forward_length(hf_config["intermediate_size"])
    writer.add_rope_dimension_count(head_dim)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    if head_dim != hidden // heads:
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_rope_freq_base(rope["rope_theta"])
    writer.add_layer_norm_rms_eps(hf_config["rms_norm_eps"])
    writer.add_vocab_size(hf_config["vocab_size"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)

    q8 = gguf.GGMLQuantizationType.Q8_0
    rounded = {}
    if arch == "llama" and rope.get("rope_type") == "llama3":
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, rope))
    writer.add_tensor("token_embd.weight", np.asarray(weights["embed_tokens.weight"], np.float32))
    for layer in range(hf_config["num_hidden_layers"]):
        for hf_suffix, gguf_suffix in LLAMA_CPP_LAYER_NAMES.items():
            for kind in ("weight", "bias"):
                hf_name = f"layers.{layer}.{hf_suffix}.{kind}"
                if hf_name not in weights:
                    continue
                values = np.asarray(weights[hf_name], np.float32)
                if arch == "llama" and gguf_suffix in ("attn_q", "attn_k"):
                    values = permute_for_llama_cpp(values, heads if gguf_suffix == "attn_q" else kv_heads)
                name = f"blk.{layer}.{gguf_suffix}.{kind}"
                if values.ndim == 2 and quantize(layer, gguf_suffix):
                    writer.add_tensor(name, gguf.quants.quantize(values, q8), raw_dtype=q8)
                    original = np.asarray(weights[hf_name], np.float32)
                    rounded[hf_name] = gguf.quants.dequantize(gguf.quants.quantize(original, q8), q8)
                else:
                    writer.add_tensor(name, values)
    writer.add_tensor("output_norm.weight", np.asarray(weights["norm.weight"], np.float32))
    if "lm_head.weight" in weights:
        writer.add_tensor("output.weight", np.asarray(weights["lm_head.weight"], np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return rounded


def write_gguf_model(out_dir, hf_model):
    """The llama-gqa-tied model as llama.cpp's converter would write it: llama tensor names,
    Q/K rows permuted, tied head (no output.weight), rope_freqs for the llama3 scaling, F32
    norms and embedding, Q8_0 for layer 1's matrices and layer 0's Q and K. Its reference is
    transformers on the HF model carrying the same Q8_0-rounded weights; since Q8_0 blocks run
    along rows and the permutation only moves rows, rounding commutes with the permutation."""
    import torch

    model_dir = os.path.join(out_dir, GGUF_NAME)
    shutil.rmtree(model_dir, ignore_errors=True)
    os.makedirs(model_dir)
    path = os.path.join(model_dir, "model.gguf")
    with open(os.path.join(out_dir, GGUF_SOURCE, "config.json")) as f:
        hf_config = json.load(f)
    weights = {k[len("model."):] if k.startswith("model.") else k: v.detach().numpy()
               for k, v in hf_model.state_dict().items()}
    if hf_config["tie_word_embeddings"]:
        weights.pop("lm_head.weight", None)
    rounded = write_llama_cpp_gguf(
        path, "llama", hf_config, weights,
        quantize=lambda layer, name: layer == 1 or name in ("attn_q", "attn_k"))
    rounded = {"model." + k: v for k, v in rounded.items()}

    with torch.no_grad():
        params = dict(hf_model.named_parameters())
        for hf_name, values in rounded.items():
            params[hf_name].copy_(torch.from_numpy(values))
    # The weights are the HF model's; only the prompts can be drawn again.
    for seed in range(5, 5 + 1000 * SEED_ATTEMPTS, 1000):
        prompts = make_prompts(seed)
        write_prompts(os.path.join(model_dir, "prompts.json"), prompts)
        logits, greedy, gaps = reference_from_transformers(
            hf_model, prompts, os.path.join(model_dir, "ref"),
            "transformers (float32) on the HF model with this file's Q8_0-rounded weights")
        if describe(GGUF_NAME, seed, logits, greedy, gaps):
            break
    else:
        raise SystemExit(f"{GGUF_NAME}: no usable prompts in {SEED_ATTEMPTS} attempts")
    print(f"{GGUF_NAME}: {len(rounded)} tensors Q8_0, {os.path.getsize(path)} bytes")


# ----------------------------------------------------------------------------------------
# Checking llama_ref.py against the stored references (numpy + gguf only)


def model_path(out_dir, name):
    model_dir = os.path.join(out_dir, name)
    gguf_file = os.path.join(model_dir, "model.gguf")
    return gguf_file if os.path.exists(gguf_file) else model_dir


def compare_with_reference(out_dir, name, break_piece=None):
    """Max relative error of llama_ref.py against the stored reference, and whether the
    greedy tokens match. break_piece deliberately gets one thing wrong."""
    import hf_compare

    config, weights = llama_ref.load_model(model_path(out_dir, name))
    if break_piece == "rope_scaling":
        config.rope_scaling, config.rope_freq_divisors = None, None
    elif break_piece == "qk_norm":
        weights = {k: v for k, v in weights.items() if not k.endswith(("q_norm.weight", "k_norm.weight"))}
    elif break_piece == "sliding_window":
        config.sliding_window = None
    elif break_piece == "window_layers":  # every layer windowed, as Mistral's
        config.full_attention_layers = 0
    elif break_piece == "hidden_act":
        config.hidden_act = "silu"
    elif break_piece == "bias":
        weights = {k: v for k, v in weights.items() if not k.endswith(".bias")}
    elif break_piece == "gguf_permutation":
        for k in list(weights):
            if k.endswith(("q_proj.weight", "k_proj.weight")):
                heads = config.num_heads if "q_proj" in k else config.num_kv_heads
                weights[k] = permute_for_llama_cpp(weights[k], heads)
    doc, ref_logits = llama_ref.read_reference(os.path.join(out_dir, name, "ref"))
    prompts = [p["ids"] for p in doc["prompts"]]
    logits, greedy, _ = llama_ref.LlamaReference(config, weights).run(prompts, len(doc["prompts"][0]["greedy"]))
    errors = hf_compare.relative_errors(ref_logits, logits)
    return errors, greedy == [p["greedy"] for p in doc["prompts"]], doc, prompts, greedy


def check_qwen_gguf(out_dir):
    """llama_ref.py's GGUF path for the qwen2 and qwen3 architectures (no Q/K permutation,
    attn_*.bias, attn_q_norm/attn_k_norm, key_length): the tiny Qwen models are converted to
    throwaway GGUFs (layer 1 in Q8_0) and must still match their transformers references,
    within the Q8_0 rounding (the references hold the unrounded weights)."""
    import tempfile

    import hf_compare

    ok = True
    for name, arch in (("qwen2-bias-sharded", "qwen2"), ("qwen3-qknorm", "qwen3")):
        model_dir = os.path.join(out_dir, name)
        with open(os.path.join(model_dir, "config.json")) as f:
            hf_config = json.load(f)
        _, weights = llama_ref.load_hf_dir(model_dir)
        doc, ref_logits = llama_ref.read_reference(os.path.join(model_dir, "ref"))
        prompts = [p["ids"] for p in doc["prompts"]]
        results = {}
        for label, quantize in (("F32", lambda layer, n: False), ("Q8_0", lambda layer, n: layer == 1)):
            with tempfile.TemporaryDirectory() as tmp:
                path = os.path.join(tmp, "model.gguf")
                write_llama_cpp_gguf(path, arch, hf_config, weights, quantize)
                config, gguf_weights = llama_ref.load_gguf(path)
            logits, greedy, _ = llama_ref.LlamaReference(config, gguf_weights).run(prompts, GREEDY)
            results[label] = (max(hf_compare.relative_errors(ref_logits, logits)),
                              greedy == [p["greedy"] for p in doc["prompts"]])
        # F32 must match like the HF directory does; Q8_0 must be close but measurably off.
        f32_ok = results["F32"][0] <= TOLERANCE and results["F32"][1]
        q8_ok = TOLERANCE < results["Q8_0"][0] < 0.05
        ok &= f32_ok and q8_ok
        print(f"{name} as a {arch} GGUF: F32 max rel err {results['F32'][0]:.3e}, greedy "
              + ("identical" if results["F32"][1] else "DIFFERS")
              + f"; layer 1 Q8_0 max rel err {results['Q8_0'][0]:.3e}"
              + ("" if f32_ok and q8_ok else " (FAILED)"))
    return ok


# Each breakage must push the error far above TOLERANCE on the model that has the feature.
BREAKAGES = [("llama-gqa-tied", "rope_scaling"), ("qwen2-bias-sharded", "bias"),
             ("qwen3-qknorm", "qk_norm"), (GGUF_NAME, "gguf_permutation"),
             ("mistral-window", "sliding_window"), ("llama-geglu", "hidden_act"),
             ("qwen2-window", "sliding_window"), ("qwen2-window", "window_layers")]


def check(out_dir):
    import hf_compare

    ok = True
    for name in list(TINY_MODELS) + [GGUF_NAME]:
        errors, same_greedy, doc, prompts, greedy = compare_with_reference(out_dir, name)
        ok &= hf_compare.report(f"{name}: transformers vs llama_ref:", prompts, errors,
                                [p["greedy"] for p in doc["prompts"]], greedy, TOLERANCE)
    ok &= check_qwen_gguf(out_dir)
    for name, piece in BREAKAGES:
        errors, same_greedy, *_ = compare_with_reference(out_dir, name, break_piece=piece)
        caught = max(errors) > 100 * TOLERANCE
        ok &= caught
        print(f"{name}: llama_ref without {piece}: max rel err {max(errors):.3e}, greedy "
              + ("identical" if same_greedy else "differs")
              + (" (caught)" if caught else " (NOT CAUGHT)"))
    print("make_tiny check: " + ("all agree" if ok else "FAILED"))
    return ok


def check_linear_rope():
    """Linear rope scaling is not among the fixtures (none of the target models use it), so
    llama_ref.py is checked against transformers on a throwaway model that has it."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    import hf_compare

    extra = dict(TINY_MODELS["llama-gqa-tied"][1],
                 rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0})
    prompts = make_prompts(11)
    with tempfile.TemporaryDirectory() as tmp:
        build_model("llama", extra, 11).save_pretrained(tmp, safe_serialization=True)
        model = AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
        hf_logits, hf_greedy, _ = hf_compare.transformers_reference(model, prompts, GREEDY)
        config, weights = llama_ref.load_model(tmp)
    ok = True
    for scaling in (config.rope_scaling, None):
        config.rope_scaling = scaling
        logits, greedy, _ = llama_ref.LlamaReference(config, weights).run(prompts, GREEDY)
        errors = hf_compare.relative_errors(hf_logits, logits)
        if scaling is None:
            caught = max(errors) > 100 * TOLERANCE
            ok &= caught
            print(f"llama-linear-rope: llama_ref without rope_scaling: max rel err "
                  f"{max(errors):.3e}" + (" (caught)" if caught else " (NOT CAUGHT)"))
        else:
            ok &= hf_compare.report("llama-linear-rope: transformers vs llama_ref:", prompts,
                                    errors, hf_greedy, greedy, TOLERANCE)
    return ok


# ----------------------------------------------------------------------------------------
# SmolLM2 prompts

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PROMPTS = [
    ("chat", [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]),
    ("prose", "Once upon a time, in a small village by the sea, there lived an old fisherman who"),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n'
             "        return n\n    return"),
    ("numbers-unicode", "On 2026-11-28 it was 3.5 °C in Zürich and 12 °C in 東京; "
                        "17/4 = 4.25, so"),
]


def write_smollm2_prompts(gguf_dir):
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=SMOLLM2_GGUF)
    prompts = []
    for kind, content in SMOLLM2_PROMPTS:
        if kind == "chat":
            ids = tokenizer.apply_chat_template(content, add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
            text = tokenizer.apply_chat_template(content, add_generation_prompt=True, tokenize=False)
        else:
            text = content
            ids = tokenizer(text).input_ids  # the GGUF's tokenizer adds no BOS
        ids = [int(t) for t in ids]
        if len(ids) > 64:
            raise SystemExit(f"smollm2 prompt {kind!r} has {len(ids)} tokens (> 64)")
        if tokenizer.decode(ids) != text:
            raise SystemExit(f"smollm2 prompt {kind!r} does not round-trip: {tokenizer.decode(ids)!r}")
        entry = {"kind": kind, "text": text, "ids": ids}
        if kind == "chat":
            entry["messages"] = content
        prompts.append(entry)
    doc = {"model": SMOLLM2_GGUF,
           "tokenizer": f"transformers {transformers.__version__} AutoTokenizer.from_pretrained"
                        f"(dir, gguf_file={SMOLLM2_GGUF!r}); plain prompts with the default "
                        "add_special_tokens (no BOS is added); the chat prompt from "
                        "apply_chat_template(messages, add_generation_prompt=True)",
           "prompts": prompts}
    path = os.path.join(FIXTURES, "smollm2_prompts.json")
    with open(path, "w") as f:
        head = {k: v for k, v in doc.items() if k != "prompts"}
        f.write("{\n" + "".join(f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},\n"
                                for k, v in head.items()))
        f.write(' "prompts": [\n  ' + ",\n  ".join(json.dumps(p, ensure_ascii=False)
                                                   for p in prompts) + "\n ]\n}\n")
    for p in prompts:
        print(f"{p['kind']}: {len(p['ids'])} tokens")
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["tiny", "check", "smollm2-prompts"])
    parser.add_argument("--out", default=TINY_DIR, help="tiny models' directory")
    parser.add_argument("--gguf-dir", help="directory holding " + SMOLLM2_GGUF)
    parser.add_argument("--only", nargs="+", choices=list(TINY_MODELS),
                        help="tiny: write only these models (the others stay as they are)")
    args = parser.parse_args()
    if args.command == "tiny":
        os.makedirs(args.out, exist_ok=True)
        chosen = {n: s for n, s in TINY_MODELS.items() if not args.only or n in args.only}
        hf_models = {name: write_hf_model(args.out, name, spec) for name, spec in chosen.items()}
        if GGUF_SOURCE in hf_models:
            write_gguf_model(args.out, hf_models[GGUF_SOURCE])
        linear_ok = check_linear_rope()
        sys.exit(0 if check(args.out) and linear_ok else 1)
    elif args.command == "check":
        sys.exit(0 if check(args.out) else 1)
    else:
        if not args.gguf_dir:
            parser.error("smollm2-prompts needs --gguf-dir")
        write_smollm2_prompts(args.gguf_dir)


if __name__ == "__main__":
    main()
