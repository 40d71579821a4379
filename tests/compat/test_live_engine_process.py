"""The engine in a process of its own (``KVSERVE_ENGINE_PROCESS=1``, the default on CUDA): the same
answers as the engine in the serving process, errors with their codes across the pipe, grammars
compiled again on the engine's side, cancellation, and both processes ending together."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from .live import LiveServer, launch

ARGS = ("-np", "2", "-c", "4096", "--metrics")


def _children(pid: int) -> list[int]:
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def _engine_pid(srv: LiveServer) -> int:
    """The spawned engine process: the child of the server that is not multiprocessing's tracker."""
    for pid in _children(srv.proc.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
        if b"resource_tracker" not in cmd:
            return pid
    raise AssertionError("no engine process")


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[LiveServer, LiveServer]]:
    """(engine in its own process, engine in the serving process), started side by side."""
    a = launch(*ARGS, env={"KVSERVE_ENGINE_PROCESS": "1"})
    b = launch(*ARGS, env={"KVSERVE_ENGINE_PROCESS": "0"})
    split, inproc = a.wait(180), b.wait(180)
    yield split, inproc
    split.stop()
    inproc.stop()


def _complete(url: str, **body: object) -> dict:
    r = httpx.post(url + "/completion", json={"temperature": 0, "n_predict": 16, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _stream_text(url: str, path: str, body: dict) -> str:
    text = []
    with httpx.stream("POST", url + path, json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ev = json.loads(line[6:])
                if "choices" in ev:
                    text += [c["delta"].get("content") or "" for c in ev["choices"]]
                else:
                    text.append(ev.get("content", ""))
    return "".join(text)


def test_two_processes_and_the_same_answers(servers: tuple[LiveServer, LiveServer]) -> None:
    split, inproc = servers
    assert _engine_pid(split) > 0
    assert all(b"resource_tracker" in open(f"/proc/{p}/cmdline", "rb").read() for p in _children(inproc.proc.pid))
    for prompt in ("The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"):
        a, b = _complete(split.url, prompt=prompt), _complete(inproc.url, prompt=prompt)
        assert a["content"] == b["content"] and a["tokens_predicted"] == b["tokens_predicted"] == 16
    chat = {"messages": [{"role": "user", "content": "Name three colors."}], "max_tokens": 12, "temperature": 0,
            "stream": True}
    assert _stream_text(split.url, "/v1/chat/completions", chat) == _stream_text(inproc.url, "/v1/chat/completions",
                                                                                 chat)
    assert _stream_text(split.url, "/completion", {"prompt": "Once upon", "n_predict": 8, "temperature": 0,
                                                   "stream": True}) != ""


def test_a_grammar_crosses_the_pipe(servers: tuple[LiveServer, LiveServer]) -> None:
    split, _ = servers
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    out = _complete(split.url, prompt="A number as JSON:", n_predict=24, json_schema=schema)
    assert isinstance(json.loads(out["content"])["n"], int)
    bad = httpx.post(split.url + "/completion", json={"prompt": "x", "grammar": "root ::= ("}, timeout=30)
    assert bad.status_code == 400


def test_state_errors_and_bad_input(servers: tuple[LiveServer, LiveServer]) -> None:
    split, inproc = servers
    slots = httpx.get(split.url + "/slots", timeout=30).json()
    assert [s["id"] for s in slots] == [0, 1] and all(s["n_ctx"] == 2048 for s in slots)
    assert "llamacpp:prompt_tokens_total" in httpx.get(split.url + "/metrics", timeout=30).text
    props = httpx.get(split.url + "/props", timeout=30).json()
    assert props["total_slots"] == 2 and props["kvserve_memory"]["weight_bytes"] > 0
    # an EngineError raised in the engine process keeps its code and type
    a = httpx.post(split.url + "/slots/0?action=save", json={"filename": "x.bin"}, timeout=30)
    b = httpx.post(inproc.url + "/slots/0?action=save", json={"filename": "x.bin"}, timeout=30)
    assert a.status_code == b.status_code == 501 and a.json() == b.json()
    assert httpx.post(split.url + "/completion", content=b"{not json", timeout=30).status_code == 400
    assert httpx.post(split.url + "/completion", json={"prompt": "x" * 40000, "n_predict": 1},
                      timeout=60).status_code == 400
    assert _complete(split.url, prompt="Still serving")["tokens_predicted"] == 16


def cancel_a_stream(url: str) -> None:
    """A long stream left after a few events; then every slot is free again within 30 s."""
    with httpx.stream("POST", url + "/completion", json={"prompt": "Count:", "n_predict": 2000,
                                                         "ignore_eos": True, "stream": True}, timeout=60) as r:
        for i, _line in enumerate(r.iter_lines()):
            if i > 4:
                break
    deadline = time.time() + 30
    while any(s["is_processing"] for s in httpx.get(url + "/slots", timeout=30).json()):
        assert time.time() < deadline, "the cancelled request still holds its slot"
        time.sleep(0.2)


def test_a_cancelled_stream_frees_its_slot(servers: tuple[LiveServer, LiveServer]) -> None:
    split, _ = servers
    cancel_a_stream(split.url)
    assert _complete(split.url, prompt="After the cancel")["tokens_predicted"] == 16


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_the_processes_end_together() -> None:
    # the server ends: the engine process ends with it
    srv = launch(*ARGS, env={"KVSERVE_ENGINE_PROCESS": "1"}).wait(180)
    child = _engine_pid(srv)
    inproc = launch(*ARGS, env={"KVSERVE_ENGINE_PROCESS": "0"}).wait(180)
    srv.proc.send_signal(signal.SIGTERM)
    inproc.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == inproc.proc.wait(timeout=30)  # the same exit status as one process
    assert _gone(child, 30)
    # the engine process dies: the server exits with an error status
    srv = launch(*ARGS, env={"KVSERVE_ENGINE_PROCESS": "1"}).wait(180)
    try:
        os.kill(_engine_pid(srv), signal.SIGKILL)
        assert srv.proc.wait(timeout=30) != 0
        assert "the engine process exited" in srv.log()
    finally:
        srv.stop()


def test_a_model_that_cannot_load_ends_the_server(tmp_path: object) -> None:
    bad = os.path.join(str(tmp_path), "bad.gguf")
    with open(bad, "wb") as f:
        f.write(b"GGUF" + b"\0" * 64)
    st = launch("-m", bad, env={"KVSERVE_ENGINE_PROCESS": "1"})
    assert st.proc.wait(timeout=60) != 0
