"""The official `openai` Python client against a running `sinter serve`.

Usage: python3 openai_client.py BASE_URL MODEL API_KEY
Runs a completion, a chat completion, a streamed completion and a streamed chat completion,
checks their shapes, checks that a bad request raises the client's BadRequestError, and
prints "openai client: 5 passed, 0 failed" at the end (any failure raises).
"""
import sys

import openai

base, model, key = sys.argv[1], sys.argv[2], sys.argv[3]
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

print("openai client: 5 passed, 0 failed")
