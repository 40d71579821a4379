"""Cache identity: pages are shared only within one (model, KV settings, tenant, adapters, media)
identity. Every dimension is exercised; identical tokens from different chat templates share."""

from __future__ import annotations

import os

import pytest

from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams
from kvserve.engine.slot_store import restore, save
from kvserve.model.chat_template import ChatTemplate
from kvserve.model.loader import load_gguf
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.engine.errors import EngineError

from ..conftest import TEXTS
from .engine_harness import GREEDY, Collector, assert_idle, make_engine, run


def _submit(eng, tokens, identity):
    col = Collector()
    eng.submit(GenerationRequest(eng.new_request_id(), list(tokens), RequestParams(n_predict=2, sampling=GREEDY), identity), col)
    return col


@pytest.fixture(scope="module")
def eng(smollm):
    return make_engine(smollm, n_slots=2)


@pytest.fixture(scope="module")
def ids(eng):
    return eng.tokenizer.encode(TEXTS[0], add_special=True, parse_special=False)


@pytest.mark.parametrize(
    "other",
    [
        CacheIdentity(tenant="key-2"),
        CacheIdentity(lora=((0, 1.0),)),
        CacheIdentity(media="sha256:abcd"),
    ],
    ids=["tenant", "lora", "media"],
)
def test_request_identity_dimensions_do_not_share(eng, ids, other):
    base = CacheIdentity()
    first = _submit(eng, ids, base)
    run(eng, [first])
    b = _submit(eng, ids, other)
    run(eng, [b])
    again = _submit(eng, ids, base)
    run(eng, [again])
    assert b.final.n_cached == 0
    assert again.final.n_cached == len(ids) - 1
    assert_idle(eng)


def test_same_tokens_from_different_templates_share(eng):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    chatml = ChatTemplate.from_metadata(eng.loaded.metadata, "chatml")
    text_a = eng.chat_template.render(msgs)
    text_b = chatml.render(msgs)
    assert text_a == text_b  # SmolLM2's template renders ChatML: same tokens
    ta = eng.tokenizer.encode(text_a, add_special=True, parse_special=True)
    a = _submit(eng, ta, CacheIdentity(tenant="tpl"))
    run(eng, [a])
    b = _submit(eng, eng.tokenizer.encode(text_b, add_special=True, parse_special=True), CacheIdentity(tenant="tpl"))
    run(eng, [b])
    assert b.final.n_cached == len(ta) - 1


def _synth_engine(path, **kw):
    return make_engine(load_gguf(path), n_slots=1, n_ctx=512, **kw)


def test_model_file_kv_dtype_and_context_are_part_of_the_identity(tmp_path):
    """A slot saved under one identity is refused by an engine with another model file, KV
    dtype or context size, and restores into an identical engine."""
    import torch

    p1 = write_random_gguf(str(tmp_path / "a.gguf"), SynthSpec(arch="llama", seed=1))
    p2 = write_random_gguf(str(tmp_path / "b.gguf"), SynthSpec(arch="llama", seed=2))
    src = _synth_engine(p1)
    toks = list(range(10, 60))
    col = _submit(src, toks, CacheIdentity())
    run(src, [col])
    src.scheduler.slots[0].prompt_tokens = toks
    f = str(tmp_path / "slot.bin")
    assert save(src, 0, f, "")["n_saved"] > 0
    for other in (
        _synth_engine(p2),  # another model file
        _synth_engine(p1, kv_dtype=torch.float16),  # another KV dtype
        make_engine(load_gguf(p1), n_slots=1, n_ctx=1024),  # another context size
    ):
        with pytest.raises(EngineError, match="another model"):
            restore(other, 0, f, "")
    with pytest.raises(EngineError, match="API key"):
        restore(_synth_engine(p1), 0, f, "tenant-b")  # another tenant
    twin = _synth_engine(p1)
    assert restore(twin, 0, f, "")["n_restored"] > 0
    hit = _submit(twin, toks, CacheIdentity())
    run(twin, [hit])
    assert hit.final.n_cached == len(toks) - 1
    assert os.path.getsize(f) > 0
