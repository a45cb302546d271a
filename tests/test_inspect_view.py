"""`responses-gateway inspect`: the pure terminal/JSON views, and the command against a loopback gateway."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.cli import main
from gateway.inspect_view import (
    Fragment,
    Inspection,
    LiveLayout,
    ends_inside_character,
    format_probability,
    lay_out,
    quoted,
    render,
    render_run,
    render_table,
    summarize,
    to_json,
    token_from_entry,
)
from gateway.logprobs.demo_vocab import build_demo_vocab
from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Token
from tests.e2e import start_stack

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def tok(data: bytes, logprob: float = -0.5, top: tuple[tuple[bytes, float], ...] = ()) -> Token:
    return Token(data, logprob, tuple(Candidate(b, lp) for b, lp in top))


WAVE = [tok(b"Hi"), tok(b" \xf0", -1.0), tok(b"\x9f\x91", -3.0), tok(b"\x8b!", -0.1)]


# --- layout -------------------------------------------------------------------------------------


def test_emoji_split_across_tokens_is_shown_as_byte_fragments_joined_by_the_character():
    layouts, splits = lay_out(WAVE)
    assert [layout.pieces for layout in layouts] == [
        ("Hi",),
        (" ", Fragment(b"\xf0", "👋")),
        (Fragment(b"\x9f\x91", "👋"),),
        (Fragment(b"\x8b", "👋", closes=True), "!"),
    ]
    assert [layout.group for layout in layouts] == [None, 1, 1, 1]
    [split] = splits
    assert (split.text, split.data, split.tokens) == ("👋", "👋".encode(), (1, 2, 3))


def test_bytes_that_never_complete_a_character_are_fragments_of_no_character():
    layouts, splits = lay_out([tok(b"a"), tok(b"\xe6"), tok(b"\xa0")])  # a length cap stopped 根 (e6 a0 b9)
    assert layouts[1].pieces == (Fragment(b"\xe6", None),) and layouts[2].pieces == (Fragment(b"\xa0", None, True),)
    assert [layout.group for layout in layouts] == [None, 1, 1]
    assert [(s.text, s.data, s.tokens) for s in splits] == [(None, b"\xe6\xa0", (1, 2))]
    layouts, splits = lay_out([tok(b"\xffok")])  # invalid UTF-8 inside one token: no group, still shown
    assert layouts[0].pieces == (Fragment(b"\xff", None, True), "ok") and layouts[0].group is None
    assert [s.tokens for s in splits] == [(0,)]


def test_ends_inside_character_waits_only_for_bytes_that_could_still_complete_one():
    assert ends_inside_character(b"a\xf0\x9f")
    assert ends_inside_character(b"\xe6")
    assert not ends_inside_character(b"\xf0\x9f\x91\x8b")
    assert not ends_inside_character(b"ok")
    assert not ends_inside_character(b"\x9f")  # a stray continuation byte: nothing will complete it
    assert not ends_inside_character(b"")


@st.composite
def tokenized(draw) -> tuple[list[Token], list[int]]:
    """Text (or any bytes) cut into tokens at arbitrary byte offsets, and batch sizes to stream them in."""
    data = draw(st.one_of(st.text(max_size=30).map(str.encode), st.binary(max_size=30)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(data) - 1)), max_size=len(data))))
    bounds = [0, *[c for c in cuts if c < len(data)], len(data)]
    tokens = [tok(data[a:b]) for a, b in itertools.pairwise(bounds) if b > a]
    batches = draw(st.lists(st.integers(1, 4), min_size=len(tokens), max_size=len(tokens)))
    return tokens, batches


@given(tokenized())
def test_layout_pieces_spell_each_tokens_exact_bytes_and_streaming_lays_out_the_same(case):
    tokens, batches = case
    layouts, splits = lay_out(tokens)
    for layout in layouts:
        spelled = b"".join(p.encode() if isinstance(p, str) else p.data for p in layout.pieces)
        assert spelled == layout.token.bytes
    for split in splits:
        if split.text is not None:
            assert split.data == split.text.encode() and len(split.tokens) > 1
        assert list(split.tokens) == list(range(split.tokens[0], split.tokens[-1] + 1))
    live = LiveLayout()
    streamed, streamed_splits, at = [], [], 0
    for size in batches:
        new_layouts, new_splits = live.feed(tokens[at : at + size])
        streamed += new_layouts
        streamed_splits += new_splits
        at += size
    new_layouts, new_splits = live.finish()
    assert streamed + new_layouts == layouts
    assert streamed_splits + new_splits == splits


# --- text views ---------------------------------------------------------------------------------


def test_flowing_text_shows_split_characters_as_byte_chips_and_the_character_they_spell():
    assert render_run(lay_out(WAVE)[0], color=False) == "Hi ‹f0›‹9f›‹91›‹8b›(👋)!"
    cut = render_run(lay_out([tok(b"ok "), tok(b"\xf0\x9f")])[0], color=False)
    assert cut == "ok ‹f0›‹9f›(incomplete)"
    coloured = render_run(lay_out(WAVE)[0], color=True)
    assert ANSI.sub("", coloured) == "Hi ‹f0›‹9f›‹91›‹8b›(👋)!"
    assert "48;5;" in coloured


def test_model_output_cannot_drive_the_terminal():
    text = render_run(lay_out([tok(b"a\x1b[2Jb\nc\xe2\x80\xae")])[0], color=False)
    assert "\x1b" not in text and "\u202e" not in text
    assert text == "a\\x1b[2Jb↵\nc\\u202e"
    assert quoted(b"a\x1b\n'\\\xf0") == "'a\\x1b\\n\\'\\\\\\xf0'"


def test_table_brackets_the_tokens_of_a_split_character_and_ranks_alternatives():
    tokens = [tok(b"Hi", -0.1, ((b"Hi", -0.1), (b"Hello", -2.5))),
              tok(b"\xf0\x9f", -1.0, ((b"!", -0.2), (b"\xf0\x9f", -1.0))),
              tok(b"\x91\x8b", -4.0, ((b"?", -0.5),))]
    table = render_table(*lay_out(tokens), color=False).splitlines()
    assert table[0].split() == ["#", "token", "bytes", "prob", "logprob", "alternatives"]
    assert re.match(r"\s+0\s{4}'Hi'\s+48 69\s+90\.5%\s+-0\.1000\s+\*'Hi' 90\.5%\s+'Hello' 8\.2%$", table[1])
    assert table[2].lstrip().startswith("1  ┌ '\\xf0\\x9f'")
    assert "'!' 81.9%  *'\\xf0\\x9f' 36.8%" in table[2]
    assert "→ '👋' = f0 9f 91 8b over tokens 1–2" in table[2]
    assert table[3].lstrip().startswith("2  └ '\\x91\\x8b'")
    assert table[3].endswith("(sampled token not in top 1)")


def test_summary_figures():
    summary = summarize(WAVE)
    assert summary.count == 4
    assert summary.total_logprob == pytest.approx(-4.6)
    assert summary.perplexity == pytest.approx(math.exp(4.6 / 4))
    assert summary.least_confident == (2, 1, 0, 3)
    assert summary.mean_probability == pytest.approx(sum(math.exp(t.logprob) for t in WAVE) / 4)
    never = summarize([tok(b"a", SENTINEL_LOGPROB), tok(b"b", -1.0)])
    assert math.isinf(never.perplexity) and never.least_confident[0] == 0
    assert summarize([]).perplexity is None


def test_probabilities_keep_two_significant_digits_when_small():
    assert [format_probability(p) for p in (1.0, 0.481, 0.001, 0.000026, 0.0)] == [
        "100.0%", "48.1%", "0.1%", "0.0026%", "0%"]


# --- reading events ---------------------------------------------------------------------------------


def _delta(delta: str, entries: list[dict]) -> dict:
    return {"type": "response.output_text.delta", "delta": delta, "logprobs": entries}


def _entry(data: bytes, logprob: float, top: list[tuple[bytes, float]] = ()) -> dict:
    def spelled(b: bytes, lp: float) -> dict:
        return {"token": b.decode("utf-8", "backslashreplace"), "bytes": list(b), "logprob": lp}
    return {**spelled(data, logprob), "top_logprobs": [spelled(b, lp) for b, lp in top]}


EVENTS = [
    {"type": "response.created", "response": {"model": "demo-model", "status": "in_progress"}},
    _delta("Hi", [_entry(b"Hi", -0.2, [(b"Hi", -0.2), (b"Yo", -1.9)])]),
    _delta(" 👋", [_entry(b" \xf0", -1.0), _entry(b"\x9f\x91\x8b", -0.3)]),
    _delta("", [_entry(b"\xe6", -2.0)]),
    {"type": "response.incomplete", "response": {"model": "demo-model", "status": "incomplete",
                                                 "incomplete_details": {"reason": "max_output_tokens"},
                                                 "usage": {"input_tokens": 3, "output_tokens": 4}}},
]


def _inspection(events=EVENTS) -> Inspection:
    inspection = Inspection()
    for event in events:
        inspection.feed(event)
    return inspection


def test_inspection_collects_tokens_text_and_the_final_status():
    inspection = _inspection()
    assert inspection.model == "demo-model" and inspection.text == "Hi 👋"
    assert [t.bytes for t in inspection.tokens] == [b"Hi", b" \xf0", b"\x9f\x91\x8b", b"\xe6"]
    assert inspection.tokens[0].top == (Candidate(b"Hi", -0.2), Candidate(b"Yo", -1.9))
    assert (inspection.status, inspection.incomplete_reason) == ("incomplete", "max_output_tokens")
    failed = _inspection([{"type": "error", "message": "upstream went away"}])
    assert (failed.status, failed.error) == ("failed", "upstream went away")


def test_entry_without_bytes_reads_the_escaped_token_string():
    token = token_from_entry({"token": "\\xf0a", "logprob": -1.0, "top_logprobs": [{"token": "é", "logprob": -2.0}]})
    assert token.bytes == b"\xf0a" and token.top[0].bytes == "é".encode()


def test_json_view_holds_tokens_split_characters_and_summary_without_infinities():
    data = to_json(_inspection())
    json.dumps(data, allow_nan=False)
    assert data["text"] == "Hi 👋" and data["status"] == "incomplete"
    assert data["tokens"][0] == {
        "index": 0, "token": "Hi", "bytes": [72, 105], "logprob": -0.2, "probability": pytest.approx(math.exp(-0.2)),
        "split_group": None, "chosen_rank": 1,
        "top_logprobs": [{"token": "Hi", "bytes": [72, 105], "logprob": -0.2,
                          "probability": pytest.approx(math.exp(-0.2))},
                         {"token": "Yo", "bytes": [89, 111], "logprob": -1.9,
                          "probability": pytest.approx(math.exp(-1.9))}]}
    assert data["tokens"][1]["token"] == " \\xf0" and data["tokens"][1]["split_group"] == 1
    assert data["tokens"][3]["chosen_rank"] is None
    assert data["split_characters"] == [{"text": "👋", "bytes": list("👋".encode()), "tokens": [1, 2]},
                                        {"text": None, "bytes": [0xE6], "tokens": [3]}]
    assert data["summary"]["tokens"] == 4 and data["summary"]["total_logprob"] == pytest.approx(-3.5)
    assert data["summary"]["least_confident"] == [3, 1, 2, 0]
    never = to_json(_inspection([_delta("a", [_entry(b"a", SENTINEL_LOGPROB)])]))
    assert never["summary"]["perplexity"] is None


def test_whole_view_without_colour():
    text = render(_inspection(), color=False)
    assert "\x1b" not in text
    assert "Hi ‹f0›‹9f›‹91›‹8b›(👋)‹e6›(incomplete)" in text
    assert "status: incomplete (max_output_tokens) · usage: 3 in, 4 out" in text
    assert "least confident: #3 '\\xe6' 13.5%" in text


# --- the command against a loopback gateway ---------------------------------------------------------


@pytest.fixture(scope="module")
def vocab():
    return build_demo_vocab()


async def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


async def test_inspect_json_reports_every_streamed_token_with_exact_bytes(aiohttp_server, vocab, capsys):
    stack = await start_stack(aiohttp_server, vocab)
    code, out, _ = await _run(capsys, "--json", "--model", stack.model, "--base-url", stack.url(""),
                              "--top-logprobs", "2", "--max-output-tokens", "40", "--instructions", "Be brief.", "hi")
    assert code == 0
    data = json.loads(out)
    reference = await stack.client.responses.create(model=stack.model, input="hi", instructions="Be brief.",
                                                    include=["message.output_text.logprobs"], top_logprobs=2,
                                                    max_output_tokens=40)
    part = reference.output[0].content[0]
    assert data["status"] == "completed" and data["model"] == stack.model and data["text"] == part.text
    assert [t["bytes"] for t in data["tokens"]] == [list(e.bytes) for e in part.logprobs]
    assert [t["logprob"] for t in data["tokens"]] == [e.logprob for e in part.logprobs]
    assert all(len(t["top_logprobs"]) == 2 for t in data["tokens"])
    assert b"".join(bytes(t["bytes"]) for t in data["tokens"]) == part.text.encode()
    assert "👋" in [s["text"] for s in data["split_characters"]]
    assert data["summary"]["total_logprob"] == pytest.approx(math.fsum(e.logprob for e in part.logprobs))


async def test_inspect_prints_the_terminal_view(aiohttp_server, vocab, capsys):
    stack = await start_stack(aiohttp_server, vocab)
    code, out, _ = await _run(capsys, "--color", "never", "--model", stack.model, "--base-url",
                              stack.url("/v1"), "hi")
    assert code == 0
    assert "\x1b" not in out
    assert out.startswith("Hi there ‹f0›‹9f›‹91›‹8b›(👋) ‹e6›‹a0›‹b9›(根)")
    assert "→ '👋' = f0 9f 91 8b over tokens 4–7" in out
    assert "status: completed" in out
    code, out, _ = await _run(capsys, "--color", "always", "--model", stack.model, "--base-url", stack.url(""), "hi")
    assert code == 0 and "\x1b[38;5;16;48;5;" in out


async def test_inspect_says_what_went_wrong(aiohttp_server, vocab, capsys):
    stack = await start_stack(aiohttp_server, vocab)
    code, _, err = await _run(capsys, "--model", "nope", "--base-url", stack.url(""), "hi")
    assert code == 1 and "HTTP 404" in err and "nope" in err
    port = stack.gateway.port
    await stack.gateway.close()
    code, _, err = await _run(capsys, "--model", stack.model, "--base-url", f"http://127.0.0.1:{port}", "hi")
    assert code == 1 and "cannot reach" in err
