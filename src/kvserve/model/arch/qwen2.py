"""Qwen2: the llama decoder with Q/K/V biases and NEOX (half-split) rope.

Both differences come from the config (``qkv_bias`` from the GGUF tensors, ``rope_style``
from the architecture), so the module is the llama one.
"""

from __future__ import annotations

from .llama import LlamaModel


class Qwen2Model(LlamaModel):
    pass
