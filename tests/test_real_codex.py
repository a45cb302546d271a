"""Codex CLI itself (`codex exec`, the pinned @openai/codex) against the gateway and the vLLM simulator.

Codex runs with its default config but for the model provider: a custom provider with
`wire_api = "responses"` pointed at the gateway, `CODEX_HOME` in a temporary folder. Any other
connection it tries goes to a dead proxy, so nothing leaves the machine and nothing waits on a network.
Its default request carries a `namespace` tool and `web_search` (see tests/test_codex_tools.py);
what it sends and what it does with the answers are asserted at the simulator.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import start_stack
from tests.real_clients import codex_bin, run

PROMPT = "say hi"
ANSWER = "hi from the simulator"
RUN_IT = "run the check"
# Codex's shell tool (`exec_command`, unified exec) with a command whose output only running it gives.
SHELL_CALL = {"tool_call": {"name": "exec_command", "arguments": {"cmd": "echo codex-$((6*7))"}}}
AFTER_TOOL = "The check printed codex-42."
DEAD_PROXY = "http://127.0.0.1:9"


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _stack(aiohttp_server, vocab, after_tool: str | None = None):
    # Codex's instructions and tools are ~20k demo-vocabulary tokens: a long context, as a real model's.
    replies = {PROMPT: ANSWER, RUN_IT: SHELL_CALL}
    return await start_stack(aiohttp_server, vocab, replies=replies, default_reply=after_tool or AFTER_TOOL,
                             max_model_len=131072)


def _codex_home(tmp_path: Path, gateway_url: str) -> Path:
    home = tmp_path / "codex-home"
    home.mkdir()
    (home / "config.toml").write_text(
        'model = "demo-model"\nmodel_provider = "gateway"\n\n'
        "[model_providers.gateway]\n"
        'name = "responses-gateway"\n'
        f'base_url = "{gateway_url}"\n'
        'wire_api = "responses"\n')
    return home


async def _codex(tmp_path: Path, home: Path, *args: str):
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    env = {"CODEX_HOME": str(home), "HTTP_PROXY": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY, "ALL_PROXY": DEAD_PROXY,
           "NO_PROXY": "127.0.0.1,localhost", "RUST_LOG": "error"}
    return await run([str(codex_bin()), "exec", "--skip-git-repo-check", *args], cwd=work, env=env, timeout=180,
                     stdin=b"")


def _upstream_bodies(stack) -> list[dict]:
    return [entry["body"] for entry in stack.stats.recent if entry["path"] == "/v1/chat/completions"]


def _access_lines(caplog) -> list[dict]:
    return [json.loads(r.getMessage()) for r in caplog.records
            if r.name == "responses_gateway.access" and '"/v1/responses"' in r.getMessage()]


async def test_codex_default_config_answers_a_prompt(aiohttp_server, vocab, tmp_path, caplog):
    codex_bin()  # skips, naming the installer, without the clients
    caplog.set_level(logging.INFO, logger="responses_gateway.access")
    stack = await _stack(aiohttp_server, vocab)
    home = _codex_home(tmp_path, stack.url("/v1"))
    ran = (await _codex(tmp_path, home, PROMPT)).check()
    assert ran.stdout.strip().splitlines()[-1] == ANSWER  # `codex exec` prints the last message
    [body] = _upstream_bodies(stack)
    names = {tool["function"]["name"] for tool in body["tools"]}
    assert {"exec_command", "multi_agent_v1__spawn_agent"} <= names  # the namespace's members, flat
    assert not any("web_search" in name for name in names)
    assert body["messages"][-1] == {"role": "user", "content": PROMPT}
    # The request log says which hosted tools Codex asked for that the upstream never saw.
    [line] = _access_lines(caplog)
    assert line["status"] == 200 and line["hosted_tools_dropped"] == ["web_search"]


async def test_codex_runs_a_shell_call_and_resumes_the_session(aiohttp_server, vocab, tmp_path):
    codex_bin()
    stack = await _stack(aiohttp_server, vocab)
    home = _codex_home(tmp_path, stack.url("/v1"))
    ran = (await _codex(tmp_path, home, RUN_IT)).check()
    assert ran.stdout.strip().splitlines()[-1] == AFTER_TOOL
    _, second = _upstream_bodies(stack)
    [call] = second["messages"][-2]["tool_calls"]
    assert call["function"]["name"] == "exec_command"
    assert json.loads(call["function"]["arguments"]) == {"cmd": "echo codex-$((6*7))"}
    tool = second["messages"][-1]
    assert tool["role"] == "tool" and tool["tool_call_id"] == call["id"]
    assert "codex-42" in tool["content"]  # Codex ran the command; its output reached the upstream

    # `resume` continues the recorded session: the whole conversation again (store: false), then the prompt.
    ran = (await _codex(tmp_path, home, "resume", "--last", PROMPT)).check()
    assert ran.stdout.strip().splitlines()[-1] == ANSWER
    third = _upstream_bodies(stack)[-1]
    contents = [(m["role"], m.get("content")) for m in third["messages"]]
    assert ("user", RUN_IT) in contents and ("assistant", AFTER_TOOL) in contents
    assert any(role == "tool" and "codex-42" in (content or "") for role, content in contents)
    assert contents[-1] == ("user", PROMPT)
