"""`responses-gateway serve | demo | check-config | inspect`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web

from gateway.config import Config, ConfigError, load_config, parse_config
from gateway.memory import check_environment, idle_trim_seconds, install_idle_trim, release_free_memory

if TYPE_CHECKING:
    from gateway.logprobs.vocab import Vocab
    from schemas.responses import Response


class DemoError(RuntimeError):
    """The demo's own request failed: printed as one line."""


def print_tokenizer_loaded(model: str, vocab: Vocab, seconds: float) -> None:
    """The start-up progress line of one model's tokenizer (a large one takes seconds)."""
    print(f"tokenizer of {model}: {vocab.name} ({len(vocab):,} tokens) loaded in {seconds:.2f} s", flush=True)


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import STATE, create_app
    from gateway.routing import build_routes

    try:
        idle_trim = idle_trim_seconds(os.environ)
        check_environment(os.environ)  # read again by the app at start-up; refused here, before loading
    except ValueError as exc:
        print(f"environment error: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
        from gateway.workers import resolve_workers

        workers = resolve_workers(config, args.workers)
        metrics_dir = None
        if workers > 1:
            from gateway.metrics import enable_multiprocess
            from gateway.workers import multiprocess_metrics_dir

            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # no tokenizer threads across the fork
            metrics_dir = multiprocess_metrics_dir()
            enable_multiprocess(metrics_dir)
        app = create_app(config, build_routes(config, on_tokenizer=print_tokenizer_loaded))
        # Start-up objects (tokenizer tables, templates) live forever: keep the collector off them.
        gc.freeze()
        # And hand back the memory that loading them freed (~36 MB with the Qwen2 tokenizer).
        release_free_memory()
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    # The same after each burst of requests, once none is in flight (~45 MB after 256 streams).
    state = app[STATE]
    install_idle_trim(app, lambda: state.in_flight > 0, idle_trim)
    from gateway.reload import Reloader
    from gateway.server import ListenError, configure_logging, raise_open_file_limit, serve

    configure_logging(config.logging.level)
    raised = raise_open_file_limit()  # before the fork: workers inherit it
    if raised is not None:
        logging.getLogger("responses_gateway").info(json.dumps({"event": "open_file_limit_raised",
                                                                 "from": raised[0], "to": raised[1]}))
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    run = asyncio.run
    try:  # uvloop when installed: a faster event loop, same asyncio semantics
        import uvloop
    except ImportError:
        pass
    else:
        run = getattr(uvloop, "run", run)  # uvloop.run needs uvloop >= 0.18
    reloader = Reloader(app, args.config, on_tokenizer=print_tokenizer_loaded)
    if workers > 1:
        return _supervise(app, reloader, host, port, workers, metrics_dir, run)
    try:
        run(serve(app, host, port, reloader))
    except ListenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _supervise(app: web.Application, reloader: Any, host: str, port: int, workers: int, metrics_dir: str | None,
               run: Callable[[Any], Any]) -> int:
    """`serve --workers N`: bind the port, fork the workers (gateway.workers), watch them until SIGTERM."""
    import shutil
    import socket

    from gateway.app import STATE
    from gateway.server import ListenError, serve
    from gateway.workers import Supervisor, listening_sockets

    try:
        sockets = listening_sockets(host, port, workers)
    except ListenError as exc:
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    config = app[STATE].config
    bound = sockets[0].getsockname()[1]
    print(f"responses-gateway on http://{host}:{bound} ({len(config.models)} models, {workers} workers)", flush=True)

    def worker(index: int, sock: socket.socket, reload_first: bool, ready: Callable[[], None]) -> int:
        run(serve(app, host, bound, reloader, sock=sock, reload_first=reload_first, on_listening=ready))
        return 0

    return Supervisor(workers, sockets, config.shutdown.grace_seconds, worker, metrics_dir).run()


DEMO_REQUEST = {
    "input": "hi",
    "max_output_tokens": 12,
    "include": ["message.output_text.logprobs"],
    "top_logprobs": 3,
    "ignore_eos": True,
}


async def _start(app: web.Application, port: int = 0) -> tuple[web.AppRunner, int]:
    from gateway.server import listen

    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    return runner, await listen(runner, "127.0.0.1", port)


def demo_config(upstream_port: int, model: str, tokenizer: dict[str, str], api: str, *,
                playground: bool = False) -> Config:
    return parse_config({
        "upstreams": {"simulator": {"urls": [f"http://127.0.0.1:{upstream_port}"], "api": api}},
        "models": {model: {"upstream": "simulator", "tokenizer": tokenizer}},
        "store": {"backend": "memory"},  # the demo leaves no file behind
        "playground": playground,
    }, Path.cwd())


async def _demo(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.logprobs.demo_vocab import build_demo_vocab
    from gateway.logprobs.vocab import load_bpe_files
    from gateway.simulator.vllm import create_app as create_simulator

    try:
        check_environment(os.environ)  # read by the app at start-up; refused here, as `serve` does
    except ValueError as exc:
        print(f"environment error: {exc}", file=sys.stderr)
        return 2
    if args.qwen2_dir:
        vocab = load_bpe_files(args.qwen2_dir / "vocab.json", args.qwen2_dir / "merges.txt")
        model = "Qwen/Qwen2-0.5B"
        tokenizer = {"vocab": str(args.qwen2_dir / "vocab.json"), "merges": str(args.qwen2_dir / "merges.txt")}
    else:
        vocab = build_demo_vocab()
        model = "demo-model"
        tokenizer = {"builtin": "demo"}
    # With --keep-running a person watches the playground: let the tokens arrive at a visible pace.
    sim_runner, sim_port = await _start(create_simulator(vocab, model, step_delay_ms=40 if args.keep_running else 0))
    try:
        gw_app = create_app(demo_config(sim_port, model, tokenizer, args.api, playground=True))
        gw_runner, gw_port = await _start(gw_app, args.port)
    except BaseException:
        await sim_runner.cleanup()
        raise
    try:
        print(f"vLLM-dialect simulator (no model: scripted text, synthetic logprobs) on :{sim_port}, "
              f"{args.api} API, tokenizer {vocab.name!r}")
        print(f"gateway on http://127.0.0.1:{gw_port}/v1/responses")
        hint = "" if args.keep_running else "   (with --keep-running, to open it)"
        print(f"playground on http://127.0.0.1:{gw_port}/playground{hint}\n")
        response = await _demo_request(gw_port, model)
        _print_table(response)
        if args.keep_running:
            print(f"\nserving until Ctrl-C; open http://127.0.0.1:{gw_port}/playground", flush=True)
            await asyncio.Event().wait()
    finally:
        await gw_runner.cleanup()
        await sim_runner.cleanup()
    return 0


async def _demo_request(port: int, model: str) -> Response:
    """POST the demo request with what `pip install -e .` installs (aiohttp) and read the answer with
    the gateway's strict Responses schema, which rejects a missing or an unknown field. (The tests
    hold the same answer to the OpenAI SDK's strict validation.)"""
    from schemas.responses import Response

    url = f"http://127.0.0.1:{port}/v1/responses"
    async with aiohttp.ClientSession() as session, session.post(url, json={"model": model, **DEMO_REQUEST}) as reply:
        body = await reply.read()
    if reply.status != 200:
        raise DemoError(f"the gateway answered HTTP {reply.status}: {body.decode(errors='replace')}")
    return Response.model_validate_json(body)


def _print_table(response: Response) -> None:
    part = response.output[0].content[0]  # type: ignore[union-attr]
    print(f"text: {part.text!r}   status: {response.status}")
    print(f"{'token':<18} {'bytes':<22} {'prob':>7}   alternatives")
    for entry in part.logprobs:
        alternatives = ", ".join(f"{alt.token!r} {math.exp(alt.logprob):.1%}" for alt in entry.top_logprobs)
        raw = " ".join(f"{b:02x}" for b in entry.bytes)
        print(f"{entry.token!r:<18} {raw:<22} {math.exp(entry.logprob):>7.1%}   {alternatives}")
    joined = b"".join(bytes(e.bytes) for e in part.logprobs)
    print(f"\nbytes of the tokens == UTF-8 of the text: {joined == part.text.encode()}")


def _check_config(args: argparse.Namespace) -> int:
    from gateway.check_config import print_table, run_checks

    rows, ok = run_checks(args.config, timeout=args.timeout, probe=args.probe)
    print_table(rows)
    return 0 if ok else 1


def _inspect(args: argparse.Namespace) -> int:
    from gateway import inspect_view as view

    body = view.request_body(args.model, args.prompt, top_logprobs=args.top_logprobs,
                             max_output_tokens=args.max_output_tokens, instructions=args.instructions,
                             temperature=args.temperature)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))

    def show(text: str) -> None:
        print(text, end="", flush=True)

    try:
        inspection = asyncio.run(view.inspect(args.base_url, body, api_key=args.api_key,
                                              on_text=None if args.json else show, color=color))
        if args.json:
            print(json.dumps(view.to_json(inspection), ensure_ascii=False, indent=2))
        else:
            print("\n\n" + view.render_report(inspection, color=color))
    except view.GatewayRequestError as exc:
        print(f"inspect: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader went away (`| head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 1 if inspection.status == "failed" else 0


DESCRIPTION = """\
The OpenAI Responses API (and /v1/chat/completions, /v1/completions) in front of chat/completions
inference servers (vLLM, TGI, SGLang, llama.cpp, OpenAI-compatible), with exact per-token logprob bytes.
Start with `responses-gateway demo` (no model, no network); `responses-gateway COMMAND --help` for more."""


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("responses-gateway")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from gateway import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog="responses-gateway", description=DESCRIPTION, formatter_class=formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve", help="run the gateway with a config file",
        description="Run the gateway: load every tokenizer and template of the config (a bad one stops it here, "
                    "naming the key), then listen. SIGTERM and Ctrl-C drain: /readyz turns 503, in-flight "
                    "requests finish within shutdown.grace_seconds. SIGHUP reads the config again: new requests "
                    "take its models and upstreams, in-flight ones finish on the old (listen, store, auth, limits "
                    "and playground change only with a restart); a config that does not load is logged and the "
                    "running one kept.")
    serve.add_argument("--config", required=True, type=Path, metavar="PATH",
                       help="the YAML config (config.example.yaml documents every key)")
    serve.add_argument("--host", help="address to listen on (default: the config's listen.host, else 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default: the config's listen.port, else 8080)")
    serve.add_argument("--workers", metavar="N", help="worker processes accepting on the port: a number, or auto "
                       "(the CPUs this process may use, cgroup limits included); default: the config's workers, "
                       "else 1")

    demo = commands.add_parser(
        "demo", help="offline demo: a simulated vLLM upstream, the gateway, one request printed as a table",
        description="Start a vLLM-dialect simulator (scripted text, synthetic logprobs, no model) and the gateway "
                    "in front of it on 127.0.0.1, send one /v1/responses request and print its tokens: bytes, "
                    "probability, alternatives. Needs no network.")
    demo.add_argument("--api", choices=["chat", "completions"], default="chat",
                      help="which API of the simulator the gateway talks to (default: %(default)s)")
    demo.add_argument("--port", type=int, default=0,
                      help="the gateway's port (default: any free one); the simulator always takes a free one")
    demo.add_argument("--qwen2-dir", type=Path, metavar="DIR",
                      help="a folder with Qwen2's vocab.json + merges.txt: use its real tokenizer instead of the "
                           "demo's small one")
    demo.add_argument("--keep-running", action="store_true",
                      help="keep serving (with the /playground page) until Ctrl-C")

    check = commands.add_parser(
        "check-config", help="validate a config, load its tokenizers and templates, probe its upstreams",
        description="Validate a config file, load every tokenizer and chat template, probe every upstream URL's "
                    "health_path, then serve the config as `serve` would on a loopback port and send each model "
                    "one real 1-token generation with logprobs and top_logprobs at the route's cap: a model the "
                    "server does not serve, a cap above the server's, logprobs or token ids not returned, or a "
                    "tokenizer that does not match the server's ids each fail, naming the model and the key to "
                    "fix. Prints one line per check (ok / FAIL); exits 1 when any check fails, 0 otherwise.")
    check.add_argument("config", type=Path, metavar="PATH", help="the YAML config to check")
    check.add_argument("--timeout", type=float, default=5.0, metavar="SECONDS",
                       help="seconds per upstream probe and per generation (default: %(default)s)")
    check.add_argument("--no-probe", dest="probe", action="store_false",
                       help="skip the generations: only validate, load, and probe each upstream's health_path")

    inspect = commands.add_parser(
        "inspect", help="stream a prompt through a running gateway; show every token's probability, bytes and "
                        "alternatives",
        description="Send PROMPT to a running gateway's /v1/responses (streamed, with logprobs) and show each "
                    "token as it arrives, then a report: probabilities, exact bytes, ranked alternatives.")
    inspect.add_argument("prompt", help="the input text")
    inspect.add_argument("--model", required=True, help="a model name the gateway serves")
    inspect.add_argument("--base-url", default="http://127.0.0.1:8080", help="the gateway (default: %(default)s)")
    inspect.add_argument("--top-logprobs", type=int, default=5, help="alternatives per token (default: %(default)s)")
    inspect.add_argument("--max-output-tokens", type=int, default=64,
                         help="stop after this many tokens (default: %(default)s)")
    inspect.add_argument("--instructions", help="a system message sent with the prompt")
    inspect.add_argument("--temperature", type=float, help="sampling temperature (default: the server's)")
    inspect.add_argument("--api-key", help="sent as a Bearer token, if the gateway asks for one")
    inspect.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                         help="shade tokens by probability (default: %(default)s: on a terminal without NO_COLOR)")
    inspect.add_argument("--json", action="store_true", help="print the view as JSON, for scripts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "inspect":
        return _inspect(args)
    from gateway.server import ListenError

    try:
        return asyncio.run(_demo(args))
    except KeyboardInterrupt:  # the end of `demo --keep-running`
        return 0
    except (DemoError, ListenError) as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
