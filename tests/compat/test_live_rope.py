"""RoPE overrides (--rope-freq-base, --rope-scale, --rope-freq-scale, --rope-scaling) against
llama-server: the next-token log-probabilities (``n_probs``) it gave for the same prompt and flags
(tests/golden/rope-overrides.json, scripts/record_rope_overrides.py).

The default quantized CPU path differs from llama-server by up to ~0.16 in these log-probabilities
with SmolLM2 (~0.35 with Gemma 3); each override moves them by 0.9 or more, so a tolerance between
the two shows that the override is llama-server's."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from kvserve.model.config import RopeOverride
from kvserve.model.loader import load_gguf
from kvserve.model.runner import ModelRunner
from kvserve.model.tokenizer import Tokenizer
from kvserve.plan import Plan, SeqChunk

from .live import Starting, free_ports, launch

GOLDEN = json.loads((Path(__file__).parent.parent / "golden" / "rope-overrides.json").read_text())
TOL_SMOLLM, TOL_GEMMA = 0.25, 0.5


def _distance(ref: list[list[float]], ours: dict[int, float], k: int = 5) -> float:
    """Largest |log-prob difference| over the reference's top k tokens (missing: a large one)."""
    return max(abs(lp - ours.get(int(tid), -100.0)) for tid, lp in ref[:k])


def test_the_overrides_change_llama_servers_answer() -> None:
    """The golden cases are far apart (what makes the tolerance below meaningful)."""
    cases = GOLDEN["smollm2"]
    base = dict(map(tuple, cases["model"]["top_logprobs"][0]))
    for name in ("freq-base-10000", "rope-scale-2", "freq-scale-0.75-linear"):
        assert _distance(cases[name]["top_logprobs"][0], base) > 0.9, name
    assert cases["none-never-scales"] == {**cases["model"], "args": cases["none-never-scales"]["args"]}


@pytest.fixture(scope="module")
def smollm2_servers() -> Iterator[dict[str, Starting]]:
    """A server per golden case, with its flags, all started side by side (each is started once
    either way; start-up is most of a case's time)."""
    names = list(GOLDEN["smollm2"])
    starting = {name: launch("-np", "1", "-c", "1024", *GOLDEN["smollm2"][name]["args"], port=port)
                for name, port in zip(names, free_ports(len(names)))}
    try:
        yield starting
    finally:
        for s in starting.values():
            s.stop()


@pytest.mark.parametrize("name", list(GOLDEN["smollm2"]))
def test_smollm2_next_token_probabilities(name: str, smollm2_servers: dict[str, Starting]) -> None:
    case: dict[str, Any] = GOLDEN["smollm2"][name]
    srv = smollm2_servers[name].wait()
    r = httpx.post(srv.url + "/completion", timeout=120, json={
        "prompt": GOLDEN["prompt"], "n_predict": 1, "temperature": 0, "n_probs": GOLDEN["n_probs"],
        "cache_prompt": False})
    assert r.status_code == 200
    step = r.json()["completion_probabilities"][0]
    ours = {t["id"]: t["logprob"] for t in step["top_logprobs"]}
    assert step["id"] == case["tokens"][0]
    assert _distance(case["top_logprobs"][0], ours) < TOL_SMOLLM
    for other, oc in GOLDEN["smollm2"].items():  # and not any other case's answer
        if oc["top_logprobs"][0] != case["top_logprobs"][0]:
            assert _distance(oc["top_logprobs"][0], ours) > TOL_SMOLLM, other


def _gemma_logprobs(path: str, rope: RopeOverride | None) -> dict[int, float]:
    loaded = load_gguf(path, rope=rope)
    ids = Tokenizer.from_metadata(loaded.metadata).encode(GOLDEN["prompt"], add_special=True, parse_special=False)
    runner = ModelRunner(loaded, -(-len(ids) // 16) + 1, 16, torch.float32, 512, max_batch=1)
    plan = Plan((SeqChunk(0, tuple(ids), 0, tuple(range(-(-len(ids) // 16))), "last"),))
    lp = torch.log_softmax(runner.run(plan).logits[0].float().reshape(-1), -1)
    return {i: float(lp[i]) for i in range(lp.numel())}


def test_gemma3_sliding_window_layers_keep_their_rope(gemma_path: str) -> None:
    """--rope-scale 2 scales the full-attention layers only, as llama.cpp does (applied to every
    layer, the log-probabilities move ~1.1 away from llama-server's)."""
    cases = GOLDEN["gemma3"]
    ours = _gemma_logprobs(gemma_path, RopeOverride(freq_scale=0.5))
    assert _distance(cases["rope-scale-2"]["top_logprobs"][0], ours) < TOL_GEMMA
    ours = _gemma_logprobs(gemma_path, RopeOverride(freq_base=10000.0))
    assert _distance(cases["freq-base-10000"]["top_logprobs"][0], ours) < TOL_GEMMA
