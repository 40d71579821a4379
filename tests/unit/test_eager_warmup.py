"""The start-up warm-up of the Triton backend's eager steps (``backends.eager_warmup``) compiles
every kernel variant a served step can need: the variants (constexprs, launch options and the
value class of each integer argument Triton specializes) launched by random eager steps through
the backend's own ``prepare`` and ``attend`` are all among those the warm-up launched.

The kernels' launches are recorded, not run, so the random steps can be of any size.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from tests.unit.test_triton_kernels import DEV  # noqa: E402  (also applies the interpreter fix)

from kvserve.model.backends import StepSeq, eager_warmup  # noqa: E402
from kvserve.model.backends.triton_kernels import cascade, decode, extend, fused_decode, rope  # noqa: E402
from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402
from kvserve.model.synth import SynthSpec, write_random_gguf  # noqa: E402

KERNELS = [(decode, "_decode_split_kernel"), (decode, "_decode_merge_kernel"), (cascade, "_shared_prefix_kernel"),
           (extend, "_extend_kernel"), (fused_decode, "_decode_fused_kernel"), (rope, "_rope_write_kernel")]


def _class(v: int) -> str:
    """Triton's specialization of an integer argument."""
    return "1" if v == 1 else "16" if v % 16 == 0 else "-"


class _Recorder:
    """Stands for a kernel: ``kernel[grid](*args, **constexprs)`` records the variant it would compile."""

    def __init__(self, name: str, kernel, seen: set) -> None:
        fn = kernel.fn
        self.name, self.seen = name, seen
        self.params = list(fn.__code__.co_varnames[: fn.__code__.co_argcount])
        dns = getattr(kernel, "do_not_specialize", None)
        if dns is None:
            dns = getattr(kernel, "kwargs", {}).get("do_not_specialize")
        self.unspecialized = set(dns or ())

    def __getitem__(self, grid):
        def launch(*args, **kw):
            ints = tuple((p, _class(a)) for p, a in zip(self.params, args)
                         if isinstance(a, int) and not isinstance(a, bool) and p not in self.unspecialized)
            self.seen.add((self.name, tuple(sorted(kw.items())), ints))
        return launch


def _recorded_backend(tmp_path, monkeypatch, n_pages: int):
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    spec = SynthSpec(arch="llama", n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_vocab=300, n_layer=1)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    runner = ModelRunner(load_gguf(path, device=DEV), n_pages=n_pages, max_batch=4)
    seen: set = set()
    for mod, name in KERNELS:
        monkeypatch.setattr(mod, name, _Recorder(name, getattr(mod, name), seen))
    return runner.backend, seen


@pytest.fixture
def backend(tmp_path, monkeypatch):
    return _recorded_backend(tmp_path, monkeypatch, 700)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_cuda_runner_warms_the_eager_steps_after_its_graphs(tmp_path, monkeypatch, caplog):
    from kvserve.model.backends.triton_backend import TritonBackend

    calls: list[bool] = []
    orig = TritonBackend.warm_eager
    def warm(self, dtype, decode_only=False):
        calls.append(decode_only)
        return orig(self, dtype, decode_only)

    monkeypatch.setattr(TritonBackend, "warm_eager", warm)
    spec = SynthSpec(arch="llama", n_embd=256, n_head=8, n_head_kv=2, head_dim=32, n_vocab=300, n_layer=1)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    with caplog.at_level("INFO", logger="kvserve.model.runner"):
        runner = ModelRunner(load_gguf(path, device="cuda", dtype=torch.bfloat16), n_pages=64, max_batch=4)
    assert calls == [runner.graphs is None] and "eager step kernels compiled or loaded" in caplog.text


def test_a_tiny_pool_gets_the_steps_it_can_have(tmp_path, monkeypatch):
    be, seen = _recorded_backend(tmp_path, monkeypatch, 2)
    assert be.warm_eager(torch.float32, decode_only=True) > 0
    assert {v[0] for v in seen} >= {"_extend_kernel", "_decode_split_kernel", "_decode_fused_kernel"}


