"""An OpenAI API *simulator*: OpenAI's own wire conventions, with no model behind it.

Scripted text and synthetic, deterministic probabilities (see `synthetic.py`), driven by a real
tokenizer. This is not OpenAI, does not talk to OpenAI and holds no OpenAI model or tokenizer; it
writes what a client of api.openai.com sees, so the gateway can be tested against an upstream that
uses OpenAI's conventions rather than an open-source server's. Sources: the OpenAPI spec, the
`openai` SDK types, recorded OpenAI streams (see /work/shared/reference/openai-wire-formats.md
sections 3 and 4). What is reproduced:

Chat (`POST /v1/chat/completions`)
- `logprobs: true` with `top_logprobs` 0..20; entries `{token, logprob, bytes, top_logprobs:
  [{token, logprob, bytes}]}`. `bytes` are the token's exact raw bytes; `token` is their UTF-8
  text with every undecodable byte written as a literal `\\xNN` (lowercase hex), so a token that
  holds part of a character reads `"\\xf0\\x9f\\x91"` in JSON, no `bytes:` prefix;
- top lists are the TRUE top-k, best first: the sampled token is not forced in and need not be
  first; the end token is never an entry and is not counted in `completion_tokens` (recorded
  streams: "Foo" + "!" = 2 completion tokens); `-9999.0` is never needed (the sampled logprob is
  always known); logprobs are float32 values printed shortest (`-0.0025094282`);
- a control token among the alternatives is shown by its name with `bytes: null`: the spec's
  "null if there is no bytes representation for the token" (INFERRED, not seen in a recording);
- not requested: `"logprobs": null` in the body, no `logprobs` key in stream chunks (as recorded);
- `top_logprobs` without `logprobs: true` -> 400 "The 'top_logprobs' parameter is only allowed
  when 'logprobs' is enabled." (`param: top_logprobs`, `code: null`), above 20 -> "Invalid value
  for 'top_logprobs': must be less than or equal to 20."; errors are
  `{"error": {"message", "type", "param", "code"}}`;
- streaming: a first chunk `delta: {role: "assistant", content: "", refusal: null}` (with
  `logprobs: {content: [], refusal: null}` when logprobs are on), then ONE chunk per generated
  token: its `delta.content` is the text that token completes, because OpenAI deltas are always
  valid UTF-8. A token that leaves a character incomplete therefore gets a chunk with
  `content: ""` (or just the complete part, e.g. " " for Qwen2's b" \\xf0\\x9f\\x91") and its own
  logprob entry; the token that completes the character carries the character. Then
  `delta: {}` with `finish_reason` (`logprobs: null`), with `stream_options.include_usage` a usage
  chunk with `choices: []` (and `"usage": null` on every other chunk), then `data: [DONE]`.
  Every chunk carries a random `obfuscation` string unless `stream_options.include_obfuscation`
  is false, as OpenAI does by default.

Legacy completions (`POST /v1/completions`)
- `logprobs` an integer 0..5 (above 5: 400 `integer_above_max_value`); `max_tokens` defaults to
  16 when absent (confirmed by OpenAI) and also when `null` (the spec's nullable-with-default
  reading; UNVERIFIED, and unlike vLLM, where null means "up to the context length"), and may be
  0; `echo` prepends the prompt: prompt tokens come first with `token_logprobs[0] = null` and
  `top_logprobs[0] = null` (no context for the first token);
- `tokens[i]`: the token's text if its bytes are valid UTF-8 on their own, else `bytes:` followed
  by EVERY byte as `\\xNN` (`"bytes:\\x20\\xf0\\x9f\\x91"`); `top_logprobs[i]` dicts hold the true
  top k plus the sampled token when it is not among them (so up to logprobs+1 keys), keys spelled
  the same way, best first;
- `text_offset`: code-point offsets into prompt + completion text, so the first generated token's
  offset is len(prompt) even without echo (the community's reading of OpenAI; UNVERIFIED against
  OpenAI). A token that leaves a character incomplete sits at the offset of that character;
- streaming: one chunk per token (text = what the token completes, its one-token `logprobs`), an
  echoed prompt as a first chunk of its own, a final `text: ""` chunk with `finish_reason`, the
  usage chunk when asked for, `data: [DONE]`. No `obfuscation` here (not observed on this route).

Both: usage `{prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details,
completion_tokens_details}` with zero details; the model must be the served one (else 404
`model_not_found`); an in-band stream error is `data: {"error": {...}}` with no `[DONE]` after it
(UNVERIFIED; the SDK raises on such a frame). If generation is cut by max tokens in the middle of
a character, the dangling bytes are written as U+FFFD (tiktoken's `decode` default) in the text,
and in a stream with the last token's delta. `GET /v1/models` lists the one model; `GET /health`
is a convenience (OpenAI has none).

    python -m gateway.simulator.openai --tokenizer-dir ../shared/tokenizers/qwen2 --model gpt-sim

Simulator-only extras (not in OpenAI): fault hooks (see `faults.py`), GET /sim/stats,
GET /sim/requests, POST /sim/reset. Not simulated: `n` > 1, `suffix`, stop sequences (ignored),
tools, refusals (`refusal` is always null), unknown-parameter errors.
"""

