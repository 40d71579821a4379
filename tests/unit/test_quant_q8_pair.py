"""Two tiled int8 GEMVs in one launch (``triton_q8_pair``) under Triton's interpreter on the CPU
(compiled on a GPU): the bits of the two launches it stands for, K slices and their counters
included; a module of two layouts (Q4_K Q/K beside Q6_K V) launches it once."""

from __future__ import annotations

import pytest
import torch

# the interpreter switch, the skips without a GPU or interpreter, the device and the packer
from .test_quant_triton import DEV, packed

from gguf import GGMLQuantizationType as Q  # noqa: E402

from kvserve.model.quant import cuda_linear  # noqa: E402
from kvserve.model.quant import triton_gemv as T  # noqa: E402
from kvserve.model.quant import triton_q8 as Q8  # noqa: E402
from kvserve.model.quant import triton_q8_pair as QP  # noqa: E402
from kvserve.model.quant import triton_q8_tile as QT  # noqa: E402
from kvserve.model.quant.cuda_linear import CudaQuantLinear  # noqa: E402

K = 256


@pytest.mark.parametrize("rows", [1, 3])
def test_pair_gives_the_bits_of_its_two_gemvs(monkeypatch, rows):
    # unlike configurations (widths, warps, tile depths): a K split on each side, unequal ones
    monkeypatch.setattr(QT, "TUNING", {})
    a, b = packed(Q.Q4_K, 80, K, seed=3), packed(Q.Q6_K, 40, K, seed=4)
    monkeypatch.setattr(QT, "ONE_ROW", {4: [(1 << 40, QT.TileConfig(32, 1, 2, 16))]})
    # by weight bytes: Q6_K's 11,040 below Q4_K's 11,840
    monkeypatch.setattr(QT, "CONFIGS", [(11500, QT.TileConfig(32, 1, 1, 16)), (None, QT.TileConfig(64, 2, 1, 16))])
    gen = torch.Generator().manual_seed(5)
    xq = Q8.quantize_x(torch.randn(rows, K, generator=gen).to(DEV))
    bias = torch.randn(120, generator=gen).to(DEV)
    la = QT.launch_of(xq, a, torch.empty(rows, 80, device=DEV))
    lb = QT.launch_of(xq, b, torch.empty(rows, 40, device=DEV))
    assert la.splits > 1 and lb.splits > 1 and la.cfg != lb.cfg
    want = torch.empty(rows, 120, device=DEV)
    QT.gemv(xq, a, want[:, :80], bias[:80])
    QT.gemv(xq, b, want[:, 80:], bias[80:])
    for _ in range(2):  # the second call finds the counters back at 0
        got = torch.full((rows, 120), float("nan"), device=DEV)
        QP.gemv_pair(xq, (a, got[:, :80], bias[:80]), (b, got[:, 80:], bias[80:]))
        assert torch.equal(got, want)
        assert int(T._counters(a, 1).abs().sum()) == 0 and int(T._counters(b, 1).abs().sum()) == 0


def test_module_of_two_layouts_launches_one_kernel(monkeypatch):
    monkeypatch.setattr(cuda_linear, "ACTIVATIONS", "int8")
    monkeypatch.setattr(cuda_linear, "KERNEL", "tile")
    packs = [packed(q, n, 256, seed=i) for i, (q, n) in enumerate([(Q.Q4_K, 32), (Q.Q6_K, 16), (Q.Q4_K, 32)])]
    bias = torch.randn(80)
    mod = CudaQuantLinear(packs, bias, DEV)  # columns of Q, V, K: V's segment after Q and K's
    calls = {"pair": 0, "one": 0}
    pair, one = QP.gemv_pair, QT.gemv
    monkeypatch.setattr(QP, "gemv_pair", lambda *a, **k: calls.__setitem__("pair", calls["pair"] + 1) or pair(*a, **k))
    monkeypatch.setattr(QT, "gemv", lambda *a, **k: calls.__setitem__("one", calls["one"] + 1) or one(*a, **k))
    x = torch.randn(2, 256, device=DEV)
    xq = Q8.quantize_x(x)
    expect = torch.cat([Q8.reference(xq, p) for p in packs], dim=1) + bias.to(DEV)
    y = mod(x)
    assert calls == {"pair": 1, "one": 0}
    assert torch.allclose(y, expect, rtol=1e-5, atol=1e-5 * expect.abs().max().item())
    monkeypatch.setattr(cuda_linear, "PAIR_SEGMENTS", False)  # KVSERVE_GEMV_PAIR=0: a launch a segment
    assert torch.equal(mod(x), y)
    assert calls == {"pair": 1, "one": 2}
