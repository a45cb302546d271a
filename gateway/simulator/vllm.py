"""A vLLM *simulator*: vLLM's OpenAI-compatible wire format with no model behind it.

The text is scripted (a reply looked up by the last user message / the prompt, else a default
reply with ASCII, an emoji split across tokens and CJK); the logprobs are synthetic but
deterministic (see `synthetic.py`). What is reproduced faithfully is everything a client sees:
field sets, chunking, the EOS token in token ids and logprobs, per-token lossy strings ("\ufffd",
""), sampled-first top lists, `token_id:N` placeholders and their `bytes` quirk, completions'
colliding dict keys and code-point text offsets, errors and their bodies (the context-length 400s in
vLLM's wording, vllm/renderers/params.py; and what the engine refuses when it takes a request, the
logprob caps and `logit_bias` ids outside the vocabulary, vllm/v1/engine/input_processor.py: a 400
for a whole request, HTTP 200 and an in-band error frame for a streamed one). It exists for the
gateway's tests, demo and benchmarks; nothing here is vLLM code.

    python -m gateway.simulator.vllm --demo-tokenizer --model sim-model --port 8001
    python -m gateway.simulator.vllm --tokenizer-json tokenizer.json --model my/model --port 8001
    python -m gateway.simulator.vllm --tokenizer-dir ../shared/tokenizers/qwen2 --model Qwen/Qwen2-0.5B-Instruct

Simulator-only extras (not in vLLM): fault hooks (see `faults.py`), GET /sim/stats (request
counters), GET /sim/requests (recently received bodies), POST /sim/reset.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Unpack

import orjson
from aiohttp import web

from gateway.logprobs.vocab import Vocab
from gateway.simulator import scripted
from gateway.simulator import vllm_wire as wire
from gateway.simulator.base import (
    Admitted,
    BadBody,
    CommonOptions,
    CommonSettings,
    Dialect,
    Flag,
    Rejected,
    Route,
    SimulatorBase,
    SSEWriter,
)
from gateway.simulator.detok import ContextualTokenStrings, HoldingDetokenizer, TokenStrings, decode_ids
from gateway.simulator.faults import FaultPlan
from gateway.simulator.script import Output, plan_output
from gateway.simulator.synthetic import Position
from gateway.simulator.vllm_params import (
    GenRequest,
    RequestError,
    ServerLimits,
    engine_check,
    parse_chat,
    parse_completions,
)
from gateway.simulator.vllm_wire import JSON


@dataclass(slots=True)
class _Job:
    """One admitted generation request and everything derived from it."""

    gen: GenRequest
    plan: FaultPlan
    env: wire.Envelope
    key: str  # digest of the prompt: seeds the synthetic logprobs
    output: Output
    steps: list[tuple[int, int]]
    turn: scripted.ScriptedTurn | None = None  # a reply with thinking or tool calls (see scripted.py)


@dataclass(frozen=True, slots=True)
class SimSettings(CommonSettings):
    """Server-wide behaviour; see `create_app` for what each setting means."""

    max_logprobs: int = 20
    max_model_len: int = 4096
    return_tokens_as_token_ids: bool = False
    reasoning_field: str = "reasoning"  # "reasoning_content" before vLLM 0.10


class VLLMSimulator(SimulatorBase):
    """Request handlers and state of one simulated vLLM server (one served model)."""

    settings: SimSettings

    def __init__(self, vocab: Vocab, model: str, settings: SimSettings) -> None:
        super().__init__(vocab, model, settings)
        self.strings = TokenStrings(vocab)
        self.contextual = ContextualTokenStrings(vocab, self.strings)
        self.limits = ServerLimits(
            model, settings.max_model_len, settings.max_logprobs, len(vocab), settings.return_tokens_as_token_ids
        )

    # --- plumbing ---------------------------------------------------------------------------

    def _decode(self, ids: Sequence[int]) -> str:
        return decode_ids(self.vocab, ids, skip_special=True)

    def fault_response(self, status: int, message: str) -> web.Response:
        try:
            kind = HTTPStatus(status).phrase.replace(" ", "")  # 503 -> ServiceUnavailableError
        except ValueError:  # a status without a name
            kind = "InternalServer" if status >= 500 else "BadRequest"
        kind = kind if kind.endswith("Error") else kind + "Error"
        return RequestError(message, status=status, kind=kind).response()

    # --- logprobs of one sequence -------------------------------------------------------------

    def _output_dicts(self, job: _Job, start: int, end: int, num: int) -> list[dict[int, float]]:
        positions = self.synthetic.output(f"out:{job.key}", job.output.token_ids, start, end)
        return [p.vllm_dict(num) for p in positions]

    def _prompt_positions(self, job: _Job) -> list[Position | None]:
        # The first prompt token has no context, hence no distribution (vLLM: None).
        return self.synthetic.prompt(f"prompt:{job.key}", job.gen.prompt_ids)

    def _prompt_dicts(self, job: _Job, num: int) -> list[dict[int, float] | None]:
        return [None if p is None else p.vllm_dict(num) for p in self._prompt_positions(job)]

    def _raw_prompt_logprobs(self, job: _Job) -> list[Any] | None:
        if job.gen.prompt_logprobs is None:
            return None
        return wire.raw_prompt_logprobs(self._prompt_positions(job), job.gen.prompt_logprobs, self.strings)

    # --- request admission ------------------------------------------------------------------

    def _job(self, gen: GenRequest, plan: FaultPlan, prefix: str) -> _Job:
        eos = self.chat_eos if gen.endpoint == "chat" else self.completion_eos
        reply = self.settings.replies.get(gen.reply_key) if gen.reply_key is not None else None
        script = None if isinstance(reply, dict) and "token_ids" in reply else scripted.read_script(reply)
        turn = None
        if script is None:
            output = self.generate(gen.reply_key, gen.max_tokens, eos, ignore_eos=gen.ignore_eos)
        else:
            if gen.endpoint != "chat":  # no parsers on /v1/completions: the text is all there is
                script = scripted.Script(script.content)
            ids, layout = scripted.layout(script, self.encode)
            output = plan_output(ids, gen.max_tokens, eos, ignore_eos=gen.ignore_eos,
                                 filler=self.encode(self.settings.default_reply))
            if gen.endpoint == "chat":
                turn = scripted.ScriptedTurn(layout, output.token_ids, lambda: HoldingDetokenizer(self.vocab),
                                             self.settings.reasoning_field)
        digest = self.digest(gen.endpoint, gen.prompt_ids)
        steps = self.steps(len(output.token_ids), plan, digest, gen.stream_interval)
        env = wire.Envelope(wire.new_request_id(prefix), int(time.time()), self.model)
        return _Job(gen, plan, env, digest, output, steps, turn)

    async def _parse(self, request: web.Request, endpoint: str) -> tuple[FaultPlan, GenRequest]:
        try:
            body, plan = await self.read_request(request)
        except BadBody as exc:
            message = f"JSON decode error: {exc.detail}" if exc.kind == "json" else exc.detail
            raise RequestError(message, param=exc.hook) from None
        if endpoint == "chat":
            return plan, parse_chat(body, self.limits, self.renderer)
        return plan, parse_completions(body, self.limits, self.encode, self._decode)

    async def admit(self, request: web.Request, endpoint: str) -> Admitted:
        try:
            plan, gen = await self._parse(request, endpoint)
        except RequestError as exc:
            raise Rejected(exc.response()) from None
        refused = engine_check(gen, self.limits)
        if refused is not None:
            if not gen.stream:
                raise Rejected(refused.response())
            # The stream generator already answers 200 when the engine refuses the request: vLLM
            # writes the error as a frame, then [DONE] (serving_chat.py / serving_completion.py,
            # `create_streaming_error_response`), status 400 only inside it.
            frame = b"data: " + orjson.dumps(refused.body()) + b"\n\n"
            return Admitted(plan, True, produce=lambda writer: self._refuse_in_band(writer, frame))
        job = self._job(gen, plan, "chatcmpl" if endpoint == "chat" else "cmpl")
        # What vLLM's stream generators do when the engine fails: an error frame, then [DONE].
        message = "simulated engine failure (x-sim-fault: error_mid_stream)"
        error = RequestError(message, status=500, kind="InternalServerError")
        return Admitted(
            plan,
            gen.stream,
            respond=lambda: self._respond(request, job),
            produce=lambda writer: self._stream(request, job, writer),
            error_frame=b"data: " + orjson.dumps(error.body()) + b"\n\n",
        )

    async def _refuse_in_band(self, writer: SSEWriter, frame: bytes) -> None:
        await writer.frame(frame)
        await writer.done()

    # --- generation ---------------------------------------------------------------------------

    async def _engine_steps(self, request: web.Request, job: _Job) -> AsyncIterator[tuple[int, int, int, str]]:
        """(step number, start, end, text delta) per engine step, each after the step's delay."""
        detok = HoldingDetokenizer(self.vocab)
        async for n, start, end in self.ticks(request, job.plan, job.steps):
            yield n, start, end, detok.feed(job.output.token_ids[start:end])

    def _usage(self, job: _Job, completion_tokens: int, *, final_chunk: bool = False) -> JSON:
        return wire.usage_body(len(job.gen.prompt_ids), completion_tokens, drop_nulls=final_chunk)

    async def _respond(self, request: web.Request, job: _Job) -> web.Response:
        text = "".join([delta async for *_, delta in self._engine_steps(request, job)])
        gen, out = job.gen, job.output
        ids = list(out.token_ids)
        if gen.endpoint == "chat":
            body = wire.chat_response(
                job.env,
                content=(gen.echo_text or "") + text,
                logprobs=self._chat_logprobs(job, 0, len(ids)),
                finish_reason=out.finish_reason,
                token_ids=ids if gen.return_token_ids else None,
                usage=self._usage(job, len(ids)),
                prompt_logprobs=self._raw_prompt_logprobs(job),
                prompt_token_ids=gen.prompt_ids if gen.return_token_ids else None,
            )
            if job.turn is not None:
                choice = body["choices"][0]
                choice["message"].update(job.turn.message(len(ids)))
                choice["finish_reason"] = job.turn.finish_reason(out.finish_reason, len(ids))
        else:
            shown_text, logprobs = self._completion_view(job, 0, len(ids), text, first=True, text_offset=0)
            body = wire.completion_response(
                job.env,
                text=shown_text,
                logprobs=logprobs,
                finish_reason=out.finish_reason,
                token_ids=ids if gen.return_token_ids else None,
                prompt_logprobs=self._raw_prompt_logprobs(job),
                prompt_token_ids=gen.prompt_ids if gen.return_token_ids else None,
                usage=self._usage(job, len(ids)),
            )
        return self.json_response(body)

    def _chat_logprobs(self, job: _Job, start: int, end: int) -> JSON | None:
        k = job.gen.logprobs
        if k is None:
            return None
        dicts = self._output_dicts(job, start, end, k)
        return wire.chat_logprobs(job.output.token_ids[start:end], dicts, k, self.strings, job.gen.as_ids,
                                  self._spell_at(job, start))

    def _spell_at(self, job: _Job, start: int, prompt: int = 0) -> Callable[[int, int], str]:
        """Token strings as vLLM gives them at output position `start + i` (the first `prompt`
        positions are echoed prompt tokens, decoded on their own): see `ContextualTokenStrings`."""
        ids = job.output.token_ids

        def spell(position: int, token_id: int) -> str:
            if position < prompt:
                return self.strings(token_id)
            return self.contextual.at(token_id, ids[: start + position - prompt])

        return spell

    def _completion_view(
        self, job: _Job, start: int, end: int, text: str, *, first: bool, text_offset: int
    ) -> tuple[str, JSON | None]:
        """Text and logprobs a completion shows for output[start:end].

        With echo, the first view also carries the prompt (only the prompt for max_tokens=0);
        vLLM drops the prompt *text* (not its ids) when return_token_ids is set.
        """
        gen = job.gen
        k = gen.logprobs
        ids = list(job.output.token_ids[start:end])
        dicts: list[dict[int, float] | None] = [None] * len(ids)
        if k is not None:
            dicts = list(self._output_dicts(job, start, end, k))
        prompt = 0
        if gen.echo and first:
            prompt = len(gen.prompt_ids)
            prompt_text = "" if gen.return_token_ids else gen.prompt_text
            prompt_dicts: list[dict[int, float] | None] = [None] * len(gen.prompt_ids)
            if k is not None:
                # echo sets prompt_logprobs = logprobs unless the request set it itself
                prompt_dicts = self._prompt_dicts(job, gen.prompt_logprobs if gen.prompt_logprobs is not None else k)
            if gen.echo_only:
                ids, text, dicts = list(gen.prompt_ids), prompt_text, prompt_dicts
            else:
                ids, text, dicts = [*gen.prompt_ids, *ids], prompt_text + text, [*prompt_dicts, *dicts]
        if k is None:
            return text, None
        spell_at = self._spell_at(job, start, prompt) if not (gen.echo_only and first) else None
        return text, wire.completion_logprobs(ids, dicts, k, self.strings, gen.as_ids, text_offset, spell_at)

    async def _stream(self, request: web.Request, job: _Job, writer: SSEWriter) -> None:
        gen, out = job.gen, job.output
        count = len(out.token_ids)
        text_len = 0  # vLLM's previous_text_lens: advanced by output text only, never the prompt
        async for n, start, end, delta in self._engine_steps(request, job):
            finish = out.finish_reason if end == count else None
            step_ids = list(out.token_ids[start:end]) if gen.return_token_ids else None
            chunks: list[tuple[JSON, int]] = []  # (chunk, completion tokens so far)
            if gen.endpoint == "chat":
                if n == 0:
                    chunks.append((wire.chat_role_chunk(job.env, gen.prompt_ids if gen.return_token_ids else None), 0))
                    if gen.echo_text:
                        chunks.append((wire.chat_echo_chunk(job.env, gen.echo_text), 0))
                logprobs = self._chat_logprobs(job, start, end)
                chunk = wire.chat_content_chunk(
                    job.env, text=delta, logprobs=logprobs, finish_reason=finish, token_ids=step_ids
                )
                if job.turn is not None:
                    choice = chunk["choices"][0]
                    choice["delta"] = job.turn.delta(start, end)
                    if finish is not None:
                        choice["finish_reason"] = job.turn.finish_reason(finish, end)
            else:
                shown_text, logprobs = self._completion_view(job, start, end, delta, first=n == 0, text_offset=text_len)
                chunk = wire.completion_chunk(
                    job.env,
                    text=shown_text,
                    logprobs=logprobs,
                    finish_reason=finish,
                    prompt_token_ids=gen.prompt_ids if n == 0 and (gen.echo or gen.return_token_ids) else None,
                    token_ids=step_ids,
                )
                if finish is not None and not gen.include_usage:
                    # (vLLM 0.32.0 without include_usage: the finishing chunk carries the fingerprint)
                    chunk["system_fingerprint"] = wire.SYSTEM_FINGERPRINT
            text_len += len(delta)
            chunks.append((chunk, end))
            for chunk, done in chunks:
                if gen.continuous_usage:
                    chunk["usage"] = self._usage(job, done)
                await writer.send(chunk)
        if gen.include_usage:
            usage_chunk = wire.chat_usage_chunk if gen.endpoint == "chat" else wire.completion_usage_chunk
            await writer.send(usage_chunk(job.env, self._usage(job, count, final_chunk=True)))
        await writer.done()

    # --- routes -----------------------------------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return self.json_response(wire.model_list(self.model, self.limits.max_model_len))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return self.json_response({"version": "0.0.0+simulator"})


