"""``KVSERVE_TTFT_TRACE``: the first-token timeline is kept only when asked for, bounded, and
written as the analysis script reads it; ``bench/ttft_trace.py`` groups it into bursts."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kvserve.engine import ttft_trace
from kvserve.engine.stats import EngineStats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import ttft_trace as analysis  # noqa: E402


def test_nothing_is_kept_without_the_variable(monkeypatch):
    monkeypatch.setattr(ttft_trace, "PATH", None)
    monkeypatch.setattr(ttft_trace, "_rows", [])
    EngineStats().first_token(1.0, 2.0, 3.0, 4.0)
    assert ttft_trace._rows == []


def test_first_tokens_are_written_with_their_four_times(monkeypatch, tmp_path):
    path = tmp_path / "t.json"
    monkeypatch.setattr(ttft_trace, "PATH", str(path))
    monkeypatch.setattr(ttft_trace, "_rows", [])
    monkeypatch.setattr(ttft_trace, "MAX_ROWS", 3)
    st = EngineStats()
    st.first_token(1.0, 1.5, 2.0, 2.5)
    st.first_token(0.0, 0.0, 5.0, 6.0)  # not from HTTP, never queued: every unknown time is the admission's
    st.first_token(1.1, 1.6, 2.1, 2.5)
    st.first_token(9.0, 9.0, 9.0, 9.0)  # past MAX_ROWS
    assert st.first_tokens == 4 and abs(st.stage_s["intake"] - 1.0) < 1e-9
    ttft_trace.write()
    rows = json.loads(path.read_text())
    assert rows == [[1.0, 1.5, 2.0, 2.5], [5.0, 5.0, 5.0, 6.0], [1.1, 1.6, 2.1, 2.5]]
    groups = analysis.bursts(rows, gap_s=0.2, min_size=2)
    assert groups == [[[1.0, 1.5, 2.0, 2.5], [1.1, 1.6, 2.1, 2.5]]]  # the lone request left out
    assert analysis.quartiles([3.0, 1.0, 2.0, 4.0]) == [1.0, 2.0, 3.0, 4.0, 4.0]
