#!/usr/bin/env python3
"""Reference token ids and chat prompts for sinter's tokenizer tests (crates/sinter-data/tests/).

Writes, into crates/sinter-data/tests/fixtures/tokenizer/:

  cases.json  1,000 lines of mixed text, made deterministically here (Unicode in several
              scripts, emoji, whitespace runs, tabs and newlines, digits, code, the special
              tokens themselves inline), and the ids Hugging Face gives for them:
                smollm2       transformers' AutoTokenizer on SmolLM2-135M-Instruct.Q4_1.gguf
                              (the GGUF vocabulary as transformers converts it), with the digit
                              split of the pre-tokenizer the file names ("smollm"; see below)
                smollm2_transformers_raw
                              {line: ids} where transformers' conversion, which has no entry for
                              "smollm" and so splits no digits, differs from that
                smollm2_special  ids with add_special_tokens=True, first 50 lines
                minilm        the MiniLM tokenizer.json through the `tokenizers` package,
                              add_special_tokens=True ([CLS] ... [SEP]), no truncation/padding
                other_pre     {pre: ids} for the first 100 lines with SmolLM2's vocabulary
                              under other pre-tokenizer names ("llama-bpe", "qwen2", "gpt2"),
                              as transformers' GGUF converter splits for them
                spm           a small SentencePiece ("llama") GGUF vocabulary made here, with
                              tied scores, byte tokens and a user-defined token, and the ids
                              transformers' GGUF converter gives for the first 200 lines
                spm_flat      the same with all pieces at one score (only tie-breaks rank)
  chat.json   SmolLM2's chat template (and a template exercising Python string methods,
              loop controls, namespace, tojson and raise_exception) rendered by transformers'
              apply_chat_template for a few conversations, with and without a system message
              and add_generation_prompt.

The "smollm" pre-tokenizer (llama.cpp's table; SmolLM2's own tokenizer.json has
Digits(individual_digits=True) before ByteLevel) puts every digit in a word of its own. For ASCII
digits that changes nothing in SmolLM2's vocabulary, which has no multi-digit tokens; for other
numerals (Arabic-Indic, superscripts) transformers' GGUF conversion, which drops the digit split,
gives different ids than the model was trained with. The fixture records both.

Run with an environment that has transformers, tokenizers, gguf, numpy and jinja2:

    /tmp/llmvenv/bin/python bench/llm/tokenizer_ref.py
"""
import json
import os
import random
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "crates", "sinter-data", "tests", "fixtures", "tokenizer")
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
N_LINES = 1000

PIECES = [
    # English, contractions, punctuation
    "Hello", "world", "The quick brown fox", "jumps over the lazy dog.", "don't", "I'LL",
    "we've", "it's", "they'd", "O'Neil's", "e.g.", "...", "?!", "(parenthesised)", "[brackets]",
    "{braces}", "\"quoted\"", "'single'", "well-known", "state-of-the-art", "C++", "@user",
    "#hashtag", "https://example.com/path?q=1&r=2", "user@example.org", "50%", "$19.99",
    # European scripts with accents
    "naïve", "café", "Straße", "Ærøskøbing", "façade", "Ñandú", "œuvre", "İstanbul", "ﬁne",
    # Greek, Cyrillic, Armenian, Georgian
    "Καλημέρα κόσμε", "Привет, мир", "Съешь же ещё этих мягких французских булок", "Բարեւ",
    "გამარჯობა",
    # Right-to-left
    "مرحبا بالعالم", "שלום עולם", "سلام",
    # Indic, Thai
    "नमस्ते दुनिया", "ভাষা", "தமிழ்", "สวัสดีชาวโลก",
    # CJK
    "你好，世界", "日本語のテキスト", "カタカナ", "ひらがな", "안녕하세요 세계", "漢字",
    # Emoji, including ZWJ sequences, skin tones, flags, keycaps
    "😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷🇯🇵", "1️⃣", "❤️", "🤖", "🦀", "✨🎉",
    # Combining marks, invisibles, rare planes
    "e\u0301", "a\u0308\u0304", "zero\u200bwidth", "soft\u00adhyphen", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "𓀀", "\ufeffBOM",
    # Numbers
    "0", "7", "42", "12345", "3.14159", "1,000,000", "-273.15", "1e-9", "0x1F", "2026-11-28",
    "12:15", "٣٤٥", "²³", "１２３", "Ⅻ", "½", "৩", "๑๒",
    # Code
    "def f(x):\n    return x ** 2", "fn main() { println!(\"hi\"); }", "for (int i = 0; i < n; ++i)",
    "<div class=\"a\">text</div>", "x != y && z >= 0", "a+=1;", "SELECT * FROM t WHERE id = 3;",
    "#include <stdio.h>", "let v: Vec<u32> = vec![];", "{\"key\": [1, 2, 3]}", "$ cargo test -p x",
    "if __name__ == \"__main__\":", "//", "/* c */", "->", "=>", "::", "...",
    # Special tokens written in text
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>", "[CLS]", "[SEP]",
    "[MASK]", "[UNK]", "<|im_start|>user\nhi<|im_end|>", "<s>", "</s>",
]

