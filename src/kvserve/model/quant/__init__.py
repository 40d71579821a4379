"""Weights in compact layouts: GGUF blocks → exact groups → the kernels' layouts."""

from __future__ import annotations

from .dequant import dequantize, has_fast_path
from .embedding import QuantEmbedding
from .groups import GROUPED, Groups, to_groups
from .linear import DenseLinear, QuantLinear

__all__ = [
    "GROUPED",
    "DenseLinear",
    "Groups",
    "QuantEmbedding",
    "QuantLinear",
    "dequantize",
    "has_fast_path",
    "to_groups",
]
