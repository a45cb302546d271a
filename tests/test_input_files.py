"""`input_file` parts end to end: OpenAI SDK -> gateway -> vLLM simulator. Text files are inlined for the
model; other files are a 400 naming the field, before anything goes upstream."""

import base64

import openai
import pytest

from gateway.logprobs.demo_vocab import build_demo_vocab
from tests.e2e import chatml_template, start_stack

NOTES = "launch: Tuesday\nowner: 根据 🦀\n"


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _message(*files: dict) -> list[dict]:
    return [{"role": "user", "content": [{"type": "input_text", "text": "What do the notes say?"}, *files]}]


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_text_files_reach_the_model_as_text(aiohttp_server, vocab, tmp_path, api):
    stack = await start_stack(aiohttp_server, vocab, api=api, chat_template=chatml_template(tmp_path))
    files = [{"type": "input_file", "filename": "notes.txt",
              "file_data": f"data:text/plain;base64,{_b64(NOTES.encode())}"},
             # bare base64: the type comes from the name
             {"type": "input_file", "filename": "plan.json", "file_data": _b64(b'{"day": "Tuesday"}')}]
    response = await stack.client.responses.create(model=stack.model, input=_message(*files))
    assert response.status == "completed"
    body = list(stack.stats.recent)[-1]["body"]
    seen = body["messages"][0]["content"] if api == "chat" else body["prompt"]
    assert f"What do the notes say?notes.txt:\n{NOTES}plan.json:\n{{\"day\": \"Tuesday\"}}" in seen
    listed = (await stack.client.responses.input_items.list(response.id)).data
    assert [part.type for part in listed[0].content] == ["input_text", "input_file", "input_file"]


async def test_files_the_model_cannot_read_are_refused_naming_the_field(aiohttp_server, vocab):
    stack = await start_stack(aiohttp_server, vocab)
    refused = [
        ({"filename": "report.pdf", "file_data": f"data:application/pdf;base64,{_b64(b'%PDF-1.7')}"}, "file_data"),
        ({"filename": "photo.png", "file_data": _b64(b"\x89PNG")}, "file_data"),
        ({"filename": "bad.txt", "file_data": f"data:text/plain;base64,{_b64(bytes([0xff, 0xfe]))}"}, "file_data"),
        ({"filename": "x.txt", "file_data": "data:text/plain,plain"}, "file_data"),
        ({"file_id": "file-abc"}, "file_id"),
        ({"file_url": "https://example.com/a.txt"}, "file_url"),
    ]
    for part, field in refused:
        with pytest.raises(openai.BadRequestError) as caught:
            await stack.client.responses.create(model=stack.model, input=_message({"type": "input_file", **part}))
        assert caught.value.param == f"input[0].content[1].{field}", part
        assert caught.value.body["type"] == "invalid_request_error"
    assert list(stack.stats.recent) == []
