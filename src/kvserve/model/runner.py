"""The runner: takes a Plan, runs the model over the paged KV pool, returns logits.

It decides nothing: which tokens, which pages and which moves all come from the plan, and so
do the host-tier copies (``plan.copies``, run first, by ``host_kv.HostKVStore``).
A plan larger than ``forward_tokens`` tokens is split into micro-batches; a chunk split in two
runs its second half after the first half's KV has been written, so results do not depend on it.
On the CPU ``forward_tokens`` is ``n_ubatch`` (``-ub``); on CUDA a forward takes up to
``n_batch`` tokens, at most ``CUDA_FORWARD_TOKENS`` (``forward_tokens``).

Attention goes through a backend (``backends``): torch (the reference; CPU) or Triton (CUDA).
On CUDA with the Triton backend, a plan of single-token chunks that fits a captured batch
bucket replays a CUDA graph (``graph_runner``); every other plan runs eagerly.
``KVSERVE_CUDA_GRAPHS=0`` turns the graphs off.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import torch
from torch.autograd.profiler import record_function

from ..plan import BatchRows, Plan, RunOutput, SeqChunk, TierCopy
from . import ops_cpu
from .backends import StepSeq, backend_name, make_backend
from .graph_runner import GraphRunner, fill_fed
from .host_kv import HostKVStore
from .kv_store import PagedKVStore
from .loader import LoadedModel
from .rope import RopeTables

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Piece:
    chunk: SeqChunk
    offset: int  # first token of the chunk in this piece
    n: int


# The most tokens one CUDA forward takes. A prompt forward on the GPU is bound by its kernel
# launches on the host (bench/engine.py --profile: a 2,048-token prefill in four 512-token
# forwards spent 27 ms on the host for 11 ms of GPU work), so a step's tokens run in one forward
# where -ub would split them; the activations of 2,048 tokens are tens of MiB (the 8B shape's
# gate/up output 117 MiB), small beside the KV pool. -ub keeps its other meaning (the largest
# input of an unsplittable task, engine.Engine.embed).
CUDA_FORWARD_TOKENS = 2048


def forward_tokens(device_type: str, n_ubatch: int, n_batch: int | None) -> int:
    """Tokens per forward: ``n_ubatch`` on the CPU (its activations are host memory and the
    step is not launch-bound), on CUDA up to ``n_batch`` within ``CUDA_FORWARD_TOKENS``;
    ``KVSERVE_FORWARD_TOKENS=N`` sets it (0: ``n_ubatch`` everywhere)."""
    env = os.environ.get("KVSERVE_FORWARD_TOKENS")
    if env is not None:
        n = int(env)
        return n_ubatch if n <= 0 else n
    if device_type != "cuda":
        return n_ubatch
    return max(n_ubatch, min(n_batch or n_ubatch, CUDA_FORWARD_TOKENS))


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        n_pages: int,
        page_size: int = 16,
        kv_dtype: torch.dtype | None = None,
        n_ubatch: int = 512,
        max_batch: int = 16,
        n_batch: int | None = None,
    ) -> None:
        """``max_batch``: the most sequences a decode step will have (CUDA graph buckets);
        ``n_batch``: the most tokens a plan will have (None: ``n_ubatch``)."""
        self.loaded = loaded
        self.cfg = loaded.cfg
        self.model = loaded.model
        self.device = loaded.device
        self.page_size = page_size
        self.n_ubatch = max(1, n_ubatch)
        self.forward_tokens = forward_tokens(self.device.type, self.n_ubatch, n_batch)
        self.kv = PagedKVStore(self.cfg, n_pages, page_size, kv_dtype or loaded.dtype, loaded.device)
        cfg = self.cfg
        name = backend_name(self.device.type)
        # The Triton backend (and its graphs) needs every position's angles up front.
        n_pos = (n_pages + 1) * page_size if name == "triton" else 4096
        keys = {cfg.layer_rope(i) for i in range(cfg.n_layer)}
        self.rope = RopeTables(keys, cfg.rope_dim, self.device, n_pos)
        self.backend = make_backend(cfg, self.kv, self.rope, name)
        self.host_kv: HostKVStore | None = None
        self.graphs: GraphRunner | None = None
        graphs_on = os.environ.get("KVSERVE_CUDA_GRAPHS", "1") != "0"
        if self.backend.supports_graphs and self.device.type == "cuda" and graphs_on:
            self.graphs = GraphRunner(self.model, self.backend, max(1, min(max_batch, self.n_ubatch)))
        if self.device.type == "cuda":
            t0 = time.perf_counter()
            try:
                with torch.inference_mode():
                    n = self.backend.warm_eager(loaded.dtype, decode_only=self.graphs is None)
            except Exception as e:  # noqa: BLE001 - serving still works; the variants compile at first use
                log.warning("eager step kernels not warmed up at start-up: %s", e)
                n = 0
            if n:
                log.info("eager step kernels compiled or loaded in %.1f s (%d warm-up steps on the scratch page)",
                         time.perf_counter() - t0, n)
        log.info("attention backend: %s%s%s", self.backend.name, ", CUDA graphs for decode" if self.graphs else "",
                 f"; layer ops: {ops_cpu.describe()}" if self.device.type == "cpu" else "")
        # ``run`` returns once the step is queued; the device finishes it later (CUDA streams)
        self.asynchronous = self.device.type == "cuda"

    def attach_host_tier(self, capacity: int | None) -> HostKVStore:
        """Host memory for up to ``capacity`` evicted pages (None: unbounded)."""
        self.host_kv = HostKVStore(self.kv, capacity)
        return self.host_kv

    @torch.inference_mode()
    def apply_copies(self, copies: tuple[TierCopy, ...]) -> None:
        """Run host-tier copies in order (plans carry theirs; other KV users call this first)."""
        if not copies:
            return
        if self.host_kv is None:
            raise RuntimeError("host-tier copies without a host tier")
        with record_function("kvserve.tier_copies"):
            self.host_kv.run(copies)

    def _micro_batches(self, chunks: tuple[SeqChunk, ...]) -> list[list[_Piece]]:
        batches: list[list[_Piece]] = [[]]
        room = self.forward_tokens
        for c in chunks:
            off = 0
            while off < len(c.tokens):
                if room == 0:
                    batches.append([])
                    room = self.forward_tokens
                n = min(room, len(c.tokens) - off)
                batches[-1].append(_Piece(c, off, n))
                off += n
                room -= n
        return [b for b in batches if b]

    @torch.inference_mode()
    def run(self, plan: Plan, prev_tokens: torch.Tensor | None = None) -> RunOutput:
        """``prev_tokens``: the previous step's sampled tokens on the device (int64 [rows]),
        the tokens of the plan's fed chunks (``Plan.feed``)."""
        t0 = time.perf_counter()
        if plan.copies:
            self.apply_copies(plan.copies)
        fed = {c.seq_id: r for c, r in zip(plan.chunks, plan.feed) if r >= 0}
        if fed and prev_tokens is None:
            raise ValueError("a plan with fed chunks needs the previous step's tokens")
        if plan.moves:
            with record_function("kvserve.moves"):
                self.kv.apply_moves(plan.moves)
        parts: dict[int, list[torch.Tensor]] = {}
        batches = self._micro_batches(plan.chunks)
        single: tuple[torch.Tensor, dict[int, int]] | None = None  # one logits tensor of "last" rows
        if self.graphs is not None and self._graph_plan(plan):
            bucket = self.graphs.bucket(len(plan.chunks))
            seqs = [StepSeq(c.seq_id, c.start_pos, 1, c.page_table) for c in plan.chunks]
            mode, groups = self.backend.graph_mode(seqs) if bucket is not None else ("eager", None)
            if bucket is not None and mode != "eager":
                feed = None
                if fed:
                    feed = (prev_tokens, [fed.get(c.seq_id, -1) for c in plan.chunks])
                with record_function("kvserve.graph_replay"):
                    logits = self.graphs.run(bucket, seqs, [max(0, c.tokens[0]) for c in plan.chunks], groups,
                                             feed)
                rows = {c.seq_id: i for i, c in enumerate(plan.chunks)}
                return RunOutput(logits=BatchRows(logits, rows), forward_s=time.perf_counter() - t0, batch=logits,
                                 batch_rows=rows)
        for batch in batches:
            rf = record_function("kvserve.inputs")
            rf.__enter__()
            ids = [tok for p in batch for tok in p.chunk.tokens[p.offset : p.offset + p.n]]
            seqs = [StepSeq(p.chunk.seq_id, p.chunk.start_pos + p.offset, p.n, p.chunk.page_table) for p in batch]
            if fed:
                ids = [max(0, t) for t in ids]
            ids_t, step = self.backend.prepare(seqs, ids)
            if fed:
                dst, src = [], []
                q = 0
                for p in batch:
                    if p.chunk.seq_id in fed:
                        dst.append(q)
                        src.append(fed[p.chunk.seq_id])
                    q += p.n
                if dst:
                    ids_t = fill_fed(ids_t, dst, prev_tokens, src)
            rf.__exit__(None, None, None)
            with record_function("kvserve.forward"):
                hidden = self.model(ids_t, step)
            rows: list[int] = []
            owners: list[tuple[int, int]] = []  # (seq_id, n_rows)
            q = 0
            for p in batch:
                want = p.chunk.logits
                if want == "all":
                    rows.extend(range(q, q + p.n))
                    owners.append((p.chunk.seq_id, p.n))
                elif want == "last" and p.offset + p.n == len(p.chunk.tokens):
                    rows.append(q + p.n - 1)
                    owners.append((p.chunk.seq_id, 1))
                q += p.n
            if rows:
                sel = hidden if len(rows) == q else hidden[torch.tensor(rows, device=self.device)]
                logits = self.model.logits(sel)
                if len(batches) == 1 and all(n == 1 for _, n in owners):
                    single = (logits, {sid: j for j, (sid, _) in enumerate(owners)})
                    break  # the rows of one tensor: logits as views of it (BatchRows)
                i = 0
                for seq_id, n in owners:
                    parts.setdefault(seq_id, []).append(logits[i : i + n])
                    i += n
        if single is not None:
            return RunOutput(logits=BatchRows(*single), forward_s=time.perf_counter() - t0, batch=single[0],
                             batch_rows=single[1])
        out = {sid: (ts[0] if len(ts) == 1 else torch.cat(ts)) for sid, ts in parts.items()}
        return RunOutput(logits=out, forward_s=time.perf_counter() - t0)

    @torch.inference_mode()
    def hidden_states(self, tokens: list[int], page_table: tuple[int, ...]) -> torch.Tensor:
        """Final-normed hidden states [n, n_embd] (float32) of tokens at positions [0, n)."""
        ids, step = self.backend.prepare([StepSeq(-1, 0, len(tokens), page_table)], list(tokens))
        return self.model(ids, step).float()

    def _graph_plan(self, plan: Plan) -> bool:
        """A decode step a graph can replay: single-token chunks wanting their last logits."""
        return bool(plan.chunks) and all(len(c.tokens) == 1 and c.logits == "last" for c in plan.chunks)
