"""A vLLM *simulator*: vLLM's OpenAI-compatible wire format with no model behind it.

The text is scripted (a reply looked up by the last user message / the prompt, else a default
reply with ASCII, an emoji split across tokens and CJK); the logprobs are synthetic but
deterministic (see `synthetic.py`). What is reproduced faithfully is everything a client sees:
field sets, chunking, the EOS token in token ids and logprobs, per-token lossy strings ("\ufffd",
""), sampled-first top lists, `token_id:N` placeholders and their `bytes` quirk, completions'
colliding dict keys and code-point text offsets, errors and their bodies. It exists for the
gateway's tests, demo and benchmarks; nothing here is vLLM code.

    python -m gateway.simulator.vllm --demo-tokenizer --model sim-model --port 8001
    python -m gateway.simulator.vllm --tokenizer-json tokenizer.json --model my/model --port 8001
    python -m gateway.simulator.vllm --tokenizer-dir ../shared/tokenizers/qwen2 --model Qwen/Qwen2-0.5B-Instruct

Simulator-only extras (not in vLLM): fault hooks (see `faults.py`), GET /sim/stats (request
counters), GET /sim/requests (recently received bodies), POST /sim/reset.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from gateway.logprobs.vocab import Vocab, load_directory, load_tokenizer_json
from gateway.simulator import vllm_wire as wire
from gateway.simulator.detok import IncrementalDetokenizer, TokenStrings
from gateway.simulator.faults import FaultPlan, HookError, SimStats, read_fault_plan
from gateway.simulator.prompt import END_OF_TEXT, IM_END, IM_START, ChatMLRenderer, find_special_id
from gateway.simulator.script import DEFAULT_REPLY, Output, TokensPerStep, plan_output, split_steps
from gateway.simulator.synthetic import Position, SyntheticLogprobs
from gateway.simulator.vllm_params import GenRequest, RequestError, ServerLimits, parse_chat, parse_completions
from gateway.simulator.vllm_wire import JSON

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
_POLL_S = 0.02  # how often a waiting handler checks that its client is still connected


class _Dropped(Exception):
    """The simulator dropped the connection on purpose (fault injection)."""


class _Aborted(Exception):
    """The simulator ended a stream with vLLM's in-band error frame (fault injection)."""


