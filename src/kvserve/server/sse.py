"""Server-sent events: framing, per-API chunk formats and the streaming loop.

Framing: each event is ``data: <json>\\n\\n`` (Anthropic and Responses streams put an
``event: <type>`` line before it; their formats live in ``anthropic_out`` / ``responses_out``);
``:\\n\\n`` (a comment) is a keep-alive sent after ``sse_ping_interval`` seconds of silence.
Native streams just end; OpenAI streams end with ``data: [DONE]\\n\\n``. An error after the
stream started is ``data: {"error": …}`` (Anthropic: ``event: error``) and the stream closes (no
``[DONE]``). The HTTP status is decided before the stream starts (see ``completions.py``: an error
as first event is a plain JSON error response).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from kvserve.engine.request import EngineEvent, ErrorEvent, FinalEvent, ProgressEvent, TokenEvent
from kvserve.server import responses as R
from kvserve.server.chat_parsing import ChatStream
from kvserve.server.errors import ApiError
from kvserve.server.dispatch import ClientGone, Dispatch, error_event_body
from kvserve.server.http_wire import WRITE_NOWAIT
from kvserve.server.jsonio import dumps, encode_basestring

SSE_HEADERS = {"content-type": "text/event-stream", "x-accel-buffering": "no"}
PING = ":\n\n"
DONE = "data: [DONE]\n\n"


def frame(obj: Any) -> str:
    return "data: " + dumps(obj) + "\n\n"


def _ints(xs: list[int]) -> str:
    """A JSON array of ints, as ``dumps`` writes it."""
    return f"[{xs[0]}]" if len(xs) == 1 else "[" + ",".join(map(str, xs)) + "]"


def _plain(ev: TokenEvent, req: Any) -> bool:
    """A token event whose chunk is text and counters only (no timings, no probabilities):
    what ``fast_token`` writes from a template."""
    return not ev.timings and not (req.n_probs > 0 and ev.probs)


def _progress(ev: ProgressEvent) -> dict[str, Any]:
    """``prompt_progress`` (``time_ms`` whole milliseconds, as llama-server's int64)."""
    return {"total": ev.total, "cache": ev.cache, "processed": ev.processed, "time_ms": int(ev.time_ms)}


def _with_progress(out: dict[str, Any], ev: ProgressEvent) -> dict[str, Any]:
    """A progress chunk: ``timings`` so far (with ``timings_per_token``), then ``prompt_progress``."""
    if ev.timings:
        out["timings"] = ev.timings
    out["prompt_progress"] = _progress(ev)
    return out


class NativeFormat:
    """``/completion`` and ``/infill``: partials, then the final object (content ""), no [DONE]."""

    done_marker = ""
    encode = staticmethod(frame)  # one chunk -> SSE text
    error_frame = staticmethod(frame)  # an error body after the stream started -> SSE text

    def __init__(self, ctx: R.ResponseContext):
        self.ctx = ctx

    def fast_token(self, ev: TokenEvent) -> str | None:
        """The SSE text of ``ev`` written from a template, byte for byte what
        ``encode(token(ev)[0])`` gives, where the chunk is plain (else None: the caller renders
        it). Every streamed token goes through here, so it builds no dict and runs no encoder."""
        if not _plain(ev, self.ctx.params.req):
            return None
        return (f'data: {{"index":{ev.index},"content":{encode_basestring(ev.text)},"tokens":{_ints(ev.tokens)},'
                f'"stop":false,"id_slot":-1,"tokens_predicted":{ev.n_decoded},"tokens_evaluated":{ev.n_prompt}}}\n\n')

    def _partial(self, index: int, text: str, tokens: list[int], n_decoded: int, n_prompt: int) -> dict[str, Any]:
        return {"index": index, "content": text, "tokens": tokens, "stop": False, "id_slot": -1,
                "tokens_predicted": n_decoded, "tokens_evaluated": n_prompt}

    def token(self, ev: TokenEvent) -> list[Any]:
        out = self._partial(ev.index, ev.text, list(ev.tokens), ev.n_decoded, ev.n_prompt)
        if ev.timings:
            out["timings"] = ev.timings
        req = self.ctx.params.req
        if req.n_probs > 0 and ev.probs:
            out["completion_probabilities"] = R.probs_json(ev.probs, req.post_sampling_probs)
        return [out]

    def progress(self, ev: ProgressEvent) -> list[Any]:
        out = self._partial(ev.index, "", [], 0, ev.total)
        return [_with_progress(out, ev)]

    def final(self, ev: FinalEvent) -> list[Any]:
        obj = R.native_final(ev, self.ctx, stream=True)
        if self.ctx.params.response_fields:
            obj = R.project_fields(obj, self.ctx.params.response_fields)
        return [obj]


class OAICompletionFormat(NativeFormat):
    done_marker = DONE

    def __init__(self, ctx: R.ResponseContext):
        super().__init__(ctx)
        self._tail: str | None = None

    def fast_token(self, ev: TokenEvent) -> str | None:
        if not _plain(ev, self.ctx.params.req):
            return None
        if self._tail is None:  # what follows the choice: the same for every chunk of the stream
            c = self.ctx
            self._tail = (f'],"created":{dumps(c.created)},"model":{dumps(c.model)},"system_fingerprint":'
                          f'{dumps(c.build_info)},"object":"text_completion","id":{dumps(c.id)}}}\n\n')
        return (f'data: {{"choices":[{{"text":{encode_basestring(ev.text)},"index":{ev.index},"logprobs":null,'
                f'"finish_reason":null}}' + self._tail)

    def _chunk(self, choice: dict[str, Any], **extra: Any) -> dict[str, Any]:
        c = self.ctx
        out: dict[str, Any] = {"choices": [choice], "created": c.created, "model": c.model,
                               "system_fingerprint": c.build_info, "object": "text_completion"}
        out.update(extra)
        out["id"] = c.id
        return out

    def token(self, ev: TokenEvent) -> list[Any]:
        req = self.ctx.params.req
        lp = {"content": R.probs_json(ev.probs, req.post_sampling_probs)} if req.n_probs > 0 and ev.probs else None
        out = self._chunk({"text": ev.text, "index": ev.index, "logprobs": lp, "finish_reason": None})
        if ev.timings:
            out["timings"] = ev.timings
        return [out]

    def progress(self, ev: ProgressEvent) -> list[Any]:
        out = self._chunk({"text": "", "index": ev.index, "logprobs": None, "finish_reason": None})
        return [_with_progress(out, ev)]

    def final(self, ev: FinalEvent) -> list[Any]:
        out = self._chunk({"text": "", "index": ev.index, "logprobs": None,
                           "finish_reason": R.finish_reason(ev.stop_type)},
                          usage=R.usage(ev.n_prompt, ev.n_decoded, ev.n_cached))
        out["timings"] = R.timings(ev)
        return [out]


class OAIChatFormat(NativeFormat):
    done_marker = DONE

    def __init__(self, ctx: R.ResponseContext):
        super().__init__(ctx)
        self.started: set[int] = set()
        self.syntax = ctx.params.chat_syntax
        self.parsing = self.syntax is not None and not self.syntax.is_plain
        self.streams: dict[int, ChatStream] = {}
        self._tail: str | None = None

    def fast_token(self, ev: TokenEvent) -> str | None:
        """Plain content deltas (no reasoning or tool-call parsing) after the role chunk."""
        if self.parsing or not ev.text or ev.index not in self.started or not _plain(ev, self.ctx.params.req):
            return None
        if self._tail is None:
            c = self.ctx
            self._tail = (f'],"created":{dumps(c.created)},"id":{dumps(c.id)},"model":{dumps(c.model)},'
                          f'"system_fingerprint":{dumps(c.build_info)},"object":"chat.completion.chunk"}}\n\n')
        return (f'data: {{"choices":[{{"finish_reason":null,"index":{ev.index},"delta":{{"content":'
                f'{encode_basestring(ev.text)}}}}}' + self._tail)

    def _stream(self, index: int) -> ChatStream:
        if index not in self.streams:
            assert self.syntax is not None
            self.streams[index] = ChatStream(self.syntax)
        return self.streams[index]

    def _diff_chunks(self, index: int, deltas: list[dict[str, Any]]) -> list[Any]:
        return [self._chunk([{"finish_reason": None, "index": index, "delta": d}]) for d in deltas]

    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        c = self.ctx
        return {"choices": choices, "created": c.created, "id": c.id, "model": c.model,
                "system_fingerprint": c.build_info, "object": "chat.completion.chunk"}

    def _role(self, index: int) -> dict[str, Any]:
        return self._chunk([{"finish_reason": None, "index": index,
                             "delta": {"role": "assistant", "content": None}}])

    def _begin(self, index: int) -> list[Any]:
        if index in self.started:
            return []
        self.started.add(index)
        return [self._role(index)]

    def token(self, ev: TokenEvent) -> list[Any]:
        out = self._begin(ev.index)
        req = self.ctx.params.req
        has_lp = req.n_probs > 0 and bool(ev.probs)
        if self.parsing:
            diffs = self._diff_chunks(ev.index, [d.to_delta() for d in self._stream(ev.index).update(ev.text)])
            if diffs and has_lp:
                diffs[-1]["choices"][0]["logprobs"] = {"content": R.probs_json(ev.probs, req.post_sampling_probs)}
            out += diffs
        elif ev.text or has_lp:
            choice: dict[str, Any] = {"finish_reason": None, "index": ev.index, "delta": {"content": ev.text}}
            if has_lp:
                choice["logprobs"] = {"content": R.probs_json(ev.probs, req.post_sampling_probs)}
            out.append(self._chunk([choice]))
        if ev.timings and out:
            out[-1]["timings"] = ev.timings
        return out

    def progress(self, ev: ProgressEvent) -> list[Any]:
        out = self._role(ev.index)
        return [_with_progress(out, ev)]

    def final(self, ev: FinalEvent) -> list[Any]:
        out = self._begin(ev.index)
        has_calls = False
        if self.parsing:
            stream = self._stream(ev.index)
            out += self._diff_chunks(ev.index, [d.to_delta() for d in stream.finish(ev.content)])
            has_calls = bool(stream.msg.tool_calls)
        out.append(self._chunk([{"finish_reason": R.finish_reason(ev.stop_type, has_calls), "index": ev.index,
                                 "delta": {}}]))
        if self.ctx.params.include_usage:
            u = self._chunk([])
            u["usage"] = R.usage(ev.n_prompt, ev.n_decoded, ev.n_cached)
            out.append(u)
        out[-1]["timings"] = R.timings(ev)
        return out


class Format(Protocol):
    """What a stream format provides (``NativeFormat`` and its kin, the Anthropic and Responses ones)."""

    done_marker: str

    def encode(self, chunk: Any) -> str: ...
    def error_frame(self, body: dict[str, Any]) -> str: ...
    def fast_token(self, ev: TokenEvent) -> str | None: ...
    def token(self, ev: TokenEvent) -> list[Any]: ...
    def progress(self, ev: ProgressEvent) -> list[Any]: ...
    def final(self, ev: FinalEvent) -> list[Any]: ...


def render(fmt: Format, ev: EngineEvent) -> list[Any]:
    if isinstance(ev, TokenEvent):
        return fmt.token(ev)
    if isinstance(ev, ProgressEvent):
        return fmt.progress(ev)
    if isinstance(ev, FinalEvent):
        return fmt.final(ev)
    raise TypeError(type(ev))


async def stream_events(d: Dispatch, fmt: Format, first: EngineEvent, ping_s: int,
                        write: Callable[[bytes], Awaitable[None]],
                        write_nowait: Callable[[bytes], bool] | None = None) -> None:
    """Write the SSE bytes of ``first`` and of every later event, pings in silent stretches.
    One write per event: a client shows each token as it comes.

    ``write_nowait`` (the connection's direct body write, ``http_wire.WRITE_NOWAIT``): plain
    token chunks go out through it, also straight from the event's delivery while this task
    waits (``Dispatch.handle_on_delivery``); where it declines, through ``write``."""
    last = [time.monotonic()]  # when bytes last went out (for pings)
    if write_nowait is not None:
        def on_delivery(ev: EngineEvent) -> bool:
            if type(ev) is not TokenEvent:
                return False
            text = fmt.fast_token(ev)
            if text is None or not write_nowait(text.encode()):
                return False
            last[0] = time.monotonic()
            return True

        d.handle_on_delivery(on_delivery)
    ev: EngineEvent | None = first
    try:
        while True:
            if ev is not None:
                if type(ev) is TokenEvent and (text := fmt.fast_token(ev)) is not None:
                    data = text.encode()
                    if write_nowait is None or not write_nowait(data):
                        await write(data)
                    last[0] = time.monotonic()
                elif isinstance(ev, ErrorEvent):
                    d.cancel()
                    await write(fmt.error_frame(error_event_body(ev)).encode())
                    return
                else:
                    chunks = render(fmt, ev)
                    if chunks:
                        await write("".join(fmt.encode(c) for c in chunks).encode())
                        last[0] = time.monotonic()
            if d.done:
                break
            ev = d.next_nowait()  # the next event is often here already
            if ev is not None:
                continue
            wait = 1.0 if ping_s <= 0 else max(0.01, min(1.0, ping_s - (time.monotonic() - last[0])))
            try:
                d.check_timeout()
            except ApiError as e:
                await write(fmt.error_frame(e.body()).encode())
                return
            ev = await d.next(wait)
            if ev is None and ping_s > 0 and time.monotonic() - last[0] >= ping_s:
                await write(PING.encode())
                last[0] = time.monotonic()
        if fmt.done_marker:
            await write(fmt.done_marker.encode())
    except ClientGone:
        return
    finally:
        d.cancel()


class EngineStreamingResponse(StreamingResponse):
    """The SSE response of a request's engine events (``stream_events`` writes each one
    straight to ``send``, no generator in between); ``on_close`` runs however the response ends
    (done, client disconnect, send failure, server shutdown).

    A client that goes away is noticed by one task waiting for ``http.disconnect`` (as
    Starlette's streaming response does, without its task group and cancel scopes, which cost
    more than the rest of a short response's own work): it runs ``on_close`` (the engine
    requests are cancelled), which wakes the stream, which then ends."""

    def __init__(self, d: Dispatch, fmt: Format, first: EngineEvent, ping_s: int, on_close: Callable[[], None]):
        # what StreamingResponse.__init__ sets, without a body iterator: stream_response writes
        self.status_code = 200
        self.media_type = None
        self.background = None
        self.init_headers(SSE_HEADERS)
        self._events = (d, fmt, first, ping_s)
        self._on_close = on_close
        self._write_nowait: Callable[[bytes], bool] | None = None

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})

        async def write(body: bytes) -> None:
            await send({"type": "http.response.body", "body": body, "more_body": True})

        await stream_events(*self._events, write, self._write_nowait)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._write_nowait = scope.get(WRITE_NOWAIT)
        watch = asyncio.get_running_loop().create_task(self._watch(receive))
        try:
            await self.stream_response(send)
        finally:
            watch.cancel()
            self._on_close()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._on_close()
