"""Pure pieces behind tools, structured output and reasoning: request mapping, token split, item events."""

from __future__ import annotations

import pytest

from gateway.canonical.step import ToolCallDelta, UpstreamFormatError
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.parse import ParseOptions
from gateway.logprobs.segment import split_content
from gateway.logprobs.tokens import Token
from gateway.translate.front_doors import generation_from_responses, responses_settings
from gateway.translate.request import (
    RequestTranslationError,
    chat_response_format,
    chat_tool_options,
    responses_to_messages,
)
from gateway.translate.response_object import ResponseSettings
from gateway.translate.stream import ResponsesStream
from gateway.upstreams.openai_compatible import chat_step


def _tokens(*pieces: bytes, special_last: bool = False) -> list[Token]:
    tokens = [Token(piece, -0.5, token_id=i) for i, piece in enumerate(pieces)]
    if special_last:
        tokens.append(Token(b"", -0.1, token_id=99, special=True))
    return tokens


# --- request mapping ------------------------------------------------------------------------------


def test_function_call_items_join_the_assistant_turn_and_outputs_become_tool_messages():
    body = {"input": [
        {"role": "user", "content": "weather?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_weather", "arguments": '{"city":"Paris"}'},
        {"type": "function_call", "call_id": "call_b", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "call_a", "output": "21"},
        {"type": "function_call_output", "call_id": "call_b",
         "output": [{"type": "input_text", "text": "2"}, {"type": "input_text", "text": "5"}]},
    ]}
    messages = responses_to_messages(body)
    assert messages == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}},
        ]},
        {"role": "tool", "tool_call_id": "call_a", "content": "21"},
        {"role": "tool", "tool_call_id": "call_b", "content": "25"},
    ]


def test_a_call_without_an_assistant_turn_before_it_gets_its_own_message():
    messages = responses_to_messages({"input": [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}]})
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def test_an_image_in_a_tool_output_is_refused_for_chat():
    with pytest.raises(RequestTranslationError) as caught:
        responses_to_messages({"input": [{"type": "function_call_output", "call_id": "c", "output": [
            {"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]})
    assert caught.value.param == "input[0].output"


def test_tools_are_re_nested_and_allowed_tools_become_a_subset():
    tools = [{"type": "function", "name": "a", "parameters": {"type": "object"}, "strict": True},
             {"type": "function", "name": "b", "description": "B"}]
    assert chat_tool_options({"tools": tools, "tool_choice": {"type": "function", "name": "b"},
                              "parallel_tool_calls": False}) == {
        "tools": [{"type": "function", "function": {"name": "a", "parameters": {"type": "object"}, "strict": True}},
                  {"type": "function", "function": {"name": "b", "description": "B"}}],
        "tool_choice": {"type": "function", "function": {"name": "b"}},
        "parallel_tool_calls": False,
    }
    allowed = {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "b"}]}
    options = chat_tool_options({"tools": tools, "tool_choice": allowed})
    assert [t["function"]["name"] for t in options["tools"]] == ["b"] and options["tool_choice"] == "auto"


def test_text_format_is_re_nested_for_chat():
    schema = {"type": "object"}
    flat = {"type": "json_schema", "name": "x", "schema": schema, "strict": True, "description": "d"}
    assert chat_response_format({"text": {"format": flat}}) == {
        "type": "json_schema", "json_schema": {"name": "x", "description": "d", "schema": schema, "strict": True}}
    assert chat_response_format({"text": {"format": {"type": "json_object"}}}) == {"type": "json_object"}
    assert chat_response_format({"text": {"format": {"type": "text"}}}) is None


def test_the_response_echoes_every_tool_field_and_numbers_never_null():
    body = {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}], "temperature": None,
            "reasoning": {"effort": "minimal"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}
    settings = responses_settings(body, generation_from_responses(body))
    assert settings.tools == [{"type": "function", "name": "f", "description": None, "parameters": None,
                               "strict": None}]
    assert settings.temperature == 1.0 and settings.top_p == 1.0
    assert settings.reasoning == {"effort": "low", "summary": None}  # the spec has no `minimal`
    assert settings.text_format == {"type": "json_schema", "name": "x", "schema": {"type": "object"},
                                    "description": None, "strict": False}


# --- which tokens are the message's ---------------------------------------------------------------


def test_the_text_run_is_found_after_the_reasoning_and_before_the_markup():
    tokens = _tokens(b"think", b" hard", b"</think>", b"\n\n", b"Hi", b"!", b"<tool_call>", b"{}",
                     special_last=True)
    segments = split_content(tokens, "\n\nHi!", skip=len(b"think hard"))
    assert [t.bytes for t in segments.before] == [b"think", b" hard", b"</think>"]
    assert [t.bytes for t in segments.content] == [b"\n\n", b"Hi", b"!"]
    assert [t.bytes for t in segments.after] == [b"<tool_call>", b"{}", b""]


def test_the_end_of_sequence_token_stays_with_the_text():
    segments = split_content(_tokens(b"ok", b"Hi", special_last=True), "Hi", skip=2)
    assert [t.bytes for t in segments.content] == [b"Hi", b""] and segments.exact


def test_a_character_cut_by_the_length_cap_stays_with_the_text():
    # The server's text never shows a character it did not finish; its tokens are still the text's.
    segments = split_content(_tokens(b"ok", b"Hi ", b"\xf0", b"\x9f"), "Hi ", skip=2)
    assert [t.bytes for t in segments.content] == [b"Hi ", b"\xf0", b"\x9f"] and segments.after == []


def test_the_text_inside_the_reasoning_is_not_taken_for_the_answer():
    tokens = _tokens(b"Yes", b".", b"Yes")
    segments = split_content(tokens, "Yes", skip=4)
    assert [t.token_id for t in segments.content] == [2]


def test_lossy_bytes_fall_back_to_byte_counts():
    tokens = [Token("\ufffd".encode(), -1.0), Token(b"A", -1.0), Token("\ufffd".encode(), -1.0)]
    segments = split_content(tokens, "B\xe9", skip=3)
    assert not segments.exact and len(segments.content) == 2


@pytest.mark.parametrize("field", ["reasoning", "reasoning_content"])
def test_a_whole_message_sets_the_thinking_tokens_aside(field):
    vocab = build_demo_vocab()
    thinking, answer = "Let me 根据 see.", "Hi 🦀!"
    ids = vocab.encode(thinking) + vocab.encode(answer)
    content = [{"token": f"token_id:{i}", "logprob": -0.5, "top_logprobs": []} for i in ids]
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer, field: thinking},
                         "logprobs": {"content": content}, "finish_reason": "stop"}]}
    step = chat_step(body, ParseOptions(vocab=vocab), streaming=False)
    assert step.reasoning == thinking and len(step.reasoning_tokens) == len(vocab.encode(thinking))
    assert b"".join(t.bytes for t in step.tokens) == answer.encode()


