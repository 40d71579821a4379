"""CUDA graphs for decode steps: one graph per batch bucket, captured at start-up.

Buckets are 1, 2, 4, 8, 16, then every 8 up to the largest decode batch. A step of n sequences
replays the smallest bucket >= n; rows n..bucket-1 are padding (scratch row, length 1) whose
KV writes land on the scratch page and whose logits are dropped. Capture stops, with a log
line, once ``budget_s`` is spent; batches above the largest captured bucket run eagerly.
A backend with ``cascade_graphs`` also gets a cascade variant of every bucket from 2 up (its
shared-prefix groups are inputs too); ``run`` replays it when given groups.
"""

from __future__ import annotations

import bisect
import logging
import time

import torch

from .backends.base import AttentionBackend, StepSeq

log = logging.getLogger(__name__)


def _index(values: list[int], device: torch.device) -> torch.Tensor:
    t = torch.tensor(values, dtype=torch.int64)
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t


def fill_fed(ids: torch.Tensor, dst: list[int], prev: torch.Tensor, src: list[int]) -> torch.Tensor:
    """``ids[dst[j]] = prev[src[j]]`` on the device without a host wait (the index lists go in
    one non-blocking copy each; a contiguous prefix needs none). Returns ``ids``."""
    n = len(dst)
    if dst == list(range(n)) and src == list(range(n)):
        ids[:n].copy_(prev[:n])
        return ids
    vals = prev.index_select(0, _index(src, prev.device))
    ids.index_copy_(0, _index(dst, ids.device), vals.to(ids.dtype))
    return ids


def decode_buckets(max_batch: int) -> list[int]:
    out = [b for b in (1, 2, 4, 8, 16) if b <= max_batch]
    b = 24
    while b <= max_batch:
        out.append(b)
        b += 8
    if max_batch > (out[-1] if out else 0):
        out.append(max_batch)
    return out


class GraphRunner:
    def __init__(self, model: torch.nn.Module, backend: AttentionBackend, max_batch: int,
                 budget_s: float = 60.0) -> None:
        self.model = model
        self.backend = backend
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.cascade: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        with_cascade = bool(getattr(backend, "cascade_graphs", False))
        self.ids: dict[tuple[int, bool], torch.Tensor] = {}  # each graph's static token-id input
        buckets = decode_buckets(max_batch)
        backend.init_graphs(max(buckets))  # type: ignore[attr-defined]
        pool = torch.cuda.graph_pool_handle()
        t0 = time.perf_counter()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        skipped: list[int] = []
        for b in sorted(buckets, reverse=True):  # largest first: later graphs reuse its pool
            if time.perf_counter() - t0 > budget_s:
                skipped.append(b)
                continue
            for cascade in ((False, True) if with_cascade and b >= 2 else (False,)):
                ids, step = backend.graph_step(b, cascade=True) if cascade else backend.graph_step(b)
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up: compiles kernels, settles the allocator
                        self.model.logits(self.model(ids, step))
                torch.cuda.current_stream().wait_stream(stream)
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    out = self.model.logits(self.model(ids, step))
                (self.cascade if cascade else self.graphs)[b] = (g, out)
                self.ids[(b, cascade)] = ids
        torch.cuda.synchronize()
        self.buckets = sorted(self.graphs)
        msg = f"captured CUDA graphs for decode batches {self.buckets} in {time.perf_counter() - t0:.1f} s"
        if self.cascade:
            msg += f" (with shared-prefix cascade variants for {sorted(self.cascade)})"
        if skipped:
            msg += f" (capture budget {budget_s:.0f} s spent; batches {sorted(skipped)} run eagerly)"
        log.info(msg)

    def bucket(self, n: int) -> int | None:
        i = bisect.bisect_left(self.buckets, n)
        return self.buckets[i] if i < len(self.buckets) else None

    def run(self, bucket: int, seqs: list[StepSeq], ids: list[int],
            groups: list[tuple[list[int], int]] | None = None,
            feed: tuple[torch.Tensor, list[int]] | None = None) -> torch.Tensor:
        """Logits [len(seqs), n_vocab] (float32, a fresh tensor) of one decode step; with
        ``groups`` (shared-prefix cascade groups, indices into ``seqs``) the cascade variant.
        ``feed``: (tokens on the device, row per sequence or -1): sequence i's token is
        ``tokens[row]`` instead of ``ids[i]``, copied on the device (no host round trip)."""
        cascade = bool(groups) and bucket in self.cascade
        if cascade:
            self.backend.load_graph_inputs(bucket, seqs, ids, groups)  # type: ignore[call-arg]
            g, out = self.cascade[bucket]
        else:
            self.backend.load_graph_inputs(bucket, seqs, ids)
            g, out = self.graphs[bucket]
        if feed is not None:
            prev, rows = feed
            dst = [i for i, r in enumerate(rows) if r >= 0]
            fill_fed(self.ids[(bucket, cascade)], dst, prev, [rows[i] for i in dst])
        g.replay()
        return out[: len(seqs)].clone()
