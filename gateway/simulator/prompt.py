"""Prompt side of the simulator: ChatML rendering of chat messages, and prompt token ids.

The simulator has no chat template of its own model, so every chat is rendered ChatML-style
(`<|im_start|>role\\ncontent<|im_end|>\\n` ... `<|im_start|>assistant\\n`), as Qwen2 does. The
control markers become their special token ids when the vocabulary has them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gateway.logprobs.vocab import Vocab

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"


def find_special_id(vocab: Vocab, text: str) -> int | None:
    """The special token spelled `text`, if the vocabulary has one."""
    token_id = vocab.id_for_piece(text)
    if token_id is not None and vocab.is_special(token_id):
        return token_id
    return None


def message_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
        return "\n".join(str(p) for p in parts)
    raise ValueError("message content must be a string or a list of content parts")


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message.get("role") == "user":
            return message_text(message.get("content"))
    return None


def reply_key(messages: Sequence[Mapping[str, Any]]) -> str | None:
    """What a scripted reply is looked up by: a tool result when the chat ends with one (the turn
    after a tool call), else the last user message."""
    if messages and messages[-1].get("role") == "tool":
        return message_text(messages[-1].get("content"))
    return last_user_text(messages)


class ChatMLRenderer:
    """Renders chat messages into prompt token ids."""

    def __init__(self, vocab: Vocab) -> None:
        self._vocab = vocab
        self._start = find_special_id(vocab, IM_START)
        self._end = find_special_id(vocab, IM_END)

    def _marker(self, token_id: int | None, text: str) -> list[int]:
        # Without the special token the marker is ordinary text, as an untemplated model sees it.
        return [token_id] if token_id is not None else self._vocab.encode(text)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            role = str(message.get("role", "user"))
            ids += self._marker(self._start, IM_START)
            ids += self._vocab.encode(f"{role}\n{message_text(message.get('content'))}")
            ids += self._marker(self._end, IM_END)
            ids += self._vocab.encode("\n")
        ids += self._marker(self._start, IM_START)
        ids += self._vocab.encode("assistant\n")
        return ids
