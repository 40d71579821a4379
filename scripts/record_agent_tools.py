"""Record llama-server's answers to the tool calls of tests/compat/agent_tools_cases.py into
tests/golden/agent_tools/calls.json (``[name, status, normalized body]`` per call).

usage: python scripts/record_agent_tools.py LLAMA_SERVER MODEL.gguf [OUT.json]
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "compat"))
from agent_tools_cases import CASES, STREAM_CASES, make_tree, normalize, summarize_stream  # noqa: E402
from recording import serving  # noqa: E402


def _post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, str, str]:
    """(status, content type, body text)"""
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **headers}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


def main() -> None:
    server, model = sys.argv[1], sys.argv[2]
    out = (
        Path(sys.argv[3])
        if len(sys.argv) > 3
        else Path(__file__).resolve().parent.parent / "tests" / "golden" / "agent_tools" / "calls.json"
    )
    with serving([server, "-m", model, "--tools", "all", "-c", "512"]) as base:
        assert base is not None, f"{server} did not start"
        with tempfile.TemporaryDirectory() as tmp:
            make_tree(Path(tmp))
            rows = []
            url = f"{base}/tools"
            for name, headers, body in CASES:
                status, _, text = _post(url, body, {"x-tool-cwd": tmp, **headers})
                rows.append([name, status, normalize(json.loads(text), tmp)])
            for name, headers, body in STREAM_CASES:
                rows.append([name, *summarize_stream(*_post(url, body, {"x-tool-cwd": tmp, **headers}), tmp)])
    out.write_text(json.dumps(rows, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"{len(rows)} calls recorded into {out}")


if __name__ == "__main__":
    main()
