"""Decoding a stream of bytes into text deltas, with stop sequences held back."""

from __future__ import annotations

import codecs
from collections.abc import Callable

from ..protocol.events import TextDelta, TokenLogprob


class TextStreamer:
    """Decodes token bytes to text deltas, holding back what may start a stop sequence."""

    def __init__(self, index: int, stops: list[str], emit: Callable[[object], None]) -> None:
        self.index = index
        self.stops = stops
        self.emit = emit
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._logprobs: list[TokenLogprob] = []
        self._tokens = 0

    def feed(self, piece: bytes, logprob: TokenLogprob | None) -> bool:
        """Take one token's bytes; return True when a stop sequence completed."""
        self._tokens += 1
        if logprob is not None:
            self._logprobs.append(logprob)
        self._pending += self._decoder.decode(piece)
        hits = [(self._pending.find(stop), stop) for stop in self.stops if stop in self._pending]
        if hits:
            self._send(self._pending[: min(hits)[0]])
            self._pending = ""
            return True
        held = max((_overlap(self._pending, stop) for stop in self.stops), default=0)
        if len(self._pending) > held:
            self._send(self._pending[: len(self._pending) - held])
            self._pending = self._pending[len(self._pending) - held :]
        return False

    def flush(self) -> None:
        self._send(self._pending + self._decoder.decode(b"", final=True))
        self._pending = ""

    def _send(self, text: str) -> None:
        if not text:
            return
        logprobs = self._logprobs if self._logprobs else None
        self.emit(TextDelta(self.index, text, logprobs=logprobs, tokens=self._tokens))
        self._logprobs, self._tokens = [], 0


def _overlap(text: str, stop: str) -> int:
    """Length of the longest end of ``text`` that begins ``stop`` (shorter than it): only
    the places in that end where ``stop``'s first character is are tried, longest first,
    so the text a token adds is looked through once, not once per length."""
    if not stop:
        return 0
    first = stop[0]
    start = text.find(first, max(0, len(text) - len(stop) + 1))
    while start != -1:
        if stop.startswith(text[start:]):
            return len(text) - start
        start = text.find(first, start + 1)
    return 0
