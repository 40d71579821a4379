"""The torch backend's SDPA path (the native attention kernel off) for one sequence decoding one
token (``TorchBackend._prepare_one``, ``attention.one_query_attention``) against its generic path
(``build_meta`` + ``paged_attention``): consecutive and scattered pages, float16 and float32 KV, float64 and
float32 attention, GQA, QK-norm and sliding windows (past the window the generic path runs).
"""

from __future__ import annotations

import pytest
import torch

from kvserve.model import ops_cpu
from kvserve.model.attention import SeqKeys
from kvserve.model.backends import torch_ref
from kvserve.model.loader import load_gguf
from kvserve.model.runner import ModelRunner
from kvserve.model.synth import SynthSpec, write_random_gguf
from kvserve.plan import Plan, SeqChunk


def test_seq_keys_read_matches_row_gather():
    ps = 4
    cache = torch.randn(40, 2, 3)
    for table, n in [((2, 3, 4), 10), ((5, 1, 7), 9), ((3,), 2), ((6, 7, 9), 12)]:
        keys = SeqKeys.of(table, n, ps, cache.device)
        n_pages = -(-n // ps)
        assert (keys.pages is None) == (table[:n_pages] == tuple(range(table[0], table[0] + n_pages)))
        rows = torch.tensor([table[p // ps] * ps + p % ps for p in range(n)])
        assert torch.equal(keys.read(cache), cache.index_select(0, rows))
        both = torch.stack([cache, -cache])  # K and V side by side, as the KV pool holds them
        assert torch.equal(keys.read(both), both.index_select(1, rows))


def _decode_logits(
    runner: ModelRunner, toks: list[int], table: tuple[int, ...], n_prompt: int
) -> list[torch.Tensor]:
    out = [runner.run(Plan((SeqChunk(0, tuple(toks[:n_prompt]), 0, table, "last"),))).logits[0]]
    for p in range(n_prompt, len(toks)):
        out.append(runner.run(Plan((SeqChunk(0, (toks[p],), p, table, "last"),))).logits[0])
    return out


@pytest.mark.parametrize("arch,window", [("llama", 0), ("qwen3", 0), ("gemma3", 16)])
@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("wide", [True, False])
def test_one_sequence_decode_matches_generic_path(arch, window, kv_dtype, wide, tmp_path, monkeypatch):
    spec = SynthSpec(arch=arch, n_layer=2, head_dim=32, n_embd=128, n_head=4, n_head_kv=2,
                     sliding_window=window, n_vocab=300)
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
    if not wide:
        monkeypatch.setattr(torch_ref, "WIDE_MAX_ROWS", 0)
    loaded = load_gguf(path, device=torch.device("cpu"))
    fast = ModelRunner(loaded, n_pages=12, page_size=8, kv_dtype=kv_dtype)
    ref = ModelRunner(loaded, n_pages=12, page_size=8, kv_dtype=kv_dtype)
    fast.backend.native = ref.backend.native = False  # the torch path (test_attn_native.py: the kernel)
    ref.backend.min_window = 1  # every single-token step takes the generic path
    toks = torch.randint(0, spec.n_vocab, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    seen_fast = []
    orig = torch_ref.TorchBackend._prepare_one
    monkeypatch.setattr(torch_ref.TorchBackend, "_prepare_one",
                        lambda self, *a: seen_fast.append(self is fast.backend) or orig(self, *a))
    for table in [(0, 1, 2, 3, 4), (9, 2, 6, 3, 11)]:  # consecutive pages (read as a view), scattered
        seen_fast.clear()
        got = _decode_logits(fast, toks, table, 5)
        assert not any(seen_fast[i] is False for i in range(len(seen_fast)))
        n_fast = len(seen_fast)
        want = _decode_logits(ref, toks, table, 5)
        assert n_fast == (35 if window == 0 else window - 5), n_fast
        for i, (g, w) in enumerate(zip(got, want)):
            if wide:
                assert torch.equal(g, w), (table, i, (g - w).abs().max().item())
            else:  # float32 attention differs by ulps between the paths, and the random model
                # grows them (to ~4e-5 in these logits of ~1); the native ops' GELU (ggml's f16
                # table) turns an ulp of its input into an f16 step now and then
                tol = 5e-3 if arch == "gemma3" and ops_cpu.ENABLED else 1e-4
                torch.testing.assert_close(g, w, rtol=1e-5, atol=tol)


def test_rms_norm_is_f_rms_norm_bit_for_bit(monkeypatch):
    """``layers.RMSNorm``'s torch code on the CPU (the native ops off) runs F.rms_norm's
    arithmetic in fewer calls: the same bits (row lengths, eps, one row or many, with the
    residual add before it)."""
    import torch.nn.functional as F

    from kvserve.model.layers import RMSNorm

    monkeypatch.setattr(ops_cpu, "ENABLED", False)

    g = torch.Generator().manual_seed(0)
    for n, eps in [(576, 1e-5), (896, 1e-6), (64, 1e-6), (640, 1e-8)]:
        norm = RMSNorm(n, eps)
        norm.weight.data = torch.rand(n, generator=g) + 0.5
        for t in (1, 3, 64):
            x, r = torch.randn(t, n, generator=g) * 3, torch.randn(t, n, generator=g)
            out, s = norm(x, r)
            assert torch.equal(s, x + r)
            assert torch.equal(out, F.rms_norm(x + r, (n,), norm.weight, eps))
            x = torch.randn(t, 4, n, generator=g) * 1e-3  # eps matters here
            assert torch.equal(norm(x), F.rms_norm(x, (n,), norm.weight, eps))


def test_without_the_attention_kernel_the_backend_runs_sdpa(tmp_path, monkeypatch):
    """No extension (no compiler at install) or KVSERVE_NATIVE_ATTN=0: the CPU backend takes the
    torch path, and its logits are the same either way."""
    from kvserve.model import attn_native

    spec = SynthSpec(arch="llama", n_layer=2, head_dim=32, n_embd=128, n_head=4, n_head_kv=2, n_vocab=300)
    loaded = load_gguf(write_random_gguf(str(tmp_path / "m.gguf"), spec), device=torch.device("cpu"))
    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
    plan = Plan((SeqChunk(0, tuple(range(3, 15)), 0, (0, 1), "all"),))
    outs = []
    for how in ("unbuilt", "env"):
        with monkeypatch.context() as m:
            if how == "unbuilt":
                m.setattr(attn_native, "_attn", None)
            else:
                m.setenv("KVSERVE_NATIVE_ATTN", "0")
            runner = ModelRunner(loaded, n_pages=4, page_size=8, kv_dtype=torch.float16)
            assert not runner.backend.native
            outs.append(runner.run(plan).logits[0])
    assert torch.equal(outs[0], outs[1])
