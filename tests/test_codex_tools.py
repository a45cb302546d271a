"""Codex CLI's tools through a chat upstream: `namespace` tools, `custom` tools and hosted tools.

Codex 0.171's default request (tests/captures/codex-0.171.0-exec-request.json, captured on loopback)
groups its sub-agent functions in a `namespace` tool and adds `web_search`; the gateway used to
refuse both. Shapes follow OpenAI's SDK types (`NamespaceTool`, `CustomTool`,
`ResponseFunctionToolCall.namespace`, `ResponseCustomToolCall`, the `custom_tool_call_input`
events) and Codex's own reading of a call (`ResponseItem::FunctionCall { name, namespace, .. }`).
"""

import itertools
import json
import logging
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openai import BadRequestError
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.translate.tools import InputStream, custom_input
from tests.e2e import create_response as _create
from tests.e2e import last_upstream_body, start_stack

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)
CODEX_REQUEST = Path(__file__).parent / "captures" / "codex-0.171.0-exec-request.json"

SPAWN = {"type": "function", "name": "spawn_agent", "description": "Spawn a sub-agent.", "strict": False,
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Tools for sub-agents.", "tools": [SPAWN]}
EXEC = {"type": "function", "name": "exec_command", "description": "Run a command.",
        "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}
GRAMMAR = 'start: "*** Begin Patch" LF body "*** End Patch"\n%import common.LF'
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
              "format": {"type": "grammar", "syntax": "lark", "definition": GRAMMAR}}
# Quotes, a backslash, a newline and an emoji: every JSON escape a streamed decoder must get right.
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+say "hi" \\o/ 🦀\n*** End Patch'
REPLIES = {
    "spawn one": {"tool_call": {"name": "multi_agent_v1__spawn_agent", "arguments": {"message": "look around"}}},
    "patch it": {"tool_call": {"name": "apply_patch", "arguments": {"input": PATCH}}},
    "agent said ok": "Done: the agent is running.",
    "patched": "The file is added.",
}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()



@pytest.mark.parametrize("stream", [False, True])
async def test_namespace_members_are_offered_as_functions_and_calls_come_back_namespaced(aiohttp_server, vocab,
                                                                                         stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step=3)
    first, raw = await _create(stack, stream, input="spawn one", tools=[EXEC, AGENTS])
    offered = last_upstream_body(stack)["tools"]
    assert [tool["function"]["name"] for tool in offered] == ["exec_command", "multi_agent_v1__spawn_agent"]
    member = offered[1]["function"]
    assert member["description"] == "Tools for sub-agents.\n\nSpawn a sub-agent."
    assert member["parameters"] == SPAWN["parameters"]
    [call] = first.output
    assert (call.type, call.name, call.namespace) == ("function_call", "spawn_agent", "multi_agent_v1")
    assert json.loads(call.arguments) == {"message": "look around"}
    assert [tool.type for tool in first.tools] == ["function", "namespace"]  # echoed as given
    if stream:
        done = next(f for f in raw if f["type"] == "response.function_call_arguments.done")
        assert done["name"] == "spawn_agent"
        assert raw[-2]["item"]["namespace"] == "multi_agent_v1"

    # Codex sends the call back with its namespace: upstream it is the same flat function again.
    history = [{"role": "user", "content": "spawn one"}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": "agent said ok"}]
    second, _ = await _create(stack, stream, input=history, tools=[EXEC, AGENTS])
    assert second.output_text == "Done: the agent is running."
    messages = last_upstream_body(stack)["messages"]
    assert messages[1]["tool_calls"] == [{"id": call.call_id, "type": "function", "function": {
        "name": "multi_agent_v1__spawn_agent", "arguments": call.arguments}}]


@pytest.mark.parametrize("stream", [False, True])
async def test_custom_tool_is_one_string_parameter_and_its_call_is_a_custom_tool_call(aiohttp_server, vocab,
                                                                                      stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    first, raw = await _create(stack, stream, input="patch it", tools=[PATCH_TOOL])
    [offered] = last_upstream_body(stack)["tools"]
    assert offered["function"]["name"] == "apply_patch"
    parameters = offered["function"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["properties"]["input"]["type"] == "string"
    assert GRAMMAR in parameters["properties"]["input"]["description"]  # the model is shown the grammar
    [call] = first.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch" and call.input == PATCH
    assert call.id.startswith("ctc_") and call.call_id.startswith("call_")
    if stream:
        types = [f["type"] for f in raw]
        assert "response.function_call_arguments.delta" not in types
        deltas = [f["delta"] for f in raw if f["type"] == "response.custom_tool_call_input.delta"]
        assert len(deltas) > 1 and "".join(deltas) == PATCH  # streamed as the model writes, decoded
        done = next(f for f in raw if f["type"] == "response.custom_tool_call_input.done")
        assert done["input"] == PATCH and done["item_id"] == call.id
        assert raw[2]["type"] == "response.output_item.added" and raw[2]["item"]["input"] == ""

    history = [{"role": "user", "content": "patch it"}, call.model_dump(exclude_none=True),
               {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "patched"}]
    second, _ = await _create(stack, stream, input=history, tools=[PATCH_TOOL])
    assert second.output_text == "The file is added."
    messages = last_upstream_body(stack)["messages"]
    [sent_call] = messages[1]["tool_calls"]
    assert sent_call["function"]["name"] == "apply_patch"
    assert json.loads(sent_call["function"]["arguments"]) == {"input": PATCH}
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": "patched"}


async def test_custom_tool_choice_names_its_function(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    await stack.client.responses.create(model=stack.model, input="patch it", tools=[PATCH_TOOL, AGENTS],
                                        tool_choice={"type": "custom", "name": "apply_patch"})
    assert last_upstream_body(stack)["tool_choice"] == {"type": "function", "function": {"name": "apply_patch"}}
    await stack.client.responses.create(model=stack.model, input="spawn one", tools=[PATCH_TOOL, AGENTS],
                                        tool_choice={"type": "function", "name": "spawn_agent"})
    assert last_upstream_body(stack)["tool_choice"] == {
        "type": "function", "function": {"name": "multi_agent_v1__spawn_agent"}}


async def test_hosted_tools_are_dropped_counted_and_reported(aiohttp_server, vocab, caplog):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    tools = [{"type": "web_search", "external_web_access": False}, EXEC, {"type": "file_search",
                                                                           "vector_store_ids": ["vs_1"]}]
    caplog.set_level(logging.INFO, logger="responses_gateway.access")
    raw = await stack.client.responses.with_raw_response.create(model=stack.model, input="hi", tools=tools)
    assert raw.headers["X-Dropped-Hosted-Tools"] == "web_search,file_search"
    response = raw.parse()
    assert response.status == "completed"
    assert [tool.type for tool in response.tools] == ["function"]  # what the model was offered
    assert [tool["function"]["name"] for tool in last_upstream_body(stack)["tools"]] == ["exec_command"]
    [line] = [json.loads(r.getMessage()) for r in caplog.records if '"/v1/responses"' in r.getMessage()]
    assert line["hosted_tools_dropped"] == ["web_search", "file_search"]
    async with aiohttp.ClientSession() as session, session.get(stack.url("/metrics")) as metrics:
        text = await metrics.text()
    assert 'gateway_hosted_tools_dropped_total{model="demo-model",tool="web_search"} 1.0' in text
    # Streamed: the header comes with the stream's headers.
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/responses"), json={
            "model": stack.model, "input": "hi", "tools": tools, "stream": True}) as streamed:
        assert streamed.headers["X-Dropped-Hosted-Tools"] == "web_search,file_search"
        assert b"response.completed" in await streamed.read()


async def test_hosted_tools_refused_where_the_model_says_so(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, model_options={"hosted_tools": "refuse"})
    with pytest.raises(BadRequestError) as caught:
        await stack.client.responses.create(model=stack.model, input="hi",
                                            tools=[EXEC, {"type": "code_interpreter", "container": {"type": "auto"}}])
    error = caught.value.body
    assert error["param"] == "tools[1].type" and "code_interpreter" in error["message"]
    assert not stack.stats.recent  # nothing went upstream


async def test_codex_default_request_capture_is_answered(aiohttp_server, vocab):
    """Codex 0.171's own first request, as captured: streamed, store false, encrypted reasoning asked
    for, a namespace and web_search among the tools. It used to fail with 400 on `tools[4].type`."""
    body = json.loads(CODEX_REQUEST.read_text())
    body.pop("_capture")
    stack = await start_stack(aiohttp_server, vocab, model=body["model"], replies={"say hi": "hi 👋"},
                              max_model_len=32768)
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/responses"), json=body) as answer:
        assert answer.status == 200, await answer.text()
        assert answer.headers["X-Dropped-Hosted-Tools"] == "web_search"
        frames = [json.loads(line[6:]) for line in (await answer.text()).splitlines() if line.startswith("data: ")]
    for frame in frames:
        STREAM_EVENT.validate_python(frame)
    final = frames[-1]["response"]
    assert frames[-1]["type"] == "response.completed" and final["store"] is False
    assert final["output"][0]["content"][0]["text"] == "hi 👋"
    sent = last_upstream_body(stack)
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert "multi_agent_v1__spawn_agent" in names and "exec_command" in names and len(names) == 12
    assert "client_metadata" not in sent and "prompt_cache_key" not in sent  # Responses-only fields stay here


# --- the custom tool input decoder (pure) ---------------------------------------------------------

# Explicit alphabet (see test_body_scan): quotes, backslashes, controls, astral characters.
_TEXT = st.text(alphabet=st.sampled_from(list('ab "\\/\n\t\x01é根🦀{}:')), max_size=40)


@settings(max_examples=300, deadline=None)
@given(text=_TEXT, ascii_only=st.booleans(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=8))
def test_streamed_custom_input_deltas_add_up_to_the_input_wherever_the_arguments_are_cut(text, ascii_only, cuts):
    arguments = json.dumps({"input": text}, ensure_ascii=ascii_only)
    bounds = sorted({min(cut, len(arguments)) for cut in cuts} | {0, len(arguments)})
    decoder = InputStream()
    deltas = [decoder.feed(arguments[a:b]) for a, b in itertools.pairwise(bounds)]
    whole, rest = decoder.done()
    assert whole == text and "".join(deltas) + rest == text


@pytest.mark.parametrize("arguments", ['{"path": "a", "input": "x"}', "plain words", '{"input": 3}',
                                       '{"input": "\\q"}'])
def test_arguments_that_are_not_the_expected_shape_still_give_one_whole_input(arguments):
    decoder = InputStream()
    deltas = [decoder.feed(piece) for piece in (arguments[:5], arguments[5:])]
    whole, rest = decoder.done()
    assert "".join(deltas) + rest == whole == custom_input(arguments)