SEPARATORS = ["", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\t\t", "\u00a0",
              "\u3000", "    "]

EDGE_LINES = ["", " ", "\n", "\t", "   leading spaces", "trailing spaces   ", "\n\nnewlines\n\n",
              "a", "<|im_start|>", "<|im_end|><|im_end|>", "   \t \n  ", "١٢٣ 123 ¹²³"]


def make_lines():
    rng = random.Random(25)
    lines = list(EDGE_LINES)
    while len(lines) < N_LINES:
        n = rng.randint(2, 9)
        parts = []
        for _ in range(n):
            parts.append(rng.choice(PIECES))
            parts.append(rng.choice(SEPARATORS))
        lines.append("".join(parts[:-1]))
    return lines


def fetch_weights(name):
    return subprocess.run([os.path.join(ROOT, ".ci", "fetch-weights"), name], check=True,
                          capture_output=True, text=True).stdout.strip()


def smollm2_ids(lines, smol_dir):
    import copy

    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smol_dir, gguf_file=GGUF_NAME)
    raw = tok.backend_tokenizer
    # transformers' conversion plus the digit split the file's pre-tokenizer ("smollm") stands
    # for, written the way SmolLM2's own tokenizer.json writes it.
    split = copy.deepcopy(raw)
    split.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
    ])
    ids, raw_differs = [], {}
    for i, line in enumerate(lines):
        a = split.encode(line, add_special_tokens=False).ids
        b = tok(line, add_special_tokens=False)["input_ids"]
        ids.append(a)
        if a != b:
            raw_differs[str(i)] = b
    # transformers' post-processor (the backend's), on the split pre-tokenizer.
    special = [split.encode(line, add_special_tokens=True).ids for line in lines[:50]]
    assert all(tok(line)["input_ids"] == raw.encode(line).ids for line in lines[:50])
    return tok, ids, raw_differs, special


