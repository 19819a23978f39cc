#!/usr/bin/env python3
"""Dump a GGUF file's tokenizer metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) as JSON
with the field names of sinter's `GgufVocab`, so the Rust tests can build the tokenizer from a
real file before sinter reads GGUF itself.

    python3 bench/llm/gguf_vocab_dump.py MODEL.gguf OUT.json

Needs the PyPI packages `gguf` and `numpy`. Writes OUT.json atomically (a temporary file renamed
into place), so a reader never sees half a file.
"""
import json
import os
import sys

# GgufVocab field <- metadata key
FIELDS = {
    "model": "tokenizer.ggml.model",
    "pre": "tokenizer.ggml.pre",
    "tokens": "tokenizer.ggml.tokens",
    "scores": "tokenizer.ggml.scores",
    "token_type": "tokenizer.ggml.token_type",
    "merges": "tokenizer.ggml.merges",
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "unknown_token_id": "tokenizer.ggml.unknown_token_id",
    "padding_token_id": "tokenizer.ggml.padding_token_id",
    "eot_token_id": "tokenizer.ggml.eot_token_id",
    "add_bos_token": "tokenizer.ggml.add_bos_token",
    "add_eos_token": "tokenizer.ggml.add_eos_token",
    "add_space_prefix": "tokenizer.ggml.add_space_prefix",
    "chat_template": "tokenizer.chat_template",
}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gguf_vocab_dump.py MODEL.gguf OUT.json")
    path, out = sys.argv[1], sys.argv[2]
    try:
        from gguf import GGUFReader
    except ImportError as e:
        sys.exit(f"gguf_vocab_dump.py: cannot import the gguf package ({e}); "
                 "install it with: python3 -m pip install gguf numpy")
    reader = GGUFReader(path)
    vocab = {}
    for name, key in FIELDS.items():
        field = reader.fields.get(key)
        if field is None:
            continue
        value = field.contents()
        if hasattr(value, "tolist"):
            value = value.tolist()
        vocab[name] = value
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False)
    os.replace(tmp, out)


if __name__ == "__main__":
    main()
