"""Dense (bf16/f16) linear layers of a CUDA decode step: a Triton GEMV beside cuBLAS, chosen per
weight shape at load by a short timing, and fused with the kernel that produces its input.

At one to four rows a step reads every weight once, so a linear layer costs its weight bytes ÷
the memory bandwidth plus a launch; cuBLAS reaches about 0.68 of the copy bandwidth on a
decode step's shapes, and the kernels between the GEMVs (the RMSNorm before Q/K/V and gate/up,
act(gate)·up before down) are launches of their own. ``GemvLinear`` (an ``nn.Linear``) runs the
``_gemv_triton`` kernel instead where the timing at load found it faster, and offers

- ``forward_normed(x, residual, norm)`` = ``(W · norm(x + residual), x + residual)`` in one launch,
- ``forward_act(gu, n_ff, act)`` = ``W · (act(g) · u)`` in one launch,

each falling back to the separate kernels (and cuBLAS) wherever the fused GEMV does not apply.

``prepare(model)`` (the loader, CUDA dense weights) turns the decode-step linear layers into
``GemvLinear`` and times, per distinct (shape, role) and for 1 and 4 rows, cuBLAS with the
kernel it would replace against a few Triton configurations, each over every layer of that
shape in turn (together larger than the L2, as in a step), replayed in a CUDA graph. Choices
are kept per process, so later loads of the same shapes do not time again.
``KVSERVE_DENSE_GEMV=0`` keeps cuBLAS and the separate kernels (the path before). The CPU never
gets here: its linear layers stay as they are.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from . import norm_kernel
from .pdl_support import pdl_supported

log = logging.getLogger(__name__)

MAX_ROWS = 4
ENABLED = os.environ.get("KVSERVE_DENSE_GEMV", "1") != "0"
# Programmatic dependent launch of the Triton GEMV (sm90+): its first weight tiles load while the
# kernel before still runs, and it lets the kernel after start early (``_gemv_triton``'s docstring).
# ``KVSERVE_GEMV_PDL=0`` launches it as before; KVSERVE_GEMV_PRE tiles (1 or 2) are loaded before
# the wait.
PDL = os.environ.get("KVSERVE_GEMV_PDL", "1").strip() != "0"
PRE_TILES = max(1, min(2, int(os.environ.get("KVSERVE_GEMV_PRE", "1"))))


def _interpret() -> bool:
    """Triton's interpreter (the CPU tests) runs the kernel on CPU tensors."""
    return os.environ.get("TRITON_INTERPRET") == "1"


class Config(NamedTuple):
    bn: int  # weight rows (output columns) per program
    bk: int  # K chunk a loop step loads: 8 weights (16 bytes) a thread along it
    warps: int
    programs: int  # aim for about this many programs per multiprocessor (sets the K split)
    stages: int = 1  # software-pipelining depth of the K loop (``tl.range(num_stages=...)``)


# What the load-time timing tries (at one row; the two fastest again at four): 4-16 KiB of
# weights a program loads per step, 4-16 programs a multiprocessor, one pipelined K loop.
# (On an H200, bench/dense_gemv.py: the candidates of 4-8 programs a multiprocessor were within
# a few % of each other on every tensor of the 1B and 8B shapes; (32, 512, 8, 2), fastest only
# on the 1B O projection by 0.3 %, was dropped.)
CANDIDATES = [Config(16, 256, 4, 8), Config(32, 256, 4, 4), Config(8, 512, 4, 8), Config(64, 128, 4, 4),
              Config(16, 256, 4, 16), Config(8, 512, 4, 16), Config(8, 256, 2, 16), Config(16, 256, 4, 8, 2)]
ROLES = ("plain", "norm", "act")

_SMS: dict[int, int] = {}
_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}


