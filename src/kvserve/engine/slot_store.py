"""Slot persistence (POST /slots/{id}?action=save|restore|erase).

A file holds the slot's cached tokens, their KV rows and the cache identity they were computed
under; restore refuses a file from another model or tenant. Restored KV is handed to the shared
prefix cache, so any slot's next request with that prefix reuses it.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

from .errors import EngineError
from .request import CacheIdentity

MAGIC = "kvserve-slot"
VERSION = 1


def _identity(engine: Any, tenant: str) -> tuple[Any, ...]:
    """What a slot file must match to be restored: model, KV and context settings, tenant."""
    return engine.scheduler.identity_key(CacheIdentity(tenant=tenant))


def _namespace(engine: Any, tenant: str, slot_id: int) -> tuple[Any, ...]:
    return engine.scheduler.namespace(CacheIdentity(tenant=tenant), slot_id)


def save(engine: Any, slot_id: int, path: str, tenant: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    slot = engine.scheduler.slots[slot_id]
    ns = _namespace(engine, tenant, slot_id)
    tokens = list(slot.prompt_tokens)
    m = engine.cache.index.lookup(ns, tokens, touch=False) if tokens else None
    n = m.n_hit if m is not None else 0
    pages = [node.page for node in m.nodes] if m is not None else []
    if -1 in pages:  # pages on the host tier: the device-resident prefix is saved
        pages = pages[: pages.index(-1)]
        n = min(n, len(pages) * engine.cache.page_size)
    engine.flush_copies()
    kv = engine.runner.kv
    rows = kv.rows(pages, 0, n) if n else torch.zeros(0, dtype=torch.int64)
    blob = {
        "magic": MAGIC,
        "version": VERSION,
        "identity": list(_identity(engine, tenant)),
        "tokens": tokens[:n],
        "k": kv.k[:, rows].cpu(),
        "v": kv.v[:, rows].cpu(),
    }
    torch.save(blob, path)
    return {
        "id_slot": slot_id,
        "filename": os.path.basename(path),
        "n_saved": n,
        "n_written": os.path.getsize(path),
        "timings": {"save_ms": (time.perf_counter() - t0) * 1000.0},
    }


def restore(engine: Any, slot_id: int, path: str, tenant: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    if not os.path.isfile(path):
        raise EngineError("Unable to restore slot: file not found", 400, "invalid_request_error")
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is a client error
        raise EngineError(f"Unable to restore slot: invalid slot save file ({type(e).__name__})", 400) from e
    if not isinstance(blob, dict) or blob.get("magic") != MAGIC or blob.get("version") != VERSION:
        raise EngineError("Unable to restore slot: invalid slot save file", 400)
    if tuple(blob["identity"]) != _identity(engine, tenant):
        raise EngineError(
            "Unable to restore slot: the file was saved for another model, cache settings or API key", 400
        )
    tokens = [int(t) for t in blob["tokens"]]
    n = len(tokens)
    if n >= engine.n_ctx_slot:
        raise EngineError("Unable to restore slot: Restored prompt does not fit in the slot context", 400)
    if any(not 0 <= t < engine.tokenizer.n_vocab for t in tokens):
        raise EngineError("Unable to restore slot: Invalid tokens in slot save file", 400)
    kv = engine.runner.kv
    cache = engine.cache
    seq_id = -1_000_000 - slot_id  # never collides with request ids (positive)
    cache.begin(seq_id, _namespace(engine, tenant, slot_id), tokens, use_cache=False)
    try:
        if n:
            table = cache.reserve(seq_id, n)
            engine.flush_copies()
            rows = kv.rows(table, 0, n)
            kv.k[:, rows] = blob["k"].to(kv.device, kv.dtype)
            kv.v[:, rows] = blob["v"].to(kv.device, kv.dtype)
    finally:
        # Donate even though the sequence did no lookup: its KV is exact for these tokens.
        cache.seqs[seq_id].share = cache.enabled
        cache.finish(seq_id, tokens, n, donate=True)
    slot = engine.scheduler.slots[slot_id]
    slot.prompt_tokens = tokens
    return {
        "id_slot": slot_id,
        "filename": os.path.basename(path),
        "n_restored": n,
        "n_read": os.path.getsize(path),
        "timings": {"restore_ms": (time.perf_counter() - t0) * 1000.0},
    }


def erase(engine: Any, slot_id: int) -> dict[str, Any]:
    slot = engine.scheduler.slots[slot_id]
    n = len(slot.prompt_tokens)
    slot.prompt_tokens = []
    slot.n_prompt_cache = 0
    return {"id_slot": slot_id, "n_erased": n}
