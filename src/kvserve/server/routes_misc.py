"""Routes without generation: health, models, props, slots, metrics, tokenizer utilities."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from starlette.responses import Response

from kvserve.server import info, metrics, sleep, tokens
from kvserve.server.completions import tenant_of
from kvserve.server.errors import UNAVAILABLE, ApiError, disabled_endpoint, from_exception, invalid
from kvserve.server.jsonio import JSONResponse, read_json, read_object
from kvserve.server.schemas import (
    AnthropicMessagesRequest,
    ChatCompletionRequest,
    DetokenizeRequest,
    ResponsesInputTokensRequest,
    SlotActionRequest,
    TokenizeRequest,
    doc_body,
)

SLOT_ACTIONS = ("save", "restore", "erase")


def valid_filename(name: str) -> bool:
    """A bare file name: no path separators, no ``..``, no control or reserved characters."""
    if not name or len(name.encode("utf-8")) > 255 or name in (".", ".."):
        return False
    if ".." in name or name != name.strip() or name.endswith("."):
        return False
    return not any(c in '/\\:*?"<>|' or ord(c) < 32 or ord(c) == 127 for c in name)


def make_router(prefix: str) -> APIRouter:
    r = APIRouter(prefix=prefix)

    @r.get("/health", tags=["server"])
    @r.get("/v1/health", tags=["server"], include_in_schema=False)
    async def health(request: Request) -> Response:
        """``{"status": "ok"}``; 503 while the model loads, or with the error when the engine
        cannot serve. Public."""
        err = request.app.state.engine.health()
        if err is not None:
            raise ApiError(err, UNAVAILABLE)
        return JSONResponse({"status": "ok"})

    @r.get("/models", tags=["server"], include_in_schema=False)
    @r.get("/v1/models", tags=["OpenAI"])
    async def models(request: Request) -> Response:
        """The served model (OpenAI ``data`` plus the ``models`` list)."""
        st = request.app.state
        if sleep.sleeping(st.engine):
            return JSONResponse(st.sleep_bodies["models"])
        return JSONResponse(info.models_body(st.engine, st.settings))

    @r.get("/props", tags=["server"])
    async def props(request: Request) -> Response:
        """Server defaults, slot count, chat template, build info."""
        st = request.app.state
        if sleep.sleeping(st.engine):
            return JSONResponse(st.sleep_bodies["props"])
        return JSONResponse(info.props_body(st.engine, st.settings))

    @r.post("/props", tags=["server"])
    async def set_props(request: Request) -> Response:
        """Needs --props; changes nothing (as llama-server)."""
        if not request.app.state.settings.endpoint_props:
            raise disabled_endpoint("changing global properties", "--props")
        await read_json(request)
        return JSONResponse({"success": True})

    @r.get("/slots", tags=["server"])
    async def slots(request: Request) -> Response:
        """Slot states (501 with --no-slots); ``?fail_on_no_slot=1`` gives 503 when all are busy."""
        st = request.app.state
        if not st.settings.endpoint_slots:
            raise disabled_endpoint("slots endpoint", "--slots")
        body = info.slots_body(st.engine)
        if request.query_params.get("fail_on_no_slot") not in (None, "", "0", "false") and not info.any_slot_idle(body):
            raise ApiError("no slot available", UNAVAILABLE)
        return JSONResponse(body)

    @r.post("/slots/{id_slot}", openapi_extra=doc_body(SlotActionRequest, required=False), tags=["server"])
    async def slot_action(request: Request, id_slot: str, action: str = "") -> Response:
        """``?action=save|restore|erase`` (needs --slot-save-path)."""
        st = request.app.state
        if not st.settings.slot_save_path:
            raise disabled_endpoint("slots action", "--slot-save-path")
        try:
            sid = int(id_slot)
        except ValueError:
            raise invalid("Invalid slot ID")
        if not 0 <= sid < st.settings.n_parallel:  # llama-server wraps it modulo n_slots instead
            raise invalid("Invalid slot ID")
        if action not in SLOT_ACTIONS:
            raise invalid("Invalid action")
        filename = ""
        if action != "erase":
            body = await read_object(request, empty_ok=True)
            raw = body.get("filename")
            filename = raw if isinstance(raw, str) else ""
            if not valid_filename(filename):
                raise invalid("Invalid filename")
        try:
            result = await asyncio.to_thread(st.engine.slot_action, sid, action, filename, tenant_of(request))
        except Exception as e:
            raise from_exception(e) from e
        return JSONResponse(result)

    @r.get("/metrics", tags=["server"])
    async def metrics_route(request: Request) -> Response:
        """Prometheus text (needs --metrics)."""
        st = request.app.state
        if not st.settings.endpoint_metrics:
            raise disabled_endpoint("metrics endpoint", "--metrics")
        snap = st.engine.metrics_snapshot()
        t_start = snap.get("t_start", st.t_start)
        return Response(metrics.render(snap).encode(), 200, headers={
            "content-type": metrics.CONTENT_TYPE, "process-start-time-unix": str(int(t_start))})

    @r.post("/tokenize", openapi_extra=doc_body(TokenizeRequest), tags=["llama.cpp"])
    async def tokenize(request: Request) -> Response:
        """Token ids (``with_pieces``: ``{id, piece}``; a non-UTF-8 piece is a byte list)."""
        return JSONResponse(tokens.tokenize(request.app.state.engine, await read_object(request)))

    @r.post("/detokenize", openapi_extra=doc_body(DetokenizeRequest), tags=["llama.cpp"])
    async def detokenize(request: Request) -> Response:
        return JSONResponse(tokens.detokenize(request.app.state.engine, await read_object(request)))

    @r.post("/apply-template", openapi_extra=doc_body(ChatCompletionRequest), tags=["llama.cpp"])
    async def apply_template(request: Request) -> Response:
        """The chat prompt the template renders (no inference)."""
        st = request.app.state
        return JSONResponse(tokens.apply_template(st.engine, st.settings, await read_object(request)))

    for path, api in (("/chat/completions/input_tokens", "chat"),
                      ("/v1/chat/completions/input_tokens", "chat"),
                      ("/responses/input_tokens", "responses"), ("/v1/responses/input_tokens", "responses"),
                      ("/v1/messages/count_tokens", "anthropic")):
        model = {"chat": ChatCompletionRequest, "responses": ResponsesInputTokensRequest,
                 "anthropic": AnthropicMessagesRequest}[api]

        def bind(api: str = api):
            async def input_tokens(request: Request) -> Response:
                """Prompt token count of a chat, Responses or Anthropic Messages body."""
                st = request.app.state
                body = await read_object(request)
                return JSONResponse(tokens.input_tokens(st.engine, st.settings, body, api))
            return input_tokens

        r.add_api_route(path, bind(), methods=["POST"], openapi_extra=doc_body(model),
                        tags=["Anthropic" if api == "anthropic" else "OpenAI"],
                        include_in_schema=path.startswith("/v1/"))

    @r.get("/lora-adapters", tags=["llama.cpp"])
    async def lora_list() -> Response:
        """No adapters are loaded (LoRA is not implemented)."""
        return JSONResponse([])

    @r.post("/lora-adapters", tags=["llama.cpp"])
    async def lora_set(request: Request) -> Response:
        body = await read_json(request)
        if not isinstance(body, list):
            raise invalid("Request body must be an array")
        if body:
            raise ApiError("Field 'lora' is not supported by this server: LoRA adapters are not implemented")
        return JSONResponse({"success": True})

    return r
