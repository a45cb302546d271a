"""A llama.cpp server (`llama-server`) *simulator*: its wire format with no model behind it.

Scripted text and synthetic, deterministic probabilities (see `synthetic.py`), driven by a real
tokenizer; nothing here is llama.cpp code. What is reproduced is what a client of llama-server sees:

- entries `{id, token, bytes, logprob, top_logprobs: [{id, token, bytes, logprob}]}` with exact raw
  `bytes` and `token` cut to its valid UTF-8 prefix (`validate_utf8`), undecodable bytes left in it
  written as U+FFFD (the JSON writer's `replace` handler);
- a sampled token that leaves a UTF-8 character incomplete gets NO entry and no stream chunk: the
  token that completes the character carries the whole pending text and bytes (`text_to_send`
  accumulates from the last sent position), so a split character yields one entry, and the
  dropped tokens' logprobs are gone; the EOS is an entry with empty `token` and `bytes`
  (control tokens render as ""); alternatives are single pieces with their own exact bytes;
- `top_logprobs` defaults to 20 when `logprobs: true` comes without it; `top_logprobs` without
  `logprobs` is refused with "top_logprobs requires logprobs to be set to true";
- probabilities are pre-sampling (the sampled token is not forced into the list); a probability
  that underflows to 0 is written as float32's lowest, `-3.4028234663852886e+38` (the simulator
  makes every alternative ranked 17th or lower underflow, so the default 20 shows it);
  `post_sampling_probs: true` switches to `prob` / `top_probs` after top-k/top-p, zeros dropped;
- `POST /v1/chat/completions`; streaming attaches logprobs to the last delta of a result, so a
  token that adds no text (the EOS) loses its entry in the stream;
- `POST /v1/completions` answers with the chat-style `logprobs: {content: [...]}`, and `max_tokens`
  defaults to unlimited (until EOS or the context is full);
- native `POST /completion` with `n_probs` -> `completion_probabilities` (omitted when not asked
  for; per chunk when streaming, no `[DONE]`);
- errors `{"error": {"code", "message", "type"}}`; an in-band stream error is an `error:` event.

    python -m gateway.simulator.llamacpp --tokenizer-dir ../shared/tokenizers/qwen2 --model qwen2

Simulator-only extras (not in llama.cpp): fault hooks (see `faults.py`), GET /sim/stats,
GET /sim/requests, POST /sim/reset. Deviations: stop words, grammars, tools, `min_p` and timings
are not simulated (timings are zeros).
"""

from __future__ import annotations

import math
import random
import string
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Unpack

import orjson
from aiohttp import web

from gateway.logprobs.vocab import Vocab
from gateway.simulator.base import (
    JSON,
    Admitted,
    BadBody,
    CommonOptions,
    CommonSettings,
    Dialect,
    Flag,
    Refusal,
    Rejected,
    Route,
    SimulatorBase,
    SSEWriter,
    flag,
    is_int,
)
from gateway.simulator.faults import FaultPlan
from gateway.simulator.floats import FLOAT32_LOWEST, f32
from gateway.simulator.synthetic import Position, nucleus

DEFAULT_TOP_LOGPROBS = 20  # chat: `logprobs: true` alone means n_probs = 20
UNDERFLOW_RANK = 17  # simulated: alternatives from this rank on have probability 0.0
SAMPLING_TOP_K, SAMPLING_TOP_P = 40, 0.95  # llama.cpp's default sampler chain (post_sampling_probs)

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def validate_utf8(data: bytes) -> int:
    """llama.cpp's `validate_utf8`: the length without a trailing incomplete multi-byte sequence.

    Only a lead byte whose sequence runs past the end counts; stray continuation bytes pass.
    """
    size = len(data)
    for back in range(1, min(4, size) + 1):
        byte = data[size - back]
        # a lead byte of a 2-, 3- or 4-byte sequence with too few bytes after it
        needed = 2 if (byte & 0xE0) == 0xC0 else 3 if (byte & 0xF0) == 0xE0 else 4 if (byte & 0xF8) == 0xF0 else 0
        if back < needed:
            return size - back
    return size


def token_text(data: bytes) -> str:
    """The `token` string: the valid prefix, any remaining bad byte as U+FFFD (JSON `replace`)."""
    return data[: validate_utf8(data)].decode("utf-8", errors="replace")


