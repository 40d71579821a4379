"""Attention backends: ``torch`` (the reference, any device) and ``triton`` (CUDA).

``KVSERVE_ATTN_BACKEND=torch|triton`` overrides the choice (default: triton on CUDA when the
triton package imports, torch otherwise).
"""

from __future__ import annotations

import logging
import os

from ..config import ModelConfig
from ..kv_store import PagedKVStore
from ..rope import RopeTables
from .base import AttentionBackend, AttentionStep, StepSeq

log = logging.getLogger(__name__)

__all__ = ["AttentionBackend", "AttentionStep", "StepSeq", "backend_name", "make_backend"]


def _triton_ok() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:  # ImportError, or a broken install
        return False
    return True


def backend_name(device_type: str) -> str:
    want = os.environ.get("KVSERVE_ATTN_BACKEND", "").strip().lower()
    if want in ("torch", "triton"):
        interpret = os.environ.get("TRITON_INTERPRET") == "1"  # kernels on the CPU (tests)
        if want == "triton" and ((device_type != "cuda" and not interpret) or not _triton_ok()):
            raise ValueError("KVSERVE_ATTN_BACKEND=triton needs CUDA and the triton package")
        return want
    if want:
        raise ValueError(f"KVSERVE_ATTN_BACKEND={want!r}: expected torch or triton")
    return "triton" if device_type == "cuda" and _triton_ok() else "torch"


def make_backend(cfg: ModelConfig, kv: PagedKVStore, rope: RopeTables, name: str) -> AttentionBackend:
    if name == "triton":
        from .triton_backend import TritonBackend

        return TritonBackend(cfg, kv, rope)
    from .torch_ref import TorchBackend

    return TorchBackend(cfg, kv, rope)
