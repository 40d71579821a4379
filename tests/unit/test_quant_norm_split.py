"""The RMSNorm between two tiled GEMVs split between them (``triton_q8_norm``), under Triton's
interpreter on the CPU (compiled on a GPU): the producer writes the norm's sum, its partial sums
of squares and the codes of s · w as ``quantize_x`` would; the consumer's scaled sums are the
GEMV of those codes times each row's 1 / rms; the pair of GEMVs does the same; the modules and
the decoder layers that use it equal the norm kernel's path within the rounding it skips."""

from __future__ import annotations

import pytest
import torch

# the interpreter switch, the skips without a GPU or interpreter, the device and the packer
from .test_quant_triton import DEV, packed

from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import triton_gemv as T  # noqa: E402
from kvserve.model.quant import triton_q8 as Q8  # noqa: E402
from kvserve.model.quant import triton_q8_norm as QN  # noqa: E402
from kvserve.model.quant import triton_q8_pair as QP  # noqa: E402
from kvserve.model.quant import triton_q8_tile as QT  # noqa: E402

EPS = 1e-5
# (producer format, batch rows, config): K slices (the last slice writes the block) with 1 row;
# one program a column block at 3 rows (one batch block, 64 columns: 2 blocks of 32 a program);
# 5 rows (a second batch block, 3 of its rows past the batch) with K slices
RUNS = [(Q.Q4_K, 1, QT.TileConfig(32, 1, 2, 16)), (Q.Q6_K, 3, QT.TileConfig(64, 2, 0, 32)),
        (Q.Q4_K, 5, QT.TileConfig(32, 1, 2, 16))]


def _inputs(m: int, n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    xq = Q8.quantize_x(torch.randn(m, k, generator=gen).to(DEV))
    r = torch.randn(m, n, generator=gen).to(DEV, torch.bfloat16)
    w = (torch.rand(n, generator=gen) + 0.5).to(DEV)
    return xq, r, w


def _produce(p, xq, r, w, cfg) -> QN.Prenormed:
    m = xq.q.shape[0]
    pre = QN.empty_prenormed(m, p.n, QT.norm_blocks(p, m, cfg), torch.bfloat16, DEV)
    QT.gemv(xq, p, pre.s, cfg=cfg, norm_out=(r, w, pre))
    return pre


@pytest.mark.parametrize("qtype,m,cfg", RUNS, ids=lambda v: getattr(v, "name", str(v)))
def test_producer_writes_the_sum_its_squares_and_the_codes_of_s_times_w(qtype, m, cfg):
    n, k = 128, 256
    p = packed(qtype, n, k, seed=31)
    xq, r, w = _inputs(m, n, k, seed=7)
    plain = QT.gemv(xq, p, torch.empty(m, n, dtype=torch.bfloat16, device=DEV), cfg=cfg)
    for _ in range(2):  # a second call: the K slices' counters were reset
        pre = _produce(p, xq, r, w, cfg)
        s = Q8.norm_quantize_x(plain, r, w, EPS)[1]  # the norm kernel's sum, rounded as it rounds
        assert torch.equal(pre.s, s)
        blocks = (s.float() ** 2).view(m, -1, cfg.bn).sum(dim=2)
        assert torch.allclose(pre.ss, blocks, rtol=1e-5, atol=0)
        want = Q8.quantize_x_reference(s.float() * w)
        assert torch.equal(pre.xq.q, want.q) and torch.equal(pre.xq.d, want.d)
        assert torch.allclose(pre.xq.s, want.s, rtol=1e-5, atol=1e-5)
        assert int(T._counters(p, 1).abs().sum()) == 0


@pytest.mark.parametrize("qtype,m,cfg", RUNS[:2], ids=lambda v: getattr(v, "name", str(v)))
def test_consumer_scales_each_row_by_its_inverse_rms(qtype, m, cfg):
    """The consumer's sums are the GEMV of the producer's codes times rsqrt(mean(s²) + eps), and
    within the int8 rounding of the norm's output of the GEMV of that output quantized."""
    n, k, n2 = 256, 256, 96
    p = packed(Q.Q4_K, n, k, seed=3)
    xq, r, w = _inputs(m, n, k, seed=8)
    pre = _produce(p, xq, r, w, QT.TileConfig(64, 2, 1, 32))
    pc = packed(qtype, n2, n, seed=4)
    y = QT.gemv(pre.xq, pc, torch.empty(m, n2, device=DEV), cfg=cfg, rscale=(pre, EPS))
    s = pre.s.float()
    c = torch.rsqrt((s * s).mean(dim=1, keepdim=True) + EPS)
    expect = Q8.reference(pre.xq, pc) * c
    assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item())
    normed = Q8.reference(Q8.quantize_x_reference(QN.reference(pre, EPS, w)), pc)
    assert (y - normed).abs().max() <= 2e-2 * normed.abs().max()


