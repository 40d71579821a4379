"""Response bodies: native completion objects, OpenAI completion/chat objects and parts.

Key order follows llama-server (``server-task.cpp``) so raw bodies diff cleanly against it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kvserve.engine.request import FinalEvent, TokenProb
from kvserve.engine.stats import timings as engine_timings
from kvserve.server.chat_parsing import ChatMsg, parse_final
from kvserve.server.gensettings import generation_settings
from kvserve.server.params import CompletionParams
from kvserve.server.random_ids import random_alnum

LOWEST_FLOAT = -3.4028234663852886e38  # log(0) is reported as the lowest float, not -inf


def completion_id() -> str:
    """``chatcmpl-`` + 32 random alphanumerics (also used for text completions)."""
    return "chatcmpl-" + random_alnum(32)


@dataclass
class ResponseContext:
    """Per-HTTP-request facts shared by all results of that request."""

    model: str
    build_info: str
    params: CompletionParams
    prompt_texts: Sequence[str]  # per prompt (detokenized with specials), indexed by prompt number
    id: str = field(default_factory=completion_id)
    created: int = field(default_factory=lambda: int(time.time()))

    def prompt_text(self, index: int) -> str:
        n = max(1, self.params.n_cmpl)
        i = index // n
        return self.prompt_texts[i] if i < len(self.prompt_texts) else ""


# ---------------------------------------------------------------------------------------
# parts
# ---------------------------------------------------------------------------------------


def timings(ev: FinalEvent) -> dict[str, Any]:
    return engine_timings(ev.n_prompt, ev.n_cached, ev.n_decoded, ev.prompt_ms, ev.predicted_ms)


def usage(n_prompt: int, n_decoded: int, n_cached: int) -> dict[str, Any]:
    return {
        "completion_tokens": n_decoded,
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + n_decoded,
        "prompt_tokens_details": {"cached_tokens": n_cached},
    }


def _lp(v: float) -> float:
    return v if math.isfinite(v) else LOWEST_FLOAT


def prob_entry(p: TokenProb, post_sampling: bool) -> dict[str, Any]:
    """``{id, token, bytes, logprob, top_logprobs}`` or, post-sampling, ``prob``/``top_probs``
    (zero-probability candidates dropped)."""
    if post_sampling:
        return {"id": p.id, "token": p.token, "bytes": list(p.bytes), "prob": p.logprob,
                "top_probs": [{"id": t.id, "token": t.token, "bytes": list(t.bytes), "prob": t.logprob}
                              for t in p.top if t.logprob > 0.0]}
    return {"id": p.id, "token": p.token, "bytes": list(p.bytes), "logprob": _lp(p.logprob),
            "top_logprobs": [{"id": t.id, "token": t.token, "bytes": list(t.bytes), "logprob": _lp(t.logprob)}
                             for t in p.top]}


def probs_json(probs: Sequence[TokenProb], post_sampling: bool) -> list[dict[str, Any]]:
    return [prob_entry(p, post_sampling) for p in probs]


def finish_reason(stop_type: str, has_tool_calls: bool = False) -> str:
    if stop_type in ("eos", "word", "grammar"):
        return "tool_calls" if has_tool_calls else "stop"
    return "length"


def chat_message(ev: FinalEvent, params: CompletionParams) -> ChatMsg:
    """The assistant message of a chat result: reasoning and tool calls parsed out."""
    syntax = params.chat_syntax
    return parse_final(syntax, ev.content) if syntax is not None else ChatMsg(ev.content)


# ---------------------------------------------------------------------------------------
# native (/completion, /infill)
# ---------------------------------------------------------------------------------------


def native_final(ev: FinalEvent, ctx: ResponseContext, stream: bool) -> dict[str, Any]:
    p = ctx.params
    req = p.child(ev.index % max(1, p.n_cmpl))
    out: dict[str, Any] = {
        "index": ev.index,
        "content": "" if stream else ev.content,
        "tokens": [] if stream or not req.return_tokens else list(ev.tokens),
        "id_slot": ev.id_slot,
        "stop": True,
        "model": ctx.model,
        "tokens_predicted": ev.n_decoded,
        "tokens_evaluated": ev.n_prompt,
        "generation_settings": generation_settings(
            req, p.eog_ids, reasoning_format=p.reasoning_format, chat_format=p.chat_format,
            generation_prompt=p.generation_prompt),
        "prompt": ctx.prompt_text(ev.index),
        "has_new_line": ev.has_new_line,
        "truncated": ev.truncated,
        "stop_type": ev.stop_type,
        "stopping_word": ev.stopping_word,
        "tokens_cached": ev.tokens_cached,
        "timings": timings(ev),
    }
    if not stream and req.n_probs > 0:
        out["completion_probabilities"] = probs_json(ev.probs, req.post_sampling_probs)
    return out


def project_fields(obj: dict[str, Any], paths: list[str]) -> dict[str, Any]:
    """``response_fields``: ``a/b`` paths are un-nested under the literal key ``"a/b"``."""
    out: dict[str, Any] = {}
    for path in paths:
        cur: Any = obj
        ok = True
        for k in path.split("/"):
            if isinstance(cur, dict) and k in cur:
                cur = cur[k]
            else:
                ok = False
                break
        if ok:
            out[path] = cur
    return out


# ---------------------------------------------------------------------------------------
# OpenAI (/v1/completions, /v1/chat/completions)
# ---------------------------------------------------------------------------------------


def oai_completion(ev: FinalEvent, ctx: ResponseContext) -> dict[str, Any]:
    req = ctx.params.child(ev.index % max(1, ctx.params.n_cmpl))
    logprobs = ({"content": probs_json(ev.probs, req.post_sampling_probs)} if req.n_probs > 0 else None)
    choice = {"text": ev.content, "index": ev.index, "logprobs": logprobs, "finish_reason": finish_reason(ev.stop_type)}
    return _oai_final(ev, ctx, choice, "text_completion")


def oai_chat(ev: FinalEvent, ctx: ResponseContext) -> dict[str, Any]:
    req = ctx.params.child(ev.index % max(1, ctx.params.n_cmpl))
    msg = chat_message(ev, ctx.params)
    choice: dict[str, Any] = {"finish_reason": finish_reason(ev.stop_type, bool(msg.tool_calls)),
                              "index": ev.index, "message": msg.to_oai()}
    if req.n_probs > 0:
        choice["logprobs"] = {"content": probs_json(ev.probs, req.post_sampling_probs)}
    return _oai_final(ev, ctx, choice, "chat.completion")


def _oai_final(ev: FinalEvent, ctx: ResponseContext, choice: dict[str, Any], obj: str) -> dict[str, Any]:
    """The OpenAI final object around one choice (llama-server's key order)."""
    out: dict[str, Any] = {
        "choices": [choice],
        "created": ctx.created,
        "model": ctx.model,
        "system_fingerprint": ctx.build_info,
        "object": obj,
        "usage": usage(ev.n_prompt, ev.n_decoded, ev.n_cached),
        "id": ctx.id,
        "timings": timings(ev),
    }
    if ctx.params.verbose:
        out["__verbose"] = native_final(ev, ctx, stream=False)
    return out


def merge_oai(results: list[dict[str, Any]], n_cmpl: int) -> dict[str, Any]:
    """Several results (prompts x n) -> one object whose ``choices`` are all of theirs.

    Usage: completion tokens are summed; prompt/cached tokens once per prompt."""
    first = dict(results[0])
    first["choices"] = [c for r in results for c in r["choices"]]
    n = max(1, n_cmpl)
    heads = [r for r in results if r["choices"][0]["index"] % n == 0] or results[:1]
    n_prompt = sum(r["usage"]["prompt_tokens"] for r in heads)
    n_cached = sum(r["usage"]["prompt_tokens_details"]["cached_tokens"] for r in heads)
    n_decoded = sum(r["usage"]["completion_tokens"] for r in results)
    first["usage"] = usage(n_prompt, n_decoded, n_cached)
    return first
