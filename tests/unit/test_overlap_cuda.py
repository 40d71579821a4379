"""Overlap on CUDA (skipped without a GPU): decode steps planned from the previous step's
tokens still on the device, replayed through the CUDA graphs (the fed tokens copied into the
graph's static input on the device) or run eagerly, give the same
greedy tokens as the engine without overlap; the step's host path never waits for the device
in between (checked by counting the steps planned ahead)."""

from __future__ import annotations

import pytest
import torch

from kvserve.engine.engine import Engine, EngineOptions
from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
from kvserve.engine.sampling_params import SamplingParams
from kvserve.model.chat_template import ChatTemplate
from kvserve.model.loader import load_gguf
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.model.tokenizer import Tokenizer

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _run(loaded, overlap: bool, n_slots: int) -> tuple[list[list[int]], int]:
    tok = Tokenizer.from_metadata(loaded.metadata)
    eng = Engine(loaded, tok, ChatTemplate.from_metadata(loaded.metadata),
                 EngineOptions(n_slots=n_slots, n_ctx=4096, check_integrity=True, overlap=overlap))
    finals: dict[int, list[int]] = {}
    for i in range(n_slots):
        rid = eng.new_request_id()
        prompt = [(7 * i + j) % 400 + 1 for j in range(5 + 3 * i)]
        params = RequestParams(n_predict=12 + i,
                               sampling=SamplingParams(temperature=0.0, top_k=1, ignore_eos=True))

        def emit(ev, rid=rid):
            if getattr(ev, "tokens", None) is not None and hasattr(ev, "stop_type"):
                finals[rid] = list(ev.tokens)

        eng.submit(GenerationRequest(rid, prompt, params, CacheIdentity()), emit)
    for _ in range(2000):
        eng._drain(block=False)
        eng.step()
        if len(finals) == n_slots:
            break
    eng.loop.drain()
    assert len(finals) == n_slots
    return [finals[k] for k in sorted(finals)], eng.loop.n_ahead


@pytest.mark.parametrize("graphs", ["1", "0"])  # replayed graphs; eager steps
def test_overlap_on_cuda_matches_step_by_step(tmp_path, monkeypatch, graphs):
    monkeypatch.setenv("KVSERVE_CUDA_GRAPHS", graphs)
    n_slots = 6
    path = write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec(arch="llama", head_dim=32, n_embd=128, n_vocab=512))
    loaded = load_gguf(path, dtype=torch.bfloat16, device="cuda", weights="dense")
    plain, n0 = _run(loaded, overlap=False, n_slots=n_slots)
    fed, n_ahead = _run(loaded, overlap=True, n_slots=n_slots)
    assert n0 == 0 and n_ahead > 5
    assert fed == plain
