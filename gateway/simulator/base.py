"""The shell every simulator shares: request accounting, fault injection, engine steps, SSE writing, the CLI.

A dialect module (vllm.py, tgi.py, sglang.py, llamacpp.py, openai.py) supplies only what differs between
servers: how a request is read and validated, what the bodies and chunks look like, how errors are spelled,
and a `Dialect` that declares its settings, routes and command-line flags. Everything a test harness relies
on is the same everywhere: `x-sim-fault` hooks (faults.py), GET /sim/stats, GET /sim/requests,
POST /sim/reset, a `create_app(vocab, model, ...)` factory and `python -m gateway.simulator.<name>`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, TypedDict, TypeVar

import orjson
from aiohttp import web

from gateway.logprobs.vocab import Vocab, load_directory, load_tokenizer_json
from gateway.simulator.detok import decode_ids
from gateway.simulator.faults import FaultPlan, HookError, SimStats, read_fault_plan
from gateway.simulator.prompt import END_OF_TEXT, IM_END, IM_START, ChatMLRenderer, find_special_id, last_user_text
from gateway.simulator.script import DEFAULT_REPLY, Output, TokensPerStep, plan_output, split_steps
from gateway.simulator.synthetic import SyntheticLogprobs

SSE_CONTENT_TYPE = "text/event-stream; charset=utf-8"
DONE_FRAME = b"data: [DONE]\n\n"
_POLL_S = 0.02  # how often a waiting handler checks that its client is still connected

JSON = dict[str, Any]


class Dropped(Exception):
    """The simulator drops the connection on purpose (fault injection)."""


class Aborted(Exception):
    """The simulator ended a stream with the server's in-band error frame (fault injection)."""


class BadBody(Exception):
    """The body is not JSON (`kind` "json"), not an object ("object"), or a hook is malformed ("hook")."""

    def __init__(self, kind: str, detail: str, hook: str | None = None) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
        self.hook = hook


class Refusal(Exception):
    """A request the simulated server refuses: the `message` it writes and the HTTP `status`.

    Each dialect subclasses it with what its error body adds, and writes the body in its own shape.
    """

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


class OpenAIError(Refusal):
    """A refusal in OpenAI's error shape, `{"error": {"message", "type", "param", "code"}}`.

    OpenAI writes a rule name (or null) as `code`; vLLM copies the shape with the HTTP status there.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        param: str | None = None,
        code: str | int | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message, status)
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> JSON:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return SimulatorBase.json_response(self.body(), self.status)


class Rejected(Exception):
    """The simulated server refuses the request; `response` is the finished error answer."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("rejected")
        self.response = response


@dataclass(frozen=True, slots=True)
class CommonSettings:
    """Settings every simulator has; see each `create_app` for what they mean."""

    replies: Mapping[str, str] = field(default_factory=dict)
    default_reply: str = DEFAULT_REPLY
    seed: int = 0
    tokens_per_step: TokensPerStep = 1
    step_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        tps = self.tokens_per_step
        if tps != "vary" and (isinstance(tps, bool) or not isinstance(tps, int) or tps < 1):
            raise ValueError(f"tokens_per_step must be an int >= 1 or 'vary', got {tps!r}")


@dataclass(slots=True)
class Admitted:
    """An accepted request: how to answer it whole (`respond`) or as a stream (`produce`)."""

    plan: FaultPlan
    stream: bool
    respond: Callable[[], Awaitable[web.StreamResponse]] | None = None
    produce: Callable[[SSEWriter], Awaitable[None]] | None = None
    # The in-band frame a stream ends with on `error_mid_stream`, and the closing frame (None: none).
    error_frame: bytes = b""
    done_frame: bytes | None = DONE_FRAME
    done_after_error: bool = True  # whether `done_frame` still follows an in-band error


