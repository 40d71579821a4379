"""Generated tokens → released text: UTF-8-complete detokenization, then stop strings with
partial-match hold-back (text that may begin a stop string is not released yet)."""

from __future__ import annotations

from typing import Any

from .request import TokenProb
from .stop import StopHit, TextStreamer

LOWEST_LOGPROB = -3.4028234663852886e38  # llama-server writes log(0) as the lowest float


class TextOutput:
    def __init__(self, tokenizer: Any, stops: list[str], special: bool, n_indent: int = 0) -> None:
        self._dec = tokenizer.stream_decoder(special=special)
        self._stream = TextStreamer(stops, n_indent=n_indent)
        self._special = special
        # no stop string and no n_indent: nothing is ever held back, so a token's text is its
        # decoded text as it is (TextStreamer.push would return it unchanged, with no hit)
        self._plain = not self._stream.matcher.stops and n_indent <= 0

    def push_token(self, token: int, is_eog: bool) -> tuple[str, StopHit | None]:
        """(text released now, the stop that ended the text or None: a stop word, or a new line
        indented less than ``n_indent``). An end-of-generation token adds no text unless special
        tokens are rendered."""
        if is_eog and not self._special:
            return "", None
        if self._plain:
            return self._dec.feed(token), None
        return self._stream.push(self._dec.feed(token))

    def flush(self, stopped_by_word: bool) -> str:
        """Text still held at the end (nothing after a stop word)."""
        if stopped_by_word:
            return ""
        tail = self._dec.flush()
        text = self._stream.push(tail)[0] if tail else ""
        return text + self._stream.finish()


def _piece(tokenizer: Any, tid: int) -> tuple[str, list[int]]:
    raw = tokenizer.token_bytes(tid)
    return raw.decode("utf-8", errors="ignore"), list(raw)


def token_prob(tokenizer: Any, token: int, res: Any, post_sampling: bool) -> TokenProb:
    def one(tid: int, value: float) -> TokenProb:
        text, raw = _piece(tokenizer, tid)
        if not post_sampling and value == float("-inf"):
            value = LOWEST_LOGPROB
        return TokenProb(tid, text, raw, float(value))

    head = one(token, res.logprob)
    head.top = [one(t, v) for t, v in res.top]
    return head
