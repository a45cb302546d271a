"""Micro-benchmark of the pure core: tokens/s of each logprob conversion, exact bytes from ids.

Inputs are the canned vLLM bodies (`token_id:N` placeholders, sampled-first top lists; the gateway
asks chat for k+1 so the true top k survive), the tokenizer is Qwen2's real one when present. Each
figure is the best of repeated calls on one pinned core, timed in the thread's CPU time (time the
scheduler gives other processes does not count: the machines are shared and noisy), in tokens/s.

    .venv/bin/python -m bench.core [--quick] [--json out.json] [--only REGEX] [--ks 5]
"""

from __future__ import annotations

import argparse
import gc
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.canned import Case, load_vocab_for, record_to_file

KS = (0, 5, 20)
TOKENS = 1000
ROOT = Path(__file__).resolve().parents[1]


def _best_rate(fn: Callable[..., Any], args: tuple[Any, ...], tokens: int, seconds: float) -> float:
    """Tokens/s of `fn(*args)` (which handles `tokens` tokens), best of repeats within ~`seconds`.

    Timed in this thread's CPU time, so time the scheduler gives to other processes does not count.
    """
    fn(*args)  # warm caches
    best = float("inf")
    gc.collect()
    deadline = time.perf_counter() + seconds
    rounds = 0
    while rounds < 5 or time.perf_counter() < deadline:
        start = time.thread_time()
        fn(*args)
        best = min(best, time.thread_time() - start)
        rounds += 1
    return tokens / best


def _sse_payloads(frames: list[str]) -> list[bytes]:
    out = []
    for frame in frames:
        data = frame.strip().removeprefix("data: ")
        if data != "[DONE]":
            out.append(data.encode())
    return out


def run(canned: dict[str, Any], seconds: float, ks: tuple[int, ...] = KS, only: str | None = None
        ) -> list[dict[str, Any]]:
    from gateway.logprobs import convert
    from gateway.logprobs.body_scan import load_chat_body, load_completions_body
    from gateway.logprobs.parse import ParseOptions, parse_chat
    from gateway.logprobs.render import render_responses_json, visible_tokens
    from gateway.sse import encode_event
    from gateway.translate.response_object import ResponseSettings
    from gateway.translate.stream import ResponsesStream
    from gateway.upstreams.base import UpstreamCall
    from gateway.upstreams.openai_compatible import (
        chat_chunk_reader,
        chat_step,
        completions_chunk_reader,
        completions_step,
    )

    vocab = load_vocab_for(canned["tokenizer"])
    options = ParseOptions(vocab=vocab)
    cases = canned["cases"]
    rows: list[dict[str, Any]] = []

    def add(direction: str, k: int, fn: Callable[..., Any], *args: Any) -> None:
        if only and not re.search(only, direction):
            return
        rate = _best_rate(fn, args, TOKENS, seconds)
        rows.append({"direction": direction, "k": k, "tokens_per_s": round(rate)})
        print(f"  {direction:<48} k={k:<3} {rate:>12,.0f} tokens/s", flush=True)

    def chat_to_responses_json(content: list[Any], k: int) -> bytes:
        return render_responses_json(visible_tokens(parse_chat(content, options).tokens), k)

    bodies = {
        "chat": UpstreamCall("/v1/chat/completions", {}, chat_step, load_chat_body),
        "completions": UpstreamCall("/v1/completions", {}, completions_step, load_completions_body),
    }

    def full(raw: bytes, api: str, settings: ResponseSettings) -> bytes:
        # The gateway's whole CPU path for a non-streamed body minus sockets: the dialect's reader (the
        # body read, its logprobs parsed against its text), the translator, the Response written.
        step = bodies[api].read(raw, options, False)
        translator = ResponsesStream(settings, vocab=vocab, serialized=True, deltas=False)  # as the server runs it
        translator.feed(step.tokens, step.text)
        return orjson.dumps(translator.final_response(step.finish_reason, None))

    readers = {
        "chat": UpstreamCall("/v1/chat/completions", {}, chat_step, load_chat_body, chat_chunk_reader),
        "completions": UpstreamCall("/v1/completions", {}, completions_step, read_chunk=completions_chunk_reader),
    }

    def stream(payloads: list[bytes], api: str, settings: ResponseSettings) -> int:
        # ... and for a stream: every upstream chunk in (read as the server reads it), every Responses SSE
        # frame out. With the route's tokenizer, as the server runs it: the message's tokens are kept as ids
        # (without it they were packed one by one, ~1.4 us a token more than the server spends).
        translator = ResponsesStream(settings, vocab=vocab, serialized=True)
        size = sum(len(encode_event(e)) for e in translator.start())
        finish = None
        read = readers[api].stream_reader(options, True)  # (a Responses stream's tokens as the server reads them)
        for data in payloads:
            step = read(data)
            size += sum(len(encode_event(e)) for e in translator.feed(step.tokens, step.text))
            finish = step.finish_reason or finish
        size += sum(len(encode_event(e)) for e in translator.finish(finish, None))
        return size

    for k in ks:
        chat_body = orjson.loads(cases[f"chat/full/k{k}/n{TOKENS}"]["body"])
        comp_body = orjson.loads(cases[f"completions/full/k{k}/n{TOKENS}"]["body"])
        chat_content = chat_body["choices"][0]["logprobs"]["content"]
        comp_logprobs = comp_body["choices"][0]["logprobs"]
        # Responses entries as a client would hand them back: exact `bytes` by contract.
        responses_entries = orjson.loads(orjson.dumps(convert.chat_to_responses(chat_content, k, options)))
        assert len(responses_entries) == TOKENS

        add("chat -> responses (token ids)", k, convert.chat_to_responses, chat_content, k, options)
        # What the gateway sends: the same entries written as JSON (byte-identical to dumping the dicts).
        add("chat -> responses JSON (token ids)", k, chat_to_responses_json, chat_content, k)
        add("chat -> completions (token ids)", k, convert.chat_to_completions, chat_content, k, options)
        add("completions -> responses (token ids)", k, convert.completions_to_responses, comp_logprobs, k, options)
        add("completions -> chat (token ids)", k, convert.completions_to_chat, comp_logprobs, k, options)
        add("responses -> chat (exact bytes)", k, convert.responses_to_chat, responses_entries, k)
        add("responses -> completions (exact bytes)", k, convert.responses_to_completions, responses_entries, k)

        settings = ResponseSettings(model="m", top_logprobs=k, include_logprobs=True)
        for api in ("chat", "completions"):
            body = cases[f"{api}/full/k{k}/n{TOKENS}"]["body"].encode()
            add(f"gateway path: {api} body -> Response JSON", k, full, body, api, settings)
            payloads = _sse_payloads(cases[f"{api}/stream/k{k}/n{TOKENS}"]["frames"])
            add(f"gateway path: {api} SSE chunks -> Responses SSE", k, stream, payloads, api, settings)
    return rows


