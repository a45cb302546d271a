"""A Text Generation Inference (TGI) *simulator*: TGI's wire format with no model behind it.

Scripted text and synthetic, deterministic logprobs (see `synthetic.py`), driven by a real tokenizer;
nothing here is TGI code. What is reproduced is what a client of TGI sees:

- native `POST /generate` and `POST /generate_stream` (SSE, one token per event, no `[DONE]`):
  `details.tokens[] {id, text, logprob, special}`, `top_tokens` (sorted descending; ties at the
  n-th value overflow n; the sampled token is not injected; the key is omitted when empty),
  `prefill` with a null first logprob when `decoder_input_details`, `seed` only when sampling;
- token `text` decoded incrementally with TGI's prefix/read offsets: "" on the first tokens of a
  split character, the whole character (with any text those tokens held) on the completing one;
  alternatives and prefill tokens decoded one id at a time ("\ufffd" for a partial character);
- EOS as a generated token with `special: true` and its text ("<|im_end|>"), absent from
  `generated_text`; finish reasons `eos_token` / `length`;
- logprobs are float32 printed the shortest way (`-1.7822266`); truncated alternatives (request
  `top_k` / `top_p`) are -inf, which TGI's serializer writes as null;
- the `--max-top-n-tokens` cap (default 5) with TGI's message, and TGI's other validation errors
  (`{"error": "Input validation error: ...", "error_type": "validation"}`, HTTP 422);
- the Messages API `POST /v1/chat/completions`: logprobs `{token, logprob, top_logprobs}` with no
  `bytes` and no ids, one entry per generated token including the EOS, `top_logprobs: []` when not
  asked for, one token per stream chunk (`content: ""` for special and partial tokens), `id: ""`;
- `POST /v1/completions`, whose `logprobs` is always null; its stream ends with TGI's
  `finish_reason: "eos_token"` (not "stop") and the EOS text in the last chunk;
- `data: [DONE]` closes the OpenAI-route streams (TGI PR #2221), not the native one.

    python -m gateway.simulator.tgi --tokenizer-dir ../shared/tokenizers/qwen2 --model Qwen/Qwen2-0.5B-Instruct

Simulator-only extras (not in TGI): fault hooks (see `faults.py`), GET /sim/stats, GET /sim/requests,
POST /sim/reset. Deviations: `stop` sequences, `best_of`, grammars and tools are not simulated.
"""

from __future__ import annotations

import random
import time
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
from gateway.simulator.detok import OffsetDecoder, TokenStrings, decode_ids
from gateway.simulator.faults import FaultPlan
from gateway.simulator.floats import f32_shortest
from gateway.simulator.synthetic import Position, Ranking, nucleus

DEFAULT_MAX_NEW_TOKENS = 100  # GenerateParameters and ChatRequest default
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "  # axum's Json rejection (422)


class TGIError(Refusal):
    """A request TGI refuses: `{"error": message, "error_type": ...}` with `status`."""

    def __init__(self, message: str, status: int = 422, error_type: str = "validation") -> None:
        super().__init__(message, status)
        self.error_type = error_type


def _invalid(detail: str) -> TGIError:
    return TGIError(f"Input validation error: {detail}")


class _BodyError(Refusal):
    """A body axum's Json extractor refuses before TGI sees it (plain-text answer)."""


@dataclass(frozen=True, slots=True)
class TGISettings(CommonSettings):
    """Server-wide behaviour; see `create_app`."""

    max_top_n_tokens: int = 5
    max_total_tokens: int = 4096
    max_stop_sequences: int = 4
    version: str = "0.0.0-simulator"


@dataclass(frozen=True, slots=True)
class _Params:
    """Validated generation parameters (what TGI's router hands to the engine)."""

    prompt_ids: list[int]
    prompt_text: str
    reply_key: str | None
    max_new_tokens: int
    top_n_tokens: int
    details: bool
    decoder_input_details: bool
    return_full_text: bool
    sampling: bool
    seed: int | None
    top_k: int | None
    top_p: float | None
    stream: bool


