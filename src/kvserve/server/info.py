"""Bodies of the informational endpoints: /models, /props, /slots (§2.9, §2.10, §4.1)."""

from __future__ import annotations

import time
from typing import Any

from kvserve.engine.snapshot import SlotView
from kvserve.server.engine_api import EngineAPI
from kvserve.server.gensettings import default_settings
from kvserve.server.settings import ServerSettings

_TEMPLATE_CAPS_DEFAULT = {
    "supports_object_arguments": False,
    "supports_parallel_tool_calls": False,
    "supports_preserve_reasoning": False,
    "supports_reasoning_effort": False,
    "supports_string_content": True,
    "supports_system_role": True,
    "supports_tool_calls": False,
    "supports_tools": False,
    "supports_typed_content": False,
}


def models_body(engine: EngineAPI, s: ServerSettings) -> dict[str, Any]:
    info = engine.model_info()
    name = s.model_id
    meta = {
        "vocab_type": int(info.get("vocab_type", 0)),
        "n_vocab": int(info.get("n_vocab", engine.tokenizer.n_vocab)),
        "n_ctx": engine.n_ctx_slot,
        "n_ctx_train": int(info.get("n_ctx_train", 0)),
        "n_embd": int(info.get("n_embd", 0)),
        "n_params": int(info.get("n_params", 0)),
        "size": int(info.get("size", 0)),
        "ftype": str(info.get("ftype", "")),
    }
    return {
        "models": [{
            "name": name, "model": name, "modified_at": "", "size": "", "digest": "", "type": "model",
            "description": "", "tags": list(s.tags) or [""], "capabilities": ["completion"],
            "parameters": "",
            "details": {"parent_model": "", "format": "gguf", "family": "", "families": [""],
                        "parameter_size": "", "quantization_level": ""},
        }],
        "object": "list",
        "data": [{
            "id": name, "aliases": list(s.aliases), "tags": list(s.tags), "object": "model",
            "created": int(time.time()), "owned_by": "llamacpp", "meta": meta,
        }],
    }


def _template_source(tmpl: Any) -> str:
    for attr in ("source", "template", "text"):
        v = getattr(tmpl, attr, None)
        if isinstance(v, str):
            return v
    return ""


_caps_cache: dict[int, tuple[Any, dict[str, bool]]] = {}


def _template_caps(tmpl: Any) -> dict[str, bool]:
    """Cached per template object (the real template probes by rendering test conversations)."""
    hit = _caps_cache.get(id(tmpl))
    if hit is not None and hit[0] is tmpl:
        return dict(hit[1])
    out = _compute_caps(tmpl)
    _caps_cache[id(tmpl)] = (tmpl, out)
    return dict(out)


def _compute_caps(tmpl: Any) -> dict[str, bool]:
    caps = getattr(tmpl, "caps", None)
    if callable(caps):
        caps = caps()
    out = dict(_TEMPLATE_CAPS_DEFAULT)
    if isinstance(caps, dict):
        out.update({k: bool(v) for k, v in caps.items()})
    elif caps is not None:
        for k in out:
            if hasattr(caps, k):
                out[k] = bool(getattr(caps, k))
    return dict(sorted(out.items()))


def props_body(engine: EngineAPI, s: ServerSettings) -> dict[str, Any]:
    info = engine.model_info()
    tok = engine.tokenizer
    tmpl = engine.chat_template
    return {
        "default_generation_settings": {
            "params": default_settings(s.sampling_defaults, s.n_predict, s.n_keep),
            "n_ctx": engine.n_ctx_slot,
        },
        "total_slots": engine.n_slots,
        "model_alias": s.model_id,
        "model_ftype": str(info.get("ftype", "")),
        "model_path": str(info.get("path", s.model_path)),
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": s.media_marker,
        "endpoint_slots": s.endpoint_slots,
        "endpoint_props": s.endpoint_props,
        "endpoint_metrics": s.endpoint_metrics,
        "ui": s.ui,
        "ui_settings": s.ui_settings,
        "chat_template": _template_source(tmpl) if tmpl is not None else "",
        "chat_template_caps": _template_caps(tmpl),
        "bos_token": str(getattr(tok, "bos_token", "") or ""),
        "eos_token": str(getattr(tok, "eos_token", "") or ""),
        "build_info": s.build_info,
        "is_sleeping": False,
        "cors_proxy_enabled": s.mcp_proxy,
        **_cache_props(engine),
    }


def _cache_props(engine: EngineAPI) -> dict[str, Any]:
    """kvserve's prompt-cache settings and state (an extra key; llama-server clients ignore it)."""
    out: dict[str, Any] = {}
    info = getattr(engine, "cache_info", None)
    if callable(info):
        out["kvserve_cache"] = info()
    mem = getattr(engine, "memory_info", None)
    if callable(mem):
        out["kvserve_memory"] = mem()
    return out


def slot_json(v: SlotView) -> dict[str, Any]:
    """One slot in llama-server's ``GET /slots`` form (a never-used slot has no task fields)."""
    d: dict[str, Any] = {"id": v.id, "n_ctx": v.n_ctx, "speculative": False, "is_processing": v.is_processing}
    if v.id_task != -1:
        nt = v.next_token
        d.update({
            "id_task": v.id_task,
            "n_prompt_tokens": v.n_prompt_tokens,
            "n_prompt_tokens_processed": v.n_prompt_tokens_processed,
            "n_prompt_tokens_cache": v.n_prompt_tokens_cache,
            "params": v.sampling.to_json(metrics_only=True) if v.sampling is not None else {},
            "next_token": [{"has_next_token": nt.has_next_token, "has_new_line": nt.has_new_line,
                            "n_remain": nt.n_remain, "n_decoded": nt.n_decoded}],
        })
    return d


def slots_body(engine: EngineAPI) -> list[dict[str, Any]]:
    return [slot_json(v) for v in engine.slots_snapshot()]


def any_slot_idle(slots: list[dict[str, Any]]) -> bool:
    return any(not slot.get("is_processing", False) for slot in slots)
