"""``/embedding(s)`` (native) and ``/v1/embeddings`` (OpenAI), §2.8.

Inputs: ``input`` or ``content`` -- a string, a token array, or an array of those.
Native: ``[{"index", "embedding": [[floats], ...]}]`` (one vector when pooled, one per token
with pooling none). OpenAI: one pooled vector per input, ``float`` or ``base64`` (float32
little-endian); ``content`` instead of ``input`` switches /v1/embeddings to the native format.
Pooled vectors are normalized per ``embd_normalize`` (-1 none, 0 max-abs int16, 1 taxicab,
2 euclidean, >2 p-norm); per-token vectors are returned raw.
"""

from __future__ import annotations

import asyncio
import base64
import math
import struct
from typing import Any

from kvserve.server import fields as F
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import disabled_endpoint, from_exception, invalid, unsupported_field
from kvserve.server.prompts import tokenize_prompts, validate_tokens
from kvserve.server.settings import ServerSettings


def normalize(vec: list[float], mode: int) -> list[float]:
    if mode < 0:
        return list(vec)
    if mode == 0:
        m = max((abs(x) for x in vec), default=0.0)
        scale = 32760.0 / m if m > 0 else 0.0
        return [x * scale for x in vec]
    if mode == 1:
        s = sum(abs(x) for x in vec)
    elif mode == 2:
        s = math.sqrt(sum(x * x for x in vec))
    else:
        s = sum(abs(x) ** mode for x in vec) ** (1.0 / mode)
    norm = 1.0 / s if s > 0 else 0.0
    return [x * norm for x in vec]


_MEDIA_PARTS = ("image_url", "input_audio", "input_video")


def _content_text(entry: dict[str, Any]) -> str:
    """An OpenAI content entry ``{"content": [{"type": "text", "text": ...}, ...]}``: its text
    parts concatenated, as llama-server's ``tokenize_oai_content_array`` (media parts: 400)."""
    parts = entry["content"]
    if not isinstance(parts, list):
        raise invalid('"content" must be an array')
    text = ""
    for part in parts:
        ptype = part.get("type") if isinstance(part, dict) else None
        if ptype in _MEDIA_PARTS:
            raise unsupported_field(f"content[].type={ptype}", "multimodal embedding inputs are not implemented")
        if ptype != "text":
            raise invalid("unsupported content[].type")
        value = part.get("text", "")
        text += value if isinstance(value, str) else ""
    return text


def _inputs(body: dict[str, Any], oai: bool) -> tuple[Any, bool]:
    """(prompt, use_oai_format)."""
    if oai and body.get("input") is not None:
        return body["input"], True
    if body.get("content") is not None:
        return body["content"], False
    if not oai and body.get("input") is not None:
        return body["input"], False
    raise invalid('"input" or "content" must be provided')


async def compute(engine: EngineAPI, s: ServerSettings, body: dict[str, Any], oai: bool) -> Any:
    if not s.embedding:
        raise disabled_endpoint("embeddings", "--embeddings")
    prompt, oai_fmt = _inputs(body, oai)
    if isinstance(prompt, list) and not any(isinstance(p, int) for p in prompt):
        prompt = [_content_text(p) if isinstance(p, dict) and "content" in p else p for p in prompt]
    elif isinstance(prompt, dict) and "content" in prompt:
        prompt = _content_text(prompt)
    if isinstance(prompt, list) and any(isinstance(p, dict) for p in prompt) or isinstance(prompt, dict):
        raise unsupported_field("content", "multimodal embedding inputs are not implemented")
    encoding = "float"
    if oai_fmt:
        encoding = body.get("encoding_format", "float") or "float"
        if encoding not in ("float", "base64"):
            raise invalid("The format to return the embeddings in. Can be either float or base64")
        if s.pooling == "none":
            raise invalid("Pooling type 'none' is not OAI compatible. Please use a different pooling type")
    embd_normalize = F.get_int(body, "embd_normalize", s.embd_normalize)
    tok = engine.tokenizer
    token_lists = tokenize_prompts(tok, prompt, True, True)
    for t in token_lists:
        if not t:
            raise invalid("Input content cannot be empty")
        validate_tokens(t, tok.n_vocab)
    try:
        vectors = await asyncio.to_thread(engine.embed, token_lists, s.pooling)
    except Exception as e:
        raise from_exception(e) from e
    pooled = s.pooling != "none"
    results: list[dict[str, Any]] = []
    for i, vs in enumerate(vectors):
        vs = [normalize(list(v), embd_normalize) for v in vs] if pooled else [list(v) for v in vs]
        results.append({"index": i, "embedding": vs, "tokens_evaluated": len(token_lists[i])})
    if not oai_fmt:
        return [{"index": r["index"], "embedding": r["embedding"]} for r in results]
    data = []
    for r in results:
        vec = r["embedding"][0] if r["embedding"] else []
        if encoding == "base64":
            raw = struct.pack(f"<{len(vec)}f", *vec)
            data.append({"embedding": base64.b64encode(raw).decode("ascii"), "index": r["index"],
                         "object": "embedding", "encoding_format": "base64"})
        else:
            data.append({"embedding": vec, "index": r["index"], "object": "embedding"})
    n_tokens = sum(r["tokens_evaluated"] for r in results)
    model = body.get("model") if isinstance(body.get("model"), str) else s.model_id
    return {"model": model, "object": "list", "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            "data": data}