from __future__ import annotations

import codecs
import hashlib
import random
import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Unpack

import orjson
from aiohttp import web

from gateway.logprobs.vocab import Vocab
from gateway.simulator.base import (
    DONE_FRAME,
    JSON,
    Admitted,
    BadBody,
    CommonOptions,
    CommonSettings,
    Dialect,
    OpenAIError,
    Rejected,
    Route,
    SimulatorBase,
    SSEWriter,
    is_int,
)
from gateway.simulator.faults import FaultPlan
from gateway.simulator.floats import f32_shortest
from gateway.simulator.synthetic import Position

CHAT_MAX_TOP_LOGPROBS = 20
COMPLETIONS_MAX_LOGPROBS = 5
COMPLETIONS_DEFAULT_MAX_TOKENS = 16
CHAT_DEFAULT_BUDGET = 16384  # chat has no default limit: the scripted reply always ends first
SERVICE_TIER = "default"
DEFAULT_PORT = 8100

Endpoint = Literal["chat", "completions"]

_ID_ALPHABET = string.ascii_letters + string.digits
_JSON_PARSE_MESSAGE = (
    "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP "
    "library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)"
)


# --- spellings ------------------------------------------------------------------------------------------


def chat_token_text(data: bytes) -> str:
    """A chat `token` string: UTF-8 text, each undecodable byte as a literal `\\xNN` (lowercase)."""
    return data.decode("utf-8", errors="backslashreplace")


