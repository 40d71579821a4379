"""The Triton backend through the whole runner against the torch backend (the reference):
prefill, a chunk over a cached prefix, mixed prefill+decode steps, decode across page
boundaries, sliding windows, norm/neox rope and QK-norm. Without CUDA the kernels run under
Triton's interpreter (see test_triton_kernels); without triton the module is skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.unit.test_triton_kernels import DEV  # noqa: E402  (also applies the interpreter fix)

from kvserve.plan import KVMove, Plan, SeqChunk  # noqa: E402
from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.backends import StepSeq  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402
from kvserve.model.synth import SynthSpec, write_random_gguf  # noqa: E402


def _plans(n_vocab: int) -> list[Plan]:
    g = torch.Generator().manual_seed(3)
    toks = torch.randint(0, n_vocab, (200,), generator=g).tolist()
    a, b = (0, 1, 2, 3, 4, 5), (6, 7, 8, 9, 10, 11)
    plans = [
        Plan((SeqChunk(0, tuple(toks[:40]), 0, a, "all"),)),
        # seq 1 adopts seq 0's first 32 positions (copied), then runs 12 more beside a decode of seq 0
        Plan((SeqChunk(1, tuple(toks[32:44]), 32, b, "all"), SeqChunk(0, (toks[40],), 40, a, "last")),
             (KVMove(a, 0, b, 0, 32),)),
    ]
    for i in range(10):  # both sequences decode across the page boundary at 48
        plans.append(Plan((SeqChunk(0, (toks[50 + i],), 41 + i, a, "last"),
                           SeqChunk(1, (toks[70 + i],), 44 + i, b, "last"))))
    plans.append(Plan((SeqChunk(0, tuple(toks[100:117]), 51, a, "last"),)))
    return plans


@pytest.mark.parametrize("arch,window,fused", [("llama", 0, "0"), ("qwen3", 0, "0"), ("gemma3", 16, "0"),
                                               ("gemma3", 16, "1"), ("llama", 0, "merge")])
def test_triton_backend_matches_torch(arch, window, fused, tmp_path, monkeypatch):
    """Also with the one-launch decode kernels (KVSERVE_DECODE_FUSED), decode-only steps taking them."""
    monkeypatch.setenv("KVSERVE_DECODE_FUSED", fused)
    spec = SynthSpec(arch=arch, head_dim=32, n_embd=128, sliding_window=window, n_vocab=300)
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
    ref = ModelRunner(load_gguf(path, device=DEV), n_pages=16, max_batch=4)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    fast = ModelRunner(load_gguf(path, device=DEV), n_pages=16, max_batch=4)
    assert fast.backend.name == "triton" and ref.backend.name == "torch"
    tol = 2e-2 if DEV.type == "cuda" else 1e-4
    for plan in _plans(spec.n_vocab):
        want, got = ref.run(plan).logits, fast.run(plan).logits
        assert set(want) == set(got)
        for sid in want:
            w, o = want[sid], got[sid]
            assert w.shape == o.shape
            assert ((o - w).abs().max() / w.abs().max()).item() < tol, (arch, sid)


@pytest.mark.parametrize("fused", ["0", "1"])
def test_graph_step_inputs_match_eager(fused, tmp_path, monkeypatch):
    """The static-buffer decode step that CUDA graphs capture, run eagerly: padded rows (scratch
    row and page) must not change the real rows' logits, page-table updates must arrive."""
    monkeypatch.setenv("KVSERVE_DECODE_FUSED", fused)
    spec = SynthSpec(arch="llama", head_dim=32, n_embd=128, n_vocab=300)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("KVSERVE_CUDA_GRAPHS", "0")
    runner = ModelRunner(load_gguf(path, device=DEV), n_pages=16, max_batch=4)
    be = runner.backend
    be.init_graphs(8)
    toks = list(range(10, 60))
    a, b = (0, 1, 2, 3), (5, 6, 7, 8)
    runner.run(Plan((SeqChunk(0, tuple(toks[:30]), 0, a, "none"), SeqChunk(1, tuple(toks[:20]), 0, b, "none"))))
    # seq 0 crosses the page boundary at 32 at step 2, seq 1 at step 12: a new page id reaches the
    # device for each row
    for i in range(14):
        chunks = (SeqChunk(0, (toks[30 + i],), 30 + i, a, "last"), SeqChunk(1, (toks[20 + i],), 20 + i, b, "last"))
        bucket = 4 if i % 2 else 2
        seqs = [StepSeq(c.seq_id, c.start_pos, 1, c.page_table) for c in chunks]
        be.load_graph_inputs(bucket, seqs, [c.tokens[0] for c in chunks])
        ids, step = be.graph_step(bucket)
        got = runner.model.logits(runner.model(ids, step))[:2]
        # the same step through prepare(), on a fresh runner replaying the same history
        if i == 0:
            monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
            ref = ModelRunner(load_gguf(path, device=DEV), n_pages=16)
            ref.run(Plan((SeqChunk(0, tuple(toks[:30]), 0, a, "none"), SeqChunk(1, tuple(toks[:20]), 0, b, "none"))))
        want = ref.run(Plan(chunks)).logits
        for j, c in enumerate(chunks):
            w = want[c.seq_id][0]
            assert ((got[j] - w).abs().max() / w.abs().max()).item() < 1e-4


