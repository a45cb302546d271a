"""The llama.cpp simulator answers every request of the real-server capture
(tests/captures/real/llamacpp-b1-smollm2.json) with the capture's shape: the same status, the same
fields at every level (the `logprobs` key absent where llama.cpp leaves it out), the same kinds of
stream frames in the same places (no role chunk when the first token splits a character), the same
finish reasons and number of choices. The texts differ (the simulator's script, the demo tokenizer,
which spells every emoji with four one-byte tokens, as SmolLM2 splits them)."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from gateway.logprobs.vocab import Vocab
from gateway.simulator.llamacpp import create_app
from tests.llamacpp_capture import CASES

# What the simulated model says to each captured prompt: text with the characters the real answers had.
REPLIES = {
    "Say hello with emoji 👋🏽 and 你好": "👋🏽👍👏👑👔👃👨",
    "Reply with only 👋🏽👋🏽👋🏽": "？👋🏽",  # a first character of three tokens: cut by 2, whole at 3
    "Say OK.": "OK, I'm ready to assist.",
    # Four characters of three tokens, then 👑: its four tokens' worth of entries cut leaves one, as on SmolLM2.
    "Emoji: 👋🏽 你好": "？，。！👑👃",
    "Say hi 👋": "👋👌👌👌👌",
}
NOT_SIMULATED = {"completions eos", "completions eos, stream"}  # a ChatML prompt: the simulator's has no EOS text


def shape(value: Any) -> Any:
    """The structure of a JSON value: keys at every level, list items merged, scalars by kind."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in value.items()}
    if isinstance(value, list):
        merged: dict[str, Any] = {}
        kinds = set()
        for item in value:
            if isinstance(item, dict):
                for key, sub in shape(item).items():
                    merged.setdefault(key, sub)
            else:
                kinds.add(json.dumps(shape(item)))
        return [merged] if merged else sorted(kinds)
    if value is None:
        return "null"
    return "bool" if isinstance(value, bool) else "number" if isinstance(value, int | float) else type(value).__name__


def frames(lines: list[str]) -> list[Any]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def frame_kind(frame: dict[str, Any]) -> str:
    """What a stream frame is: role / content / finish / usage (chat, completions), or its event type."""
    if "type" in frame:
        return frame["type"]
    if not frame.get("choices"):
        return "usage"
    choice = frame["choices"][0]
    if choice.get("finish_reason"):
        return f"finish:{choice['finish_reason']}"
    delta = choice.get("delta", {})
    if "role" in delta:
        return "role"
    logprobs = "+logprobs" if choice.get("logprobs") else ""
    return ("content" if delta.get("content") or choice.get("text") else "empty") + logprobs


def _pairs(names: list[str]) -> set[tuple[str, str]]:
    return set(itertools.pairwise(names))


def collapsed(kinds: list[str]) -> list[str]:
    return [kind for i, kind in enumerate(kinds) if i == 0 or kinds[i - 1] != kind]


@pytest.fixture
async def simulator(aiohttp_client, demo_vocab: Vocab):
    return await aiohttp_client(create_app(demo_vocab, "smollm2", replies=REPLIES))


def _without_volatile(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key not in ("completed_at",)}


@pytest.mark.parametrize("name", [name for name in CASES if name not in NOT_SIMULATED])
async def test_the_simulator_answers_each_captured_request_with_its_shape(simulator, name):
    case = CASES[name]
    captured = case["response"]
    reply = await simulator.post(case["path"], json=case["request"])
    assert reply.status == captured["status"]
    if "events" in captured:
        raw = (await reply.text()).splitlines()
        real, simulated = frames(captured["events"]), frames(raw)
        if not any(line.startswith("event: ") for line in captured["events"]):
            assert collapsed([frame_kind(f) for f in simulated]) == collapsed([frame_kind(f) for f in real])
        real_events = [line[7:] for line in captured["events"] if line.startswith("event: ")]
        simulated_events = [line[7:] for line in raw if line.startswith("event: ")]
        # Its /v1/responses stream repeats created + in_progress before every delta: as many as tokens.
        assert _pairs(simulated_events) == _pairs(real_events)
        assert simulated_events[:5] == real_events[:5] and simulated_events[-4:] == real_events[-4:]
        for real_frame, simulated_frame in zip(real, simulated, strict=False):
            if frame_kind(real_frame) == frame_kind(simulated_frame):
                assert shape(simulated_frame) == shape(real_frame)
        assert ("data: [DONE]" in raw) == ("data: [DONE]" in captured["events"])
        return
    body = await reply.json()
    real = captured["body"]
    if "error" in real:
        assert body["error"]["message"] == real["error"]["message"]
        assert shape(body) == shape(real)
        return
    assert shape(_without_volatile(body)) == shape(_without_volatile(real))
    if "choices" in real:
        assert [c["finish_reason"] for c in body["choices"]] == [c["finish_reason"] for c in real["choices"]]
        for sim_choice, real_choice in zip(body["choices"], real["choices"], strict=True):
            sim_entries = (sim_choice.get("logprobs") or {}).get("content") or []
            real_entries = (real_choice.get("logprobs") or {}).get("content") or []
            # The EOS entry (empty token and bytes) is there exactly where the real server sent one.
            assert (bool(sim_entries) and sim_entries[-1]["bytes"] == []) == (
                bool(real_entries) and real_entries[-1]["bytes"] == [])
