"""OpenAI's own conventions, and the fallback for unknown OpenAI-compatible servers.

Chat token strings write undecodable bytes as literal `\\xNN` beside exact `bytes`; legacy
completions spell such tokens `bytes:\\xNN`. `bytes` are judged per token (exact unless they are a
lossy decode), so a server that only claims compatibility is still read safely.
"""

from __future__ import annotations

from gateway.upstreams.openai_compatible import Flavor

FLAVOR = Flavor(name="OpenAI-compatible", trust_bytes=None, escapes=True, prompt_logprobs=True)
