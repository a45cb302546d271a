"""The pure, I/O-free logprob core.

Every token is a run of exact bytes with a logprob; each wire format is a spelling of it.
Parse upstream spellings into `Token`s, render `Token`s into any client format.
"""

from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Origin, Token, normalize_logprob

__all__ = ["SENTINEL_LOGPROB", "Candidate", "Origin", "Token", "normalize_logprob"]
