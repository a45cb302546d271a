"""llama.cpp server: OpenAI-compatible APIs whose entries carry exact raw `bytes` and the token `id`.

Its /v1/completions answers with the chat-style `logprobs: {content: [...]}`, and a token that
leaves a character incomplete gets no entry of its own (the completing token carries the whole
character), so entries are per completed character there. Logprobs are asked for only when the
client wants them (issue 20: 18 of 144 requests that stopped inside a character, some never asking
for logprobs, failed on entries llama-server never sent); then `top_logprobs` is always sent (it
returns none for 0).
"""

from __future__ import annotations

from gateway.upstreams.openai_compatible import Flavor

# Its `bytes` are the truth: a completing token's bytes hold the whole character, more than its id's.
FLAVOR = Flavor(name="llama.cpp", trust_bytes=True, chat_shaped_completions=True, read_ids=False,
                min_top_logprobs=1, logprobs_when_asked=True)
