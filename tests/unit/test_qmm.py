"""The native block kernels (``quant.native``, ``qmm.c``): against a numpy reference of the same
arithmetic (activation blocks, exact per-block integer dots, float32 accumulation in block order;
Q4_1 and Q8_0 as ggml's x86 vec_dot kernels: 8 float lanes of 4 codes each, summed at the end),
against gguf's dequantizer and a float32 matmul, batch invariance, and every instruction-set path
bit-identical to the scalar one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as np_dequantize

from kvserve.model.quant import native
from kvserve.model.quant.groups import _k_scales, to_groups

from . import ggml_numpy as G
from .test_quant import random_blocks

_BUILT = native.available()
pytestmark = pytest.mark.skipif(not _BUILT, reason=native.unavailable_reason() if not _BUILT else "")

FORMATS = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ISAS = [i for i in range(4) if native.available() and i <= native.best_isa()]
f32 = np.float32


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16).astype(f32)[..., 0]


# ---- the reference: numpy, the same arithmetic spelled out ----

def ref_quantize(qtype: Q, x: np.ndarray):
    """(codes int64 [M, nb, bw], d float32 [M, nb], s float32 [M, nb] (Q8_1), sums int64 [M, nb, bw // 16])."""
    m, k = x.shape
    if native.BLOCK_WEIGHTS[qtype] == 32:  # Q8_0 / Q8_1 as llama.cpp's x86 quantizer
        b = x.reshape(m, -1, 32).astype(f32)
        amax = np.abs(b).max(-1)
        d = (amax / f32(127)).astype(f32)
        with np.errstate(divide="ignore"):
            idv = np.where(amax != 0, f32(127) / amax, f32(0)).astype(f32)
        q = np.rint((b * idv[..., None]).astype(f32)).astype(np.int64)  # half to even
        s = (d * q.sum(-1).astype(f32)).astype(np.float16).astype(f32)
        return q, d.astype(np.float16).astype(f32), s, q.reshape(m, -1, 2, 16).sum(-1)
    b = x.reshape(m, -1, 256).astype(f32)  # Q8_K as ggml's reference quantizer
    at = np.abs(b).argmax(-1)
    mx = np.take_along_axis(b, at[..., None], -1)[..., 0]
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, f32(-127) / mx, f32(0)).astype(f32)
    q = np.minimum(127, np.rint((iscale[..., None] * b).astype(f32))).astype(np.int64)
    d = np.where(mx != 0, (f32(1) / np.where(iscale != 0, iscale, f32(1))).astype(f32), f32(0))
    return q, d, None, q.reshape(m, -1, 16, 16).sum(-1)


def ref_weights(qtype: Q, raw: np.ndarray, n: int, k: int):
    """(unsigned codes int64 [N, nb, bw], per-block f16 fields float32 [N, nb, 2], sub-scales)."""
    from gguf.constants import GGML_QUANT_SIZES

    bw, bb = GGML_QUANT_SIZES[qtype]
    blocks = raw.reshape(n, k // bw, bb)
    if qtype == Q.Q6_K:
        ql, qh = blocks[..., :128].astype(np.int64), blocks[..., 128:192].astype(np.int64)
        c = np.empty((n, k // bw, 256), np.int64)
        for h in range(2):
            l0, l1, hb = ql[..., 64 * h : 64 * h + 32], ql[..., 64 * h + 32 : 64 * h + 64], qh[..., 32 * h : 32 * h + 32]
            o = 128 * h
            c[..., o : o + 32] = (l0 & 15) | ((hb & 3) << 4)
            c[..., o + 32 : o + 64] = (l1 & 15) | (((hb >> 2) & 3) << 4)
            c[..., o + 64 : o + 96] = (l0 >> 4) | (((hb >> 4) & 3) << 4)
            c[..., o + 96 : o + 128] = (l1 >> 4) | (((hb >> 6) & 3) << 4)
        d = _f16(blocks[..., 208:210, None].reshape(n, -1, 2).copy())
        return c, np.stack([d, d], -1), blocks[..., 192:208].view(np.int8).astype(np.int64)
    c = to_groups(raw, qtype, (n, k)).codes.reshape(n, k // bw, bw).astype(np.int64)
    fields = np.stack([_f16(blocks[..., 0:2].copy()), _f16(blocks[..., 2:4].copy())], -1)
    if qtype in (Q.Q4_K, Q.Q5_K):
        sc, mn = _k_scales(blocks[..., 4:16].reshape(-1, 12))
        return c, fields, (sc.reshape(n, -1, 8).astype(np.int64), mn.reshape(n, -1, 8).astype(np.int64))
    return c, fields, None


def fma32(a, b, c):
    """float32 fma through float64 (a·b exact there; the sum may round twice: ≤ 1 ulp off)."""
    return (np.float64(a) * np.float64(b) + np.float64(c)).astype(f32)


def ref_lanes(qtype: Q, x: np.ndarray, raw: np.ndarray, n: int) -> np.ndarray:
    """ggml_vec_dot_q4_1_q8_1 / ggml_vec_dot_q8_0_q8_0 (arch/x86/quants.c, AVX2 and up): lane j
    of 8 is Σ codes 4j..4j+3 · activation codes (exact), acc_j = fma(dx·dy, lane_j, acc_j) over
    the blocks in order, Q4_1's summs = fma(mx, sy, summs) (gcc contracts it); hsum_float_8(acc)
    (+ summs). Exact fma (G.fma32): these are compared bit for bit."""
    m, k = x.shape
    q, dy, sy, _ = ref_quantize(qtype, x)
    c, fields, _ = ref_weights(qtype, raw, n, k)
    c = c - (128 if qtype == Q.Q8_0 else 0)  # Q8_0: the signed weights
    acc = np.zeros((m, n, 8), f32)
    summs = np.zeros((m, n), f32)
    for b in range(c.shape[1]):
        lanes = np.einsum("mjl,njl->mnj", q[:, b].reshape(m, 8, 4), c[:, b].reshape(n, 8, 4))
        d = (fields[None, :, b, 0] * dy[:, None, b]).astype(f32)
        acc = G.fma32(np.broadcast_to(d[..., None], acc.shape), lanes.astype(f32), acc)
        if qtype == Q.Q4_1:
            summs = G.fma32(np.broadcast_to(fields[None, :, b, 1], summs.shape),
                            np.broadcast_to(sy[:, None, b], summs.shape), summs)
    h = G.hsum8(acc)
    return (h + summs).astype(f32) if qtype == Q.Q4_1 else h


def ref_matmul(qtype: Q, x: np.ndarray, raw: np.ndarray, n: int) -> np.ndarray:
    if qtype in (Q.Q4_1, Q.Q8_0):
        return ref_lanes(qtype, x, raw, n)
    m, k = x.shape
    q, dy, sy, sums = ref_quantize(qtype, x)
    c, fields, sub = ref_weights(qtype, raw, n, k)
    dx = fields[..., 0]
    acc = np.zeros((m, n), f32)
    for b in range(c.shape[1]):
        if qtype in (Q.Q4_K, Q.Q5_K):
            sc, mn = sub
            dots = np.einsum("mjl,njl->mnj", q[:, b].reshape(m, 8, 32), c[:, b].reshape(n, 8, 32))
            s = (dots * sc[None, :, b]).sum(-1)
            t = (sums[:, b].reshape(m, 8, 2).sum(-1)[:, None] * mn[None, :, b]).sum(-1)
            dd = (dx[None, :, b] * dy[:, None, b]).astype(f32)
            acc = fma32(dd, s.astype(f32), acc)
            acc = fma32((-fields[None, :, b, 1] * dy[:, None, b]).astype(f32), t.astype(f32), acc)
        elif qtype == Q.Q6_K:
            dots = np.einsum("mjl,njl->mnj", q[:, b].reshape(m, 16, 16), c[:, b].reshape(n, 16, 16))
            s = ((dots - 32 * sums[:, None, b]) * sub[None, :, b]).sum(-1)
            acc = fma32((dx[None, :, b] * dy[:, None, b]).astype(f32), s.astype(f32), acc)
        else:
            zero = {Q.Q4_0: 8, Q.Q5_0: 16, Q.Q8_0: 128}.get(qtype, 0)
            s = q[:, b] @ c[:, b].T - zero * q[:, b].sum(-1)[:, None]
            acc = fma32((dx[None, :, b] * dy[:, None, b]).astype(f32), s.astype(f32), acc)
            if qtype in (Q.Q4_1, Q.Q5_1):
                acc = fma32(fields[None, :, b, 1], sy[:, None, b], acc)
    return acc


def _case(qtype: Q, n: int, k: int, m: int, seed: int = 0):
    raw = random_blocks(qtype, n, k, seed)
    rng = np.random.default_rng(seed + 100)
    x = (rng.standard_normal((m, k)) * rng.uniform(0.01, 3, (m, 1))).astype(f32)
    x[0, :32] = 0  # an all-zero activation block
    return raw, torch.from_numpy(x), torch.from_numpy(raw)


def _ulps(a: np.ndarray, b: np.ndarray) -> int:
    ia, ib = a.view(np.int32).astype(np.int64), b.view(np.int32).astype(np.int64)
    ia = np.where(ia < 0, -(ia & 0x7FFFFFFF), ia)
    ib = np.where(ib < 0, -(ib & 0x7FFFFFFF), ib)
    return int(np.abs(ia - ib).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_activation_blocks_match_the_reference(qtype, isa):
    _, x, _ = _case(qtype, 8, 512, 5)
    x[1, 40] = -x[1].abs().max() * 2  # the block's largest magnitude twice, with both signs:
    x[1, 41] = -x[1, 40]  # Q8_K takes the first one's sign
    got = native.quantize(qtype, x, isa=isa)
    q, d, s, sums = ref_quantize(qtype, x.numpy())
    if native.BLOCK_WEIGHTS[qtype] == 32:
        assert np.array_equal(got[..., 16:].view(np.int8), q)
        assert np.array_equal(got[..., 0:4].copy().view(f32)[..., 0], d)
        assert np.array_equal(got[..., 8:12].copy().view(np.int32)[..., 0], q.sum(-1))
        assert np.array_equal(got[..., 4:8].copy().view(f32)[..., 0], s)
    else:
        assert np.array_equal(got[..., 48:].view(np.int8), q)
        assert np.array_equal(got[..., 0:4].copy().view(f32)[..., 0], d)
        assert np.array_equal(got[..., 16:48].copy().view(np.int16), sums)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_kernel_matches_reference_arithmetic(qtype):
    n, k, m = 40, 768, 19
    raw, x, w = _case(qtype, n, k, m, seed=3)
    ref = ref_matmul(qtype, x.numpy(), raw, n)
    for isa in ISAS:
        y = native.matmul(qtype, x, w, isa=isa).numpy()
        if qtype in (Q.Q4_1, Q.Q8_0):  # ggml's lanes: bit for bit
            assert np.array_equal(y.view(np.int32), ref.view(np.int32)), native.isa_name(isa)
        else:
            assert _ulps(y, ref) <= 1, (native.isa_name(isa), np.abs(y - ref).max())


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_kernel_close_to_dequantized_f32(qtype):
    n, k, m = 64, 1024, 3
    raw, x, w = _case(qtype, n, k, m, seed=4)
    wf = np_dequantize(raw, qtype).reshape(n, k).astype(np.float64)
    exact = x.numpy().astype(np.float64) @ wf.T
    y = native.matmul(qtype, x, w).numpy()
    # Q8 activations: each code within half a step (amax/254) of the value
    bound = (np.abs(wf).sum(1)[None, :] * np.abs(x.numpy()).max(1)[:, None] / 254) * 1.01 + 1e-6
    assert (np.abs(y - exact) <= bound).all()
    rel = np.linalg.norm(y - exact) / np.linalg.norm(exact)
    assert rel < 0.02


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
def test_isa_paths_are_bit_identical(qtype):
    n, k, m = 35, 512, 37  # odd columns (partial chunk and tile), 2 row tiles + 5 rows
    _, x, w = _case(qtype, n, k, m, seed=5)
    ys = [native.matmul(qtype, x, w, isa=i) for i in ISAS]
    for y in ys[1:]:
        assert torch.equal(y.view(torch.int32), ys[0].view(torch.int32))


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.Q5_0], ids=lambda q: q.name)
def test_batch_and_thread_invariance(qtype):
    n, k = 70, 512
    _, x, w = _case(qtype, n, k, 128, seed=6)
    full = native.matmul(qtype, x, w, threads=2)
    for m in (1, 5, 37, 128):
        for t in (1, 3):
            y = native.matmul(qtype, x[:m], w, threads=t)
            assert torch.equal(y.view(torch.int32), full[:m].view(torch.int32)), (m, t)
    one = torch.stack([native.matmul(qtype, x[i : i + 1], w, threads=1)[0] for i in (0, 17, 36, 100)])
    assert torch.equal(one.view(torch.int32), full[[0, 17, 36, 100]].view(torch.int32))


def test_out_writes_a_column_slice():
    _, x, w = _case(Q.Q4_1, 24, 256, 7)
    wide = torch.full((7, 50), 7.0)
    native.matmul(Q.Q4_1, x, w, out=wide[:, 10:34])
    assert torch.equal(wide[:, 10:34], native.matmul(Q.Q4_1, x, w))
    assert (wide[:, :10] == 7).all() and (wide[:, 34:] == 7).all()


def test_native_linear_fuses_mixed_formats():
    k = 512
    parts = []
    for i, (qt, n) in enumerate([(Q.Q4_K, 32), (Q.Q4_K, 16), (Q.Q6_K, 16)]):
        raw = random_blocks(qt, n, k, seed=10 + i)
        parts.append((raw, qt, (n, k), None))
    bias = torch.randn(64)
    mod = native.NativeLinear(parts, bias)
    assert mod.qtypes == [Q.Q4_K, Q.Q6_K] and mod.out_features == 64
    x = torch.randn(3, 4, k)
    y = mod(x)
    sep = torch.cat([native.matmul(qt, x.reshape(-1, k), torch.from_numpy(r)) for r, qt, _, _ in parts], 1) + bias
    assert y.shape == (3, 4, 64) and torch.equal(y.reshape(-1, 64), sep)
    assert mod.weight_bytes() == sum(p[0].nbytes for p in parts) + bias.nbytes


def test_loader_paths_fusion_and_tied_embedding():
    """On the CPU every format the kernels know takes the native path (whatever mix of them a
    fused Q/K/V or gate/up has); a tied embedding reads its rows from the head's own bytes,
    exactly as the file's dequantizer, and the file rows are released once copied."""
    from kvserve.model.quant.build import RawTensor, fuse_groups, linear, path_of
    from kvserve.model.quant.embedding import QuantEmbedding

    def t(q, n=64, k=256):
        return RawTensor(np.zeros(1, np.uint8), q, (n, k))

    assert [path_of(t(q)) for q in (Q.Q4_K, Q.Q5_0, Q.Q8_0, Q.Q6_K, Q.Q4_1, Q.F16)] == ["native"] * 5 + ["dense"]
    assert path_of(t(Q.Q4_K, k=96)) == "int4"  # not whole super-blocks: the int4 layout takes it
    lin = {"l.attn.q": t(Q.Q5_0), "l.attn.k": t(Q.Q5_0), "l.attn.v": t(Q.Q8_0), "l.mlp.gate": t(Q.Q4_K),
           "l.mlp.up": t(Q.Q6_K)}
    got = dict(fuse_groups(lin))
    assert got["l.attn.qkv"] == ["l.attn.q", "l.attn.k", "l.attn.v"] and got["l.mlp.gate_up"] == ["l.mlp.gate", "l.mlp.up"]

    n, k = 100, 256
    raw = random_blocks(Q.Q8_0, n, k, seed=12)
    seen: list[tuple[int, int]] = []
    head = linear([RawTensor(raw, Q.Q8_0, (n, k), lambda i, j: seen.append((i, j)))], [None])
    assert isinstance(head, native.NativeLinear) and head.weight_bytes() == raw.nbytes
    assert sorted({r for i, j in seen for r in range(i, j)}) == list(range(n))
    emb = QuantEmbedding(head.segments[0].raw, Q.Q8_0, n, k)
    assert emb.weight_bytes() == 0 and emb.raw.data_ptr() == head.segments[0].raw.data_ptr()
    ids = torch.tensor([[3, 0, 99], [7, 7, 1]])
    assert torch.equal(emb(ids), torch.from_numpy(np_dequantize(raw, Q.Q8_0))[ids])
    x = torch.randn(2, k)
    assert torch.equal(head(x), native.matmul(Q.Q8_0, x, torch.from_numpy(raw)))


def test_without_the_extension_the_int4_layout_runs(monkeypatch):
    """A checkout where the extension is not built loads on the int4 layout and says so."""
    from kvserve.model.quant.build import RawTensor, cpu_kernels, path_of

    monkeypatch.setattr(native, "_qmm", None)
    monkeypatch.setattr(native, "_IMPORT_ERROR", "No module named 'kvserve.model.quant._qmm'")
    assert not native.available()
    assert path_of(RawTensor(np.zeros(1, np.uint8), Q.Q4_1, (64, 256))) == "int4"
    assert cpu_kernels().startswith("native kernels not built") and "int4" in cpu_kernels()