def run_isolated(canned_path: Path, *, quick: bool) -> list[dict[str, Any]]:
    """Run this benchmark in its own process (pinned to one core); return its rows."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "core.json"
        argv = [sys.executable, "-m", "bench.core", "--canned", str(canned_path), "--json", str(out)]
        subprocess.run(argv + (["--quick"] if quick else []), check=True, cwd=ROOT)
        return orjson.loads(out.read_bytes())["rows"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.core", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter timing (about 20 s in all)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--canned", type=Path, help="reuse (or write) this canned file from bench.canned")
    parser.add_argument("--demo-vocab", action="store_true", help="the demo tokenizer even if Qwen2 is present")
    parser.add_argument("--only", help="only directions matching this regular expression")
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="comma-separated k values (default 0,5,20)")
    parser.add_argument("--seconds", type=float, help="timing budget per figure")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    if args.canned and args.canned.is_file():
        canned = orjson.loads(args.canned.read_bytes())
    else:
        cases = [Case(api, stream, k, TOKENS) for api in ("chat", "completions") for stream in (False, True)
                 for k in KS]
        path = args.canned or Path(tempfile.gettempdir()) / f"bench-core-canned-{os.getpid()}.json"
        print(f"recording canned upstream bodies with the simulator -> {path}", flush=True)
        canned = record_to_file(cases, path, use_qwen2=False if args.demo_vocab else None)
    print(f"pure core, {TOKENS} tokens per call, tokenizer {canned['vocab']!r}, one core, "
          f"python {sys.version.split()[0]}", flush=True)
    seconds = args.seconds or (0.4 if args.quick else 1.5)
    rows = run(canned, seconds, tuple(int(k) for k in args.ks.split(",")), args.only)
    if args.json:
        args.json.write_bytes(orjson.dumps({"vocab": canned["vocab"], "tokens_per_call": TOKENS, "rows": rows},
                                           option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
