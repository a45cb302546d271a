"""An SGLang *simulator*: SGLang's wire format with no model behind it.

Scripted text and synthetic, deterministic logprobs (see `synthetic.py`), driven by a real tokenizer;
nothing here is SGLang code. What is reproduced is what a client of SGLang sees:

- `POST /v1/chat/completions`: entries `{token, bytes, logprob, top_logprobs}` where each token is
  its id decoded alone (special tokens keep their text) and `bytes` is the UTF-8 of that string,
  so a partial character is "\ufffd" = [239, 191, 189]; alternatives come from a dict keyed by
  that text, so two ids spelling the same string collapse into one entry (first position, last
  value); the top list is the plain top-k, the sampled token is not forced in; the EOS is an entry;
- truncated alternatives (request `top_p` < 1 or `top_k` > 0) show float32's lowest value
  `-3.4028234663852886e+38`, the kept ones renormalized; values are float32 as Python prints them;
- streaming sends a chunk only when the decoded text grew: the logprobs of a step whose tokens
  only hold part of a character (or only the EOS) are dropped with it, not carried to the next
  chunk; a step can carry several tokens (`tokens_per_step`, SGLang's `--stream-interval`), and
  with `stream_top_logprobs_bug` (on by default, as in affected versions, sglang#39260) every
  token of a multi-token chunk gets the top list of the chunk's first token; the stream starts
  with a role chunk, ends with a separate finish chunk (`matched_stop`), then `[DONE]`;
- `POST /v1/completions`: legacy `logprobs {text_offset, token_logprobs, tokens, top_logprobs}`
  with `text_offset` -1 for every token ("not supported yet") and dict top lists (collisions);
- native `POST /generate` with `return_logprob`, `top_logprobs_num`, `return_text_in_logprobs`,
  `logprob_start_len` -> `meta_info.output_token_logprobs` `[[logprob, id, text|null], ...]`,
  `output_top_logprobs`, `input_token_logprobs` (first prompt position null); streaming sends
  cumulative text and logprobs, then `[DONE]`;
- the response `model` echoes the request's; errors `{"object": "error", "message", "type",
  "param", "code"}` (native /generate: `{"error": {"message"}}`).

    python -m gateway.simulator.sglang --tokenizer-dir ../shared/tokenizers/qwen2 --model Qwen/Qwen2-0.5B-Instruct

Simulator-only extras (not in SGLang): fault hooks (see `faults.py`), GET /sim/stats, GET /sim/requests,
POST /sim/reset. Deviations: values ignore temperature; `n`, stop strings, tools and reasoning
parsers are not simulated.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
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
from gateway.simulator.detok import IncrementalDetokenizer, TokenStrings
from gateway.simulator.faults import FaultPlan
from gateway.simulator.floats import FLOAT32_LOWEST, f32
from gateway.simulator.synthetic import Position, nucleus

Triple = list[Any]  # [logprob, token id, text | None], as SGLang's (logprob, id, text) tuples serialize


class SGLangError(Refusal):
    """A request SGLang refuses (rendered in the route's error shape)."""


@dataclass(frozen=True, slots=True)
class SGLangSettings(CommonSettings):
    """Server-wide behaviour; see `create_app`."""

    context_length: int = 4096
    stream_top_logprobs_bug: bool = True
    weight_version: str = "default"


@dataclass(frozen=True, slots=True)
class _Request:
    """A validated request, the same shape for all three routes."""

    route: str  # "chat" | "completions" | "generate"
    model: str
    stream: bool
    prompt_ids: list[int]
    prompt_text: str
    reply_key: str | None
    max_tokens: int
    ignore_eos: bool
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int  # -1: no prompt logprobs
    text_in_logprobs: bool
    top_k: int | None
    top_p: float | None
    include_usage: bool
    continuous_usage: bool
    echo: bool


@dataclass(slots=True)
class _Generation:
    request: _Request
    plan: FaultPlan
    rid: str
    ids: tuple[int, ...]
    finish: JSON  # meta_info.finish_reason
    outputs: list[Triple]  # output_token_logprobs
    tops: list[list[Triple]]  # output_top_logprobs
    steps: list[tuple[int, int]]


class SGLangSimulator(SimulatorBase):
    """Request handlers and state of one simulated SGLang server (one served model)."""

    settings: SGLangSettings

    def __init__(self, vocab: Vocab, model: str, settings: SGLangSettings) -> None:
        super().__init__(vocab, model, settings)
        self.pieces = TokenStrings(vocab, skip_special=False)  # tokenizer.batch_decode of single ids

    # --- errors -------------------------------------------------------------------------------

    @staticmethod
    def _openai_error(message: str, status: int = 400, kind: str = "BadRequestError") -> web.Response:
        body = {"object": "error", "message": message, "type": kind, "param": None, "code": status}
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    def fault_response(self, status: int, message: str) -> web.Response:
        return self._openai_error(message, status, "InternalServerError" if status >= 500 else "BadRequestError")

    @staticmethod
    def _stream_error() -> bytes:
        # create_streaming_error_response: an error object in a data frame, then [DONE]
        error = {"error": {"message": "simulated failure (x-sim-fault: error_mid_stream)", "type": "BadRequestError",
                           "param": None, "code": 400}}  # fmt: skip
        return b"data: " + orjson.dumps(error) + b"\n\n"

    # --- request parsing ----------------------------------------------------------------------

    async def _read(self, request: web.Request) -> tuple[JSON, FaultPlan]:
        try:
            return await self.read_request(request)
        except BadBody as exc:
            raise SGLangError(f"JSON decode error: {exc.detail}" if exc.kind == "json" else exc.detail) from None

    def _max_tokens(self, requested: Any, prompt_len: int, name: str) -> int:
        ctx = self.settings.context_length
        if prompt_len >= ctx:
            raise SGLangError(
                f"The input ({prompt_len} tokens) is longer than the model's context length ({ctx} tokens)."
            )
        if requested is None:
            return ctx - prompt_len
        if not is_int(requested) or requested <= 0:
            raise SGLangError(f"{name} must be positive")
        if requested > ctx:
            raise SGLangError(f"{name} is too large: {requested}.This model supports at most {ctx} completion tokens.")
        return min(requested, ctx - prompt_len)

    @staticmethod
    def _truncation(body: Mapping[str, Any]) -> tuple[int | None, float | None]:
        top_k, top_p = body.get("top_k"), body.get("top_p")
        return (top_k if is_int(top_k) and top_k > 0 else None), (
            float(top_p) if isinstance(top_p, int | float) and 0 < top_p < 1 else None
        )

    def _parse_openai(self, body: JSON, route: str) -> _Request:
        if route == "chat":
            messages = body.get("messages")
            if not messages:
                raise SGLangError("Messages cannot be empty.")
            try:
                prompt_ids, key = self.chat_input(messages)
            except ValueError as exc:
                raise SGLangError(str(exc)) from None
            prompt_text = ""
            name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
            max_tokens = self._max_tokens(body.get(name), len(prompt_ids), name)
            return_logprob = flag(body, "logprobs")
            top_n = body.get("top_logprobs") or 0
        else:
            given = self.prompt_input(body.get("prompt"))
            if given is None:
                raise SGLangError("simulator limitation: `prompt` must be one string or one list of token ids")
            prompt_ids, prompt_text = given
            key = prompt_text
            max_tokens = self._max_tokens(body.get("max_tokens", 16), len(prompt_ids), "max_tokens")
            return_logprob = body.get("logprobs") is not None
            top_n = body.get("logprobs") or 0
        if not is_int(top_n) or top_n < 0:
            raise SGLangError("top_logprobs must be a non-negative integer")
        if body.get("n") not in (None, 1):
            raise SGLangError("simulator limitation: only n=1 is supported")
        options = body.get("stream_options") or {}
        top_k, top_p = self._truncation(body)
        echo = route == "completions" and flag(body, "echo")
        return _Request(
            route=route,
            model=str(body.get("model", self.model)),  # SGLang echoes the requested name
            stream=flag(body, "stream"),
            prompt_ids=prompt_ids,
            prompt_text=prompt_text,
            reply_key=key,
            max_tokens=max_tokens,
            ignore_eos=flag(body, "ignore_eos"),
            return_logprob=return_logprob,
            top_logprobs_num=top_n,
            logprob_start_len=0 if echo and return_logprob else -1,
            text_in_logprobs=True,
            top_k=top_k,
            top_p=top_p,
            include_usage=bool(options.get("include_usage")),
            continuous_usage=bool(options.get("continuous_usage_stats")),
            echo=echo,
        )

    def _parse_generate(self, body: JSON) -> _Request:
        text = body.get("text")
        given = self.prompt_input(text if isinstance(text, str) else body.get("input_ids"))
        if given is None:
            raise SGLangError("Either text or input_ids should be provided.")
        prompt_ids, prompt_text = given
        sampling = body.get("sampling_params") or {}
        if not isinstance(sampling, dict):
            raise SGLangError("sampling_params must be an object")
        top_n = body.get("top_logprobs_num") or 0
        start = body.get("logprob_start_len")
        start = -1 if start is None else start
        if not is_int(top_n) or top_n < 0 or not is_int(start):
            raise SGLangError("top_logprobs_num and logprob_start_len must be integers")
        top_k, top_p = self._truncation(sampling)
        return _Request(
            route="generate",
            model=self.model,
            stream=flag(body, "stream"),
            prompt_ids=prompt_ids,
            prompt_text=prompt_text,
            reply_key=prompt_text,
            max_tokens=self._max_tokens(sampling.get("max_new_tokens", 128), len(prompt_ids), "max_new_tokens"),
            ignore_eos=flag(sampling, "ignore_eos"),
            return_logprob=flag(body, "return_logprob"),
            top_logprobs_num=top_n,
            logprob_start_len=start,
            text_in_logprobs=flag(body, "return_text_in_logprobs"),
            top_k=top_k,
            top_p=top_p,
            include_usage=False,
            continuous_usage=False,
            echo=False,
        )

    async def admit(self, request: web.Request, route: str) -> Admitted:
        try:
            body, plan = await self._read(request)
            req = self._parse_generate(body) if route == "generate" else self._parse_openai(body, route)
        except SGLangError as exc:
            if route == "generate":
                error = {"error": {"message": exc.message}}
                raise Rejected(web.json_response(error, status=exc.status)) from None
            raise Rejected(self._openai_error(exc.message, exc.status)) from None
        gen = self._generate(req, plan)
        respond, produce = {
            "chat": (self._respond_chat, self._stream_chat),
            "completions": (self._respond_completion, self._stream_completion),
            "generate": (self._respond_native, self._stream_native),
        }[route]
        return Admitted(
            plan,
            req.stream,
            respond=lambda: respond(request, gen),
            produce=lambda writer: produce(request, gen, writer),
            error_frame=self._stream_error(),
        )

    # --- generation ---------------------------------------------------------------------------

    def _triple(self, logprob: float | None, token_id: int, with_text: bool) -> Triple:
        return [logprob, token_id, self.pieces(token_id) if with_text else None]

    def _position(self, position: Position, req: _Request) -> tuple[float, list[Triple]]:
        """(sampled logprob, top list) as SGLang's logits processor reports one position."""
        if req.top_k is not None or req.top_p is not None:
            ranking, sampled = nucleus(position, top_k=req.top_k, top_p=req.top_p)
        else:
            ranking, sampled = list(position.ranked), position.sampled_logprob
        top = [
            self._triple(FLOAT32_LOWEST if lp is None else f32(lp), token_id, req.text_in_logprobs)
            for token_id, lp in ranking[: req.top_logprobs_num]
        ]
        return f32(sampled), top

    def _generate(self, req: _Request, plan: FaultPlan) -> _Generation:
        eos = self.chat_eos if req.route == "chat" else self.completion_eos
        output = self.generate(req.reply_key, req.max_tokens, eos, ignore_eos=req.ignore_eos)
        ids = output.token_ids
        key = self.digest(req.route, req.prompt_ids)
        outputs: list[Triple] = []
        tops: list[list[Triple]] = []
        for position in self.synthetic.output(f"out:{key}", ids):
            sampled, top = self._position(position, req)
            outputs.append(self._triple(sampled, position.sampled, req.text_in_logprobs))
            tops.append(top)
        if output.finish_reason == "stop":
            finish: JSON = {"type": "stop", "matched": eos}
        else:
            finish = {"type": "length", "length": len(ids)}
        prefix = {"chat": "chatcmpl-", "completions": "cmpl-", "generate": ""}[req.route]
        steps = self.steps(len(ids), plan, key)
        return _Generation(req, plan, prefix + uuid.uuid4().hex, ids, finish, outputs, tops, steps)

    def _input_logprobs(self, gen: _Generation) -> tuple[list[Triple], list[list[Triple] | None]]:
        req = gen.request
        if req.logprob_start_len < 0:
            return [], []
        positions = self.synthetic.prompt(f"prompt:{self.digest(req.route, req.prompt_ids)}", req.prompt_ids)
        values: list[Triple] = []
        tops: list[list[Triple] | None] = []
        for j in range(min(req.logprob_start_len, len(positions)), len(positions)):
            position, token_id = positions[j], req.prompt_ids[j]
            if position is None:  # the first prompt token has no logprob
                values.append(self._triple(None, token_id, req.text_in_logprobs))
                tops.append(None)
                continue
            sampled, top = self._position(position, req)
            values.append(self._triple(sampled, token_id, req.text_in_logprobs))
            tops.append(top)
        return values, tops

    async def _texts(self, request: web.Request, gen: _Generation) -> Any:
        """Per engine step: (end, text delta); the last step flushes held-back bytes as U+FFFD."""
        detok = IncrementalDetokenizer(self.vocab)
        count = len(gen.ids)
        async for _, start, end in self.ticks(request, gen.plan, gen.steps):
            delta = detok.feed(gen.ids[start:end])
            yield end, delta + (detok.flush() if end == count else "")

    def _usage(self, gen: _Generation, completion: int | None = None) -> JSON:
        prompt = len(gen.request.prompt_ids)
        done = len(gen.ids) if completion is None else completion
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + done,
            "completion_tokens": done,
            "prompt_tokens_details": None,
            "reasoning_tokens": 0,
        }

    def _head(self, gen: _Generation, obj: str) -> JSON:
        return {"id": gen.rid, "object": obj, "created": int(time.time()), "model": gen.request.model}

    # --- chat ---------------------------------------------------------------------------------

    def _chat_entries(self, gen: _Generation, start: int, end: int, *, first_top_only: bool) -> list[JSON]:
        """`_process_logprobs_tokens`; `first_top_only` is the streaming bug (top list of index 0)."""
        entries = []
        for i in range(start, end):
            logprob, _, token = gen.outputs[i]
            top_source = gen.tops[start] if first_top_only else gen.tops[i]
            by_text: dict[str, float] = {t[2]: t[0] for t in top_source}  # to_openai_style_logprobs
            entries.append(
                {
                    "token": token,
                    "bytes": list(token.encode("utf-8")),
                    "logprob": logprob,
                    "top_logprobs": [
                        {"token": text, "bytes": list(text.encode("utf-8")), "logprob": lp}
                        for text, lp in by_text.items()
                    ],
                }
            )
        return entries

    async def _respond_chat(self, request: web.Request, gen: _Generation) -> web.Response:
        text = "".join([delta async for _, delta in self._texts(request, gen)])
        logprobs = None
        if gen.request.return_logprob:
            logprobs = {"content": self._chat_entries(gen, 0, len(gen.ids), first_top_only=False)}
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text or None, "reasoning_content": None, "tool_calls": None},
            "logprobs": logprobs,
            "finish_reason": gen.finish["type"],
            "matched_stop": gen.finish.get("matched"),
        }
        body = {
            **self._head(gen, "chat.completion"),
            "choices": [choice],
            "usage": self._usage(gen),
            "metadata": {"weight_version": self.settings.weight_version},
        }
        return self.json_response(body)

    @staticmethod
    def _delta(role: str | None = None, content: str | None = None) -> JSON:
        return {"role": role, "content": content, "reasoning_content": None, "tool_calls": None}

    def _chunk(self, gen: _Generation, delta: JSON, logprobs: Any, finish: Any = None, matched: Any = None) -> JSON:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish, "matched_stop": matched}
        return {**self._head(gen, "chat.completion.chunk"), "choices": [choice], "usage": None}

    async def _stream_chat(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        req = gen.request
        sent_role = False
        n_prev = 0
        async for end, delta in self._texts(request, gen):
            if not sent_role:
                await writer.send(self._chunk(gen, self._delta("assistant", ""), None))
                sent_role = True
            logprobs = None
            if req.return_logprob:
                bug = self.settings.stream_top_logprobs_bug
                logprobs = {"content": self._chat_entries(gen, n_prev, end, first_top_only=bug)}
            n_prev = end  # advanced even when no chunk goes out: those entries are lost
            if delta:
                chunk = self._chunk(gen, self._delta(content=delta), logprobs)
                if req.continuous_usage:
                    chunk["usage"] = self._usage(gen, end)
                await writer.send(chunk)
        await writer.send(self._chunk(gen, self._delta(), None, gen.finish["type"], gen.finish.get("matched")))
        if req.include_usage:
            await writer.send({**self._head(gen, "chat.completion.chunk"), "choices": [], "usage": self._usage(gen)})
        await writer.done()

    # --- completions --------------------------------------------------------------------------

    def _legacy_logprobs(self, gen: _Generation, start: int, end: int, *, with_prompt: bool) -> JSON:
        """`to_openai_style_logprobs`: dict top lists keyed by text, text_offset always -1."""
        values: list[Triple] = []
        tops: list[list[Triple] | None] = []
        if with_prompt:
            values, tops = self._input_logprobs(gen)
        values = [*values, *gen.outputs[start:end]]
        tops = [*tops, *gen.tops[start:end]]
        return {
            "text_offset": [-1] * len(values),
            "token_logprobs": [v[0] for v in values],
            "tokens": [v[2] for v in values],
            "top_logprobs": [None if t is None else {c[2]: c[0] for c in t} for t in tops],
        }

    async def _respond_completion(self, request: web.Request, gen: _Generation) -> web.Response:
        req = gen.request
        text = "".join([delta async for _, delta in self._texts(request, gen)])
        choice = {
            "index": 0,
            "text": (req.prompt_text if req.echo else "") + text,
            "logprobs": self._legacy_logprobs(gen, 0, len(gen.ids), with_prompt=req.echo)
            if req.return_logprob
            else None,
            "finish_reason": gen.finish["type"],
            "matched_stop": gen.finish.get("matched"),
        }
        body = {**self._head(gen, "text_completion"), "choices": [choice], "usage": self._usage(gen)}
        return self.json_response(body)

    async def _stream_completion(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        req = gen.request
        n_prev = 0
        async for end, delta in self._texts(request, gen):
            first = n_prev == 0
            done = end == len(gen.ids)
            choice = {
                "index": 0,
                "text": (req.prompt_text if req.echo and first else "") + delta,
                "logprobs": self._legacy_logprobs(gen, n_prev, end, with_prompt=req.echo and first)
                if req.return_logprob
                else None,
                "finish_reason": gen.finish["type"] if done else None,
                "matched_stop": gen.finish.get("matched") if done else None,
            }
            n_prev = end
            chunk = {**self._head(gen, "text_completion"), "choices": [choice], "usage": None}
            if req.continuous_usage:
                chunk["usage"] = self._usage(gen, end)
            await writer.send(chunk)
        if req.include_usage:
            await writer.send({**self._head(gen, "text_completion"), "choices": [], "usage": self._usage(gen)})
        await writer.done()

    # --- native /generate ---------------------------------------------------------------------

    def _native_body(self, gen: _Generation, text: str, end: int) -> JSON:
        req = gen.request
        done = end == len(gen.ids)
        meta: JSON = {
            "id": gen.rid,
            "finish_reason": gen.finish if done else None,
            "prompt_tokens": len(req.prompt_ids),
            "weight_version": self.settings.weight_version,
            "completion_tokens": end,
            "cached_tokens": 0,
            "e2e_latency": 0.0,
        }
        if req.return_logprob:
            input_values, input_tops = self._input_logprobs(gen)
            meta["input_token_logprobs"] = input_values
            meta["output_token_logprobs"] = gen.outputs[:end]
            if req.top_logprobs_num > 0:
                meta["input_top_logprobs"] = input_tops
                meta["output_top_logprobs"] = gen.tops[:end]
        return {"text": text, "output_ids": list(gen.ids[:end]), "meta_info": meta}

    async def _respond_native(self, request: web.Request, gen: _Generation) -> web.Response:
        text = "".join([delta async for _, delta in self._texts(request, gen)])
        return self.json_response(self._native_body(gen, text, len(gen.ids)))

    async def _stream_native(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        text = ""
        async for end, delta in self._texts(request, gen):
            text += delta  # cumulative text, ids and logprobs in every frame
            await writer.send(self._native_body(gen, text, end))
        await writer.done()

    # --- routes -------------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "sglang",
            "root": self.model,
            "max_model_len": self.settings.context_length,
        }
        return self.json_response({"object": "list", "data": [card]})

    async def model_info(self, request: web.Request) -> web.Response:
        return self.json_response({"model_path": self.model, "tokenizer_path": self.model, "is_generation": True})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)


SGLANG = Dialect(
    module="sglang",
    title="SGLang",
    port=30000,
    simulator=SGLangSimulator,
    settings=SGLangSettings,
    routes=(
        Route("POST", "/v1/chat/completions", endpoint="chat"),
        Route("POST", "/v1/completions", endpoint="completions"),
        Route("POST", "/generate", endpoint="generate"),
        Route("GET", "/v1/models", handler="models"),
        Route("GET", "/get_model_info", handler="model_info"),
        Route("GET", "/health", handler="health"),
    ),
    flags=(
        Flag("--context-length", "context_length"),
        Flag("--fixed-stream-top-logprobs", "stream_top_logprobs_bug", help="without sglang#39260"),
    ),
)
SIMULATOR_KEY = SGLANG.key


def create_app(
    vocab: Vocab,
    model: str,
    *,
    context_length: int = 4096,
    stream_top_logprobs_bug: bool = True,
    **common: Unpack[CommonOptions],
) -> web.Application:
    """An aiohttp app that answers like `python -m sglang.launch_server --model-path <model>`.

    replies: exact last user message / prompt / `text` -> reply text. tokens_per_step: tokens per
    streamed step after the first (SGLang's `--stream-interval`; "vary" for 1-3). step_delay_ms:
    wait before each step. context_length: `--context-length`. stream_top_logprobs_bug: reproduce
    sglang#39260 (every token of a multi-token stream chunk gets the first token's top list).
    The options every simulator takes (replies, default_reply, seed, tokens_per_step, step_delay_ms)
    are `base.CommonOptions`. The simulator object (stats, settings) is at `app[SIMULATOR_KEY]`.
    """
    return SGLANG.app(
        vocab, model, common, context_length=context_length, stream_top_logprobs_bug=stream_top_logprobs_bug
    )


main = SGLANG.main

if __name__ == "__main__":
    main()
