"""Aligning lossy token strings against the final text."""

import pytest

from gateway.logprobs.align import AlignmentError, Piece, align

EMOJI = "🦀".encode()  # f0 9f a6 80
ROOT = "根".encode()  # e6 a0 b9


def test_exact_and_clean_pieces_take_the_fast_path():
    result = align([Piece("Hi"), Piece(exact=b" \xf0\x9f"), Piece(exact=b"\xa6\x80")], b"Hi " + EMOJI)
    assert result.spans == [b"Hi", b" \xf0\x9f", b"\xa6\x80"]
    assert not result.ambiguous


def test_replacement_characters_recover_partial_bytes():
    # vLLM decodes each id alone with errors="replace": " \xf0\x9f" -> " �", "\xa6" -> "�", "\x80" -> "�"
    pieces = [Piece("Hi"), Piece(" \ufffd"), Piece("\ufffd"), Piece("\ufffd"), Piece(" ok")]
    result = align(pieces, b"Hi " + EMOJI + b" ok")
    assert result.spans == [b"Hi", b" \xf0\x9f", b"\xa6", b"\x80", b" ok"]
    assert not result.ambiguous


def test_one_token_holding_a_whole_lossy_run_is_exact():
    result = align([Piece("a"), Piece("\ufffd"), Piece("b")], b"a\xe6\xa0b")
    assert result.spans[1] == b"\xe6\xa0"


def test_fragment_then_merged_character_recovers_the_run_total():
    # TGI: the first token of a split character is "", the completing one carries the whole character.
    pieces = [Piece("x"), Piece(""), Piece("根"), Piece("y")]
    result = align(pieces, b"x" + ROOT + b"y")
    assert b"".join(result.spans[1:3]) == ROOT
    assert result.spans[0] == b"x" and result.spans[3] == b"y"
    # Without a tokenizer the split inside the character cannot be known: spelled per character, as
    # vLLM itself spells it (the lead empty, the completing token the whole character), and counted.
    assert result.spans[1:3] == [b"", ROOT]
    assert not result.ambiguous and result.per_character == 1


def test_single_fragment_split_is_exact_when_only_one_split_fits():
    # 2-byte character: one fragment byte, one completing byte; nothing else fits.
    pieces = [Piece(""), Piece("é")]
    result = align(pieces, "é".encode())
    assert result.spans == [b"\xc3", b"\xa9"]
    assert not result.ambiguous


def test_trailing_control_token_may_carry_no_text():
    pieces = [Piece("ok"), Piece("</s>", may_be_empty=True)]
    assert align(pieces, b"ok").spans == [b"ok", b""]


def test_tokens_that_do_not_describe_the_text_fail_loudly():
    with pytest.raises(AlignmentError) as err:
        align([Piece("Hello"), Piece(" there")], b"Hello world")
    assert err.value.index == 1


def test_too_few_tokens_for_the_text_fail():
    with pytest.raises(AlignmentError):
        align([Piece("\ufffd")], b"\xe6\xa0\xb9\xe6\x8d\xae")


def test_sentencepiece_first_token_may_lose_the_leading_space_the_decoder_strips():
    pieces = [Piece(exact=b" To", may_drop_leading_space=True), Piece(exact=b" sell")]
    assert align(pieces, b"To sell").spans == [b"To", b" sell"]
    assert align(pieces, b" To sell").spans == [b" To", b" sell"]
    with pytest.raises(AlignmentError):
        align([Piece(exact=b" To"), Piece(exact=b" sell")], b"To sell")


def test_adjacent_split_characters_without_a_tokenizer_are_each_spelled_per_character():
    # Real vLLM 0.32 without token ids (tests/real_engines/test_vllm_cases.py): "", "雖", "", " 오팀" —
    # two split characters in a row. Taken as one run they stayed a guess (1 + 2 bytes for 雖, shown as
    # exact); each run ends at its completing token, whose string pins where it ends.
    pieces = [Piece(""), Piece("雖"), Piece(""), Piece(" 오팀")]
    found = align(pieces, "雖 오팀".encode())
    assert found.spans == [b"", "雖".encode(), b"", " 오팀".encode()]
    assert found.ambiguous == frozenset() and found.per_character == 2
