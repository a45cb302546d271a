"""How each wire format spells a token's bytes as a string, both ways.

- chat / responses: the UTF-8 text, with bytes that do not decode written as literal `\\xNN`
  (OpenAI's own convention; the exact bytes travel beside it in `bytes`);
- legacy completions: a token that is not valid UTF-8 on its own is `bytes:` + every byte as
  `\\xNN` (OpenAI GPT-3 convention; there is no `bytes` field to carry the truth);
- vLLM `return_tokens_as_token_ids`: `token_id:N`.
"""

from __future__ import annotations

import re

REPLACEMENT_CHAR = "\ufffd"
_BYTES_PREFIX = "bytes:"
_BYTES_SPELLING = re.compile(r"bytes:((?:\\x[0-9a-fA-F]{2})+)")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def chat_token_string(data: bytes) -> str:
    """The chat/responses `token` string: UTF-8 text, undecodable bytes as literal `\\xNN`."""
    return data.decode("utf-8", errors="backslashreplace")


def completions_token_string(data: bytes) -> str:
    """The legacy completions `tokens[i]` string.

    Valid UTF-8 stays text; anything else (or text that itself starts with `bytes:`, which would
    otherwise read back as escapes) is written `bytes:` + all bytes escaped, so the spelling is
    injective and reads back exactly.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and not text.startswith(_BYTES_PREFIX):
        return text
    return _BYTES_PREFIX + "".join(f"\\x{b:02x}" for b in data)


def parse_bytes_spelling(token: str) -> bytes | None:
    """`bytes:\\xe6\\xa0` -> b'\\xe6\\xa0'; None if `token` is not in that spelling."""
    match = _BYTES_SPELLING.fullmatch(token)
    if match is None:
        return None
    return bytes.fromhex(match.group(1).replace("\\x", ""))


TOKEN_ID_PREFIX = "token_id:"


def parse_token_id(token: str) -> int | None:
    """`token_id:1234` -> 1234; None if `token` is not a vLLM id placeholder."""
    # Same language as `token_id:(\d+)` (str.isdecimal is exactly regex \d: Unicode category Nd),
    # without the regex engine: this runs for every token and every alternative.
    if token.startswith(TOKEN_ID_PREFIX):
        digits = token[9:]
        if digits.isdecimal():
            return int(digits)
    return None


def unescape_chat_token(token: str) -> bytes:
    """Read an OpenAI chat token string with literal `\\xNN` escapes back into bytes.

    Only for upstreams that use that convention and sent no `bytes`: a literal backslash-x in
    real text is indistinguishable here, which is why `bytes` wins whenever it is present.
    """
    out = bytearray()
    last = 0
    for match in _ESCAPE.finditer(token):
        out += token[last : match.start()].encode()
        out.append(int(match.group(1), 16))
        last = match.end()
    out += token[last:].encode()
    return bytes(out)


def is_lossy_string(token: str) -> bool:
    """True when a decoded token string cannot stand for its bytes: it is empty (a fragment whose
    character completes later) or holds U+FFFD (bytes replaced by `errors="replace"`)."""
    return token == "" or REPLACEMENT_CHAR in token


_SPECIAL_SPELLING = re.compile(r"<\|[^|<>]*\|>|<｜[^<>]*｜>|</?s>|<[a-z_]+>|\[[A-Z_]+\]")


def looks_like_special(token: str) -> bool:
    """Heuristic for control tokens in upstreams that send no ids or `special` flag
    (`<|im_end|>`, `</s>`, `<｜end▁of▁sentence｜>`, `[EOS]`): such a token may carry no text."""
    return bool(_SPECIAL_SPELLING.fullmatch(token))
