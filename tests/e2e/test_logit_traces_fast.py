"""``bench/logit_traces.py --fast`` on both real models: every exact condition (prefix-cache
hits with copy-on-write, batch widths, chunking, micro-batching) must agree with the cold
computation at every decided position, and the report must list every condition."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from types import ModuleType

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")


def _load_bench() -> ModuleType:
    path = os.path.abspath(os.path.join(BENCH, "logit_traces.py"))
    spec = importlib.util.spec_from_file_location("kvserve_bench_logit_traces", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def _run_fast(loaded, capsys: pytest.CaptureFixture[str]) -> None:
    lt = _load_bench()
    status = lt.main(["--fast"], loaded=loaded)
    out = capsys.readouterr().out
    rows = {m.group(1): m.group(0) for m in re.finditer(r"^\| ([a-z0-9_]+) +\|.*$", out, re.MULTILINE)}
    for name in lt.condition_names(fast=True):
        assert name in rows, f"condition {name} missing from the report:\n{out}"
    assert status == 0, out
    assert "RESULT: PASS" in out


def test_logit_traces_fast_smollm2(smollm, capsys):
    _run_fast(smollm, capsys)


@pytest.mark.slow
def test_logit_traces_fast_gemma3(gemma, capsys):
    _run_fast(gemma, capsys)
