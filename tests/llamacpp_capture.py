"""The real llama-server capture (tests/captures/real/llamacpp-b1-smollm2.json, see its README) as a
loopback upstream that answers each request with the captured reply it matches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp import web

CAPTURE = Path(__file__).resolve().parent / "captures" / "real" / "llamacpp-b1-smollm2.json"
CASES: dict[str, dict[str, Any]] = {case["name"]: case for case in json.loads(CAPTURE.read_text())["cases"]}
# What picks the captured reply for a request (the gateway adds stream_options, drops logprobs, ...).
MATCHED = ("messages", "prompt", "max_tokens", "stop", "n", "temperature")


def matches(case: dict[str, Any], path: str, body: dict[str, Any]) -> bool:
    request = case["request"]
    return (case["path"] == path and bool(request.get("stream")) == bool(body.get("stream"))
            and all(request.get(key) == body.get(key) for key in MATCHED))


def raw_reply(case: dict[str, Any]) -> web.Response:
    reply = case["response"]
    if "events" in reply:
        frames = "".join(line + ("\n\n" if line.startswith("data:") else "\n") for line in reply["events"])
        return web.Response(body=frames.encode(), status=reply["status"], content_type="text/event-stream")
    return web.Response(body=json.dumps(reply["body"], ensure_ascii=False).encode(), status=reply["status"],
                        content_type="application/json")


def replay_app(seen: list[dict[str, Any]]) -> web.Application:
    """Answers with the first case that matches; `seen` collects the request bodies."""
    async def answer(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        for case in CASES.values():
            if matches(case, request.path, body):
                return raw_reply(case)
        return web.json_response({"error": {"code": 404, "message": f"no captured case for {body}",
                                            "type": "not_found_error"}}, status=404)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
        app.router.add_post(path, answer)
    app.router.add_get("/health", health)
    return app
