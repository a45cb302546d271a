"""A chat or completions body's JSON read without building its logprob entries, when they are `token_id:N`.

Most of a body with logprobs is the logprobs (100 tokens with 5 alternatives: 70 of 71 KB), and the
id reader throws nearly all of it away (an id carries the bytes). The compiled scanner
(`_fastpath_json.c`) reads `choices[0].logprobs` straight into a `TokenBatch` (ids and logprobs in flat
arrays, `_fastpath_body.c`: no Token per position) and cuts it out; orjson reads the rest. The result
is the body as orjson would give it, with that chat `content` (or the completions `logprobs`) as the
batch, which `parse_chat` (`parse_completions`) takes as the id reader's answer. Any other body is
read by orjson as before.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.logprobs.compiled import fastpath
from gateway.logprobs.parse import ParseOptions, id_table


def load_json(raw: bytes, options: ParseOptions) -> Any:
    """The body loader of every dialect without a faster one."""
    return orjson.loads(raw)


def load_chat_body(raw: bytes, options: ParseOptions) -> Any:
    """A chat completion or stream chunk -> its JSON object (see the module docstring)."""
    return _load_body(raw, options, False)


def load_completions_body(raw: bytes, options: ParseOptions) -> Any:
    """A legacy completion -> its JSON object (see the module docstring)."""
    return _load_body(raw, options, True)


def _load_body(raw: bytes, options: ParseOptions, completions: bool) -> Any:
    if fastpath is None or options.vocab is None or type(raw) is not bytes:
        return orjson.loads(raw)
    table, flags = id_table(options.vocab)
    split = fastpath.split_body(raw, completions, table, flags)
    if split is None:
        return orjson.loads(raw)
    body, batch = split
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return orjson.loads(raw)  # raises the error the whole body gives (the scanner keeps validity)
    data["choices"][0]["logprobs"] = batch if completions else {"content": batch}
    return data
