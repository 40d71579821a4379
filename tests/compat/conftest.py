"""Fixtures shared by the live compat tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .live import LiveServer, start_server


@pytest.fixture(scope="session")
def qwen_server(qwen_path: str) -> Iterator[LiveServer]:
    """Qwen2.5-Coder-0.5B-Instruct on one slot, 2,048 tokens of context: one process serves the
    tool-call and the structured-output tests (a load is the largest of the live tests)."""
    srv = start_server("-m", qwen_path, "-c", "2048", "-np", "1", timeout=300)
    yield srv
    srv.stop()