class LlamaError(Refusal):
    """A request llama-server refuses: `{"error": {"code", "message", "type", ...}}`."""

    def __init__(self, message: str, status: int = 400, kind: str | None = None, **extra: Any) -> None:
        super().__init__(message, status)
        self.kind = kind or _ERROR_TYPES.get(status, "server_error")
        self.extra = extra


@dataclass(frozen=True, slots=True)
class LlamaCppSettings(CommonSettings):
    """Server-wide behaviour; see `create_app`."""

    n_ctx: int = 4096
    build_info: str = "b0-simulator"


@dataclass(frozen=True, slots=True)
class _Request:
    route: str  # "chat" | "completions" | "completion"
    model: str
    stream: bool
    prompt_ids: list[int]
    prompt_text: str
    reply_key: str | None
    max_tokens: int
    n_probs: int
    post_sampling: bool
    top_k: int
    top_p: float
    include_usage: bool
    return_tokens: bool


@dataclass(frozen=True, slots=True)
class _Entry:
    """One token that reached the client (`slot.add_token`): its index and the bytes it sends."""

    index: int
    token_id: int
    text: bytes
    json: JSON


@dataclass(slots=True)
class _Generation:
    request: _Request
    plan: FaultPlan
    cmpl_id: str
    ids: tuple[int, ...]
    stopped_by_eos: bool
    entries: list[_Entry]
    text: str
    steps: list[tuple[int, int]]


