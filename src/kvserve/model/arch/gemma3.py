"""Gemma 3: sliding-window layers (5 local : 1 global), local rope base 10k / global 1M, NEOX
rope, QK-norm, post-attention and post-FFN norms, embeddings scaled by sqrt(n_embd), GELU-tanh
gated FFN. Window, bases and scale come from the config; norms use the GGUF weights as stored.
"""

from __future__ import annotations

import torch
from torch import nn

from ..backends.base import AttentionStep
from ..config import ModelConfig
from ..layers import GatedMLP, RMSNorm
from .llama import Attention, LlamaModel


class Gemma3Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.attn = Attention(cfg, layer)
        self.post_attn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.n_embd, cfg.n_ff, "gelu_tanh")
        self.post_ffn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)

    def forward(self, x: torch.Tensor, step: AttentionStep) -> torch.Tensor:
        x = x + self.post_attn_norm(self.attn(self.attn_norm(x), step))
        return x + self.post_ffn_norm(self.mlp(self.ffn_norm(x)))


class Gemma3Model(LlamaModel):
    block_cls = Gemma3Block
