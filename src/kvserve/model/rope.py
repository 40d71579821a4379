"""Rotary position embeddings, and ``rope_shift``: re-rotating cached keys by a position delta.

Keys are cached *after* rotation. Rotations compose, R(p + d) = R(d) · R(p), so moving a cached
key from position p to p + d is one more rotation by d: no recomputation of the token.
``rope_cos_sin`` computes angles in float64 so that R(d)·R(p) matches R(p + d) to float32
rounding (the shift); the model's per-position tables (``RopeTables``) are llama.cpp's instead
(``ggml_cos_sin``), and the rotation is ggml's as its build contracts it (``apply_rope``).
"""

from __future__ import annotations

import numpy as np
import torch

from . import ops_cpu
from .config import RopeStyle


def rope_cos_sin(
    positions: torch.Tensor, rope_dim: int, base: float, scale: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [T, rope_dim // 2] for integer (possibly negative) positions."""
    inv_freq = 1.0 / (
        base ** (torch.arange(0, rope_dim, 2, dtype=torch.float64, device=positions.device) / rope_dim)
    )
    angles = (positions.to(torch.float64) / scale)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def ggml_cos_sin(n_pos: int, rope_dim: int, base: float, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [n_pos, rope_dim // 2] (float32) of positions 0..n_pos−1 as llama.cpp's CPU rope
    cache computes them: θ_0 = p, θ_i+1 = θ_i · powf(base, −2 / rope_dim) by float32 products in
    order, then cosf/sinf of θ_i / scale. With the native ops built, libm's cosf/sinf (the bits
    llama.cpp gets); without, the float32 angles' cos/sin in float64, rounded (cosf is not always
    correctly rounded: ~3% of the values then differ by an ulp)."""
    if ops_cpu.available():
        return ops_cpu.rope_table(n_pos, rope_dim, base, 1.0 / scale)
    f32 = torch.float32
    ts = torch.tensor(float(np.power(np.float32(base), np.float32(-2.0) / np.float32(rope_dim))), dtype=f32)
    fs = torch.tensor(1.0 / scale, dtype=f32)
    theta = torch.arange(n_pos, dtype=f32)
    cols = []
    for _ in range(rope_dim // 2):
        cols.append(theta * fs)
        theta = theta * ts
    t = torch.stack(cols, -1).double()
    return t.cos().float(), t.sin().float()


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """fma(a, b, c) of float32 tensors, in float64 (a·b exact there; the sum rounded to float64,
    then to float32: the same bits as the instruction but for a tie after the first rounding,
    about one in 10^8 values)."""
    return (a.double() * b.double() + c.double()).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """Rotate x [T, H, D] (first rope_dim dims) by per-token angles cos/sin [T, rope_dim // 2]:
    a pair (x0, x1) becomes (fma(x0, c, −(x1·s)), fma(x0, s, x1·c)), ggml's rotation as its
    build contracts it (float32 activations; other dtypes are rotated in float32)."""
    rd = cos.shape[-1] * 2
    xr, rest = x[..., :rd], x[..., rd:]
    c = cos[:, None, :]
    s = sin[:, None, :]
    if xr.dtype != torch.float32:
        xr = xr.float()
    if style == "neox":
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
        out = torch.cat([_fma(x1, c, -(x2 * s)), _fma(x1, s, x2 * c)], dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([_fma(x1, c, -(x2 * s)), _fma(x1, s, x2 * c)], dim=-1).flatten(-2)
    out = out.to(x.dtype)  # angles are float32; keep the activations' dtype (bf16/f16 models)
    if rest.shape[-1]:
        out = torch.cat([out, rest], dim=-1)
    return out


def full_tables(cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [T, rope_dim // 2] → (C, S) [T, 1, rope_dim] for ``apply_rope_full``."""
    if style == "neox":
        c, s = torch.cat([cos, cos], -1), torch.cat([-sin, sin], -1)
    else:
        c, s = cos.repeat_interleave(2, -1), torch.stack([-sin, sin], -1).flatten(-2)
    return c.unsqueeze(1), s.unsqueeze(1)


def _rot(x: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    if style == "neox":
        h = x.shape[-1] // 2
        return torch.cat([x[..., h:], x[..., :h]], -1)
    return x.view(*x.shape[:-1], -1, 2).flip(-1).view(x.shape)


def _full(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    rot = _rot(x, style)
    xc, rs = x * c, rot * s  # float32 products: the unfused one of each pair
    first = torch.zeros(x.shape[-1], dtype=torch.bool, device=x.device)
    if style == "neox":
        first[: x.shape[-1] // 2] = True
    else:
        first[0::2] = True
    # x0' = fma(x0, c, −(x1·s)): x·C exact plus rot·S rounded; x1' = fma(x0, s, x1·c): rot·S exact plus x·C rounded
    exact = torch.where(first, x.double() * c.double(), rot.double() * s.double())
    return (exact + torch.where(first, rs, xc).double()).float()


def apply_rope_full(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """``apply_rope`` for x [T, H, D] (float32) whose every dim rotates, from the full tables
    (``full_tables``: S carries the sign, rot swaps the two members of each pair): each output
    is the same fused product and rounded product as in ``apply_rope``, the same bits."""
    return _full(x, c, s, style)


def apply_rope_full_(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """``apply_rope_full`` in place: x is overwritten with the same bits."""
    return x.copy_(_full(x, c, s, style))


def rope_shift(
    keys: torch.Tensor, delta: int, rope_dim: int, base: float, scale: float, style: RopeStyle
) -> torch.Tensor:
    """Keys [N, H, D] cached at positions p → the same keys as if computed at p + delta."""
    if delta == 0:
        return keys
    pos = torch.full((keys.shape[0],), delta, dtype=torch.int64, device=keys.device)
    cos, sin = rope_cos_sin(pos, rope_dim, base, scale, torch.float32)
    return apply_rope(keys.float(), cos, sin, style).to(keys.dtype)


class RopeTables:
    """cos/sin per position, computed once (``ggml_cos_sin``: llama.cpp's angles and values) for
    every rope key ``(base, scale)`` of a model: ``cos[key][p]`` for position p.
    Tables grow (doubling) when a position beyond them is asked for; a step indexes them with its
    positions instead of recomputing the angles."""

    def __init__(self, keys: set[tuple[float, float]], rope_dim: int, device: torch.device, n_pos: int = 4096) -> None:
        self.keys = sorted(keys)
        self.rope_dim = rope_dim
        self.device = device
        self.n_pos = 0
        self.cos: dict[tuple[float, float], torch.Tensor] = {}
        self.sin: dict[tuple[float, float], torch.Tensor] = {}
        self._full: dict[tuple[tuple[float, float], str], tuple[torch.Tensor, torch.Tensor]] = {}
        self.ensure(n_pos)

    def ensure(self, n_pos: int) -> None:
        """Cover positions [0, n_pos)."""
        if n_pos <= self.n_pos:
            return
        n = max(n_pos, 2 * self.n_pos)
        for key in self.keys:
            c, s = ggml_cos_sin(n, self.rope_dim, key[0], key[1])
            self.cos[key], self.sin[key] = c.to(self.device), s.to(self.device)
        self._full.clear()
        self.n_pos = n

    def lookup(self, positions: torch.Tensor) -> dict[tuple[float, float], tuple[torch.Tensor, torch.Tensor]]:
        """Per key, (cos, sin) [T, rope_dim // 2] at ``positions`` (which must be covered)."""
        return {k: (self.cos[k].index_select(0, positions), self.sin[k].index_select(0, positions)) for k in self.keys}

    def full(self, key: tuple[float, float], style: RopeStyle) -> tuple[torch.Tensor, torch.Tensor]:
        """``full_tables`` of every covered position for ``key``: (C, S) [n_pos, 1, rope_dim], built
        on first use (a step then gathers its rows instead of building them per step)."""
        t = self._full.get((key, style))
        if t is None:
            t = self._full[(key, style)] = full_tables(self.cos[key], self.sin[key], style)
        return t
