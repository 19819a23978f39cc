#!/usr/bin/env python3
"""Writes the GGUF test fixtures of crates/sinter-models/tests/gguf.rs with PyPI's `gguf`
package (gguf-py, llama.cpp's own Python implementation of the format), so sinter's reader and
dequantization are checked against an independent implementation.

    python3 -m pip install numpy gguf safetensors
    python3 bench/llm/make_gguf_fixtures.py [OUT_DIR]   # default: crates/sinter-models/tests/fixtures/gguf

Files:
- quant.gguf: one tensor per GGML type sinter reads, `q.<TYPE>`, and beside each
  `expected.<TYPE>` (F32): its values as gguf-py's `dequantize` gives them. The float and
  legacy types (Q4_0 … Q8_0) are quantized from random normal values with gguf-py's
  `quantize`; gguf-py cannot quantize the k-quants, so their blocks are random bytes (every bit
  pattern of the packed integers and scales) with finite f16 scales. Q8_K, which gguf-py does
  not dequantize, is expected as d·q computed here. Its metadata holds one key of every GGUF
  value type, nested arrays included (`test.*`).
- llama-tiny.gguf / qwen2-tiny.gguf / qwen3-tiny.gguf: tiny Llama-family models as llama.cpp's
  converter writes them (GGUF names; for llama, Q and K rows permuted for its rotary layout),
  and *-tiny.hf.safetensors: the same tensors under their Hugging Face names as a checkpoint
  would hold them, before conversion. F16 values throughout, so the round trip is exact.
"""
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "crates/sinter-models/tests/fixtures/gguf")
rng = np.random.default_rng(25)

LEGACY = [T.F32, T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]
KQUANTS = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_K]

