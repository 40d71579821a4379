"""The Triton backend (CUDA): paged decode and extend kernels over a device-resident page table.

Per step, ``prepare`` packs every int32 input into one pinned buffer and sends it with one
non-blocking copy; nothing in a step waits for the device or has a shape that depends on device
data. Single-token chunks take the split-K decode kernel; longer chunks take the extend kernel
(a chunk over its cached prefix and itself). Each layer runs RoPE fused with the KV write, then
decode (split and merge) and/or extend attention; a step of decoding sequences only, without
cascade, can run all of that in one launch (``tk.decode_fused``, ``KVSERVE_DECODE_FUSED=1``;
``auto``: for steps of up to ``FUSED_AUTO_MAX_BATCH`` sequences; ``merge``: split and merge in one
launch after ``rope_write``; ``0``: the separate kernels), with ``KVSERVE_DECODE_PDL=1`` as a
programmatic dependent launch on sm90+ (measured slower: off); ``KVSERVE_DECODE_MAX_SPLITS`` and
``KVSERVE_DECODE_BLOCK_N`` override its split cap and key block.

Decoding sequences whose page tables start with the same pages (``attention.cascade_groups``,
the torch backend's rule) read that prefix once per group (``tk.CascadeGroups``) when it pays:
by default for head_dim <= ``CASCADE_MAX_HEAD_DIM`` (measured faster there; larger heads keep
plain decode until measured) and KV reads saved (bytes of the prefix times the extra members)
of at least ``KVSERVE_CASCADE_GRAPH_MB`` (256). A decode step a graph replays then takes the
bucket's cascade graph (captured beside the plain one, for up to ``GRAPH_GROUPS`` groups), or
runs eagerly with more groups when it saves at least ``KVSERVE_CASCADE_EAGER_GB`` (16).
``KVSERVE_CASCADE=0`` turns cascade off, ``1`` takes it whenever a group exists.

For CUDA graphs, decode steps of up to ``bucket`` sequences use static buffers
``[ids | positions | rows | lengths | starts]`` (one section of ``max_bucket`` each), then the
cascade groups' ``[n | shared | minlen]`` (``GRAPH_GROUPS`` each, padded to 4) and members
(``GRAPH_GROUPS`` x ``max_bucket``), then room for page-table updates, filled by one copy per
replay; padding rows point at the scratch row, padding groups have no members.
"""

from __future__ import annotations

import os

import torch

from ..attention import cascade_groups
from ..config import ModelConfig
from ..kv_store import PagedKVStore
from ..rope import RopeTables
from . import triton_kernels as tk
from .base import AttentionBackend, AttentionStep, StepSeq, split_qkv
from .device_state import PageTable, StepBuffer

_UPDATE_ROOM = 4096  # page-table updates that ride in the graph input copy
GRAPH_GROUPS = 4  # cascade groups a decode graph can take
CASCADE_MAX_HEAD_DIM = 64  # the default rule's limit (bench/gpu_matrix.sh features: 1B gains, d128 not measured)
_G4 = (GRAPH_GROUPS + 3) & ~3
# The one-launch decode kernel (docs/benchmarks.md §1, bench/decode_attn_b1.py on an H200: at
# batch 1 and 2k context 32 splits beat 8 and 16, 64-key blocks beat 128 at head_dim 64 and
# 32-key blocks beat 64 at head_dim 128; PDL after the Q/K/V GEMV measured slower, off)
FUSED_DEFAULT = "auto"  # KVSERVE_DECODE_FUSED's default
FUSED_AUTO_MAX_BATCH = 4  # "auto": the one-launch decode kernel for steps of up to this many sequences
FUSED_MAX_SPLITS = 32  # the one-launch kernel's most splits a sequence
FUSED_BLOCK_N: dict[int, int] = {64: 64, 128: 32}  # its keys per block by head_dim (else the kernel's rule)


class _Decode:
    def __init__(self, q_rows: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor, ws: tk.DecodeWorkspace,
                 cascade: tk.CascadeGroups | None = None) -> None:
        self.q_rows, self.rows, self.lens, self.ws, self.cascade = q_rows, rows, lens, ws, cascade


