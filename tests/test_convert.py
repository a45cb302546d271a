"""Parsing, rendering and the six conversions over the canonical form."""

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.logprobs.convert import (
    LogprobFormat,
    chat_to_completions,
    chat_to_responses,
    completions_to_chat,
    completions_to_responses,
    parse,
    render,
    responses_to_chat,
    responses_to_completions,
)
from gateway.logprobs.parse import LogprobParseError, ParseOptions, parse_chat, parse_completions
from gateway.logprobs.render import completions_top_dict, render_completions
from gateway.logprobs.report import TranslationReport
from gateway.logprobs.tokens import SENTINEL_LOGPROB, Candidate, Origin, Token, normalize_candidates

# --- canonical tokens for property tests --------------------------------------------------------

logprobs = st.floats(min_value=-60.0, max_value=0.0, allow_nan=False)


@st.composite
def token_runs(draw, max_k=6, data=st.binary(min_size=1, max_size=40)):  # noqa: B008  (a strategy, not a call per run)
    """Random bytes (`data`) split into random tokens, each with k random distinct alternatives, in normalized
    form (sorted, distinct) and consistent: the sampled token is either one of the top k or no more
    likely than the k-th. A round trip must give them back unchanged."""
    k = draw(st.integers(min_value=0, max_value=max_k))
    data = draw(data)
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(data) - 1)), max_size=10))))
    bounds = [0, *[c for c in cuts if c < len(data)], len(data)]
    tokens = []
    for start, end in itertools.pairwise(bounds):
        chunk = data[start:end]
        alts = draw(st.lists(st.binary(min_size=1, max_size=6).filter(lambda b, c=chunk: b != c),
                             min_size=k, max_size=k, unique=True))
        values = sorted((draw(logprobs) for _ in alts), reverse=True)
        top = [Candidate(a, v) for a, v in zip(alts, values, strict=True)]
        if top and draw(st.booleans()):
            index = draw(st.integers(0, k - 1))
            top[index] = Candidate(chunk, values[index])
            sampled = values[index]
        else:
            sampled = draw(st.floats(min_value=-80.0, max_value=values[-1] if values else 0.0, allow_nan=False))
        tokens.append(Token(chunk, sampled, tuple(top)))
    return k, tokens


def projection(tokens, k):
    return [(t.bytes, t.logprob, [(c.bytes, c.logprob) for c in t.normalized_top(k)]) for t in tokens]


def strict_json(payload):
    return json.loads(json.dumps(payload, allow_nan=False))


@given(token_runs())
@settings(max_examples=300)
def test_round_trip_through_responses_is_identity(run):
    k, tokens = run
    back = parse(strict_json(render(tokens, LogprobFormat.RESPONSES, k)), LogprobFormat.RESPONSES, ParseOptions())
    assert projection(back.tokens, k) == projection(tokens, k)


@given(token_runs())
@settings(max_examples=300)
def test_round_trip_through_chat_is_identity(run):
    k, tokens = run
    payload = strict_json(render(tokens, LogprobFormat.CHAT, k))
    back = parse(payload, LogprobFormat.CHAT, ParseOptions(trust_bytes=True))
    assert projection(back.tokens, k) == projection(tokens, k)


@given(token_runs(max_k=5))
@settings(max_examples=300)
def test_round_trip_through_completions_is_identity(run):
    k, tokens = run
    payload = strict_json(render(tokens, LogprobFormat.COMPLETIONS, k))
    back = parse(payload, LogprobFormat.COMPLETIONS, ParseOptions())
    # The sampled token OpenAI adds to each dict sorts below the true top k and is cut again.
    assert projection(back.tokens, k) == projection(tokens, k)


@given(token_runs())
@settings(max_examples=200)
def test_every_conversion_keeps_the_bytes_and_their_concatenation(run):
    k, tokens = run
    text_bytes = b"".join(t.bytes for t in tokens)
    chat = render(tokens, LogprobFormat.CHAT, k)
    completions = chat_to_completions(chat, k, ParseOptions(trust_bytes=True))
    responses = completions_to_responses(completions, k)
    assert b"".join(bytes(e["bytes"]) for e in responses) == text_bytes
    assert b"".join(bytes(e["bytes"]) for e in responses_to_chat(responses, k)) == text_bytes
    again = responses_to_completions(responses, k)
    assert again["tokens"] == completions["tokens"]
    assert completions_to_chat(again, k) == responses_to_chat(responses, k)
    assert chat_to_responses(chat, k, ParseOptions(trust_bytes=True)) == responses