# Byte offsets of the f16 scales in each k-quant block (the rest of a block is packed ints).
F16_FIELDS = {T.Q2_K: [80, 82], T.Q3_K: [108], T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def random_kquant_blocks(qtype, n_blocks):
    """Random blocks whose f16 scales are finite values of a weight's magnitude."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    if qtype == T.Q8_K:
        d = rng.uniform(1e-3, 1e-2, size=n_blocks).astype("<f4")
        blocks[:, 0:4] = d.view(np.uint8).reshape(n_blocks, 4)
        return blocks
    for off in F16_FIELDS[qtype]:
        d = rng.uniform(1e-3, 1e-1, size=n_blocks).astype("<f2")
        blocks[:, off:off + 2] = d.view(np.uint8).reshape(n_blocks, 2)
    return blocks


def q8k_dequantize(blocks):
    d = blocks[:, 0:4].copy().view("<f4")
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def write_quant():
    w = gguf.GGUFWriter(OUT / "quant.gguf", "sinter-test")
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 0.15625)
    w.add_bool("test.bool", True)
    w.add_string("test.string", "héllo GGUF")
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**40))
    w.add_float64("test.f64", 2.718281828459045)
    w.add_array("test.str_array", ["a", "bc", ""])
    w.add_key_value("test.f32_array", [0.5, -1.25, 3.0], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.FLOAT32)
    w.add_array("test.i32_array", [1, -2, 3])
    w.add_key_value("test.u8_array", [7, 8, 255], gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT8)
    w.add_key_value("test.nested", [[1, 2], [3], [4, 5, 6]], gguf.GGUFValueType.ARRAY)
    w.add_custom_alignment(64)  # sets the writer's padding as well as general.alignment

    for qtype in LEGACY:
        values = rng.standard_normal((4, 64)).astype(np.float32)
        if qtype == T.F32:
            stored = values
        elif qtype == T.F16:
            stored = values.astype(np.float16)
        else:
            stored = gguf.quants.quantize(values, qtype)
        expected = gguf.quants.dequantize(stored.view(np.uint8) if qtype in (T.F32, T.F16) else stored, qtype)
        w.add_tensor(f"q.{qtype.name}", stored, raw_dtype=qtype if stored.dtype == np.uint8 else None)
        w.add_tensor(f"expected.{qtype.name}", np.asarray(expected, np.float32).reshape(4, 64))

    for qtype in KQUANTS:
        blocks = random_kquant_blocks(qtype, 2 * 2)  # shape [2, 512]: 2 rows of 2 blocks
        stored = blocks.reshape(2, -1)
        expected = q8k_dequantize(blocks) if qtype == T.Q8_K else gguf.quants.dequantize(stored, qtype)
        w.add_tensor(f"q.{qtype.name}", stored, raw_dtype=qtype)
        w.add_tensor(f"expected.{qtype.name}", np.asarray(expected, np.float32).reshape(2, 512))
    finish(w)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def f16_values(*shape, scale=0.1):
    return (rng.standard_normal(shape) * scale).astype(np.float16)


def llama_cpp_permute(w, n_head):
    """The row order llama.cpp's converter gives Q/K of `llama` models: per head, the two
    rotary halves interleaved (row i of each half → rows 2i, 2i + 1)."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_divisors(head_dim, theta, factor, low_freq_factor, high_freq_factor, original):
    """What llama.cpp's converter stores as rope_freqs.weight for Llama 3.1's rope_scaling:
    per rotary frequency, the divisor transformers' "llama3" rope applies."""
    divisors = []
    for i in range(0, head_dim, 2):
        wavelength = 2 * np.pi * theta ** (i / head_dim)
        if wavelength < original / high_freq_factor:
            divisors.append(1.0)
        elif wavelength > original / low_freq_factor:
            divisors.append(factor)
        else:
            smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def write_tiny(arch, layers, hidden, heads, kv_heads, ffn, vocab, head_dim=None,
               tied=False, qkv_bias=False, qk_norm=False, rope_scaling=None,
               name=None, theta=None, context=256, llama3_rope=None, checkpoint=True):
    hd = head_dim or hidden // heads
    hf, ggml = {}, {}

    def put(hf_name, gguf_name, value, permute_heads=None):
        hf[hf_name] = value
        ggml[gguf_name] = llama_cpp_permute(value, permute_heads) if permute_heads else value

    put("model.embed_tokens.weight", "token_embd.weight", f16_values(vocab, hidden))
    permute = arch == "llama"
    for i in range(layers):
        p, g = f"model.layers.{i}.", f"blk.{i}."
        put(p + "input_layernorm.weight", g + "attn_norm.weight", f16_values(hidden, scale=1.0))
        put(p + "self_attn.q_proj.weight", g + "attn_q.weight", f16_values(heads * hd, hidden), heads if permute else None)
        put(p + "self_attn.k_proj.weight", g + "attn_k.weight", f16_values(kv_heads * hd, hidden), kv_heads if permute else None)
        put(p + "self_attn.v_proj.weight", g + "attn_v.weight", f16_values(kv_heads * hd, hidden))
        if qkv_bias:
            put(p + "self_attn.q_proj.bias", g + "attn_q.bias", f16_values(heads * hd))
            put(p + "self_attn.k_proj.bias", g + "attn_k.bias", f16_values(kv_heads * hd))
            put(p + "self_attn.v_proj.bias", g + "attn_v.bias", f16_values(kv_heads * hd))
        if qk_norm:
            put(p + "self_attn.q_norm.weight", g + "attn_q_norm.weight", f16_values(hd, scale=1.0))
            put(p + "self_attn.k_norm.weight", g + "attn_k_norm.weight", f16_values(hd, scale=1.0))
        put(p + "self_attn.o_proj.weight", g + "attn_output.weight", f16_values(hidden, heads * hd))
        put(p + "post_attention_layernorm.weight", g + "ffn_norm.weight", f16_values(hidden, scale=1.0))
        put(p + "mlp.gate_proj.weight", g + "ffn_gate.weight", f16_values(ffn, hidden))
        put(p + "mlp.up_proj.weight", g + "ffn_up.weight", f16_values(ffn, hidden))
        put(p + "mlp.down_proj.weight", g + "ffn_down.weight", f16_values(hidden, ffn))
    put("model.norm.weight", "output_norm.weight", f16_values(hidden, scale=1.0))
    if not tied:
        put("lm_head.weight", "output.weight", f16_values(vocab, hidden))

    name = name or f"{arch}-tiny"
    w = gguf.GGUFWriter(OUT / f"{name}.gguf", arch)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if head_dim:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    theta = theta or (1e6 if arch != "llama" else 100000.0)
    w.add_rope_freq_base(theta)
    if rope_scaling:
        kind, factor, orig = rope_scaling
        w.add_rope_scaling_type(kind)
        w.add_rope_scaling_factor(factor)
        if orig:
            w.add_rope_scaling_orig_ctx_len(orig)
    w.add_vocab_size(vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if llama3_rope:
        w.add_tensor("rope_freqs.weight", llama3_rope_divisors(hd, theta, **llama3_rope))
    for tensor_name, value in ggml.items():
        w.add_tensor(tensor_name, value)
    finish(w)
    if checkpoint:
        save_file({k: np.ascontiguousarray(v) for k, v in hf.items()}, OUT / f"{name}.hf.safetensors")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    write_quant()
    write_tiny("llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=40)
    write_tiny("qwen2", layers=1, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=40, tied=True,
               qkv_bias=True, rope_scaling=(gguf.RopeScalingType.LINEAR, 2.0, None))
    write_tiny("qwen3", layers=1, hidden=32, heads=4, kv_heads=2, ffn=48, vocab=40, head_dim=16,
               tied=True, qk_norm=True, rope_scaling=(gguf.RopeScalingType.YARN, 4.0, 64))
    # Llama 3.1's rope scaling (its real values), as rope_freqs.weight: 32 frequencies of which
    # 3 fall in the smooth band. Only the config is checked, so no checkpoint is written.
    write_tiny("llama", layers=1, hidden=64, heads=1, kv_heads=1, ffn=8, vocab=8, tied=True,
               name="llama3-tiny", theta=500000.0, context=131072, checkpoint=False,
               llama3_rope=dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original=8192))
    for f in sorted(OUT.iterdir()):
        print(f"{f}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
