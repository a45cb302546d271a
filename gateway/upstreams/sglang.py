"""SGLang: OpenAI-compatible APIs with lossy `bytes` (UTF-8 of each id decoded alone, `"�"`),
alternatives keyed by text (colliding strings collapse) and float32-lowest sentinels.

Without a tokenizer the text repairs the sampled tokens; its native `/generate` with token ids
(`api: generate`) is the exact route.
"""

from __future__ import annotations

from gateway.upstreams.openai_compatible import Flavor

FLAVOR = Flavor(name="SGLang", trust_bytes=None)
