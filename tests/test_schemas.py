"""The wire models against both contracts: the OpenAI SDK types and the Open Responses spec.

Bodies are built with our models, dumped to JSON-ready dicts, then validated by the OpenAI SDK's
pydantic types and, for Responses, by JSON Schema (Draft 2020-12) against the Open Responses
OpenAPI document, read in place from /work/shared (skipped when that folder is absent).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai.types
import openai.types.chat
import openai.types.responses
import pytest
from pydantic import BaseModel, TypeAdapter, ValidationError
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from schemas.chat import (
    ChatChoice,
    ChatChoiceLogprobs,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionMessage,
    ChatCompletionRequest,
    ChatDelta,
    ChatTokenLogprob,
    ChatTopLogprob,
)
from schemas.completions import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    CompletionLogprobs,
    CompletionRequest,
    CompletionUsage,
)
from schemas.errors import ErrorResponse, validation_error_to_openai
from schemas.responses import (
    ContentPartAddedEvent,
    ContentPartDoneEvent,
    ErrorEvent,
    FunctionCall,
    FunctionCallArgumentsDeltaEvent,
    FunctionCallArgumentsDoneEvent,
    IncompleteDetails,
    LogProb,
    OutputItemAddedEvent,
    OutputItemDoneEvent,
    OutputMessage,
    OutputText,
    OutputTextDeltaEvent,
    OutputTextDoneEvent,
    ReasoningItem,
    ReasoningText,
    ReasoningTextDeltaEvent,
    ReasoningTextDoneEvent,
    Response,
    ResponseCompletedEvent,
    ResponseCreatedEvent,
    ResponseError,
    ResponseFailedEvent,
    ResponseIncompleteEvent,
    ResponseInProgressEvent,
    ResponseStreamEvent,
    TextConfig,
    TextFormatJsonSchema,
    TopLogProb,
    Usage,
)
from schemas.responses_request import CreateResponseRequest, extra_fields

SPEC_PATH = Path(__file__).resolve().parents[2] / "shared" / "reference" / "openresponses-openapi.json"
SPEC_URI = "urn:openresponses-openapi"

SDK_STREAM_EVENT = TypeAdapter(openai.types.responses.ResponseStreamEvent)
OUR_STREAM_EVENT = TypeAdapter(ResponseStreamEvent)

RESP_ID = "resp_0123456789abcdef"
MSG_ID = "msg_0123456789abcdef"
FC_ID = "fc_0123456789abcdef"
RS_ID = "rs_0123456789abcdef"
CREATED_AT = 1_760_000_000


# --- the Open Responses spec, read in place -------------------------------------------------


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    if not SPEC_PATH.is_file():
        pytest.skip(f"Open Responses spec not found at {SPEC_PATH} (/work/shared absent): spec checks skipped")
    return json.loads(SPEC_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def spec_registry(spec: dict[str, Any]) -> Registry:
    # The whole document is one resource, so "#/components/schemas/..." refs resolve anywhere in it.
    return Registry().with_resource(SPEC_URI, Resource(contents=spec, specification=DRAFT202012))


def validate_against_spec(registry: Registry, schema_name: str, instance: dict[str, Any]) -> None:
    schema = {"$ref": f"{SPEC_URI}#/components/schemas/{schema_name}"}
    jsonschema.Draft202012Validator(schema, registry=registry).validate(instance)


def spec_event_schema_name(spec: dict[str, Any], event_type: str) -> str:
    """The spec schema whose ``type`` enum is exactly ``event_type``.

    ``error`` is also the type of ``WebSocketErrorEvent``; stream events are the ones with a
    ``sequence_number``.
    """
    names = [
        name
        for name, schema in spec["components"]["schemas"].items()
        if isinstance(schema, dict)
        and schema.get("properties", {}).get("type", {}).get("enum") == [event_type]
        and "sequence_number" in schema.get("properties", {})
    ]
    assert len(names) == 1, f"expected one spec schema for {event_type!r}, found {names}"
    return names[0]


# Known conflict: the SDK's reasoning text events are the spec's `response.reasoning.*` under
# another name (each side rejects the other's); we send the SDK's and check the shape as the spec's.
SPEC_EVENT_NAME = {"response.reasoning_text.delta": "response.reasoning.delta",
                   "response.reasoning_text.done": "response.reasoning.done"}


def validate_event_against_spec(spec: dict[str, Any], registry: Registry, body: dict[str, Any]) -> None:
    spec_type = SPEC_EVENT_NAME.get(body["type"], body["type"])
    validate_against_spec(registry, spec_event_schema_name(spec, spec_type), {**body, "type": spec_type})


# --- bodies ----------------------------------------------------------------------------------

# "Hi👋" generated as three byte-level tokens; the emoji's 4 bytes are split 3 + 1, so the
# middle token is not valid UTF-8 alone and is spelled with literal \xNN escapes.
TEXT = "Hi👋"
TOKENS = [("Hi", [72, 105], -0.31), ("\\xf0\\x9f\\x91", [240, 159, 145], -1.2), ("\\x8b", [139], 0.0)]


def logprobs() -> list[LogProb]:
    return [
        LogProb(
            token=token,
            bytes=raw,
            logprob=logprob,
            top_logprobs=[
                TopLogProb(token=token, bytes=raw, logprob=logprob),
                TopLogProb(token=" there", bytes=list(b" there"), logprob=-9.5),
            ],
        )
        for token, raw, logprob in TOKENS
    ]


def response(**changes: Any) -> Response:
    """A finished response to ``include: ["message.output_text.logprobs"], top_logprobs: 2``."""
    fields: dict[str, Any] = {
        "id": RESP_ID,
        "created_at": CREATED_AT,
        "completed_at": CREATED_AT + 2,
        "status": "completed",
        "model": "qwen3-8b",
        "output": [OutputMessage(id=MSG_ID, status="completed", content=[OutputText(text=TEXT, logprobs=logprobs())])],
        "usage": Usage(input_tokens=9, output_tokens=3, total_tokens=12),
        "top_logprobs": 2,
        "max_output_tokens": 4,
        "metadata": {"run": "42"},
    }
    fields.update(changes)
    return Response(**fields)


def in_progress() -> Response:
    return response(status="in_progress", completed_at=None, output=[], usage=None)


def text_stream() -> list[BaseModel]:
    """Every event of a streamed text response, in order, with logprobs."""
    entries = logprobs()
    done_message = response().output[0]
    where = {"item_id": MSG_ID, "output_index": 0, "content_index": 0}
    events: list[BaseModel] = [
        ResponseCreatedEvent(sequence_number=0, response=in_progress()),
        ResponseInProgressEvent(sequence_number=1, response=in_progress()),
        OutputItemAddedEvent(
            sequence_number=2,
            output_index=0,
            item=OutputMessage(id=MSG_ID, status="in_progress", content=[]),
        ),
        ContentPartAddedEvent(sequence_number=3, **where, part=OutputText(text="")),
        OutputTextDeltaEvent(sequence_number=4, **where, delta="Hi", logprobs=entries[:1]),
        # The partial emoji token: no text yet, but its logprob (with bytes) goes out now.
        OutputTextDeltaEvent(sequence_number=5, **where, delta="", logprobs=entries[1:2]),
        OutputTextDeltaEvent(sequence_number=6, **where, delta="👋", logprobs=entries[2:]),
        OutputTextDoneEvent(sequence_number=7, **where, text=TEXT, logprobs=entries),
        ContentPartDoneEvent(sequence_number=8, **where, part=OutputText(text=TEXT, logprobs=entries)),
        OutputItemDoneEvent(sequence_number=9, output_index=0, item=done_message),
        ResponseCompletedEvent(sequence_number=10, response=response()),
    ]
    return events


def other_events() -> list[BaseModel]:
    """Events of the other endings: length cap, failure, and a tool call."""
    call = FunctionCall(
        id=FC_ID, call_id="call_abc", name="get_weather", arguments='{"city":"Paris"}', status="completed"
    )
    cut = response(
        status="incomplete",
        completed_at=None,
        incomplete_details=IncompleteDetails(reason="max_output_tokens"),
        output=[OutputMessage(id=MSG_ID, status="incomplete", content=[OutputText(text="Hi")])],
    )
    failed = response(
        status="failed",
        completed_at=None,
        usage=None,
        output=[],
        error=ResponseError(code="server_error", message="upstream closed the connection"),
    )
    return [
        OutputItemAddedEvent(
            sequence_number=2, output_index=0, item=call.model_copy(update={"status": "in_progress", "arguments": ""})
        ),
        FunctionCallArgumentsDeltaEvent(sequence_number=3, item_id=FC_ID, output_index=0, delta='{"city":'),
        FunctionCallArgumentsDoneEvent(
            sequence_number=4, item_id=FC_ID, output_index=0, name="get_weather", arguments=call.arguments
        ),
        OutputItemDoneEvent(sequence_number=5, output_index=0, item=call),
        *reasoning_events(),
        ResponseIncompleteEvent(sequence_number=9, response=cut),
        ErrorEvent(sequence_number=5, code="server_error", message="upstream closed the connection"),
        ResponseFailedEvent(sequence_number=6, response=failed),
    ]


def reasoning_events() -> list[BaseModel]:
    """A reasoning item's events: added, its reasoning_text part, deltas, done."""
    thinking = "Think 🤔"
    where = {"item_id": RS_ID, "output_index": 0, "content_index": 0}
    done = ReasoningItem(id=RS_ID, status="completed", content=[ReasoningText(text=thinking)])
    return [
        OutputItemAddedEvent(sequence_number=2, output_index=0, item=ReasoningItem(id=RS_ID, status="in_progress")),
        ContentPartAddedEvent(sequence_number=3, **where, part=ReasoningText(text="")),
        ReasoningTextDeltaEvent(sequence_number=4, **where, delta=thinking),
        ReasoningTextDoneEvent(sequence_number=5, **where, text=thinking),
        ContentPartDoneEvent(sequence_number=6, **where, part=ReasoningText(text=thinking)),
        OutputItemDoneEvent(sequence_number=7, output_index=0, item=done),
    ]


