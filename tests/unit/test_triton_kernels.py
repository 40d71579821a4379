"""The Triton attention kernels against the torch reference (``attention.paged_attention``,
``rope.apply_rope``) on random shapes: GQA ratios, lengths across page boundaries, sliding
windows, partially filled and full pages, pages in shuffled order.

On a machine without CUDA the kernels run under Triton's interpreter (``TRITON_INTERPRET=1`` is
set before triton is imported); without triton the module is skipped.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")


def _interpreter_index_fix() -> None:
    """Triton 3.6's interpreter turns a scalar into a Python int with ``int(array)``, which
    NumPy >= 2.4 refuses for the 1-element arrays it uses (loop bounds loaded from memory)."""
    from triton.runtime import interpreter

    orig = interpreter._patch_lang_tensor

    def patched(tensor, scope):
        orig(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    if not getattr(orig, "_kvserve_fixed", False):
        patched._kvserve_fixed = True  # type: ignore[attr-defined]
        interpreter._patch_lang_tensor = patched


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreter_index_fix()

from kvserve.model import attention as attn  # noqa: E402
from kvserve.model.backends import triton_kernels as tk  # noqa: E402
from kvserve.model.rope import RopeTables, apply_rope  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPE = torch.bfloat16 if DEV.type == "cuda" else torch.float32
TOL = 2e-2 if DTYPE == torch.bfloat16 else 1e-4
PS = 16


def _setup(seed: int, lengths: list[int], hkv: int, g: int, d: int):
    gen = torch.Generator().manual_seed(seed)
    n_pages = sum(-(-n // PS) for n in lengths) + 3
    perm = torch.randperm(n_pages, generator=gen).tolist()
    tables, i = [], 0
    for n in lengths:
        k = -(-n // PS)
        tables.append(perm[i : i + k])
        i += k
    kc, vc, table = _caches(gen, tables, n_pages * PS, hkv, d)
    return gen, tables, kc, vc, table


def _caches(gen: torch.Generator, tables: list[list[int]], rows: int, hkv: int, d: int):
    """Random K and V caches of ``rows`` rows and the int32 page table of ``tables`` (a spare
    column past the longest)."""
    kc = torch.randn(rows, hkv, d, generator=gen).to(DEV, DTYPE)
    vc = torch.randn(rows, hkv, d, generator=gen).to(DEV, DTYPE)
    width = max(len(t) for t in tables) + 1
    table = torch.zeros(len(tables), width, dtype=torch.int32)
    for r, t in enumerate(tables):
        table[r, : len(t)] = torch.tensor(t, dtype=torch.int32)
    return kc, vc, table.to(DEV)


def _i32(x: list[int]) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.int32, device=DEV)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-6)).item()


@pytest.mark.parametrize(
    "seed,lengths,hkv,g,d,window",
    [
        (0, [1, 15, 16, 17], 2, 2, 32, 0),
        (1, [70, 33, 5], 1, 8, 64, 0),
        (2, [100, 48], 4, 1, 32, 20),
        (3, [130, 7, 64], 2, 4, 64, 16),
        (4, [40, 17], 1, 4, 256, 24),  # Gemma 3's head_dim
    ],
)
@pytest.mark.parametrize("num_splits,block_n", [(1, 64), (3, 64), (2, 128)])
def test_decode_matches_reference(seed, lengths, hkv, g, d, window, num_splits, block_n):
    gen, tables, kc, vc, table = _setup(seed, lengths, hkv, g, d)
    h = hkv * g
    b = len(lengths)
    q = torch.randn(b, h, d, generator=gen).to(DEV, DTYPE)
    meta = attn.build_meta([(n - 1, 1, t) for n, t in zip(lengths, tables)], PS, DEV)
    ref = attn.paged_attention(q, kc, vc, meta, window, d**-0.5)
    out = torch.full_like(q, float("nan"))
    ws = tk.DecodeWorkspace(b, h, d, num_splits, DEV)
    tk.decode_attention(q, out, _i32(list(range(b))), kc, vc, table, _i32(list(range(b))), _i32(lengths),
                        ws, PS, d**-0.5, window, block_n=block_n)
    assert not out.isnan().any()
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize(
    "seed,chunks,hkv,g,d,window",
    [
        (0, [(0, 20), (16, 17), (5, 1)], 2, 2, 32, 0),  # (cached prefix, chunk length)
        (1, [(33, 40), (0, 70)], 1, 4, 64, 0),
        (2, [(40, 30), (0, 50)], 2, 1, 32, 24),
        (3, [(20, 40)], 1, 4, 256, 32),  # Gemma 3's head_dim
    ],
)
def test_extend_matches_reference(seed, chunks, hkv, g, d, window):
    lengths = [p + n for p, n in chunks]
    gen, tables, kc, vc, table = _setup(seed, lengths, hkv, g, d)
    h = hkv * g
    t = sum(n for _, n in chunks)
    q = torch.randn(t, h, d, generator=gen).to(DEV, DTYPE)
    meta = attn.build_meta([(p, n, tb) for (p, n), tb in zip(chunks, tables)], PS, DEV)
    ref = attn.paged_attention(q, kc, vc, meta, window, d**-0.5)
    out = torch.full_like(q, float("nan"))
    starts = [sum(n for _, n in chunks[:i]) for i in range(len(chunks))]
    tk.extend_attention(q, out, kc, vc, table, _i32(list(range(len(chunks)))), _i32(starts),
                        _i32([n for _, n in chunks]), _i32(lengths), max(n for _, n in chunks), PS, d**-0.5, window)
    assert not out.isnan().any()
    assert _rel(out, ref) < TOL


@pytest.mark.parametrize("neox,rope_dim", [(False, 32), (True, 32), (False, 16), (True, 16)])
def test_rope_write_matches_reference(neox, rope_dim):
    d, h, hkv = 32, 4, 2
    lengths = [5, 20]
    gen, tables, kc, vc, table = _setup(7, [n + 3 for n in lengths], hkv, h // hkv, d)
    starts = [3, 3]
    t = sum(lengths)
    q = torch.randn(t, h, d, generator=gen).to(DEV, DTYPE)
    k = torch.randn(t, hkv, d, generator=gen).to(DEV, DTYPE)
    v = torch.randn(t, hkv, d, generator=gen).to(DEV, DTYPE)
    pos = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)]).to(DEV)
    rows = torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]).to(DEV, torch.int32)
    rope = RopeTables({(10000.0, 1.0)}, rope_dim, DEV, 64)
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    style = "neox" if neox else "norm"
    ref_q = apply_rope(q, cos[pos], sin[pos], style)
    ref_k = apply_rope(k, cos[pos], sin[pos], style)
    meta = attn.build_meta([(s, n, tb) for s, n, tb in zip(starts, lengths, tables)], PS, DEV)
    kc2, vc2 = kc.clone(), vc.clone()
    kc2.index_copy_(0, meta.write_rows, ref_k)
    vc2.index_copy_(0, meta.write_rows, v)
    out_q = tk.rope_write(q, k, v, kc, vc, cos, sin, pos.to(torch.int32), rows, table, PS, rope_dim, neox)
    assert _rel(out_q, ref_q) < 1e-5 if DTYPE == torch.float32 else _rel(out_q, ref_q) < 1e-2
    assert torch.allclose(kc.float(), kc2.float(), atol=1e-2 if DTYPE != torch.float32 else 1e-5)
    assert torch.equal(vc, vc2)


@pytest.mark.parametrize("shape", [(3, 64), (5, 4, 32), (2, 100)])
def test_rms_norm_kernel_matches_reference(shape):
    from kvserve.model import norm_kernel
    from kvserve.model.layers import RMSNorm

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(*shape, generator=gen).to(DEV, DTYPE)
    norm = RMSNorm(shape[-1], 1e-6).to(DEV)
    norm.weight.data = torch.randn(shape[-1], generator=gen).to(DEV)
    xf = x.float()
    ref = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.float()).to(x.dtype)
    got = norm_kernel.rms_norm(x, norm.weight, 1e-6)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert _rel(got, ref) < (1e-5 if DTYPE == torch.float32 else 1e-2)


@pytest.mark.parametrize("shape", [(3, 64), (2, 100)])
def test_add_rms_norm_kernel_matches_reference(shape):
    from kvserve.model import norm_kernel
    from kvserve.model.layers import RMSNorm

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(*shape, generator=gen).to(DEV, DTYPE)
    r = torch.randn(*shape, generator=gen).to(DEV, DTYPE)
    norm = RMSNorm(shape[-1], 1e-6).to(DEV)
    norm.weight.data = torch.randn(shape[-1], generator=gen).to(DEV)
    s_ref = x + r
    sf = s_ref.float()
    ref = (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.float()).to(x.dtype)
    y, s = norm_kernel.add_rms_norm(x, r, norm.weight, 1e-6)
    assert torch.equal(s, s_ref)  # the sum is rounded exactly as torch's add
    assert _rel(y, ref) < (1e-5 if DTYPE == torch.float32 else 1e-2)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows,n_ff", [(1, 48), (3, 1500)])
def test_act_mul_kernel_matches_reference(act, rows, n_ff):
    import torch.nn.functional as F

    from kvserve.model import norm_kernel

    gen = torch.Generator().manual_seed(7)
    gu = (3 * torch.randn(rows, 2 * n_ff, generator=gen)).to(DEV, DTYPE)
    g, u = gu.split((n_ff, n_ff), dim=-1)
    ref = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")) * u
    got = norm_kernel.act_mul(gu, n_ff, act)
    assert got.shape == (rows, n_ff) and got.dtype == gu.dtype
    assert _rel(got, ref) < (1e-5 if DTYPE == torch.float32 else 1e-2)


def _cascade_setup(seed: int, groups: list[tuple[int, list[int]]], singles: list[int], hkv: int, d: int):
    """Page tables where each group's members share their first ``shared`` pages' ids."""
    gen = torch.Generator().manual_seed(seed)
    need = sum(sp + sum(-(-n // PS) - sp for n in own) for sp, own in groups) + sum(-(-n // PS) for n in singles)
    perm = torch.randperm(need + 3, generator=gen).tolist()
    tables, lengths, i = [], [], 0
    for sp, own in groups:
        prefix = perm[i : i + sp]
        i += sp
        for n in own:
            k = -(-n // PS) - sp
            tables.append(prefix + perm[i : i + k])
            lengths.append(n)
            i += k
    for n in singles:
        k = -(-n // PS)
        tables.append(perm[i : i + k])
        lengths.append(n)
        i += k
    order = torch.randperm(len(tables), generator=gen).tolist()  # members need not be adjacent
    tables, lengths = [tables[j] for j in order], [lengths[j] for j in order]
    kc, vc, table = _caches(gen, tables, (need + 3) * PS, hkv, d)
    return gen, tables, lengths, kc, vc, table


@pytest.mark.parametrize(
    "seed,groups,singles,hkv,g,d,window",
    [
        (0, [(4, [70, 80, 65])], [20], 2, 2, 32, 0),  # (shared pages, member lengths)
        (1, [(5, [81, 96, 150, 97]), (4, [70, 64 + 1])], [5, 33], 1, 8, 64, 0),  # two groups, G 8
        (2, [(6, [100, 120])], [], 2, 4, 32, 40),  # a window hides part of the prefix
        (3, [(4, [65] * 9)], [17], 4, 1, 32, 0),  # nine members of one key each past the prefix
        (4, [(4, [90, 70])], [], 1, 4, 256, 24),  # Gemma 3's head_dim, window inside the own keys
    ],
)
@pytest.mark.parametrize("shared_splits", [1, 3])
def test_cascade_decode_matches_reference(seed, groups, singles, hkv, g, d, window, shared_splits):
    """The shared prefix read once per group and merged by log-sum-exp equals plain decode."""
    gen, tables, lengths, kc, vc, table = _cascade_setup(seed, groups, singles, hkv, d)
    h = hkv * g
    b = len(lengths)
    q = torch.randn(b, h, d, generator=gen).to(DEV, DTYPE)
    meta = attn.build_meta([(n - 1, 1, t) for n, t in zip(lengths, tables)], PS, DEV)
    assert sum(dg.shared_rows is not None for dg in meta.decode) == len(groups)  # the reference cascades too
    ref = attn.paged_attention(q, kc, vc, meta, window, d**-0.5)
    found = attn.cascade_groups([(t, n) for t, n in zip(tables, lengths)], PS)
    assert sorted(len(m) for m, _ in found) == sorted(len(own) for _, own in groups)
    casc = tk.cascade_groups_tensor(found, lengths, DEV)
    ws = tk.DecodeWorkspace(b, h, d, 2, DEV, shared_splits=shared_splits)
    out = torch.full_like(q, float("nan"))
    rows = _i32(list(range(b)))
    tk.decode_attention(q, out, rows, kc, vc, table, rows, _i32(lengths), ws, PS, d**-0.5, window, cascade=casc)
    assert not out.isnan().any()
    assert _rel(out, ref) < TOL
    plain = torch.full_like(q, float("nan"))
    tk.decode_attention(q, plain, rows, kc, vc, table, rows, _i32(lengths), ws, PS, d**-0.5, window)
    assert _rel(out, plain) < TOL


@pytest.mark.parametrize(
    "seed,lengths,hkv,g,d,window,neox,rope_dim",
    [
        (0, [1, 16, 17], 2, 2, 32, 0, False, 32),  # the new key first in a page, last in one
        (1, [70, 33], 1, 8, 64, 0, True, 64),
        (2, [100, 48], 4, 1, 32, 20, False, 16),  # window, partial rotation
        (3, [130, 64], 2, 4, 64, 16, True, 32),
        (4, [40], 1, 4, 256, 24, True, 256),  # Gemma 3's head_dim and a window
        (5, [300, 257], 2, 4, 64, 0, False, 64),  # several blocks a split: the prefetched successor
    ],
)
@pytest.mark.parametrize("num_splits,block_n", [(1, 64), (3, 64), (5, 16)])
@pytest.mark.parametrize("rope", [True, False])
def test_decode_fused_matches_reference(seed, lengths, hkv, g, d, window, neox, rope_dim, num_splits, block_n,
                                        rope):
    """RoPE + KV write + split attention + merge in one launch (or, without rope, split + merge
    after rope_write) = rope_write then the reference attention; the cache gets the same rows;
    the split count is back at zero (a second launch, as a graph replay does, gives the same bits)."""
    gen, tables, kc, vc, table = _setup(seed, lengths, hkv, g, d)
    h = hkv * g
    b = len(lengths)
    q = torch.randn(b, h, d, generator=gen).to(DEV, DTYPE)
    k = torch.randn(b, hkv, d, generator=gen).to(DEV, DTYPE)
    v = torch.randn(b, hkv, d, generator=gen).to(DEV, DTYPE)
    rope = RopeTables({(10000.0, 1.0)}, rope_dim, DEV, max(256, max(lengths)))
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    pos = _i32([n - 1 for n in lengths])
    rows = _i32(list(range(b)))
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q_rot = tk.rope_write(q, k, v, kc_ref, vc_ref, cos, sin, pos, rows, table, PS, rope_dim, neox)
    meta = attn.build_meta([(n - 1, 1, t) for n, t in zip(lengths, tables)], PS, DEV)
    ref = attn.paged_attention(q_rot, kc_ref, vc_ref, meta, window, d**-0.5)
    ws = tk.DecodeWorkspace(b, h, d, num_splits, DEV, n_head_kv=hkv)
    outs = []
    for _ in range(2):
        out = torch.full_like(q, float("nan"))
        if rope:
            tk.decode_fused(q, k, v, out, rows, kc, vc, cos, sin, table, rows, _i32(lengths), ws, PS, d**-0.5,
                            window, rope_dim, neox, block_n=block_n)
        else:
            kc.copy_(kc_ref)
            vc.copy_(vc_ref)
            tk.decode_fused(q_rot, None, None, out, rows, kc, vc, None, None, table, rows, _i32(lengths), ws,
                            PS, d**-0.5, window, block_n=block_n)
        outs.append(out)
        assert int(ws.count.abs().sum()) == 0
    assert torch.equal(kc, kc_ref) and torch.equal(vc, vc_ref)
    assert not outs[0].isnan().any()
    assert _rel(outs[0], ref) < TOL
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("lengths,hkv,g,d,num_splits", [([1, 40], 2, 2, 32, 3), ([70], 1, 8, 64, 2),
                                                         ([130, 17], 2, 4, 128, 5), ([20], 4, 1, 64, 1)])
def test_decode_fused_writes_the_quantized_output(lengths, hkv, g, d, num_splits):
    """With ``quant_out`` the merge also writes ``quantize_x`` of the output [T, H·D] (the codes and
    block scales bit for bit, the sums within float32 rounding of their order); the output
    itself and the cache are those of the launch without it."""
    from kvserve.model.quant import triton_q8 as Q8

    gen, tables, kc, vc, table = _setup(7, lengths, hkv, g, d)
    h, b = hkv * g, len(lengths)
    assert tk.quant_fits(h, hkv, d)
    q = torch.randn(b, h, d, generator=gen).to(DEV, DTYPE)
    k = torch.randn(b, hkv, d, generator=gen).to(DEV, DTYPE)
    v = torch.randn(b, hkv, d, generator=gen).to(DEV, DTYPE)
    rope = RopeTables({(10000.0, 1.0)}, d, DEV, max(256, max(lengths)))
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    rows = _i32(list(range(b)))
    ws = tk.DecodeWorkspace(b, h, d, num_splits, DEV, n_head_kv=hkv)
    kc0, vc0 = kc.clone(), vc.clone()
    plain = torch.full_like(q, float("nan"))
    tk.decode_fused(q, k, v, plain, rows, kc, vc, cos, sin, table, rows, _i32(lengths), ws, PS, d**-0.5, 0, d)
    kc1, vc1 = kc.clone(), vc.clone()
    kc.copy_(kc0)
    vc.copy_(vc0)
    sink = Q8.QuantX(torch.zeros(b, h * d // 4, dtype=torch.int32, device=DEV),
                     torch.full((b, h * d // 32), float("nan"), device=DEV),
                     torch.full((b, h * d // 16), float("nan"), device=DEV))
    out = torch.full_like(q, float("nan"))
    tk.decode_fused(q, k, v, out, rows, kc, vc, cos, sin, table, rows, _i32(lengths), ws, PS, d**-0.5, 0, d,
                    quant_out=sink)
    assert torch.equal(out, plain) and torch.equal(kc, kc1) and torch.equal(vc, vc1)
    expect = Q8.quantize_x(out.reshape(b, h * d))
    assert torch.equal(sink.q, expect.q) and torch.equal(sink.d, expect.d)
    assert torch.allclose(sink.s, expect.s, rtol=1e-6, atol=1e-6)
    assert int(ws.count.abs().sum()) == 0
    assert not tk.quant_fits(12, 4, 64) and not tk.quant_fits(8, 2, 96)  # 3 heads a group; head_dim 96


@pytest.mark.skipif(not (DEV.type == "cuda" and tk.pdl_supported(DEV)), reason="PDL needs compiled kernels on sm90+")
@pytest.mark.parametrize("d,block_n,num_splits", [(64, 64, 32), (64, 128, 16), (128, 64, 16), (128, 32, 8)])
def test_decode_fused_pdl_in_a_graph(d, block_n, num_splits):
    """The one-launch kernel as a programmatic dependent launch after the projection that makes
    its q/k/v, captured in a CUDA graph and replayed over several layers' caches: the same
    attention and cache rows as rope_write + decode_attention, the same bits on every replay."""
    hkv, g, lengths, layers = 8, 4, [2048], 3
    h = hkv * g
    gen, tables, kc0, vc0, table = _setup(7, lengths, hkv, g, d)
    caches = [(kc0.clone(), vc0.clone()) for _ in range(layers)]
    refs = [(kc0.clone(), vc0.clone()) for _ in range(layers)]
    w = (torch.randn(256, (h + 2 * hkv) * d, generator=gen) * 0.1).to(DEV, DTYPE)
    x = torch.randn(1, 256, generator=gen).to(DEV, DTYPE)
    rope = RopeTables({(10000.0, 1.0)}, d, DEV, 4096)
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    lens, rows = _i32(lengths), _i32([0])
    ws = tk.DecodeWorkspace(1, h, d, num_splits, DEV, n_head_kv=hkv)
    ws_ref = tk.DecodeWorkspace(1, h, d, num_splits, DEV)
    outs = [torch.empty(1, h, d, device=DEV, dtype=DTYPE) for _ in range(layers)]

    def step() -> None:
        for li in range(layers):
            qkv = (x * (li + 1)) @ w  # the kernel before: writes q, k, v
            q, k, v = qkv[:, : h * d].view(1, h, d), qkv[:, h * d : (h + hkv) * d].view(1, hkv, d), \
                qkv[:, (h + hkv) * d :].view(1, hkv, d)
            tk.decode_fused(q, k, v, outs[li], rows, *caches[li], cos, sin, table, rows, lens, ws, PS, d**-0.5, 0,
                            d, False, block_n=block_n, pdl=True)

    want = []
    for li in range(layers):
        qkv = (x * (li + 1)) @ w
        q, k, v = qkv[:, : h * d].view(1, h, d), qkv[:, h * d : (h + hkv) * d].view(1, hkv, d), \
            qkv[:, (h + hkv) * d :].view(1, hkv, d)
        q_rot = tk.rope_write(q, k, v, *refs[li], cos, sin, lens - 1, rows, table, PS, d, False)
        o = torch.empty_like(q_rot)
        tk.decode_attention(q_rot, o, rows, *refs[li], table, rows, lens, ws_ref, PS, d**-0.5, 0)
        want.append(o)
    step()  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    got = []
    for _ in range(3):
        graph.replay()
        torch.cuda.synchronize()
        got.append(torch.stack([o.clone() for o in outs]))
    assert int(ws.count.abs().sum()) == 0
    for li in range(layers):
        assert torch.equal(caches[li][0], refs[li][0]) and torch.equal(caches[li][1], refs[li][1])
        assert _rel(got[0][li], want[li]) < TOL
    assert torch.equal(got[0], got[1]) and torch.equal(got[0], got[2])


@pytest.mark.skipif(not (DEV.type == "cuda" and tk.pdl_supported(DEV)),
                    reason="PDL needs compiled kernels on sm90+")
def test_decode_fused_trigger_before_a_pdl_gemv_in_a_graph():
    """The one-launch kernel letting the output projection start early (``trigger``): the dense
    GEMV after it, a programmatic dependent launch that loads its weights before it waits,
    captured with it in a CUDA graph over three layers and replayed on fresh inputs: the same
    projections and cache rows, bit for bit, as both kernels launched plainly."""
    from kvserve.model import dense_gemv as D

    hkv, g, d, lengths, layers = 8, 4, 64, [2048], 3
    h = hkv * g
    gen, tables, kc0, vc0, table = _setup(9, lengths, hkv, g, d)
    w = (torch.randn(256, (h + 2 * hkv) * d, generator=gen) * 0.1).to(DEV, DTYPE)
    wo = [(torch.randn(256, h * d, generator=gen) * 0.05).to(DEV, DTYPE) for _ in range(layers)]
    rope = RopeTables({(10000.0, 1.0)}, d, DEV, 4096)
    cos, sin = rope.cos[(10000.0, 1.0)], rope.sin[(10000.0, 1.0)]
    lens, rows = _i32(lengths), _i32([0])
    ws = tk.DecodeWorkspace(1, h, d, 32, DEV, n_head_kv=hkv)
    cfg = D.Config(16, 256, 4, 8)
    assert D.split_of(256, h * d, cfg, DEV)[0] > 1

    def step(x, caches, fast):
        ys = []
        for li in range(layers):
            qkv = (x * (li + 1)) @ w
            q, k, v = qkv[:, : h * d].view(1, h, d), qkv[:, h * d : (h + hkv) * d].view(1, hkv, d), \
                qkv[:, (h + hkv) * d :].view(1, hkv, d)
            o = torch.empty(1, h, d, device=DEV, dtype=DTYPE)
            tk.decode_fused(q, k, v, o, rows, *caches[li], cos, sin, table, rows, lens, ws, PS, d**-0.5, 0, d,
                            False, trigger=fast)
            ys.append(D.gemv(o.view(1, h * d), wo[li], cfg, pdl=fast)[0])
        return torch.stack(ys)

    fresh = lambda: [(kc0.clone(), vc0.clone()) for _ in range(layers)]  # noqa: E731
    xs = [torch.randn(1, 256, generator=gen).to(DEV, DTYPE) for _ in range(3)]
    want = []
    for x in xs:
        c = fresh()
        want.append((step(x, c, False), c))
    sx, caches = xs[0].clone(), fresh()
    step(sx, caches, True)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ys = step(sx, caches, True)
    for x, (y_ref, c_ref) in zip(xs[::-1], want[::-1]):
        sx.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(ys, y_ref)
        for (kc, vc), (kr, vr) in zip(caches, c_ref):
            assert torch.equal(kc, kr) and torch.equal(vc, vr)
    assert int(ws.count.abs().sum()) == 0
