"""glibc's heap, where torch's CPU tensors and the tokenizer live: its mmap threshold while
loading, and handing freed memory back to the OS (glibc keeps freed chunks resident in its
arenas otherwise: a CPU prefill's temporaries leave ~100-200 MiB there, docs/benchmarks.md §6).
Without glibc (another libc) every call does nothing."""

from __future__ import annotations

import functools
from typing import Any

_M_MMAP_THRESHOLD = -3


@functools.cache
def _glibc() -> Any:
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")  # ctypes releases the interpreter lock during calls
        libc.malloc_trim  # noqa: B018 - glibc's own
        return libc
    except (OSError, AttributeError):  # not glibc: nothing to tune
        return None


def set_mmap_threshold(nbytes: int) -> None:
    """Allocations above ``nbytes`` get their own mapping, returned to the OS when freed."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, nbytes)


def trim() -> bool:
    """Free pages of every arena back to the OS (``malloc_trim(0)``: ~1-3 ms for a 300 MiB
    heap). Returns whether glibc released any memory."""
    libc = _glibc()
    return bool(libc.malloc_trim(0)) if libc is not None else False


def release_free_memory() -> None:
    """Collect garbage, then ``trim``: after loading (the loader's and the tokenizer build's
    temporaries) and after the engine is dropped."""
    import gc

    gc.collect()
    trim()