ALL_EVENTS = text_stream() + other_events()


def dump(model: BaseModel) -> dict[str, Any]:
    # Through real JSON text, as a client would receive it.
    return json.loads(json.dumps(model.model_dump(mode="json"), ensure_ascii=False))


# --- Responses: response object ---------------------------------------------------------------


def test_response_with_partial_utf8_token_validates_against_sdk_and_spec(spec_registry: Registry) -> None:
    body = dump(response())

    sdk = openai.types.responses.Response.model_validate(body)
    part = sdk.output[0].content[0]
    assert part.logprobs is not None
    assert part.logprobs[1].token == "\\xf0\\x9f\\x91"
    assert part.logprobs[1].bytes == [240, 159, 145]
    assert part.logprobs[1].top_logprobs[0].bytes == [240, 159, 145]
    validate_against_spec(spec_registry, "ResponseResource", body)


def test_response_logprob_bytes_rebuild_the_text_exactly() -> None:
    part = response().output[0].content[0]
    assert b"".join(bytes(entry.bytes) for entry in part.logprobs) == part.text.encode()


def test_response_survives_a_json_round_trip() -> None:
    original = response()
    assert Response.model_validate_json(original.model_dump_json()) == original


def test_response_model_sends_every_field_either_contract_requires(spec: dict[str, Any]) -> None:
    spec_required = set(spec["components"]["schemas"]["ResponseResource"]["required"])
    sdk_required = {name for name, field in openai.types.responses.Response.model_fields.items() if field.is_required()}
    ours = set(Response.model_json_schema(mode="serialization")["required"])
    sent = set(dump(response()))

    assert spec_required <= ours, spec_required - ours
    assert sdk_required <= ours, sdk_required - ours
    assert spec_required | sdk_required | {"user"} <= sent


