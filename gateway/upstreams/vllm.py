"""vLLM: the OpenAI-compatible APIs with token-id placeholders and a sampled-first top list.

We send `return_tokens_as_token_ids` whenever the model's tokenizer is configured, so every token
(sampled and alternative) is a `token_id:N` placeholder whose bytes are exact; vLLM's own `bytes`
(UTF-8 of a lossy decode) are never used then. Without a tokenizer the lossy strings are aligned
against the final text. vLLM puts the sampled token first in a list of k, so we ask for k+1.
"""

from __future__ import annotations

from gateway.upstreams.openai_compatible import Flavor

FLAVOR = Flavor(name="vLLM", token_id_placeholders=True, sampled_first=True, trust_bytes=None,
                prompt_logprobs=True)