@dataclass(slots=True)
class _Job:
    """One admitted generation request and everything derived from it."""

    gen: GenRequest
    plan: FaultPlan
    env: wire.Envelope
    key: str  # digest of the prompt: seeds the synthetic logprobs
    output: Output
    steps: list[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class SimSettings:
    """Server-wide behaviour; see `create_app` for what each setting means."""

    replies: Mapping[str, str] = field(default_factory=dict)
    default_reply: str = DEFAULT_REPLY
    max_logprobs: int = 20
    seed: int = 0
    max_model_len: int = 4096
    tokens_per_step: TokensPerStep = 1
    step_delay_ms: float = 0.0
    return_tokens_as_token_ids: bool = False

    def __post_init__(self) -> None:
        tps = self.tokens_per_step
        if tps != "vary" and (isinstance(tps, bool) or not isinstance(tps, int) or tps < 1):
            raise ValueError(f"tokens_per_step must be an int >= 1 or 'vary', got {tps!r}")


class VLLMSimulator:
    """Request handlers and state of one simulated vLLM server (one served model)."""

    def __init__(self, vocab: Vocab, model: str, settings: SimSettings) -> None:
        self.vocab = vocab
        self.model = model
        self.settings = settings
        self.stats = SimStats()
        self.strings = TokenStrings(vocab)
        self.renderer = ChatMLRenderer(vocab)
        self.limits = ServerLimits(
            model, settings.max_model_len, settings.max_logprobs, len(vocab), settings.return_tokens_as_token_ids
        )
        im_end, eot = find_special_id(vocab, IM_END), find_special_id(vocab, END_OF_TEXT)
        self.chat_eos = im_end if im_end is not None else eot
        self.completion_eos = eot if eot is not None else im_end
        specials = [i for i in (im_end, eot, find_special_id(vocab, IM_START)) if i is not None]
        self.synthetic = SyntheticLogprobs(vocab, seed=settings.seed, special_ids=specials)
        self._encoded: dict[str, list[int]] = {}

    # --- plumbing ---------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = self._encoded[text] = self.vocab.encode(text)
        return ids

    def _decode(self, ids: Sequence[int]) -> str:
        data = b"".join(b"" if self.vocab.is_special(i) else self.vocab.token_bytes(i) for i in ids)
        return data.decode("utf-8", errors="replace")

    @staticmethod
    def _json(body: Any, status: int = 200) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")

    def _error(self, exc: RequestError) -> web.Response:
        return self._json(wire.error_body(exc.message, exc.err_type, exc.status, exc.param), exc.status)

    @staticmethod
    def _gone(request: web.Request) -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    async def _pause(self, request: web.Request, seconds: float | None) -> None:
        """Sleep (None = forever), noticing a vanished client even without handler cancellation."""
        loop = asyncio.get_running_loop()
        deadline = None if seconds is None else loop.time() + seconds
        while True:
            if self._gone(request):
                raise ConnectionResetError("client went away")
            remaining = _POLL_S if deadline is None else deadline - loop.time()
            if remaining <= 0:
                return
            await asyncio.sleep(min(remaining, _POLL_S))

    @staticmethod
    def _drop(request: web.Request) -> None:
        if request.transport is not None:
            request.transport.close()  # flushes what was written, then ends the body early

    # --- logprobs of one sequence -------------------------------------------------------------

    def _output_dicts(self, job: _Job, start: int, end: int, num: int) -> list[dict[int, float]]:
        ids = job.output.token_ids
        key = f"out:{job.key}"
        return [
            self.synthetic.position(key, i, ids[i], (*ids[i + 1 : i + 3], *ids[max(0, i - 1) : i])).vllm_dict(num)
            for i in range(start, end)
        ]

    def _prompt_positions(self, job: _Job) -> list[Position | None]:
        ids = job.gen.prompt_ids
        # The first prompt token has no context, hence no distribution (vLLM: None).
        key = f"prompt:{job.key}"
        return [None, *(self.synthetic.position(key, j, ids[j], ids[j + 1 : j + 3]) for j in range(1, len(ids)))]

    def _prompt_dicts(self, job: _Job, num: int) -> list[dict[int, float] | None]:
        return [None if p is None else p.vllm_dict(num) for p in self._prompt_positions(job)]

    def _raw_prompt_logprobs(self, job: _Job) -> list[Any] | None:
        if job.gen.prompt_logprobs is None:
            return None
        return wire.raw_prompt_logprobs(self._prompt_positions(job), job.gen.prompt_logprobs, self.strings)

    # --- request admission ------------------------------------------------------------------

    def _admit(self, gen: GenRequest, plan: FaultPlan, prefix: str) -> _Job:
        cfg = self.settings
        eos = self.chat_eos if gen.endpoint == "chat" else self.completion_eos
        reply = cfg.replies.get(gen.reply_key, cfg.default_reply) if gen.reply_key is not None else cfg.default_reply
        output = plan_output(
            self._encode(reply), gen.max_tokens, eos, ignore_eos=gen.ignore_eos, filler=self._encode(cfg.default_reply)
        )
        digest = hashlib.blake2b(
            f"{gen.endpoint}:{','.join(map(str, gen.prompt_ids))}".encode(), digest_size=8
        ).hexdigest()
        tokens_per_step = plan.tokens_per_step or gen.stream_interval or cfg.tokens_per_step
        steps = split_steps(len(output.token_ids), tokens_per_step, f"{cfg.seed}|steps|{digest}")
        env = wire.Envelope(wire.new_request_id(prefix), int(time.time()), self.model)
        return _Job(gen, plan, env, digest, output, steps)

    async def _parse(self, request: web.Request, endpoint: str) -> tuple[FaultPlan, GenRequest]:
        try:
            body = orjson.loads(await request.read() or b"null")
        except orjson.JSONDecodeError as exc:
            raise RequestError(f"JSON decode error: {exc}") from None
        self.stats.record(request.path, request.headers, body)
        if not isinstance(body, dict):
            raise RequestError("request body must be a JSON object")
        try:
            plan = read_fault_plan(request.headers, body, self.settings.step_delay_ms)
        except HookError as exc:
            raise RequestError(str(exc), param=exc.hook) from None
        if endpoint == "chat":
            return plan, parse_chat(body, self.limits, self.renderer)
        return plan, parse_completions(body, self.limits, self._encode, self._decode)

    async def _serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        self.stats.start()
        outcome = "cancelled"  # unless something below says otherwise
        response: web.StreamResponse | None = None
        try:
            try:
                plan, gen = await self._parse(request, endpoint)
            except RequestError as exc:
                outcome = "rejected"
                return self._error(exc)
            early = await self._early_fault(request, plan, gen.stream)
            if early is not None:
                outcome = "faulted"
                return early
            job = self._admit(gen, plan, "chatcmpl" if endpoint == "chat" else "cmpl")
            if not gen.stream:
                response = await self._respond(request, job)
            else:
                response = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
                await response.prepare(request)
                if plan.fault == "hang_before_first_token":
                    await self._pause(request, None)
                writer = _SSEWriter(response, plan)
                await self._stream(request, job, writer)
            outcome = "finished"
            return response
        except _Dropped:
            outcome = "faulted"
            self._drop(request)
            return response if response is not None else web.Response()
        except _Aborted:
            outcome = "faulted"
            return response if response is not None else web.Response()
        except ConnectionResetError:
            # The client is gone; returning lets aiohttp finish quietly on the dead transport.
            return response if response is not None else web.Response()
        except Exception:
            outcome = "errored"  # a simulator bug: let aiohttp log it and answer 500
            raise
        finally:
            self.stats.end(outcome)

    async def _early_fault(self, request: web.Request, plan: FaultPlan, stream: bool) -> web.StreamResponse | None:
        """Faults that strike before any response bytes; None to go on normally."""
        fault = plan.fault
        if fault == "refuse" or (fault == "die_mid_stream" and not stream):
            raise _Dropped
        if fault is not None and (fault.startswith("http") or (fault == "error_mid_stream" and not stream)):
            status = plan.http_status  # 500 unless httpNNN said otherwise
            try:
                kind = HTTPStatus(status).phrase.replace(" ", "")  # 503 -> ServiceUnavailableError
            except ValueError:  # a status without a name
                kind = "InternalServer" if status >= 500 else "BadRequest"
            kind = kind if kind.endswith("Error") else kind + "Error"
            message = f"simulated failure (x-sim-fault: {fault})"
            return self._json(wire.error_body(message, kind, status), status)
        if fault == "hang" or (fault == "hang_before_first_token" and not stream):
            await self._pause(request, None)
        return None

    # --- generation ---------------------------------------------------------------------------

    async def _engine_steps(self, request: web.Request, job: _Job) -> AsyncIterator[tuple[int, int, int, str]]:
        """(step number, start, end, text delta) per engine step, each after the step's delay."""
        detok = IncrementalDetokenizer(self.vocab)
        for n, (start, end) in enumerate(job.steps):
            await self._pause(request, job.plan.delay_ms / 1000.0)
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
        return self._json(body)

    def _chat_logprobs(self, job: _Job, start: int, end: int) -> JSON | None:
        k = job.gen.logprobs
        if k is None:
            return None
        dicts = self._output_dicts(job, start, end, k)
        return wire.chat_logprobs(job.output.token_ids[start:end], dicts, k, self.strings, job.gen.as_ids)

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
        if gen.echo and first:
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
        return text, wire.completion_logprobs(ids, dicts, k, self.strings, gen.as_ids, text_offset)

    async def _stream(self, request: web.Request, job: _Job, writer: _SSEWriter) -> None:
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

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, "completions")

    async def models(self, request: web.Request) -> web.Response:
        return self._json(wire.model_list(self.model, self.limits.max_model_len))

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return self._json({"version": "0.0.0+simulator"})

    async def sim_stats(self, request: web.Request) -> web.Response:
        return self._json(self.stats.snapshot())

    async def sim_requests(self, request: web.Request) -> web.Response:
        return self._json(list(self.stats.recent))

    async def sim_reset(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return self._json(self.stats.snapshot())


class _SSEWriter:
    """Writes `data: {json}` frames, and stops early when a mid-stream fault says so."""

    def __init__(self, response: web.StreamResponse, plan: FaultPlan) -> None:
        self._response = response
        self._fault = plan.fault if plan.fault in ("die_mid_stream", "error_mid_stream") else None
        self._stop_after = plan.die_after
        self._sent = 0

    async def send(self, chunk: Mapping[str, Any]) -> None:
        await self._response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        self._sent += 1
        if self._fault is None or self._sent < self._stop_after:
            return
        if self._fault == "die_mid_stream":
            raise _Dropped
        # What vLLM's stream generators do when the engine fails: an error frame, then [DONE].
        error = wire.error_body("simulated engine failure (x-sim-fault: error_mid_stream)", "InternalServerError", 500)
        await self._response.write(b"data: " + orjson.dumps(error) + b"\n\n")
        await self.done()
        raise _Aborted

    async def done(self) -> None:
        await self._response.write(b"data: [DONE]\n\n")
        await self._response.write_eof()


SIMULATOR_KEY = web.AppKey("vllm_simulator", VLLMSimulator)


def create_app(
    vocab: Vocab,
    model: str,
    *,
    replies: Mapping[str, str] | None = None,
    default_reply: str = DEFAULT_REPLY,
    max_logprobs: int = 20,
    seed: int = 0,
    max_model_len: int = 4096,
    tokens_per_step: TokensPerStep = 1,
    step_delay_ms: float = 0.0,
    return_tokens_as_token_ids: bool = False,
) -> web.Application:
    """An aiohttp app that answers like `vllm serve <model>` (see the module docstring).

    replies: exact last-user-message (chat) / prompt (completions) -> reply text.
    max_logprobs: vLLM's --max-logprobs (-1 = no cap). max_model_len: context length.
    tokens_per_step: tokens per streamed engine step after the first (an int, or "vary" for
    1-3 like speculative decoding); requests may override it with `stream_interval`.
    step_delay_ms: wait before each engine step. return_tokens_as_token_ids: the server flag.
    The simulator object (stats, settings) is at `app[SIMULATOR_KEY]`.
    """
    settings = SimSettings(
        replies=dict(replies or {}),
        default_reply=default_reply,
        max_logprobs=max_logprobs,
        seed=seed,
        max_model_len=max_model_len,
        tokens_per_step=tokens_per_step,
        step_delay_ms=step_delay_ms,
        return_tokens_as_token_ids=return_tokens_as_token_ids,
    )
    sim = VLLMSimulator(vocab, model, settings)
    app = web.Application()
    app[SIMULATOR_KEY] = sim
    app.router.add_post("/v1/chat/completions", sim.chat_completions)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/version", sim.version)
    app.router.add_get("/sim/stats", sim.sim_stats)
    app.router.add_get("/sim/requests", sim.sim_requests)
    app.router.add_post("/sim/reset", sim.sim_reset)
    return app


# --- command line -----------------------------------------------------------------------------


def _tokens_per_step(value: str) -> TokensPerStep:
    if value == "vary":
        return "vary"
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1 or 'vary'")
    return number


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m gateway.simulator.vllm",
        description="vLLM wire-format simulator: scripted text, synthetic logprobs, no model.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokenizer-json", type=Path, help="HF tokenizer.json of the model to mimic")
    source.add_argument(
        "--tokenizer-dir", type=Path, help="model folder: tokenizer.json, or vocab.json + merges.txt (Qwen2 style)"
    )
    source.add_argument("--demo-tokenizer", action="store_true", help="the project's small demo BPE")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-logprobs", type=int, default=20)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--tokens-per-step", type=_tokens_per_step, default=1, help="int >= 1, or 'vary'")
    parser.add_argument("--step-delay-ms", type=float, default=0.0)
    parser.add_argument("--default-reply", default=DEFAULT_REPLY)
    parser.add_argument("--replies", type=Path, help="JSON object: user message / prompt -> reply")
    parser.add_argument("--return-tokens-as-token-ids", action="store_true")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.demo_tokenizer:
        from gateway.logprobs.demo_vocab import build_demo_vocab

        vocab: Vocab = build_demo_vocab()
    elif args.tokenizer_dir is not None:
        vocab = load_directory(args.tokenizer_dir)
    else:
        vocab = load_tokenizer_json(args.tokenizer_json)
    replies = json.loads(args.replies.read_text(encoding="utf-8")) if args.replies else None
    app = create_app(
        vocab,
        args.model,
        replies=replies,
        default_reply=args.default_reply,
        max_logprobs=args.max_logprobs,
        seed=args.seed,
        max_model_len=args.max_model_len,
        tokens_per_step=args.tokens_per_step,
        step_delay_ms=args.step_delay_ms,
        return_tokens_as_token_ids=args.return_tokens_as_token_ids,
    )
    print(
        f"vLLM simulator (no model: scripted text, synthetic logprobs) serving {args.model!r} "
        f"with vocabulary {vocab.name!r} on http://{args.host}:{args.port}",
        flush=True,
    )
    # handler_cancellation: like vLLM, stop generating when the client disconnects.
    web.run_app(app, host=args.host, port=args.port, handler_cancellation=True, print=None)


if __name__ == "__main__":
    main()
