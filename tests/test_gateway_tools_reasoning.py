"""Function tools, structured output and reasoning, end to end: OpenAI SDK (strict) -> gateway -> vLLM simulator.

The simulator scripts what a model with vLLM's tool and reasoning parsers would send (see
gateway/simulator/scripted.py): logprobs cover the thinking and the tool-call markup too, and the
gateway must keep only the message text's tokens.
"""

import json

import pytest
from openai import BadRequestError
from openai.types.responses import ResponseStreamEvent
from pydantic import BaseModel, TypeAdapter

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import LOGPROBS, assert_exact_logprobs, chatml_template, last_upstream_body, start_stack
from tests.e2e import create_response as _create

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)

WEATHER_TOOL = {
    "type": "function", "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                   "additionalProperties": False},
    "strict": True,
}
CHAT_TOOL = {"type": "function", "function": {k: WEATHER_TOOL[k] for k in ("name", "description", "parameters")}}
QUESTION = "What is the weather in Paris?"
TOOL_RESULT = '{"temp_c": 21, "sky": "☀️"}'
ANSWER = "It is 21 °C and sunny ☀️ in Paris."
THINKING = "The user wants 根据 weather 🤔; call the tool."
REPLIES = {
    QUESTION: {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
    TOOL_RESULT: ANSWER,
    "think first": {"reasoning": THINKING, "content": "Answer: 42 🦀."},
    "think then call": {"reasoning": THINKING, "tool_call": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
    "two calls": {"content": "Checking both.", "tool_calls": [
        {"name": "get_weather", "arguments": {"city": "Paris"}},
        {"name": "get_weather", "arguments": {"city": "Rome"}}]},
    "json please": '{"city": "Paris", "temp_c": 21}',
}


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()



@pytest.mark.parametrize("stream", [False, True])
async def test_two_turn_tool_call_with_the_history_sent_back(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    first, raw = await _create(stack, stream, input=QUESTION, tools=[WEATHER_TOOL], include=LOGPROBS,
                               top_logprobs=2, parallel_tool_calls=False)
    [call] = first.output
    assert call.type == "function_call" and call.name == "get_weather" and call.status == "completed"
    assert call.id.startswith("fc_") and call.call_id.startswith("call_")
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert first.status == "completed" and first.tools[0].name == "get_weather"
    sent = last_upstream_body(stack)
    assert sent["tools"] == [{"type": "function", "function": {k: WEATHER_TOOL[k] for k in
                                                               ("name", "description", "parameters", "strict")}}]
    assert sent["parallel_tool_calls"] is False
    if stream:
        types = [frame["type"] for frame in raw]
        assert types[2:] == ["response.output_item.added"] + ["response.function_call_arguments.delta"] * (
            len(types) - 6) + ["response.function_call_arguments.done", "response.output_item.done",
                               "response.completed"]
        assert raw[2]["item"]["arguments"] == "" and raw[2]["item"]["status"] == "in_progress"
        deltas = [frame["delta"] for frame in raw if frame["type"] == "response.function_call_arguments.delta"]
        assert len(deltas) > 1 and "".join(deltas) == call.arguments
        done = next(frame for frame in raw if frame["type"] == "response.function_call_arguments.done")
        assert done["name"] == "get_weather" and done["arguments"] == call.arguments and done["item_id"] == call.id

    history = [{"role": "user", "content": QUESTION}, *first.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}]
    second, _ = await _create(stack, stream, input=history, tools=[WEATHER_TOOL], include=LOGPROBS, top_logprobs=2)
    assert second.output_text == ANSWER
    assert_exact_logprobs(second.output[0].content[0], 2)
    messages = last_upstream_body(stack)["messages"]
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.call_id, "type": "function", "function": {"name": "get_weather", "arguments": call.arguments}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": call.call_id, "content": TOOL_RESULT}


@pytest.mark.parametrize("stream", [False, True])
async def test_text_then_two_calls_come_as_three_items_in_order(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step=2)
    response, raw = await _create(stack, stream, input="two calls", tools=[WEATHER_TOOL], include=LOGPROBS)
    assert [item.type for item in response.output] == ["message", "function_call", "function_call"]
    assert response.output_text == "Checking both."
    assert_exact_logprobs(response.output[0].content[0], 0)  # the markup's tokens are not the message's
    assert [json.loads(item.arguments)["city"] for item in response.output[1:]] == ["Paris", "Rome"]
    if stream:  # one item at a time: each is done before the next is added
        items = [(f["type"], f["output_index"]) for f in raw if f["type"].startswith("response.output_item")]
        assert items == [("response.output_item.added", 0), ("response.output_item.done", 0),
                         ("response.output_item.added", 1), ("response.output_item.done", 1),
                         ("response.output_item.added", 2), ("response.output_item.done", 2)]


async def test_tool_choice_is_re_nested_for_chat(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    named = {"type": "function", "name": "get_weather"}
    response = await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL],
                                                   tool_choice=named)
    assert last_upstream_body(stack)["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert response.tool_choice.name == "get_weather"
    other = {**WEATHER_TOOL, "name": "get_time"}
    allowed = {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]}
    await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL, other],
                                        tool_choice=allowed)
    sent = last_upstream_body(stack)
    assert sent["tool_choice"] == "required" and [t["function"]["name"] for t in sent["tools"]] == ["get_time"]


