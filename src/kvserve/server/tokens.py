"""Utility endpoints without inference: /tokenize, /detokenize, /apply-template, input_tokens."""

from __future__ import annotations

from typing import Any

from kvserve.server import fields as F
from kvserve.server.chat import chat_to_completion
from kvserve.server.engine_api import EngineAPI
from kvserve.server.errors import invalid
from kvserve.server.prompts import tokenize_mixed
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


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """The text subset of the OpenAI Responses input, as a chat body."""
    if "input" not in body:
        raise invalid("'input' is required")
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    inp = body["input"]
    if isinstance(inp, str):
        messages.append({"role": "user", "content": inp})
    elif isinstance(inp, list):
        for item in inp:
            if not isinstance(item, dict) or not isinstance(item.get("role"), str):
                raise invalid("'input' items must be messages with a 'role'")
            content = item.get("content")
            if isinstance(content, list):
                texts = []
                for part in content:
                    if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
                        raise invalid("'type' must be one of 'input_text' or 'output_text'")
                    texts.append(str(part.get("text", "")))
                content = "\n".join(texts)
            messages.append({"role": item["role"], "content": content if isinstance(content, str) else ""})
    else:
        raise invalid("'input' must be a string or an array")
    chat = {k: v for k, v in body.items() if k not in ("input", "instructions")}
    chat["messages"] = messages
    return chat


def input_tokens(engine: EngineAPI, s: ServerSettings, body: dict[str, Any], responses_api: bool) -> dict[str, Any]:
    chat = responses_to_chat(body) if responses_api else body
    prompt = chat_to_completion(chat, engine.chat_template, s)["prompt"]
    n = len(engine.tokenizer.encode(prompt, True, True))
    return {"input_tokens": n, "object": "response.input_tokens"}
