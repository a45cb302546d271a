"""`responses-gateway serve | demo`."""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from aiohttp import web

from gateway.config import Config, ConfigError, load_config, parse_config


def _serve(args: argparse.Namespace) -> int:
    from gateway.app import create_app

    try:
        config = load_config(args.config)
        app = create_app(config)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    host = args.host or config.listen.host
    port = args.port if args.port is not None else config.listen.port
    print(f"responses-gateway on http://{host}:{port} ({len(config.models)} models)", flush=True)
    web.run_app(app, host=host, port=port, handler_cancellation=True, print=None)
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


def demo_config(upstream_port: int, model: str, tokenizer: dict[str, str], api: str) -> Config:
    return parse_config({
        "upstreams": {"simulator": {"urls": [f"http://127.0.0.1:{upstream_port}"], "api": api}},
        "models": {model: {"upstream": "simulator", "tokenizer": tokenizer}},
    }, Path.cwd())


async def _demo(args: argparse.Namespace) -> int:
    from gateway.app import create_app
    from gateway.logprobs.demo_vocab import build_demo_vocab
    from gateway.logprobs.vocab import load_bpe_files
    from gateway.simulator.vllm import create_app as create_simulator

    if args.qwen2_dir:
        vocab = load_bpe_files(args.qwen2_dir / "vocab.json", args.qwen2_dir / "merges.txt")
        model = "Qwen/Qwen2-0.5B"
        tokenizer = {"vocab": str(args.qwen2_dir / "vocab.json"), "merges": str(args.qwen2_dir / "merges.txt")}
    else:
        vocab = build_demo_vocab()
        model = "demo-model"
        tokenizer = {"builtin": "demo"}
    sim_runner, sim_port = await _start(create_simulator(vocab, model))
    gw_runner, gw_port = await _start(create_app(demo_config(sim_port, model, tokenizer, args.api)))
    try:
        print(f"vLLM-dialect simulator (no model: scripted text, synthetic logprobs) on :{sim_port}, "
              f"{args.api} API, tokenizer {vocab.name!r}")
        print(f"gateway on http://127.0.0.1:{gw_port}/v1/responses\n")
        response = await asyncio.to_thread(_demo_request, gw_port, model)
    finally:
        await gw_runner.cleanup()
        await sim_runner.cleanup()
    _print_table(response)
    return 0


def _demo_request(port: int, model: str) -> object:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="demo", _strict_response_validation=True)
    body = dict(DEMO_REQUEST)
    extra = {"ignore_eos": body.pop("ignore_eos")}
    return client.responses.create(model=model, extra_body=extra, **body)  # type: ignore[arg-type]


def _print_table(response: object) -> None:
    part = response.output[0].content[0]  # type: ignore[attr-defined]
    print(f"text: {part.text!r}   status: {response.status}")  # type: ignore[attr-defined]
    print(f"{'token':<18} {'bytes':<22} {'prob':>7}   alternatives")
    for entry in part.logprobs:
        alternatives = ", ".join(f"{alt.token!r} {math.exp(alt.logprob):.1%}" for alt in entry.top_logprobs)
        raw = " ".join(f"{b:02x}" for b in entry.bytes)
        print(f"{entry.token!r:<18} {raw:<22} {math.exp(entry.logprob):>7.1%}   {alternatives}")
    joined = b"".join(bytes(e.bytes) for e in part.logprobs)
    print(f"\nbytes of the tokens == UTF-8 of the text: {joined == part.text.encode()}")


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
    args = parser.parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    return asyncio.run(_demo(args))


if __name__ == "__main__":
    sys.exit(main())
