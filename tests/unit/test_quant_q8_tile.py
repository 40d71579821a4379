"""The tiled int8-activation GEMV (``triton_q8_tile``) under Triton's interpreter on the CPU
(compiled on a GPU): equal to ``triton_q8``'s torch reference (exact integer dot products) for
every layout, batch rows, tile sizes, K slices and masked edges; the module runs it by default."""

from __future__ import annotations

import pytest
import torch

# the interpreter switch, the skips without a GPU or interpreter, the device and the packer
from .test_quant_triton import DEV, packed

from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import cuda_pack as P  # noqa: E402
from kvserve.model.quant import triton_gemv as T  # noqa: E402
from kvserve.model.quant import triton_q8 as Q8  # noqa: E402
from kvserve.model.quant import triton_q8_tile as QT  # noqa: E402
from kvserve.model.quant.cuda_linear import CudaQuantLinear  # noqa: E402

CASES = [(Q.Q4_K, 80, 512), (Q.Q6_K, 72, 512), (Q.Q4_0, 33, 96), (Q.Q8_0, 17, 160), (Q.Q5_K, 20, 256),
         (Q.Q4_1, 24, 64), (Q.Q5_0, 9, 96), (Q.Q5_1, 12, 64)]
# (batch rows, config): one K slice; tiles past the end of K (masked groups) and K slices of
# unequal length; 3 rows in one batch block (fewer groups a step); 9 rows (a second block); a
# narrow program with a deep tile (the warp's lanes across groups as well as columns)
RUNS = [(1, QT.TileConfig(64, 2, 0, 32)), (1, QT.TileConfig(32, 1, 2, 8)), (3, QT.TileConfig(64, 2, 1, 32)),
        (9, QT.TileConfig(128, 4, 0, 16)), (1, QT.TileConfig(16, 1, 1, 128)), (1, QT.TileConfig(64, 2, 2, 128))]


@pytest.mark.parametrize("qtype,n,k", CASES, ids=lambda c: getattr(c, "name", str(c)))
def test_tiled_gemv_equals_the_reference(qtype, n, k):
    p = packed(qtype, n, k, seed=11)
    gen = torch.Generator().manual_seed(4)
    for i, (m, cfg) in enumerate(RUNS):
        x = torch.randn(m, k, generator=gen).to(DEV)
        bias = torch.randn(n, generator=gen).to(DEV)
        xq = Q8.quantize_x(x)
        y = QT.gemv(xq, p, torch.empty(m, n, device=DEV), bias=bias, cfg=cfg)
        expect = Q8.reference(xq, p) + bias
        assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item()), (m, cfg)
        if i > 1:
            continue
        # the group-at-a-time kernel: the same terms summed in another order
        old = Q8.gemv(xq, p, torch.empty(m, n, device=DEV), bias=bias, cfg=T.Config(64, 2, 0))
        assert torch.allclose(y, old, rtol=1e-5, atol=1e-5 * old.abs().max().item()), (m, cfg)


def test_tiled_split_gemv_resets_its_counters():
    p = packed(Q.Q4_K, 16, 1024, seed=8)
    xq = Q8.quantize_x(torch.randn(2, 1024).to(DEV))
    cfg = QT.TileConfig(16, 1, 2, 8)
    one = QT.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=cfg._replace(programs=0))
    first = QT.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=cfg)
    # split over programs: the same terms summed in another order (outputs of magnitude ~1e3)
    assert torch.allclose(first, one, rtol=1e-5, atol=1e-5 * one.abs().max().item())
    assert int(T._counters(p, 1).abs().sum()) == 0
    assert torch.equal(QT.gemv(xq, p, torch.empty(2, 16, device=DEV), cfg=cfg), first)


