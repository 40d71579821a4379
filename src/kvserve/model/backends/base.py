"""The attention backend interface: what the model needs from the KV pool in one step.

A backend turns the sequences of one micro-batch into an ``AttentionStep`` once per step
(``prepare``); the model then calls ``step.attend(layer, q, k, v)`` once per layer, which applies
RoPE to q and k, writes k and v into the paged pool, and returns the attention output.

    q [T, H, D], k/v [T, Hkv, D]   un-rotated projections of the T tokens of the step, in the
                                   order of ``StepSeq`` (each sequence's tokens contiguous)
    query at position p sees keys j with j <= p (and p - j < window on sliding-window layers)

Backends that run on CUDA graphs also implement the capture hooks: ``graph_step(bucket)`` gives
a step whose inputs live in static device buffers, and ``load_graph_inputs(bucket, seqs, ids)``
fills them for a replay. The torch backend is the reference every other backend is tested against.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class StepSeq:
    """``n`` tokens of one sequence at positions [start, start + n); the pages of ``page_table``
    hold every position before ``start`` and have room for the new ones."""

    seq_id: int
    start: int
    n: int
    page_table: tuple[int, ...]


class AttentionStep(ABC):
    positions: torch.Tensor  # int64 or int32 [T]

    @abstractmethod
    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """RoPE on q/k, KV write, attention: returns [T, H, D] in q's dtype."""

    def attend_qkv(self, layer: int, qkv: torch.Tensor, n_head: int, n_head_kv: int,
                   qk_norm: tuple[nn.Module, nn.Module] | None = None) -> torch.Tensor:
        """``attend`` on a fused projection's output: qkv [T, (H + 2·Hkv)·D] holds q, k and v side
        by side (a backend may rotate q and k together); ``qk_norm``: the per-head RMSNorms of q and
        k, applied before RoPE (a backend may fuse them). Returns [T, H, D]."""
        q, k, v = split_qkv(qkv, n_head, n_head_kv)
        if qk_norm is not None:
            q, k = qk_norm[0].forward(q), qk_norm[1].forward(k)
        return self.attend(layer, q, k, v)

    def quantizes_output(self, n_head: int, n_head_kv: int, head_dim: int) -> bool:
        """Whether ``attend_qkv_quant`` runs in this step (its attention kernel can write the
        output as the int8 GEMV's quantized input); none but the CUDA backend's decode steps."""
        return False

    def attend_qkv_quant(self, layer: int, qkv: torch.Tensor, n_head: int, n_head_kv: int,
                         quant_out) -> torch.Tensor:
        """``attend_qkv`` (without QK-norm) that also writes its output, as [T, H·D], into
        ``quant_out`` (``quant.triton_q8.QuantX`` buffers) as ``quantize_x`` would; only where
        ``quantizes_output``."""
        raise NotImplementedError


def split_qkv(qkv: torch.Tensor, n_head: int, n_head_kv: int) -> tuple[torch.Tensor, ...]:
    """q [T, H, D], k and v [T, Hkv, D]: views of a fused projection's output [T, (H + 2·Hkv)·D]."""
    x = qkv.view(qkv.shape[0], n_head + 2 * n_head_kv, -1)
    return x.split((n_head, n_head_kv, n_head_kv), dim=1)


class AttentionBackend(ABC):
    name: str = "base"
    supports_graphs: bool = False

    @abstractmethod
    def prepare(self, seqs: list[StepSeq], ids: list[int]) -> tuple[torch.Tensor, AttentionStep]:
        """Per-step inputs on the device: (token ids [T], the step's attention state)."""

    def graph_mode(self, seqs: list[StepSeq]) -> tuple[str, list[tuple[list[int], int]] | None]:
        """How a decode step of ``seqs`` that a CUDA graph could replay runs: ("plain", None),
        ("cascade", groups) — the bucket's cascade graph with these shared-prefix groups — or
        ("eager", None) when a path the graphs lack pays off."""
        return "plain", None

    def warm_eager(self, dtype: torch.dtype, decode_only: bool = False) -> int:
        """Compile, at start-up, the kernel variants eager steps can need (activations of
        ``dtype``; ``decode_only``: decode-only steps too, where no graph replays them). Returns
        the number of steps run (0: nothing to compile)."""
        return 0

    # -- CUDA graph hooks (backends with supports_graphs) ----------------------------------------
    def graph_step(self, bucket: int) -> tuple[torch.Tensor, AttentionStep]:
        """Static (ids, step) for a decode step of ``bucket`` sequences, used at capture."""
        raise NotImplementedError

    def load_graph_inputs(self, bucket: int, seqs: list[StepSeq], ids: list[int]) -> None:
        """Fill the static buffers of ``graph_step(bucket)`` for one decode step of ``seqs``
        (len(seqs) <= bucket; the remaining rows are padding that writes to a scratch page)."""
        raise NotImplementedError
