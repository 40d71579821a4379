"""Helpers shared by the benchmark scripts: the conditions header, Markdown tables, starting and
stopping a server process, /metrics, deterministic text and streamed requests (process-tree memory
through /proc: ``proc_memory``; the engine benchmarks' tiny model and null runner: ``engine_trees``).

Nothing here imports kvserve, so the HTTP benchmarks can drive any llama-server-compatible
binary from a machine that only has httpx.
"""

from __future__ import annotations

import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20


# -- reporting ---------------------------------------------------------------------------------
def print_conditions(title: str, conditions: dict[str, Any]) -> None:
    """The first lines of every benchmark's output: what ran, where, and how."""
    print(f"# {title}\n")
    base = {
        "host": platform.node(),
        "cpu": f"{os.cpu_count()} logical cores, {platform.machine()}",
        "python": platform.python_version(),
        "load average": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    for k, v in {**base, **conditions}.items():
        print(f"- {k}: {v}")
    print(flush=True)


def fmt(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "n/a"
        return f"{v:.{digits}f}"
    return str(v)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 1) -> str:
    cells = [[fmt(c, digits) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    line = lambda items: "| " + " | ".join(s.ljust(w) for s, w in zip(items, widths, strict=True)) + " |"  # noqa: E731
    out = [line(list(headers)), "| " + " | ".join("-" * w for w in widths) + " |"]
    out += [line(r) for r in cells]
    return "\n".join(out)


def print_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 1) -> None:
    print(markdown_table(headers, rows, digits))
    print(flush=True)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile, q in [0, 100]; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    k = (len(xs) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


# -- models ----------------------------------------------------------------------------------------
def default_models() -> list[str]:
    """The embedded SmolLM2 file, for scripts run without ``--model``."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    from kvserve.model.files import default_model_path

    return [default_model_path()]


# -- server processes ---------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_argv(cmd: str, port: int) -> list[str]:
    """Split a server command line; ``{port}`` and ``{python}`` are substituted, and without a
    ``{port}`` placeholder ``--port PORT`` is appended."""
    has_port = "{port}" in cmd
    argv = [a.replace("{port}", str(port)).replace("{python}", sys.executable) for a in shlex.split(cmd)]
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable  # the interpreter running the benchmark (its venv)
    if not has_port:
        argv += ["--port", str(port)]
    return argv


class ServerProcess:
    """A server started from a command line in its own process group, logging to a file.

    ``stop`` ends exactly the process group this object started (SIGTERM, then SIGKILL).
    """

    def __init__(self, cmd: str, port: int | None = None, env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.argv = server_argv(cmd, self.port)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kvserve-bench-", suffix=".log", delete=False)
        self.t_start = time.monotonic()
        self.t_ready: float | None = None
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout: float = 600.0) -> float:
        """Poll ``/health`` until it answers 200; returns seconds since start."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"server exited with {self.proc.returncode} before /health: {' '.join(self.argv)}\n"
                        + self.log_tail()
                    )
                try:
                    if client.get(self.url + "/health").status_code == 200:
                        self.t_ready = time.monotonic()
                        return self.t_ready - self.t_start
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
        self.stop(keep_log=True)
        raise TimeoutError(f"server not healthy after {timeout:.0f} s: {' '.join(self.argv)}\n" + self.log_tail())

    def log_tail(self, n: int = 40) -> str:
        try:
            with open(self.log.name, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 15.0, keep_log: bool = False) -> None:
        """End the server; its log file is removed unless ``keep_log``."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=timeout)
        self.log.close()
        if keep_log:
            print(f"server log kept: {self.log.name}", file=sys.stderr)
        elif os.path.exists(self.log.name):
            os.unlink(self.log.name)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# -- /metrics ---------------------------------------------------------------------------------------
def parse_prometheus(text: str) -> dict[str, float]:
    """``{series: value}`` for every sample line (labels kept in the key)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, val = line.rpartition(" ")
        try:
            out[name.strip()] = float(val)
        except ValueError:
            continue
    return out


def scrape_metrics(url: str, timeout: float = 2.0) -> dict[str, float] | None:
    """The server's /metrics as numbers, or None when it does not serve them."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout)
    except httpx.HTTPError:
        return None
    if r.status_code != 200:
        return None
    return parse_prometheus(r.text)


# -- deterministic text ----------------------------------------------------------------------------
WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no what more out "
    "can who up some time could them into only about other then than its now two may like over such "
    "these first new also after any most made many before must through back years where much your way "
    "well down should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another know while "
    "last might us great old year off come since against go came right used take three river garden "
    "market engine village letter winter harbour bridge signal kitchen forest machine window number "
    "question answer history science music paper summer morning evening animal island mountain road "
    "water light stone silver copper wooden careful quiet bright simple ancient modern northern "
    "southern narrow heavy gentle rapid patient curious honest"
).split()


def make_text(seed: int, n_words: int) -> str:
    """Deterministic pseudo-English: the same (seed, n_words) always gives the same string."""
    import random

    rng = random.Random(seed)
    out: list[str] = []
    sentence = 0
    for _ in range(n_words):
        w = rng.choice(WORDS)
        if sentence == 0:
            w = w.capitalize()
        out.append(w)
        sentence += 1
        if sentence >= rng.randint(8, 18):
            out[-1] += "."
            sentence = 0
    return " ".join(out) + ("." if sentence else "")


def make_text_chars(seed: int, n_chars: int) -> str:
    """Deterministic text of about ``n_chars`` characters (cut at a word boundary)."""
    text = make_text(seed, max(1, n_chars // 4))
    while len(text) < n_chars:
        text += " " + make_text(seed * 7919 + len(text), max(1, (n_chars - len(text)) // 4 + 1))
    cut = text.rfind(" ", 0, n_chars)
    return text[: cut if cut > 0 else n_chars]


# -- streaming requests ----------------------------------------------------------------------------
@dataclass
class ReqResult:
    """Timings of one streamed request (monotonic seconds) and the server's own counters."""

    t_send: float
    t_first: float | None = None  # first generated token arrived
    t_done: float | None = None
    n_gen: int = 0  # generated tokens (timings.predicted_n, else streamed chunks)
    prompt_n: int = 0  # timings.prompt_n: prompt tokens evaluated
    cache_n: int = 0  # timings.cache_n: prompt tokens reused from the cache
    text: str = ""
    error: str | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.t_first is None else self.t_first - self.t_send

    @property
    def decode_tps(self) -> float | None:
        """Per-stream decode rate: tokens after the first over the time after the first."""
        if self.t_first is None or self.t_done is None or self.n_gen < 2 or self.t_done <= self.t_first:
            return None
        return (self.n_gen - 1) / (self.t_done - self.t_first)


async def _sse_events(resp: Any) -> Any:
    async for line in resp.aiter_lines():
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        import json

        yield json.loads(payload)


async def _stream_objects(client: Any, url: str, payload: dict[str, Any], res: ReqResult) -> Any:
    """The SSE objects of a streamed POST; an answer other than 200 or an error object ends them
    (in ``res.error``)."""
    async with client.stream("POST", url, json=payload) as r:
        if r.status_code != 200:
            res.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            return
        async for obj in _sse_events(r):
            if "error" in obj:
                res.error = str(obj["error"])[:200]
                return
            yield obj


def _take_timings(res: ReqResult, obj: dict[str, Any]) -> None:
    t = obj.get("timings")
    if isinstance(t, dict):
        res.prompt_n = int(t.get("prompt_n", 0) or 0)
        res.cache_n = int(t.get("cache_n", 0) or 0)
        if t.get("predicted_n") is not None:
            res.n_gen = int(t["predicted_n"])


async def stream_completion(client: Any, url: str, body: dict[str, Any]) -> ReqResult:
    """POST /completion with ``stream: true`` (native SSE). The first partial chunk carrying
    content or tokens is the first token; the final chunk (``stop: true``) has ``timings``."""
    res = ReqResult(time.monotonic())
    chunks, parts = 0, []
    try:
        async with aclosing(_stream_objects(client, url.rstrip("/") + "/completion", {**body, "stream": True},
                                            res)) as objs:
            async for obj in objs:
                if obj.get("stop"):
                    res.t_done = time.monotonic()
                    _take_timings(res, obj)
                    continue
                if "prompt_progress" in obj and not obj.get("tokens") and not obj.get("content"):
                    continue
                if res.t_first is None:
                    res.t_first = time.monotonic()
                chunks += 1
                parts.append(obj.get("content", ""))
    except Exception as e:  # noqa: BLE001 - reported per request
        res.error = f"{type(e).__name__}: {e}"[:200]
    return _finished(res, chunks, parts)


def _finished(res: ReqResult, chunks: int, parts: list[str]) -> ReqResult:
    """Close a streamed result: end time, token count from chunks if the server sent none."""
    if res.t_done is None and res.error is None:
        res.t_done = time.monotonic()
    if res.n_gen == 0:
        res.n_gen = chunks
    res.text = "".join(parts)
    return res


async def stream_chat(client: Any, url: str, body: dict[str, Any]) -> ReqResult:
    """POST /v1/chat/completions with ``stream: true``. The first chunk with choices is the
    first token (llama-server sends the role chunk with it); the last chunk carries ``timings``
    (and ``usage`` with ``stream_options.include_usage``)."""
    res = ReqResult(time.monotonic())
    chunks, parts = 0, []
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    try:
        async with aclosing(_stream_objects(client, url.rstrip("/") + "/v1/chat/completions", payload, res)) as objs:
            async for obj in objs:
                choices = obj.get("choices") or []
                if choices and res.t_first is None and not obj.get("prompt_progress"):
                    res.t_first = time.monotonic()
                for ch in choices:
                    delta = ch.get("delta") or {}
                    if delta.get("content"):
                        parts.append(delta["content"])
                        chunks += 1
                    if ch.get("finish_reason"):
                        res.t_done = time.monotonic()
                usage = obj.get("usage")
                if isinstance(usage, dict):
                    res.n_gen = int(usage.get("completion_tokens", 0) or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    res.cache_n = int(details.get("cached_tokens", 0) or 0)
                    res.prompt_n = int(usage.get("prompt_tokens", 0) or 0) - res.cache_n
                _take_timings(res, obj)
    except Exception as e:  # noqa: BLE001 - reported per request
        res.error = f"{type(e).__name__}: {e}"[:200]
    return _finished(res, chunks, parts)
