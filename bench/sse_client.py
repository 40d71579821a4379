"""A lean streaming client for the benchmarks: ``POST /completion`` with ``stream: true`` over a
plain asyncio connection, parsed in the protocol's ``data_received`` callback.

httpx (with h11 under it) spends about 40-50 us of Python per streamed event and a millisecond
or so per request: at 64 streams and 10,000+ tokens per second one client process then runs at
80% of a core, and in a 64-request burst it is still sending the last requests while the server
answers the first. This client frames the request itself, reads the response head, undoes the
chunked transfer encoding and splits SSE events as bytes arrive, with one ``json.loads`` per event
and the arrival time taken when the bytes come in. It gives the same ``ReqResult`` as
``common.stream_completion`` (same rules for the first token, the final chunk and errors).

HTTP/1.1, one connection per request (``Connection: close``); bodies chunked or ended by the
connection closing; no TLS, no redirects, no proxies.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any
from urllib.parse import urlsplit

from common import ReqResult, _finished, _take_timings


class _Stream(asyncio.Protocol):
    def __init__(self, res: ReqResult, done: asyncio.Future[None]) -> None:
        self.res = res
        self.done = done
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()  # received, not yet framed
        self.sse = bytearray()  # body bytes, not yet split into events
        self.status: int | None = None
        self.chunked = False
        self.need = -1  # bytes of the current chunk still to come (-1: a size line is next)
        self.chunks = 0
        self.parts: list[str] = []
        self.over = False
        self.ended = False  # the last chunk came

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.over:
            return
        self.buf += data
        if self.status is None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            del self.buf[: end + 4]
            try:
                self.status = int(head[0].split(" ", 2)[1])
            except (IndexError, ValueError):
                self._finish(f"bad status line {head[0]!r}")
                return
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "transfer-encoding" and "chunked" in value.lower():
                    self.chunked = True
        if self.chunked:
            self._unchunk()
        else:
            self.sse += self.buf
            self.buf.clear()
        if self.status != 200:
            if self.ended:
                self._finish(self._error_text())
            return  # else the error body is read to its end
        now = time.monotonic()
        while not self.over:
            j = self.sse.find(b"\n\n")
            if j < 0:
                break
            block = bytes(self.sse[:j])
            del self.sse[: j + 2]
            self._event(block, now)
        if self.ended:
            self._finish(None)

    def _unchunk(self) -> None:
        buf = self.buf
        while buf:
            if self.need < 0:
                j = buf.find(b"\r\n")
                if j < 0:
                    return
                size = int(bytes(buf[:j]).split(b";", 1)[0], 16)
                del buf[: j + 2]
                if size == 0:  # the last chunk: the body is complete
                    self.ended = True
                    return
                self.need = size
            if len(buf) < self.need + 2:
                return
            self.sse += buf[: self.need]
            del buf[: self.need + 2]
            self.need = -1

    def _event(self, block: bytes, now: float) -> None:
        res = self.res
        for line in block.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self._finish(None)
                return
            obj = json.loads(payload)
            if "error" in obj:
                self._finish(str(obj["error"])[:200])
                return
            if obj.get("stop"):
                res.t_done = now
                _take_timings(res, obj)
                continue
            if "prompt_progress" in obj and not obj.get("tokens") and not obj.get("content"):
                continue
            if res.t_first is None:
                res.t_first = now
            self.chunks += 1
            self.parts.append(obj.get("content", ""))

    def _error_text(self) -> str:
        return f"HTTP {self.status}: {bytes(self.sse[:200])!r}"

    def _finish(self, error: str | None) -> None:
        if self.over:
            return
        self.over = True
        if error is not None:
            self.res.error = error
        _finished(self.res, self.chunks, self.parts)
        if self.transport is not None:
            self.transport.close()
        if not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.status is None:
            self._finish(f"connection closed before a response ({exc})")
        elif self.status != 200:
            self._finish(self._error_text())
        elif self.chunked and not self.over:
            self._finish("connection closed inside the response body")
        else:
            self._finish(None)


async def stream_completion(url: str, body: dict[str, Any], timeout: float = 600.0) -> ReqResult:
    """POST ``url``/completion with ``stream: true``; the result as ``common.stream_completion``'s."""
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    path = (u.path.rstrip("/") or "") + "/completion"
    payload = json.dumps({**body, "stream": True}).encode()
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
            f"Accept: text/event-stream\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
    res = ReqResult(time.monotonic())
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    proto = _Stream(res, done)
    try:
        transport, _ = await loop.create_connection(lambda: proto, host, port)
        transport.write(head + payload)
        await asyncio.wait_for(done, timeout)
    except Exception as e:  # noqa: BLE001 - reported per request
        if proto.transport is not None:
            proto.transport.close()
        if not proto.over:
            proto.over = True
            res.error = f"{type(e).__name__}: {e}"[:200]
            _finished(res, proto.chunks, proto.parts)
    return res
