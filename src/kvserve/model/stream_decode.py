"""Incremental detokenization: token ids in, newly completed text out (a UTF-8 sequence split
over tokens held back until it completes)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvserve.model.tokenizer import Tokenizer


def utf8_complete_prefix(data: bytes) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence (llama-server's ``validate_utf8``)."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if (c & 0xE0) == 0xC0:
            if i < 2:
                return n - i
        elif (c & 0xF0) == 0xE0:
            if i < 3:
                return n - i
        elif (c & 0xF8) == 0xF0:
            if i < 4:
                return n - i
    return n


class StreamDecoder:
    """Incremental detokenizer: feed token ids one at a time, get back only newly completed text.

    Bytes of a UTF-8 sequence that is still incomplete are held back until the sequence completes
    (or :meth:`flush` is called).
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tok = tokenizer
        self._special = special
        self._pending = b""
        # the text of each token whose piece is complete UTF-8 on its own, shared by the
        # tokenizer's decoders: with nothing pending, such a token's text is always that
        self._complete = tokenizer._complete_text[special]

    def feed(self, tid: int) -> str:
        if not self._pending:
            text = self._complete.get(tid)
            if text is not None:
                return text
        data = self._pending + self._tok.token_bytes(tid, special=self._special)
        cut = utf8_complete_prefix(data)
        out = data[:cut].decode("utf-8", errors="replace")
        if not self._pending and cut == len(data):
            self._complete[tid] = out
        self._pending = data[cut:]
        return out

    def feed_many(self, ids: Iterable[int]) -> str:
        return "".join(self.feed(t) for t in ids)

    @property
    def pending(self) -> bytes:
        return self._pending

    def flush(self) -> str:
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")
