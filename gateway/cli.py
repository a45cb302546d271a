"""`responses-gateway serve | demo | check-config | inspect`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from gateway.config import Config, ConfigError, load_config, parse_config
from gateway.memory import idle_trim_seconds, install_idle_trim, release_free_memory, upstream_read_bufsize

if TYPE_CHECKING:
    from schemas.responses import Response


class DemoError(RuntimeError):
    """The demo's own request failed: printed as one line."""


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import STATE, create_app

    try:
        idle_trim = idle_trim_seconds(os.environ)
        upstream_read_bufsize(os.environ)  # read again by the app at start-up; refused here, before loading
    except ValueError as exc:
        print(f"environment error: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(args.config)
        app = create_app(config)
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
    from gateway.server import configure_logging, serve

    configure_logging(config.logging.level)
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    run = asyncio.run
    try:  # uvloop when installed: a faster event loop, same asyncio semantics
        import uvloop
    except ImportError:
        pass
    else:
        run = getattr(uvloop, "run", run)  # uvloop.run needs uvloop >= 0.18
    run(serve(app, host, port, config.shutdown.grace_seconds))
    return 0


DEMO_REQUEST = {
    "input": "hi",
    "max_output_tokens": 12,
    "include": ["message.output_text.logprobs"],
    "top_logprobs": 3,
    "ignore_eos": True,
}


async def _start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, port


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
        upstream_read_bufsize(os.environ)  # read by the app at start-up; refused here, as `serve` does
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
    gw_runner, gw_port = await _start(create_app(demo_config(sim_port, model, tokenizer, args.api, playground=True)))
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

    rows, ok = run_checks(args.config, timeout=args.timeout)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="responses-gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the gateway")
    serve.add_argument("--config", required=True, type=Path)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    demo = commands.add_parser("demo", help="offline demo: simulator upstream + gateway + OpenAI SDK")
    demo.add_argument("--api", choices=["chat", "completions"], default="chat")
    demo.add_argument("--qwen2-dir", type=Path, help="folder with Qwen2 vocab.json + merges.txt")
    demo.add_argument("--keep-running", action="store_true", help="keep serving (and the playground) until Ctrl-C")
    check = commands.add_parser("check-config", help="validate a config, load tokenizers, probe upstreams")
    check.add_argument("config", type=Path)
    check.add_argument("--timeout", type=float, default=5.0, help="seconds per upstream probe")
    inspect = commands.add_parser("inspect", help="stream a prompt through a running gateway; show every token's "
                                  "probability, bytes and alternatives")
    inspect.add_argument("prompt")
    inspect.add_argument("--model", required=True)
    inspect.add_argument("--base-url", default="http://127.0.0.1:8080", help="the gateway (default: %(default)s)")
    inspect.add_argument("--top-logprobs", type=int, default=5, help="alternatives per token (default: %(default)s)")
    inspect.add_argument("--max-output-tokens", type=int, default=64, help="(default: %(default)s)")
    inspect.add_argument("--instructions")
    inspect.add_argument("--temperature", type=float)
    inspect.add_argument("--api-key", help="sent as a Bearer token, if the gateway asks for one")
    inspect.add_argument("--color", choices=["auto", "always", "never"], default="auto")
    inspect.add_argument("--json", action="store_true", help="print the view as JSON, for scripts")
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "check-config":
        return _check_config(args)
    if args.command == "inspect":
        return _inspect(args)
    try:
        return asyncio.run(_demo(args))
    except KeyboardInterrupt:  # the end of `demo --keep-running`
        return 0
    except DemoError as exc:
        print(f"demo: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