def _sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 4
    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SMS:
        _SMS[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SMS[i]


def split_of(n: int, k: int, cfg: Config, device: torch.device) -> tuple[int, int]:
    """(K slices, K chunks per slice) for ``cfg``."""
    chunks = -(-k // cfg.bk)
    blocks = -(-n // cfg.bn)
    want = max(1, min(chunks, (cfg.programs * _sms(device)) // blocks))
    steps = -(-chunks // want)
    return -(-chunks // steps), steps


def _counters(w: torch.Tensor, n: int) -> torch.Tensor:
    """Completion counters of split GEMVs over ``w``, one int32 per (batch block, column block),
    zero between calls (the last slice of a call resets its own)."""
    key = (w.device, w.data_ptr())
    c = _COUNTERS.get(key)
    if c is None or c.numel() < n:  # sized for the narrowest column blocks tried: never replaced
        c = torch.zeros(max(n, 64, -(-w.shape[0] // min(x.bn for x in CANDIDATES))), dtype=torch.int32,
                        device=w.device)
        _COUNTERS[key] = c
    return c


def gemv(x: torch.Tensor, w: torch.Tensor, cfg: Config, bias: torch.Tensor | None = None, *,
         residual: torch.Tensor | None = None, norm_w: torch.Tensor | None = None, eps: float = 0.0,
         n_ff: int = 0, act: str | None = None, out: torch.Tensor | None = None,
         pdl: bool | None = None, pre: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(y [M, N] in x's dtype, the residual sum or None). Plain: y = x @ wᵀ + bias. With
    ``residual`` and ``norm_w``: y = rms_norm(x + residual) · norm_w @ wᵀ + bias, and the sum
    x + residual is returned. With ``act`` (silu | gelu_tanh): x = [g | u] [M, 2·n_ff] and
    y = (act(g) · u) @ wᵀ + bias.

    ``pdl`` (default ``PDL``; only where ``pdl_supported``): launched as a programmatic dependent
    launch with ``pre`` weight tiles (default ``PRE_TILES``; at most the K chunks of a slice)
    loaded before it waits for the kernel before. ``pre`` alone (no PDL) moves those loads ahead
    of the first read of x, nothing else: the result is the same bits either way."""
    from . import _gemv_triton as G

    m = x.shape[0]
    n, k = w.shape
    assert 1 <= m and x.stride(-1) == 1 and w.stride(1) == 1
    pro = 0 if act is None and residual is None else (2 if act is not None else 1)
    if pro == 2:
        assert k == n_ff and x.shape[1] >= 2 * n_ff
    else:
        assert x.shape[1] == k
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = None
    if pro == 1:
        assert residual is not None and norm_w is not None and residual.stride(-1) == 1
        s = torch.empty((m, k), dtype=x.dtype, device=x.device)
    bm = min(MAX_ROWS, 1 << (m - 1).bit_length())
    splits, steps = split_of(n, k, cfg, x.device)
    grid = (-(-m // bm), -(-n // cfg.bn), splits)
    if splits > 1:
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        sq = torch.empty((splits, m, grid[1]), dtype=torch.float32, device=x.device) if pro == 1 else part
        cnt = _counters(w, grid[0] * grid[1])
    else:
        part = sq = out  # not read
        cnt = w
    r = residual if residual is not None else x
    nw = norm_w if norm_w is not None else x
    sv = s if s is not None else x
    pdl = (PDL if pdl is None else pdl) and pdl_supported(x.device)
    pre = min(steps, 2, (PRE_TILES if pdl else 0) if pre is None else pre)
    extra = {"launch_pdl": True} if pdl else {}
    kernel = G.gemv_kernel_const if G.INTERPRET else G.gemv_kernel
    kernel[grid](x, r, nw, sv, w, bias if bias is not None else out, out, part, sq, cnt, m, n, k,
                 x.stride(0), r.stride(0), sv.stride(0), w.stride(0), out.stride(0), n_ff, float(eps),
                 steps, splits,
                 PRO=pro, GELU=act == "gelu_tanh", HAS_BIAS=bias is not None, BM=bm, BN=cfg.bn, BK=cfg.bk,
                 SPLIT=splits > 1, SB=min(8, 1 << (splits - 1).bit_length()), STAGES=cfg.stages,
                 PRE=pre, PDL=pdl, num_warps=cfg.warps, **extra)
    return out, s


class GemvLinear(nn.Linear):
    """``nn.Linear`` whose CUDA forward at ≤ ``MAX_ROWS`` rows runs the Triton GEMV when the
    load-time timing chose it (``choice``: per row bucket 1 / 4, a ``Config`` or None = cuBLAS)."""

    choice: dict[int, Config | None]

    def _cfg(self, x: torch.Tensor) -> Config | None:
        m = x.numel() // x.shape[-1] if x.dim() else 0
        if not (1 <= m <= MAX_ROWS and (x.is_cuda or _interpret())):
            return None
        return self.choice.get(1 if m == 1 else MAX_ROWS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        cfg = self._cfg(x)
        if cfg is None or x.dtype != self.weight.dtype:
            return F.linear(x, self.weight, self.bias)
        x2 = x.reshape(-1, x.shape[-1])
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        return gemv(x2, self.weight, cfg, self.bias)[0].view(*x.shape[:-1], self.out_features)

    def forward_normed(self, x: torch.Tensor, residual: torch.Tensor, norm: nn.Module
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """(self(norm(x + residual)), x + residual) — ``norm`` an RMSNorm; one launch when it applies."""
        cfg = self._cfg(x)
        if (cfg is None or x.dim() != 2 or x.dtype != self.weight.dtype or residual.dtype != x.dtype
                or not x.is_contiguous() or not residual.is_contiguous()):
            h, s = norm.forward(x, residual)
            return self.forward(h), s
        y, s = gemv(x, self.weight, cfg, self.bias, residual=residual, norm_w=norm.weight, eps=norm.eps)
        assert s is not None
        return y, s

    def forward_act(self, gu: torch.Tensor, n_ff: int, act: str) -> torch.Tensor:
        """self(act(gu[:, :n_ff]) · gu[:, n_ff:]) for a 2-D gu with unit column stride (CUDA)."""
        cfg = self._cfg(gu)
        if cfg is None or gu.dim() != 2 or gu.dtype != self.weight.dtype or gu.stride(-1) != 1:
            return self.forward(norm_kernel.act_mul(gu, n_ff, act))
        return gemv(gu, self.weight, cfg, self.bias, n_ff=n_ff, act=act)[0]


def role_of(name: str) -> str | None:
    """How a decode step feeds the linear layer ``name`` (None: not one of a step's GEMVs)."""
    last = name.rpartition(".")[2]
    if last in ("qkv", "gate_up"):
        return "norm"
    if last == "down":
        return "act"
    if last in ("q", "k", "v", "o", "gate", "up", "lm_head"):
        return "plain"
    return None


def graph_time_us(calls: list[Callable[[], object]], min_calls: int = 32) -> float:
    """GPU microseconds per call of ``calls`` (in turn, at least ``min_calls`` in all) replayed in a
    CUDA graph: no launch cost on the host, the gaps between kernels of a graph included."""
    n = max(min_calls, len(calls))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for c in calls:
            c()
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for i in range(n):
            calls[i % len(calls)]()
    g.replay()
    torch.cuda.synchronize()
    best = float("inf")
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        best = min(best, e0.elapsed_time(e1) * 1e3 / n)
    del g
    return best


class _Probe:
    """Inputs of one timing: x (or [g | u]) and the residual for ``rows`` rows, and an RMSNorm."""

    def __init__(self, k: int, rows: int, dtype: torch.dtype, device: torch.device, role: str) -> None:
        gen = torch.Generator(device=device).manual_seed(0)
        width = 2 * k if role == "act" else k
        self.x = torch.randn((rows, width), generator=gen, device=device).to(dtype)
        self.r = torch.randn((rows, k), generator=gen, device=device).to(dtype)
        self.nw = torch.ones(k, device=device, dtype=torch.float32)
        self.k = k

    def baseline(self, mod: nn.Linear, role: str) -> Callable[[], object]:
        if role == "norm":
            return lambda: F.linear(norm_kernel.add_rms_norm(self.x, self.r, self.nw, 1e-6)[0], mod.weight,
                                    mod.bias)
        if role == "act":
            return lambda: F.linear(norm_kernel.act_mul(self.x, self.k, "silu"), mod.weight, mod.bias)
        return lambda: F.linear(self.x, mod.weight, mod.bias)

    def fused(self, mod: nn.Linear, role: str, cfg: Config) -> Callable[[], object]:
        if role == "norm":
            return lambda: gemv(self.x, mod.weight, cfg, mod.bias, residual=self.r, norm_w=self.nw, eps=1e-6)
        if role == "act":
            return lambda: gemv(self.x, mod.weight, cfg, mod.bias, n_ff=self.k, act="silu")
        return lambda: gemv(self.x, mod.weight, cfg, mod.bias)


# (N, K, dtype, bias, role, device name, rows) → (choice, µs per candidate) of this process
_CHOSEN: dict[tuple, tuple[Config | None, dict[str, float]]] = {}
# (shape, layers, role, rows, µs per candidate, chosen) of the last ``prepare``
TIMINGS: list[tuple[str, int, str, int, dict[str, float], str]] = []


def _label(c: Config | None) -> str:
    return "cublas" if c is None else f"triton{tuple(c) if c.stages > 1 else tuple(c)[:4]}"


def _choose(mods: list[nn.Linear], role: str, rows: int, cands: list[Config]) -> tuple[Config | None, dict]:
    w = mods[0].weight
    key = (tuple(w.shape), w.dtype, mods[0].bias is not None, role, torch.cuda.get_device_name(w.device),
           rows)
    if key in _CHOSEN:
        return _CHOSEN[key]
    probe = _Probe(w.shape[1], rows, w.dtype, w.device, role)
    times = {"cublas": graph_time_us([probe.baseline(m, role) for m in mods])}
    for c in cands:
        try:
            times[_label(c)] = graph_time_us([probe.fused(m, role, c) for m in mods])
        except Exception as e:  # a configuration that does not compile here is not a choice
            log.debug("GEMV configuration %s failed: %s", c, e)
    best = min(times, key=times.__getitem__)
    choice = next((c for c in cands if _label(c) == best), None)
    _CHOSEN[key] = (choice, times)
    return choice, times


def prepare(model: nn.Module) -> int:
    """Turn the decode-step linear layers of ``model`` (dense bf16/f16 weights on CUDA) into
    ``GemvLinear`` and choose, per shape and role, cuBLAS or a Triton configuration. Returns the
    number of layers with a Triton choice (at one row)."""
    if not ENABLED or not torch.cuda.is_available():
        return 0
    if not norm_kernel.available(torch.empty(1, device="cuda")):
        return 0
    groups: dict[tuple, list[nn.Linear]] = {}
    for name, mod in model.named_modules():
        role = role_of(name)
        if role is None or type(mod) is not nn.Linear:
            continue
        w = mod.weight
        if not (w.is_cuda and w.dtype in (torch.bfloat16, torch.float16) and w.is_contiguous()):
            continue
        mod.__class__ = GemvLinear
        mod.choice = {}
        groups.setdefault((tuple(w.shape), w.dtype, mod.bias is not None, role), []).append(mod)
    t0 = time.perf_counter()
    chosen = 0
    TIMINGS.clear()
    for (shape, dtype, _, role), mods in groups.items():
        with torch.no_grad():
            c1, t1 = _choose(mods, role, 1, CANDIDATES)
            ranked = sorted((c for c in CANDIDATES if _label(c) in t1), key=lambda c: t1[_label(c)])[:2]
            c4, t4 = _choose(mods, role, MAX_ROWS, ranked)
        for mod in mods:
            mod.choice = {1: c1, MAX_ROWS: c4}
        chosen += len(mods) if c1 is not None else 0
        label = f"{shape[0]}x{shape[1]}"
        TIMINGS.append((label, len(mods), role, 1, t1, _label(c1)))
        TIMINGS.append((label, len(mods), role, MAX_ROWS, t4, _label(c4)))
        log.debug("GEMV %s %s ×%d: 1 row %s %s; %d rows %s %s", label, role, len(mods), _label(c1), t1,
                  MAX_ROWS, _label(c4), t4)
    if groups:
        log.info("decode GEMVs: Triton for %d of %d linear layers at one row (chosen by timing in %.1f s)",
                 chosen, sum(len(v) for v in groups.values()), time.perf_counter() - t0)
    return chosen
