"""Triton kernels compiled while serving, logged.

Start-up compiles what a step can need (the decode graphs' capture, the GEMV timing and its
warm-up, the engine's warm-up pass). A kernel variant that a request meets first (a new
constexpr, a new specialization of an argument) compiles on that step's critical path instead:
0.1-1 s on an H100 or H200, which every sequence of the step waits for. Once the engine serves,
each such compile is logged as a warning with its kernel, constexprs and time, so a variant
start-up missed shows in the log rather than as an unexplained slow step.

Only kernel names and constexprs are logged (no request content). Nothing is imported here:
the hooks are installed only where Triton is already loaded (a CUDA runner)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any

log = logging.getLogger(__name__)

_local = threading.local()
_installed = False


def _constexprs(fn: Any, constants: Any) -> dict[str, Any]:
    """{argument name: value} of a compile's constexprs (simple values only)."""
    names = list(getattr(getattr(fn, "jit_function", None), "arg_names", None) or [])
    out: dict[str, Any] = {}
    for key, value in dict(constants or {}).items():
        if not isinstance(value, (bool, int, float, str)):
            continue
        idx = key[0] if isinstance(key, tuple) and len(key) == 1 else key
        name = names[idx] if isinstance(idx, int) and 0 <= idx < len(names) else str(key)
        out[name] = value
    return out


def before_compile(**kw: Any) -> None:
    """Triton's ``jit_cache_hook``: a variant missing from the in-memory cache is about to compile."""
    _local.t0 = time.perf_counter()
    _local.hit = None


def listener(**kw: Any) -> None:
    """Triton's ``compilation.listener``: whether the binary came from the on-disk cache."""
    _local.hit = bool(kw.get("cache_hit"))


def after_compile(**kw: Any) -> None:
    """Triton's ``jit_post_compile_hook``: log the compile."""
    t0 = getattr(_local, "t0", None)
    dt = time.perf_counter() - t0 if t0 is not None else float("nan")
    fn = kw.get("fn")
    name = str(getattr(fn, "name", fn))
    consts = _constexprs(fn, (kw.get("compile") or {}).get("constants"))
    hit = getattr(_local, "hit", None)
    _local.t0 = None
    log.warning("Triton kernel %s compiled while serving in %.0f ms (%s); constexprs %s: start-up did "
                "not warm this variant", name, dt * 1e3,
                "from the on-disk cache" if hit else "compiled" if hit is not None else "source unknown",
                ", ".join(f"{k}={v}" for k, v in consts.items()) or "none")


def _chain(prev: Any, mine: Any) -> Any:
    if prev is None:
        return mine

    def both(**kw: Any) -> Any:
        r = prev(**kw)
        mine(**kw)
        return r
    return both


def serving() -> bool:
    """From now on, log each Triton compile (once start-up is done). False where Triton is not
    loaded or has no hooks (nothing to watch)."""
    global _installed
    triton = sys.modules.get("triton")
    knobs = getattr(triton, "knobs", None)
    runtime = getattr(knobs, "runtime", None)
    compilation = getattr(knobs, "compilation", None)
    if runtime is None or compilation is None or not hasattr(runtime, "jit_post_compile_hook"):
        return False
    if getattr(runtime, "interpret", False):
        return False  # the interpreter compiles nothing
    if not _installed:
        runtime.jit_cache_hook = _chain(runtime.jit_cache_hook, before_compile)
        compilation.listener = _chain(compilation.listener, listener)
        runtime.jit_post_compile_hook = _chain(runtime.jit_post_compile_hook, after_compile)
        _installed = True
    return True
