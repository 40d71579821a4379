"""Every call of agent_tools_cases.py answered as llama-server b10621 answered it (calls.json,
recorded by scripts/record_agent_tools.py) through POST /tools of the real app."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from .agent_tools_cases import CASES, STREAM_CASES, make_tree, normalize, summarize_stream
from .test_http_fake_engine import client

GOLDEN = json.loads(
    (Path(__file__).parent.parent / "golden" / "agent_tools" / "calls.json").read_text("utf-8")
)


_NAMED_404 = {
    "unknown_tool": 'unknown tool "no_such_tool"',
    "stream_not_streamable": 'tool "read_file" does not support stream = true',
}


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Any]]:
    root = tmp_path_factory.mktemp("tree")
    make_tree(root)
    c, _ = client(tools=("all",))
    out: dict[str, list[Any]] = {}
    for name, headers, body in CASES:
        r = c.post("/tools", json=body, headers={"x-tool-cwd": str(root), **headers})
        out[name] = [r.status_code, normalize(r.json(), str(root))]
    for name, headers, body in STREAM_CASES:
        r = c.post("/tools", json=body, headers={"x-tool-cwd": str(root), **headers})
        out[name] = summarize_stream(r.status_code, r.headers.get("content-type", ""), r.text, str(root))
    return out


@pytest.mark.parametrize(
    ("name", "status", "body"), [g[:2] + [g[2:]] for g in GOLDEN], ids=[g[0] for g in GOLDEN]
)
def test_call_matches_llama_server(
    answers: dict[str, list[Any]], name: str, status: int, body: list[Any]
) -> None:
    if name in ("glob_git", "grep_git") and shutil.which("git") is None:
        pytest.skip("git is not installed")
    if name in _NAMED_404:  # llama-server's generic 404 text; kvserve names the tool
        assert answers[name][0] == status == 404 and body[0]["error"]["message"] == "File Not Found"
        assert answers[name][1]["error"] == {**body[0]["error"], "message": _NAMED_404[name]}
        return
    if name in ("info", "params_null"):  # get_info: the machine's own uname
        body = [
            {**body[0], "os": subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()}
        ]
    assert answers[name] == [status, *body]


def test_every_case_was_recorded() -> None:
    assert [g[0] for g in GOLDEN] == [c[0] for c in CASES + STREAM_CASES]