@pytest.mark.parametrize("arch,window", [("llama", 0), ("gemma3", 24)])
def test_triton_cascade_decode_matches_torch(arch, window, tmp_path, monkeypatch):
    """Three sequences whose page tables share a 64-token prefix decode side by side (beside one
    that shares nothing): the Triton backend reads the prefix once per layer for the group, as
    the torch backend does, with the same logits; ``KVSERVE_CASCADE=0`` gives them too."""
    spec = SynthSpec(arch=arch, head_dim=32, n_embd=128, sliding_window=window, n_vocab=300)
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    g = torch.Generator().manual_seed(5)
    toks = torch.randint(0, spec.n_vocab, (400,), generator=g).tolist()
    prefix = (0, 1, 2, 3)
    tables = {0: prefix + (4, 5), 1: prefix + (6, 7), 2: prefix + (8, 9), 3: (10, 11, 12)}
    setup = [Plan((SeqChunk(0, tuple(toks[:70]), 0, tables[0], "none"),)),
             Plan((SeqChunk(1, tuple(toks[100:110]), 64, tables[1], "none"),
                   SeqChunk(2, tuple(toks[200:203]), 64, tables[2], "none"),
                   SeqChunk(3, tuple(toks[300:330]), 0, tables[3], "none")))]
    lens = {0: 70, 1: 74, 2: 67, 3: 30}
    steps = []
    for i in range(12):  # seq 2 crosses into its second own page, seq 1 decodes beside a prefill
        chunks = [SeqChunk(s, (toks[380 + i],), lens[s] + i, tables[s], "last") for s in (0, 1, 2, 3)]
        steps.append(Plan(tuple(chunks)))
    runners = {}
    for name, mode in (("torch", "auto"), ("triton", "1"), ("plain", "0")):
        monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch" if name == "torch" else "triton")
        monkeypatch.setenv("KVSERVE_CASCADE", mode)
        runners[name] = ModelRunner(load_gguf(path, device=DEV), n_pages=16, max_batch=4)
    tol = 2e-2 if DEV.type == "cuda" else 1e-4
    for plan in setup + steps:
        outs = {name: r.run(plan).logits for name, r in runners.items()}
        for sid, w in outs["torch"].items():
            for name in ("triton", "plain"):
                o = outs[name][sid]
                assert ((o - w).abs().max() / w.abs().max()).item() < tol, (name, sid)
    assert runners["triton"].backend.n_cascade_steps == len(steps)
    assert runners["plain"].backend.n_cascade_steps == 0
    mode, groups = runners["triton"].backend.graph_mode([StepSeq(c.seq_id, c.start_pos, 1, c.page_table)
                                                         for c in steps[0].chunks])
    assert mode == "cascade" and groups == [([0, 1, 2], 64)]