def test_in_progress_snapshot_has_no_output_or_usage(spec_registry: Registry) -> None:
    body = dump(in_progress())
    assert body["output"] == [] and body["usage"] is None and body["completed_at"] is None
    openai.types.responses.Response.model_validate(body)
    validate_against_spec(spec_registry, "ResponseResource", body)


def test_json_schema_text_format_follows_the_sdk_where_the_spec_types_schema_as_null(
    spec_registry: Registry,
) -> None:
    """Known conflict: the spec's JsonSchemaResponseFormat says ``schema: {type: null}``."""
    text = TextConfig(format=TextFormatJsonSchema(name="weather", schema={"type": "object"}, strict=True))
    body = dump(response(text=text))

    assert body["text"]["format"]["schema"] == {"type": "object"}
    openai.types.responses.Response.model_validate(body)
    with pytest.raises(jsonschema.ValidationError):
        validate_against_spec(spec_registry, "JsonSchemaResponseFormat", body["text"]["format"])


def test_output_text_without_logprobs_still_sends_an_empty_list() -> None:
    assert dump(OutputText(text="Hi"))["logprobs"] == []


# --- Responses: stream events --------------------------------------------------------------


def test_text_stream_numbers_events_from_zero_without_gaps() -> None:
    assert [event.sequence_number for event in text_stream()] == list(range(len(text_stream())))