def test_pair_scales_both_gemvs_as_each_alone():
    n, k, m = 256, 256, 2
    p = packed(Q.Q4_K, n, k, seed=5)
    xq, r, w = _inputs(m, n, k, seed=9)
    pre = _produce(p, xq, r, w, QT.TileConfig(32, 1, 2, 16))
    pa, pb = packed(Q.Q4_K, 64, n, seed=6), packed(Q.Q6_K, 32, n, seed=7)
    ya, yb = (QT.gemv(pre.xq, pq, torch.empty(m, pq.n, device=DEV), rscale=(pre, EPS)) for pq in (pa, pb))
    y = torch.empty(m, 96, device=DEV)
    QP.gemv_pair(pre.xq, (pa, y[:, :64], None), (pb, y[:, 64:], None), rscale=(pre, EPS))
    assert torch.equal(y[:, :64], ya) and torch.equal(y[:, 64:], yb)


def _layer_modules(k: int, n_ff: int):
    """A decode layer's quantized projections: output (Q4_K), gate/up (Q4_K), down (Q6_K), then
    the next layer's Q/K (Q4_K) beside V (Q6_K), with the two norms between them."""
    from kvserve.model.layers import GatedMLP, RMSNorm
    from kvserve.model.quant.cuda_linear import CudaQuantLinear

    gen = torch.Generator().manual_seed(12)
    o = CudaQuantLinear([packed(Q.Q4_K, k, k, seed=1)], None, DEV)
    mlp = GatedMLP(k, n_ff, "silu")
    mlp.gate_up = CudaQuantLinear([packed(Q.Q4_K, n_ff, k, seed=2), packed(Q.Q4_K, n_ff, k, seed=3)], None, DEV)
    mlp.down = CudaQuantLinear([packed(Q.Q6_K, k, n_ff, seed=4)], None, DEV)
    qkv = CudaQuantLinear([packed(Q.Q4_K, 128, k, seed=5), packed(Q.Q4_K, 64, k, seed=6),
                           packed(Q.Q6_K, 64, k, seed=7)], None, DEV)
    norms = [RMSNorm(k, EPS).to(DEV), RMSNorm(k, EPS).to(DEV)]
    with torch.no_grad():
        for nm in norms:
            nm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    return o, mlp, qkv, norms


def _chain(o, mlp, qkv, norms, xq, r):
    """O projection → ffn norm → MLP → the next layer's norm → Q/K/V, as the llama block runs
    them: (q/k/v, the residual stream after the MLP, the MLP's output + that stream)."""
    from kvserve.model.layers import norm_linear

    dtype = r.dtype
    a = o.forward_quantized_into(xq, dtype, r, norms[0])
    if a is None:
        a, res = o.forward_quantized(xq, dtype), r
    else:
        res = None
    h, res = mlp.forward_normed(norms[0], a, res, norms[1])
    out = h.s if res is None else (h.float() + res.float())
    y, s = norm_linear(norms[1], qkv, h, res)
    return y, s, out


