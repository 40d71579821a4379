"""Where programmatic dependent launch (PDL) can run: compiled CUDA kernels (not Triton's
interpreter) on sm90 or later. One answer for every kernel family that launches that way (the dense
GEMV, the one-launch decode attention, the quantized GEMVs and their producers)."""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def _sm90_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: compiled CUDA kernels (not the interpreter) on sm90 or later."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _sm90_or_later(device.index if device.index is not None else torch.cuda.current_device())
