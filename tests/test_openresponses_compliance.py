"""The official Open Responses compliance suite against the gateway in front of the vLLM simulator.

The suite (`bin/compliance-test.ts` of github.com/openresponses/openresponses, pinned in
../shared/openresponses-suite/SOURCE.md) runs in place from /work/shared with bun and zod from
`.ci/install-openresponses-suite`; nothing of it is copied here. It runs once per module with `--json`,
and every one of its tests is a test here. The ones the gateway cannot pass yet are strict xfails
naming the issue, so a regression fails and a fix shows up as XPASS (then drop it from KNOWN_FAILING).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import start_stack

SUITE = Path(__file__).resolve().parents[2] / "shared" / "openresponses-suite"
CACHE_ROOT = Path(os.environ.get("RESPONSES_GATEWAY_CACHE")
                  or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "responses-gateway")
RUNTIME = Path(os.environ.get("RESPONSES_GATEWAY_OPENRESPONSES_RUNTIME")
               or CACHE_ROOT / "openresponses-suite" / "bun-1.3.12-zod-3.25.76")
BUN = RUNTIME / "node_modules" / ".bin" / "bun"

# The suite's tool-calling test asks this with a `get_weather` tool and expects a function_call item.
WEATHER_QUESTION = "What's the weather like in San Francisco?"
REPLIES = {WEATHER_QUESTION: {"tool_call": {"name": "get_weather", "arguments": {"location": "San Francisco, CA"}}}}

# Every test of the pinned suite, in its order (the run must report exactly these).
SUITE_TESTS = [
    "basic-response", "assistant-phase", "response-output-phase-schema", "streaming-response",
    "websocket-response", "websocket-sequential-responses", "websocket-continuation",
    "websocket-reconnect-store-false-recovery", "websocket-previous-response-not-found",
    "websocket-failed-continuation-evicts-cache", "websocket-compact-new-chain", "system-prompt",
    "tool-calling", "image-input", "multi-turn", "compact-response", "compact-missing-model",
]
# What the gateway does not do yet (issue 21), and why each fails today.
KNOWN_FAILING: dict[str, str] = {}
SUITE_SECONDS = 300  # the suite's own per-turn WebSocket timeout is 30 s; this only guards against a hang


def _missing() -> str | None:
    if not (SUITE / "bin" / "compliance-test.ts").is_file():
        return f"Open Responses compliance suite not found at {SUITE} (/work/shared absent)"
    if not BUN.is_file():
        reason = f"bun/zod runtime not found at {RUNTIME}: run .ci/install-openresponses-suite"
        if os.environ.get("RESPONSES_GATEWAY_REQUIRE_OPENRESPONSES"):  # .ci/run installed it: missing is a failure
            pytest.fail(reason)
        return reason
    return None


async def _run_suite() -> dict[str, Any]:
    servers: list[TestServer] = []

    async def serve(app: Any) -> TestServer:
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return server

    try:
        stack = await start_stack(serve, build_demo_vocab(), replies=REPLIES)
        process = await asyncio.create_subprocess_exec(
            str(BUN), "run", "--no-install", "bin/compliance-test.ts", "--base-url", stack.url("/v1"),
            "--api-key", "test-key", "--model", stack.model, "--json",
            cwd=SUITE, env={**os.environ, "NODE_PATH": str(RUNTIME / "node_modules"), "NO_COLOR": "1"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(process.communicate(), SUITE_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise
        # Exit status 1 only says some test failed; the JSON says which.
        try:
            return json.loads(out)
        except json.JSONDecodeError as exc:
            raise AssertionError(f"the suite printed no JSON (exit {process.returncode}): {err.decode()[-2000:]}"
                                 f"{out.decode()[-2000:]}") from exc
    finally:
        for server in reversed(servers):
            await server.close()


@pytest.fixture(scope="module")
def suite_run() -> dict[str, Any]:
    reason = _missing()
    if reason:
        pytest.skip(reason)
    report = asyncio.run(_run_suite())
    summary = report["summary"]
    failing = {r["id"]: r.get("errors") for r in report["results"] if r["status"] != "passed"}
    print(f"\nOpen Responses compliance: {summary['passed']}/{summary['total']} passed; failing: "
          + json.dumps(failing, indent=1))
    return report


def test_the_suite_runs_exactly_its_known_tests(suite_run):
    assert sorted(r["id"] for r in suite_run["results"]) == sorted(SUITE_TESTS)
    assert suite_run["summary"]["skipped"] == 0


@pytest.mark.parametrize("test_id", [
    pytest.param(test_id, marks=pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[test_id]))
    if test_id in KNOWN_FAILING else test_id
    for test_id in SUITE_TESTS])
def test_compliance(suite_run, test_id):
    [result] = [r for r in suite_run["results"] if r["id"] == test_id]
    assert result["status"] == "passed", f"{test_id}: " + "\n".join(result.get("errors") or [])