class _Extend:
    def __init__(self, rows: torch.Tensor, q_start: torch.Tensor, q_len: torch.Tensor, kv_len: torch.Tensor,
                 max_q: int) -> None:
        self.rows, self.q_start, self.q_len, self.kv_len, self.max_q = rows, q_start, q_len, kv_len, max_q


class TritonStep(AttentionStep):
    def __init__(self, be: TritonBackend, positions: torch.Tensor, tok_rows: torch.Tensor,
                 decode: _Decode | None, extend: _Extend | None) -> None:
        self.be = be
        self.positions = positions
        self.tok_rows = tok_rows
        self.decode = decode
        self.extend = extend

    def _one_launch(self) -> bool:
        d = self.decode
        return d is not None and d.ws.count is not None and self.be.fused_decode != "merge"

    def quantizes_output(self, n_head: int, n_head_kv: int, head_dim: int) -> bool:
        return self.be.quant_out and self._one_launch() and tk.quant_fits(n_head, n_head_kv, head_dim)

    def attend_qkv_quant(self, layer: int, qkv: torch.Tensor, n_head: int, n_head_kv: int,
                         quant_out) -> torch.Tensor:
        assert self.quantizes_output(n_head, n_head_kv, qkv.shape[1] // (n_head + 2 * n_head_kv))
        return self.attend(layer, *split_qkv(qkv, n_head, n_head_kv), quant_out=quant_out)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, quant_out=None) -> torch.Tensor:
        """``quant_out``: see ``attend_qkv_quant`` (the one-launch decode kernel only)."""
        be = self.be
        cfg = be.cfg
        key = cfg.layer_rope(layer)
        kc, vc = be.kv.k[layer], be.kv.v[layer]
        table = be.pt.table
        ps = be.kv.page_size
        window, scale = cfg.layer_window(layer), cfg.attn_scale
        d = self.decode
        if self._one_launch():  # decoding only: one launch
            out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            tk.decode_fused(q, k, v, out, d.q_rows, kc, vc, be.rope.cos[key], be.rope.sin[key], table, d.rows,
                            d.lens, d.ws, ps, scale, window, cfg.rope_dim, cfg.rope_style == "neox",
                            block_n=be.fused_block_n, pdl=be.fused_pdl, quant_out=quant_out)
            return out
        assert quant_out is None
        q = tk.rope_write(q, k, v, kc, vc, be.rope.cos[key], be.rope.sin[key], self.positions, self.tok_rows,
                          table, ps, cfg.rope_dim, cfg.rope_style == "neox")
        out = torch.empty_like(q)
        if d is not None and d.ws.count is not None:  # "merge": split attention and merge in one launch
            tk.decode_fused(q, None, None, out, d.q_rows, kc, vc, None, None, table, d.rows, d.lens, d.ws, ps,
                            scale, window, block_n=be.fused_block_n)
        elif d is not None:
            tk.decode_attention(q, out, d.q_rows, kc, vc, table, d.rows, d.lens, d.ws, ps, scale, window,
                                cascade=d.cascade)
        e = self.extend
        if e is not None:
            tk.extend_attention(q, out, kc, vc, table, e.rows, e.q_start, e.q_len, e.kv_len, e.max_q, ps,
                                scale, window)
        return out


