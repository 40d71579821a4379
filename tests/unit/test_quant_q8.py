"""The int8-activation GEMV (``triton_q8``) under Triton's interpreter on the CPU (compiled on a
GPU): activations quantized as the torch definition does, the GEMV equal to its torch
reference (exact integer dot products) for every layout, batch rows, K slices and masked
edges, and within int8 rounding of the float32 GEMV."""

from __future__ import annotations

import pytest
import torch

# the interpreter switch, the skips without a GPU or interpreter, the device and the packer
from .test_quant_triton import DEV, packed

from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import cuda_pack as P  # noqa: E402
from kvserve.model.quant import triton_gemv as T  # noqa: E402
from kvserve.model.quant import triton_q8 as Q8  # noqa: E402
from kvserve.model.quant.cuda_linear import CudaQuantLinear  # noqa: E402


def test_quantize_x_matches_the_reference():
    gen = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 544, generator=gen) * torch.logspace(-3, 2, 544)).to(DEV).to(torch.bfloat16)
    x[1, 32:64] = 0  # an all-zero block: scale 0, codes 0
    got, ref = Q8.quantize_x(x), Q8.quantize_x_reference(x)
    codes = got.q.view(torch.int8).view(3, 544).int()
    expect = ref.q.view(torch.int8).view(3, 544).int()
    assert codes.abs().max() <= 127 and (codes[1, 32:64] == 0).all() and (got.d[1, 1] == 0)
    # the GPU may round a tie the other way: at most one step, rarely
    assert (codes - expect).abs().max() <= 1 and (codes != expect).float().mean() < 1e-3
    assert torch.allclose(got.d, ref.d, rtol=1e-6, atol=0)
    assert torch.allclose(got.s, ref.s, rtol=1e-5, atol=1e-6 * float(ref.s.abs().max()))


CASES = [(Q.Q4_K, 80, 512), (Q.Q6_K, 72, 512), (Q.Q4_0, 33, 96), (Q.Q8_0, 17, 160), (Q.Q5_K, 20, 256),
         (Q.Q4_1, 24, 64), (Q.Q5_0, 9, 96), (Q.Q5_1, 12, 64)]
RUNS = [(1, None), (3, T.Config(64, 2, 1)), (9, T.Config(512, 4, 0))]


@pytest.mark.parametrize("qtype,n,k", CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_gemv_equals_its_reference(qtype, n, k):
    p = packed(qtype, n, k, seed=7)
    gen = torch.Generator().manual_seed(1)
    for m, cfg in RUNS:
        x = torch.randn(m, k, generator=gen).to(DEV)
        bias = torch.randn(n, generator=gen).to(DEV)
        xq = Q8.quantize_x(x)
        y = Q8.gemv(xq, p, torch.empty(m, n, device=DEV), bias=bias, cfg=cfg)
        expect = Q8.reference(xq, p) + bias
        assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item()), (m, cfg)
        # against float32 activations: apart by at most the rounding of x to int8 (half a step
        # of its block's scale per element), weighted by |w|
        w = P.reference(p)
        exact = x @ w.T + bias
        bound = (xq.d.repeat_interleave(32, dim=1) / 2) @ w.abs().T
        assert ((y - exact).abs() <= bound * 1.001 + 1e-4 * exact.abs().max()).all(), (m, cfg)


def test_split_gemv_resets_its_counters():
    p = packed(Q.Q6_K, 16, 1024, seed=8)
    cfg = T.Config(16, 4, 2)
    assert T.split_of(p, cfg, DEV)[0] > 1
    xq = Q8.quantize_x(torch.randn(2, 1024, generator=torch.Generator().manual_seed(4)).to(DEV))
    expect = Q8.reference(xq, p)
    # the terms reach ~1e4 against outputs down to ~1: one K slice and several sum them in
    # another order (and the GPU fuses other multiply-adds), so each is held to the exact
    # reference within float32 rounding of the largest output, not to the other
    tol = 1e-5 * float(expect.abs().max())
    one = Q8.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=T.Config(16, 4, 0))
    first = Q8.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=cfg)
    for name, y in (("one slice", one), ("split", first)):
        err = float((y - expect).abs().max())
        assert err <= tol, (name, err, tol)
    # the last slice of a call sums the partials and resets its counter: a second call (as a
    # CUDA graph replays it) gives the same bits, whichever slice finishes last
    assert int(T._counters(p, 1).abs().sum()) == 0
    assert torch.equal(Q8.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=cfg), first)


