"""Endpoints without inference: /tokenize, /detokenize, /apply-template, input_tokens, count_tokens."""

from __future__ import annotations

from typing import Any

from kvserve.server import fields as F
from kvserve.server.anthropic import anthropic_to_chat
from kvserve.server.chat import chat_to_completion
from kvserve.server.chat_parsing.reasoning import detect_think_tags
from kvserve.server.chat_tools import template_source
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import invalid
from kvserve.server.prompts import tokenize_mixed
from kvserve.server.responses_api import responses_to_chat
from kvserve.server.settings import ServerSettings


def _piece(raw: bytes) -> str | list[int]:
    """A piece that is not valid UTF-8 on its own is returned as its byte values."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def tokenize(engine: EngineAPI, body: dict[str, Any]) -> dict[str, Any]:
    """``content`` (string or mixed array); ``add_special`` false, ``parse_special`` true by default."""
    if "content" not in body or body["content"] is None:
        return {"tokens": []}
    add_special = F.get_bool(body, "add_special", False)
    parse_special = F.get_bool(body, "parse_special", True)
    with_pieces = F.get_bool(body, "with_pieces", False)
    tok = engine.tokenizer
    ids = tokenize_mixed(tok, body["content"], add_special, parse_special)
    if not with_pieces:
        return {"tokens": ids}
    return {"tokens": [{"id": t, "piece": _piece(tok.token_bytes(t))} for t in ids]}


def detokenize(engine: EngineAPI, body: dict[str, Any]) -> dict[str, Any]:
    """The concatenated pieces (special tokens rendered), as llama-server's tokens_to_str."""
    ids = body.get("tokens") or []
    if not isinstance(ids, list):
        raise invalid("[json.exception.type_error.302] type must be array, but is " + F.json_type(ids))
    tok = engine.tokenizer
    out = bytearray()
    for t in ids:
        if isinstance(t, bool) or not isinstance(t, int):
            raise invalid("[json.exception.type_error.302] type must be number, but is " + F.json_type(t))
        if not 0 <= t < tok.n_vocab:
            raise invalid(f"Invalid token id: {t}")
        out += tok.token_bytes(t)
    return {"content": out.decode("utf-8", "replace")}


def apply_template(engine: EngineAPI, s: ServerSettings, body: dict[str, Any]) -> dict[str, Any]:
    return {"prompt": chat_to_completion(body, engine.chat_template, s)["prompt"]}


def input_tokens(engine: EngineAPI, s: ServerSettings, body: dict[str, Any],
                 api: str = "chat") -> dict[str, Any]:
    """The prompt token count of a chat body (``api`` "chat"), a Responses body ("responses") or
    an Anthropic Messages body ("anthropic": no ``object`` key, as llama-server)."""
    if api == "responses":
        chat = responses_to_chat(body)
    elif api == "anthropic":
        chat = anthropic_to_chat(body, detect_think_tags(template_source(engine.chat_template)) is not None)
    else:
        chat = body
    prompt = chat_to_completion(chat, engine.chat_template, s)["prompt"]
    n = len(engine.tokenizer.encode(prompt, True, True))
    if api == "anthropic":
        return {"input_tokens": n}
    return {"input_tokens": n, "object": "response.input_tokens"}
