"""Header names on the wire: the status line kept, every name canonical, values untouched."""

from __future__ import annotations

from kvserve.server.http_wire import canonical_header, canonical_header_block, protocol_class


def test_canonical_header():
    assert canonical_header(b"access-control-allow-origin") == b"Access-Control-Allow-Origin"
    assert canonical_header(b"X-REQUEST-ID") == b"X-Request-Id"
    assert canonical_header(b"etag") == b"Etag"


def test_header_block_names_only():
    raw = (b"HTTP/1.1 200 OK\r\ncontent-type: text/plain; charset=utf-8\r\n"
           b"process-start-time-unix: 1700000000\r\nx-odd: a-b: c-d\r\n\r\n")
    out = canonical_header_block(raw)
    assert out == (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\n"
                   b"Process-Start-Time-Unix: 1700000000\r\nX-Odd: a-b: c-d\r\n\r\n")


def test_protocol_is_httptools_when_available():
    try:
        import httptools  # noqa: F401
    except ImportError:
        assert protocol_class() == "h11"
        return
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert issubclass(protocol_class(), HttpToolsProtocol)
