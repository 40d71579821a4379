"""The process's resident memory outside the tensors' own bytes: glibc's heap, where torch's CPU
tensors and the tokenizer live (its mmap threshold while loading; handing freed memory back to
the OS, which glibc otherwise keeps resident in its arenas: a CPU prefill's temporaries leave
40-130 MiB there), and the shared libraries' pages that only initialisation read
(docs/benchmarks.md §6). Without glibc (another libc) or /proc every call does nothing."""

from __future__ import annotations

import functools
from typing import Any

_M_MMAP_THRESHOLD = -3
_MADV_DONTNEED = 4


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


def freeze() -> None:
    """Once the server has started (model loaded, engine warmed up and running): garbage is
    collected, then every object still alive is moved out of the collector's generations
    (``gc.freeze``). What start-up left (the libraries' modules, functions and types, the
    tokenizer, the weights' objects) lives as long as the server, but a full collection walked it
    all again each time the survivors of serving crossed the collector's threshold: 150-180 ms
    on a 2-core CPU, every thread waiting, falling on a burst's requests (docs/benchmarks.md,
    the cached burst's serial Python). Full collections then walk only what serving made.
    Reference counting frees frozen objects as before; only cyclic garbage among them waits for
    ``thaw`` (the sleeping engine thaws before dropping its engine).
    """
    import gc

    gc.collect()
    gc.freeze()


def thaw() -> bool:
    """Objects frozen by ``freeze`` back into the collector's oldest generation; whether there
    were any (the caller may freeze again afterwards)."""
    import gc

    frozen = gc.get_freeze_count() > 0
    gc.unfreeze()
    return frozen


def _library_mappings() -> list[tuple[int, int]]:
    """Address ranges of the shared libraries' read-only mappings that hold only the files' own
    pages (``/proc/self/smaps``: no write permission, nothing copied on write, not locked)."""
    out: list[tuple[int, int]] = []
    blocks: list[tuple[str, str, str, dict[str, str]]] = []
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(maxsplit=5)
            if head[0].endswith(":"):
                if blocks:
                    blocks[-1][3][head[0]] = line.split(":", 1)[1].strip()
            else:  # "start-end perms offset dev inode [path]"
                blocks.append((head[0], head[1], head[5].strip() if len(head) > 5 else "", {}))
    for rng, perms, path, fields in blocks:
        lib = path.startswith("/") and (path.endswith(".so") or ".so." in path)
        flags = fields.get("VmFlags:", "").split()
        if not lib or perms[:1] != "r" or "w" in perms or fields.get("Anonymous:") != "0 kB":
            continue
        if fields.get("Locked:", "0 kB") != "0 kB" or {"lo", "io", "pf"} & set(flags):
            continue
        a, b = (int(x, 16) for x in rng.split("-"))
        out.append((a, b))
    return out


def drop_library_pages() -> int:
    """Unmap the resident pages of the shared libraries' code and read-only data from this
    process (``madvise(MADV_DONTNEED)``); the ones still used come back from the page cache
    on first touch (minor faults). Loading torch leaves ~60 MiB of libtorch's pages resident
    that only its initialisation read (docs/benchmarks.md §6). Pages copied on write are never
    touched (such mappings are skipped). Returns the bytes of the mappings advised."""
    import ctypes

    libc = _glibc()
    if libc is None:
        return 0
    try:
        ranges = _library_mappings()
    except OSError:  # no /proc
        return 0
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for a, b in ranges:
        if madvise(a, b - a, _MADV_DONTNEED) == 0:
            done += b - a
    return done
