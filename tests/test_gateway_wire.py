"""Raw wire checks: SSE framing, every frame against the SDK's event union, input shapes, /v1/models."""

import json

import aiohttp
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from gateway.config import parse_config
from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import LOGPROBS, start_stack

STREAM_EVENT = TypeAdapter(ResponseStreamEvent)


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_every_raw_sse_frame_is_a_valid_event_with_matching_event_line(aiohttp_server, vocab, api):
    stack = await start_stack(aiohttp_server, vocab, api=api, tokens_per_step="vary")
    body = {"model": stack.model, "input": "hi", "stream": True, "include": LOGPROBS, "top_logprobs": 2}
    async with aiohttp.ClientSession() as session, session.post(stack.url("/v1/responses"), json=body) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        raw = await reply.text()
    assert "[DONE]" not in raw
    frames = [block for block in raw.split("\n\n") if block]
    assert raw.endswith("\n\n")
    for number, block in enumerate(frames):
        event_line, data_line = block.split("\n")
        event = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {event['type']}"
        assert event["sequence_number"] == number
        STREAM_EVENT.validate_python(event)
        assert "error" not in event  # the SDK would raise on a top-level error key
        for entry in event.get("logprobs", []):
            assert {"token", "bytes", "logprob", "top_logprobs"} <= set(entry)
    final = json.loads(frames[-1].split("\n")[1].removeprefix("data: "))["response"]
    Response.model_validate(final)


async def test_message_list_with_instructions_and_history_reaches_the_upstream_as_messages(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    response = await stack.client.responses.create(
        model=stack.model, instructions="Be brief.", include=LOGPROBS,
        input=[{"role": "system", "content": "You are a test."},
               {"role": "user", "content": [{"type": "input_text", "text": "Hello"}]},
               {"role": "assistant", "content": "Hi!"},
               {"role": "developer", "content": [{"type": "input_text", "text": "Stay on topic."}]},
               {"role": "user", "content": "hi"}])
    assert response.instructions == "Be brief."
    assert response.output[0].content[0].logprobs
    [received] = list(stack.stats.recent)
    assert received["body"]["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "You are a test."},
        {"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi!"},
        {"role": "developer", "content": "Stay on topic."}, {"role": "user", "content": "hi"}]


async def test_completions_upstream_gets_the_prompt_rendered_from_the_chat_template(aiohttp_server, vocab, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    stack = await start_stack(aiohttp_server, vocab, api="completions")
    config = parse_config({"upstreams": {"sim": {"urls": [str(stack.simulator.make_url("")).rstrip("/")],
                                                 "api": "completions"}},
                           "models": {"templated": {"upstream": "sim", "upstream_model": "demo-model",
                                                    "tokenizer": {"builtin": "demo"},
                                                    "chat_template": "template.jinja"}}}, tmp_path)
    from gateway.app import create_app

    gateway = await aiohttp_server(create_app(config))
    body = {"model": "templated", "input": [{"role": "user", "content": "hi"}], "instructions": "Be brief."}
    async with aiohttp.ClientSession() as session, session.post(str(gateway.make_url("/v1/responses")),
                                                                json=body) as reply:
        assert reply.status == 200
    [received] = list(stack.stats.recent)
    assert received["body"]["prompt"] == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                                          "<|im_start|>assistant\n")


async def test_completions_upstream_without_template_takes_a_plain_string_only(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, api="completions")
    await stack.client.responses.create(model=stack.model, input="plain prompt")
    [received] = list(stack.stats.recent)
    assert received["body"]["prompt"] == "plain prompt"
    async with aiohttp.ClientSession() as session, session.post(
        stack.url("/v1/responses"), json={"model": stack.model, "input": [{"role": "user", "content": "hi"}]}
    ) as reply:
        assert reply.status == 400
        assert "chat template" in (await reply.json())["error"]["message"]


async def test_models_lists_the_configured_names(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    models = await stack.client.models.list()
    assert [m.id for m in models.data] == ["demo-model"]