def test_every_event_type_we_emit_has_a_sample() -> None:
    emitted = {event.type for event in ALL_EVENTS}
    modelled = {OUR_STREAM_EVENT.validate_python(dump(event)).type for event in ALL_EVENTS}
    assert emitted == modelled
    assert emitted == {
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.content_part.added",
        "response.content_part.done",
        "response.output_text.delta",
        "response.output_text.done",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.completed",
        "response.incomplete",
        "response.failed",
        "error",
    }


@pytest.mark.parametrize("event", ALL_EVENTS, ids=lambda e: f"{e.sequence_number}-{e.type}")
def test_stream_event_validates_against_sdk_and_spec(
    event: BaseModel, spec: dict[str, Any], spec_registry: Registry
) -> None:
    body = dump(event)

    sdk = SDK_STREAM_EVENT.validate_python(body)
    assert sdk.type == body["type"]
    validate_event_against_spec(spec, spec_registry, body)
    assert OUR_STREAM_EVENT.validate_python(body) == event


def test_delta_logprobs_carry_bytes_that_the_sdk_keeps_as_extra() -> None:
    delta = text_stream()[5]
    assert isinstance(delta, OutputTextDeltaEvent)
    body = dump(delta)
    assert body["delta"] == ""
    assert body["logprobs"][0]["bytes"] == [240, 159, 145]

    sdk = SDK_STREAM_EVENT.validate_python(body)
    assert sdk.logprobs[0].model_extra == {"bytes": [240, 159, 145]}


def test_error_event_carries_the_error_flat_for_the_sdk_and_nested_for_the_spec() -> None:
    nested_only = ErrorEvent.model_validate(
        {
            "type": "error",
            "sequence_number": 7,
            "error": {"type": "server_error", "code": "upstream_timeout", "message": "timed out", "param": None},
        }
    )
    assert (nested_only.code, nested_only.message, nested_only.param) == ("upstream_timeout", "timed out", None)

    with pytest.raises(ValidationError, match="must equal"):
        ErrorEvent.model_validate(
            {
                "sequence_number": 7,
                "message": "one thing",
                "error": {"type": "server_error", "code": None, "message": "another", "param": None},
            }
        )


# --- Chat Completions ------------------------------------------------------------------------


def chat_logprobs() -> ChatChoiceLogprobs:
    return ChatChoiceLogprobs(
        content=[
            ChatTokenLogprob(
                token=token,
                logprob=logprob,
                bytes=raw,
                top_logprobs=[ChatTopLogprob(token=token, logprob=logprob, bytes=raw)],
            )
            for token, raw, logprob in TOKENS
        ]
        # TGI and llama.cpp have no bytes for a candidate; the wire allows null.
        + [ChatTokenLogprob(token="!", logprob=-9999.0, bytes=None, top_logprobs=[])],
        refusal=None,
    )


def test_chat_completion_with_logprobs_validates_against_sdk() -> None:
    body = dump(
        ChatCompletion(
            id="chatcmpl-1",
            created=CREATED_AT,
            model="qwen3-8b",
            choices=[
                ChatChoice(
                    index=0,
                    message=ChatCompletionMessage(content=TEXT + "!"),
                    logprobs=chat_logprobs(),
                    finish_reason="stop",
                )
            ],
            usage=CompletionUsage(prompt_tokens=9, completion_tokens=4, total_tokens=13),
        )
    )

    sdk = openai.types.chat.ChatCompletion.model_validate(body)
    content = sdk.choices[0].logprobs.content
    assert content[1].bytes == [240, 159, 145]
    assert content[3].bytes is None and content[3].logprob == -9999.0


