"""The HTTP/1.1 protocol uvicorn runs: httptools, with header names written as the app gives them.

llama-server (cpp-httplib) writes header names capitalized (``Content-Type``,
``Access-Control-Allow-Origin``) and some clients compare them exactly; the middleware capitalizes
them. uvicorn's h11 protocol keeps that case but costs pure-Python framing on every streamed
chunk; its httptools protocol frames chunks cheaply but lowercases names. ``protocol_class()``
returns the httptools protocol with one change: the status line and header block of each
response go out with canonical names (``content-type`` -> ``Content-Type``). Where httptools or
the uvicorn internals this relies on are missing, it returns ``"h11"``.

Streamed bodies: the scope of a request on this protocol carries ``scope[WRITE_NOWAIT]``, a
function that writes one chunk of the response body straight to the connection (the chunk
framing uvicorn's ``send`` writes, byte for byte) and returns True, or returns False and writes
nothing where ``send`` is needed (the response has not started or has ended, the connection is
gone or its write buffer is full, a body that is not chunked). An SSE stream writes each token
with it: no ASGI ``send`` through the middleware chain per token, and no wake-up of the
stream's task (see ``dispatch.EventQueue.sink``).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("kvserve.server")

WRITE_NOWAIT = "kvserve.write_nowait"  # the scope key (see the module docstring)


def canonical_header(name: bytes) -> bytes:
    """``access-control-allow-origin`` -> ``Access-Control-Allow-Origin``."""
    return b"-".join(part[:1].upper() + part[1:] for part in name.lower().split(b"-"))


def canonical_header_block(data: bytes) -> bytes:
    """A response's status line and header lines with every header name canonical."""
    head, sep, rest = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    out = [lines[0]]
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        out.append(canonical_header(name) + colon + value)
    return b"\r\n".join(out) + sep + rest


class _HeaderBlockTransport:
    """Stands in for the transport while a cycle writes its status line and headers."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport

    def write(self, data: bytes) -> None:
        self._transport.write(canonical_header_block(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def protocol_class() -> Any:
    try:
        from uvicorn.protocols.http import httptools_impl as impl

        base_protocol = impl.HttpToolsProtocol
        base_cycle = impl.RequestResponseCycle
        base_protocol.on_headers_complete  # noqa: B018 - the hook this relies on
    except (ImportError, AttributeError) as exc:  # no httptools, or other uvicorn internals
        log.debug("HTTP protocol: h11 (%s)", exc)
        return "h11"

    class Cycle(base_cycle):  # type: ignore[misc, valid-type]
        def write_nowait(self, body: bytes) -> bool:
            if (self.disconnected or self.flow.write_paused or not self.response_started
                    or self.response_complete or self.chunked_encoding is not True or not body):
                return False
            self.transport.write(b"%x\r\n%b\r\n" % (len(body), body))
            return True

        async def send(self, message: Any) -> None:
            if self.response_started or message.get("type") != "http.response.start":
                await super().send(message)
                if self.response_complete:  # no writes after the end (and no reference cycle)
                    self.scope.pop(WRITE_NOWAIT, None)
                return
            transport = self.transport
            self.transport = _HeaderBlockTransport(transport)
            try:
                await super().send(message)
            finally:
                self.transport = transport

    class Protocol(base_protocol):  # type: ignore[misc, valid-type]
        cycle_class = Cycle

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            # the cycle just made (its task starts on the loop's next turn) writes through Cycle
            if type(self.cycle) is base_cycle:
                self.cycle.__class__ = self.cycle_class
                self.cycle.scope[WRITE_NOWAIT] = self.cycle.write_nowait

    return Protocol
