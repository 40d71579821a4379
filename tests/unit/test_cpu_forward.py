"""``cpu_forward.CpuForward`` (the native CPU forward pass as bare native calls) gives the bits of
the modules it stands for: every architecture's block, prefill, decode and batched decode steps,
float16 and float32 KV, Q/K/V biases, QK-norm, sliding windows, mixed weight formats."""

from __future__ import annotations

import pytest
import torch

from kvserve.model import attn_native, ops_cpu
from kvserve.model.cpu_forward import CpuForward
from kvserve.model.loader import load_gguf
from kvserve.model.quant import native
from kvserve.model.runner import ModelRunner
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.plan import Plan, SeqChunk

# the native forward runs where the native attention does (attn_native.supports: a CPU with AVX-512)
pytestmark = pytest.mark.skipif(not (ops_cpu.ENABLED and attn_native.supports(torch.float32, torch.device("cpu"))
                                     and native.available()), reason="native kernels not built or no AVX-512")


def _steps(runner: ModelRunner, toks: list[int]) -> list[torch.Tensor]:
    """A 20-token prefill, a prefill chunk of 30 after it, then decode steps of one sequence and
    of two (a second sequence with its own pages)."""
    out = [runner.run(Plan((SeqChunk(0, tuple(toks[:20]), 0, (0, 1, 2, 3), "all"),))).logits[0]]
    out.append(runner.run(Plan((SeqChunk(0, tuple(toks[20:50]), 20, (0, 1, 2, 3), "all"),))).logits[0])
    runner.run(Plan((SeqChunk(1, tuple(toks[:7]), 0, (5, 6), "none"),)))
    for p in range(50, 56):
        out.append(runner.run(Plan((SeqChunk(0, (toks[p],), p, (0, 1, 2, 3), "last"),))).logits[0])
        two = runner.run(Plan((SeqChunk(0, (toks[p],), p, (0, 1, 2, 3), "none"),
                               SeqChunk(1, (toks[p],), 7 + p - 50, (5, 6), "last"))))
        out.append(two.logits[1])
    return out


@pytest.mark.parametrize("arch,qtype", [("llama", "Q4_0"), ("qwen2", "Q8_0"), ("qwen3", "Q4_K"),
                                        ("gemma3", "Q8_0"), ("qwen2", "Q4_K_M")])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
def test_cpu_forward_is_the_modules_bit_for_bit(arch, qtype, kv_dtype, tmp_path, monkeypatch):
    spec = SynthSpec(arch=arch, n_layer=3, head_dim=64, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                     sliding_window=16 if arch == "gemma3" else 0, n_vocab=300, qtype=qtype)
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    toks = torch.randint(0, spec.n_vocab, (60,), generator=torch.Generator().manual_seed(2)).tolist()
    loaded = load_gguf(path, device=torch.device("cpu"))
    assert isinstance(CpuForward.build(loaded.model), CpuForward)
    calls = []
    orig = CpuForward.forward
    monkeypatch.setattr(CpuForward, "forward",
                        lambda self, x, step: calls.append(x.shape[0]) or orig(self, x, step))
    fast = _steps(ModelRunner(loaded, n_pages=8, page_size=16, kv_dtype=kv_dtype), toks)
    assert calls == [20, 30, 7] + [1, 2] * 6  # every step ran the native forward
    loaded.model._cpu_forward = False  # the modules
    ref = _steps(ModelRunner(loaded, n_pages=8, page_size=16, kv_dtype=kv_dtype), toks)
    assert len(calls) == 15
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


def test_cpu_forward_only_where_it_applies(tmp_path, monkeypatch):
    path = write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec(arch="llama", n_layer=1, n_vocab=300))
    assert CpuForward.build(load_gguf(path, weights="dense").model) is None  # dense weights: the modules
    monkeypatch.setattr(ops_cpu, "ENABLED", False)
    assert CpuForward.build(load_gguf(path).model) is None


def test_a_second_forward_meanwhile_uses_its_own_buffers(tmp_path):
    """While one forward holds the kept buffers (another thread's step), a forward allocates its
    own and gives the same logits."""
    spec = SynthSpec(arch="llama", n_layer=2, head_dim=32, n_embd=128, n_head=4, n_head_kv=2, n_vocab=300,
                     qtype="Q8_0")
    loaded = load_gguf(write_random_gguf(str(tmp_path / "m.gguf"), spec), device=torch.device("cpu"))
    toks = tuple(range(10, 30))
    want = _steps(ModelRunner(loaded, n_pages=8, page_size=16), list(toks) * 3)
    fast = loaded.model._cpu_forward
    kept = fast._bufs
    assert fast._held.acquire(blocking=False)
    try:
        got = _steps(ModelRunner(loaded, n_pages=8, page_size=16), list(toks) * 3)
    finally:
        fast._held.release()
    assert fast._bufs is kept
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_mlp_row_blocks_give_the_same_bits(arch, tmp_path, monkeypatch):
    """The MLP in blocks of 16 rows (prefills of 20 and 30 rows: a full block and a partial one)
    gives the bits of the modules, and the kept buffers grow to the largest step, reused after."""
    from kvserve.model import cpu_forward

    monkeypatch.setattr(cpu_forward, "_MLP_ROWS", 16)
    spec = SynthSpec(arch=arch, n_layer=2, head_dim=64, n_embd=256, n_head=4, n_head_kv=2, n_ff=512,
                     sliding_window=16 if arch == "gemma3" else 0, n_vocab=300, qtype="Q4_K")
    loaded = load_gguf(write_random_gguf(str(tmp_path / "m.gguf"), spec), device=torch.device("cpu"))
    toks = torch.randint(0, spec.n_vocab, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    fast = _steps(ModelRunner(loaded, n_pages=8, page_size=16), toks)
    kept = loaded.model._cpu_forward._bufs
    assert kept[0] == 32 and kept[1][-2].shape == (16, 2 * 512)  # 30 rows → 32; gate/up: one block
    loaded.model._cpu_forward = False
    ref = _steps(ModelRunner(loaded, n_pages=8, page_size=16), toks)
    for i, (a, b) in enumerate(zip(fast, ref)):
        assert torch.equal(a, b), (i, (a - b).abs().max().item())


def test_a_step_larger_than_the_kept_rows_uses_its_own_buffers(tmp_path, monkeypatch):
    from kvserve.model import cpu_forward

    monkeypatch.setattr(cpu_forward, "_KEEP_ROWS", 16)
    spec = SynthSpec(arch="llama", n_layer=2, head_dim=32, n_embd=128, n_head=4, n_head_kv=2, n_vocab=300,
                     qtype="Q8_0")
    loaded = load_gguf(write_random_gguf(str(tmp_path / "m.gguf"), spec), device=torch.device("cpu"))
    toks = torch.randint(0, spec.n_vocab, (60,), generator=torch.Generator().manual_seed(4)).tolist()
    fast = _steps(ModelRunner(loaded, n_pages=8, page_size=16), toks)
    assert loaded.model._cpu_forward._bufs[0] == 16  # the 7-row prefill's, kept; 20 and 30 rows: their own
    loaded.model._cpu_forward = False
    ref = _steps(ModelRunner(loaded, n_pages=8, page_size=16), toks)
    assert all(torch.equal(a, b) for a, b in zip(fast, ref))