def test_chat_completion_chunk_with_logprobs_validates_against_sdk() -> None:
    chunk = ChatCompletionChunk(
        id="chatcmpl-1",
        created=CREATED_AT,
        model="qwen3-8b",
        choices=[
            ChatChunkChoice(
                index=0,
                delta=ChatDelta(content=""),
                logprobs=ChatChoiceLogprobs(content=chat_logprobs().content[1:2]),
            )
        ],
    )
    usage_only = ChatCompletionChunk(
        id="chatcmpl-1",
        created=CREATED_AT,
        model="qwen3-8b",
        choices=[],
        usage=CompletionUsage(prompt_tokens=9, completion_tokens=4, total_tokens=13),
    )
    for body in (dump(chunk), dump(usage_only)):
        openai.types.chat.ChatCompletionChunk.model_validate(body)


def test_chat_models_keep_vendor_keys_from_upstream() -> None:
    chunk = ChatCompletionChunk.model_validate(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "created": CREATED_AT,
            "model": "m",
            "choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "stop_reason": None}],
        }
    )
    assert chunk.choices[0].delta.model_extra == {"reasoning_content": "hmm"}


# --- Completions -------------------------------------------------------------------------------


def test_completion_with_logprobs_validates_against_sdk() -> None:
    completion = Completion(
        id="cmpl-1",
        created=CREATED_AT,
        model="qwen3-8b",
        choices=[
            CompletionChoice(
                index=0,
                text=" world",
                logprobs=CompletionLogprobs(
                    tokens=[" world"],
                    token_logprobs=[-0.5],
                    top_logprobs=[{" world": -0.5, " there": -1.9}],
                    text_offset=[5],
                ),
                finish_reason="length",
            )
        ],
        usage=CompletionUsage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
    )
    chunk = CompletionChunk.model_validate(dump(completion))

    openai.types.Completion.model_validate(dump(completion))
    openai.types.Completion.model_validate(dump(chunk))


def test_completion_echo_keeps_null_logprobs_of_the_first_prompt_token() -> None:
    """Our model only: ``openai.types.Completion`` rejects null entries (its arrays are floats)."""
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": CREATED_AT,
        "model": "qwen3-8b",
        "choices": [
            {
                "index": 0,
                "text": "Hello world",
                "finish_reason": "length",
                "logprobs": {
                    "tokens": ["Hello", " world"],
                    "token_logprobs": [None, -0.5],
                    "top_logprobs": [None, {" world": -0.5, " there": -1.9}],
                    "text_offset": [0, 5],
                },
            }
        ],
    }
    completion = Completion.model_validate(body)
    assert completion.choices[0].logprobs is not None
    assert completion.choices[0].logprobs.token_logprobs[0] is None
    assert completion.choices[0].logprobs.top_logprobs == [None, {" world": -0.5, " there": -1.9}]
    assert dump(completion)["choices"][0]["logprobs"] == body["choices"][0]["logprobs"]


# --- Responses request -------------------------------------------------------------------------

