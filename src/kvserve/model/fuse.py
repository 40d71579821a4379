"""Fuse projections that share an input into one matrix at load (dense weights).

Q/K/V of an attention module and gate/up of a gated MLP are concatenated row-wise into one
``nn.Linear`` (``attn.qkv``, ``mlp.gate_up``) whose output the layer splits by views, so one
GEMM (one weight read, one launch) serves the group. The quantized layout fuses the same groups
in ``quant.build`` (the group table ``FUSED`` is shared); the layer code only sees ``qkv`` /
``gate_up`` modules and does not care which layout built them.
"""

from __future__ import annotations

import torch
from torch import nn

from .quant.build import FUSED


def fuse_dense(model: nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Replace, in ``model`` (on the meta device) and its pending ``state`` dict, every complete
    group of ``FUSED`` by one linear module; returns the number of groups fused. Weights of one
    group must share dtype and input size (they always do for dense loads)."""
    n = 0
    for name, mod in list(model.named_modules()):
        kind = name.rpartition(".")[2]
        if kind not in FUSED:
            continue
        children, fused = FUSED[kind]
        keys = [f"{name}.{c}.weight" for c in children]
        if not all(k in state for k in keys) or getattr(mod, fused, None) is not None:
            continue
        ws = [state[k] for k in keys]
        if len({(w.dtype, w.shape[1]) for w in ws}) != 1:
            continue
        bs = [state.get(f"{name}.{c}.bias") for c in children]
        out = sum(w.shape[0] for w in ws)
        lin = nn.Linear(ws[0].shape[1], out, bias=any(b is not None for b in bs), device="meta")
        for c in children:
            state.pop(f"{name}.{c}.weight")
            state.pop(f"{name}.{c}.bias", None)
            delattr(mod, c)
        state[f"{name}.{fused}.weight"] = torch.cat(ws)
        if lin.bias is not None:
            state[f"{name}.{fused}.bias"] = torch.cat(
                [b if b is not None else w.new_zeros(w.shape[0]) for w, b in zip(ws, bs)])
        setattr(mod, fused, lin)
        n += 1
    return n
