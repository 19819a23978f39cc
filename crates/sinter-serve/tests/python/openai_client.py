"""The official `openai` Python client against a running `sinter serve`.

Usage: python3 openai_client.py BASE_URL MODEL API_KEY EMBEDDING_MODEL
Runs a completion, a chat completion, a streamed completion and a streamed chat completion,
checks their shapes, checks that a bad request raises the client's BadRequestError, asks
for embeddings (the client's default base64 encoding and floats) and for a JSON object
(response_format), and prints "openai client: 7 passed, 0 failed" at the end (any failure
raises).
"""
import json
import math
import sys

import openai

base, model, key, embed_model = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
client = openai.OpenAI(base_url=base + "/v1", api_key=key, timeout=60, max_retries=0)

c = client.completions.create(model=model, prompt="ROMEO:", max_tokens=8, temperature=0, seed=1)
assert c.object == "text_completion", c
assert c.choices[0].finish_reason in ("length", "stop"), c
assert c.usage.prompt_tokens == 6 and c.usage.completion_tokens <= 8, c.usage
again = client.completions.create(model=model, prompt="ROMEO:", max_tokens=8, temperature=0, seed=1)
assert again.choices[0].text == c.choices[0].text

chat = client.chat.completions.create(
    model=model,
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
    max_tokens=6,
)
assert chat.object == "chat.completion", chat
assert chat.choices[0].message.role == "assistant", chat
assert isinstance(chat.choices[0].message.content, str)

pieces = []
finish = None
for chunk in client.completions.create(
    model=model, prompt="ROMEO:", max_tokens=8, temperature=0, seed=1, stream=True
):
    pieces.append(chunk.choices[0].text)
    finish = chunk.choices[0].finish_reason or finish
assert "".join(pieces) == c.choices[0].text, (pieces, c.choices[0].text)
assert finish == c.choices[0].finish_reason

usage = None
content = []
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Hi"}],
    max_tokens=5,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage
    for choice in chunk.choices:
        content.append(choice.delta.content or "")
assert usage is not None and usage.completion_tokens <= 5, usage

try:
    client.completions.create(model=model, prompt="x", max_tokens=0)
    raise AssertionError("max_tokens=0 was accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
    assert "max_tokens" in str(e)

# The client asks for base64 unless told otherwise, and decodes it itself.
e = client.embeddings.create(model=embed_model, input=["hello", "a longer one"])
assert len(e.data) == 2 and [d.index for d in e.data] == [0, 1], e
vec = e.data[1].embedding
assert len(vec) == 32 and abs(math.sqrt(sum(x * x for x in vec)) - 1) < 1e-4, vec
assert e.usage.prompt_tokens == len("hello") + len("a longer one"), e.usage
floats = client.embeddings.create(model=embed_model, input="a longer one", encoding_format="float")
assert max(abs(a - b) for a, b in zip(floats.data[0].embedding, vec)) < 1e-6

j = client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "JSON please"}],
    max_tokens=40,
    seed=2,
    response_format={"type": "json_object"},
)
assert isinstance(json.loads(j.choices[0].message.content), dict), j

print("openai client: 7 passed, 0 failed")
