"""When the engine runs in a process of its own (``engine_process_wanted``)."""

from __future__ import annotations

import pytest
import torch

from kvserve.config import load_config
from kvserve.engine_process import engine_process_wanted


def _cfg(*argv: str):
    return load_config(["-m", "x.gguf", *argv], {})


def test_the_rule(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.delenv("KVSERVE_ENGINE_PROCESS", raising=False)
    assert not engine_process_wanted(_cfg("--device", "cpu"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert engine_process_wanted(_cfg())  # CUDA: on by default
    assert not engine_process_wanted(_cfg("--sleep-idle-seconds", "5"))  # the sleeping engine stays in-process
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not engine_process_wanted(_cfg())
    assert not engine_process_wanted(_cfg("--device", "cuda"))  # its error is the load's, as before
    monkeypatch.setenv("KVSERVE_ENGINE_PROCESS", "1")
    assert engine_process_wanted(_cfg("--device", "cpu"))
    with caplog.at_level("WARNING", logger="kvserve"):
        assert not engine_process_wanted(_cfg("--sleep-idle-seconds", "5"))  # asked for, refused aloud
    assert "not with --sleep-idle-seconds" in caplog.text
    monkeypatch.setenv("KVSERVE_ENGINE_PROCESS", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not engine_process_wanted(_cfg())
