"""model/heap.py: the libraries' read-only pages leave the resident set and come back when used;
nothing writable or copied on write is advised."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PROBE = r"""
import json, os, torch
from kvserve.model import heap

def lib_rss(name):
    kb, cur = 0, None
    for line in open("/proc/self/smaps"):
        head = line.split()
        if not head[0].endswith(":"):
            cur = head[5] if len(head) > 5 else ""
        elif head[0] == "Rss:" and os.path.basename(cur) == name:
            kb += int(head[1])
    return kb / 1024

x = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
want = (x @ x).softmax(-1)
before = lib_rss("libtorch_cpu.so")
ranges = heap._library_mappings()
perms = {}
for line in open("/proc/self/maps"):
    rng, p = line.split()[:2]
    a, b = (int(v, 16) for v in rng.split("-"))
    perms[(a, b)] = p
advised = heap.drop_library_pages()
after = lib_rss("libtorch_cpu.so")
got = (x @ x).softmax(-1)
print(json.dumps({"before": before, "after": after, "advised": advised, "same": bool(torch.equal(want, got)),
                  "perms": sorted({perms.get(r, "?") for r in ranges})}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc")
def test_library_pages_leave_and_return() -> None:
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["advised"] > 0
    assert r["before"] - r["after"] > 20, r  # libtorch's pages that loading read (~45 MiB)
    assert r["same"]  # the code still runs, bit for bit
    assert all("w" not in p and p.startswith("r") for p in r["perms"]), r["perms"]


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_freeze_collects_first_then_keeps_the_living_out_of_collections() -> None:
    import gc
    import weakref

    from kvserve.model import heap

    dead = _Cycle()
    dead_ref = weakref.ref(dead)
    del dead  # unreachable before the freeze: collected by it, not frozen
    alive = _Cycle()
    alive_ref = weakref.ref(alive)
    try:
        heap.freeze()
        assert dead_ref() is None
        assert gc.get_freeze_count() > 0
        del alive  # garbage now, but frozen: full collections leave it
        gc.collect()
        assert alive_ref() is not None
        assert heap.thaw() is True and gc.get_freeze_count() == 0
        gc.collect()
        assert alive_ref() is None
        assert heap.thaw() is False  # nothing frozen any more
    finally:
        gc.unfreeze()
        gc.collect()  # the collector's counts as a process that never froze has them