def test_cascade_graph_step_inputs_match_torch(tmp_path, monkeypatch):
    """The static-buffer cascade decode step a CUDA graph captures, run eagerly: two groups and
    a sequence outside them in a padded bucket, the groups changing from step to step, give the
    torch backend's logits."""
    spec = SynthSpec(arch="llama", head_dim=32, n_embd=128, n_vocab=300)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("KVSERVE_CUDA_GRAPHS", "0")
    monkeypatch.setenv("KVSERVE_CASCADE", "1")  # a tiny model saves too few bytes for the default rule
    runner = ModelRunner(load_gguf(path, device=DEV), n_pages=32, max_batch=8)
    be = runner.backend
    be.init_graphs(8)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
    ref = ModelRunner(load_gguf(path, device=DEV), n_pages=32)
    toks = list(range(10, 200))
    pa, pb = (0, 1, 2, 3), (4, 5, 6, 7)
    tables = {0: pa + (8, 9), 1: pa + (10, 11), 2: pb + (12, 13), 3: pb + (14, 15), 4: pb + (16, 17),
              5: (18, 19, 20, 21, 22)}
    setup = [Plan((SeqChunk(0, tuple(toks[:66]), 0, tables[0], "none"), SeqChunk(2, tuple(toks[70:136]), 0,
                                                                               tables[2], "none"))),
             Plan(tuple(SeqChunk(s, tuple(toks[s * 7 : s * 7 + 3]), 64, tables[s], "none") for s in (1, 3, 4))
                  + (SeqChunk(5, tuple(toks[:66]), 0, tables[5], "none"),))]
    for r in (runner, ref):
        for plan in setup:
            r.run(plan)
    lens = {0: 66, 1: 67, 2: 66, 3: 67, 4: 67, 5: 66}
    for i in range(6):
        members = (0, 1, 2, 3, 4, 5) if i % 2 == 0 else (5, 2, 0, 3)  # two groups, then one (2 and 3)
        chunks = tuple(SeqChunk(s, (toks[150 + i],), lens[s], tables[s], "last") for s in members)
        seqs = [StepSeq(c.seq_id, c.start_pos, 1, c.page_table) for c in chunks]
        mode, groups = be.graph_mode(seqs)
        assert mode == "cascade" and groups and len(groups) == (2 if i % 2 == 0 else 1)
        be.load_graph_inputs(8, seqs, [c.tokens[0] for c in chunks], groups)
        ids, step = be.graph_step(8, cascade=True)
        got = runner.model.logits(runner.model(ids, step))[: len(chunks)]
        want = ref.run(Plan(chunks)).logits
        for j, c in enumerate(chunks):
            w = want[c.seq_id][0]
            assert ((got[j] - w).abs().max() / w.abs().max()).item() < (2e-2 if DEV.type == "cuda" else 1e-4)
        for s in members:
            lens[s] += 1


def test_decode_attention_hands_the_quantized_output_projection_its_input(tmp_path, monkeypatch):
    """Decode steps of the one-launch kernel write the output projection's int8 input in its merge
    (``KVSERVE_DECODE_QUANT_OUT``, on by default): the projection then skips its own quantizer, and
    the logits are those of the model where it quantizes (the same codes and scales; the sums
    within float32 rounding of their order)."""
    from gguf import GGMLQuantizationType as Q

    from kvserve.model.quant import cuda_linear
    from kvserve.model.quant import triton_q8 as Q8
    from kvserve.model.quant.cuda_linear import CudaQuantLinear
    from tests.unit.test_quant_triton import packed

    monkeypatch.setattr(cuda_linear, "ACTIVATIONS", "int8")
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    monkeypatch.setenv("KVSERVE_DECODE_FUSED", "1")
    monkeypatch.setenv("KVSERVE_CUDA_GRAPHS", "0")  # every step through the modules (counted below)
    spec = SynthSpec(arch="llama", head_dim=64, n_embd=256, n_head=4, n_head_kv=2, n_vocab=300)  # Q4_K: K of 256
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    calls = {"sink": 0, "quantize_x": 0}
    real_fq, real_qx = CudaQuantLinear.forward_quantized, Q8.quantize_x
    monkeypatch.setattr(CudaQuantLinear, "forward_quantized",
                        lambda self, *a: calls.__setitem__("sink", calls["sink"] + 1) or real_fq(self, *a))
    monkeypatch.setattr(Q8, "quantize_x", lambda *a, **kw: calls.__setitem__("quantize_x", calls["quantize_x"] + 1)
                        or real_qx(*a, **kw))
    runners = []
    for flag in ("1", "0"):
        monkeypatch.setenv("KVSERVE_DECODE_QUANT_OUT", flag)
        m = load_gguf(path, device=DEV)
        for i, layer in enumerate(m.model.layers):  # a quantized output projection (Q4_K) in every layer
            layer.attn.o = CudaQuantLinear([packed(Q.Q4_K, spec.n_embd, spec.n_embd, seed=i)], None, DEV)
        runners.append(ModelRunner(m, n_pages=16, max_batch=4))
    n_layer = len(m.model.layers)
    for plan in _plans(spec.n_vocab)[:5]:  # a prefill, a mixed step, decode steps
        decode = all(len(c.tokens) == 1 for c in plan.chunks)
        before = dict(calls)
        got = runners[0].run(plan).logits
        assert calls["sink"] - before["sink"] == (n_layer if decode else 0)
        if decode:
            assert calls["quantize_x"] == before["quantize_x"]
        before = dict(calls)
        want = runners[1].run(plan).logits  # the projection quantizes its input itself
        assert calls["sink"] == before["sink"]
        if decode:
            assert calls["quantize_x"] - before["quantize_x"] == n_layer
        for sid in want:
            w, o = want[sid], got[sid]
            assert ((o - w).abs().max() / w.abs().max()).item() < 1e-5, sid
