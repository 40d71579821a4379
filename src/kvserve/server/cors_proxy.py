"""``GET``/``POST /cors-proxy?url=URL``: the Web UI's MCP CORS proxy (``--ui-mcp-proxy``, ``-ag``).

As llama-server (``server-cors-proxy.h``): the request goes to ``URL`` (http or https, no
password in it) with the client's method and body and *only* the headers the client names
explicitly, ``x-llama-server-proxy-header-NAME: VALUE`` becoming ``NAME: VALUE`` — never its
own ``Authorization``, ``Cookie`` or API key, which are meant for this server. The answer comes
back with its status, its headers except hop-by-hop ones and the target's CORS headers (this
server adds its own), and its body streamed as it arrives. Redirects are followed; the target
has 600 s to connect and answer.

Differences: a malformed URL is a 400 (llama-server answers 500); a target that cannot be
reached is a 502 carrying ``proxy error: ...`` in llama-server's error JSON (llama-server: a
500 with that text as the body).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kvserve.server.errors import SERVER, ApiError, invalid

log = logging.getLogger("kvserve.server")

HEADER_PREFIX = "x-llama-server-proxy-header-"
TIMEOUT_S = 600.0
# Request headers the proxy sets itself (the body is forwarded decoded; httpx sizes it).
_DROP_REQUEST = {"accept-encoding", "transfer-encoding", "content-length", "host"}
# Response headers that would be duplicated or wrong once re-sent by this server.
_DROP_RESPONSE = {"server", "transfer-encoding", "content-length", "keep-alive", "connection"}


def target_url(url: str | None) -> str:
    """Validate the ``url`` query parameter as llama-server does; the URL to request."""
    if not url:
        raise invalid("invalid target URL: missing url parameter")
    if "://" not in url:
        raise invalid("invalid URL: no scheme")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise invalid(f"unsupported URL scheme in target URL: {parts.scheme}")
    try:
        host, password, _ = parts.hostname, parts.password, parts.port
    except ValueError as e:  # a port that is not a number
        raise invalid(f"invalid target URL: {e}") from None
    if not host:
        raise invalid("invalid target URL: missing host")
    if password:
        raise invalid("authentication in target URL is not supported")
    return url if parts.path else parts._replace(path="/").geturl()


def forwarded_headers(request: Request) -> dict[str, str]:
    """The headers named with ``x-llama-server-proxy-header-``, with that prefix removed."""
    out: dict[str, str] = {}
    for key, value in request.headers.items():
        if not key.lower().startswith(HEADER_PREFIX):
            continue
        name = key[len(HEADER_PREFIX):]
        if name and name.lower() not in _DROP_REQUEST:
            out[name] = value
    return out


def client_module() -> Any:
    """httpx, imported on first use: a server without the proxy does not hold it (~4.5 MiB);
    one with it imports it at start (``create_app``)."""
    import httpx

    return httpx


async def proxy(request: Request) -> Response:
    httpx = client_module()
    url = target_url(request.query_params.get("url"))
    parsed = urlsplit(url)
    log.info("proxying %s request to %s://%s%s", request.method, parsed.scheme, parsed.netloc, parsed.path)
    client = httpx.AsyncClient(follow_redirects=True, timeout=TIMEOUT_S, trust_env=False)
    try:
        upstream = await client.send(
            client.build_request(request.method, url, headers=forwarded_headers(request),
                                 content=await request.body()),
            stream=True,
        )
    except httpx.HTTPError as e:
        await client.aclose()
        raise ApiError(f"proxy error: {type(e).__name__}: {e}", SERVER, code=502) from None
    headers = {k: v for k, v in upstream.headers.items()
               if k.lower() not in _DROP_RESPONSE and not k.lower().startswith("access-control-")}

    async def body() -> AsyncIterator[bytes]:
        try:
            async for chunk in upstream.aiter_raw():
                yield chunk
        finally:
            await upstream.aclose()
            await client.aclose()

    if upstream.status_code in (204, 304) or request.method == "HEAD":
        await upstream.aclose()
        await client.aclose()
        return Response(status_code=upstream.status_code, headers=headers)
    return StreamingResponse(body(), status_code=upstream.status_code, headers=headers)