class LlamaCppSimulator(SimulatorBase):
    """Request handlers and state of one simulated llama-server (one loaded model)."""

    settings: LlamaCppSettings

    def __init__(self, vocab: Vocab, model: str, settings: LlamaCppSettings) -> None:
        super().__init__(vocab, model, settings)

    # --- errors -------------------------------------------------------------------------------

    @staticmethod
    def _error(exc: LlamaError) -> web.Response:
        body = {"error": {"code": exc.status, "message": exc.message, "type": exc.kind, **exc.extra}}
        return web.Response(body=orjson.dumps(body), status=exc.status, content_type="application/json")

    def fault_response(self, status: int, message: str) -> web.Response:
        return self._error(LlamaError(message, status))

    @staticmethod
    def _stream_error() -> bytes:
        error = {"code": 500, "message": "simulated failure (x-sim-fault: error_mid_stream)", "type": "server_error"}
        return b"error: " + orjson.dumps(error) + b"\n\n"

    # --- request parsing ----------------------------------------------------------------------

    async def _read(self, request: web.Request) -> tuple[JSON, FaultPlan]:
        try:
            return await self.read_request(request)
        except BadBody as exc:
            raise LlamaError(f"Failed to parse JSON: {exc.detail}" if exc.kind == "json" else exc.detail) from None

    def _budget(self, requested: Any, prompt_len: int) -> int:
        n_ctx = self.settings.n_ctx
        if prompt_len >= n_ctx:
            raise LlamaError(
                "the request exceeds the available context size, try increasing it",
                kind="exceed_context_size_error",
                n_prompt_tokens=prompt_len,
                n_ctx=n_ctx,
            )
        room = n_ctx - prompt_len
        if requested is None or (is_int(requested) and requested < 0):  # -1: until EOS or the context is full
            return room
        if not is_int(requested):
            raise LlamaError("max_tokens must be an integer")
        return max(1, min(requested, room))

    def _prompt(self, body: Mapping[str, Any]) -> tuple[list[int], str]:
        if body.get("prompt") is None:
            raise LlamaError('"prompt" must be provided')
        given = self.prompt_input(body["prompt"])
        if given is None:
            raise LlamaError("simulator limitation: `prompt` must be one string or one list of token ids")
        return given

    def _parse(self, body: JSON, route: str) -> _Request:
        if body.get("n") not in (None, 1):
            raise LlamaError("Only one completion choice is allowed")
        if route == "chat":
            if not isinstance(body.get("messages"), list):
                raise LlamaError("Expected 'messages' to be an array")
            try:
                prompt_ids, key = self.chat_input(body["messages"])
            except ValueError as exc:
                raise LlamaError(str(exc)) from None
            prompt_text = ""
            top = body.get("top_logprobs")
            if flag(body, "logprobs"):
                n_probs = DEFAULT_TOP_LOGPROBS if top is None else top
            elif top is not None:
                raise LlamaError("top_logprobs requires logprobs to be set to true")
            else:
                n_probs = 0
            requested = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            prompt_ids, prompt_text = self._prompt(body)
            key = prompt_text
            if route == "completions":
                if flag(body, "echo"):
                    raise LlamaError("Only no echo is supported")
                n_probs = body.get("logprobs") or 0  # OpenAI's `logprobs` stands in for n_probs
                requested = body.get("max_tokens")
            else:
                n_probs = body.get("n_probs") or 0
                requested = body.get("n_predict")
        if not is_int(n_probs) or n_probs < 0:
            raise LlamaError("n_probs must be a non-negative integer")
        options = body.get("stream_options") or {}
        top_k, top_p = body.get("top_k"), body.get("top_p")
        return _Request(
            route=route,
            model=str(body.get("model") or self.model),
            stream=flag(body, "stream"),
            prompt_ids=prompt_ids,
            prompt_text=prompt_text,
            reply_key=key,
            max_tokens=self._budget(requested, len(prompt_ids)),
            n_probs=n_probs,
            post_sampling=flag(body, "post_sampling_probs"),
            top_k=top_k if is_int(top_k) else SAMPLING_TOP_K,
            top_p=float(top_p) if isinstance(top_p, int | float) and not isinstance(top_p, bool) else SAMPLING_TOP_P,
            include_usage=bool(options.get("include_usage")) if isinstance(options, Mapping) else False,
            return_tokens=flag(body, "return_tokens"),
        )

    async def admit(self, request: web.Request, route: str) -> Admitted:
        try:
            body, plan = await self._read(request)
            req = self._parse(body, route)
        except LlamaError as exc:
            raise Rejected(self._error(exc)) from None
        gen = self._generate(req, plan)
        respond, produce = {
            "chat": (self._respond_chat, self._stream_chat),
            "completions": (self._respond_completions, self._stream_completions),
            "completion": (self._respond_native, self._stream_native),
        }[route]
        return Admitted(
            plan,
            req.stream,
            respond=lambda: respond(request, gen),
            produce=lambda writer: produce(request, gen, writer),
            error_frame=self._stream_error(),
            done_frame=None if route == "completion" else b"data: [DONE]\n\n",
            done_after_error=False,  # the error event ends the stream
        )

    # --- generation ---------------------------------------------------------------------------

    def _piece(self, token_id: int) -> bytes:
        """`common_token_to_piece(..., special=false)`: control tokens render as nothing."""
        return b"" if self.vocab.is_special(token_id) else self.vocab.token_bytes(token_id)

    def _candidate(self, token_id: int, value: float, post: bool) -> JSON:
        piece = self._piece(token_id)
        key = "prob" if post else "logprob"
        return {"id": token_id, "token": token_text(piece), "bytes": list(piece), key: value}

    def _probs(self, position: Position, req: _Request) -> tuple[float, list[JSON]]:
        """(sampled value, top list) for one position, as `populate_token_probs` fills them."""
        if req.post_sampling:  # the sampler's candidates after top-k/top-p, renormalized; zeros dropped
            ranking, sampled = nucleus(position, top_k=req.top_k, top_p=req.top_p)
            top = [self._candidate(i, f32(math.exp(lp)), True) for i, lp in ranking[: req.n_probs] if lp is not None]
            return f32(math.exp(sampled)), top
        top = [
            self._candidate(i, FLOAT32_LOWEST if rank >= UNDERFLOW_RANK else f32(lp), False)
            for rank, (i, lp) in enumerate(position.top(req.n_probs), start=1)
        ]
        return f32(position.sampled_logprob), top

    def _generate(self, req: _Request, plan: FaultPlan) -> _Generation:
        eos = self.chat_eos if req.route == "chat" else self.completion_eos
        output = self.generate(req.reply_key, req.max_tokens, eos)
        ids = output.token_ids
        key = self.digest(req.route, req.prompt_ids)
        generated, sent = b"", 0
        entries: list[_Entry] = []
        for index, position in enumerate(self.synthetic.output(f"out:{key}", ids)):
            generated += self._piece(position.sampled)
            if validate_utf8(generated) < len(generated):
                continue  # incomplete character: nothing is sent, no entry is kept
            text, sent = generated[sent:], len(generated)
            entry: JSON = {"id": position.sampled, "token": token_text(text), "bytes": list(text)}
            if req.n_probs > 0:
                value, top = self._probs(position, req)
                entry["prob" if req.post_sampling else "logprob"] = value
                entry["top_probs" if req.post_sampling else "top_logprobs"] = top
            entries.append(_Entry(index, position.sampled, text, entry))
        alphabet = string.ascii_letters + string.digits
        prefix = "chatcmpl-" if req.route == "chat" else "cmpl-"
        cmpl_id = prefix + "".join(random.choices(alphabet, k=32))
        return _Generation(
            request=req,
            plan=plan,
            cmpl_id=cmpl_id,
            ids=ids,
            stopped_by_eos=output.finish_reason == "stop",
            entries=entries,
            text=generated.decode("utf-8", errors="replace"),  # a dangling tail is replaced, not dropped
            steps=self.steps(len(ids), plan, key),
        )

    async def _sent(self, request: web.Request, gen: _Generation) -> Any:
        """The entries in order as their tokens are generated, pausing once per engine step."""
        by_index = {e.index: e for e in gen.entries}
        async for _, start, end in self.ticks(request, gen.plan, gen.steps):
            for index in range(start, end):
                if index in by_index:
                    yield by_index[index]

    async def _drain(self, request: web.Request, gen: _Generation) -> None:
        async for _ in self._sent(request, gen):
            pass

    def _finish_reason(self, gen: _Generation) -> str:
        return "stop" if gen.stopped_by_eos else "length"

    def _usage(self, gen: _Generation) -> JSON:
        prompt, done = len(gen.request.prompt_ids), len(gen.ids)
        return {
            "completion_tokens": done,
            "prompt_tokens": prompt,
            "total_tokens": prompt + done,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def _timings(self, gen: _Generation) -> JSON:
        prompt, done = len(gen.request.prompt_ids), len(gen.ids)
        return {
            "cache_n": 0,
            "prompt_n": prompt,
            "prompt_ms": 0.0,
            "prompt_per_token_ms": 0.0,
            "prompt_per_second": 0.0,
            "predicted_n": done,
            "predicted_ms": 0.0,
            "predicted_per_token_ms": 0.0,
            "predicted_per_second": 0.0,
        }

    def _tail(self, gen: _Generation, obj: str) -> JSON:
        return {
            "created": int(time.time()),
            "model": gen.request.model,
            "system_fingerprint": self.settings.build_info,
            "object": obj,
            "id": gen.cmpl_id,
        }

    def _logprobs(self, entries: Sequence[_Entry]) -> JSON | None:
        return {"content": [e.json for e in entries]}

    # --- chat ---------------------------------------------------------------------------------

    async def _respond_chat(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        choice: JSON = {
            "finish_reason": self._finish_reason(gen),
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
        }
        if gen.request.n_probs > 0 and gen.entries:
            choice["logprobs"] = self._logprobs(gen.entries)  # the key is absent otherwise
        body = {
            "choices": [choice],
            **self._tail(gen, "chat.completion"),
            "usage": self._usage(gen),
            "timings": self._timings(gen),
        }
        return self.json_response(body)

    async def _stream_chat(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        head = "chat.completion.chunk"
        role_sent = False
        async for entry in self._sent(request, gen):
            if not role_sent:
                role = {"finish_reason": None, "index": 0, "delta": {"role": "assistant", "content": None}}
                await writer.send({"choices": [role], **self._tail(gen, head)})
                role_sent = True
            if not entry.text:
                continue  # no message diff, no chunk: the entry's logprobs are lost
            delta = {"content": entry.text.decode("utf-8", "replace")}
            choice: JSON = {"finish_reason": None, "index": 0, "delta": delta}
            if gen.request.n_probs > 0:
                choice["logprobs"] = self._logprobs([entry])
            await writer.send({"choices": [choice], **self._tail(gen, head)})
        final: JSON = {"choices": [{"finish_reason": self._finish_reason(gen), "index": 0, "delta": {}}]}
        chunks = [{**final, **self._tail(gen, head)}]
        if gen.request.include_usage:
            chunks.append({"choices": [], **self._tail(gen, head), "usage": self._usage(gen)})
        chunks[-1]["timings"] = self._timings(gen)
        for chunk in chunks:
            await writer.send(chunk)
        await writer.done()

    # --- completions --------------------------------------------------------------------------

    async def _respond_completions(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        logprobs = self._logprobs(gen.entries) if gen.request.n_probs > 0 and gen.entries else None
        choice = {"text": gen.text, "index": 0, "logprobs": logprobs, "finish_reason": self._finish_reason(gen)}
        body = {
            "choices": [choice],
            **self._tail(gen, "text_completion"),
            "usage": self._usage(gen),
            "timings": self._timings(gen),
        }
        return self.json_response(body)

    async def _stream_completions(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        async for entry in self._sent(request, gen):  # every partial result, the EOS's "" too
            logprobs = self._logprobs([entry]) if gen.request.n_probs > 0 else None
            text = entry.text.decode("utf-8", "replace")
            choice = {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": None}
            await writer.send({"choices": [choice], **self._tail(gen, "text_completion")})
        choice = {"text": "", "index": 0, "logprobs": None, "finish_reason": self._finish_reason(gen)}
        final = {"choices": [choice], **self._tail(gen, "text_completion"), "usage": self._usage(gen)}
        await writer.send({**final, "timings": self._timings(gen)})
        await writer.done()

    # --- native /completion ---------------------------------------------------------------------

    def _native_final(self, gen: _Generation, *, stream: bool) -> JSON:
        req = gen.request
        body: JSON = {
            "index": 0,
            "content": "" if stream else gen.text,
            "tokens": list(gen.ids) if req.return_tokens and not stream else [],
            "id_slot": 0,
            "stop": True,
            "model": req.model,
            "tokens_predicted": len(gen.ids),
            "tokens_evaluated": len(req.prompt_ids),
            "generation_settings": {
                "n_predict": req.max_tokens,
                "seed": self.settings.seed,
                "top_k": req.top_k,
                "top_p": req.top_p,
                "n_probs": req.n_probs,
                "post_sampling_probs": req.post_sampling,
                "stream": req.stream,
            },
            "prompt": req.prompt_text,
            "has_new_line": "\n" in gen.text,
            "truncated": False,
            "stop_type": "eos" if gen.stopped_by_eos else "limit",
            "stopping_word": "",
            "tokens_cached": len(req.prompt_ids) + len(gen.ids),
            "timings": self._timings(gen),
        }
        if not stream and req.n_probs > 0 and gen.entries:
            body["completion_probabilities"] = [e.json for e in gen.entries]
        return body

    async def _respond_native(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        return self.json_response(self._native_final(gen, stream=False))

    async def _stream_native(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        async for entry in self._sent(request, gen):
            chunk: JSON = {
                "index": 0,
                "content": entry.text.decode("utf-8", "replace"),
                "tokens": [entry.token_id],
                "stop": False,
                "id_slot": -1,
                "tokens_predicted": entry.index + 1,
                "tokens_evaluated": len(gen.request.prompt_ids),
            }
            if gen.request.n_probs > 0:
                chunk["completion_probabilities"] = [entry.json]
            await writer.send(chunk)
        await writer.send(self._native_final(gen, stream=True))
        await writer.done()

    # --- routes -------------------------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return self.json_response({"status": "ok"})

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": int(time.time()), "owned_by": "llamacpp", "meta": None}
        return self.json_response({"object": "list", "data": [card]})


LLAMACPP = Dialect(
    module="llamacpp",
    title="llama.cpp",
    port=8080,
    simulator=LlamaCppSimulator,
    settings=LlamaCppSettings,
    routes=(
        Route("POST", "/v1/chat/completions", endpoint="chat"),
        Route("POST", "/chat/completions", endpoint="chat"),
        Route("POST", "/v1/completions", endpoint="completions"),
        Route("POST", "/completions", endpoint="completions"),
        Route("POST", "/completion", endpoint="completion"),
        Route("GET", "/health", handler="health"),
        Route("GET", "/v1/models", handler="models"),
    ),
    flags=(Flag("--ctx-size", "n_ctx"),),
)
SIMULATOR_KEY = LLAMACPP.key


def create_app(vocab: Vocab, model: str, *, n_ctx: int = 4096, **common: Unpack[CommonOptions]) -> web.Application:
    """An aiohttp app that answers like `llama-server -m <model>.gguf` (see the module docstring).

    replies: exact last user message / prompt -> reply text. tokens_per_step: tokens per engine
    step after the first (llama-server still sends one result per token; a step's results follow
    each other without delay). step_delay_ms: wait before each step. n_ctx: the context size.
    The options every simulator takes (replies, default_reply, seed, tokens_per_step, step_delay_ms)
    are `base.CommonOptions`. The simulator object (stats, settings) is at `app[SIMULATOR_KEY]`.
    """
    return LLAMACPP.app(vocab, model, common, n_ctx=n_ctx)


main = LLAMACPP.main

if __name__ == "__main__":
    main()
