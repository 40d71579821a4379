"""Rotary position embeddings, and ``rope_shift``: re-rotating cached keys by a position delta.

Keys are cached *after* rotation. Rotations compose, R(p + d) = R(d) · R(p), so moving a cached
key from position p to p + d is one more rotation by d: no recomputation of the token.
Angles are computed in float64 so that R(d)·R(p) matches R(p + d) to float32 rounding.
"""

from __future__ import annotations

import torch

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


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """Rotate x [T, H, D] (first rope_dim dims) by per-token angles cos/sin [T, rope_dim // 2]."""
    rd = cos.shape[-1] * 2
    xr, rest = x[..., :rd], x[..., rd:]
    c = cos[:, None, :]
    s = sin[:, None, :]
    if style == "neox":
        x1, x2 = xr[..., : rd // 2], xr[..., rd // 2 :]
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
    else:
        x1, x2 = xr[..., 0::2], xr[..., 1::2]
        out = torch.stack([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).flatten(-2)
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


def apply_rope_full(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """``apply_rope`` for x [T, H, D] (float32) whose every dim rotates, in a few ops:
    ``x·C + rot(x)·S`` with rot swapping the two members of each rotated pair and S carrying
    the sign. Each output is the same two products and one sum as in ``apply_rope`` (``a − b``
    is ``a + (−b)`` exactly), so the results are bit for bit the same."""
    if style == "neox":
        h = x.shape[-1] // 2
        rot = torch.cat([x[..., h:], x[..., :h]], -1)
    else:
        rot = x.view(*x.shape[:-1], -1, 2).flip(-1).view(x.shape)
    return (x * c).add_(rot.mul_(s))


def apply_rope_full_(x: torch.Tensor, c: torch.Tensor, s: torch.Tensor, style: RopeStyle) -> torch.Tensor:
    """``apply_rope_full`` in place: x is overwritten with the same bits."""
    if style == "neox":
        h = x.shape[-1] // 2
        rot = torch.cat([x[..., h:], x[..., :h]], -1)
    else:
        rot = x.view(*x.shape[:-1], -1, 2).flip(-1).view(x.shape)
    return x.mul_(c).add_(rot.mul_(s))


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
    """cos/sin per position, computed once (float64 angles, stored float32) for every rope key
    ``(base, scale)`` of a model: ``cos[key][p]`` is what ``rope_cos_sin`` gives for position p.
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
        pos = torch.arange(n, dtype=torch.int64, device=self.device)
        for key in self.keys:
            self.cos[key], self.sin[key] = rope_cos_sin(pos, self.rope_dim, key[0], key[1], torch.float32)
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