def test_one_batch_row_takes_its_own_table(monkeypatch):
    monkeypatch.setattr(QT, "TUNING", {})
    p = packed(Q.Q4_K, 64, 256)
    monkeypatch.setattr(QT, "ONE_ROW", {4: [(p.nbytes, QT.TileConfig(64, 2, 8, 128)), (p.nbytes + 1, QT.TileConfig(32, 1, 8, 128))]})
    monkeypatch.setattr(QT, "CONFIGS", [(p.nbytes, QT.TileConfig(256, 2, 4, 16)), (None, QT.TileConfig(128, 1, 8, 32))])
    assert QT.default_config(p, 1) == QT.TileConfig(32, 1, 8, 128)
    assert QT.default_config(p, 2) == QT.default_config(p, 8) == QT.TileConfig(128, 1, 8, 32)
    p8 = packed(Q.Q8_0, 64, 256)  # 8-bit codes: no batch-1 entry in this table
    assert QT.default_config(p8, 1) == QT.TileConfig(128, 1, 8, 32)
    monkeypatch.setattr(QT, "TUNING", {p.nbytes: QT.TileConfig(16, 1, 2, 8)})  # the tuning file first
    assert QT.default_config(p, 1) == QT.default_config(p, 4) == QT.TileConfig(16, 1, 2, 8)


def test_groups_a_step_shrink_with_batch_rows():
    p4, p8 = packed(Q.Q4_K, 8, 256), packed(Q.Q8_0, 8, 256)
    cfg = QT.TileConfig(128, 1, 4, 32)
    assert [QT.groups_of(p4, cfg, m) for m in (1, 2, 3, 4, 8)] == [8, 4, 2, 2, 2]
    assert [QT.groups_of(p8, cfg, m) for m in (1, 2, 4)] == [4, 2, 1]


@pytest.mark.parametrize("kernel", ["tile", "group"])
def test_module_runs_the_kernel_asked_for(monkeypatch, kernel):
    k = 256
    packs = [packed(q, n, k, seed=i) for i, (q, n) in enumerate([(Q.Q4_K, 32), (Q.Q6_K, 16)])]
    mod = CudaQuantLinear(packs, None, DEV)
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "int8")
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.KERNEL", kernel)
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.PAIR_SEGMENTS", False)  # not one launch of both
    calls = []
    target = QT if kernel == "tile" else Q8
    real = target.gemv
    monkeypatch.setattr(target, "gemv", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    x = torch.randn(2, k, device=DEV)
    xq = Q8.quantize_x(x)
    expect = torch.cat([Q8.reference(xq, p) for p in packs], dim=1)
    y = mod(x)
    assert len(calls) == 2  # one launch a segment
    assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item())


