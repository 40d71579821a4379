"""``/rerank`` (also ``/reranking``, ``/v1/rerank``, ``/v1/reranking``), spec §2.8.

Needs ``--reranking`` (or ``--embedding --pooling rank``); otherwise llama-server's 501.

Request: ``query`` (a string), ``documents`` (Jina) or ``texts`` (TEI, switches the response
format), ``top_n`` (default: all), ``return_text`` (TEI only), ``model`` (echoed, Jina only).
Each document is scored on its own prompt (``rerank_tokens``); the results are sorted by score,
highest first, and cut to ``top_n``.

Jina: ``{"model", "object": "list", "usage": {"prompt_tokens", "total_tokens"},
"results": [{"index", "relevance_score"}]}``; TEI: ``[{"index", "score"[, "text"]}]``.

Where llama-server reads a field leniently (``json_value``) kvserve does the same for
``documents``/``texts`` (anything but a non-empty array of strings is the same 400) and
``return_text``; a ``top_n`` that is not an integer or is negative is a 400 here (llama-server
silently uses all documents, or fails with a 500 for a negative one).
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvserve.server.engine_api import EngineAPI, TokenizerLike
from kvserve.server.errors import disabled_endpoint, from_exception, invalid
from kvserve.server.prompts import validate_tokens
from kvserve.server.settings import ServerSettings


def rerank_tokens(tok: TokenizerLike, template: str | None, query: str, doc: str) -> list[int]:
    """llama-server's ``format_prompt_rerank``: the model's rerank template with ``{query}`` and
    ``{document}`` filled in (special tokens parsed), else ``[BOS] query [EOS] [SEP] doc [EOS]``
    with each optional token as the vocabulary asks for it (EOS falls back to SEP)."""
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", doc)
        return tok.encode(prompt, add_special=False, parse_special=True)
    eos = tok.eos_id if tok.eos_id is not None else getattr(tok, "sep_id", None)
    out: list[int] = []
    if tok.add_bos and tok.bos_id is not None:
        out.append(tok.bos_id)
    out += tok.encode(query, add_special=False, parse_special=False)
    if getattr(tok, "add_eos", False) and eos is not None:
        out.append(eos)
    sep = getattr(tok, "sep_id", None)
    if getattr(tok, "add_sep", False) and sep is not None:
        out.append(sep)
    out += tok.encode(doc, add_special=False, parse_special=False)
    if getattr(tok, "add_eos", False) and eos is not None:
        out.append(eos)
    return out


def _documents(body: dict[str, Any]) -> list[str]:
    for name in ("documents", "texts"):
        v = body.get(name)
        if isinstance(v, list) and all(isinstance(d, str) for d in v):
            return list(v)
    raise invalid('"documents" must be a non-empty string array')


def _top_n(body: dict[str, Any], n_docs: int) -> int:
    v = body.get("top_n")
    if v is None:
        return n_docs
    if isinstance(v, bool) or not isinstance(v, int):
        raise invalid('"top_n" must be a non-negative integer')
    if v < 0:
        raise invalid('"top_n" must be a non-negative integer')
    return v


def format_response(body: dict[str, Any], model_name: str, scores: list[float], n_tokens: list[int],
                    documents: list[str], tei: bool, top_n: int) -> Any:
    """llama-server's ``format_response_rerank`` (a stable sort by score, highest first)."""
    label = "score" if tei else "relevance_score"
    return_text = tei and body.get("return_text") is True
    elements: list[dict[str, Any]] = []
    for i, score in enumerate(scores):
        elem: dict[str, Any] = {"index": i, label: score}
        if return_text:
            elem["text"] = documents[i]
        elements.append(elem)
    elements.sort(key=lambda e: -e[label])
    results = elements[:top_n]
    if tei:
        return results
    total = sum(n_tokens)
    model = body.get("model") if isinstance(body.get("model"), str) else model_name
    return {"model": model, "object": "list", "usage": {"prompt_tokens": total, "total_tokens": total},
            "results": results}


async def compute(engine: EngineAPI, s: ServerSettings, body: dict[str, Any]) -> Any:
    if not s.reranking:
        raise disabled_endpoint("reranking", "--reranking")
    tei = "texts" in body
    if "query" not in body:
        raise invalid('"query" must be provided')
    query = body["query"]
    if not isinstance(query, str):
        raise invalid('"query" must be a string')
    documents = _documents(body)
    if not documents:
        raise invalid('"documents" must be a non-empty string array')
    top_n = _top_n(body, len(documents))
    tok = engine.tokenizer
    prompts = [rerank_tokens(tok, engine.rerank_template, query, d) for d in documents]
    for p in prompts:
        if not p:
            raise invalid("Input content cannot be empty")
        validate_tokens(p, tok.n_vocab)
    try:
        scores = await asyncio.to_thread(engine.rank, prompts)
    except Exception as e:
        raise from_exception(e) from e
    return format_response(body, s.model_id, scores, [len(p) for p in prompts], documents, tei, top_n)