def test_a_chunk_that_starts_inside_a_held_character_splits_where_the_thinking_ends():
    vocab = build_demo_vocab()
    emoji = "🤔".encode()
    ids = vocab.encode("x🤔")
    # The previous chunk ended after the emoji's first bytes; this one brings the rest, "." and "Hi".
    head = [i for i in ids if vocab.token_bytes(i) and not emoji.startswith(vocab.token_bytes(i))]
    tail_ids = [i for i in vocab.encode("🤔")][1:] + vocab.encode(".") + vocab.encode("Hi")
    content = [{"token": f"token_id:{i}", "logprob": -0.5, "top_logprobs": []} for i in tail_ids]
    chunk = {"choices": [{"index": 0, "delta": {"reasoning": "🤔.", "content": "Hi"},
                          "logprobs": {"content": content}, "finish_reason": None}]}
    step = chat_step(chunk, ParseOptions(vocab=vocab), streaming=True)
    assert head  # the setup really split the emoji
    assert b"".join(t.bytes for t in step.tokens) == b"Hi"
    assert len(step.reasoning_tokens) == len(tail_ids) - len(vocab.encode("Hi"))


def test_tool_call_pieces_are_read_and_tgi_object_arguments_become_text():
    chunk = {"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "x1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
        "logprobs": None, "finish_reason": None}]}
    step = chat_step(chunk, ParseOptions(), streaming=True)
    assert step.tool_calls == [ToolCallDelta(0, "x1", "f", '{"a": 1}')] and step.tokens == []


# --- output items and their events ----------------------------------------------------------------


def _stream() -> ResponsesStream:
    return ResponsesStream(ResponseSettings(model="m", include_logprobs=True), response_id="resp_1", created_at=1)


def test_items_are_streamed_one_at_a_time_in_the_order_they_come():
    stream = _stream()
    events = stream.start()
    events += stream.feed_reasoning("Hmm", _tokens(b"Hmm"))
    events += stream.feed(_tokens(b"Hi"), "Hi")
    events += stream.feed_tool_calls([ToolCallDelta(0, "t0", None, "")])  # no name yet: waits
    events += stream.feed_tool_calls([ToolCallDelta(0, None, "f", '{"a":'), ToolCallDelta(0, None, None, "1}")])
    events += stream.finish("tool_calls", None)
    types = [(e["type"], e.get("output_index")) for e in events]
    assert types == [
        ("response.created", None), ("response.in_progress", None),
        ("response.output_item.added", 0), ("response.content_part.added", 0),
        ("response.reasoning_text.delta", 0), ("response.reasoning_text.done", 0),
        ("response.content_part.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.content_part.added", 1), ("response.output_text.delta", 1),
        ("response.output_text.done", 1), ("response.content_part.done", 1), ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.delta", 2), ("response.function_call_arguments.done", 2),
        ("response.output_item.done", 2), ("response.completed", None)]
    final = events[-1]["response"]
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    call = final["output"][2]
    assert call["call_id"] == "call_t0" and call["arguments"] == '{"a":1}' and call["name"] == "f"
    assert final["output"][1]["content"][0]["logprobs"][0]["token"] == "Hi"
    assert stream.reasoning_tokens == 1


def test_counted_reasoning_tokens_fill_in_usage_the_upstream_left_at_zero():
    stream = _stream()
    stream.feed_reasoning("Hmm", _tokens(b"H", b"mm"))
    usage = {"input_tokens": 1, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
             "output_tokens": 4, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 5}
    final = stream.final_response("stop", usage)
    assert final["usage"]["output_tokens_details"]["reasoning_tokens"] == 2


def test_a_call_continued_after_the_next_item_began_is_an_upstream_error():
    stream = _stream()
    stream.feed_tool_calls([ToolCallDelta(0, "a", "f", "{")])
    stream.feed_tool_calls([ToolCallDelta(1, "b", "g", "{")])
    with pytest.raises(UpstreamFormatError):
        stream.feed_tool_calls([ToolCallDelta(0, None, None, "}")])


def test_a_failure_mid_call_keeps_the_call_as_incomplete():
    stream = _stream()
    stream.start()
    stream.feed_tool_calls([ToolCallDelta(0, "a", "f", '{"x"')])
    [failed] = stream.fail("upstream went away")
    assert failed["response"]["output"][0]["status"] == "incomplete"
