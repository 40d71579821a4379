"""The runner: takes a Plan, runs the model over the paged KV pool, returns logits.

It decides nothing: which tokens, which pages and which moves all come from the plan.
A plan larger than ``n_ubatch`` tokens is split into micro-batches; a chunk split in two runs
its second half after the first half's KV has been written, so results do not depend on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch.autograd.profiler import record_function

from ..plan import Plan, RunOutput, SeqChunk
from .attention import build_meta
from .kv_store import PagedKVStore
from .loader import LoadedModel


@dataclass(frozen=True)
class _Piece:
    chunk: SeqChunk
    offset: int  # first token of the chunk in this piece
    n: int


class ModelRunner:
    def __init__(
        self,
        loaded: LoadedModel,
        n_pages: int,
        page_size: int = 16,
        kv_dtype: torch.dtype | None = None,
        n_ubatch: int = 512,
    ) -> None:
        self.loaded = loaded
        self.cfg = loaded.cfg
        self.model = loaded.model
        self.device = loaded.device
        self.page_size = page_size
        self.n_ubatch = max(1, n_ubatch)
        self.kv = PagedKVStore(self.cfg, n_pages, page_size, kv_dtype or loaded.dtype, loaded.device)

    def _micro_batches(self, chunks: tuple[SeqChunk, ...]) -> list[list[_Piece]]:
        batches: list[list[_Piece]] = [[]]
        room = self.n_ubatch
        for c in chunks:
            off = 0
            while off < len(c.tokens):
                if room == 0:
                    batches.append([])
                    room = self.n_ubatch
                n = min(room, len(c.tokens) - off)
                batches[-1].append(_Piece(c, off, n))
                off += n
                room -= n
        return [b for b in batches if b]

    @torch.inference_mode()
    def run(self, plan: Plan) -> RunOutput:
        t0 = time.perf_counter()
        if plan.moves:
            with record_function("kvserve.moves"):
                self.kv.apply_moves(plan.moves)
        parts: dict[int, list[torch.Tensor]] = {}
        for batch in self._micro_batches(plan.chunks):
            rf = record_function("kvserve.inputs")
            rf.__enter__()
            ids = torch.tensor(
                [tok for p in batch for tok in p.chunk.tokens[p.offset : p.offset + p.n]],
                dtype=torch.int64,
                device=self.device,
            )
            meta = build_meta(
                [(p.chunk.start_pos + p.offset, p.n, list(p.chunk.page_table)) for p in batch],
                self.page_size,
                self.device,
            )
            rf.__exit__(None, None, None)
            with record_function("kvserve.forward"):
                hidden = self.model(ids, meta.positions, self.kv, meta)
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
                logits = self.model.logits(hidden[torch.tensor(rows, device=self.device)])
                i = 0
                for seq_id, n in owners:
                    parts.setdefault(seq_id, []).append(logits[i : i + n])
                    i += n
        out = {sid: (ts[0] if len(ts) == 1 else torch.cat(ts)) for sid, ts in parts.items()}
        return RunOutput(logits=out, forward_s=time.perf_counter() - t0)

    @torch.inference_mode()
    def hidden_states(self, tokens: list[int], page_table: tuple[int, ...]) -> torch.Tensor:
        """Final-normed hidden states [n, n_embd] (float32) of tokens at positions [0, n)."""
        ids = torch.tensor(tokens, dtype=torch.int64, device=self.device)
        meta = build_meta([(0, len(tokens), list(page_table))], self.page_size, self.device)
        return self.model(ids, meta.positions, self.kv, meta).float()
