"""``Prenormed``: the residual stream's sum as a GEMV that also did half of the RMSNorm after it
leaves it (``quant.triton_q8_norm``), for the layers to hand to the GEMV after the norm. A
type of its own, without Triton, so that the layers can tell it from a tensor on every backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

if TYPE_CHECKING:
    from .quant.triton_q8 import QuantX


class Prenormed(NamedTuple):
    """s = x + r as a producer GEMV with ``norm_out`` leaves it, for the GEMV after ``rms_norm(s) · w``."""

    xq: QuantX  # the codes of s · w, their scales and sums (of s · w: without the row's 1 / rms(s))
    ss: torch.Tensor  # float32 [M, blocks]: Σ s² over each block of columns of the producer
    s: torch.Tensor  # [M, K]: s itself, the residual stream
