"""Rank pooling (``--pooling rank``, ``--reranking``): one relevance score per sequence.

As llama.cpp's ``build_pooling`` for ``LLAMA_POOLING_TYPE_RANK`` with a causal model: the
final-normed hidden state of the sequence's last token, through the GGUF's classifier head
when the file has one, and the score is element 0 of the result.

- ``cls.output.weight`` [n_cls_out, n_embd] (+ ``cls.output.bias``): a linear projection.
  llama.cpp reads it for ``qwen3`` only; Qwen3 rerankers carry it (their "yes"/"no" rows of
  the LM head).
- no head: the score is the first component of the hidden state itself (what llama-server
  answers for a plain chat model started with ``--reranking``).
- ``qwen3``: a softmax over the vector (head or not) comes last, as llama.cpp's graph does.

Tensors are float32 on the model's device; the head is tiny (a few rows).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

HEAD_TENSORS = ("cls.output.weight", "cls.output.bias")
HEAD_ARCHS = frozenset({"qwen3"})  # the architectures whose GGUF may carry the head
_SOFTMAX_ARCHS = frozenset({"qwen3"})


class RankHead:
    def __init__(self, weight: torch.Tensor | None, bias: torch.Tensor | None, softmax: bool) -> None:
        if weight is None and bias is not None:
            raise ValueError("cls.output.bias without cls.output.weight")
        self.weight = weight
        self.bias = bias
        self.softmax = softmax

    @classmethod
    def from_tensors(cls, arch: str, tensors: Mapping[str, torch.Tensor]) -> RankHead:
        """``tensors``: the GGUF's ``cls.output.*`` tensors by name (possibly none)."""
        return cls(tensors.get("cls.output.weight"), tensors.get("cls.output.bias"), arch in _SOFTMAX_ARCHS)

    @property
    def has_classifier(self) -> bool:
        return self.weight is not None

    def pooled(self, last_hidden: torch.Tensor) -> torch.Tensor:
        """[n_embd] final-normed hidden state of the last token -> the rank-pooled vector."""
        x = last_hidden.float()
        if self.weight is not None:
            x = self.weight.to(x.device, torch.float32) @ x
            if self.bias is not None:
                x = x + self.bias.to(x.device, torch.float32)
        if self.softmax:
            x = torch.softmax(x, dim=-1)
        return x

    def score(self, last_hidden: torch.Tensor) -> float:
        return float(self.pooled(last_hidden)[0])
