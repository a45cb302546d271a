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
  token that adds no text (the EOS) loses its entry in the stream; the opening role chunk comes with
  the first token's result only, so a stream whose first token leaves a character unfinished has none
  (captures "chat stream", "chat cut inside a character, stream");
- stop strings as `process_token` applies them: a full match is cut from the text (generation stops,
  `finish_reason: "stop"`), a partial match at the end holds the text back (its tokens' entries are
  empty); non-streamed, as many entries as the stop string has *tokens* are removed from the end,
  although entries are per piece of text, so real ones vanish ("chat stop string": `stop: ["🏽"]` gives
  "👋" and no entries; "completions stop string"); streams keep them ("..., stream");
- `n` choices, each the scripted reply ("chat n=2", "completions n=2"); `echo` on /v1/completions is
  ignored ("completions echo");
- no cap on `top_logprobs` ("chat top_logprobs 25");
- `POST /v1/responses`: never logprobs (`logprobs: []`; `top_logprobs` is the chat path's 400), status
  `completed` even where the cap stopped it, and a stream that repeats `response.created` and
  `response.in_progress` before every result and has no `sequence_number` ("responses",
  "responses, top_logprobs", "responses stream");
- `POST /v1/completions` answers with the chat-style `logprobs: {content: [...]}`, and `max_tokens`
  defaults to unlimited (until EOS or the context is full);
- native `POST /completion` with `n_probs` -> `completion_probabilities` (omitted when not asked
  for; per chunk when streaming, no `[DONE]`);
- errors `{"error": {"code", "message", "type"}}`; an in-band stream error is an `error:` event.

    python -m gateway.simulator.llamacpp --tokenizer-dir ../shared/tokenizers/qwen2 --model qwen2

Captures: tests/captures/real/llamacpp-b1-smollm2.json (real llama-server; case names quoted above);
tests/test_llamacpp_simulator_captures.py holds the simulator's answers to the same shapes.
Simulator-only extras (not in llama.cpp): fault hooks (see `faults.py`), GET /sim/stats,
GET /sim/requests, POST /sim/reset. Deviations: grammars, tools, `min_p` and timings are not simulated
(timings are zeros); the `n` choices of a stream follow each other rather than interleave.
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
    stop: tuple[bytes, ...] = ()
    n: int = 1


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
    stop_word: bytes | None = None


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
        n = body.get("n", 1)
        if not is_int(n) or n < 1:
            raise LlamaError("n must be a positive integer")
        if route in ("chat", "responses"):
            if route == "responses":  # converted to a chat request (`convert_responses_to_chatcmpl`)
                given = body.get("input")
                body = {**body, "messages": [{"role": "user", "content": given}] if isinstance(given, str) else given,
                        "max_tokens": body.get("max_output_tokens")}
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
                n_probs = body.get("logprobs") or 0  # OpenAI's `logprobs` stands in for n_probs
                requested = body.get("max_tokens")
            else:
                n_probs = body.get("n_probs") or 0
                requested = body.get("n_predict")
        if not is_int(n_probs) or n_probs < 0:
            raise LlamaError("n_probs must be a non-negative integer")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not isinstance(stop, list | tuple) or not all(isinstance(word, str) for word in stop):
            raise LlamaError("stop must be a string or a list of strings")
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
            stop=tuple(word.encode() for word in stop if word),
            n=n,
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
            "responses": (self._respond_responses, self._stream_responses),
            "completions": (self._respond_completions, self._stream_completions),
            "completion": (self._respond_native, self._stream_native),
        }[route]
        return Admitted(
            plan,
            req.stream,
            respond=lambda: respond(request, gen),
            produce=lambda writer: produce(request, gen, writer),
            error_frame=self._stream_error(),
            done_frame=None if route in ("completion", "responses") else b"data: [DONE]\n\n",
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
        eos = self.chat_eos if req.route in ("chat", "responses") else self.completion_eos
        output = self.generate(req.reply_key, req.max_tokens, eos)
        ids = output.token_ids
        key = self.digest(req.route, req.prompt_ids)
        generated, sent = b"", 0
        entries: list[_Entry] = []
        stop_word: bytes | None = None
        for index, position in enumerate(self.synthetic.output(f"out:{key}", ids)):
            piece = self._piece(position.sampled)
            generated += piece
            if validate_utf8(generated) < len(generated):
                continue  # incomplete character: nothing is sent, no entry is kept
            start = min(sent, len(generated))
            found = _full_stop(generated[start:], len(piece), req.stop)
            held = False
            if found is not None:  # the stop string and what follows it leave the text; generation ends
                cut, stop_word = found
                generated = generated[: start + cut]
                start = min(sent, len(generated))
            elif position.sampled != eos:
                held = _partial_stop(generated[start:], req.stop)  # might become a stop string: held back
            text = b"" if held else generated[start:]
            sent += len(text)
            entry: JSON = {"id": position.sampled, "token": token_text(text), "bytes": list(text)}
            if req.n_probs > 0:
                value, top = self._probs(position, req)
                entry["prob" if req.post_sampling else "logprob"] = value
                entry["top_probs" if req.post_sampling else "top_logprobs"] = top
            entries.append(_Entry(index, position.sampled, text, entry))
            if stop_word is not None:
                ids = ids[: index + 1]
                break
        if stop_word is not None and not req.stream:
            # send_final_response: as many entries removed as the stop string has tokens
            entries = entries[: len(entries) - min(len(entries), len(self.encode(stop_word.decode())))]
        alphabet = string.ascii_letters + string.digits
        prefix = "chatcmpl-" if req.route == "chat" else "cmpl-"
        cmpl_id = prefix + "".join(random.choices(alphabet, k=32))
        return _Generation(
            request=req,
            plan=plan,
            cmpl_id=cmpl_id,
            ids=ids,
            stopped_by_eos=stop_word is None and output.finish_reason == "stop",
            entries=entries,
            text=generated.decode("utf-8", errors="replace"),  # a dangling tail is replaced, not dropped
            steps=self.steps(len(ids), plan, key),
            stop_word=stop_word,
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
        return "stop" if gen.stopped_by_eos or gen.stop_word is not None else "length"

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
            "choices": _choices(choice, gen.request.n),
            **self._tail(gen, "chat.completion"),
            "usage": self._usage(gen),
            "timings": self._timings(gen),
        }
        return self.json_response(body)

    async def _stream_chat(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        head = "chat.completion.chunk"
        for index in range(gen.request.n):
            async for entry in self._sent(request, gen):
                if entry.index == 0:  # `n_decoded == 1`: only the first token's result opens with the role
                    role = {"finish_reason": None, "index": index, "delta": {"role": "assistant", "content": None}}
                    await writer.send({"choices": [role], **self._tail(gen, head)})
                if not entry.text:
                    continue  # no message diff, no chunk: the entry's logprobs are lost
                delta = {"content": entry.text.decode("utf-8", "replace")}
                choice: JSON = {"finish_reason": None, "index": index, "delta": delta}
                if gen.request.n_probs > 0:
                    choice["logprobs"] = self._logprobs([entry])
                await writer.send({"choices": [choice], **self._tail(gen, head)})
        chunks = [{"choices": [{"finish_reason": self._finish_reason(gen), "index": index, "delta": {}}],
                   **self._tail(gen, head)} for index in range(gen.request.n)]
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
            "choices": _choices(choice, gen.request.n),
            **self._tail(gen, "text_completion"),
            "usage": self._usage(gen),
            "timings": self._timings(gen),
        }
        return self.json_response(body)

    async def _stream_completions(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        for index in range(gen.request.n):
            async for entry in self._sent(request, gen):  # every partial result, the EOS's "" too
                logprobs = self._logprobs([entry]) if gen.request.n_probs > 0 else None
                text = entry.text.decode("utf-8", "replace")
                choice = {"text": text, "index": index, "logprobs": logprobs, "finish_reason": None}
                chunk = {"choices": [choice], **self._tail(gen, "text_completion")}
                if gen.stop_word is not None and entry.index == len(gen.ids) - 1:
                    chunk["timings"] = self._timings(gen)  # the stop is known when its token's result goes out
                await writer.send(chunk)
        for index in range(gen.request.n):
            choice = {"text": "", "index": index, "logprobs": None, "finish_reason": self._finish_reason(gen)}
            final = {"choices": [choice], **self._tail(gen, "text_completion"), "usage": self._usage(gen)}
            await writer.send({**final, "timings": self._timings(gen)})
        await writer.done()

    # --- /v1/responses --------------------------------------------------------------------------

    def _response(self, gen: _Generation, message_id: str, status: str) -> JSON:
        part = {"type": "output_text", "annotations": [], "logprobs": [], "text": gen.text}
        prompt, done = len(gen.request.prompt_ids), len(gen.ids)
        return {
            "id": "resp_" + gen.cmpl_id.split("-", 1)[1], "object": "response", "created_at": int(time.time()),
            "status": status, "model": gen.request.model,
            "output": [{"type": "message", "status": "completed", "id": message_id, "content": [part],
                        "role": "assistant"}],
            "usage": {"input_tokens": prompt, "output_tokens": done, "total_tokens": prompt + done,
                      "input_tokens_details": {"cached_tokens": 0}},
        }

    async def _respond_responses(self, request: web.Request, gen: _Generation) -> web.Response:
        await self._drain(request, gen)
        body = self._response(gen, "msg_" + gen.cmpl_id.split("-", 1)[1], "completed")  # even when cut
        return self.json_response({"completed_at": body["created_at"], **body})

    async def _stream_responses(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        resp_id, msg_id = "resp_" + gen.cmpl_id.split("-", 1)[1], "msg_" + gen.cmpl_id.split("-", 1)[1]
        stub = {"id": resp_id, "object": "response", "status": "in_progress"}
        started = False
        async for entry in self._sent(request, gen):
            # Every result re-announces the response (its `created` flag is per result, not per stream).
            events: list[tuple[str, JSON]] = [("response.created", {"response": stub}),
                                              ("response.in_progress", {"response": stub})]
            if entry.text and not started:
                started = True
                events += [("response.output_item.added", {"item": {"content": [], "id": msg_id, "role": "assistant",
                                                                    "status": "in_progress", "type": "message"}}),
                           ("response.content_part.added", {"item_id": msg_id,
                                                            "part": {"type": "output_text", "text": ""}})]
            if entry.text:
                events.append(("response.output_text.delta",
                               {"item_id": msg_id, "delta": entry.text.decode("utf-8", "replace")}))
            for name, data in events:
                await writer.frame(_event(name, data))
        final = self._response(gen, msg_id, "completed")
        part, item = final["output"][0]["content"][0], final["output"][0]
        for name, data in (("response.output_text.done", {"item_id": msg_id, "text": gen.text}),
                           ("response.content_part.done", {"item_id": msg_id, "part": part}),
                           ("response.output_item.done", {"item": item}),
                           ("response.completed", {"response": final, "timings": self._timings(gen)})):
            await writer.frame(_event(name, data))
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


def _choices(choice: JSON, n: int) -> list[JSON]:
    """`n` choices, each the scripted reply (the real server samples each; see the module docstring)."""
    return [choice if index == 0 else {**choice, "index": index} for index in range(n)]


def _event(name: str, data: JSON) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps({"type": name, **data}) + b"\n\n"


def _full_stop(text: bytes, last_piece: int, words: Sequence[bytes]) -> tuple[int, bytes] | None:
    """Where a stop string starts in the unsent text (searched from where the last piece could have
    completed one), and which; the earliest one wins."""
    best: tuple[int, bytes] | None = None
    for word in words:
        at = text.find(word, max(0, len(text) - len(word) - last_piece))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, word)
    return best


def _partial_stop(text: bytes, words: Sequence[bytes]) -> bool:
    """The unsent text ends with the start of a stop string: it is held back until it is decided."""
    return any(text.endswith(word[:size]) for word in words for size in range(len(word), 0, -1))


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
        Route("POST", "/v1/responses", endpoint="responses"),
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