class SSEWriter:
    """Writes SSE frames, and stops early when a mid-stream fault says so."""

    def __init__(self, response: web.StreamResponse, admitted: Admitted) -> None:
        self._response = response
        fault = admitted.plan.fault
        self._fault = fault if fault in ("die_mid_stream", "error_mid_stream") else None
        self._stop_after = admitted.plan.die_after
        self._error_frame = admitted.error_frame
        self._done_frame = admitted.done_frame
        self._done_after_error = admitted.done_after_error
        self._sent = 0

    async def send(self, payload: Mapping[str, Any]) -> None:
        """One `data: {json}` frame."""
        await self.frame(b"data: " + orjson.dumps(payload) + b"\n\n")

    async def frame(self, frame: bytes) -> None:
        await self._response.write(frame)
        self._sent += 1
        if self._fault is None or self._sent < self._stop_after:
            return
        if self._fault == "die_mid_stream":
            raise Dropped
        await self._response.write(self._error_frame)
        await self.done(closing=self._done_after_error)
        raise Aborted

    async def done(self, *, closing: bool = True) -> None:
        if closing and self._done_frame is not None:
            await self._response.write(self._done_frame)
        await self._response.write_eof()


class SimulatorBase:
    """Plumbing and state shared by the simulated servers of every dialect (one served model)."""

    def __init__(self, vocab: Vocab, model: str, settings: CommonSettings) -> None:
        self.vocab = vocab
        self.model = model
        self.settings = settings
        self.stats = SimStats()
        self.renderer = ChatMLRenderer(vocab)
        im_end, eot = find_special_id(vocab, IM_END), find_special_id(vocab, END_OF_TEXT)
        # Chat ends on <|im_end|>, raw completion on <|endoftext|>, as Qwen2 models do.
        self.chat_eos = im_end if im_end is not None else eot
        self.completion_eos = eot if eot is not None else im_end
        specials = [i for i in (im_end, eot, find_special_id(vocab, IM_START)) if i is not None]
        self.synthetic = SyntheticLogprobs(vocab, seed=settings.seed, special_ids=specials)
        self._encoded: dict[str, list[int]] = {}

    # --- dialect hooks ----------------------------------------------------------------------

    async def admit(self, request: web.Request, endpoint: str) -> Admitted:
        """Read and validate a request to one of the dialect's generation endpoints (the `endpoint` its
        `Route` names: "chat", "completions", "generate", ...); raise Rejected with the server's answer."""
        raise NotImplementedError

    def fault_response(self, status: int, message: str) -> web.Response:
        """The server's error answer for an injected `httpNNN` fault."""
        raise NotImplementedError

    # --- helpers ------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = self._encoded[text] = self.vocab.encode(text)
        return ids

    def reply_text(self, key: str | None) -> str:
        cfg = self.settings
        return cfg.replies.get(key, cfg.default_reply) if key is not None else cfg.default_reply

    def reply_ids(self, key: str | None) -> list[int]:
        """The reply's token ids: its text encoded, or ids given as they are (`{"token_ids": [...]}`),
        for what no text encodes to: a character a model started and never finished, say."""
        reply = self.settings.replies.get(key) if key is not None else None
        if isinstance(reply, Mapping) and "token_ids" in reply:
            return [int(i) for i in reply["token_ids"]]
        return self.encode(self.reply_text(key))

    def generate(self, reply_key: str | None, max_tokens: int, eos: int | None, *, ignore_eos: bool = False) -> Output:
        """The token ids the simulated model emits for this request."""
        return plan_output(
            self.reply_ids(reply_key),
            max_tokens,
            eos,
            ignore_eos=ignore_eos,
            filler=self.encode(self.settings.default_reply),
        )

    @staticmethod
    def digest(kind: str, ids: Sequence[int]) -> str:
        """A key for the synthetic logprobs of one prompt: the same prompt, the same numbers."""
        return hashlib.blake2b(f"{kind}:{','.join(map(str, ids))}".encode(), digest_size=8).hexdigest()

    def steps(self, count: int, plan: FaultPlan, key: str, requested: int | None = None) -> list[tuple[int, int]]:
        tokens_per_step = plan.tokens_per_step or requested or self.settings.tokens_per_step
        return split_steps(count, tokens_per_step, f"{self.settings.seed}|steps|{key}")

    @staticmethod
    def json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
        return web.Response(body=orjson.dumps(body), status=status, content_type="application/json", headers=headers)

    async def read_json(self, request: web.Request) -> Any:
        """The request body as JSON (kept for /sim/requests); orjson.JSONDecodeError if it is not JSON."""
        raw = await request.read()
        try:
            body = orjson.loads(raw or b"null")
        except orjson.JSONDecodeError:
            self.stats.record(request.path, request.headers, raw.decode("utf-8", errors="replace"))
            raise
        self.stats.record(request.path, request.headers, body)
        return body

    def fault_plan(self, request: web.Request, body: Mapping[str, Any]) -> FaultPlan:
        """The request's fault hooks (faults.HookError when malformed)."""
        return read_fault_plan(request.headers, body, self.settings.step_delay_ms)

    async def read_request(self, request: web.Request) -> tuple[JSON, FaultPlan]:
        """The JSON object body and its fault plan; BadBody says what is wrong, for the dialect to spell."""
        try:
            body = await self.read_json(request)
        except orjson.JSONDecodeError as exc:
            raise BadBody("json", str(exc)) from None
        if not isinstance(body, dict):
            raise BadBody("object", "request body must be a JSON object")
        try:
            return body, self.fault_plan(request, body)
        except HookError as exc:
            raise BadBody("hook", str(exc), exc.hook) from None

    def prompt_input(self, prompt: Any) -> tuple[list[int], str] | None:
        """(ids, text) of a completions-style prompt: one string or one list of ids (a batch of one
        unwrapped); None for anything else."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.encode(prompt), prompt
        if isinstance(prompt, list) and prompt and all(is_int(t) for t in prompt):
            return list(prompt), decode_ids(self.vocab, prompt, skip_special=False)
        return None

    def chat_input(self, messages: Any) -> tuple[list[int], str | None]:
        """(prompt ids, reply key) of chat messages; ValueError when they are not a list of objects."""
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("`messages` must be a list of message objects")
        return self.renderer.prompt_ids(messages), last_user_text(messages)

    @staticmethod
    def _gone(request: web.Request) -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    async def pause(self, request: web.Request, seconds: float | None) -> None:
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

    async def ticks(
        self, request: web.Request, plan: FaultPlan, steps: Sequence[tuple[int, int]]
    ) -> AsyncIterator[tuple[int, int, int]]:
        """(step number, start, end) per engine step, each after the step's delay."""
        for n, (start, end) in enumerate(steps):
            await self.pause(request, plan.delay_ms / 1000.0)
            yield n, start, end

    # --- the request life cycle ----------------------------------------------------------------

    async def serve(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        """Run one request: admission, injected faults, the answer, and its outcome in /sim/stats."""
        self.stats.start()
        outcome = "cancelled"  # unless something below says otherwise
        response: web.StreamResponse | None = None
        try:
            try:
                admitted = await self.admit(request, endpoint)
            except Rejected as exc:
                outcome = "rejected"
                return exc.response
            early = await self._early_fault(request, admitted)
            if early is not None:
                outcome = "faulted"
                return early
            if not admitted.stream:
                assert admitted.respond is not None
                response = await admitted.respond()
            else:
                assert admitted.produce is not None
                response = web.StreamResponse(headers={"Content-Type": SSE_CONTENT_TYPE})
                await response.prepare(request)
                if admitted.plan.fault == "hang_before_first_token":
                    await self.pause(request, None)
                await admitted.produce(SSEWriter(response, admitted))
            outcome = "finished"
            return response
        except Dropped:
            outcome = "faulted"
            if request.transport is not None:
                request.transport.close()  # flushes what was written, then ends the body early
            return response if response is not None else web.Response()
        except Aborted:
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

    async def _early_fault(self, request: web.Request, admitted: Admitted) -> web.StreamResponse | None:
        """Faults that strike before any response bytes; None to go on normally."""
        plan, stream = admitted.plan, admitted.stream
        fault = plan.fault
        if fault == "refuse" or (fault == "die_mid_stream" and not stream):
            raise Dropped
        if fault is not None and (fault.startswith("http") or (fault == "error_mid_stream" and not stream)):
            return self.fault_response(plan.http_status, f"simulated failure (x-sim-fault: {fault})")
        if fault == "hang" or (fault == "hang_before_first_token" and not stream):
            await self.pause(request, None)
        return None

    # --- simulator-only routes -------------------------------------------------------------------

    async def sim_stats(self, request: web.Request) -> web.Response:
        return self.json_response(self.stats.snapshot())

    async def sim_requests(self, request: web.Request) -> web.Response:
        return self.json_response(list(self.stats.recent))

    async def sim_reset(self, request: web.Request) -> web.Response:
        self.stats.reset()
        return self.json_response(self.stats.snapshot())

    def add_sim_routes(self, app: web.Application) -> None:
        app.router.add_get("/sim/stats", self.sim_stats)
        app.router.add_get("/sim/requests", self.sim_requests)
        app.router.add_post("/sim/reset", self.sim_reset)

    def handler(self, route: Route) -> Handler:
        """The aiohttp handler of one of the dialect's routes."""
        if route.handler is not None:
            return getattr(self, route.handler)
        endpoint = route.endpoint
        assert endpoint is not None

        async def generation(request: web.Request) -> web.StreamResponse:
            return await self.serve(request, endpoint)

        return generation


# --- request fields -------------------------------------------------------------------------------


def flag(body: Mapping[str, Any], name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    return default if value is None else bool(value)


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# --- a dialect, declared once -----------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Sim = TypeVar("Sim", bound=SimulatorBase)


class CommonOptions(TypedDict, total=False):
    """The `create_app` keyword options every simulator takes (the CommonSettings; `replies` None = {})."""

    replies: Mapping[str, str] | None
    default_reply: str
    seed: int
    tokens_per_step: TokensPerStep
    step_delay_ms: float


@dataclass(frozen=True, slots=True)
class Route:
    """One HTTP route of a simulated server.

    A generation route names the `endpoint` its requests are admitted as (`SimulatorBase.admit`, run
    by `serve`); any other route names the simulator method that answers it (`handler`).
    """

    method: str
    path: str
    endpoint: str | None = None
    handler: str | None = None

    def __post_init__(self) -> None:
        if (self.endpoint is None) == (self.handler is None):
            raise ValueError(f"route {self.method} {self.path}: give an endpoint or a handler")


@dataclass(frozen=True, slots=True)
class Flag:
    """A dialect's own command-line option and the `create_app` option (settings field) it sets.

    Its type and default are the settings field's: an int takes a value; a bool is a switch that
    flips the field's default (`--return-tokens-as-token-ids` on, `--fixed-stream-top-logprobs` off).
    """

    name: str  # "--ctx-size"
    option: str  # "n_ctx"
    help: str | None = None

    def add_to(self, parser: argparse.ArgumentParser, default: Any) -> None:
        if isinstance(default, bool):
            parser.add_argument(self.name, action="store_true", help=self.help)
        else:
            parser.add_argument(self.name, type=type(default), default=default, help=self.help)

    def value(self, args: argparse.Namespace, default: Any) -> Any:
        given = getattr(args, self.name.removeprefix("--").replace("-", "_"))
        if isinstance(default, bool):
            return not default if given else default
        return given


@dataclass(frozen=True)
class Dialect(Generic[Sim]):
    """What makes one simulator module: its simulator and settings classes, its routes and its flags.

    `app` is the module's `create_app`, `main` its `python -m gateway.simulator.<module>`, and `key`
    the module's `SIMULATOR_KEY` (`app[key]` is the simulator: stats, settings).
    """

    module: str  # "tgi": the module under gateway/simulator/, and the app key's name
    title: str  # "TGI": the server's name in the command line's description and banner
    port: int  # the command line's default port (the real server's)
    simulator: type[Sim]
    settings: type[CommonSettings]
    routes: tuple[Route, ...]
    flags: tuple[Flag, ...] = ()
    key: web.AppKey[Sim] = field(init=False)

    def __post_init__(self) -> None:
        # aiohttp prefixes a key's name with the module whose top level is running: the dialect module
        # declaring this, so the key reads `gateway.simulator.<module>.<module>_simulator` as it always has.
        object.__setattr__(self, "key", web.AppKey(f"{self.module}_simulator", self.simulator))

    def app(self, vocab: Vocab, model: str, common: Mapping[str, Any], **options: Any) -> web.Application:
        """The aiohttp app: the simulator of `model` with the shared options `common` and the dialect's
        `options` as its settings, the dialect's routes and the /sim/* routes."""
        for name in common:
            if name not in CommonOptions.__optional_keys__:
                raise TypeError(f"create_app() got an unexpected keyword argument {name!r}")
        replies = dict(common.get("replies") or {})
        sim = self.simulator(vocab, model, self.settings(**{**common, "replies": replies}, **options))
        app = web.Application()
        app[self.key] = sim
        for route in self.routes:
            app.router.add_route(route.method, route.path, sim.handler(route))
        sim.add_sim_routes(app)
        return app

    def main(self, argv: Sequence[str] | None = None) -> None:
        """`python -m gateway.simulator.<module>`: the shared options plus the dialect's flags, then serve."""
        description = f"{self.title} wire-format simulator: scripted text, synthetic logprobs, no model."
        parser = argument_parser(f"python -m gateway.simulator.{self.module}", description, self.port)
        defaults = {setting.name: setting.default for setting in fields(self.settings)}
        for option in self.flags:
            option.add_to(parser, defaults[option.option])
        args = parser.parse_args(argv)
        vocab = cli_vocab(args)
        options = {option.option: option.value(args, defaults[option.option]) for option in self.flags}
        app = self.app(vocab, args.model, cli_common(args), **options)
        print(
            f"{self.title} simulator (no model: scripted text, synthetic logprobs) serving {args.model!r} "
            f"with vocabulary {vocab.name!r} on http://{args.host}:{args.port}",
            flush=True,
        )
        # handler_cancellation: like the real servers, stop generating when the client disconnects.
        web.run_app(app, host=args.host, port=args.port, handler_cancellation=True, print=None)


# --- command line -----------------------------------------------------------------------------------


def _tokens_per_step(value: str) -> TokensPerStep:
    if value == "vary":
        return "vary"
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be >= 1 or 'vary'")
    return number


def argument_parser(prog: str, description: str, default_port: int) -> argparse.ArgumentParser:
    """The options every simulator takes: tokenizer, model name, address, timing, replies."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tokenizer-json", type=Path, help="HF tokenizer.json of the model to mimic")
    source.add_argument(
        "--tokenizer-dir", type=Path, help="model folder: tokenizer.json, or vocab.json + merges.txt (Qwen2 style)"
    )
    source.add_argument("--demo-tokenizer", action="store_true", help="the project's small demo BPE")
    parser.add_argument("--model", required=True, help="served model name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokens-per-step", type=_tokens_per_step, default=1, help="int >= 1, or 'vary'")
    parser.add_argument("--step-delay-ms", type=float, default=0.0)
    parser.add_argument("--default-reply", default=DEFAULT_REPLY)
    parser.add_argument("--replies", type=Path, help="JSON object: user message / prompt -> reply")
    return parser


def cli_vocab(args: argparse.Namespace) -> Vocab:
    if args.demo_tokenizer:
        from gateway.logprobs.demo_vocab import build_demo_vocab

        return build_demo_vocab()
    if args.tokenizer_dir is not None:
        return load_directory(args.tokenizer_dir)
    return load_tokenizer_json(args.tokenizer_json)


def cli_common(args: argparse.Namespace) -> CommonOptions:
    """`create_app` keyword arguments from the shared options."""
    replies = json.loads(args.replies.read_text(encoding="utf-8")) if args.replies else None
    return {
        "replies": replies,
        "default_reply": args.default_reply,
        "seed": args.seed,
        "tokens_per_step": args.tokens_per_step,
        "step_delay_ms": args.step_delay_ms,
    }
