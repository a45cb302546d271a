"""The vLLM simulator's wire against real vLLM 0.32.0's (tests/captures/real/vllm-0.32.0-qwen2-tiny.json):
each captured request, sent to the simulator with Qwen2's real vocabulary, answers with the same status,
content type and field sets, and the quirks the capture shows (lead tokens of a split character spelled
"" with empty bytes and the completing token the whole character; sampled-first top lists of exactly k;
HTTP 200 with one in-band error frame for a refused stream)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.simulator.vllm import create_app

CAPTURE = json.loads((Path(__file__).parent / "captures" / "real" / "vllm-0.32.0-qwen2-tiny.json").read_text())
CASES = {case["name"]: case for case in CAPTURE["cases"]}
MODEL = "qwen2-tiny"


def _shape(value: Any, key: str = "") -> Any:
    """The field names at every level (lists: the union of their items' shapes), not the values; legacy
    completions' top_logprobs dicts are keyed by token strings, which are values."""
    if isinstance(value, dict) and key == "top_logprobs":
        return "token -> logprob"
    if isinstance(value, dict):
        return {name: _shape(item, name) for name, item in value.items()}
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        for item in value:
            shape = _shape(item, key)
            if isinstance(shape, dict):
                merged.update(shape)
        return [merged] if merged else []
    return None


def _frames(events: list[str]) -> list[Any]:
    return [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: ") and e != "data: [DONE]"]


async def _replay(aiohttp_client, qwen2_vocab, case: dict[str, Any]) -> dict[str, Any]:
    client = await aiohttp_client(create_app(qwen2_vocab, MODEL, max_model_len=1024, max_logprobs=20))
    async with client.post(case["path"], json=case["request"]) as answer:
        raw = await answer.read()
        kept: dict[str, Any] = {"status": answer.status, "content_type": answer.headers["Content-Type"]}
    if kept["content_type"].startswith("text/event-stream"):
        kept["events"] = [line for line in raw.decode().split("\n") if line.startswith("data: ")]
    else:
        kept["body"] = json.loads(raw)
    return kept


CHAT_CASES = [name for name, case in CASES.items() if case["path"] != "/v1/responses"]


@pytest.mark.parametrize("name", CHAT_CASES)
async def test_the_simulator_answers_each_captured_request_in_vllms_shape(aiohttp_client, qwen2_vocab, name) -> None:
    case = CASES[name]
    real, simulated = case["response"], await _replay(aiohttp_client, qwen2_vocab, case)
    assert simulated["status"] == real["status"]
    assert simulated["content_type"].split(";")[0] == real["content_type"].split(";")[0]
    if "body" in real:
        assert _shape(simulated["body"]) == _shape(real["body"])
    else:
        real_frames, sim_frames = _frames(real["events"]), _frames(simulated["events"])
        assert _shape(sim_frames) == _shape(real_frames)
        assert ("error" in real_frames[0]) == ("error" in sim_frames[0])


def _entries(response: dict[str, Any]) -> list[dict[str, Any]]:
    return response["body"]["choices"][0]["logprobs"]["content"]


@pytest.mark.parametrize("name", ["chat logprobs, no ids", "chat top 20 at temperature 1, token ids"])
async def test_the_simulators_logprob_quirks_are_the_captured_ones(aiohttp_client, qwen2_vocab, name) -> None:
    case = CASES[name]
    k = case["request"]["top_logprobs"]
    for response in (case["response"], await _replay(aiohttp_client, qwen2_vocab, case)):
        entries = _entries(response)
        # top lists of exactly k, the sampled token first (vLLM's engine dict: sampled, then the top k)
        assert all(len(e["top_logprobs"]) == k and e["top_logprobs"][0]["token"] == e["token"] for e in entries)
        if "token ids" not in name:
            # a split character: its lead token "" with no bytes, the completing one the whole character
            leads = [i for i, e in enumerate(entries) if e["token"] == ""]
            assert leads and all(entries[i]["bytes"] == [] for i in leads)
            completing = entries[leads[0] + 1]
            assert bytes(completing["bytes"]).decode() == completing["token"]
