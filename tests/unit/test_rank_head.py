"""Rank pooling's head (model/rank_head.py) and the GGUF classifier tensors the loader reads for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGUFReader

from kvserve.model.config import UnsupportedModelError
from kvserve.model.loader import load_gguf
from kvserve.model.rank_head import RankHead
from kvserve.model.synth import SynthSpec, write_random_gguf


def test_without_a_head_the_score_is_the_first_component() -> None:
    h = torch.tensor([-0.5, 2.0, 3.0])
    head = RankHead.from_tensors("llama", {})
    assert not head.has_classifier
    assert head.score(h) == -0.5
    assert torch.equal(head.pooled(h), h)


def test_classifier_projection_bias_and_qwen3_softmax() -> None:
    h = torch.tensor([1.0, 2.0])
    w = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    b = torch.tensor([0.5, 0.0, -1.0])
    plain = RankHead(w, b, softmax=False)
    assert plain.pooled(h).tolist() == [1.5, 2.0, 2.0]
    q3 = RankHead.from_tensors("qwen3", {"cls.output.weight": w, "cls.output.bias": b})
    assert q3.score(h) == pytest.approx(float(torch.softmax(torch.tensor([1.5, 2.0, 2.0]), 0)[0]))
    # qwen3 applies its softmax with or without a head, as llama.cpp's graph does
    assert RankHead.from_tensors("qwen3", {}).score(h) == pytest.approx(float(torch.softmax(h, 0)[0]))
    with pytest.raises(ValueError):
        RankHead(None, b, softmax=False)


def test_loader_reads_a_qwen3_classifier_head(tmp_path: Path) -> None:
    path = write_random_gguf(str(tmp_path / "q3.gguf"), SynthSpec(arch="qwen3", n_cls_out=2))
    loaded = load_gguf(path, weights="dense")
    head = loaded.rank_head
    assert head is not None and head.has_classifier and head.softmax
    want = next(t for t in GGUFReader(path).tensors if t.name == "cls.output.weight")
    assert head.weight is not None and head.weight.shape == (2, 64)
    np.testing.assert_allclose(head.weight.numpy(), np.asarray(want.data).reshape(2, 64))
    s = head.score(torch.ones(64))
    assert 0.0 < s < 1.0


def test_a_classifier_head_on_another_architecture_is_refused(tmp_path: Path) -> None:
    """llama.cpp reads cls.output only for qwen3; elsewhere the file does not match its architecture."""
    path = write_random_gguf(str(tmp_path / "l.gguf"), SynthSpec(arch="llama", n_cls_out=2))
    with pytest.raises(UnsupportedModelError):
        load_gguf(path, weights="dense")
    assert load_gguf(write_random_gguf(str(tmp_path / "l0.gguf"), SynthSpec(arch="llama")),
                     weights="dense").rank_head is not None