def test_split_gemv_counters_are_sized_for_every_decode_batch_up_front():
    """Counters never replaced between decode batch sizes (1-8 rows) and column blocks of 16:
    graphs captured at one batch size keep pointing at live counters. Two column blocks and one
    Q4_K super-block of K (split in slices) are enough: the interpreter's time grows with both."""
    n, k = 32, 256
    p = packed(Q.Q4_K, n, k, seed=2)
    cfg = T.Config(16, 1, 4)
    assert T.split_of(p, cfg, DEV)[0] > 1  # K slices: the counters are used
    cnt = T._counters(p, 1)
    for m in (1, 4, 8):
        xq = Q8.quantize_x(torch.randn(m, k).to(DEV))
        Q8.gemv(xq, p, torch.empty(m, n, device=DEV), cfg=cfg)
        assert T._counters(p, 1) is cnt
    assert cnt.numel() >= 2 * (n // 16) and int(cnt.abs().sum()) == 0


def test_module_runs_int8_activations_when_asked(monkeypatch):
    k = 256
    packs = [packed(q, n, k, seed=i) for i, (q, n) in enumerate([(Q.Q4_K, 32), (Q.Q6_K, 16)])]
    mod = CudaQuantLinear(packs, None, DEV)
    x = torch.randn(2, k, device=DEV)
    w = torch.cat([P.reference(p) for p in packs])
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "int8")
    xq = Q8.quantize_x(x)
    expect = torch.cat([Q8.reference(xq, p) for p in packs], dim=1)
    y8 = mod(x)
    assert torch.allclose(y8, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item())
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "float")
    y = mod(x)
    assert torch.allclose(y, x @ w.T, rtol=1e-4, atol=1e-4 * y.abs().max().item()) and not torch.equal(y, y8)


def _codes_close(got: "Q8.QuantX", ref: "Q8.QuantX", m: int, k: int) -> None:
    a = got.q.view(torch.int8).view(m, k).int()
    b = ref.q.view(torch.int8).view(m, k).int()
    # the fused kernels' float32 arithmetic may round a code the other way: one step, rarely
    assert (a - b).abs().max() <= 1 and (a != b).float().mean() < 2e-3
    assert torch.allclose(got.d, ref.d, rtol=1e-5, atol=0)
    assert torch.allclose(got.s, ref.s, rtol=1e-4, atol=1e-5 * float(ref.s.abs().max()))


@pytest.mark.parametrize("m,k", [(1, 512), (3, 96)])
def test_norm_quantize_x_equals_norm_then_quantize(m, k):
    gen = torch.Generator().manual_seed(m)
    x = (torch.randn(m, k, generator=gen) * 4).to(DEV)
    r = torch.randn(m, k, generator=gen).to(DEV)
    w = (torch.rand(k, generator=gen) + 0.5).to(DEV)
    xq, s = Q8.norm_quantize_x(x, r, w, 1e-6)
    assert torch.equal(s, x + r)
    h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    _codes_close(xq, Q8.quantize_x_reference(h), m, k)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_act_quantize_x_equals_act_mul_then_quantize(act):
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(9)
    m, n_ff = 2, 2080  # two column blocks, the second partly masked
    gu = (torch.randn(m, 2 * n_ff, generator=gen) * 2).to(DEV)
    xq = Q8.act_quantize_x(gu, n_ff, act)
    g = gu[:, :n_ff]
    a = F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")
    _codes_close(xq, Q8.quantize_x_reference(a * gu[:, n_ff:]), m, n_ff)


def test_module_takes_its_quantized_input_from_the_norm_and_act_kernels(monkeypatch):
    """``forward_normed`` / ``forward_act`` (one launch before the GEMVs) against the norm or
    act·mul kernel followed by ``forward`` (which quantizes x itself)."""
    import torch.nn.functional as F

    from kvserve.model.layers import RMSNorm

    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "int8")
    gen = torch.Generator().manual_seed(2)
    k, n = 256, 96
    mod = CudaQuantLinear([packed(Q.Q4_K, 64, k, seed=3), packed(Q.Q6_K, 32, k, seed=4)], None, DEV)
    norm = RMSNorm(k, 1e-5).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    x = torch.randn(2, k, generator=gen).to(DEV)
    r = torch.randn(2, k, generator=gen).to(DEV)
    y, s = mod.forward_normed(x, r, norm)
    h = (x + r) * torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    ref = mod.forward(h)
    assert y.shape == (2, n) and torch.equal(s, x + r)
    assert torch.allclose(y, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))
    down = CudaQuantLinear([packed(Q.Q6_K, 48, k, seed=5)], None, DEV)
    gu = torch.randn(3, 2 * k, generator=gen).to(DEV)
    ref = down.forward(F.silu(gu[:, :k]) * gu[:, k:])
    got = down.forward_act(gu, k, "silu")
    assert torch.allclose(got, ref, rtol=1e-3, atol=1e-3 * float(ref.abs().max()))
