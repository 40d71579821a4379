"""The log of Triton compiles after start-up (``kvserve.model.jit_watch``), driven through the
hooks as Triton calls them."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from kvserve.model import jit_watch


@pytest.fixture
def fake_triton(monkeypatch):
    seen: list[str] = []
    runtime = SimpleNamespace(interpret=False, jit_cache_hook=lambda **kw: seen.append("pre") or None,
                              jit_post_compile_hook=None)
    compilation = SimpleNamespace(listener=None)
    monkeypatch.setitem(sys.modules, "triton", SimpleNamespace(knobs=SimpleNamespace(
        runtime=runtime, compilation=compilation)))
    monkeypatch.setattr(jit_watch, "_installed", False)
    return runtime, compilation, seen


def _compile(runtime, compilation, hit: bool) -> None:
    fn = SimpleNamespace(name="gemv_kernel", jit_function=SimpleNamespace(arg_names=["x", "m", "BM", "PDL"]))
    kw = dict(key="k", repr="r", fn=fn, compile={"constants": {(2,): 2, (3,): True, (0,): None}},
              is_manual_warmup=False, already_compiled=False)
    assert not runtime.jit_cache_hook(**kw)
    compilation.listener(src=None, metadata={}, metadata_group={}, times=None, cache_hit=hit)
    runtime.jit_post_compile_hook(**kw)


def test_compiles_after_serving_are_logged(fake_triton, caplog):
    runtime, compilation, seen = fake_triton
    assert jit_watch.serving()
    assert jit_watch.serving()  # installed once
    with caplog.at_level(logging.WARNING, logger="kvserve.model.jit_watch"):
        _compile(runtime, compilation, hit=False)
        _compile(runtime, compilation, hit=True)
    assert seen == ["pre", "pre"]  # the hook that was there still runs, once per compile
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 2 and all("Triton kernel gemv_kernel compiled while serving in " in m for m in msgs)
    assert all("constexprs BM=2, PDL=True:" in m for m in msgs)  # names from the kernel's arguments
    assert "(compiled)" in msgs[0] and "(from the on-disk cache)" in msgs[1]


def test_the_hooks_fit_this_triton():
    """The installed Triton has the three hooks, and the function info its hooks get names the kernel."""
    triton = pytest.importorskip("triton")
    from triton.runtime.jit import JitFunctionInfo

    assert all(hasattr(triton.knobs.runtime, h) for h in ("jit_cache_hook", "jit_post_compile_hook"))
    assert hasattr(triton.knobs.compilation, "listener")
    assert {"name", "jit_function"} <= set(JitFunctionInfo.__annotations__)


def test_the_engine_watches_once_it_starts(monkeypatch, tmp_path):
    from kvserve.model.loader import load_gguf
    from kvserve.model.synth import SynthSpec, write_random_gguf
    from tests.e2e.engine_harness import make_engine

    calls: list[int] = []
    monkeypatch.setattr(jit_watch, "serving", lambda: calls.append(1) or False)
    path = write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec())
    eng = make_engine(load_gguf(path), n_ctx=256)
    assert calls == []
    eng.start()
    try:
        assert calls == [1]
    finally:
        eng.stop()


def test_nothing_to_watch_without_triton_or_in_the_interpreter(monkeypatch, fake_triton):
    runtime, _, _ = fake_triton
    runtime.interpret = True
    assert not jit_watch.serving()
    assert runtime.jit_post_compile_hook is None
    monkeypatch.delitem(sys.modules, "triton")
    assert not jit_watch.serving()