@dataclass(slots=True)
class _Generation:
    """Everything one request generates, in TGI's terms."""

    params: _Params
    plan: FaultPlan
    key: str
    ids: tuple[int, ...]
    finish_reason: str  # "eos_token" | "length"
    tokens: list[JSON]  # details.tokens
    top_tokens: list[list[JSON]]  # details.top_tokens ([] per position when not asked for)
    text: str  # generated_text without the prompt, special tokens skipped
    seed: int | None
    steps: list[tuple[int, int]]


class TGISimulator(SimulatorBase):
    """Request handlers and state of one simulated TGI server (one served model)."""

    settings: TGISettings

    def __init__(self, vocab: Vocab, model: str, settings: TGISettings) -> None:
        super().__init__(vocab, model, settings)
        self.pieces = TokenStrings(vocab, skip_special=False)  # batch_decode of single ids
        self.fingerprint = f"{settings.version}-native"

    # --- errors -------------------------------------------------------------------------------

    def _error(self, exc: TGIError) -> web.Response:
        return self.json_response({"error": exc.message, "error_type": exc.error_type}, exc.status)

    def fault_response(self, status: int, message: str) -> web.Response:
        kind = {422: "validation", 429: "overloaded"}.get(status, "generation")
        return self._error(TGIError(message, status, kind))

    @staticmethod
    def _stream_error() -> bytes:
        body = {"error": "Request failed during generation: simulated (x-sim-fault: error_mid_stream)"}
        return b"data: " + orjson.dumps({**body, "error_type": "generation"}) + b"\n\n"

    # --- request parsing --------------------------------------------------------------------------

    async def _body(self, request: web.Request, required: str) -> tuple[JSON, FaultPlan]:
        try:
            body, plan = await self.read_request(request)
        except BadBody as exc:
            if exc.kind == "json":
                raise _BodyError(f"Failed to parse the request body as JSON: {exc.detail}", 400) from None
            if exc.kind == "object":
                raise _BodyError(DESERIALIZE + "expected a map", 422) from None
            raise TGIError(exc.detail, 400, "validation") from None
        if required not in body:
            raise _BodyError(DESERIALIZE + f"missing field `{required}`", 422)
        return body, plan

    def _validate(
        self,
        raw: Mapping[str, Any],
        prompt_ids: list[int],
        prompt_text: str,
        reply_key: str | None,
        *,
        stream: bool,
        default_max_new_tokens: int | None = DEFAULT_MAX_NEW_TOKENS,
    ) -> _Params:
        """`validation.rs` in TGI's order, with its messages."""
        cfg = self.settings
        temperature = _number(raw, "temperature")
        if temperature is not None and temperature <= 0:
            raise _invalid("`temperature` must be strictly positive")
        top_p = _number(raw, "top_p")
        if top_p is not None and not 0.0 < top_p < 1.0:
            raise _invalid("`top_p` must be > 0.0 and < 1.0")  # so top_p=1.0 is refused, as in TGI
        top_k = _integer(raw, "top_k")
        if top_k is not None and top_k <= 0:
            raise _invalid("`top_k` must be strictly positive")
        typical_p = _number(raw, "typical_p")
        if typical_p is not None and not 0.0 < typical_p < 1.0:
            raise _invalid("`typical_p` must be > 0.0 and < 1.0")
        stop = raw.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop  # the OpenAI routes accept one string
        if len(stop) > cfg.max_stop_sequences:
            raise _invalid(f"`stop` supports up to {cfg.max_stop_sequences} stop sequences. Given: {len(stop)}")
        top_n = _integer(raw, "top_n_tokens") or 0
        if top_n > cfg.max_top_n_tokens:
            raise _invalid(f"`top_n_tokens` must be >= 0 and <= {cfg.max_top_n_tokens}. Given: {top_n}")
        decoder_input_details = flag(raw, "decoder_input_details")
        if decoder_input_details and stream:
            raise _invalid("`decoder_input_details` == true is not supported when streaming tokens")
        max_new = _integer(raw, "max_new_tokens") if "max_new_tokens" in raw else default_max_new_tokens
        if max_new is None:  # an explicit null: whatever the context leaves
            max_new = max(cfg.max_total_tokens - len(prompt_ids), 1)
        if max_new == 0:
            raise _invalid("`max_new_tokens` must be strictly positive")
        if len(prompt_ids) + max_new > cfg.max_total_tokens:
            raise _invalid(
                f"`inputs` tokens + `max_new_tokens` must be <= {cfg.max_total_tokens}. "
                f"Given: {len(prompt_ids)} `inputs` tokens and {max_new} `max_new_tokens`"
            )
        seed = _integer(raw, "seed")
        sampling = flag(raw, "do_sample") or any(v is not None for v in (temperature, top_k, top_p, typical_p))
        return _Params(
            prompt_ids=prompt_ids,
            prompt_text=prompt_text,
            reply_key=reply_key,
            max_new_tokens=max_new,
            top_n_tokens=top_n,
            details=flag(raw, "details"),
            decoder_input_details=decoder_input_details,
            return_full_text=flag(raw, "return_full_text"),
            sampling=sampling,
            seed=seed,
            top_k=top_k,
            top_p=top_p,
            stream=stream,
        )

    # --- generation ---------------------------------------------------------------------------

    def _ranking(self, position: Position, index: int, params: _Params) -> tuple[Ranking, float | None]:
        """The processed distribution TGI reports at one position, and the sampled token's value.

        Values come after the warpers (truncated ones are -inf); every 4th position has tied
        pairs of values (ranks 1=2, 3=4, ...) so that an odd `top_n_tokens` overflows by one.
        """
        if params.top_k is not None or params.top_p is not None:
            ranking, _ = nucleus(position, top_k=params.top_k, top_p=params.top_p)
        else:
            ranking = list(position.ranked)
        if index % 4 == 1:
            ranking = [
                (token_id, ranking[r - 1][1] if r % 2 == 1 and lp is not None else lp)
                for r, (token_id, lp) in enumerate(ranking)
            ]
        shown = [(token_id, None if lp is None else f32_shortest(lp)) for token_id, lp in ranking]
        sampled = next(lp for token_id, lp in shown if token_id == position.sampled)
        return shown, sampled

    def _top_tokens(self, ranking: Ranking, n: int) -> list[JSON]:
        """`batch_top_tokens`: the n best, plus every further token tied with the n-th (finite) value."""
        if n <= 0:
            return []
        chosen = list(ranking[:n])
        last = chosen[-1][1] if chosen else None
        if last is not None:
            chosen += [(i, lp) for i, lp in ranking[n:] if lp is not None and lp >= last]
        return [self._token(i, self.pieces(i), lp) for i, lp in chosen]

    def _token(self, token_id: int, text: str, logprob: float | None) -> JSON:
        return {"id": token_id, "text": text, "logprob": logprob, "special": self.vocab.is_special(token_id)}

    def _generate(self, params: _Params, plan: FaultPlan, eos: int | None, kind: str) -> _Generation:
        output = self.generate(params.reply_key, params.max_new_tokens, eos)
        ids = output.token_ids
        key = self.digest(kind, params.prompt_ids)
        decoder = OffsetDecoder(self.vocab)
        tokens: list[JSON] = []
        tops: list[list[JSON]] = []
        for index, position in enumerate(self.synthetic.output(f"out:{key}", ids)):
            ranking, sampled = self._ranking(position, index, params)
            tokens.append(self._token(position.sampled, decoder.feed(position.sampled), sampled))
            tops.append(self._top_tokens(ranking, params.top_n_tokens))
        seed = None
        if params.sampling:  # the router draws a seed when the request has none
            seed = params.seed if params.seed is not None else random.Random(key).getrandbits(64)
        return _Generation(
            params=params,
            plan=plan,
            key=key,
            ids=ids,
            finish_reason="eos_token" if output.finish_reason == "stop" else "length",
            tokens=tokens,
            top_tokens=tops,
            text=decode_ids(self.vocab, ids, skip_special=True),
            seed=seed,
            steps=self.steps(len(ids), plan, key),
        )

    def _prefill(self, gen: _Generation) -> list[JSON]:
        if not gen.params.decoder_input_details:
            return []
        ids = gen.params.prompt_ids
        positions = self.synthetic.prompt(f"prompt:{gen.key}", ids)
        return [
            {"id": i, "text": self.pieces(i), "logprob": None if p is None else f32_shortest(p.sampled_logprob)}
            for i, p in zip(ids, positions, strict=True)
        ]

    def _full_text(self, gen: _Generation) -> str:
        return gen.params.prompt_text + gen.text if gen.params.return_full_text else gen.text

    @staticmethod
    def _openai_finish(gen: _Generation) -> str:
        return "stop" if gen.finish_reason == "eos_token" else gen.finish_reason  # FinishReason::format(true)

    def _usage(self, gen: _Generation) -> JSON:
        prompt, completion = len(gen.params.prompt_ids), len(gen.ids)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _headers(self, gen: _Generation) -> dict[str, str]:
        return {
            "x-compute-type": "simulator",
            "x-compute-characters": str(len(gen.params.prompt_text)),
            "x-prompt-tokens": str(len(gen.params.prompt_ids)),
            "x-generated-tokens": str(len(gen.ids)),
        }

    async def _tokens(self, request: web.Request, gen: _Generation) -> Any:
        """Token indices in order, pausing once per engine step (TGI sends one token per event)."""
        async for _, start, end in self.ticks(request, gen.plan, gen.steps):
            for index in range(start, end):
                yield index

    # --- native routes ------------------------------------------------------------------------

    async def _admit_native(self, request: web.Request, stream: bool) -> Admitted:
        try:
            body, plan = await self._body(request, "inputs")
            inputs, raw = body["inputs"], body.get("parameters") or {}
            if not isinstance(inputs, str) or not isinstance(raw, dict):
                raise _BodyError(DESERIALIZE + "invalid type", 422)
            params = self._validate(raw, self.encode(inputs), inputs, inputs, stream=stream)
        except _BodyError as exc:
            raise Rejected(web.Response(text=exc.message, status=exc.status)) from None
        except TGIError as exc:
            raise Rejected(self._error(exc)) from None
        gen = self._generate(params, plan, self.completion_eos, "generate")
        return Admitted(
            plan,
            stream,
            respond=lambda: self._respond_native(request, gen),
            produce=lambda writer: self._stream_native(request, gen, writer),
            error_frame=self._stream_error(),
            done_frame=None,  # /generate_stream just ends
        )

    async def _respond_native(self, request: web.Request, gen: _Generation) -> web.Response:
        async for _ in self._tokens(request, gen):
            pass
        body: JSON = {"generated_text": self._full_text(gen)}
        if gen.params.details:
            details: JSON = {
                "finish_reason": gen.finish_reason,
                "generated_tokens": len(gen.ids),
                "seed": gen.seed,
                "prefill": self._prefill(gen),
                "tokens": gen.tokens,
            }
            if any(gen.top_tokens):
                details["top_tokens"] = gen.top_tokens  # skip_serializing_if = "Vec::is_empty"
            body["details"] = details
        return self.json_response(body, headers=self._headers(gen))

    async def _stream_native(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        last = len(gen.ids) - 1
        async for index in self._tokens(request, gen):
            event: JSON = {"index": index + 1, "token": gen.tokens[index]}
            if gen.top_tokens[index]:
                event["top_tokens"] = gen.top_tokens[index]
            event["generated_text"] = self._full_text(gen) if index == last else None
            details = None
            if index == last and gen.params.details:
                details = {
                    "finish_reason": gen.finish_reason,
                    "generated_tokens": len(gen.ids),
                    "seed": gen.seed,
                    "input_length": len(gen.params.prompt_ids),
                }
            event["details"] = details
            await writer.send(event)
        await writer.done()

    # --- OpenAI-compatible routes -------------------------------------------------------------

    async def _admit_openai(self, request: web.Request, endpoint: str) -> Admitted:
        required = "messages" if endpoint == "chat" else "prompt"
        try:
            body, plan = await self._body(request, required)
            stream = flag(body, "stream")
            raw = {  # what ChatRequest / CompletionRequest hand to the generate parameters
                "temperature": None if body.get("temperature") == 0 else body.get("temperature"),
                "top_p": body.get("top_p"),
                "seed": body.get("seed"),
                "stop": body.get("stop"),
                "top_n_tokens": body.get("top_logprobs") if endpoint == "chat" else None,
                "max_new_tokens": body.get("max_tokens"),
                "do_sample": body.get("temperature") != 0,
            }
            if body.get("max_tokens") is None:
                raw.pop("max_new_tokens")
            if endpoint == "chat":
                try:
                    prompt_ids, key = self.chat_input(body["messages"])
                except ValueError as exc:
                    raise _BodyError(DESERIALIZE + f"{exc}", 422) from None
                prompt_text = ""
            else:
                prompt = body["prompt"]
                if isinstance(prompt, list) and len(prompt) == 1:
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise TGIError("simulator limitation: `prompt` must be one string", 422)
                prompt_ids, key, prompt_text = self.encode(prompt), prompt, prompt
            params = self._validate(raw, prompt_ids, prompt_text, key, stream=stream)
        except _BodyError as exc:
            raise Rejected(web.Response(text=exc.message, status=exc.status)) from None
        except TGIError as exc:
            raise Rejected(self._error(exc)) from None
        eos = self.chat_eos if endpoint == "chat" else self.completion_eos
        gen = self._generate(params, plan, eos, endpoint)
        options = body.get("stream_options") or {}
        include_usage = bool(options.get("include_usage")) if isinstance(options, Mapping) else False
        logprobs = endpoint == "chat" and flag(body, "logprobs")
        if endpoint == "chat":
            respond = lambda: self._respond_chat(request, gen, logprobs)  # noqa: E731
            produce = lambda writer: self._stream_chat(request, gen, writer, logprobs, include_usage)  # noqa: E731
        else:
            respond = lambda: self._respond_completion(request, gen)  # noqa: E731
            produce = lambda writer: self._stream_completion(request, gen, writer)  # noqa: E731
        return Admitted(plan, stream, respond=respond, produce=produce, error_frame=self._stream_error())

    def _head(self, obj: str) -> JSON:
        return {
            "object": obj,
            "id": "",
            "created": int(time.time()),
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    @staticmethod
    def _chat_entry(token: JSON, top: list[JSON]) -> JSON:
        """ChatCompletionLogprob: no bytes, no ids; top entries `{token, logprob}`."""
        return {
            "token": token["text"],
            "logprob": token["logprob"],
            "top_logprobs": [{"token": t["text"], "logprob": t["logprob"]} for t in top],
        }

    async def _respond_chat(self, request: web.Request, gen: _Generation, logprobs: bool) -> web.Response:
        async for _ in self._tokens(request, gen):
            pass
        content = None
        if logprobs:
            content = {"content": [self._chat_entry(t, top) for t, top in zip(gen.tokens, gen.top_tokens, strict=True)]}
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": gen.text},
            "logprobs": content,
            "finish_reason": self._openai_finish(gen),
        }
        body = {**self._head("chat.completion"), "choices": [choice], "usage": self._usage(gen)}
        return self.json_response(body, headers=self._headers(gen))

    async def _stream_chat(
        self, request: web.Request, gen: _Generation, writer: SSEWriter, logprobs: bool, include_usage: bool
    ) -> None:
        last = len(gen.ids) - 1
        async for index in self._tokens(request, gen):
            token = gen.tokens[index]
            choice = {
                "index": 0,
                # special tokens show as content "" (their text stays in the logprob entry)
                "delta": {"role": "assistant", "content": "" if token["special"] else token["text"]},
                "logprobs": {"content": [self._chat_entry(token, gen.top_tokens[index])]} if logprobs else None,
                "finish_reason": self._openai_finish(gen) if index == last else None,
            }
            await writer.send({**self._head("chat.completion.chunk"), "choices": [choice], "usage": None})
        if include_usage:
            await writer.send({**self._head("chat.completion.chunk"), "choices": [], "usage": self._usage(gen)})
        await writer.done()

    async def _respond_completion(self, request: web.Request, gen: _Generation) -> web.Response:
        async for _ in self._tokens(request, gen):
            pass
        choice = {"index": 0, "text": gen.text, "logprobs": None, "finish_reason": self._openai_finish(gen)}
        body = {**self._head("text_completion"), "choices": [choice], "usage": self._usage(gen)}
        return self.json_response(body, headers=self._headers(gen))

    async def _stream_completion(self, request: web.Request, gen: _Generation, writer: SSEWriter) -> None:
        last = len(gen.ids) - 1
        async for index in self._tokens(request, gen):
            # Chunks carry the raw token text, the EOS text included; the last one is a
            # CompletionFinal with the unformatted finish reason ("eos_token") and usage.
            choice = {
                "index": 0,
                "text": gen.tokens[index]["text"],
                "logprobs": None,
                "finish_reason": gen.finish_reason if index == last else "",
            }
            chunk = {**self._head("text_completion"), "choices": [choice]}
            if index == last:
                chunk["usage"] = self._usage(gen)
            await writer.send(chunk)
        await writer.done()

    # --- routes -------------------------------------------------------------------------------

    async def admit(self, request: web.Request, endpoint: str) -> Admitted:
        if endpoint in ("generate", "generate_stream"):
            return await self._admit_native(request, stream=endpoint == "generate_stream")
        return await self._admit_openai(request, endpoint)

    async def info(self, request: web.Request) -> web.Response:
        cfg = self.settings
        return self.json_response(
            {
                "model_id": self.model,
                "model_sha": None,
                "model_pipeline_tag": "text-generation",
                "max_concurrent_requests": 128,
                "max_best_of": 2,
                "max_stop_sequences": cfg.max_stop_sequences,
                "max_input_tokens": cfg.max_total_tokens - 1,
                "max_total_tokens": cfg.max_total_tokens,
                "validation_workers": 2,
                "max_client_batch_size": 4,
                "router": "text-generation-router",
                "version": cfg.version,
                "sha": None,
                "docker_label": None,
            }
        )

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.model, "object": "model", "created": 0, "owned_by": self.model}
        return self.json_response({"object": "list", "data": [card]})


