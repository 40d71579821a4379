"""Llama-family decoder (SmolLM2, Llama 2/3, Mistral-style).

GGUF stores Q/K rows permuted for llama.cpp's adjacent-pair ("norm") rope, so the weights are
used as stored with adjacent-pair rotation; attention scores are unchanged by the permutation.
The attention module also serves Qwen2 (Q/K/V biases) and Qwen3/Gemma3 (QK-norm).

Submodules are called through ``.forward``: ``nn.Module.__call__``'s hook dispatch costs about a
microsecond a call, and a CPU decode step makes ~9 such calls per layer (no hooks are used).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .. import ops_cpu
from ..backends.base import AttentionStep
from ..config import ModelConfig
from ..cpu_forward import CpuForward
from ..layers import GatedMLP, RMSNorm, norm_linear
from ..prenormed import Prenormed


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.layer = layer
        hd = cfg.head_dim
        self.q = nn.Linear(cfg.n_embd, cfg.n_head * hd, bias=cfg.qkv_bias)
        self.k = nn.Linear(cfg.n_embd, cfg.n_head_kv * hd, bias=cfg.qkv_bias)
        self.v = nn.Linear(cfg.n_embd, cfg.n_head_kv * hd, bias=cfg.qkv_bias)
        self.o = nn.Linear(cfg.n_head * hd, cfg.n_embd, bias=False)
        self.qkv: nn.Module | None = None  # q, k and v fused at load (replaces the three)
        self.qkv_sizes = (cfg.n_head * hd, cfg.n_head_kv * hd, cfg.n_head_kv * hd)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_eps)

    def forward(self, x: torch.Tensor, step: AttentionStep) -> torch.Tensor:
        if self.qkv is not None:
            return self.from_qkv(self.qkv.forward(x), step)
        return self._attend(self.q.forward(x), self.k.forward(x), self.v.forward(x), step)

    def from_qkv(self, qkv: torch.Tensor, step: AttentionStep,
                 into: tuple[torch.Tensor, RMSNorm] | None = None) -> torch.Tensor | Prenormed:
        """The module's output from the fused projection's output [T, q | k | v]. ``into`` =
        (residual, norm): the output projection may return the ``Prenormed`` of its output +
        residual for the GEMV after ``norm`` instead (``CudaQuantLinear.forward_quantized_into``)."""
        cfg = self.cfg
        if not cfg.qk_norm:
            sink = self._o_input(qkv, step)
            if sink is not None:  # the attention kernel hands the output projection its int8 input
                o = step.attend_qkv_quant(self.layer, qkv, cfg.n_head, cfg.n_head_kv, sink)
                if into is not None and getattr(type(self.o), "forward_quantized_into", None) is not None:
                    pre = self.o.forward_quantized_into(sink, o.dtype, *into)
                    if pre is not None:
                        return pre
                return self.o.forward_quantized(sink, o.dtype)
            o = step.attend_qkv(self.layer, qkv, cfg.n_head, cfg.n_head_kv)
            return self.o.forward(o.reshape(qkv.shape[0], cfg.n_head * cfg.head_dim))
        if ops_cpu.enabled(qkv):  # QK-norm fused with RoPE and the KV write
            o = step.attend_qkv(self.layer, qkv, cfg.n_head, cfg.n_head_kv, (self.q_norm, self.k_norm))
            return self.o.forward(o.reshape(qkv.shape[0], cfg.n_head * cfg.head_dim))
        q, k, v = qkv.split(self.qkv_sizes, dim=-1)
        return self._attend(q, k, v, step)

    def _o_input(self, qkv: torch.Tensor, step: AttentionStep):
        """Buffers for the output projection's quantized input, where the step's attention can
        fill them (``AttentionStep.quantizes_output``) and the projection takes them (a CUDA
        quantized module on int8 activations); else None."""
        cfg = self.cfg
        if not step.quantizes_output(cfg.n_head, cfg.n_head_kv, cfg.head_dim):  # the step first: cheap
            return None
        make = getattr(self.o, "quant_input", None)
        return None if make is None else make(qkv.shape[0], qkv.device)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, step: AttentionStep) -> torch.Tensor:
        cfg = self.cfg
        t = q.shape[0]
        q = q.view(t, cfg.n_head, cfg.head_dim)
        k = k.view(t, cfg.n_head_kv, cfg.head_dim)
        v = v.view(t, cfg.n_head_kv, cfg.head_dim)
        if cfg.qk_norm:
            q = self.q_norm.forward(q)
            k = self.k_norm.forward(k)
        o = step.attend(self.layer, q, k, v)  # RoPE, KV write, paged attention (layer's window)
        return self.o.forward(o.reshape(t, cfg.n_head * cfg.head_dim))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.attn = Attention(cfg, layer)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.mlp = GatedMLP(cfg.n_embd, cfg.n_ff, "silu")

    def forward(self, x: torch.Tensor | Prenormed, step: AttentionStep, residual: torch.Tensor | None = None,
                next_norm: RMSNorm | None = None) -> tuple[torch.Tensor | Prenormed, torch.Tensor | None]:
        """The block on hidden state ``x + residual`` (``x`` alone when residual is None, or x a
        ``Prenormed``: its sum); returns ``(h, r)`` whose sum is its output, so that the next norm
        adds them in its kernel, or ``(Prenormed, None)`` where the down projection did the first
        half of ``next_norm`` (the next block's first norm) on it (``GatedMLP.forward_normed``)."""
        attn, mlp = self.attn, self.mlp
        if isinstance(x, Prenormed) and attn.qkv is None:
            x, residual = x.s, None
        if residual is None and not isinstance(x, Prenormed):
            h, residual = self.attn_norm.forward(x), x
            a = attn.forward(h, step)
        elif attn.qkv is not None:  # the norm may run inside the projection's kernel (norm_linear)
            qkv, residual = norm_linear(self.attn_norm, attn.qkv, x, residual)
            # the output projection may do the first half of the feed-forward norm where the
            # gate/up module does the second (looked up on the class: cheap on every backend)
            takes = getattr(type(mlp.gate_up), "forward_prenormed_act", None) is not None
            a = attn.from_qkv(qkv, step, (residual, self.ffn_norm) if takes else None)
        else:
            h, residual = self.attn_norm.forward(x, residual)
            a = attn.forward(h, step)
        if mlp.gate_up is not None:
            return mlp.forward_normed(self.ffn_norm, a, residual, next_norm)
        h, residual = self.ffn_norm.forward(a, residual)
        return mlp.forward(h), residual


class LlamaModel(nn.Module):
    block_cls: type[nn.Module] = LlamaBlock

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.n_vocab, cfg.n_embd)
        self.layers = nn.ModuleList([self.block_cls(cfg, i) for i in range(cfg.n_layer)])
        self.norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        if not cfg.tied_embeddings:
            self.lm_head = nn.Linear(cfg.n_embd, cfg.n_vocab, bias=False)
        # the native CPU forward (cpu_forward.CpuForward), decided on the first CPU step: None
        # until then, False where it does not apply
        self._cpu_forward: CpuForward | None | bool = None

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        if self.cfg.embed_scale != 1.0:
            x = x * torch.tensor(self.cfg.embed_scale, dtype=x.dtype)
        return x

    def forward(self, input_ids: torch.Tensor, step: AttentionStep) -> torch.Tensor:
        """Final-normed hidden states [T, n_embd] of the step's tokens (positions and KV pages
        are the step's)."""
        x = self.embed_tokens(input_ids)
        fast = self._cpu_forward
        if fast is not False and x.is_cpu:
            if fast is None:
                fast = self._cpu_forward = CpuForward.build(self) or False
            if fast and ops_cpu.ENABLED and CpuForward.runs(step, x):
                return fast.forward(x, step)
        residual = None
        prev = None
        for block in self.layers:  # each block but the last told the norm after it (its next's first)
            if prev is not None:
                x, residual = prev.forward(x, step, residual, block.attn_norm)
            prev = block
        x, residual = prev.forward(x, step, residual)
        return self.norm.forward(x, residual)[0] if residual is not None else self.norm.forward(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        if "lm_head" in self._modules:  # also set for tied embeddings when weights are repacked
            return self.lm_head(hidden).float()
        return F.linear(hidden, self.embed.weight).float()
