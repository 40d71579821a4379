"""Drive a real Engine step by step on the test thread (no engine thread): deterministic."""

from __future__ import annotations

from typing import Any

from kvserve.engine.engine import Engine, EngineOptions
from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
from kvserve.engine.sampling_params import SamplingParams
from kvserve.model.chat_template import ChatTemplate
from kvserve.model.tokenizer import Tokenizer

from tests.events import GREEDY, Collector

__all__ = ["GREEDY", "Collector", "assert_idle", "make_engine", "run", "submit"]


def make_engine(loaded: Any, **kw: Any) -> Engine:
    tok = Tokenizer.from_metadata(loaded.metadata)
    tpl = ChatTemplate.from_metadata(loaded.metadata)
    kw.setdefault("n_ctx", 4096)
    kw.setdefault("check_integrity", True)
    return Engine(loaded, tok, tpl, EngineOptions(**kw))


def submit(
    eng: Engine,
    tokens: list[int],
    n_predict: int = 16,
    sampling: SamplingParams = GREEDY,
    tenant: str = "",
    **params: Any,
) -> tuple[int, Collector]:
    col = Collector()
    rid = eng.new_request_id()
    req = GenerationRequest(
        rid,
        list(tokens),
        RequestParams(n_predict=n_predict, sampling=sampling, **params),
        CacheIdentity(tenant=tenant),
    )
    eng.submit(req, col)
    return rid, col


def run(eng: Engine, cols: list[Collector], max_steps: int = 10_000, on_step: Any = None) -> None:
    for _ in range(max_steps):
        eng._drain(block=False)
        ran = eng.step()
        if on_step is not None:
            on_step(eng)
        if all(c.done for c in cols):
            eng.loop.drain()  # a step planned ahead of the last commit, if any
            eng._drain(block=False)
            return
        if not ran and not eng.scheduler.has_work():
            break
    raise AssertionError("requests did not finish")


def assert_idle(eng: Engine) -> None:
    """No busy slot, no running sequence, no page held by a sequence."""
    assert not any(s.busy for s in eng.scheduler.slots)
    assert not eng.scheduler.running and not eng.scheduler.waiting
    st = eng.cache.stats()
    assert st.in_use_pages == 0, st
    eng.cache.check_integrity()