# --- normalization -------------------------------------------------------------------------------


def test_vllm_sampled_first_list_of_k_plus_one_gives_the_true_top_k_sorted():
    # vLLM: sampled token first, then the top k; sampled (-2.5) is not among the best 3.
    vllm_top = [(b" the", -2.5), (b" a", -0.3), (b" an", -1.1), (b" this", -1.9)]
    candidates = [Candidate(b, lp) for b, lp in vllm_top]
    top = normalize_candidates(candidates, 3)
    assert [(c.bytes, c.logprob) for c in top] == [(b" a", -0.3), (b" an", -1.1), (b" this", -1.9)]


def test_sampled_token_is_not_injected_into_chat_lists():
    token = Token(b" the", -2.5, (Candidate(b" a", -0.3), Candidate(b" an", -1.1)))
    [entry] = render(([token]), LogprobFormat.CHAT, 2)
    assert [t["token"] for t in entry["top_logprobs"]] == [" a", " an"]


def test_candidates_deduplicate_by_id_then_bytes_keeping_the_best():
    cands = [Candidate(b"x", -1.0, 5), Candidate(b"x", -0.5, 5), Candidate(b"x", -0.7, 6), Candidate(b"y", -3.0)]
    top = normalize_candidates(cands, 5)
    assert [(c.token_id, c.logprob) for c in top] == [(5, -0.5), (6, -0.7), (None, -3.0)]


@pytest.mark.parametrize("value", [None, float("-inf"), float("nan"), -3.4028234663852886e38, -1e30, float("inf")])
def test_sentinels_become_minus_9999(value):
    parsed = parse_chat([{"token": "a", "logprob": value, "top_logprobs": [{"token": "b", "logprob": value}]}],
                        ParseOptions())
    assert parsed.tokens[0].logprob == SENTINEL_LOGPROB
    assert parsed.tokens[0].top[0].logprob == SENTINEL_LOGPROB
    assert parsed.report.sentinels == 2
    rendered = render(parsed.tokens, LogprobFormat.RESPONSES, 1)
    json.dumps(rendered, allow_nan=False)  # no NaN or Infinity can reach a client


def test_real_minus_9999_is_kept_and_not_counted():
    parsed = parse_chat([{"token": "a", "logprob": -9999.0}], ParseOptions())
    assert parsed.tokens[0].logprob == -9999.0 and parsed.report.sentinels == 0


# --- lossy spellings -----------------------------------------------------------------------------


def test_bytes_spelling_in_legacy_completions_is_exact():
    lp = {"tokens": ["<|endoftext|>", "bytes:\\xe2\\x80", "bytes:\\x99", "Hello"],
          "token_logprobs": [-0.1, -0.2, -0.3, -0.4], "top_logprobs": None, "text_offset": [0, 0, 0, 0]}
    parsed = parse_completions(lp, ParseOptions())
    assert [t.bytes for t in parsed.tokens[1:]] == [b"\xe2\x80", b"\x99", b"Hello"]
    assert parsed.tokens[1].origin is Origin.EXACT


def test_openai_literal_escapes_without_bytes_are_read_when_asked():
    content = [{"token": "\\xf0\\x9f\\x92", "logprob": -1.0, "bytes": None, "top_logprobs": []},
               {"token": "\\x99", "logprob": -0.1, "bytes": None, "top_logprobs": []}]
    parsed = parse_chat(content, ParseOptions(escapes=True))
    assert b"".join(t.bytes for t in parsed.tokens) == "💙".encode()


def test_openai_exact_bytes_beside_escaped_strings_are_trusted():
    content = [{"token": " \\xeb", "logprob": -1.0, "bytes": [32, 235], "top_logprobs": []}]
    assert parse_chat(content, ParseOptions()).tokens[0].bytes == b" \xeb"


def test_replacement_char_bytes_are_repaired_from_the_text():
    # vLLM errors="replace": both halves of 👋 come as "�" with bytes [239,191,189].
    fffd = [239, 191, 189]
    content = [{"token": "Hi", "logprob": -0.3, "bytes": [72, 105], "top_logprobs": []},
               {"token": "\ufffd", "logprob": -1.2, "bytes": fffd, "top_logprobs": []},
               {"token": "\ufffd", "logprob": -0.1, "bytes": fffd, "top_logprobs": []}]
    parsed = parse_chat(content, ParseOptions(), text="Hi👋")
    # Only one split of F0 9F 91 8B decodes to exactly "�" then "�": 3 bytes, then 1.
    assert [t.bytes for t in parsed.tokens] == [b"Hi", b"\xf0\x9f\x91", b"\x8b"]
    assert parsed.report.ambiguous_positions == []
    assert parsed.report.aligned == 2


