"""Tool calls replayed against llama-server (``scripts/record_agent_tools.py`` records the answers into
``tests/golden/agent_tools/calls.json``) and against kvserve (``test_http_agent_tools_golden.py``).

Every call runs with ``x-tool-cwd`` set to a fresh tree built by ``make_tree``; answers are compared
after ``normalize`` (the tree's path becomes ``<ROOT>``, and listing lines are sorted: the order of a
directory walk is the file system's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

BIG = "".join(f"line {i:05d} " + "x" * 40 + "\n" for i in range(600))  # ~30 KB: over read_file's 16 KB


def make_tree(root: Path) -> None:
    (root / "src" / "deep" / "deeper").mkdir(parents=True)
    (root / "node_modules" / "pkg").mkdir(parents=True)
    (root / "build").mkdir()
    (root / "notes.txt").write_text("alpha\nBeta\ngamma alpha\n")
    (root / "crlf.txt").write_bytes(b"one\r\ntwo\r\n")
    (root / "big.txt").write_text(BIG)
    (root / "src" / "main.cpp").write_text("int main() {\n    return 0;\n}\n")
    (root / "src" / "util.cpp").write_text("// util\nint add(int a, int b) { return a + b; } // alpha\n")
    (root / "src" / "deep" / "x.txt").write_text("deep alpha\n")
    (root / "src" / "deep" / "deeper" / "y.txt").write_text("deeper\n")
    (root / "node_modules" / "pkg" / "index.js").write_text("alpha\n")
    (root / "build" / "out.txt").write_text("alpha\n")
    (root / "quotes.txt").write_text("say \u201chello\u201d   \nsecond line\n")
    (root / "dup.txt").write_text("dup\nx\ndup\n")
    (root / "many.txt").write_text("hit\n" * 120)
    repo = root / "repo"
    (repo / "ignored").mkdir(parents=True)
    (repo / ".gitignore").write_text("ignored/\n*.log\n")
    (repo / "kept.py").write_text("print('alpha')\n")
    (repo / "debug.log").write_text("alpha\n")
    (repo / "ignored" / "secret.py").write_text("alpha\n")
    if shutil.which("git"):
        subprocess.run(["git", "init", "-q", str(repo)], check=True)


def _call(tool: str, **params: Any) -> dict[str, Any]:
    return {"tool": tool, "params": params}


# (name, extra headers, body); run in this order (some edit what earlier ones wrote)
CASES: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    ("read", {}, _call("read_file", path="notes.txt")),
    ("read_range_loc", {}, _call("read_file", path="notes.txt", start_line=2, end_line=3, append_loc=True)),
    ("read_crlf", {}, _call("read_file", path="crlf.txt")),
    ("read_missing", {}, _call("read_file", path="missing.txt")),
    ("read_dir", {}, _call("read_file", path="src")),
    ("read_big", {}, _call("read_file", path="big.txt")),
    ("read_big_range", {}, _call("read_file", path="big.txt", start_line=3, end_line=4)),
    ("read_big_truncated", {}, _call("read_file", path="big.txt", start_line=1, end_line=100000)),
    ("read_base64", {"x-resp-type": "base64"}, _call("read_file", path="crlf.txt")),
    ("read_abs_dotdot", {}, _call("read_file", path="src/../notes.txt")),
    ("write_nested", {}, _call("write_file", path="new/dir/file.txt", content="a\nb\nc\n")),
    ("read_written", {}, _call("read_file", path="new/dir/file.txt")),
    (
        "edit_multi",
        {},
        _call(
            "edit_file",
            path="new/dir/file.txt",
            edits=[{"old_text": "c\n", "new_text": "C\nD\n"}, {"old_text": "a", "new_text": "A"}],
        ),
    ),
    ("read_edited", {}, _call("read_file", path="new/dir/file.txt")),
    ("edit_not_unique", {}, _call("edit_file", path="dup.txt", edits=[{"old_text": "dup", "new_text": "d"}])),
    (
        "edit_overlap",
        {},
        _call(
            "edit_file",
            path="notes.txt",
            edits=[{"old_text": "alpha\nBeta", "new_text": "1"}, {"old_text": "Beta", "new_text": "2"}],
        ),
    ),
    (
        "edit_not_found",
        {},
        _call("edit_file", path="notes.txt", edits=[{"old_text": "zzz", "new_text": "1"}]),
    ),
    ("edit_same", {}, _call("edit_file", path="notes.txt", edits=[{"old_text": "Beta", "new_text": "Beta"}])),
    ("edit_empty_old", {}, _call("edit_file", path="notes.txt", edits=[{"old_text": "", "new_text": "x"}])),
    ("edit_no_edits", {}, _call("edit_file", path="notes.txt", edits=[])),
    (
        "edit_missing_file",
        {},
        _call("edit_file", path="nope.txt", edits=[{"old_text": "a", "new_text": "b"}]),
    ),
    (
        "edit_fuzzy",
        {},
        _call(
            "edit_file",
            path="quotes.txt",
            edits=[{"old_text": 'say "hello"\nsecond', "new_text": "say 'bye'\nSECOND"}],
        ),
    ),
    ("read_fuzzy", {}, _call("read_file", path="quotes.txt")),
    ("glob_default", {}, _call("file_glob_search", path=".")),
    ("glob_txt", {}, _call("file_glob_search", path=".", include="*.txt")),
    ("glob_slash", {}, _call("file_glob_search", path=".", include="deep/*.txt")),
    ("glob_anchored", {}, _call("file_glob_search", path=".", include="**/deeper/*")),
    ("glob_exclude", {}, _call("file_glob_search", path="src", exclude="*.cpp")),
    ("glob_dirs", {}, _call("file_glob_search", path=".", type="dir")),
    ("glob_all_depth1", {}, _call("file_glob_search", path=".", type="all", max_depth=1)),
    ("glob_depth2", {}, _call("file_glob_search", path="src", max_depth=2)),
    ("glob_bogus_type", {}, _call("file_glob_search", path=".", type="bogus")),
    ("glob_limit0", {}, _call("file_glob_search", path=".", limit=0)),
    ("glob_limit_count", {}, _call("file_glob_search", path="src", include="*.cpp", limit=1)),
    ("glob_missing", {}, _call("file_glob_search", path="missing")),
    ("glob_git", {}, _call("file_glob_search", path="repo")),
    ("glob_class", {}, _call("file_glob_search", path=".", include="[m-n]*.txt")),
    ("grep", {}, _call("grep_search", path=".", pattern="alpha")),
    (
        "grep_icase_lines",
        {},
        _call("grep_search", path=".", pattern="beta", ignore_case=True, return_line_numbers=True),
    ),
    ("grep_literal", {}, _call("grep_search", path="src", pattern="a + b", literal=True)),
    ("grep_regex", {}, _call("grep_search", path="src", pattern="^int \\w+\\(")),
    ("grep_context", {}, _call("grep_search", path="notes.txt", pattern="Beta", context_lines=1)),
    ("grep_include", {}, _call("grep_search", path=".", pattern="alpha", include="*.cpp")),
    ("grep_exclude", {}, _call("grep_search", path=".", pattern="alpha", exclude="src/**")),
    ("grep_missing", {}, _call("grep_search", path="missing", pattern="x")),
    ("grep_limit", {}, _call("grep_search", path="many.txt", pattern="hit")),
    ("grep_git", {}, _call("grep_search", path="repo", pattern="alpha")),
    ("exec", {}, _call("exec_shell_command", command="echo out; echo err >&2; exit 7")),
    ("exec_pwd_relative", {}, _call("exec_shell_command", command="cat notes.txt | wc -l")),
    (
        "exec_max_output",
        {},
        _call("exec_shell_command", command="printf 0123456789abcdef", max_output_size=4),
    ),
    ("exec_timeout", {}, _call("exec_shell_command", command="echo a; sleep 5; echo b", timeout=1)),
    ("exec_negative_max_output", {}, _call("exec_shell_command", command="echo hi", max_output_size=-1)),
    ("exec_zero_timeout", {}, _call("exec_shell_command", command="sleep 3", timeout=0)),
    ("read_start0", {}, _call("read_file", path="notes.txt", start_line=0, end_line=1)),
    ("read_end_before_start", {}, _call("read_file", path="notes.txt", start_line=3, end_line=2)),
    ("glob_negative_depth", {}, _call("file_glob_search", path="src", max_depth=-3, include="*.txt")),
    ("grep_negative_context", {}, _call("grep_search", path="notes.txt", pattern="Beta", context_lines=-2)),
    ("info", {}, _call("get_info")),
    ("missing_param", {}, _call("grep_search", path=".")),
    ("params_null", {}, {"tool": "get_info", "params": None}),
    ("no_params", {}, {"tool": "read_file"}),
    ("edit_item_not_object", {}, _call("edit_file", path="notes.txt", edits=["x"])),
    ("edit_item_missing_new", {}, _call("edit_file", path="notes.txt", edits=[{"old_text": "x"}])),
    ("write_content_number", {}, _call("write_file", path="w.txt", content=5)),
    ("unknown_tool", {}, _call("no_such_tool")),
]

# Streamed calls: compared as (status, the chunks joined, the final event); chunk boundaries are timing.
STREAM_CASES: list[tuple[str, dict[str, str], dict[str, Any]]] = [
    (
        "stream_exec",
        {},
        {**_call("exec_shell_command", command="echo a; echo b >&2; exit 2"), "stream": True},
    ),
    (
        "stream_timeout",
        {},
        {**_call("exec_shell_command", command="echo a; sleep 5", timeout=1), "stream": True},
    ),
    ("stream_missing_param", {}, {**_call("exec_shell_command"), "stream": True}),
    (
        "stream_bad_runtime",
        {"x-tool-runtime": "ssh:-oX"},
        {**_call("exec_shell_command", command="true"), "stream": True},
    ),
    ("stream_not_streamable", {}, {**_call("read_file", path="notes.txt"), "stream": True}),
    ("stream_false", {}, {**_call("exec_shell_command", command="echo x"), "stream": False}),
]


def summarize_stream(status: int, content_type: str, text: str, root: str) -> list[Any]:
    if not content_type.startswith("text/event-stream"):
        return [status, normalize(json.loads(text), root)]
    events = [
        json.loads(block[len("data: ") :]) for block in text.split("\n\n") if block.startswith("data: ")
    ]
    chunks = "".join(e.get("chunk", "") for e in events[:-1])
    return [status, normalize(chunks, root), normalize(events[-1], root)]


def normalize(body: Any, root: str) -> Any:
    text = (
        json.dumps(body, ensure_ascii=False).replace(os.path.realpath(root), "<ROOT>").replace(root, "<ROOT>")
    )
    out = json.loads(text)
    if isinstance(out, dict):
        ptr = out.get("plain_text_response")
        if isinstance(ptr, str) and "\n---\nTotal matches: " in ptr:
            head, _, tail = ptr.partition("\n---\n")
            if "\n--\n" not in head:  # context blocks keep their order inside one file
                head = "\n".join(sorted(head.split("\n")))
            out["plain_text_response"] = head + "\n---\n" + tail
        if isinstance(out.get("entries"), list):
            out["entries"] = sorted(out["entries"], key=lambda e: (e.get("path"), e.get("type")))
    return out
