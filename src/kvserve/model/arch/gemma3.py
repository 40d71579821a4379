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

    def forward(self, x: torch.Tensor, step: AttentionStep, residual: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``LlamaBlock.forward``: the output is the sum of the returned pair (``next_norm`` is
        not used: the post-FFN norm comes between the down projection and the sum)."""
        if residual is None:
            h, residual = self.attn_norm.forward(x), x
        else:
            h, residual = self.attn_norm.forward(x, residual)
        h, residual = self.ffn_norm.forward(self.post_attn_norm.forward(self.attn.forward(h, step)), residual)
        return self.post_ffn_norm.forward(self.mlp.forward(h)), residual


class Gemma3Model(LlamaModel):
    block_cls = Gemma3Block
