"""Routes that run the model: completions, chat, Responses, Anthropic Messages, infill, embeddings (thin: see
completions.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from kvserve.server import cors_proxy, embeddings, rerank
from kvserve.server.agent_tools import route as agent_route
from kvserve.server.completions import Kind, handle
from kvserve.server.errors import unsupported_feature
from kvserve.server.jsonio import JSONResponse, read_object
from kvserve.server.schemas import (
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    InfillRequest,
    ResponsesRequest,
    doc_body,
)


def feature_disabled() -> Response:
    return JSONResponse({"error": {"message": "this feature is disabled", "type": "feature_disabled"}}, 403)


# Agent endpoints: 403 when not enabled (no --tools, -ag or MCP server; no --ui-mcp-proxy), as in
# llama-server. The router serves them too (app.state.agent_tools, app.state.settings).
async def tools_endpoint(request: Request) -> Response:
    registry = request.app.state.agent_tools
    if registry is None:
        return feature_disabled()
    if request.method == "GET":
        return agent_route.list_tools(registry)
    return await agent_route.call_tool(request, registry)


async def cors_proxy_endpoint(request: Request) -> Response:
    if not request.app.state.settings.mcp_proxy:
        return feature_disabled()
    return await cors_proxy.proxy(request)


def _generation(kind: Kind, name: str, doc: str) -> Callable[[Request], Awaitable[Response]]:
    """The handler of a route that runs the model: the body read as a JSON object, then ``handle``."""

    async def endpoint(request: Request) -> Response:
        return await handle(request, kind, await read_object(request))

    endpoint.__name__ = endpoint.__qualname__ = name  # the API description's names
    endpoint.__doc__ = doc
    return endpoint


completion = _generation(Kind.NATIVE, "completion", "Native completion; several prompts give an array of results.")
oai_completion = _generation(Kind.OAI_COMPLETION, "oai_completion",
                             "OpenAI text completion (``choices[].text``), SSE ends with ``data: [DONE]``.")
chat_completion = _generation(Kind.OAI_CHAT, "chat_completion", "OpenAI chat completion.")
oai_responses = _generation(Kind.OAI_RESP, "oai_responses",
                            "OpenAI Responses (run as a chat completion); SSE events named ``response.*``.")
anthropic_messages = _generation(Kind.ANTHROPIC, "anthropic_messages",
                                 "Anthropic Messages (run as a chat completion); SSE ``message_start`` … "
                                 "``message_stop``.")
infill = _generation(Kind.INFILL, "infill", "Fill-in-the-middle (needs the model's FIM tokens); native completion "
                     "format.")


# The routes that run the model: (path, handler, request body documented, tags, in the API description).
# Their POSTs skip FastAPI's routing (server/fast_routes.py); these are the handlers both ways.
GENERATION: tuple[tuple[str, Any, Any, str, bool], ...] = (
    ("/completion", completion, CompletionRequest, "llama.cpp", True),
    ("/completions", completion, CompletionRequest, "llama.cpp", False),
    ("/v1/completions", oai_completion, CompletionRequest, "OpenAI", True),
    ("/v1/chat/completions", chat_completion, ChatCompletionRequest, "OpenAI", True),
    ("/chat/completions", chat_completion, ChatCompletionRequest, "OpenAI", False),
    ("/v1/responses", oai_responses, ResponsesRequest, "OpenAI", True),
    ("/responses", oai_responses, ResponsesRequest, "OpenAI", False),
    ("/v1/messages", anthropic_messages, AnthropicMessagesRequest, "Anthropic", True),
    ("/infill", infill, InfillRequest, "llama.cpp", True),
)


def generation_routes(prefix: str) -> dict[str, Any]:
    """Full path -> handler of the routes that run the model."""
    return {prefix + path: handler for path, handler, *_ in GENERATION}


def make_router(prefix: str) -> APIRouter:
    r = APIRouter(prefix=prefix)
    for path, handler, schema, tag, documented in GENERATION:
        r.add_api_route(path, handler, methods=["POST"], openapi_extra=doc_body(schema), tags=[tag],
                        include_in_schema=documented)

    @r.post("/embedding", openapi_extra=doc_body(EmbeddingRequest), tags=["llama.cpp"])
    @r.post("/embeddings", openapi_extra=doc_body(EmbeddingRequest), tags=["llama.cpp"],
            include_in_schema=False)
    async def embedding(request: Request) -> Response:
        """Native embeddings (needs --embeddings)."""
        st = request.app.state
        return JSONResponse(await embeddings.compute(st.engine, st.settings, await read_object(request), oai=False))

    @r.post("/v1/embeddings", openapi_extra=doc_body(EmbeddingRequest), tags=["OpenAI"])
    async def oai_embeddings(request: Request) -> Response:
        """OpenAI embeddings (needs --embeddings)."""
        st = request.app.state
        return JSONResponse(await embeddings.compute(st.engine, st.settings, await read_object(request), oai=True))

    for path in ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"):
        @r.post(path, include_in_schema=False)
        async def rerank_route(request: Request) -> Response:
            st = request.app.state
            return JSONResponse(await rerank.compute(st.engine, st.settings, await read_object(request)))

    r.add_api_route("/tools", tools_endpoint, methods=["GET", "POST"], include_in_schema=False)
    r.add_api_route("/cors-proxy", cors_proxy_endpoint, methods=["GET", "POST"], include_in_schema=False)

    return r
