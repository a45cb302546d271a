"""Every front door x every upstream dialect and API x streaming: the client gets its own format,
valid for OpenAI's SDK (strict), with exact bytes — or an honest 400 where the route cannot serve."""

import importlib.util

import pytest
from openai import BadRequestError

from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.spellings import parse_bytes_spelling
from gateway.simulator.floats import f32
from tests.e2e import LOGPROBS, chatml_template, start_stack

TEXT = "Hi 👋🏽 根据 🦀 done."
K = 2
ROUTES = [("vllm", "chat"), ("vllm", "completions"), ("tgi", "chat"), ("tgi", "generate"), ("sglang", "chat"),
          ("sglang", "generate"), ("llamacpp", "chat"), ("llamacpp", "completions"), ("openai", "chat"),
          ("openai", "completions")]
FRONTS = ["responses", "chat", "completions"]


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _have(dialect: str) -> bool:
    return importlib.util.find_spec(f"gateway.simulator.{dialect}") is not None


def _check_entries(entries, text):
    """Bytes tile the text; top lists sorted, at most K."""
    assert b"".join(bytes(e.bytes) for e in entries) == text.encode()
    for entry in entries:
        values = [t.logprob for t in entry.top_logprobs]
        assert len(values) <= K and values == sorted(values, reverse=True)


def _completions_bytes(token: str) -> bytes:
    spelled = parse_bytes_spelling(token)
    return spelled if spelled is not None else token.encode()


async def _responses(stack, stream):
    kwargs = {"model": stack.model, "input": "hello", "include": LOGPROBS, "top_logprobs": K,
              "max_output_tokens": 200}
    if stream:
        async with stack.client.responses.stream(**kwargs) as events:
            response = await events.get_final_response()
    else:
        response = await stack.client.responses.create(**kwargs)
    part = response.output[0].content[0]
    return part.text, part.logprobs


async def _chat(stack, stream):
    kwargs = {"model": stack.model, "messages": [{"role": "user", "content": "hello"}], "logprobs": True,
              "top_logprobs": K, "max_tokens": 200}
    if not stream:
        choice = (await stack.client.chat.completions.create(**kwargs)).choices[0]
        return choice.message.content, choice.logprobs.content
    text, entries = "", []
    async for chunk in await stack.client.chat.completions.create(stream=True, **kwargs):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            if chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
                entries += chunk.choices[0].logprobs.content
    return text, entries


async def _completions(stack, stream):
    # OpenAI's SDK types legacy completion chunks with a non-null finish_reason (see README): lenient here.
    client = stack.client if not stream else stack.client.with_options()
    if stream:
        client._strict_response_validation = False
    kwargs = {"model": stack.model, "prompt": "hello", "logprobs": K, "max_tokens": 200}
    if not stream:
        choice = (await client.completions.create(**kwargs)).choices[0]
        tokens, tops = choice.logprobs.tokens, choice.logprobs.top_logprobs
        text = choice.text
    else:
        text, tokens, tops = "", [], []
        async for chunk in await client.completions.create(stream=True, **kwargs):
            if chunk.choices:
                text += chunk.choices[0].text
                if chunk.choices[0].logprobs:
                    tokens += chunk.choices[0].logprobs.tokens
                    tops += chunk.choices[0].logprobs.top_logprobs
    assert b"".join(_completions_bytes(t) for t in tokens) == text.encode()
    assert all(len(top) <= K + 1 for top in tops)
    return text, None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize(("dialect", "api"), ROUTES, ids=[f"{d}-{a}" for d, a in ROUTES])
@pytest.mark.parametrize("front", FRONTS)
async def test_every_front_door_over_every_route(aiohttp_server, vocab, tmp_path, front, dialect, api, stream):
    if not _have(dialect):
        pytest.skip(f"no {dialect} simulator")
    stack = await start_stack(aiohttp_server, vocab, dialect=dialect, api=api, default_reply=TEXT,
                              chat_template=chatml_template(tmp_path))
    serve = {"responses": _responses, "chat": _chat, "completions": _completions}[front]
    text, entries = await serve(stack, stream)
    assert text == TEXT
    if entries is not None:
        _check_entries(entries, text)


async def test_tgi_refuses_more_alternatives_than_its_cap(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab, dialect="tgi", api="generate")
    with pytest.raises(BadRequestError) as err:
        await stack.client.responses.create(model=stack.model, input="x", include=LOGPROBS, top_logprobs=6)
    assert err.value.body["code"] == "unsupported_parameter" and err.value.body["param"] == "top_logprobs"


@pytest.mark.parametrize("front", FRONTS)
async def test_two_dialects_driven_by_the_same_tokens_give_identical_output(aiohttp_server, vocab, tmp_path, front):
    """vLLM (token-id placeholders, sampled-first lists, k+1 dicts) and a server in OpenAI's conventions
    (escaped strings with bytes, `bytes:` tokens, true top-k) simulate the same tokens for the same
    prompt: the client must not be able to tell them apart, but for how each prints a number: vLLM
    sends the float32 its engine computed in full, the other the value as drawn (`as_float32`)."""
    outputs = []
    for dialect in ("vllm", "openai"):
        stack = await start_stack(aiohttp_server, vocab, dialect=dialect, api="completions", default_reply=TEXT,
                                  chat_template=chatml_template(tmp_path))
        if front == "responses":
            response = await stack.client.responses.create(model=stack.model, input="hello", include=LOGPROBS,
                                                           top_logprobs=K, max_output_tokens=200)
            outputs.append([e.model_dump() for e in response.output[0].content[0].logprobs])
        elif front == "chat":
            completion = await stack.client.chat.completions.create(
                model=stack.model, messages=[{"role": "user", "content": "hello"}], logprobs=True, top_logprobs=K,
                max_tokens=200)
            outputs.append([e.model_dump() for e in completion.choices[0].logprobs.content])
        else:
            completion = await stack.client.completions.create(model=stack.model, prompt="hello", logprobs=K,
                                                               max_tokens=200)
            outputs.append(completion.choices[0].logprobs.model_dump())
    assert outputs[0] == as_float32(outputs[1])
    assert outputs[0]  # and it is not vacuous


def as_float32(value):
    """`value` with every float as the double of its float32 (what vLLM prints)."""
    if type(value) is float:
        return f32(value)
    if type(value) is dict:
        return {key: as_float32(item) for key, item in value.items()}
    if type(value) is list:
        return [as_float32(item) for item in value]
    return value