def _random_step(rng: random.Random, be, decode_only: bool) -> list[StepSeq]:
    ps, max_pages = be.kv.page_size, be.pt.max_pages
    seqs: list[StepSeq] = []
    sid = rng.randrange(10**6)
    n_dec = rng.choice([0, 1, 2, 3, 5, 16, 40, 64, 100]) if not decode_only else rng.choice([1, 2, 4, 9, 64])
    prefix = [rng.randrange(be.kv.n_pages) for _ in range(rng.randrange(max_pages - 2))]
    for i in range(n_dec):
        length = rng.randrange(1, (max_pages - 1) * ps)
        shared = prefix[: (length - 1) // ps] if rng.random() < 0.6 else []  # some share a prefix
        own = [rng.randrange(be.kv.n_pages) for _ in range(-(-length // ps) - len(shared))]
        seqs.append(StepSeq(sid + i, length - 1, 1, tuple(shared + own)))
    for j in range(0 if decode_only else rng.choice([1, 1, 2, 3])):
        n = rng.choice([2, 5, 16, 32, 33, 64, 200, 512])
        start = rng.choice([0, 0, rng.randrange((max_pages - 40) * ps)])
        seqs.append(StepSeq(sid + 1000 + j, start, n, tuple(rng.randrange(be.kv.n_pages)
                                                            for _ in range(-(-(start + n) // ps)))))
    return seqs


def _launch(be, seqs: list[StepSeq]) -> None:
    cfg = be.cfg
    t = sum(s.n for s in seqs)
    _, step = be.prepare(seqs, [0] * t)
    q = torch.zeros((t, cfg.n_head, cfg.head_dim), dtype=torch.float32)
    kv = torch.zeros((t, cfg.n_head_kv, cfg.head_dim), dtype=torch.float32)
    step.attend(0, q, kv, kv)
    for s in seqs:
        be.pt.forget(s.seq_id)


@pytest.mark.parametrize("n_sm,mode", [(132, "auto"), (132, "1"), (8, "1"), (78, "0")])
def test_random_eager_steps_launch_only_warmed_variants(backend, n_sm, mode):
    be, seen = backend
    be.n_sm, be.cascade_mode = n_sm, mode
    be.cascade_graphs = mode == "1" or (mode != "0" and be.cascade_auto_ok)
    steps = be.warm_eager(torch.float32)
    assert steps > 10 and be.pt._rows == {} and be.n_cascade_steps == 0  # nothing left behind
    warmed = set(seen)
    assert {v[0] for v in warmed} >= {"_extend_kernel", "_decode_split_kernel", "_decode_merge_kernel"}
    if mode == "1":
        assert "_shared_prefix_kernel" in {v[0] for v in warmed}
    rng = random.Random(n_sm)
    eager = 0
    for _ in range(300):
        seqs = _random_step(rng, be, decode_only=rng.random() < 0.3)
        if all(s.n == 1 for s in seqs) and be.graph_mode(seqs)[0] != "eager":
            continue  # a graph replays it
        seen.clear()
        _launch(be, seqs)
        eager += 1
        assert seen <= warmed, f"not warmed: {seen - warmed} (step of {[(s.start, s.n) for s in seqs]})"
    assert eager > 150


def test_without_graphs_decode_only_steps_are_warmed_too(backend):
    be, seen = backend
    be.n_sm = 132
    be.warm_eager(torch.float32, decode_only=True)
    warmed = set(seen)
    rng = random.Random(1)
    for _ in range(150):
        seen.clear()
        seqs = _random_step(rng, be, decode_only=True)
        _launch(be, seqs)
        assert seen <= warmed, f"not warmed: {seen - warmed}"


@pytest.mark.slow
def test_warmup_writes_only_the_scratch_page(tmp_path, monkeypatch):
    """Run for real (the interpreter on the CPU): every page but the scratch page keeps its bytes."""
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "triton")
    spec = SynthSpec(arch="llama", n_embd=64, n_head=4, n_head_kv=4, head_dim=16, n_vocab=300, n_layer=1)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    runner = ModelRunner(load_gguf(path, device=DEV), n_pages=40, max_batch=4)
    monkeypatch.setattr(eager_warmup, "SPLIT_UNITS", (1, 2))  # every kind of step, fewer of them
    monkeypatch.setattr(eager_warmup, "SHARED_UNITS", (1,))
    be = runner.backend
    for c in (*be.kv.k, *be.kv.v):
        c.normal_()
    before = [c.clone() for c in (*be.kv.k, *be.kv.v)]
    ps, scratch = be.kv.page_size, be.kv.scratch_page
    assert be.warm_eager(torch.float32) > 0
    for b, c in zip(before, (*be.kv.k, *be.kv.v)):
        rows = torch.ones(c.shape[0], dtype=torch.bool)
        rows[scratch * ps:(scratch + 1) * ps] = False
        assert torch.equal(b[rows], c[rows])
