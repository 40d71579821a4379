"""The CPU layer's work between the matrix products as native calls (``ops_cpu.c``).

A CPU decode step's cost outside its linear layers follows its number of torch calls (each
costs several µs there: the weights streamed by the matrix products evict the caches between
layers). These functions do in one call each what ``layers`` and the torch backend do in many:
RMSNorm with the residual add before it, RoPE on q and k with the KV write (QK-norm first where
the architecture has it), and act(gate) · up. ``ops_cpu.c`` states their arithmetic (llama.cpp's
where it is cheap: squares summed in float64, SiLU through exp, GELU through ggml's f16 table).

They run for float32 activations on the CPU whenever the extension is built and
``KVSERVE_NATIVE`` is not ``0``; the decision depends on nothing else (not the shape, not the
layout: a strided input is copied first), so every step of a model takes the same arithmetic and
cached, batched and chunked evaluations keep giving the same bits. Otherwise the torch code in
``layers`` and ``backends.torch_ref`` runs (the readable reference).
"""

from __future__ import annotations

import os

import torch

try:
    from . import _ops_cpu  # type: ignore[attr-defined]
except ImportError:  # not built: the torch path runs
    _ops_cpu = None

ENABLED = _ops_cpu is not None and os.environ.get("KVSERVE_NATIVE", "1") != "0"
KV_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
ACTS = {"silu": 0, "gelu_tanh": 1}
_F32 = torch.float32


def available() -> bool:
    """Whether the extension is built (its libm-based helpers, like ``rope_table``, then run
    whatever ``KVSERVE_NATIVE`` says: they compute tables, not a path of the forward pass)."""
    return _ops_cpu is not None


def rope_table(n_pos: int, rope_dim: int, base: float, freq_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """llama.cpp's rope cos/sin [n_pos, rope_dim // 2] (float32) for positions 0..n_pos−1."""
    assert _ops_cpu is not None
    c, s = torch.empty(n_pos, rope_dim // 2), torch.empty(n_pos, rope_dim // 2)
    _ops_cpu.rope_table(c.data_ptr(), s.data_ptr(), 0, n_pos, rope_dim, float(base), float(freq_scale))
    return c, s


def enabled(x: torch.Tensor) -> bool:
    """Whether the native ops run for activations like ``x`` (float32 on the CPU)."""
    return ENABLED and x.dtype is _F32 and x.is_cpu


def describe() -> str:
    """The load log's note on which code runs the CPU layer's norms, RoPE and activations."""
    if ENABLED:
        return "native (ops_cpu)"
    return "torch (" + ("KVSERVE_NATIVE=0" if _ops_cpu is not None else "native ops not built") + ")"


def set_isa(level: int) -> int:
    """Cap the SiLU and RoPE loops' instruction set (0 generic, 1 AVX2, 2 AVX-512; -1 the best); returns the
    level now used (tests: every level gives the same bits)."""
    assert _ops_cpu is not None
    return int(_ops_cpu.set_isa(level))


def _rows(x: torch.Tensor, n: int) -> torch.Tensor:
    """x as [M, n] rows with contiguous elements (a copy only when x's layout needs one)."""
    if x.dim() != 2 or x.stride(1) != 1:
        x = x.reshape(-1, n)
        if x.stride(1) != 1:
            x = x.contiguous()
    return x


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``norm(x) * w``; with ``residual`` (x's shape): ``(norm(x + residual) * w, x + residual)``.
    x [..., n] float32; the results have x's shape."""
    n = x.shape[-1]
    x2 = _rows(x, n)
    m = x2.shape[0]
    assert w.dtype is _F32
    y = torch.empty(x.shape)
    threads = torch.get_num_threads() if m > 1 else 1
    if residual is None:
        _ops_cpu.rms_norm(x2.data_ptr(), x2.stride(0), 0, 0, 0, 0, w.data_ptr(), y.data_ptr(), n, m, n, eps,
                          threads)
        return y
    r = _rows(residual, n)
    s = torch.empty(x.shape)
    _ops_cpu.rms_norm(x2.data_ptr(), x2.stride(0), r.data_ptr(), r.stride(0), s.data_ptr(), n, w.data_ptr(),
                      y.data_ptr(), n, m, n, eps, threads)
    return y, s


def act_mul(gu: torch.Tensor, n_ff: int, act: str, up: torch.Tensor | None = None) -> torch.Tensor:
    """act(gu[:, :n_ff]) * gu[:, n_ff:2 n_ff] for gu [M, ≥ 2 n_ff] float32 (the fused gate/up
    projection's output), or act(gu) * up for separate gate and up outputs [M, n_ff]: [M, n_ff]."""
    g = _rows(gu, gu.shape[-1])
    u = g if up is None else _rows(up, n_ff)
    m = g.shape[0]
    y = torch.empty(m, n_ff)
    u0 = u.data_ptr() + (4 * n_ff if up is None else 0)
    _ops_cpu.act_mul(g.data_ptr(), g.stride(0), u0, u.stride(0), n_ff, y.data_ptr(), n_ff, m, ACTS[act],
                     torch.get_num_threads() if m > 1 else 1)
    return y


def rope_kv(qkv: torch.Tensor, n_head: int, n_head_kv: int, head_dim: int, cos: torch.Tensor,
            sin: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, kv: torch.Tensor, neox: bool,
            q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
            eps: float = 0.0) -> torch.Tensor:
    """The fused projection's output qkv [T, (H + 2 Hkv) · D] float32 with rows of contiguous
    elements: q and k rotated in place by the tables ``cos``/``sin`` [positions, rope_dim / 2]
    at ``positions`` (int64 [T]), after their per-head RMSNorm when ``q_norm``/``k_norm`` [D]
    are given, and k and v written to rows ``rows`` (int64 [T]) of ``kv`` — a layer's K and V
    side by side, [2, pool rows, Hkv, D] (float32, float16 or bfloat16, contiguous per half).
    Returns qkv (as [T, H + 2 Hkv, D])."""
    t = qkv.shape[0]
    if qkv.stride(-1) != 1:
        qkv = qkv.contiguous()
    assert kv.stride(-1) == 1 and kv.stride(-2) == head_dim and kv.stride(-3) == n_head_kv * head_dim
    assert positions.dtype == torch.int64 and rows.dtype == torch.int64 and positions.is_contiguous()
    k, v = kv.data_ptr(), kv.data_ptr() + kv.stride(0) * kv.element_size()
    _ops_cpu.rope_kv(qkv.data_ptr(), t, qkv.stride(0), n_head, n_head_kv, head_dim, 2 * cos.shape[-1],
                     cos.data_ptr(), sin.data_ptr(), positions.data_ptr(), rows.data_ptr(), k, v,
                     KV_TYPES[kv.dtype], int(neox), 0 if q_norm is None else q_norm.data_ptr(),
                     0 if k_norm is None else k_norm.data_ptr(), eps, torch.get_num_threads() if t > 1 else 1,
                     0)
    return qkv.view(t, n_head + 2 * n_head_kv, head_dim)


def exp(x: torch.Tensor) -> torch.Tensor:
    """The kernels' exp of a contiguous float32 tensor (tests)."""
    assert _ops_cpu is not None and x.dtype == _F32 and x.is_contiguous()
    y = torch.empty_like(x)
    _ops_cpu.exp(x.data_ptr(), y.data_ptr(), x.numel())
    return y
