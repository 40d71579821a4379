"""The CUDA weight layouts and kernels (Triton), run by Triton's interpreter on the CPU against
the torch reference: repacking loses nothing (gguf's own dequantizer, bit for bit), the
dequantizing GEMV (batch rows, K slices, masked edges), the dequantize kernel, the module."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("no GPU and the Triton interpreter is off", allow_module_level=True)

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize as np_dequantize  # noqa: E402

from kvserve.model.quant import cuda_pack as P  # noqa: E402
from kvserve.model.quant import triton_gemv as T  # noqa: E402
from kvserve.model.quant.build import RawTensor, fuse_groups, path_of  # noqa: E402
from kvserve.model.quant.cuda_linear import CudaQuantLinear  # noqa: E402

from .test_quant import random_blocks  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def packed(qtype: Q, n: int, k: int, seed: int = 0) -> P.Packed:
    return P.pack(torch.from_numpy(random_blocks(qtype, n, k, seed=seed)).to(DEV), qtype, k)


@pytest.mark.parametrize("qtype", list(P.FORMATS), ids=lambda q: q.name)
def test_repack_reproduces_gguf_dequantizer_exactly(qtype):
    n, k = 24, 512
    raw = random_blocks(qtype, n, k, seed=5)
    p = P.pack(torch.from_numpy(raw), qtype, k)
    ref = torch.from_numpy(np_dequantize(raw, qtype))
    assert torch.equal(P.reference(p), ref)  # equal as numbers (up to the sign of zero)
    bits = P.FORMATS[qtype][0]
    assert p.q.dtype == torch.int32 and p.q.shape == (k * bits // 32, n)  # K-major words
    assert p.nbytes * 8 / (n * k) <= bits + 1.125  # codes + scales, nothing dequantized
    assert int(P.codes(p).max()) < 2**bits


def test_word_layout_puts_one_slot_of_a_group_on_consecutive_columns():
    p = packed(Q.Q4_0, 2, 64)
    u = P.codes(p)
    w0 = int(p.q[0, 0]) & 0xFFFFFFFF  # word 0 of group 0 of row 0: columns 0-7, low nibbles 0-3
    assert [(w0 >> (4 * i)) & 0xF for i in range(8)] == [int(u[0, c]) for c in (0, 4, 1, 5, 2, 6, 3, 7)]
    w1 = int(p.q[1, 0]) & 0xFFFFFFFF  # word 1: columns 8-15
    assert [(w1 >> (8 * b)) & 0xF for b in range(4)] == [int(u[0, 8 + b]) for b in range(4)]
    p8 = packed(Q.Q8_0, 2, 64)
    w2 = int(p8.q[2, 1]) & 0xFFFFFFFF  # 8-bit: word 2 of row 1 is columns 8-11, byte order
    assert [(w2 >> (8 * b)) & 0xFF for b in range(4)] == [int(P.codes(p8)[1, 8 + b]) for b in range(4)]


# (format, rows, cols): output columns across 64-column blocks (masked edges), K slices of unequal length
CASES = [(Q.Q4_K, 80, 512), (Q.Q6_K, 72, 512), (Q.Q4_0, 33, 96), (Q.Q8_0, 17, 160), (Q.Q5_K, 20, 256),
         (Q.Q4_1, 24, 64), (Q.Q5_0, 9, 96), (Q.Q5_1, 12, 64)]
# (batch rows, config): one K slice per program; K slices summed by the reduce kernel; batch
# rows beyond a program's 4 (a second batch block); few programs (the interpreter runs each)
RUNS = [(1, None), (3, T.Config(64, 2, 1)), (9, T.Config(512, 4, 0))]


@pytest.mark.parametrize("qtype,n,k", CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_gemv_matches_the_reference(qtype, n, k):
    p = packed(qtype, n, k, seed=7)
    w = P.reference(p)
    gen = torch.Generator().manual_seed(1)
    for m, cfg in RUNS:
        x = torch.randn(m, k, generator=gen).to(DEV)
        bias = torch.randn(n, generator=gen).to(DEV)
        y = T.gemv(x, p, bias=bias, cfg=cfg)
        expect = x @ w.T + bias
        assert y.dtype == x.dtype and y.shape == (m, n)
        assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item()), (m, cfg)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_gemv_k_slices_are_summed_once(qtype):
    p = packed(qtype, 16, 1024, seed=8)
    cfg = T.Config(16, 4, 2)
    assert T.split_of(p, cfg, DEV)[0] > 1 and T.split_of(p, T.Config(16, 4, 0), DEV)[0] == 1
    x = torch.randn(2, 1024, generator=torch.Generator().manual_seed(8)).to(DEV)
    one = T.gemv(x, p, cfg=T.Config(16, 4, 0))
    first = T.gemv(x, p, cfg=cfg)
    # the slices add the same terms in another order: equal within float32 rounding of the
    # largest output (terms reach ~1e4 here), not to an absolute 1e-4
    assert torch.allclose(first, one, rtol=1e-5, atol=1e-5 * float(one.abs().max()))
    # the last slice of a call sums the partials and resets its counter: a second call (as a
    # CUDA graph replays it) gives the same bits, whichever slice finishes last
    assert int(T._counters(p, 1).abs().sum()) == 0
    assert torch.equal(T.gemv(x, p, cfg=cfg), first)


def test_gemv_writes_bf16_into_a_column_slice():
    p = packed(Q.Q4_K, 32, 256, seed=9)
    x = torch.randn(2, 256).to(DEV).to(torch.bfloat16)
    out = torch.zeros(2, 80, dtype=torch.bfloat16, device=DEV)
    T.gemv(x, p, out[:, 40:72])
    expect = x.float() @ P.reference(p).T
    assert (out[:, :40] == 0).all() and (out[:, 72:] == 0).all()
    assert torch.allclose(out[:, 40:72].float(), expect, rtol=2e-2, atol=2e-2 * expect.abs().max().item())


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_dequantize_kernel_is_exact(qtype):
    p = packed(qtype, 40, 768 if qtype != Q.Q4_1 else 96, seed=10)
    assert torch.equal(T.dequantize_t(p, dtype=torch.float32, bn=16).t(), P.reference(p))


def test_module_fuses_mixed_formats_in_member_order(monkeypatch):
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "float")  # exact (int8: test_quant_q8)
    k = 256
    specs = [(Q.Q4_K, 32), (Q.Q6_K, 16), (Q.Q4_K, 24)]  # Q4_K, Q6_K, Q4_K: segments reorder columns
    packs = [packed(q, n, k, seed=i) for i, (q, n) in enumerate(specs)]
    bias = torch.randn(72)
    mod = CudaQuantLinear(packs, bias, DEV)
    assert len(mod.segments) == 2 and mod.perm is not None
    assert sorted(p for p, _, _ in mod.summary()) == ["q4-cuda", "q8-cuda"]
    w = torch.cat([P.reference(p) for p in packs])
    for m in (3, 12):  # GEMV, then dequantize + GEMM
        x = torch.randn(m, k, device=DEV)
        expect = x @ w.T + bias.to(DEV)
        tol = 1e-4 if m <= 8 else 2e-2  # the GEMM runs on bf16 inputs
        assert torch.allclose(mod(x), expect, rtol=tol, atol=tol * expect.abs().max().item()), m


def test_cuda_paths_fuse_q4_and_q6_members():
    cuda = torch.device("cuda")
    raws = {f"blk.0.attn.{c}": RawTensor(np.zeros(1, np.uint8), q, (n, 256))
            for c, q, n in [("q", Q.Q4_K, 64), ("k", Q.Q4_K, 16), ("v", Q.Q6_K, 16)]}
    assert {path_of(t, cuda) for t in raws.values()} == {"cuda-quant"}
    assert fuse_groups(raws, cuda) == [("blk.0.attn.qkv", list(raws))]
    assert path_of(RawTensor(np.zeros(1, np.uint8), Q.Q3_K, (16, 256)), cuda) == "dense"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the loader's CUDA layout needs a GPU")
def test_cuda_quantized_model_follows_its_dense_twin(tmp_path):
    """A Q4_K_M file loaded quantized on CUDA (Q4_K and Q6_K members fused, decode steps in CUDA
    graphs) against the same file dequantized to bf16: prefill (dequantize + GEMM) and decode."""
    from kvserve.model.loader import load_gguf
    from kvserve.model.runner import ModelRunner
    from kvserve.model.synth import SynthSpec, write_random_gguf
    from kvserve.plan import Plan, SeqChunk

    spec = SynthSpec(arch="llama", qtype="Q4_K_M", n_embd=256, n_ff=512, head_dim=64, n_vocab=700)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    quant, dense = load_gguf(path, dtype=torch.bfloat16, device="cuda", weights="quant"), \
        load_gguf(path, dtype=torch.bfloat16, device="cuda", weights="dense")
    assert quant.weight_bytes < dense.weight_bytes * 0.6
    assert set(quant.summary.as_dict()) == {"q4-cuda", "q8-cuda", "dense"}  # dense: the embedding table
    qkv = quant.model.layers[0].attn.qkv
    assert isinstance(qkv, CudaQuantLinear) and len(qkv.segments) == 2
    runners = [ModelRunner(m, n_pages=8, max_batch=4) for m in (quant, dense)]
    ids = tuple(range(5, 45))
    outs = [r.run(Plan((SeqChunk(0, ids, 0, (0, 1, 2, 3), "all"),))).logits[0].float() for r in runners]
    for pos in range(40, 44):
        plan = Plan((SeqChunk(0, (7 + pos,), pos, (0, 1, 2, 3), "last"),))
        outs = [torch.cat([o, r.run(plan).logits[0].float()]) for o, r in zip(outs, runners)]
    q, d = outs
    assert (q - d).abs().max().item() <= 0.05 * d.abs().max().item()
