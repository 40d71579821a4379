"""The SSE token templates (``fast_token``) write exactly what rendering the chunk and encoding
it gives, and step aside (None) wherever a chunk carries more than text and counters."""

from __future__ import annotations

import random

import pytest

from kvserve.engine.request import RequestParams, TokenEvent, TokenProb
from kvserve.server import responses as R
from kvserve.server import sse
from kvserve.server.params import CompletionParams

TEXTS = ["", "a", " hello", 'quote " and \\ backslash', "new\nline\ttab\r", "\x00\x01\x1f\x7f", "é ü 漢字 🙂",
         "\u2028\u2029", "\ufffd", "</script>", "{}[],:"]


def ctx(n_probs: int = 0, model: str = "m\"odel", syntax: object = None) -> R.ResponseContext:
    p = CompletionParams(req=RequestParams(stream=True, n_probs=n_probs))
    p.chat_syntax = syntax  # type: ignore[assignment]
    return R.ResponseContext(model=model, build_info="b1-abc", params=p, prompt_texts=[])


def events(n: int = 200) -> list[TokenEvent]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        text = rng.choice(TEXTS) + "".join(chr(rng.randrange(0x20, 0x3000)) for _ in range(rng.randrange(4)))
        toks = [rng.randrange(50000) for _ in range(rng.randrange(3))]
        out.append(TokenEvent(rng.randrange(1000), rng.randrange(4), text, toks, rng.randrange(1, 5000),
                              rng.randrange(1, 70000)))
    return out


def rendered(fmt: sse.Format, ev: TokenEvent) -> str:
    return "".join(fmt.encode(c) for c in fmt.token(ev))


@pytest.mark.parametrize("cls", [sse.NativeFormat, sse.OAICompletionFormat])
def test_template_matches_rendering(cls: type) -> None:
    fmt = cls(ctx())
    for ev in events():
        fast = fmt.fast_token(ev)
        assert fast is not None
        assert fast == rendered(fmt, ev)


def test_chat_template_matches_rendering_after_the_role_chunk() -> None:
    fmt = sse.OAIChatFormat(ctx())
    for ev in events():
        fast = fmt.fast_token(ev)
        slow = rendered(fmt, ev)  # the first event of an index also writes the role chunk
        if fast is None:
            assert not ev.text or slow.count("data: ") == 2 or not slow
            continue
        assert fast == slow


@pytest.mark.parametrize("cls", [sse.NativeFormat, sse.OAICompletionFormat, sse.OAIChatFormat])
def test_no_template_for_timings_or_probabilities(cls: type) -> None:
    ev = TokenEvent(1, 0, "x", [5], 1, 3)
    fmt = cls(ctx(n_probs=2))
    fmt.token(ev)  # the role chunk of a chat stream
    assert fmt.fast_token(ev) is not None  # asked for probabilities, none in this event
    ev.probs = [TokenProb(5, "x", [120], -0.5)]
    assert fmt.fast_token(ev) is None
    ev.probs = []
    ev.timings = {"predicted_n": 1}
    assert fmt.fast_token(ev) is None


def test_chat_with_output_parsing_is_rendered() -> None:
    class Parsed:
        is_plain = False

    fmt = sse.OAIChatFormat(ctx(syntax=Parsed()))
    fmt.started.add(0)
    assert fmt.fast_token(TokenEvent(1, 0, "x", [5], 1, 3)) is None