VLLM = Dialect(
    module="vllm",
    title="vLLM",
    port=8000,
    simulator=VLLMSimulator,
    settings=SimSettings,
    routes=(
        Route("POST", "/v1/chat/completions", endpoint="chat"),
        Route("POST", "/v1/completions", endpoint="completions"),
        Route("GET", "/v1/models", handler="models"),
        Route("GET", "/health", handler="health"),
        Route("GET", "/version", handler="version"),
    ),
    flags=(
        Flag("--max-logprobs", "max_logprobs"),
        Flag("--max-model-len", "max_model_len"),
        Flag("--return-tokens-as-token-ids", "return_tokens_as_token_ids"),
    ),
)
SIMULATOR_KEY = VLLM.key


def create_app(
    vocab: Vocab,
    model: str,
    *,
    max_logprobs: int = 20,
    max_model_len: int = 4096,
    return_tokens_as_token_ids: bool = False,
    reasoning_field: str = "reasoning",
    **common: Unpack[CommonOptions],
) -> web.Application:
    """An aiohttp app that answers like `vllm serve <model>` (see the module docstring).

    replies: exact last-user-message (chat) / prompt (completions) -> reply text.
    max_logprobs: vLLM's --max-logprobs (-1 = no cap). max_model_len: context length.
    tokens_per_step: tokens per streamed engine step after the first (an int, or "vary" for
    1-3 like speculative decoding); requests may override it with `stream_interval`.
    step_delay_ms: wait before each engine step. return_tokens_as_token_ids: the server flag.
    A reply may also be an object with thinking and tool calls (see `scripted.py`); reasoning_field
    names the thinking's key (`reasoning`; `reasoning_content` before vLLM 0.10).
    The options every simulator takes (replies, default_reply, seed, tokens_per_step, step_delay_ms)
    are `base.CommonOptions`. The simulator object (stats, settings) is at `app[SIMULATOR_KEY]`.
    """
    return VLLM.app(
        vocab,
        model,
        common,
        max_logprobs=max_logprobs,
        max_model_len=max_model_len,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
        reasoning_field=reasoning_field,
    )


main = VLLM.main

if __name__ == "__main__":
    main()