def test_bytes_null_tokens_fall_back_to_their_text():
    content = [{"token": "Hello", "logprob": -0.3, "bytes": None, "top_logprobs": []},
               {"token": "°", "logprob": -0.3, "bytes": None, "top_logprobs": []}]
    parsed = parse_chat(content, ParseOptions(), text="Hello°")
    assert [t.origin for t in parsed.tokens] == [Origin.TEXT, Origin.TEXT]
    assert parsed.report.ambiguous_positions == []


def test_lossy_tokens_without_text_are_reported_ambiguous():
    parsed = parse_chat([{"token": "\ufffd", "logprob": -1.0}], ParseOptions())
    assert parsed.report.ambiguous_positions == [0]
    assert parsed.tokens[0].origin is Origin.AMBIGUOUS


def test_lossy_alternatives_are_counted():
    content = [{"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "\ufffd", "logprob": -2.0}]}]
    assert parse_chat(content, ParseOptions()).report.ambiguous_candidates == 1


def test_token_id_placeholders_need_a_tokenizer():
    with pytest.raises(LogprobParseError, match="no tokenizer"):
        parse_chat([{"token": "token_id:5", "logprob": -1.0}], ParseOptions())


def test_malformed_payloads_raise_parse_errors():
    with pytest.raises(LogprobParseError):
        parse_chat([{"token": 5, "logprob": -1.0}], ParseOptions())
    with pytest.raises(LogprobParseError):
        parse_chat([{"token": "a", "logprob": "x"}], ParseOptions())
    with pytest.raises(LogprobParseError):
        parse_completions({"tokens": ["a", "b"], "token_logprobs": [-1.0]}, ParseOptions())


# --- completions rendering -----------------------------------------------------------------------


def test_echo_first_prompt_token_keeps_null_logprob_and_top():
    tokens = [Token(b"Hello", None), Token(b" world", -0.5, (Candidate(b" world", -0.5), Candidate(b" there", -1.9)))]
    out = render_completions(tokens, 2)
    assert out["token_logprobs"] == [None, -0.5]
    assert out["top_logprobs"] == [None, {" world": -0.5, " there": -1.9}]
    assert out["text_offset"] == [0, 5]


def test_completions_dict_adds_the_sampled_token_when_outside_the_top_k():
    token = Token(b" of", -3.0, (Candidate(b" the", -0.2), Candidate(b" a", -0.9)))
    assert render_completions([token], 2)["top_logprobs"] == [{" the": -0.2, " a": -0.9, " of": -3.0}]
    assert render_completions([token], 0)["top_logprobs"] == [{}]


def test_text_offset_counts_code_points_and_points_into_split_characters():
    tokens = [Token(b"a", -1.0), Token(b"\xf0\x9f", -1.0), Token(b"\xa6\x80", -1.0), Token("根".encode(), -1.0),
              Token(b"b", -1.0)]
    out = render_completions(tokens, 0, text_offset_start=3)
    text = "a🦀根b"
    assert out["text_offset"] == [3, 4, 4, 5, 6]
    assert [text[o - 3] for o in out["text_offset"]] == ["a", "🦀", "🦀", "根", "b"]
    assert out["tokens"][1:3] == ["bytes:\\xf0\\x9f", "bytes:\\xa6\\x80"]


def test_colliding_completions_keys_stay_distinguishable():
    report = TranslationReport()
    cands = [Candidate(b"x", -0.1, 10), Candidate(b"x", -0.2, 11), Candidate(b"x", -0.3, 12)]
    out = completions_top_dict(cands, report)
    assert out == {"x": -0.1, "bytes:\\x78": -0.2, "token_id:12": -0.3}
    assert report.collisions == 2
    # Without ids a third same-bytes candidate can only be merged, and that is counted.
    report = TranslationReport()
    assert len(completions_top_dict([Candidate(b"x", -0.1), Candidate(b"x", -0.2), Candidate(b"x", -0.3)], report)) == 2
    assert report.collisions == 1 and report.collisions_merged == 1


def test_no_output_has_nan_or_infinity():
    tokens = [Token(b"a", float("nan"), (Candidate(b"b", float("-inf")),))]
    for fmt in LogprobFormat:
        text = json.dumps(render(tokens, fmt, 1), allow_nan=False)
        assert "NaN" not in text and not math.isnan(json.loads(text) and 0.0)
