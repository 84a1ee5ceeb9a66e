"""Decoding token bytes into text deltas with stop sequences held back."""

from hypothesis import given
from hypothesis import strategies as st

from chatparity.backends.text import TextStreamer, _overlap
from chatparity.protocol.events import TextDelta


def longest_end_beginning(text, stop):
    """The definition: the longest end of ``text`` (shorter than ``stop``) that begins it."""
    sizes = [n for n in range(1, min(len(text), len(stop) - 1) + 1) if stop.startswith(text[-n:])]
    return max(sizes, default=0)


@given(st.text(alphabet="ab,", max_size=30), st.text(alphabet="ab,", min_size=1, max_size=12))
def test_the_overlap_is_the_longest_end_of_the_text_that_begins_the_stop(text, stop):
    assert _overlap(text, stop) == longest_end_beginning(text, stop)


def stream(pieces, stops):
    sent = []
    streamer = TextStreamer(0, stops, sent.append)
    stopped = False
    for piece in pieces:
        if streamer.feed(piece.encode(), None):
            stopped = True
            break
    streamer.flush()
    return "".join(delta.text for delta in sent if isinstance(delta, TextDelta)), stopped


def test_a_stop_sequence_is_held_back_and_never_sent():
    assert stream(["Hello", " EN", "D", " more"], ["END"]) == ("Hello ", True)


def test_text_that_only_began_a_stop_is_sent_once_it_cannot_be_one():
    assert stream(["a", "b", "a", "b", "c"], ["abab!"]) == ("ababc", False)


def test_a_long_stop_is_looked_for_as_a_short_one():
    stop = "ab" * 256  # the longest a request may give
    pieces = ["ab"] * 200 + ["x"] + ["ab"] * 256
    text, stopped = stream(pieces, [stop])
    assert (text, stopped) == ("ab" * 200 + "x", True)
