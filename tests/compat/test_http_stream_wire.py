"""Streamed bodies on the wire under uvicorn with kvserve's protocol: token chunks written
straight to the connection (``http_wire.WRITE_NOWAIT``, also from the event's delivery) give
the same bytes as the ASGI ``send`` path, and a reader that falls behind (the connection's
write buffer full) still gets every event in order."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest
import uvicorn

from kvserve.server.app import create_app
from kvserve.server.dispatch import EventQueue
from kvserve.server.http_wire import protocol_class
from tests.compat.test_http_fake_engine import FakeEngine, client, settings


class Counting:
    """The protocol class with its cycles' direct writes counted (taken / declined)."""

    def __init__(self, high_water: int | None = None) -> None:
        self.taken = 0
        self.declined = 0
        proto = protocol_class()
        if proto == "h11":
            pytest.skip("no httptools: uvicorn's h11 protocol has no direct body writes")
        base = proto.cycle_class
        counter = self

        class Cycle(base):  # type: ignore[misc, valid-type]
            def write_nowait(self, body: bytes) -> bool:
                ok = super().write_nowait(body)
                if ok:
                    counter.taken += 1
                else:
                    counter.declined += 1
                return ok

        class Protocol(proto):  # type: ignore[misc, valid-type]
            cycle_class = Cycle

            def connection_made(self, transport: Any) -> None:
                super().connection_made(transport)
                if high_water is not None:  # small write buffers: a slow reader fills them soon
                    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, high_water)
                    transport.set_write_buffer_limits(high=high_water)

        self.protocol = Protocol


class Served:
    def __init__(self, engine: FakeEngine, high_water: int | None = None) -> None:
        self.counts = Counting(high_water)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        config = uvicorn.Config(create_app(engine, settings()), log_level="warning", lifespan="off",
                                http=self.counts.protocol)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            assert time.time() < deadline and self.thread.is_alive(), "uvicorn did not start"
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def post_raw(port: int, path: str, body: dict[str, Any], rcvbuf: int = 0, pause_s: float = 0.0) -> tuple[bytes, list[bytes]]:
    """(head, chunks) of a chunked HTTP/1.1 response read off the socket."""
    data = json.dumps(body).encode()
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    s.connect(("127.0.0.1", port))
    with s:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                  b"Connection: close\r\n\r\n%s" % (path.encode(), len(data), data))
        if pause_s:
            time.sleep(pause_s)
        raw = b""
        while True:
            got = s.recv(65536)
            if not got:
                break
            raw += got
    head, _, rest = raw.partition(b"\r\n\r\n")
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        n = int(size_line, 16)
        if n == 0:
            break
        chunks.append(rest[:n])
        assert rest[n:n + 2] == b"\r\n"
        rest = rest[n + 2:]
    return head, chunks


@pytest.fixture
def slow_engine():
    srv = Served(FakeEngine(delay=0.003))
    yield srv
    srv.close()


def test_direct_writes_give_the_send_paths_bytes(slow_engine: Served) -> None:
    body = {"prompt": "x", "n_predict": 40, "stream": True}
    head, chunks = post_raw(slow_engine.port, "/completion", body)
    assert head.startswith(b"HTTP/1.1 200") and b"Transfer-Encoding: chunked" in head
    # one chunk per event, the tokens written directly (from the delivery while the task waits)
    assert slow_engine.counts.taken >= 38
    assert all(c.startswith(b"data: ") and c.endswith(b"\n\n") and c.count(b"\n\n") == 1 for c in chunks)
    c, _ = client()  # the same request through the ASGI test client: every byte through send
    assert b"".join(chunks) == c.post("/completion", json=body).content


def test_chat_stream_same_events(slow_engine: Served) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "stream": True}
    _, chunks = post_raw(slow_engine.port, "/v1/chat/completions", body)
    c, _ = client()
    want = c.post("/v1/chat/completions", json=body).text.split("\n\n")
    got = b"".join(chunks).decode().split("\n\n")
    assert len(got) == len(want) and got[-2:] == ["data: [DONE]", ""]

    def norm(e: str) -> Any:
        if not e.startswith("data: {"):
            return e
        obj = json.loads(e[6:])
        for k in ("id", "created", "timings"):
            obj.pop(k, None)
        return obj
    assert [norm(e) for e in got] == [norm(e) for e in want]
    assert slow_engine.counts.taken >= 10


def test_reader_behind_gets_every_event_in_order() -> None:
    srv = Served(FakeEngine(output="abcdefghij" * 30), high_water=2048)
    try:
        n = 4000  # ~500 KB of events at once: more than the socket buffers
        _, chunks = post_raw(srv.port, "/completion", {"prompt": "x", "n_predict": n, "stream": True},
                             rcvbuf=4096, pause_s=0.5)
    finally:
        srv.close()
    events = [json.loads(c[6:]) for c in chunks]
    assert [e["tokens_predicted"] for e in events[:-1]] == list(range(1, n + 1))
    assert events[-1]["stop"] is True
    assert srv.counts.declined > 0  # the full write buffer sent tokens through send (and its wait)


def test_event_queue_sink_keeps_order() -> None:
    loop = asyncio.new_event_loop()
    try:
        q = EventQueue(loop)
        taken: list[Any] = []
        q.sink = lambda ev: ev % 2 == 0 and (taken.append(ev) or True)

        async def consume() -> list[Any]:
            got: list[Any] = []
            while len(got) < 3:
                if q.empty():
                    await q.wait(1.0)
                    continue
                got.append(q.get_nowait())
                if len(got) == 1:  # busy: nothing goes to the sink now, everything queues
                    for ev in (4, 6, 7):
                        q.put_nowait(ev)
            return got

        async def main() -> list[Any]:
            task = loop.create_task(consume())
            await asyncio.sleep(0)
            q.put_nowait(0)  # the consumer waits, nothing queued: the sink takes it
            q.put_nowait(1)  # declined: queued, the consumer wakes
            q.put_nowait(2)  # queued behind 1, not taken out of order
            return await task

        got = loop.run_until_complete(main())
        assert taken == [0]
        assert got == [1, 2, 4]  # and 6, 7 still queued after them
        assert [q.get_nowait(), q.get_nowait()] == [6, 7]
    finally:
        loop.close()
