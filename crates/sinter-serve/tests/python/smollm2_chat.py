"""The official `openai` Python client asks a served SmolLM2-135M-Instruct a question.

Usage: python3 smollm2_chat.py BASE_URL MODEL
A greedy chat completion of "What is the capital of France?" (16 tokens at most), whole and
streamed: the answer names Paris, both give the same text, and finish_reason agrees with the
token count ("length" only at the limit). Prints "smollm2 chat: ok" at the end.
"""
import sys

import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base + "/v1", api_key="none", timeout=120, max_retries=0)
MAX = 16
question = [{"role": "user", "content": "What is the capital of France?"}]

chat = client.chat.completions.create(model=model, messages=question, max_tokens=MAX, temperature=0)
answer = chat.choices[0].message.content
finish = chat.choices[0].finish_reason
used = chat.usage.completion_tokens
print(f"answer: {answer!r} ({used} tokens, {finish})")
assert chat.model == model, chat.model
assert "Paris" in answer, answer
# "length" exactly at the limit; "stop" (an end-of-turn token, counted) at or before it.
assert (finish == "length" and used == MAX) or (finish == "stop" and used <= MAX), (finish, used)
assert "<|im_end|>" not in answer and "<|im_start|>" not in answer, answer

pieces, streamed_finish = [], None
for chunk in client.chat.completions.create(
    model=model, messages=question, max_tokens=MAX, temperature=0, stream=True
):
    for choice in chunk.choices:
        pieces.append(choice.delta.content or "")
        streamed_finish = choice.finish_reason or streamed_finish
assert "".join(pieces) == answer, (pieces, answer)
assert streamed_finish == finish, (streamed_finish, finish)
print("smollm2 chat: ok")