@pytest.mark.parametrize("rows", [1, 3])
def test_layer_chain_without_norm_kernels_equals_the_norm_kernels_path(monkeypatch, rows):
    """The split norms give the residual stream of the norm kernels' path bit for bit after the
    output projection and within bf16 rounding after the MLP, Q/K/V within the int8 rounding of
    the norm's output, and no norm kernel runs; with ``KVSERVE_GEMV_NORM_SPLIT=0`` the modules
    decline (the norm kernels' path)."""
    from kvserve.model.quant import cuda_linear

    k, n_ff = 256, 256
    o, mlp, qkv, norms = _layer_modules(k, n_ff)
    gen = torch.Generator().manual_seed(13)
    xq = Q8.quantize_x(torch.randn(rows, k, generator=gen).to(DEV))
    r = (4 * torch.randn(rows, k, generator=gen)).to(DEV, torch.bfloat16)
    monkeypatch.setattr(cuda_linear, "ACTIVATIONS", "int8")
    monkeypatch.setattr(cuda_linear, "KERNEL", "tile")
    monkeypatch.setattr(cuda_linear, "ACT_EPILOGUE", True)
    monkeypatch.setattr(cuda_linear, "NORM_SPLIT", False)
    base_y, base_s, base_out = _chain(o, mlp, qkv, norms, xq, r)
    monkeypatch.setattr(cuda_linear, "NORM_SPLIT", True)
    calls = []
    real = Q8.norm_quantize_x
    monkeypatch.setattr(Q8, "norm_quantize_x", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    pre = o.forward_quantized_into(xq, r.dtype, r, norms[0])
    assert pre is not None
    assert torch.equal(pre.s, real(o.forward_quantized(xq, r.dtype), r, norms[0].weight, EPS)[1])
    y, s, out = _chain(o, mlp, qkv, norms, xq, r)
    assert calls == []
    assert torch.allclose(out.float(), base_out.float(), rtol=2e-2, atol=2e-2 * base_out.abs().max().item())
    assert torch.allclose(s.float(), base_s.float(), rtol=2e-2, atol=2e-2 * base_s.abs().max().item())
    assert (y.float() - base_y.float()).abs().max() <= 3e-2 * base_y.abs().max()


@pytest.mark.skipif(DEV.type != "cuda", reason="CUDA graphs")
@pytest.mark.parametrize("level", [0, 2])
def test_split_norm_chain_in_a_cuda_graph_gives_the_eager_bits(monkeypatch, level):
    """Captured at ``KVSERVE_QUANT_GEMV_PDL`` ``level`` and replayed, the chain without norm
    kernels gives its eager bits every replay, and every count is back at 0."""
    from kvserve.model.quant import cuda_linear, pdl

    k, n_ff = 512, 1024
    o, mlp, qkv, norms = _layer_modules(k, n_ff)
    gen = torch.Generator().manual_seed(14)
    xq = Q8.quantize_x(torch.randn(1, k, generator=gen).to(DEV))
    r = torch.randn(1, k, generator=gen).to(DEV, torch.bfloat16)
    for name, v in (("ACTIVATIONS", "int8"), ("KERNEL", "tile"), ("ACT_EPILOGUE", True), ("NORM_SPLIT", True)):
        monkeypatch.setattr(cuda_linear, name, v)
    monkeypatch.setattr(pdl, "LEVEL", level)

    def run():
        return torch.cat([t.float().flatten() for t in _chain(o, mlp, qkv, norms, xq, r)])

    base = run()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g):
        out = run()
    for _ in range(3):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, base)
    for mod in (o, mlp.gate_up, mlp.down, qkv):
        for s in mod.segments:
            assert int(T._counters(s.packed(), 1).abs().sum()) == 0
            assert int(T._counters(s.packed(), 1, "act").abs().sum()) == 0
