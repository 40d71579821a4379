"""``build_engine``'s load order: the tokenizer is built from the file's header before the weights
load, so its build's temporaries peak before the weights are resident (docs/benchmarks.md §6)."""

from __future__ import annotations

from kvserve.__main__ import build_engine
from kvserve.config import load_config
from kvserve.model import loader
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.model.tokenizer import Tokenizer


def test_the_tokenizer_is_built_before_the_weights_from_one_header(tmp_path, monkeypatch) -> None:
    path = write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec(arch="llama", n_layer=1, n_vocab=300))
    order: list[tuple[str, int]] = []
    tok_build, load = Tokenizer.from_metadata.__func__, loader.load_gguf

    def from_metadata(cls, meta, *a, **k):  # noqa: ANN001, ANN002, ANN003
        order.append(("tokenizer", id(meta)))
        return tok_build(cls, meta, *a, **k)

    def load_gguf(*a, **k):  # noqa: ANN002, ANN003
        got = load(*a, **k)
        order.append(("weights", id(got.metadata)))
        return got

    monkeypatch.setattr(Tokenizer, "from_metadata", classmethod(from_metadata))
    monkeypatch.setattr(loader, "load_gguf", load_gguf)
    engine = build_engine(load_config(["-m", path, "-c", "256", "-np", "1"], {}))
    assert [name for name, _ in order] == ["tokenizer", "weights"]
    assert order[0][1] == order[1][1]  # the header was parsed once: the weights' metadata is the tokenizer's
    assert engine.tokenizer.n_vocab == 300


def test_load_temporaries_go_once_the_engine_exists() -> None:
    import linecache
    from types import SimpleNamespace

    from kvserve.__main__ import drop_load_temporaries

    linecache.getline(__file__, 1)  # as importing torch leaves its config modules' lines
    assert linecache.cache
    meta = {"tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": ["a b"], "general.name": "m"}
    drop_load_temporaries(SimpleNamespace(metadata=meta, device=SimpleNamespace(type="cuda")))
    assert meta == {"general.name": "m"} and not linecache.cache


def test_the_heap_is_frozen_once_the_loaded_engine_is_started_and_attached(tmp_path, monkeypatch) -> None:
    import threading

    import kvserve.__main__ as entry
    from kvserve.model import heap
    from kvserve.server import http_server

    path = write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec(arch="llama", n_layer=1, n_vocab=300))
    events: list[str] = []
    frozen = threading.Event()

    class Stub:
        ready = False

        def start(self) -> None:
            events.append("start")
            self.ready = True

    def serve(engine, cfg) -> None:  # noqa: ANN001 - until the load thread is done
        assert frozen.wait(30)
        events.append("attached" if engine.ready else "not attached")

    def freeze() -> None:
        events.append("freeze")
        frozen.set()

    monkeypatch.setattr(entry, "build_engine", lambda cfg: Stub())
    monkeypatch.setattr(http_server, "serve", serve)
    monkeypatch.setattr(heap, "freeze", freeze)
    entry.main(["-m", path, "-c", "256", "-np", "1"])
    assert events == ["start", "freeze", "attached"]