async def test_a_length_cap_inside_a_call_leaves_it_incomplete(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    stream = await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL],
                                                 max_output_tokens=16, stream=True)
    events = [event async for event in stream]
    final = events[-1].response
    assert events[-1].type == "response.incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    [call] = final.output  # streamed as it was written, then cut short
    assert call.type == "function_call" and call.status == "incomplete"
    assert '{"city": "Paris"}'.startswith(call.arguments)
    # Whole, the tool parser cannot read half a call: what the model wrote comes back as text.
    whole = await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL],
                                                max_output_tokens=16)
    assert whole.status == "incomplete" and [item.type for item in whole.output] == ["message"]
    assert whole.output_text.startswith("<tool_call>")


async def test_tools_on_a_completions_route_are_refused_before_reaching_the_upstream(aiohttp_server, vocab, tmp_path):
    stack = await start_stack(aiohttp_server, vocab, api="completions", chat_template=chatml_template(tmp_path))
    with pytest.raises(BadRequestError) as caught:
        await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL])
    error = caught.value.body
    assert error["code"] == "unsupported_parameter" and error["param"] == "tools"
    with pytest.raises(BadRequestError) as caught:
        await stack.client.chat.completions.create(model=stack.model, messages=[{"role": "user", "content": "x"}],
                                                   tools=[CHAT_TOOL])
    assert caught.value.body["param"] == "tools"
    assert list(stack.stats.recent) == []


# --- structured output ----------------------------------------------------------------------------


class CityWeather(BaseModel):
    city: str
    temp_c: int


