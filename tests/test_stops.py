"""Stop strings on decoded text: held-back prefixes, whole characters, the text before a stop."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from torch_tensorrt_dist.errors import ConfigError
from torch_tensorrt_dist.generation.stops import StopText, check_stop_strings, held_back
from torch_tensorrt_dist.models.tokenizer import ByteTokenizer

TOK = ByteTokenizer(256)


def _feed(text: str, stop: tuple[str, ...]) -> tuple[list[str], bool, str]:
    tail = StopText(TOK, stop)
    pieces, hit = [], False
    for b in text.encode():
        piece, hit = tail.push(b)
        pieces.append(piece)
        if hit:
            break
    if hit:
        return pieces, hit, ""
    rest, hit = tail.flush()
    return pieces, hit, rest


def test_held_back_is_the_longest_stop_prefix() -> None:
    assert held_back("abc\n", ("\n\n",)) == 1
    assert held_back("abc", ("\n\n",)) == 0
    assert held_back("xEN", ("END", "ENOUGH")) == 2
    assert held_back("END", ("END",)) == 0  # a whole stop string is a hit, not a prefix


def test_text_before_the_stop_string_and_nothing_after() -> None:
    pieces, hit, _ = _feed("Hello\n\nWorld", ("\n\n",))
    assert hit and "".join(pieces) == "Hello"
    assert pieces[5] == ""  # the first newline was held back, then dropped with the stop


def test_a_false_start_is_released() -> None:
    pieces, hit, rest = _feed("a\nb", ("\n\n",))
    assert not hit and "".join(pieces) + rest == "a\nb"
    assert pieces == ["a", "", "\nb"]


def test_never_cut_inside_a_multibyte_character() -> None:
    pieces, hit, rest = _feed("déjà vu", ("xyz",))
    assert not hit and "".join(pieces) + rest == "déjà vu"
    assert all("\ufffd" not in p for p in pieces)
    pieces, hit, _ = _feed("café—fin", ("—",))  # a 3-byte stop string
    assert hit and "".join(pieces) == "café"


def test_stop_string_across_many_tokens_and_earliest_of_several() -> None:
    pieces, hit, _ = _feed("one END two STOP", ("STOP", "END"))
    assert hit and "".join(pieces) == "one "


def test_flush_releases_the_held_prefix_at_the_end() -> None:
    tail = StopText(TOK, ("\n\n",))
    assert tail.push(ord("a")) == ("a", False)
    assert tail.push(ord("\n")) == ("", False)
    assert tail.flush() == ("\n", False) and tail.text == "a\n"


def test_flush_finds_a_stop_string_in_what_it_releases() -> None:
    """Bytes that never completed a character show as U+FFFD at the end, as ``decode`` gives
    them: a stop string in that text is a hit too, and it is never shown."""
    tail = StopText(TOK, ("\ufffd",))
    assert tail.push(ord("a")) == ("a", False)
    assert tail.push(0xE4) == ("", False)  # the first byte of a 3-byte character
    assert tail.flush() == ("", True) and tail.text == "a"
    tail = StopText(TOK, ("b\ufffd",))  # a stop string that starts in released text
    assert [tail.push(b) for b in b"ab\xe4"] == [("a", False), ("", False), ("", False)]
    assert tail.flush() == ("", True) and tail.text == "a"


def test_stop_string_validation() -> None:
    assert check_stop_strings(["a", "b"]) == ("a", "b")
    with pytest.raises(ConfigError, match="5 stop strings given; at most 4"):
        check_stop_strings(["a"] * 5)
    with pytest.raises(ConfigError, match="a stop string is empty"):
        check_stop_strings([""])


@given(
    st.text(alphabet="ab\n é", max_size=30),
    st.lists(st.text("ab\n", min_size=1, max_size=3), max_size=3),
)
def test_pieces_are_the_text_up_to_the_first_stop(text: str, stop: list[str]) -> None:
    """Generation stops where a stop string first completes; the text before it is shown."""
    pieces, hit, rest = _feed(text, tuple(stop))
    done = [(i + len(s), i) for s, i in ((s, text.find(s)) for s in stop) if i >= 0]
    if done:
        assert hit and "".join(pieces) == text[: min(done)[1]]
    else:
        assert not hit and "".join(pieces) + rest == text