def other_pre_ids(lines, smol_dir):
    """SmolLM2's vocabulary as if the file named another pre-tokenizer: checks the regular
    expressions of those names against transformers' (Python `tokenizers`, Oniguruma)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer, get_gguf_tokenizer)

    architecture, tokenizer_dict, _ = get_gguf_tokenizer(os.path.join(smol_dir, GGUF_NAME))
    out = {}
    for pre in ("llama-bpe", "qwen2", "gpt2"):
        backend, _ = convert_gguf_tokenizer(architecture,
                                            dict(tokenizer_dict, pre_tokenizer_type=pre))
        out[pre] = [backend.encode(line, add_special_tokens=False).ids for line in lines[:100]]
    return out


def minilm_ids(lines, minilm_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(os.path.join(minilm_dir, "tokenizer.json"))
    tok.no_truncation()
    tok.no_padding()
    return [tok.encode(line, add_special_tokens=True).ids for line in lines]


def spm_case(lines, flat=False):
    """A SentencePiece vocabulary in GGUF form: no merges, so the converter must rank the merges
    it recovers from the scores. Pieces share scores in threes, or with `flat` all share one,
    so that only the tie-breaks (lengths of the halves, vocabulary order) rank them."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    words = ("the quick brown fox jumps over the lazy dog hello world the theory of everything "
             "is hard but then there were three other thoughts").split()
    counts = {}
    for word in words:
        word = "\u2581" + word
        for i in range(len(word)):
            for j in range(i + 2, min(len(word), i + 5) + 1):
                counts[word[i:j]] = counts.get(word[i:j], 0) + 1
    pieces = sorted(counts, key=lambda p: (-counts[p], p))[:150]
    chars = ["\u2581"] + sorted(set("".join(words)))
    tokens = (["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + chars + pieces
              + ["<think>"])
    scores = ([0.0] * 259 + [-1000.0 - i for i in range(len(chars))]
              + [-1.0 if flat else -float(i // 3) for i in range(len(pieces))] + [0.0])
    token_type = [2, 3, 3] + [6] * 256 + [1] * (len(chars) + len(pieces)) + [4]
    vocab = {"model": "llama", "tokens": tokens, "scores": scores, "token_type": token_type,
             "bos_token_id": 1, "eos_token_id": 2, "unknown_token_id": 0}
    backend, _ = convert_gguf_tokenizer("llama", {
        "tokenizer_type": "llama", "tokens": tokens, "scores": scores, "token_type": token_type,
        "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0})
    texts = lines[:200] + ["<think>hello world</think>", "the  theory", " leading", "é ü 😀"]
    return {"vocab": vocab, "texts": texts,
            "ids": [backend.encode(t, add_special_tokens=False).ids for t in texts]}


RICH_TEMPLATE = (
    "{%- set ns = namespace(system='') -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}{%- set ns.system = m.content.strip() -%}{%- continue -%}{%- endif -%}"
    "{%- if m.role not in ['user', 'assistant'] -%}{{ raise_exception('unknown role ' + m.role) }}{%- endif -%}"
    "[{{ loop.index0 }}:{{ m.role.upper() }}]{{ m.content.strip() | tojson }}"
    "{%- if m.content.startswith('Stop') -%}{%- break -%}{%- endif %}\n"
    "{% endfor -%}"
    "{%- if ns.system %}system={{ ns.system.split(' ') | tojson }}\n{% endif -%}"
    "{{ {'n': messages | length, 'gen': add_generation_prompt, 'bos': bos_token, 'eos': eos_token} | tojson }}\n"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are terse."},
     {"role": "user", "content": "What is 2+2?"},
     {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3+3?"}],
    [{"role": "user", "content": "  Ünïcödé ✓ 你好 <b>&'\"\n\tindented  "},
     {"role": "assistant", "content": "Stop here. "},
     {"role": "user", "content": "never shown by the rich template"}],
    [{"role": "system", "content": "  Answer in French, please.  "},
     {"role": "user", "content": ""}],
]


def chat_cases(tok):
    cases = []
    for name, template in [("smollm2", None), ("rich", RICH_TEMPLATE)]:
        for conv in CONVERSATIONS:
            for gen in (False, True):
                text = tok.apply_chat_template(conv, chat_template=template, tokenize=False,
                                               add_generation_prompt=gen)
                cases.append({"template": name, "messages": conv, "add_generation_prompt": gen,
                              "text": text})
    return {"bos_token": tok.bos_token, "eos_token": tok.eos_token,
            "smollm2_template": tok.chat_template,
            "rich_template": RICH_TEMPLATE, "cases": cases}


def main():
    lines = make_lines()
    smol_dir, minilm_dir = fetch_weights("smollm2"), fetch_weights("minilm")
    tok, smol, smol_raw, smol_special = smollm2_ids(lines, smol_dir)
    cases = {"texts": lines, "smollm2": smol, "smollm2_transformers_raw": smol_raw,
             "smollm2_special": smol_special, "minilm": minilm_ids(lines, minilm_dir),
             "other_pre": other_pre_ids(lines, smol_dir), "spm": spm_case(lines),
             "spm_flat": spm_case(lines, flat=True)}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "cases.json"), "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    with open(os.path.join(OUT, "chat.json"), "w", encoding="utf-8") as f:
        json.dump(chat_cases(tok), f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_tokens = sum(map(len, smol)) + sum(map(len, cases["minilm"]))
    print(f"{len(lines)} lines, {n_tokens} ids; transformers' raw GGUF conversion differs on "
          f"{len(smol_raw)} lines; wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
