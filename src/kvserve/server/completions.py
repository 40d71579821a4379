"""Completion-like endpoints: /completion, /v1/completions, /v1/chat/completions, /infill, and the
chat-based /v1/messages (Anthropic) and /v1/responses (OpenAI Responses).

Flow: body -> (Anthropic / Responses: converted to a chat body) -> (chat: rendered prompt) ->
prompts tokenized -> fields parsed -> one ``GenerationRequest`` per prompt x n_cmpl
(``index = prompt * n_cmpl + j``) -> engine.
Non-stream: wait for all results (polling for a disconnect), merge like llama-server.
Stream: the first event decides the status (an error is a plain JSON error), then SSE.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import enum
import functools
import os
import time
from collections.abc import Sequence as SequenceABC
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kvserve.engine.request import CacheIdentity, ErrorEvent, GenerationRequest
from kvserve.engine.slots import prompt_key
from kvserve.model import prefix_tokens
from kvserve.server import anthropic_out, responses_out, sse
from kvserve.server import responses as R
from kvserve.server.anthropic import anthropic_to_chat
from kvserve.server.chat import prepare_chat
from kvserve.server.chat_parsing.reasoning import detect_think_tags
from kvserve.server.chat_tools import template_source
from kvserve.server.dispatch import ClientGone, Dispatch, error_of
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import ApiError, invalid
from kvserve.server.jsonio import JSONResponse, error_response
from kvserve.server.grammar_fields import compile_grammar
from kvserve.server.params import CompletionParams, parse_completion_params
from kvserve.server.prompts import (
    build_infill,
    check_infill_support,
    tokenize_mixed,
    tokenize_prompts,
    validate_input_extra,
)
from kvserve.server.responses_api import responses_to_chat
from kvserve.server.settings import ServerSettings


# Request bodies at least this large are validated and tokenized in a worker thread.
PREPARE_IN_THREAD_BYTES = 2048
# Long bodies are prepared by a pool of threads of their own, min(8, cores) by default
# (KVSERVE_PREPARE_THREADS=N; 0: the event loop's default executor, min(32, cores + 4) threads).
# Each one holds the interpreter only around its tokenizer call, but every thread waiting for the
# interpreter competes with the engine thread and the event loop for it: on an H200 host (16 cores)
# a 64-request burst's cached round took 88-98 ms to a first token with 8, 99-108 with the
# default executor's 20 (docs/benchmarks.md)
_PREPARE_THREADS = int(os.environ.get("KVSERVE_PREPARE_THREADS", "") or min(8, os.cpu_count() or 1))
_prepare_pool: concurrent.futures.ThreadPoolExecutor | None = None


async def _in_thread(fn: Any, *args: Any) -> Any:
    global _prepare_pool
    if _PREPARE_THREADS <= 0:
        return await asyncio.to_thread(fn, *args)
    if _prepare_pool is None:
        _prepare_pool = concurrent.futures.ThreadPoolExecutor(_PREPARE_THREADS, thread_name_prefix="kvserve-prepare")
    ctx = contextvars.copy_context()
    return await asyncio.get_running_loop().run_in_executor(_prepare_pool, functools.partial(ctx.run, fn, *args))


class Kind(enum.Enum):
    NATIVE = "native"
    OAI_COMPLETION = "oai_completion"
    OAI_CHAT = "oai_chat"
    INFILL = "infill"
    ANTHROPIC = "anthropic"  # /v1/messages: an Anthropic body, converted to chat
    OAI_RESP = "oai_resp"  # /v1/responses: a Responses body, converted to chat

    @property
    def is_chat(self) -> bool:
        return self in (Kind.OAI_CHAT, Kind.ANTHROPIC, Kind.OAI_RESP)


def to_chat_body(kind: Kind, body: dict[str, Any], engine: EngineAPI) -> dict[str, Any]:
    """Anthropic and Responses bodies as the chat body they stand for (others unchanged)."""
    if kind is Kind.ANTHROPIC:
        return anthropic_to_chat(body, detect_think_tags(template_source(engine.chat_template)) is not None)
    if kind is Kind.OAI_RESP:
        return responses_to_chat(body)
    return body


def tenant_of(request: Request) -> str:
    """The API key the request authenticated with ("" without keys): the cache tenant."""
    return str(request.scope.get("state", {}).get("api_key", ""))


def prepare(kind: Kind, body: dict[str, Any], engine: EngineAPI, s: ServerSettings
            ) -> tuple[list[list[int]], CompletionParams]:
    """Validate and tokenize; every failure here is a 400 (or the 501 for infill support)."""
    tok = engine.tokenizer
    try:
        if kind is Kind.INFILL:
            check_infill_support(tok)
            for name in ("input_prefix", "input_suffix"):
                if name not in body:
                    raise invalid(f'"{name}" is required')
                if not isinstance(body[name], (str, list)):
                    raise invalid(f'"{name}" must be a string or an array of strings and tokens')
            extra = validate_input_extra(body.get("input_extra"))
        rendered = None
        if kind.is_chat:
            data, rendered = prepare_chat(to_chat_body(kind, body, engine), engine.chat_template, s)
            if kind is not Kind.OAI_CHAT and data.get("n", 1) != 1:
                raise invalid("only one result per request ('n' must be 1) on this endpoint")
        else:
            data = body
        if kind is Kind.INFILL:
            prompt = data.get("prompt", "")
            prompt_tokens = tokenize_mixed(tok, prompt if isinstance(prompt, (str, list)) else "", False, True)
            params = parse_completion_params(data, s, tok)
            prompts = [build_infill(tok, data["input_prefix"], data["input_suffix"], extra, prompt_tokens,
                                    s.n_batch, params.req.n_predict, engine.n_ctx_slot, s.spm_infill)]
        else:
            if "prompt" not in data:
                raise invalid("[json.exception.out_of_range.403] key 'prompt' not found")
            prompts = tokenize_prompts(tok, data["prompt"], True, True)
            params = parse_completion_params(data, s, tok)
            if rendered is not None:
                params.chat_syntax = rendered.syntax
                if rendered.tool_grammar is not None:
                    params.grammar = rendered.tool_grammar
                params.chat_format = "peg-native" if s.jinja else "Content-only"
        # validate_tokens' check, read from each prompt's bytes, which the engine's intake then
        # takes as they are (made here, in the worker thread, not on the engine thread)
        keys: list[tuple[list[int], bytes | None]] = []
        for p in prompts:
            ok, key = prompt_key(p, tok.n_vocab)
            if not ok:
                raise invalid("Prompt contains invalid tokens")
            keys.append((p, key))
        params.prompt_keys = keys
    except ApiError:
        raise
    except (ValueError, TypeError, KeyError) as e:
        raise invalid(str(e))
    return prompts, params


def build_requests(engine: EngineAPI, prompts: list[list[int]], params: CompletionParams,
                   identity: CacheIdentity, t_received: float = 0.0) -> list[GenerationRequest]:
    n = params.n_cmpl
    made = params.prompt_keys
    # a prompt's bytes go with it when they were made from this very list (prepare's)
    keys = [made[i][1] if i < len(made) and made[i][0] is toks else None for i, toks in enumerate(prompts)]
    return [
        GenerationRequest(id=engine.new_request_id(), prompt_tokens=list(toks), params=params.child(j),
                          identity=identity, index=i * n + j, t_received=t_received, prompt_key=keys[i])
        for i, toks in enumerate(prompts)
        for j in range(n)
    ]


def _final_json(kind: Kind, finals: list[Any], ctx: R.ResponseContext) -> Any:
    if kind is Kind.ANTHROPIC:
        return anthropic_out.message_body(finals[0], ctx)
    if kind is Kind.OAI_RESP:
        return responses_out.response_body(finals[0], ctx)
    if kind in (Kind.NATIVE, Kind.INFILL):
        objs = [R.native_final(ev, ctx, stream=False) for ev in finals]
        if ctx.params.response_fields:
            objs = [R.project_fields(o, ctx.params.response_fields) for o in objs]
        return objs[0] if len(objs) == 1 else objs
    fmt = R.oai_chat if kind is Kind.OAI_CHAT else R.oai_completion
    results = [fmt(ev, ctx) for ev in finals]
    return results[0] if len(results) == 1 else R.merge_oai(results, ctx.params.n_cmpl)


def _stream_format(kind: Kind, ctx: R.ResponseContext) -> sse.Format:
    if kind is Kind.ANTHROPIC:
        return anthropic_out.AnthropicFormat(ctx)
    if kind is Kind.OAI_RESP:
        return responses_out.ResponsesFormat(ctx)
    if kind is Kind.OAI_CHAT:
        return sse.OAIChatFormat(ctx)
    if kind is Kind.OAI_COMPLETION:
        return sse.OAICompletionFormat(ctx)
    return sse.NativeFormat(ctx)


class LazyDecoded(SequenceABC[str]):
    """Prompt texts (detokenized with special tokens), each decoded on first use."""

    def __init__(self, tokenizer: Any, prompts: list[list[int]]) -> None:
        self._tok = tokenizer
        self._prompts = prompts
        self._texts: dict[int, str] = {}

    def __len__(self) -> int:
        return len(self._prompts)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        text = self._texts.get(i)
        if text is None:
            text = self._texts[i] = self._tok.decode(self._prompts[i], True)
        return text


async def handle(request: Request, kind: Kind, body: dict[str, Any]) -> Response:
    t_received = time.perf_counter()  # the body is read and parsed; validation and tokenization follow
    engine: EngineAPI = request.app.state.engine
    s: ServerSettings = request.app.state.settings
    # long prompts' beginnings are kept for this tenant's next requests (its own trie, as its
    # own prompt cache); the request's task has a context of its own, which its thread copies
    prefix_tokens.TENANT.set(tenant_of(request))
    if len(await request.body()) >= PREPARE_IN_THREAD_BYTES:
        # a long prompt: tokenized in a worker thread (the tokenizer releases the interpreter
        # lock for long texts), so the requests of a burst are tokenized in parallel while the
        # event loop goes on streaming
        prompts, params = await _in_thread(prepare, kind, body, engine, s)
    else:
        prompts, params = prepare(kind, body, engine, s)
    params.req.grammar = await compile_grammar(engine, params.grammar)

    needs_prompt_text = kind in (Kind.NATIVE, Kind.INFILL) or params.verbose
    # decoded when a response needs it (the final result), not before the request is submitted
    prompt_texts = LazyDecoded(engine.tokenizer, prompts) if needs_prompt_text else []
    ctx = R.ResponseContext(model=s.model_id, build_info=s.build_info, params=params, prompt_texts=prompt_texts)

    reqs = build_requests(engine, prompts, params, CacheIdentity(tenant=tenant_of(request)), t_received)
    d = Dispatch(engine, timeout=s.timeout)
    d.submit(reqs)

    if not params.req.stream:
        try:
            finals = await d.collect(request)
        except ClientGone:
            return Response(status_code=200)
        return JSONResponse(_final_json(kind, finals, ctx))

    try:
        first = await d.next_or_gone(request)
    except ClientGone:
        return Response(status_code=200)
    except BaseException:
        d.cancel()
        raise
    if isinstance(first, ErrorEvent):
        d.cancel()
        return error_response(error_of(first))
    return sse.EngineStreamingResponse(d, _stream_format(kind, ctx), first, params.sse_ping_interval, on_close=d.cancel)