VALID_REQUESTS = {
    "string input": {"model": "m", "input": "Say hi"},
    "no input, previous response": {"model": "m", "previous_response_id": RESP_ID},
    "four output tokens (vLLM scoring)": {"model": "m", "input": "x", "max_output_tokens": 4},
    "integer temperature": {"model": "m", "input": "x", "temperature": 1, "top_p": 0.5},
    "logprobs": {"model": "m", "input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 20},
    "message items": {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "system", "content": "You are terse."},
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "No emoji."}]},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://example.com/cat.png", "detail": "low"},
                ],
            },
        ],
    },
    "assistant history is our own output": {
        "model": "m",
        "input": [
            {"role": "user", "content": "Hi"},
            dump(response().output[0]),
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "user", "content": "Again"},
        ],
    },
    "tool round trip": {
        "model": "m",
        "input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": '{"temp_c": 21}'},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Current weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                "strict": True,
            }
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "parallel_tool_calls": False,
    },
    "every option": {
        "model": "m",
        "input": "x",
        "stream": True,
        "stream_options": {"include_obfuscation": False},
        "store": False,
        "background": False,
        "metadata": {"k": "v"},
        "user": "u-1",
        "text": {"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}, "verbosity": "low"},
        "reasoning": {"effort": "minimal", "summary": "auto"},
        "truncation": "auto",
        "service_tier": "flex",
        "tool_choice": "none",
        "presence_penalty": -0.5,
        "frequency_penalty": 2,
        "max_tool_calls": 3,
        "safety_identifier": "s",
        "prompt_cache_key": "p",
    },
    "vendor fields": {"model": "m", "input": "x", "top_k": 20, "ignore_eos": True, "repetition_penalty": 1.1},
}


@pytest.mark.parametrize("body", VALID_REQUESTS.values(), ids=VALID_REQUESTS.keys())
def test_valid_request_passes(body: dict[str, Any]) -> None:
    CreateResponseRequest.model_validate(body)


def test_extra_fields_are_only_the_unknown_vendor_fields() -> None:
    request = CreateResponseRequest.model_validate(VALID_REQUESTS["vendor fields"])
    assert extra_fields(request) == {"top_k": 20, "ignore_eos": True, "repetition_penalty": 1.1}
    assert extra_fields(CreateResponseRequest.model_validate(VALID_REQUESTS["every option"])) == {}


INVALID_REQUESTS = {
    "top_logprobs above 20": ({"model": "m", "top_logprobs": 21}, "top_logprobs", "integer_above_max_value"),
    "top_logprobs as a string": ({"model": "m", "top_logprobs": "3"}, "top_logprobs", "invalid_type"),
    "temperature above 2": ({"model": "m", "temperature": 3}, "temperature", "decimal_above_max_value"),
    "missing model": ({"input": "hi"}, "model", "missing_required_parameter"),
    "input a number": ({"model": "m", "input": 5}, "input", "invalid_type"),
    "stream as a string": ({"model": "m", "stream": "true"}, "stream", "invalid_type"),
    "zero output tokens": ({"model": "m", "max_output_tokens": 0}, "max_output_tokens", "integer_below_min_value"),
    "null content": ({"model": "m", "input": [{"role": "user", "content": None}]}, "input[0].content", "invalid_type"),
    "tool role": ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0]", "invalid_value"),
    "unsupported item": ({"model": "m", "input": [{"type": "file_search_call", "id": "x"}]}, "input[0]",
                         "invalid_value"),
    "missing part text": (
        {"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
        "input[0].content[0].text",
        "missing_required_parameter",
    ),
    "unknown nested key": (
        {"model": "m", "input": [{"role": "user", "content": "x", "tool_call_id": "c"}]},
        "input[0].tool_call_id",
        "unknown_parameter",
    ),
    "17 metadata keys": (
        {"model": "m", "metadata": {f"k{i}": "v" for i in range(17)}},
        "metadata",
        "object_above_max_properties",
    ),
    "bad tool_choice": ({"model": "m", "tool_choice": "any"}, "tool_choice", "invalid_value"),
}


