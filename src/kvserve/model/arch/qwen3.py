"""Qwen3: the llama decoder with per-head RMS QK-norm before rope, NEOX rope, no biases."""

from __future__ import annotations

from .llama import LlamaModel


class Qwen3Model(LlamaModel):
    pass