def _number(raw: Mapping[str, Any], name: str) -> float | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _BodyError(DESERIALIZE + f"{name}: invalid type", 422)
    return float(value)


def _integer(raw: Mapping[str, Any], name: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if not is_int(value) or value < 0:
        raise _BodyError(
            DESERIALIZE + f"{name}: invalid value: {value!r}, expected u32",
            422,
        )
    return int(value)


TGI = Dialect(
    module="tgi",
    title="TGI",
    port=8080,
    simulator=TGISimulator,
    settings=TGISettings,
    routes=(
        Route("POST", "/generate", endpoint="generate"),
        Route("POST", "/generate_stream", endpoint="generate_stream"),
        Route("POST", "/v1/chat/completions", endpoint="chat"),
        Route("POST", "/v1/completions", endpoint="completions"),
        Route("GET", "/info", handler="info"),
        Route("GET", "/health", handler="health"),
        Route("GET", "/v1/models", handler="models"),
    ),
    flags=(Flag("--max-top-n-tokens", "max_top_n_tokens"), Flag("--max-total-tokens", "max_total_tokens")),
)
SIMULATOR_KEY = TGI.key


def create_app(
    vocab: Vocab,
    model: str,
    *,
    max_top_n_tokens: int = 5,
    max_total_tokens: int = 4096,
    **common: Unpack[CommonOptions],
) -> web.Application:
    """An aiohttp app that answers like `text-generation-launcher --model-id <model>` (see the module docstring).

    replies: exact `inputs` / last user message / prompt -> reply text. tokens_per_step: tokens
    per engine step after the first (TGI still sends one event per token; a step's tokens follow
    each other without delay). step_delay_ms: wait before each engine step. max_top_n_tokens:
    the launcher's `--max-top-n-tokens`; max_total_tokens: `--max-total-tokens`.
    The options every simulator takes (replies, default_reply, seed, tokens_per_step, step_delay_ms)
    are `base.CommonOptions`. The simulator object (stats, settings) is at `app[SIMULATOR_KEY]`.
    """
    return TGI.app(vocab, model, common, max_top_n_tokens=max_top_n_tokens, max_total_tokens=max_total_tokens)


main = TGI.main

if __name__ == "__main__":
    main()
