"""Quantized weights: GGUF blocks → exact groups → int4 planes → kernels, against gguf's numpy
dequantizer (the reference) on random blocks of every grouped format. The int4 layout is the CPU
path where the native kernels are not built: these tests run with them turned off
(``KVSERVE_NATIVE=0``); tests/unit/test_qmm.py covers the native path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize as np_dequantize
from gguf.quants import quantize as np_quantize

from kvserve.model.quant import int4
from kvserve.model.quant.build import RawTensor, fuse_groups, linear, path_of
from kvserve.model.quant.embedding import PlaneEmbedding, QuantEmbedding
from kvserve.model.quant.groups import GGUFGroups
from kvserve.model.quant.groups import GROUPED, to_groups
from kvserve.model.quant.linear import GEMV_MAX_ROWS, DenseLinear, QuantLinear

@pytest.fixture(autouse=True)
def _int4_path(monkeypatch):
    monkeypatch.setenv("KVSERVE_NATIVE", "0")


# bytes of f16 fields at the start of each block (d, or d and m/dmin)
_F16_BYTES = {Q.Q4_0: 2, Q.Q5_0: 2, Q.Q8_0: 2, Q.Q4_1: 4, Q.Q5_1: 4, Q.Q4_K: 4, Q.Q5_K: 4, Q.Q6_K: 2}


def random_blocks(qtype: Q, n: int, k: int, seed: int = 0) -> np.ndarray:
    """Random raw GGUF bytes of an [n, k] tensor: every code and sub-scale random, f16 fields
    random finite values over four decades (so products cover many exponents)."""
    rng = np.random.default_rng(seed)
    from gguf.constants import GGML_QUANT_SIZES

    bw, bb = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (n, k // bw, bb), dtype=np.uint8)
    nf = _F16_BYTES[qtype] // 2
    f = rng.standard_normal((n, k // bw, nf)) * 10.0 ** rng.uniform(-5, 0, (n, k // bw, nf))
    at = 0 if qtype != Q.Q6_K else bb - 2  # Q6_K keeps its d at the end of the block
    raw[..., at : at + 2 * nf] = f.astype(np.float16).view(np.uint8).reshape(n, k // bw, 2 * nf)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", list(GROUPED), ids=lambda q: q.name)
def test_groups_reproduce_gguf_dequantizer_exactly(qtype):
    n, k = 48, 512
    raw = random_blocks(qtype, n, k)
    ref = np_dequantize(raw, qtype)
    g = to_groups(raw, qtype, (n, k))
    ours = g.dequantize()
    assert g.codes.max() < 2**g.bits and g.codes.dtype == np.uint8
    assert np.array_equal(ours, ref)  # equal as numbers: bit for bit up to the sign of zero
    differ = ours.view(np.uint32) != ref.view(np.uint32)
    assert (ours[differ] == 0).all()


@pytest.mark.parametrize("qtype", list(GROUPED), ids=lambda q: q.name)
def test_planes_sum_to_the_groups_exactly(qtype):
    n, k = 16, 256
    g = to_groups(random_blocks(qtype, n, k, seed=1), qtype, (n, k))
    total = np.zeros((n, k))
    for p in int4.planes(g):
        assert p.codes.max() < 16
        c = p.codes.reshape(n, -1, 32).astype(np.float64)
        total += ((c - 8) * p.s[..., None] + p.z[..., None]).reshape(n, k)
    c = g.codes.reshape(n, -1, 32).astype(np.float64)
    exact = (c * g.scale[..., None].astype(np.float64) + g.offset[..., None].astype(np.float64)).reshape(n, k)
    assert np.array_equal(total, exact)  # whose float32 rounding is gguf's value (test above)
    assert np.array_equal(exact.astype(np.float32), g.dequantize())


def test_packed_layout_round_trips(monkeypatch):
    """The layout int4.unpack_codes assumes is the one torch's packer writes (rows padded to 64),
    and packing in row chunks gives the bytes of packing at once."""
    rng = np.random.default_rng(2)
    codes = rng.integers(0, 16, (200, 96), dtype=np.uint8)
    zeros = np.zeros((200, 3), np.float32)
    packed, sz, rows = int4.pack([int4.Plane(codes, zeros, zeros)], 200)
    assert rows == 200 and sz.shape == (3, 256, 2)
    assert torch.equal(int4.unpack_codes(packed, 96)[:200], torch.from_numpy(codes))
    assert int4.HALF in (32, 16)  # torch's layout on this CPU (AVX-512 or AVX2) is one pack() writes
    padded = np.concatenate([codes, np.full((56, 96), 8, np.uint8)])
    torch_packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(torch.from_numpy(padded).to(torch.int32), 1)
    assert torch.equal(packed, torch_packed)  # the bytes of torch's own packer, which its kernel reads
    monkeypatch.setattr(int4, "PACK_ROWS", 64)
    assert torch.equal(int4.pack([int4.Plane(codes, zeros, zeros)], 200)[0], packed)
    # planes whose row counts are not multiples of 64 (fused parts) pack as their concatenation
    pieces = [int4.Plane(codes[a:b], zeros[a:b], zeros[a:b]) for a, b in ((0, 10), (10, 75), (75, 139), (139, 200))]
    assert torch.equal(int4.pack(pieces, 200)[0], packed)
    with pytest.raises(ValueError, match="expected 201"):
        int4.pack([int4.Plane(codes, zeros, zeros)], 201)


@pytest.mark.parametrize("half", [32, 16], ids=["avx512-layout", "avx2-layout"])
def test_both_packed_layouts_read_back_what_was_packed(monkeypatch, half):
    """Whichever layout torch's kernel has on the CPU at hand (``int4.HALF``), the codes packed
    read back row by row and in blocks, and the GEMM operand is the planes' weights."""
    monkeypatch.setattr(int4, "HALF", half)
    rng = np.random.default_rng(5)
    n, k = 128, 64
    codes = rng.integers(0, 16, (n, k), dtype=np.uint8)
    s = rng.uniform(0.5, 2.0, (n, k // 32)).astype(np.float32).astype(np.float64)
    z = rng.uniform(-1.0, 1.0, (n, k // 32)).astype(np.float32).astype(np.float64)
    packed, sz, _ = int4.pack([int4.Plane(codes, s, z)], n)
    v = codes.reshape(-1, 2, half, k)  # the layout: byte [b, k, j] = rows 2Hb + j (low), 2Hb + H + j (high)
    assert np.array_equal(packed.numpy(), (v[:, 0] | (v[:, 1] << 4)).transpose(0, 2, 1).reshape(n, k // 2))
    assert torch.equal(int4.unpack_codes(packed, k), torch.from_numpy(codes))
    rows = torch.tensor([0, 15, 16, 31, 32, 63, 64, 100, 127])
    assert torch.equal(int4.gather_codes(packed, k, rows), torch.from_numpy(codes)[rows])
    w = int4.dequantize(packed, sz, k, torch.float32)
    assert torch.equal(int4.dequantize_t(packed, sz, k, 0, 2).float(), w.to(torch.bfloat16).float().t())


def test_bf16_rounding_is_torchs():
    rng = np.random.default_rng(5)
    x = np.concatenate([
        rng.standard_normal(10000) * 10.0 ** rng.integers(-30, 30, 10000),
        # float32 values halfway between two bf16 values (ties to even), and around them
        (np.arange(-512, 512, dtype=np.int64) * 0x10000 + 0x3F808000).astype(np.uint32).view(np.float32),
        [0.0, -0.0, 1.0, 3.0e38, -3.0e38, 1e-45],
    ]).astype(np.float64)
    x = np.concatenate([x, np.nextafter(x, np.inf), np.nextafter(x, -np.inf)])
    expect = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(int4.bf16_bits(x), expect)


def test_groups_decode_in_row_chunks(monkeypatch):
    import kvserve.model.quant.groups as G

    raw = random_blocks(Q.Q5_K, 40, 512, seed=9)
    whole = G.to_groups(raw, Q.Q5_K, (40, 512))
    monkeypatch.setattr(G, "ROW_CHUNK", 7)
    part = G.to_groups(raw, Q.Q5_K, (40, 512))
    assert all(np.array_equal(a, b) for a, b in zip(whole[:3], part[:3]))


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q8_0], ids=lambda q: q.name)
def test_quant_linear_matches_its_weights_on_both_paths(qtype):
    n, k = 96, 256
    raw = random_blocks(qtype, n, k, seed=3)
    mod = QuantLinear([to_groups(raw, qtype, (n, k))])
    ref = torch.from_numpy(np_dequantize(raw, qtype))
    w = mod.dequantized()
    # the only rounding: per-group scale and offset to bf16 (relative 2^-9 of the group's range)
    assert ((w - ref).abs() <= ref.abs().amax(1, keepdim=True) * 2**-7).all()
    for m in (1, GEMV_MAX_ROWS + 5):  # int4 kernel; dequantize + GEMM
        x = torch.randn(m, k)
        y = mod(x)
        expect = F.linear(x.bfloat16().float(), w)
        assert y.dtype == torch.float32 and y.shape == (m, n)
        assert ((y - expect).abs() <= expect.abs().amax() * 2e-2).all()


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q4_K, Q.Q5_0, Q.Q8_0], ids=lambda q: q.name)
def test_prefill_dequantization_is_the_kernels_weight_rounded_once(qtype):
    """dequantize_t (planes combined, one row block at a time) = the float32 weight the int4
    kernel applies, rounded to bf16 once: no shared (per-group) rounding that would bias sums."""
    n, k = 192, 256
    raw = random_blocks(qtype, n, k, seed=5)
    mod = QuantLinear([to_groups(raw, qtype, (n, k))])
    assert mod.combined
    w = mod.dequantized()
    hi = n // int4.ROW_BLOCK if mod.n_second else None
    parts = [int4.dequantize_t(mod.packed, mod.scale_zero, k, b, b + 1, None if hi is None else hi + b)
             for b in range(n // int4.ROW_BLOCK)]
    wt = torch.cat(parts, dim=1).t()
    assert wt.shape == (n, k) and torch.equal(wt, w.to(torch.bfloat16))
    x = torch.randn(GEMV_MAX_ROWS + 1, k)
    y = mod(x)  # the dequantize + GEMM path
    expect = F.linear(x.bfloat16().float(), wt.float())
    assert ((y - expect).abs() <= expect.abs().amax() * 2**-7).all()


def test_two_planes_with_offsets_off_the_bf16_grid_keep_the_reference_dequantizer():
    raw = random_blocks(Q.Q5_K, 64, 256, seed=6)
    assert not QuantLinear([to_groups(raw, Q.Q5_K, (64, 256))]).combined


def test_prefill_of_mixed_planes_falls_back_to_the_reference_dequantizer():
    k = 256
    fmts = [(Q.Q4_K, 64), (Q.Q8_0, 32)]
    groups = [to_groups(random_blocks(q, n, k, seed=i), q, (n, k)) for i, (q, n) in enumerate(fmts)]
    fused = QuantLinear(groups)
    assert not fused.combined
    x = torch.randn(GEMV_MAX_ROWS + 1, k)
    sep = torch.cat([QuantLinear([g])(x) for g in groups], dim=-1)
    assert torch.allclose(fused(x), sep, rtol=2e-2, atol=2e-2 * sep.abs().max().item())


def test_fused_parts_of_mixed_formats_equal_separate_modules():
    k = 256
    fmts = [(Q.Q4_K, 64), (Q.Q8_0, 32), (Q.Q4_0, 64)]  # one plane, two planes, one plane
    raws = [random_blocks(q, n, k, seed=i) for i, (q, n) in enumerate(fmts)]
    groups = [to_groups(r, q, (n, k)) for r, (q, n) in zip(raws, fmts)]
    bias = torch.randn(160)
    fused = QuantLinear(groups, bias)
    x = torch.randn(3, k)
    sep = torch.cat([QuantLinear([g])(x) for g in groups], dim=-1) + bias
    assert torch.allclose(fused(x), sep, rtol=1e-2, atol=1e-3 * sep.abs().max().item())
    w = torch.cat([QuantLinear([g]).dequantized() for g in groups])
    assert torch.equal(fused.dequantized(), w)


def test_paths_and_fusion_are_chosen_per_tensor():
    def t(q, n=64, k=64):
        return RawTensor(np.zeros(1, np.uint8), q, (n, k))

    assert [path_of(t(q)) for q in (Q.Q4_K, Q.Q5_0, Q.Q8_0, Q.Q6_K, Q.F16)] == ["int4"] * 3 + ["dense"] * 2
    assert path_of(t(Q.Q4_0, k=48)) == "dense"  # not whole groups of 32
    lin = {"l.attn.q": t(Q.Q5_0), "l.attn.k": t(Q.Q5_0), "l.attn.v": t(Q.Q8_0), "l.attn.o": t(Q.Q4_K),
           "l.mlp.gate": t(Q.Q4_K), "l.mlp.up": t(Q.Q6_K), "l.mlp.down": t(Q.Q6_K)}
    got = dict(fuse_groups(lin))
    assert got["l.attn.qkv"] == ["l.attn.q", "l.attn.k", "l.attn.v"]
    assert got["l.mlp.gate"] == ["l.mlp.gate"] and got["l.mlp.up"] == ["l.mlp.up"]  # int4 + dense: not fused
    assert sum(len(v) for v in got.values()) == len(lin)


def test_dense_fallback_keeps_float32_files_exact():
    w = np.random.default_rng(4).standard_normal((32, 40)).astype(np.float32)
    mod = linear([RawTensor(w, Q.F32, (32, 40))], [None])
    assert isinstance(mod, DenseLinear) and mod.weight.dtype == torch.float32
    x = torch.randn(2, 40)
    assert torch.equal(mod(x), F.linear(x, torch.from_numpy(w)))
    q6 = random_blocks(Q.Q6_K, 8, 256)
    d = linear([RawTensor(q6, Q.Q6_K, (8, 256))], [None])
    assert d.weight.dtype == torch.bfloat16
    assert torch.equal(d.weight, torch.from_numpy(np_dequantize(q6, Q.Q6_K)).bfloat16())


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q5_0, Q.Q6_K, Q.Q4_K, Q.F32], ids=lambda q: q.name)
def test_embedding_rows_are_dequantized_exactly(qtype):
    n, k = 40, 256
    if qtype == Q.F32:
        raw = np.random.default_rng(5).standard_normal((n, k)).astype(np.float32)
    else:
        raw = random_blocks(qtype, n, k, seed=5)
    emb = QuantEmbedding(raw, qtype, n, k)
    ids = torch.tensor([[3, 0, 39], [7, 7, 1]])
    ref = np_dequantize(raw, qtype) if qtype != Q.F32 else raw
    assert torch.equal(emb(ids), torch.from_numpy(ref)[ids])


@pytest.mark.parametrize("qtype", list(GROUPED), ids=lambda q: q.name)
def test_tied_embedding_rows_from_the_head_planes_are_exact(qtype):
    """A tied model's embedding read from the output head's planes plus the file's group scales:
    every row bit for bit the file's dequantized row (as QuantEmbedding gives it), at a small
    fraction of the bytes; rows past a packed block of 64 and both nibbles included."""
    n, k = 200, 256
    raw = random_blocks(qtype, n, k, seed=11)
    head = linear([RawTensor(raw, qtype, (n, k))], [None])
    assert isinstance(head, QuantLinear)
    emb = PlaneEmbedding(head, GGUFGroups.of(raw, qtype, (n, k)))
    ref = torch.from_numpy(np_dequantize(raw, qtype))
    ids = torch.tensor([[0, 31, 32, 63], [64, 127, 199, 5]])
    assert torch.equal(emb(ids), ref[ids])
    assert torch.equal(emb(torch.arange(n)), ref)  # every row
    assert emb.packed.data_ptr() == head.packed.data_ptr()  # shared, not copied
    assert emb.weight_bytes() <= n * (k // 32) * 8 < raw.nbytes // 2


def test_real_quantizer_output_round_trips():
    """Blocks written by gguf's quantizer (not random bytes) take the same exact path."""
    w = np.random.default_rng(6).standard_normal((64, 128)).astype(np.float32)
    for q in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        raw = np_quantize(w, q)
        assert np.array_equal(to_groups(raw, q, w.shape).dequantize(), np_dequantize(raw, q))


def test_file_rows_are_released_once_repacked():
    """The loader's hook: every row of every part is handed back after it is decoded (both
    planes' passes), and the layout is the same as without the hook."""
    k = 256
    parts = [(Q.Q8_0, 100), (Q.Q4_0, 64)]
    raws = [random_blocks(q, n, k, seed=i) for i, (q, n) in enumerate(parts)]
    seen: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
    hooked = [RawTensor(r, q, (n, k), lambda i, j, p=p: seen[p].append((i, j)))
              for p, (r, (q, n)) in enumerate(zip(raws, parts))]
    mod = linear(hooked, [None, None])
    plain = linear([RawTensor(r, q, (n, k)) for r, (q, n) in zip(raws, parts)], [None, None])
    assert torch.equal(mod.packed, plain.packed) and torch.equal(mod.scale_zero, plain.scale_zero)
    for p, (_, n) in enumerate(parts):
        assert sorted({r for i, j in seen[p] for r in range(i, j)}) == list(range(n))
    emb_seen: list[tuple[int, int]] = []
    emb = QuantEmbedding(raws[0], Q.Q8_0, 100, k, lambda i, j: emb_seen.append((i, j)))
    assert np.array_equal(emb.raw.numpy(), raws[0]) and sorted({r for i, j in emb_seen for r in range(i, j)}) == list(range(100))