def test_q6_k_planes_keep_the_file_s_information():
    from gguf.quants import dequantize as np_dequantize

    from .test_quant import random_blocks

    n, k = 24, 512
    raw = random_blocks(Q.Q6_K, n, k, seed=5)
    p = P.pack(torch.from_numpy(raw), Q.Q6_K, k, q6_planes=True)
    assert p.bits == 6 and p.q.shape == (k * 3 // 16, n) and p.nbytes * 8 / (n * k) == 6.625
    assert torch.equal(P.reference(p), torch.from_numpy(np_dequantize(raw, Q.Q6_K)))
    assert torch.equal(P.codes(p), P.codes(P.pack(torch.from_numpy(raw), Q.Q6_K, k)))
    # word 2 of group 0 of row 0: the high 2 bits, byte b bits 2j … holding column 4j + b
    hw, u = int(p.q[2, 0]) & 0xFFFFFFFF, P.codes(p)[0]
    high = [(hw >> (8 * (c % 4) + 2 * (c // 4))) & 3 for c in range(16)]
    assert high == [int(u[c]) >> 4 for c in range(16)]


def test_tiled_gemv_and_dequantize_read_q6_k_planes():
    from .test_quant import random_blocks

    raw = torch.from_numpy(random_blocks(Q.Q6_K, 72, 512, seed=6)).to(DEV)
    p = P.pack(raw, Q.Q6_K, 512, q6_planes=True)
    assert torch.equal(T.dequantize_t(p, dtype=torch.float32).t(), P.reference(p))
    gen = torch.Generator().manual_seed(5)
    for m, cfg in RUNS[:3]:
        xq = Q8.quantize_x(torch.randn(m, 512, generator=gen).to(DEV))
        y = QT.gemv(xq, p, torch.empty(m, 72, device=DEV), cfg=cfg)
        expect = Q8.reference(xq, p)
        assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item()), (m, cfg)


def test_module_runs_q6_k_planes_on_the_tiled_kernel_whatever_the_switches(monkeypatch):
    from .test_quant import random_blocks

    k = 256
    raw = torch.from_numpy(random_blocks(Q.Q6_K, 16, k, seed=2)).to(DEV)
    packs = [packed(Q.Q4_K, 32, k, seed=1), P.pack(raw, Q.Q6_K, k, q6_planes=True)]
    mod = CudaQuantLinear(packs, None, DEV)
    x = torch.randn(2, k, device=DEV)
    xq = Q8.quantize_x(x)
    expect = torch.cat([Q8.reference(xq, p) for p in packs], dim=1)
    for acts, kernel in (("int8", "group"), ("float", "tile")):
        monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", acts)
        monkeypatch.setattr("kvserve.model.quant.cuda_linear.KERNEL", kernel)
        y = mod(x)
        assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item()), (acts, kernel)
    w = mod.dequantized_t(torch.float32).t()  # prefill's dequantized weights: exact
    assert torch.equal(w, torch.cat([P.reference(p) for p in packs]))


@pytest.mark.parametrize("qtype,n,k", [CASES[0], CASES[1], CASES[3]], ids=lambda c: getattr(c, "name", str(c)))
def test_first_tile_before_the_wait_gives_the_same_bits(qtype, n, k):
    """``KVSERVE_QUANT_GEMV_PDL`` 1 and 2 (the first tile loaded before the activations; on sm90 a
    programmatic dependent launch waiting in between, where the interpreter runs no wait) give
    the bits of 0: one K slice, several, slices of unequal length, 3 and 9 rows."""
    p = packed(qtype, n, k, seed=12)
    gen = torch.Generator().manual_seed(6)
    for m, cfg in RUNS:
        xq = Q8.quantize_x(torch.randn(m, k, generator=gen).to(DEV), pdl_level=0)
        bias = torch.randn(n, generator=gen).to(DEV)
        base = QT.gemv(xq, p, torch.empty(m, n, device=DEV), bias=bias, cfg=cfg, pdl_level=0)
        for lv in (1, 2):
            got = QT.gemv(xq, p, torch.empty(m, n, device=DEV), bias=bias, cfg=cfg, pdl_level=lv)
            assert torch.equal(got, base), (m, cfg, lv)


def test_quantizing_kernels_give_the_same_bits_under_pdl():
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(2, 512, generator=gen).to(DEV)
    r = torch.randn(2, 512, generator=gen).to(DEV)
    w = (torch.rand(512, generator=gen) + 0.5).to(DEV)
    gu = torch.randn(2, 2 * 1056, generator=gen).to(DEV)
    for lv in (1, 2):
        for a, b in zip(Q8.quantize_x(x, pdl_level=lv), Q8.quantize_x(x, pdl_level=0)):
            assert torch.equal(a, b), lv
        (qa, sa), (qb, sb) = Q8.norm_quantize_x(x, r, w, 1e-6, pdl_level=lv), Q8.norm_quantize_x(x, r, w, 1e-6,
                                                                                              pdl_level=0)
        assert torch.equal(sa, sb) and all(torch.equal(a, b) for a, b in zip(qa, qb)), lv
        for a, b in zip(Q8.act_quantize_x(gu, 1056, "silu", pdl_level=lv), Q8.act_quantize_x(gu, 1056, "silu",
                                                                                              pdl_level=0)):
            assert torch.equal(a, b), lv


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("epilogue", [False, True], ids=["act-kernel", "act-epilogue"])
@pytest.mark.parametrize("pair", [True, False], ids=["pair", "two-streams"])
def test_pdl_chain_in_a_cuda_graph_gives_the_bits_of_plain_launches(monkeypatch, level, epilogue, pair):
    """Two layers' worth of norm + quantize → Q4_K/Q6_K GEMVs (two segments: one launch, or the
    second on the side stream) → act·mul + quantize (its own kernel, or the gate/up GEMV's programs:
    ``GatedMLP.forward_normed``) → down GEMV, captured with ``KVSERVE_QUANT_GEMV_PDL`` at ``level``
    (programmatic dependent launches where the device has them) and replayed: every replay
    gives the bits of the same chain launched plainly, and the split GEMVs' and the act pairs'
    counters are back at 0."""
    from kvserve.model.layers import GatedMLP, RMSNorm
    from kvserve.model.quant import pdl

    k, n_ff = 512, 1024
    gen = torch.Generator().manual_seed(3)
    qkv = CudaQuantLinear([packed(Q.Q4_K, 384, k, seed=1), packed(Q.Q6_K, 128, k, seed=2)], None, DEV)
    gate_up = CudaQuantLinear([packed(Q.Q4_K, 2 * n_ff, k, seed=3)], None, DEV)
    down = CudaQuantLinear([packed(Q.Q6_K, k, n_ff, seed=4)], None, DEV)
    norm = RMSNorm(k, 1e-5).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    x = torch.randn(1, k, generator=gen).to(DEV)
    r = torch.randn(1, k, generator=gen).to(DEV)

    mlp = GatedMLP(k, n_ff, "silu")
    mlp.gate_up, mlp.down = gate_up, down

    def chain():
        h, s = x, r
        outs = []
        for _ in range(2):
            y, s = qkv.forward_normed(h, s, norm)
            if epilogue:
                h, s = mlp.forward_normed(norm, y, s)
                outs += [y, h]
            else:
                gu, s = gate_up.forward_normed(y, s, norm)
                h = down.forward_act(gu, n_ff, "silu")
                outs += [y, gu, h]
        return torch.cat([o.float().flatten() for o in outs])

    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACTIVATIONS", "int8")
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.KERNEL", "tile")
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.ACT_EPILOGUE", epilogue)
    monkeypatch.setattr("kvserve.model.quant.cuda_linear.PAIR_SEGMENTS", pair)
    calls = []
    if epilogue:
        real = Q8.act_quantize_x
        monkeypatch.setattr(Q8, "act_quantize_x", lambda *a, **kw: calls.append(a) or real(*a, **kw))
    monkeypatch.setattr(pdl, "LEVEL", 0)
    base = chain()
    monkeypatch.setattr(pdl, "LEVEL", level)
    assert torch.equal(chain(), base)  # eager
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(g):
        out = chain()
    for _ in range(3):
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, base)
    for mod in (qkv, gate_up, down):
        for s in mod.segments:
            assert int(T._counters(s.packed(), 1).abs().sum()) == 0
            assert int(T._counters(s.packed(), 1, "act").abs().sum()) == 0
    assert calls == []  # no act·mul kernel of its own where the gate/up GEMV quantizes for down


# (batch rows, config, output dtype): one program a column block and no K split; K slices (the
# pair's count waits for every slice of both blocks); 3 rows in one batch block; 9 rows (a second
# block, its last row alone); 64 and 128 columns a program (2 and 4 blocks of 32 a pair)
ACT_RUNS = [(1, QT.TileConfig(32, 1, 0, 64), torch.float32), (1, QT.TileConfig(32, 1, 2, 16), torch.bfloat16),
            (3, QT.TileConfig(64, 2, 1, 32), torch.bfloat16), (9, QT.TileConfig(32, 1, 2, 16), torch.float32),
            (2, QT.TileConfig(128, 4, 0, 32), torch.bfloat16)]


@pytest.mark.parametrize("qtype,act", [(Q.Q4_K, "silu"), (Q.Q6_K, "gelu_tanh"), (Q.Q8_0, "silu")],
                         ids=lambda v: getattr(v, "name", v))
def test_gate_up_gemv_quantizes_act_times_up_as_its_own_kernel_does(qtype, act):
    """``act_out``: the GEMV's output [g | u] is what it is without, and the codes, scales and sums
    it writes for the down projection are those of ``act_quantize_x`` on that output, bit for bit;
    the pair counts are back at 0 after each call (a second call gives the same bits). Under the
    interpreter the other formats than Q4_K take the K-split and the 3-row runs only (time)."""
    n_ff, k = 128, 256
    p = packed(qtype, 2 * n_ff, k, seed=21)
    gen = torch.Generator().manual_seed(9)
    runs = ACT_RUNS if qtype == Q.Q4_K or DEV.type == "cuda" else ACT_RUNS[1:3]
    for i, (m, cfg, dtype) in enumerate(runs):
        assert QT.fuses_act(p, m, n_ff, cfg)
        xq = Q8.quantize_x(torch.randn(m, k, generator=gen).to(DEV))
        bias = torch.randn(2 * n_ff, generator=gen).to(DEV)
        plain = QT.gemv(xq, p, torch.empty(m, 2 * n_ff, dtype=dtype, device=DEV), bias=bias, cfg=cfg)
        expect = Q8.act_quantize_x(plain, n_ff, act)
        for _ in range(2 if i == 0 else 1):
            sink = Q8.QuantX(torch.full((m, n_ff // 4), -1, dtype=torch.int32, device=DEV),
                             torch.full((m, n_ff // 32), float("nan"), device=DEV),
                             torch.full((m, n_ff // 16), float("nan"), device=DEV))
            y = QT.gemv(xq, p, torch.empty(m, 2 * n_ff, dtype=dtype, device=DEV), bias=bias, cfg=cfg,
                        act_out=(sink, n_ff, act))
            assert torch.equal(y, plain), (m, cfg)
            for got, want in zip(sink, expect):
                assert torch.equal(got, want), (m, cfg, dtype)
            assert int(T._counters(p, 1, "act").abs().sum()) == 0
            assert int(T._counters(p, 1).abs().sum()) == 0


def test_act_epilogue_only_where_gate_and_up_blocks_pair_up():
    p = packed(Q.Q4_K, 2 * 96, 256, seed=2)
    assert QT.fuses_act(p, 1, 96, QT.TileConfig(32, 1, 0, 64))
    # gate's last block would hold up's columns
    assert not QT.fuses_act(p, 1, 96, QT.TileConfig(64, 2, 0, 64))
    assert not QT.fuses_act(p, 1, 80, QT.TileConfig(32, 1, 0, 64))  # not [g | u] of 80 each
    assert not QT.fuses_act(packed(Q.Q4_K, 2 * 64, 256, seed=2), 1, 64, QT.TileConfig(16, 1, 0, 64))


@pytest.mark.parametrize("rows", [1, 4])
def test_mlp_with_the_act_epilogue_equals_its_kernels_one_by_one(monkeypatch, rows):
    """``GatedMLP.forward_normed`` on CUDA quantized modules (the gate/up GEMV quantizing the down
    projection's input) gives the bits of the norm + quantize, GEMV, act·mul + quantize and GEMV
    kernels launched one by one, and launches no act·mul kernel."""
    from kvserve.model.layers import GatedMLP, RMSNorm
    from kvserve.model.quant import cuda_linear

    k, n_ff = 256, 256
    gen = torch.Generator().manual_seed(5)
    mlp = GatedMLP(k, n_ff, "silu")
    mlp.gate_up = CudaQuantLinear([packed(Q.Q4_K, n_ff, k, seed=3), packed(Q.Q4_K, n_ff, k, seed=4)], None,
                                  DEV)
    mlp.down = CudaQuantLinear([packed(Q.Q6_K, k, n_ff, seed=5)], None, DEV)
    norm = RMSNorm(k, 1e-5).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(k, generator=gen) + 0.5)
    x = torch.randn(rows, k, generator=gen).to(DEV, torch.bfloat16)
    r = torch.randn(rows, k, generator=gen).to(DEV, torch.bfloat16)
    monkeypatch.setattr(cuda_linear, "ACTIVATIONS", "int8")
    monkeypatch.setattr(cuda_linear, "KERNEL", "tile")
    monkeypatch.setattr(cuda_linear, "ACT_EPILOGUE", True)
    gu, base_s = mlp.gate_up.forward_normed(x, r, norm)
    base = mlp.down.forward_act(gu, n_ff, "silu")
    calls = []
    monkeypatch.setattr(Q8, "act_quantize_x", lambda *a, **kw: calls.append(a))
    y, s = mlp.forward_normed(norm, x, r)
    assert calls == [] and torch.equal(s, base_s) and torch.equal(y, base)
