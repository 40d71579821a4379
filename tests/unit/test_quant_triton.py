"""The CUDA 4-bit kernels (Triton), run by Triton's interpreter on the CPU against the torch
reference: the dequantizing GEMV (split over K, atomics), the dequantize kernel, the module."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
triton = pytest.importorskip("triton")
if os.environ["TRITON_INTERPRET"] != "1" and not torch.cuda.is_available():
    pytest.skip("no GPU and the Triton interpreter is off", allow_module_level=True)

from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf.quants import dequantize as np_dequantize  # noqa: E402

from kvserve.model.quant import triton_q4 as T  # noqa: E402
from kvserve.model.quant.cuda_linear import Q4Linear  # noqa: E402
from kvserve.model.quant.groups import to_groups  # noqa: E402

from .test_quant import random_blocks  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K], ids=lambda q: q.name)
def test_layout_holds_the_gguf_weights(qtype):
    raw = random_blocks(qtype, 40, 256, seed=11)
    q, s, o = T.pack(to_groups(raw, qtype, (40, 256)))
    ref = torch.from_numpy(np_dequantize(raw, qtype))
    w = T.reference(q, s, o)  # only the f16 rounding of scale and offset
    assert ((w - ref).abs() <= ref.abs().amax(1, keepdim=True) * 2**-9).all()


@pytest.mark.parametrize("split_k", [1, 3])
def test_gemv_and_dequantize_match_the_reference(split_k):
    rng = np.random.default_rng(12)
    n, k = 80, 768  # n not a multiple of the block: masked rows
    raw = random_blocks(Q.Q4_K, n, k, seed=13)
    q, s, o = (t.to(DEV) for t in T.pack(to_groups(raw, Q.Q4_K, (n, k))))
    w = T.reference(q, s, o)
    x = torch.from_numpy(rng.standard_normal((2, k)).astype(np.float32)).to(DEV)
    y = T.gemv(x, q, s, o, block_n=32, block_k=128, split_k=split_k)
    expect = x @ w.T
    assert torch.allclose(y, expect, rtol=1e-4, atol=1e-4 * expect.abs().max().item())
    assert torch.equal(T.dequantize(q, s, o, torch.float32), w)


def test_module_fuses_parts_and_adds_bias():
    k = 256
    raws = [(random_blocks(q, n, k, seed=i), q, n) for i, (q, n) in enumerate([(Q.Q4_0, 32), (Q.Q4_K, 48)])]
    groups = [to_groups(r, q, (n, k)) for r, q, n in raws]
    bias = torch.randn(80)
    mod = Q4Linear(groups, bias, DEV)
    x = torch.randn(3, k, device=DEV)
    w = torch.cat([T.reference(*T.pack(g)) for g in groups]).to(DEV)
    expect = x @ w.T + bias.to(DEV)
    assert torch.allclose(mod(x), expect, rtol=1e-4, atol=1e-4 * expect.abs().max().item())
