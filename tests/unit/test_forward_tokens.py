"""Tokens per forward: ``-ub`` on the CPU, up to ``-b`` (capped) in one forward on CUDA."""

from __future__ import annotations

import pytest
import torch

from kvserve.model.loader import load_gguf
from kvserve.model.runner import CUDA_FORWARD_TOKENS, ModelRunner, forward_tokens
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.plan import Plan, SeqChunk


@pytest.fixture(autouse=True)
def _no_override(monkeypatch):
    monkeypatch.delenv("KVSERVE_FORWARD_TOKENS", raising=False)


def test_cpu_follows_ubatch():
    assert forward_tokens("cpu", 512, 2048) == 512
    assert forward_tokens("cpu", 64, None) == 64


def test_cuda_takes_the_batch_within_the_cap():
    assert forward_tokens("cuda", 512, 2048) == 2048
    assert forward_tokens("cuda", 512, 1024) == 1024
    assert forward_tokens("cuda", 512, 8192) == CUDA_FORWARD_TOKENS
    assert forward_tokens("cuda", 4096, 2048) == 4096  # never below -ub
    assert forward_tokens("cuda", 512, None) == 512


def test_environment_sets_it(monkeypatch):
    monkeypatch.setenv("KVSERVE_FORWARD_TOKENS", "0")
    assert forward_tokens("cuda", 512, 2048) == 512
    monkeypatch.setenv("KVSERVE_FORWARD_TOKENS", "96")
    assert forward_tokens("cpu", 512, 2048) == 96


def _counting_runner(tmp_path, monkeypatch, n: str | None) -> tuple[ModelRunner, list[int]]:
    if n is not None:
        monkeypatch.setenv("KVSERVE_FORWARD_TOKENS", n)
    path = write_random_gguf(str(tmp_path / f"m{n}.gguf"), SynthSpec(n_layer=2, n_vocab=300, qtype="F32"))
    r = ModelRunner(load_gguf(path, device=torch.device("cpu")), n_pages=64, page_size=16, n_ubatch=64,
                    n_batch=2048)
    sizes: list[int] = []
    model = r.model
    r.model = lambda ids, step: (sizes.append(int(ids.numel())), model(ids, step))[1]  # type: ignore[assignment]
    r.model.logits = model.logits  # type: ignore[attr-defined]
    return r, sizes


def test_runner_splits_by_forward_tokens_with_the_same_logits(tmp_path, monkeypatch):
    ids = tuple(torch.randint(0, 290, (200,), generator=torch.Generator().manual_seed(1)).tolist())
    plan = Plan((SeqChunk(0, ids[:120], 0, tuple(range(8)), "last"), SeqChunk(1, ids[120:], 0, tuple(range(8, 16)), "last")))
    out = {}
    for n in (None, "256"):
        r, sizes = _counting_runner(tmp_path, monkeypatch, n)
        res = r.run(plan).logits
        out[n] = (sizes, [res[0], res[1]])
    assert out[None][0] == [64, 64, 64, 8]  # the CPU's -ub
    assert out["256"][0] == [200]  # one forward
    for a, b in zip(out[None][1], out["256"][1]):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)