@pytest.mark.parametrize("stream", [False, True])
async def test_json_schema_output_parses_and_the_format_is_re_nested(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    schema = CityWeather.model_json_schema() | {"additionalProperties": False}
    text = {"format": {"type": "json_schema", "name": "city_weather", "schema": schema, "strict": True}}
    response, _ = await _create(stack, stream, input="json please", text=text, include=LOGPROBS)
    assert CityWeather.model_validate_json(response.output_text) == CityWeather(city="Paris", temp_c=21)
    assert response.text.format.type == "json_schema" and response.text.format.schema_ == schema
    assert response.text.format.strict is True and response.text.format.name == "city_weather"
    assert last_upstream_body(stack)["response_format"] == {
        "type": "json_schema", "json_schema": {"name": "city_weather", "schema": schema, "strict": True}}


async def test_sdk_parse_helper_gets_a_parsed_object(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    parsed = await stack.client.responses.parse(model=stack.model, input="json please", text_format=CityWeather)
    assert parsed.output_parsed == CityWeather(city="Paris", temp_c=21)


async def test_json_object_format(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    response = await stack.client.responses.create(model=stack.model, input="json please",
                                                   text={"format": {"type": "json_object"}})
    assert json.loads(response.output_text)["city"] == "Paris"
    assert response.text.format.type == "json_object"
    assert last_upstream_body(stack)["response_format"] == {"type": "json_object"}


# --- reasoning ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tokens_per_step", [1, "vary", 4])
async def test_reasoning_item_comes_first_and_its_tokens_never_reach_the_logprobs(
        aiohttp_server, vocab, field, stream, tokens_per_step):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, reasoning_field=field,
                              tokens_per_step=tokens_per_step)
    response, raw = await _create(stack, stream, input="think first", include=LOGPROBS, top_logprobs=3)
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(part.type, part.text) for part in reasoning.content] == [("reasoning_text", THINKING)]
    assert message.type == "message" and response.output_text == "Answer: 42 🦀."
    assert_exact_logprobs(message.content[0], 3)  # exactly the answer's bytes: no thinking token leaked
    thinking_tokens = len(vocab.encode(THINKING))
    assert response.usage.output_tokens_details.reasoning_tokens == thinking_tokens
    assert len(message.content[0].logprobs) == response.usage.output_tokens - thinking_tokens - 1  # EOS
    if stream:
        types = [frame["type"] for frame in raw]
        n = types.count("response.reasoning_text.delta")
        assert types[2:6 + n] == ["response.output_item.added", "response.content_part.added",
                                  *["response.reasoning_text.delta"] * n, "response.reasoning_text.done",
                                  "response.content_part.done"]
        assert types[6 + n:9 + n] == ["response.output_item.done", "response.output_item.added",
                                      "response.content_part.added"]
        deltas = [frame["delta"] for frame in raw if frame["type"] == "response.reasoning_text.delta"]
        assert "".join(deltas) == THINKING
        assert raw[2]["item"]["type"] == "reasoning" and raw[3]["part"] == {"type": "reasoning_text", "text": ""}
        assert {frame["output_index"] for frame in raw if frame["type"] == "response.output_text.delta"} == {1}


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_without_a_tokenizer_keeps_the_answer_right(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokenizer={}, tokens_per_step="vary")
    response, _ = await _create(stack, stream, input="think first", include=LOGPROBS, top_logprobs=2)
    assert response.output[0].content[0].text == THINKING
    part = response.output[1].content[0]
    assert part.text == "Answer: 42 🦀."
    if not stream:  # the whole text is known: alignment recovers every byte
        assert b"".join(bytes(e.bytes) for e in part.logprobs) == part.text.encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_reasoning_then_a_tool_call(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    response, _ = await _create(stack, stream, input="think then call", tools=[WEATHER_TOOL], include=LOGPROBS)
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert json.loads(response.output[1].arguments) == {"city": "Oslo"}
    assert response.usage.output_tokens_details.reasoning_tokens == len(vocab.encode(THINKING))
    # The reasoning item can go back as input: it is dropped for the chat upstream.
    history = [{"role": "user", "content": "think then call"}, *response.output,
               {"type": "function_call_output", "call_id": response.output[1].call_id, "output": TOOL_RESULT}]
    second, _ = await _create(stack, stream, input=history, tools=[WEATHER_TOOL])
    assert second.output_text == ANSWER
    assert [m["role"] for m in last_upstream_body(stack)["messages"]] == ["user", "assistant", "tool"]


async def test_a_function_call_output_must_answer_an_earlier_function_call(aiohttp_server, vocab):
    """As OpenAI: an output whose call_id no earlier call (in `input` or the previous_response_id chain)
    has is a 400 naming the item, before anything reaches the upstream."""
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    first = await stack.client.responses.create(model=stack.model, input=QUESTION, tools=[WEATHER_TOOL])
    [call] = first.output
    orphan = {"type": "function_call_output", "call_id": "call_nobody_made", "output": TOOL_RESULT}
    answer = {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}
    sent_before = len(stack.stats.recent)
    refused = [
        ({"input": [{"role": "user", "content": QUESTION}, orphan]}, "input[1].call_id", "call_nobody_made"),
        # the output before its call does not answer it
        ({"input": [answer, *[item.model_dump(exclude_none=True) for item in first.output]]}, "input[0].call_id",
         call.call_id),
        # a chain whose stored output holds a different call
        ({"previous_response_id": first.id, "input": [answer, orphan]}, "input[1].call_id", "call_nobody_made"),
    ]
    for params, param, call_id in refused:
        with pytest.raises(BadRequestError) as caught:
            await stack.client.responses.create(model=stack.model, tools=[WEATHER_TOOL], **params)
        error = caught.value.body
        assert error["param"] == param and error["type"] == "invalid_request_error"
        assert error["message"] == f"No tool call found for function call output with call_id {call_id}."
    assert len(stack.stats.recent) == sent_before
    # The call in the previous response's output is what the output answers.
    second = await stack.client.responses.create(model=stack.model, previous_response_id=first.id, input=[answer],
                                                 tools=[WEATHER_TOOL])
    assert second.output_text == ANSWER


# --- the chat front door --------------------------------------------------------------------------



async def test_chat_front_door_passes_tools_and_returns_tool_calls(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES)
    completion = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": QUESTION}], tools=[CHAT_TOOL],
        tool_choice="auto", logprobs=True)
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.logprobs.content == []  # the markup is no message text
    assert last_upstream_body(stack)["tools"] == [CHAT_TOOL]
    assert last_upstream_body(stack)["tool_choice"] == "auto"


async def test_chat_front_door_streams_tool_call_pieces(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    stream = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": QUESTION}], tools=[CHAT_TOOL], stream=True)
    chunks = [chunk async for chunk in stream]
    pieces = [call for c in chunks if c.choices and c.choices[0].delta.tool_calls
              for call in c.choices[0].delta.tool_calls]
    assert pieces[0].id and pieces[0].function.name == "get_weather" and pieces[0].type == "function"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == {"city": "Paris"}
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


async def test_chat_front_door_sets_reasoning_aside(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    completion = await stack.client.chat.completions.create(
        model=stack.model, messages=[{"role": "user", "content": "think first"}], logprobs=True, top_logprobs=1)
    message = completion.choices[0].message
    assert message.content == "Answer: 42 🦀." and message.model_extra["reasoning_content"] == THINKING
    entries = completion.choices[0].logprobs.content
    assert b"".join(bytes(e.bytes) for e in entries) == message.content.encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_a_length_cap_while_thinking_leaves_only_an_incomplete_reasoning_item(aiohttp_server, vocab, stream):
    stack = await start_stack(aiohttp_server, vocab, replies=REPLIES, tokens_per_step="vary")
    if stream:
        events = await stack.client.responses.create(model=stack.model, input="think first", max_output_tokens=6,
                                                     include=LOGPROBS, stream=True)
        response = [event async for event in events][-1].response
    else:
        response = await stack.client.responses.create(model=stack.model, input="think first", max_output_tokens=6,
                                                       include=LOGPROBS)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [reasoning] = response.output
    assert reasoning.type == "reasoning" and reasoning.status == "incomplete"
    assert THINKING.startswith(reasoning.content[0].text)
    assert response.usage.output_tokens_details.reasoning_tokens == 6