def test_item_reference_and_codex_items_are_accepted_in_the_sdk_shapes() -> None:
    """OpenAI's SDK types (and the Open Responses spec's `ItemReferenceParam`) define these; the gateway
    used to refuse `item_reference`. The SDK's own param types build them here."""
    items = [
        openai.types.responses.response_input_item_param.ItemReference(type="item_reference", id="msg_1"),
        openai.types.responses.ResponseCustomToolCallParam(type="custom_tool_call", call_id="call_1",
                                                           name="apply_patch", input="*** Begin Patch"),
        openai.types.responses.ResponseCustomToolCallOutputParam(type="custom_tool_call_output", call_id="call_1",
                                                                 output="done"),
        openai.types.responses.ResponseFunctionToolCallParam(type="function_call", call_id="call_2",
                                                             name="spawn_agent", arguments="{}",
                                                             namespace="multi_agent_v1"),
    ]
    tools = [{"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.",
              "tools": [{"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}]},
             {"type": "custom", "name": "apply_patch", "format": {"type": "grammar", "syntax": "lark",
                                                                  "definition": "start: /.+/"}},
             {"type": "web_search", "external_web_access": False}]
    request = CreateResponseRequest.model_validate({"model": "m", "input": items, "tools": tools})
    assert [item.type for item in request.input] == ["item_reference", "custom_tool_call",
                                                     "custom_tool_call_output", "function_call"]
    assert [tool.type for tool in request.tools] == ["namespace", "custom", "web_search"]


@pytest.mark.parametrize(("body", "param", "code"), INVALID_REQUESTS.values(), ids=INVALID_REQUESTS.keys())
def test_invalid_request_maps_to_openai_error(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CreateResponseRequest.model_validate(body)

    error = validation_error_to_openai(caught.value).error
    assert (error.type, error.param, error.code) == ("invalid_request_error", param, code)
    assert f"'{param}'" in error.message or "Invalid value" in error.message


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"model": "m", "top_logprobs": 21},
            "Invalid 'top_logprobs': integer above maximum value. Expected a value <= 20, but got 21 instead.",
        ),
        (
            {"model": "m", "top_logprobs": "3"},
            "Invalid type for 'top_logprobs': expected an integer, but got a string instead.",
        ),
        (
            {"model": "m", "temperature": 3},
            "Invalid 'temperature': decimal above maximum value. Expected a value <= 2, but got 3 instead.",
        ),
        ({"input": "hi"}, "Missing required parameter: 'model'."),
        (
            {"model": "m", "input": 5},
            "Invalid type for 'input': expected one of a string or an array, but got an integer instead.",
        ),
        (
            {"model": "m", "input": [{"role": "tool", "content": "x"}]},
            "Invalid value: 'tool'. Supported values are: 'user', 'system', 'developer', and 'assistant'.",
        ),
    ],
)
def test_error_messages_read_like_openai(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        CreateResponseRequest.model_validate(body)
    assert validation_error_to_openai(caught.value).error.message == message


def test_error_response_is_the_openai_envelope() -> None:
    with pytest.raises(ValidationError) as caught:
        CreateResponseRequest.model_validate({"model": "m", "top_logprobs": 21})
    body = validation_error_to_openai(caught.value).model_dump(mode="json")
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    assert ErrorResponse.model_validate(body).error.param == "top_logprobs"


# --- Chat and Completions requests -------------------------------------------------------------


def test_chat_request_accepts_logprobs_tools_and_vendor_fields() -> None:
    request = ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [
                {"role": "system", "content": "Be terse."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "low"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": "call_1", "content": "42"},
            ],
            "logprobs": True,
            "top_logprobs": 5,
            "max_completion_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_schema", "json_schema": {"name": "out", "schema": {"type": "object"}}},
            "top_k": 20,
        }
    )
    assert request.model_extra == {"top_k": 20}
    assert request.model_dump(mode="json", exclude_none=True)["response_format"]["json_schema"]["schema"] == {
        "type": "object"
    }


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 21},
            "top_logprobs",
            "integer_above_max_value",
        ),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}, "logprobs", "invalid_type"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]", "invalid_value"),
        ({"model": "m", "messages": []}, "messages", "array_below_min_length"),
    ],
)
def test_invalid_chat_request_maps_to_openai_error(body: dict[str, Any], param: str, code: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ChatCompletionRequest.model_validate(body)
    error = validation_error_to_openai(caught.value).error
    assert (error.param, error.code) == (param, code)


def test_completion_request_accepts_echo_scoring_and_token_prompts() -> None:
    scoring = CompletionRequest.model_validate(
        {"model": "m", "prompt": "Hello world", "max_tokens": 0, "echo": True, "logprobs": 5, "n": 1, "top_k": 1}
    )
    assert scoring.model_extra == {"top_k": 1}
    CompletionRequest.model_validate({"model": "m", "prompt": [15496, 995], "max_tokens": 4})

    with pytest.raises(ValidationError) as caught:
        CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": 21})
    error = validation_error_to_openai(caught.value).error
    assert (error.param, error.code) == ("logprobs", "integer_above_max_value")