def completions_token_text(data: bytes) -> str:
    """A legacy completions `tokens[i]` string: text if valid UTF-8 alone, else `bytes:` + all bytes escaped."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in data)


def _number(logprob: float) -> float:
    """A logprob as OpenAI prints it: a float32, shortest decimal."""
    return f32_shortest(logprob)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a decimal"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# --- errors -------------------------------------------------------------------------------------------


def _invalid_type(name: str, expected: str, value: Any) -> OpenAIError:
    return OpenAIError(
        f"Invalid type for '{name}': expected {expected}, but got {_json_type(value)} instead.",
        param=name,
        code="invalid_type",
    )


def _limitation(name: str, detail: str) -> OpenAIError:
    return OpenAIError(f"simulator limitation: {detail}", param=name, code="unsupported_value")


def _optional_int(body: Mapping[str, Any], name: str, minimum: int, maximum: int | None = None) -> int | None:
    """An integer field (null = absent) in OpenAI's bounds, else OpenAI's validation error."""
    value = body.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise _invalid_type(name, "an integer", value)
    if value < minimum:
        raise OpenAIError(
            f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum}, but got {value} instead.",
            param=name,
            code="integer_below_min_value",
        )
    if maximum is not None and value > maximum:
        raise OpenAIError(
            f"Invalid '{name}': integer above maximum value. Expected a value <= {maximum}, but got {value} instead.",
            param=name,
            code="integer_above_max_value",
        )
    return value


def _optional_bool(body: Mapping[str, Any], name: str) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise _invalid_type(name, "a boolean", value)
    return value


# --- the simulator ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OpenAISettings(CommonSettings):
    """Server-wide behaviour; see `create_app`."""


@dataclass(frozen=True, slots=True)
class _Request:
    route: Endpoint
    model: str
    stream: bool
    prompt_ids: list[int]
    prompt_text: str  # completions: the prompt as text (chat: "")
    reply_key: str | None
    max_tokens: int
    logprobs: bool
    top: int  # chat: top_logprobs; completions: logprobs
    echo: bool
    include_usage: bool
    include_obfuscation: bool


@dataclass(frozen=True, slots=True)
class _Token:
    """One generated token a client sees (the end token is never one)."""

    position: Position
    data: bytes
    text: str  # the text this token completes (valid UTF-8 only; "" while a character is pending)
    offset: int  # completions: code points of prompt + completion text before this token


@dataclass(frozen=True, slots=True)
class _Item:
    """One legacy completions logprobs position (prompt or generated)."""

    token: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int


@dataclass(slots=True)
class _Generation:
    request: _Request
    plan: FaultPlan
    cmpl_id: str
    created: int
    tokens: list[_Token]
    finish_reason: str
    steps: list[tuple[int, int]]
    prompt_items: list[_Item]  # completions with echo and logprobs


class OpenAISimulator(SimulatorBase):
    """Request handlers and state of one simulated OpenAI endpoint (one served model)."""

    settings: OpenAISettings

    def __init__(self, vocab: Vocab, model: str, settings: OpenAISettings) -> None:
        super().__init__(vocab, model, settings)
        digest = hashlib.blake2b(f"{model}|{settings.seed}".encode(), digest_size=5).hexdigest()
        self.system_fingerprint = f"fp_{digest}"

    # --- errors ------------------------------------------------------------------------------------

    def fault_response(self, status: int, message: str) -> web.Response:
        kind, code = "invalid_request_error", None
        if status == 401:
            code = "invalid_api_key"
        elif status == 429:
            kind, code = "requests", "rate_limit_exceeded"
        elif status >= 500:
            kind = "server_error"
        return OpenAIError(message, status=status, kind=kind, code=code).response()

    @staticmethod
    def _stream_error() -> bytes:
        error = OpenAIError("simulated failure (x-sim-fault: error_mid_stream)", kind="server_error")
        return b"data: " + orjson.dumps(error.body()) + b"\n\n"

    # --- request parsing ---------------------------------------------------------------------------

    async def _read(self, request: web.Request) -> tuple[JSON, FaultPlan]:
        try:
            return await self.read_request(request)
        except BadBody as exc:
            if exc.kind == "hook":
                raise OpenAIError(exc.detail, param=exc.hook) from None
            raise OpenAIError(_JSON_PARSE_MESSAGE) from None

    def _model(self, body: Mapping[str, Any]) -> str:
        model = body.get("model")
        if model is None:
            raise OpenAIError("Missing required parameter: 'model'.", param="model", code="missing_required_parameter")
        if not isinstance(model, str):
            raise _invalid_type("model", "a string", model)
        if model != self.model:
            raise OpenAIError(
                f"The model `{model}` does not exist or you do not have access to it.",
                status=404,
                code="model_not_found",
            )
        return model

    def _stream_options(self, body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
        """(include_usage, include_obfuscation)."""
        options = body.get("stream_options")
        if options is None:
            return False, True
        if not isinstance(options, Mapping):
            raise _invalid_type("stream_options", "an object", options)
        if not stream:
            raise OpenAIError(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.", param="stream_options"
            )
        usage = _optional_bool(options, "include_usage")
        obfuscation = _optional_bool(options, "include_obfuscation")
        return bool(usage), obfuscation is not False

    @staticmethod
    def _single_choice(body: Mapping[str, Any], names: Sequence[str]) -> None:
        for name in names:
            if _optional_int(body, name, 1) not in (None, 1):
                raise _limitation(name, f"only `{name}: 1` is simulated")

    def _parse_chat(self, body: Mapping[str, Any]) -> _Request:
        model = self._model(body)
        messages = body.get("messages")
        if messages is None:
            raise OpenAIError(
                "Missing required parameter: 'messages'.", param="messages", code="missing_required_parameter"
            )
        if not isinstance(messages, list):
            raise _invalid_type("messages", "an array", messages)
        if not messages:
            raise OpenAIError(
                "Invalid 'messages': empty array. Expected an array with minimum length 1, "
                "but got an empty array instead.",
                param="messages",
                code="empty_array",
            )
        try:
            prompt_ids, key = self.chat_input(messages)
        except ValueError as exc:
            raise OpenAIError(str(exc), param="messages") from None
        logprobs = bool(_optional_bool(body, "logprobs"))
        top_value = body.get("top_logprobs")
        if top_value is not None:
            if not is_int(top_value):
                raise _invalid_type("top_logprobs", "an integer", top_value)
            _optional_int(body, "top_logprobs", 0)
            if top_value > CHAT_MAX_TOP_LOGPROBS:
                raise OpenAIError(
                    f"Invalid value for 'top_logprobs': must be less than or equal to {CHAT_MAX_TOP_LOGPROBS}.",
                    param="top_logprobs",
                )
            if not logprobs:
                raise OpenAIError(
                    "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.", param="top_logprobs"
                )
        limit = _optional_int(body, "max_completion_tokens", 1)
        if limit is None:
            limit = _optional_int(body, "max_tokens", 1)
        self._single_choice(body, ["n"])
        stream = bool(_optional_bool(body, "stream"))
        usage, obfuscation = self._stream_options(body, stream)
        return _Request(
            route="chat",
            model=model,
            stream=stream,
            prompt_ids=prompt_ids,
            prompt_text="",
            reply_key=key,
            max_tokens=CHAT_DEFAULT_BUDGET if limit is None else limit,
            logprobs=logprobs,
            top=top_value or 0,
            echo=False,
            include_usage=usage,
            include_obfuscation=obfuscation,
        )

    def _parse_completions(self, body: Mapping[str, Any]) -> _Request:
        model = self._model(body)
        if body.get("prompt") is None:
            raise OpenAIError(
                "Missing required parameter: 'prompt'.", param="prompt", code="missing_required_parameter"
            )
        given = self.prompt_input(body["prompt"])
        if given is None:
            raise _limitation("prompt", "`prompt` must be one string or one list of token ids")
        prompt_ids, prompt_text = given
        top = _optional_int(body, "logprobs", 0, COMPLETIONS_MAX_LOGPROBS)
        echo = bool(_optional_bool(body, "echo"))
        max_tokens = _optional_int(body, "max_tokens", 0)
        self._single_choice(body, ["n", "best_of"])
        if body.get("suffix") is not None:
            raise _limitation("suffix", "`suffix` is not simulated")
        stream = bool(_optional_bool(body, "stream"))
        usage, _ = self._stream_options(body, stream)
        return _Request(
            route="completions",
            model=model,
            stream=stream,
            prompt_ids=prompt_ids,
            prompt_text=prompt_text,
            reply_key=prompt_text,
            max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
            logprobs=top is not None,
            top=top or 0,
            echo=echo,
            include_usage=usage,
            include_obfuscation=False,
        )

    async def admit(self, request: web.Request, route: str) -> Admitted:
        try:
            body, plan = await self._read(request)
            req = self._parse_chat(body) if route == "chat" else self._parse_completions(body)
        except OpenAIError as exc:
            raise Rejected(exc.response()) from None
        gen = self._generate(req, plan)
        if route == "chat":
            respond, produce = self._respond_chat, self._stream_chat
        else:
            respond, produce = self._respond_completions, self._stream_completions
        return Admitted(
            plan,
            req.stream,
            respond=lambda: respond(request, gen),
            produce=lambda writer: produce(request, gen, writer),
            error_frame=self._stream_error(),
            done_frame=DONE_FRAME,
            done_after_error=False,
        )

    # --- generation --------------------------------------------------------------------------------

    def _generate(self, req: _Request, plan: FaultPlan) -> _Generation:
        eos = self.chat_eos if req.route == "chat" else self.completion_eos
        output = self.generate(req.reply_key, req.max_tokens, eos)
        ids = output.token_ids
        ends_with_eos = output.finish_reason == "stop" and eos is not None and bool(ids) and ids[-1] == eos
        shown = len(ids) - 1 if ends_with_eos else len(ids)
        key = self.digest(req.route, req.prompt_ids)
        positions = self.synthetic.output(f"out:{key}", ids)[:shown]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset = len(req.prompt_text)
        tokens: list[_Token] = []
        for index, position in enumerate(positions):
            data = self.vocab.token_bytes(position.sampled)
            text = decoder.decode(data, final=index == shown - 1)  # a dangling tail becomes U+FFFD at the end
            tokens.append(_Token(position, data, text, offset))
            offset += len(text)
        prefix = "chatcmpl-" if req.route == "chat" else "cmpl-"
        return _Generation(
            request=req,
            plan=plan,
            cmpl_id=prefix + "".join(random.choices(_ID_ALPHABET, k=29)),
            created=int(time.time()),
            tokens=tokens,
            finish_reason=output.finish_reason,
            steps=self.steps(len(ids), plan, key),
            prompt_items=self._prompt_items(req, key) if req.echo and req.logprobs else [],
        )

    async def _sent(self, request: web.Request, gen: _Generation) -> Any:
        """The visible tokens in order as they are generated, pausing once per engine step."""
        async for _, start, end in self.ticks(request, gen.plan, gen.steps):
            for index in range(start, min(end, len(gen.tokens))):
                yield gen.tokens[index]

    async def _drain(self, request: web.Request, gen: _Generation) -> None:
        async for _ in self._sent(request, gen):
            pass

    @staticmethod
    def _usage(gen: _Generation) -> JSON:
        prompt, done = len(gen.request.prompt_ids), len(gen.tokens)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": done,
            "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
            "completion_tokens_details": {
                "reasoning_tokens": 0,
                "audio_tokens": 0,
                "accepted_prediction_tokens": 0,
                "rejected_prediction_tokens": 0,
            },
        }

    @staticmethod
    def _text(gen: _Generation) -> str:
        return "".join(t.text for t in gen.tokens)

    # --- chat --------------------------------------------------------------------------------------

    def _chat_alternative(self, token_id: int, logprob: float) -> JSON:
        data = self.vocab.token_bytes(token_id)
        if self.vocab.is_special(token_id):  # a control token: its name, no bytes representation
            return {"token": data.decode("utf-8", "replace"), "logprob": _number(logprob), "bytes": None}
        return {"token": chat_token_text(data), "logprob": _number(logprob), "bytes": list(data)}

    def _chat_entry(self, token: _Token, k: int) -> JSON:
        return {
            "token": chat_token_text(token.data),
            "logprob": _number(token.position.sampled_logprob),
            "bytes": list(token.data),
            "top_logprobs": [self._chat_alternative(i, lp) for i, lp in token.position.top(k)],
        }

    async def _respond_chat(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        req = gen.request
        logprobs = None
        if req.logprobs:
            logprobs = {"content": [self._chat_entry(t, req.top) for t in gen.tokens], "refusal": None}
        message = {"role": "assistant", "content": self._text(gen), "refusal": None, "annotations": []}
        body = {
            "id": gen.cmpl_id,
            "object": "chat.completion",
            "created": gen.created,
            "model": req.model,
            "choices": [{"index": 0, "message": message, "logprobs": logprobs, "finish_reason": gen.finish_reason}],
            "usage": self._usage(gen),
            "service_tier": SERVICE_TIER,
            "system_fingerprint": self.system_fingerprint,
        }
        return self.json_response(body)

    def _chunk(self, gen: _Generation, choices: list[JSON], usage: JSON | None = None) -> JSON:
        req = gen.request
        chunk: JSON = {
            "id": gen.cmpl_id,
            "object": "chat.completion.chunk",
            "created": gen.created,
            "model": req.model,
            "service_tier": SERVICE_TIER,
            "system_fingerprint": self.system_fingerprint,
            "choices": choices,
        }
        if req.include_usage:
            chunk["usage"] = usage
        if req.include_obfuscation:  # random padding that hides the length of each delta
            chunk["obfuscation"] = "".join(random.choices(_ID_ALPHABET, k=random.randint(1, 16)))
        return chunk

    def _chat_choice(self, gen: _Generation, delta: JSON, entries: list[JSON] | None, finish: str | None) -> JSON:
        choice: JSON = {"index": 0, "delta": delta}
        if gen.request.logprobs:
            choice["logprobs"] = None if entries is None else {"content": entries, "refusal": None}
        choice["finish_reason"] = finish
        return choice

    async def _stream_chat(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        req = gen.request
        role = {"role": "assistant", "content": "", "refusal": None}
        await writer.send(self._chunk(gen, [self._chat_choice(gen, role, [], None)]))
        async for token in self._sent(request, gen):
            entries = [self._chat_entry(token, req.top)] if req.logprobs else None
            choice = self._chat_choice(gen, {"content": token.text}, entries, None)
            await writer.send(self._chunk(gen, [choice]))
        await writer.send(self._chunk(gen, [self._chat_choice(gen, {}, None, gen.finish_reason)]))
        if req.include_usage:
            await writer.send(self._chunk(gen, [], self._usage(gen)))
        await writer.done()

    # --- legacy completions --------------------------------------------------------------------------

    def _completions_key(self, token_id: int) -> str:
        return completions_token_text(self.vocab.token_bytes(token_id))

    def _top_dict(self, position: Position, k: int) -> dict[str, float]:
        """The true top k, plus the sampled token when it is not among them (best first)."""
        top = position.top(k)
        entries: dict[str, float] = {}
        for token_id, logprob in top:
            entries.setdefault(self._completions_key(token_id), _number(logprob))
        if all(token_id != position.sampled for token_id, _ in top):
            entries.setdefault(self._completions_key(position.sampled), _number(position.sampled_logprob))
        return entries

    def _prompt_items(self, req: _Request, key: str) -> list[_Item]:
        ids = req.prompt_ids
        positions = self.synthetic.prompt(f"prompt:{key}", ids)[: len(ids)]
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        items: list[_Item] = []
        offset = 0
        for token_id, position in zip(ids, positions, strict=True):
            data = self.vocab.token_bytes(token_id)
            if position is None:  # the first prompt token has no context
                items.append(_Item(completions_token_text(data), None, None, offset))
            else:
                logprob = _number(position.sampled_logprob)
                items.append(_Item(completions_token_text(data), logprob, self._top_dict(position, req.top), offset))
            offset += len(decoder.decode(data))
        return items

    def _generated_item(self, token: _Token, k: int) -> _Item:
        position = token.position
        return _Item(
            completions_token_text(token.data),
            _number(position.sampled_logprob),
            self._top_dict(position, k),
            token.offset,
        )

    @staticmethod
    def _completions_logprobs(items: Sequence[_Item]) -> JSON:
        return {
            "tokens": [i.token for i in items],
            "token_logprobs": [i.logprob for i in items],
            "top_logprobs": [i.top for i in items],
            "text_offset": [i.offset for i in items],
        }

    def _completions_body(self, gen: _Generation, choices: list[JSON], usage: JSON | None) -> JSON:
        body: JSON = {
            "id": gen.cmpl_id,
            "object": "text_completion",
            "created": gen.created,
            "model": gen.request.model,
            "choices": choices,
        }
        if not gen.request.stream or gen.request.include_usage:
            body["usage"] = usage
        return body

    async def _respond_completions(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        req = gen.request
        logprobs = None
        if req.logprobs:
            items = [*gen.prompt_items, *(self._generated_item(t, req.top) for t in gen.tokens)]
            logprobs = self._completions_logprobs(items)
        text = (req.prompt_text if req.echo else "") + self._text(gen)
        choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": gen.finish_reason}
        return self.json_response(self._completions_body(gen, [choice], self._usage(gen)))

    async def _stream_completions(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        req = gen.request

        def choice(text: str, logprobs: JSON | None, finish: str | None = None) -> JSON:
            return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish}

        if req.echo:
            logprobs = self._completions_logprobs(gen.prompt_items) if req.logprobs else None
            await writer.send(self._completions_body(gen, [choice(req.prompt_text, logprobs)], None))
        async for token in self._sent(request, gen):
            logprobs = self._completions_logprobs([self._generated_item(token, req.top)]) if req.logprobs else None
            await writer.send(self._completions_body(gen, [choice(token.text, logprobs)], None))
        await writer.send(self._completions_body(gen, [choice("", None, gen.finish_reason)], None))
        if req.include_usage:
            await writer.send(self._completions_body(gen, [], self._usage(gen)))
        await writer.done()

    # --- routes ------------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": "system"}
        return self.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        return self.json_response({"status": "ok"})


OPENAI = Dialect(
    module="openai",
    title="OpenAI",
    port=DEFAULT_PORT,
    simulator=OpenAISimulator,
    settings=OpenAISettings,
    routes=(
        Route("POST", "/v1/chat/completions", endpoint="chat"),
        Route("POST", "/v1/completions", endpoint="completions"),
        Route("GET", "/v1/models", handler="models"),
        Route("GET", "/health", handler="health"),
    ),
)
SIMULATOR_KEY = OPENAI.key


def create_app(vocab: Vocab, model: str, **common: Unpack[CommonOptions]) -> web.Application:
    """An aiohttp app that answers in OpenAI's conventions for `model` (see the module docstring).

    No model runs: replies are scripted, logprobs synthetic. replies: exact last user message /
    prompt -> reply text. tokens_per_step: tokens per engine step after the first (one chunk per
    token still; a step's chunks follow each other without delay). step_delay_ms: wait before
    each step. The options every simulator takes (replies, default_reply, seed, tokens_per_step,
    step_delay_ms) are `base.CommonOptions`. The simulator object (stats, settings) is at
    `app[SIMULATOR_KEY]`.
    """
    return OPENAI.app(vocab, model, common)


main = OPENAI.main

if __name__ == "__main__":
    main()
