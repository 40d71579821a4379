"""The engine benchmarks' shared parts: the tiny model, ``--tree`` arguments and their environment,
and the null runner's logits (kvserve, torch and engine.py are imported only when these are called)."""

from __future__ import annotations

import os
import tempfile
from typing import Any

TINY = "llama:n_layer=1,n_embd=64,n_head=2,n_head_kv=1,head_dim=32,n_ff=128,n_vocab=49152,tied=False"


def tiny_model() -> str:
    """The GGUF of ``TINY`` (random weights, the 1B shape's 49,152-token vocabulary), made once."""
    from engine import synth_path

    return synth_path(TINY, "F16", os.environ.get("KVSERVE_SYNTH_DIR",
                                                  os.path.join(tempfile.gettempdir(), "kvserve-synth")))


def trees_of(specs: list[str], bench_dir: str) -> list[list[str]]:
    """``--tree NAME=SRC`` arguments as [name, src] pairs (none: this checkout's src, "this")."""
    return [t.split("=", 1) for t in specs] or [["this", os.path.join(os.path.dirname(bench_dir), "src")]]


def tree_env(src: str) -> dict[str, str]:
    """This environment with the tree's ``src`` (a PYTHONPATH) before what the caller had."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [os.path.abspath(x) for x in src.split(os.pathsep)] + [os.environ.get("PYTHONPATH", "")]))


def null_logits(plan: Any, src: Any) -> Any:
    """A ``RunOutput`` for ``plan`` from the rows of ``src`` (a [rows, vocab] tensor): one row per
    chunk that wants its last logits, all of a chunk's for ``logits == "all"``, one batch tensor
    when every chunk wants its last row only (what the fast sampler reads)."""
    import torch

    from kvserve.plan import RunOutput

    want = [c for c in plan.chunks if c.logits != "none"]
    n_rows = sum(len(c.tokens) if c.logits == "all" else 1 for c in want)
    batch = src[:n_rows] if n_rows <= src.shape[0] else torch.randn(n_rows, src.shape[1])
    logits, rows, i = {}, {}, 0
    for c in want:
        n = len(c.tokens) if c.logits == "all" else 1
        logits[c.seq_id] = batch[i : i + n]
        rows[c.seq_id] = i
        i += n
    single = all(c.logits == "last" for c in want)
    return RunOutput(logits=logits, batch=batch if single else None, batch_rows=rows if single else None)
