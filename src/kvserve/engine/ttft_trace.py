"""``KVSERVE_TTFT_TRACE=PATH``: each request's first-token timeline, for ``bench/ttft_trace.py``.

``EngineStats.first_token`` sums a request's stages for /metrics (intake, queue, prefill); with
this variable set it also keeps the four times they are taken from — the server began handling
the HTTP request (its body read and parsed), the request entered the engine's queue, the engine
took it in, its first token was sampled (``time.perf_counter`` seconds) — and the process
writes them to PATH as a JSON list of ``[received, submitted, admitted, first]`` when it exits.
Times only: no text, no ids. At most ``MAX_ROWS`` requests are kept (the first ones).
"""

from __future__ import annotations

import atexit
import json
import os

MAX_ROWS = 100_000
PATH = os.environ.get("KVSERVE_TTFT_TRACE") or None
_rows: list[tuple[float, float, float, float]] = []


def record(t_received: float, t_submitted: float, t_admitted: float, t_first: float) -> None:
    if PATH is not None and len(_rows) < MAX_ROWS:
        _rows.append((t_received, t_submitted, t_admitted, t_first))


def write(path: str | None = None) -> None:
    """Write the rows kept so far to ``path`` (default ``PATH``)."""
    path = path or PATH
    if path is not None:
        with open(path, "w") as f:
            json.dump(_rows, f)


if PATH is not None:
    atexit.register(write)