class TritonBackend(AttentionBackend):
    name = "triton"
    supports_graphs = True

    def __init__(self, cfg: ModelConfig, kv: PagedKVStore, rope: RopeTables, max_rows: int = 512) -> None:
        self.cfg = cfg
        self.kv = kv
        self.rope = rope  # must cover every position up front: graphs hold its pointers
        self.device = kv.device
        self.pt = PageTable(max_rows, kv.n_pages, kv.scratch_page, kv.device)
        self.buf = StepBuffer(4096, kv.device)
        props = torch.cuda.get_device_properties(kv.device) if kv.device.type == "cuda" else None
        self.n_sm = props.multi_processor_count if props is not None else 8
        self.max_bucket = 0
        self._graph_dev: torch.Tensor | None = None
        self._graph_ws: dict[int, tk.DecodeWorkspace] = {}
        self._graph_host = StepBuffer(0, kv.device)
        self.cascade_mode = os.environ.get("KVSERVE_CASCADE", "auto").strip().lower()
        self.cascade_eager_bytes = float(os.environ.get("KVSERVE_CASCADE_EAGER_GB", "16")) * 1e9
        self.cascade_graph_bytes = float(os.environ.get("KVSERVE_CASCADE_GRAPH_MB", "256")) * 2**20
        self.cascade_auto_ok = cfg.head_dim <= CASCADE_MAX_HEAD_DIM
        # GraphRunner captures cascade variants only where a step can take them
        self.cascade_graphs = self.cascade_mode == "1" or (self.cascade_mode != "0" and self.cascade_auto_ok)
        self.n_cascade_steps = 0  # decode steps (eager or graph) that read a shared prefix once
        # "1": decode-only steps without cascade run RoPE, KV write, split attention and merge in one
        # launch; "auto" (the default: measured faster at batch 1, docs/benchmarks.md): the same for
        # steps of up to FUSED_AUTO_MAX_BATCH sequences; "merge": RoPE + KV write apart, split
        # attention and merge in one launch; "0": all apart (the kernels before)
        mode = os.environ.get("KVSERVE_DECODE_FUSED", FUSED_DEFAULT).strip().lower()
        self.fused_decode = mode if mode in ("1", "merge", "auto") else "0"
        # most splits of a decode step's sequence (the separate kernels', the one-launch kernel's;
        # KVSERVE_DECODE_MAX_SPLITS sets both, for A/B of the split count)
        env_splits = os.environ.get("KVSERVE_DECODE_MAX_SPLITS")
        self.max_splits = int(env_splits or 32)
        self.fused_max_splits = int(env_splits or FUSED_MAX_SPLITS)
        # the one-launch kernel's keys per block (0: its own rule) and programmatic dependent
        # launch (its first cached keys read while the Q/K/V projection finishes; sm90+)
        self.fused_block_n = int(os.environ.get("KVSERVE_DECODE_BLOCK_N", "0")) or FUSED_BLOCK_N.get(cfg.head_dim)
        self.fused_pdl = (os.environ.get("KVSERVE_DECODE_PDL", "0").strip() == "1"
                          and tk.pdl_supported(self.device))
        # the one-launch kernel's merge also quantizes the output for a quantized output
        # projection's int8 GEMV (no quantizing kernel between them); "0": the GEMV quantizes it
        self.quant_out = os.environ.get("KVSERVE_DECODE_QUANT_OUT", "1").strip() != "0"

    def fused_for(self, batch: int) -> bool:
        """Whether a decode-only step (no cascade) of ``batch`` sequences runs the one-launch kernel:
        "auto" up to ``FUSED_AUTO_MAX_BATCH`` sequences (where the attention side is latency-bound)."""
        if self.fused_decode == "auto":
            return batch <= FUSED_AUTO_MAX_BATCH
        return self.fused_decode != "0"

    def _groups(self, seqs: list[StepSeq]) -> list[tuple[list[int], int]]:
        """Cascade groups of the decoding (single-token) sequences, indices in decode order."""
        if self.cascade_mode == "0":
            return []
        dec = [(list(s.page_table), s.start + 1) for s in seqs if s.n == 1]
        return cascade_groups(dec, self.kv.page_size) if len(dec) > 1 else []

    def _saved(self, groups: list[tuple[list[int], int]]) -> float:
        """KV bytes a step reads less with these groups (all layers)."""
        return sum((len(m) - 1) * shared for m, shared in groups) * self.kv.bytes_per_page / self.kv.page_size

    def _worth(self, groups: list[tuple[list[int], int]]) -> bool:
        if self.cascade_mode == "1":
            return bool(groups)
        return bool(groups) and self.cascade_auto_ok and self._saved(groups) >= self.cascade_graph_bytes

    def graph_mode(self, seqs: list[StepSeq]) -> tuple[str, list[tuple[list[int], int]] | None]:
        groups = self._groups(seqs)
        if not self._worth(groups):
            return "plain", None
        if len(groups) <= GRAPH_GROUPS:
            return "cascade", groups
        force = self.cascade_mode == "1"
        return ("eager", None) if force or self._saved(groups) >= self.cascade_eager_bytes else ("plain", None)

    def shared_splits(self, n_groups: int, max_rows: int, max_shared: int) -> int:
        """Splits of the shared prefix: about two programs per multiprocessor, 256 keys each at least."""
        n_mb = -(-max_rows // 64)
        want = -(-2 * self.n_sm // max(1, n_groups * n_mb * self.cfg.n_head_kv))
        return max(1, min(want, 32, -(-max_shared // 256)))

    def num_splits(self, batch: int, max_len: int, fused: bool = False) -> int:
        """Enough (batch, kv head, split) programs for two per multiprocessor, at least 64 keys each
        (fewer, longer splits measured faster once the batch fills the GPU: bench/attn_kernels.py),
        at most ``max_splits``; for the one-launch kernel four programs per multiprocessor, at
        least 32 keys each, at most ``fused_max_splits``."""
        if fused:  # latency-bound: more, shorter splits (bench/decode_attn_b1.py)
            want = -(-4 * self.n_sm // max(1, batch * self.cfg.n_head_kv))
            return max(1, min(want, self.fused_max_splits, -(-max_len // 32)))
        want = -(-2 * self.n_sm // max(1, batch * self.cfg.n_head_kv))
        return max(1, min(want, self.max_splits, -(-max_len // 64)))

    def prepare(self, seqs: list[StepSeq], ids: list[int]) -> tuple[torch.Tensor, AttentionStep]:
        rows, idx, val = self.pt.assign([s.seq_id for s in seqs], [s.page_table for s in seqs])
        positions: list[int] = []
        tok_rows: list[int] = []
        d_q, d_rows, d_lens, e_rows, e_start, e_len, e_kv = [], [], [], [], [], [], []
        q = 0
        for s, r in zip(seqs, rows):
            positions.extend(range(s.start, s.start + s.n))
            tok_rows.extend([r] * s.n)
            if s.n == 1:
                d_q.append(q)
                d_rows.append(r)
                d_lens.append(s.start + 1)
            else:
                e_rows.append(r)
                e_start.append(q)
                e_len.append(s.n)
                e_kv.append(s.start + s.n)
            q += s.n
        groups = self._groups(seqs) if len(d_q) > 1 else []
        if not self._worth(groups):
            groups = []
        casc: list[list[int]] = [[], [], [], [], []]
        width = 0
        if groups:
            casc, width = tk.cascade_lists(groups, d_lens)
        parts = [ids, positions, tok_rows, d_q, d_rows, d_lens, e_rows, e_start, e_len, e_kv, idx, val, *casc]
        host, spans = self.buf.pack(parts)
        dev = self.buf.send(host, spans[-1][0] + spans[-1][1])
        v = [dev[o : o + n] for o, n in spans]
        self.pt.apply(v[10], v[11])
        decode = extend = None
        if d_q:
            cfg = self.cfg
            cascade = None
            own = d_lens
            sh_splits = 0
            if groups:
                members = v[12].view(len(groups), width)
                cascade = tk.CascadeGroups(members, v[13], v[14], v[15], v[16], width)
                own = [n - st for n, st in zip(d_lens, casc[4])]
                sh_splits = self.shared_splits(len(groups), width * (cfg.n_head // cfg.n_head_kv),
                                               max(sh for _, sh in groups))
                self.n_cascade_steps += 1
            fused = not e_rows and cascade is None and self.fused_for(len(d_q))
            ws = tk.DecodeWorkspace(len(d_q), cfg.n_head, cfg.head_dim, self.num_splits(len(d_q), max(own), fused),
                                    self.device, shared_splits=sh_splits,
                                    n_head_kv=cfg.n_head_kv if fused else 0)
            decode = _Decode(v[3], v[4], v[5], ws, cascade)
        if e_rows:
            extend = _Extend(v[6], v[7], v[8], v[9], max(e_len))
        return v[0], TritonStep(self, v[1], v[2], decode, extend)

    def warm_eager(self, dtype: torch.dtype, decode_only: bool = False) -> int:
        from .eager_warmup import warm

        return warm(self, dtype, decode_only)

    # -- CUDA graphs -------------------------------------------------------------------------------
    def init_graphs(self, max_bucket: int) -> None:
        self.max_bucket = (max_bucket + 3) & ~3  # sections of whole 16-byte units
        m = self.max_bucket
        size = 5 * m + 3 * _G4 + GRAPH_GROUPS * m + 2 * _UPDATE_ROOM
        self._graph_dev = torch.zeros(size, dtype=torch.int32, device=self.device)
        self._graph_q_rows = torch.arange(max_bucket, dtype=torch.int32, device=self.device)
        self.load_graph_inputs(max_bucket, [], [])

    def _sections(self) -> list[torch.Tensor]:
        """ids, positions, rows, lengths, starts; group n, shared, minlen; members [groups, m]."""
        assert self._graph_dev is not None
        m = self.max_bucket
        out = [self._graph_dev[i * m : (i + 1) * m] for i in range(5)]
        o = 5 * m
        for _ in range(3):
            out.append(self._graph_dev[o : o + GRAPH_GROUPS])
            o += _G4
        out.append(self._graph_dev[o : o + GRAPH_GROUPS * m].view(GRAPH_GROUPS, m))
        return out

    def graph_step(self, bucket: int, cascade: bool = False) -> tuple[torch.Tensor, AttentionStep]:
        sec = self._sections()
        ids, pos, rows, lens, starts = (t[:bucket] for t in sec[:5])
        cfg = self.cfg
        # Splits for the longest context a sequence can have: the grid is fixed at capture.
        max_ctx = self.kv.n_pages * self.kv.page_size
        fused = self.fused_for(bucket) and not cascade
        ns = self.num_splits(bucket, max_ctx, fused)
        casc = None
        sh = 0
        if cascade:
            casc = tk.CascadeGroups(sec[8], sec[5], sec[6], sec[7], starts, bucket)
            sh = self.shared_splits(1, bucket * (cfg.n_head // cfg.n_head_kv), max_ctx)
        ws = self._graph_ws.setdefault(
            (bucket, cascade),
            tk.DecodeWorkspace(bucket, cfg.n_head, cfg.head_dim, ns, self.device, shared_splits=sh,
                               n_head_kv=cfg.n_head_kv if fused else 0))
        step = TritonStep(self, pos, rows, _Decode(self._graph_q_rows[:bucket], rows, lens, ws, casc), None)
        return ids, step

    def load_graph_inputs(self, bucket: int, seqs: list[StepSeq], ids: list[int],
                          groups: list[tuple[list[int], int]] | None = None) -> None:
        """``groups``: cascade groups (indices into ``seqs``) for the bucket's cascade graph."""
        assert self._graph_dev is not None and len(seqs) <= bucket <= self.max_bucket
        rows, idx, val = self.pt.assign([s.seq_id for s in seqs], [s.page_table for s in seqs])
        m, n = self.max_bucket, len(seqs)
        pad = m - n
        scratch = self.pt.scratch_row
        inline = len(idx) <= _UPDATE_ROOM
        starts, g_n, g_sh, g_min = [0] * m, [0] * _G4, [0] * _G4, [0] * _G4
        members = [0] * (GRAPH_GROUPS * m)
        if groups:
            self.n_cascade_steps += 1
        for gi, (mem, shared) in enumerate(groups or []):
            g_n[gi], g_sh[gi] = len(mem), shared
            g_min[gi] = min(seqs[i].start + 1 for i in mem)
            members[gi * m : gi * m + len(mem)] = mem
            for i in mem:
                starts[i] = shared
        parts = [
            list(ids) + [0] * pad,
            [s.start for s in seqs] + [0] * pad,
            rows + [scratch] * pad,
            [s.start + 1 for s in seqs] + [1] * pad,
            starts, g_n, g_sh, g_min, members,
            idx if inline else [],
            val if inline else [],
        ]
        host, spans = self._graph_host.pack(parts)
        self._graph_host.send(host, spans[-1][0] + spans[-1][1], self._graph_dev)
        if inline:
            o_i, n_i = spans[-2]
            o_v, _ = spans[-1]
            self.pt.apply(self._graph_dev[o_i : o_i + n_i], self._graph_dev[o_v : o_v + n_i])
        else:
            h2, sp2 = self.buf.pack([idx, val])
            dev = self.buf.send(h2, sp2[1][0] + sp2[1][1])
            self.pt.apply(dev[: len(idx)], dev[sp2[1][0] : sp2[1][0] + len(idx)])
