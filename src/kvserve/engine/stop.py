"""Stop strings, and the text stream held back while it may still become one (spec §3.8).

Text here is ``str`` that is already complete UTF-8 (the detokenizer holds back partial
characters), so positions are code-point indices.

llama-server, per generated token:
- searches the not-yet-sent text for a full stop string, only where a new match can be: from
  ``len(word) + len(last piece)`` characters before the end; the earliest match over all stop
  strings wins (ties: the first in the list); the text is cut there and generation stops;
- otherwise, if a suffix of the unsent text is a prefix of a stop string, sends nothing this
  step (all unsent text is held, not only that suffix) until the match resolves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

StopKind = Literal["word", "indent"]


@dataclass(frozen=True)
class StopHit:
    """``pos``: text[:pos] is kept. ``word``: the stop string ("" for an indentation stop).

    kind "word" maps to stop_type "word"; "indent" (``n_indent``) to stop_type "limit".
    """

    pos: int
    word: str
    kind: StopKind = "word"


class StopMatcher:
    """Full and partial matches of a fixed set of stop strings (empty strings are ignored)."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops: tuple[str, ...] = tuple(s for s in stops if s)

    def find(self, text: str, new_len: int, start: int = 0) -> StopHit | None:
        """Earliest full match in ``text[start:]`` that can involve the last ``new_len`` chars."""
        best: StopHit | None = None
        for word in self.stops:
            pos = text.find(word, max(start, len(text) - new_len - len(word)))
            if pos != -1 and (best is None or pos < best.pos):
                best = StopHit(pos, word)
        return best

    def partial(self, text: str, start: int = 0) -> int:
        """Length of the longest suffix of ``text[start:]`` that is a proper prefix of a stop."""
        best = 0
        room = len(text) - start
        for word in self.stops:
            for k in range(min(len(word) - 1, room), best, -1):
                if text.endswith(word[:k]):
                    best = k
                    break
        return best


class TextStreamer:
    """Turns decoded text increments into what may be sent now.

    ``push(piece)`` → (text to emit now, StopHit or None). A stop string, and any text that may
    still turn into one, is never emitted. After a hit, ``text`` ends at the cut and further
    pushes emit nothing. ``finish()`` (EOS, limit) returns the held text.

    ``hold_all_on_partial`` (default, as llama-server): while a partial match is pending, emit
    nothing; False emits everything before the partial match.
    ``n_indent`` > 0: stop when a line after the first newline starts (first char that is not a
    space or tab, a newline included) with less indentation; the cut keeps the indentation.
    """

    def __init__(
        self, stops: Iterable[str] = (), *, n_indent: int = 0, hold_all_on_partial: bool = True
    ) -> None:
        self.matcher = StopMatcher(stops)
        self.n_indent = n_indent
        self.hold_all_on_partial = hold_all_on_partial
        self.text = ""
        self.n_sent = 0
        self.stop: StopHit | None = None
        self._scan = 0  # newlines before this index have been checked for indentation
        self._line: int | None = None  # start of the line waiting for its first non-blank char

    @property
    def held(self) -> str:
        return self.text[self.n_sent :]

    def push(self, piece: str) -> tuple[str, StopHit | None]:
        if self.stop is not None:
            return "", self.stop
        self.text += piece
        if not self.matcher.stops and self.n_indent <= 0:  # nothing can hold text back
            self.n_sent = len(self.text)
            return piece, None
        hit = self.matcher.find(self.text, len(piece), self.n_sent)
        if self.n_indent > 0:
            ind = self._indent_hit()
            if ind is not None and (hit is None or ind.pos < hit.pos):
                hit = ind
        if hit is not None:
            self.stop = hit
            self.text = self.text[: hit.pos]
            return self._emit(max(self.n_sent, hit.pos)), hit
        plen = self.matcher.partial(self.text, self.n_sent)
        if plen == 0:
            return self._emit(len(self.text)), None
        if self.hold_all_on_partial:
            return "", None
        return self._emit(len(self.text) - plen), None

    def finish(self) -> str:
        """Everything not yet emitted (nothing after a stop string: it was cut)."""
        return self._emit(len(self.text))

    def _emit(self, end: int) -> str:
        out = self.text[self.n_sent : end]
        self.n_sent = max(self.n_sent, end)
        return out

    def _indent_hit(self) -> StopHit | None:
        t = self.text
        while True:
            if self._line is None:
                q = t.find("\n", self._scan)
                if q == -1:
                    self._scan = len(t)
                    return None
                self._line = q + 1
            pos = self._line
            while pos < len(t) and t[pos] in " \t":
                pos += 1
            if pos >= len(t):
                return None  # the line has no content yet
            if pos - self._line < self.n_indent:
                return StopHit(pos, "", "indent")
            self._scan, self._line = pos, None
