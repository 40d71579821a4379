"""One sequence gives the same logits alone, in mixed batches, in chunks, and from a cached prefix;
rope_shift moves cached keys exactly."""

from __future__ import annotations

import pytest
import torch

from kvserve.plan import KVMove, Plan, SeqChunk
from kvserve.model import ops_cpu
from kvserve.model.loader import load_gguf
from kvserve.model.quant.linear import GEMV_MAX_ROWS
from kvserve.model.rope import apply_rope, apply_rope_full, full_tables, rope_cos_sin
from kvserve.model.runner import ModelRunner
from kvserve.model.synth import SynthSpec, write_random_gguf

TOL = 1e-4  # float32 weights: chunking and batching change only the summation order
# ... which the native ops' GELU (ggml's f16 table: an ulp of its input now and then moves its
# output by an f16 step) grows to ~7e-4 on this Gemma 3
TOL_GELU_TABLE = 2e-3
# Quantized weights: a few rows run the int4 kernel, many rows a dequantize + bf16 GEMM, both
# with bf16 outputs, so two chunkings of one prompt differ by bf16 roundings: a few bf16 ulps of
# the largest logit (a wrong page or position differs by the logits' own scale).
TOL_QUANT = 2**-5  # relative to max |logit|


@pytest.fixture(scope="module", params=["llama", "gemma3", "llama-Q4_0", "gemma3-Q8_0"])
def runner(request, tmp_path_factory):
    arch, _, qtype = request.param.partition("-")
    spec = SynthSpec(arch=arch, n_layer=3, sliding_window=24 if arch == "gemma3" else 0, n_vocab=400,
                     qtype=qtype or "F32")
    path = write_random_gguf(str(tmp_path_factory.mktemp(arch) / "m.gguf"), spec)
    loaded = load_gguf(path)
    assert loaded.weights == "quant"
    r = ModelRunner(loaded, n_pages=256, page_size=16, n_ubatch=4096)
    r.rel_tol = TOL_QUANT if qtype else 0.0  # type: ignore[attr-defined]
    r.abs_tol = TOL_GELU_TABLE if arch == "gemma3" and ops_cpu.ENABLED else TOL  # type: ignore[attr-defined]
    return r


def _close(runner, got: torch.Tensor, ref: torch.Tensor) -> bool:
    tol = runner.rel_tol * ref.abs().max().item() if runner.rel_tol else runner.abs_tol
    return (got - ref).abs().max().item() <= tol


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 390, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _pages(start: int, n_tokens: int) -> tuple[int, ...]:
    return tuple(range(start, start + -(-n_tokens // 16)))


def test_alone_mixed_chunked_and_cached_agree(runner):
    ids = _ids(300, 0)
    pages = _pages(0, 300)
    alone = runner.run(Plan((SeqChunk(0, tuple(ids), 0, pages, "all"),))).logits[0]

    # Chunks of 7 / 64 / 256 tokens, continuing the cached context each time.
    for size in (7, 64, 256):
        pages_c = _pages(40, 300)
        parts = []
        for s in range(0, 300, size):
            chunk = SeqChunk(1, tuple(ids[s : s + size]), s, pages_c, "all")
            parts.append(runner.run(Plan((chunk,))).logits[1])
        assert _close(runner, torch.cat(parts), alone), size

    # Inside a mixed batch of 4: two other prefills and a decode whose context is cached.
    other = _ids(50, 1)
    runner.run(Plan((SeqChunk(7, tuple(other), 0, _pages(100, 60), "none"),)))
    mixed = Plan(
        (
            SeqChunk(5, tuple(_ids(33, 2)), 0, _pages(120, 40), "all"),
            SeqChunk(2, tuple(ids), 0, _pages(140, 300), "all"),
            SeqChunk(7, (5,), 50, _pages(100, 60), "last"),
            SeqChunk(6, tuple(_ids(90, 3)), 0, _pages(170, 90), "last"),
        )
    )
    out = runner.run(mixed).logits
    assert _close(runner, out[2], alone)
    assert set(out) == {5, 2, 7, 6} and out[7].shape[0] == 1

    # From a cached prefix: the first 123 tokens computed by "another request" and copied
    # (copy-on-write of the partial page) into this sequence's pages.
    src = _pages(200, 123)
    runner.run(Plan((SeqChunk(9, tuple(ids[:123]), 0, src, "none"),)))
    dst = src[:7] + _pages(220, 300 - 112)  # 7 full shared pages, private pages after
    mv = KVMove(src[7:], 0, dst[7:], 0, 123 - 112, 0)
    rest = runner.run(Plan((SeqChunk(3, tuple(ids[123:]), 123, dst, "all"),), (mv,))).logits[3]
    assert _close(runner, rest, alone[123:])


def test_rope_shift_equals_recomputation(runner):
    """Layer-0 keys of a token computed at p and shifted by d equal those computed at p + d.
    Both prompts are longer than GEMV_MAX_ROWS, so quantized weights take one path for both."""
    kv = runner.kv
    n, d = GEMV_MAX_ROWS + 2, 37
    ids = _ids(n, 4)
    runner.run(Plan((SeqChunk(0, tuple(ids), 0, _pages(0, n), "none"),)))
    ref_pages, dst_pages = _pages(10, n + d), _pages(30, n + d)
    runner.run(Plan((SeqChunk(1, tuple(_ids(d, 5)) + tuple(ids), 0, ref_pages, "none"),)))
    # Shift tokens at positions [0, n) of their pages by +d into other pages at [d, d + n).
    runner.run(Plan((), (KVMove(_pages(0, n), 0, dst_pages, d, n, d),)))
    rows_shift = kv.rows(dst_pages, d, n)
    rows_ref = kv.rows(ref_pages, d, n)
    assert (kv.k[0][rows_shift] - kv.k[0][rows_ref]).abs().max().item() <= 1e-5
    assert torch.equal(kv.v[0][rows_shift], kv.v[0][rows_ref])


def test_rope_composes_exactly():
    x = torch.randn(64, 4, 32)
    for style in ("norm", "neox"):
        p = torch.arange(1000, 1064)
        a = apply_rope(x, *rope_cos_sin(p, 32, 10000.0, 1.0, torch.float32), style)
        b = apply_rope(x, *rope_cos_sin(p - 300, 32, 10000.0, 1.0, torch.float32), style)
        b = apply_rope(b, *rope_cos_sin(torch.full((64,), 300), 32, 10000.0, 1.0, torch.float32), style)
        assert (a - b).abs().max().item() <= 1e-5


def test_full_rope_is_bit_for_bit_the_reference():
    x = torch.randn(7, 5, 64)
    cos, sin = rope_cos_sin(torch.tensor([0, 3, 99, 1000, 4095, 12345, 77]), 64, 10000.0, 1.0, torch.float32)
    for style in ("norm", "neox"):
        full = apply_rope_full(x, *full_tables(cos, sin, style), style)
        assert torch.equal(full, apply_rope(x, cos, sin, style))


@pytest.mark.parametrize("window", [0, 40])
def test_decode_only_step_equals_the_same_query_in_a_mixed_batch(window):
    """A step of decode queries alone (no row gather, no mask where nothing is hidden) gives what
    the general path gives for the same queries next to a prefill chunk and a longer sequence."""
    import kvserve.model.attention as attn

    gen = torch.Generator().manual_seed(4)
    k = torch.randn(64 * 16, 3, 64, generator=gen)
    v = torch.randn(64 * 16, 3, 64, generator=gen)
    q = torch.randn(6, 9, 64, generator=gen)
    for length in (30, 70):  # within and beyond the window
        one = [(length - 1, 1, list(range(5)))]
        meta = attn.build_meta(one, 16, torch.device("cpu"))
        assert meta.decode[0].whole
        alone = attn.paged_attention(q[:1], k, v, meta, window, 0.125)
        mixed_chunks = one + [(0, 4, list(range(10, 12))), (99, 1, list(range(20, 27)))]
        mixed = attn.build_meta(mixed_chunks, 16, torch.device("cpu"))
        assert not any(d.whole for d in mixed.decode)
        got = attn.paged_attention(q, k, v, mixed, window, 0.125)[:1]
        assert (alone - got).abs().max().item() <= 1e-6


@pytest.mark.parametrize("window", [0, 40, 200])
def test_shared_prefix_decode_equals_padded_decode(window, monkeypatch):
    """Decode queries whose page tables share leading pages read the prefix once (cascade);
    the result equals attending to each sequence's keys separately."""
    import kvserve.model.attention as attn

    gen = torch.Generator().manual_seed(3)
    k = torch.randn(64 * 16, 3, 64, generator=gen)
    v = torch.randn(64 * 16, 3, 64, generator=gen)
    shared = list(range(10))
    tables = [(shared + [20 + i, 40 + i], 10 * 16 + 5 + 3 * i) for i in range(4)]
    tables.append(([50 + j for j in range(11)], 170))  # an unrelated sequence in the same batch
    chunks = [(length - 1, 1, t) for t, length in tables]
    q = torch.randn(len(chunks), 9, 64, generator=gen)
    meta = attn.build_meta(chunks, 16, torch.device("cpu"))
    assert [g.shared_rows is not None for g in meta.decode] == [True, False]
    cascade = attn.paged_attention(q, k, v, meta, window, 0.125)
    monkeypatch.setattr(attn, "CASCADE_MIN_SHARED", 1 << 30)
    plain_meta = attn.build_meta(chunks, 16, torch.device("cpu"))
    assert all(g.shared_rows is None for g in plain_meta.decode)
    plain = attn.paged_attention(q, k, v, plain_meta, window, 0.125)
    assert (cascade - plain).abs().max().item() <= 1e-5


@pytest.mark.parametrize("window", [0, 40])
def test_cascade_reference_in_bf16_with_a_window(window):
    """The torch reference's cascade decode (a shared prefix read once) in bf16, where a window
    masks part of the prefix: the same as the float32 result within bf16 rounding."""
    from kvserve.model import attention as attn

    g = torch.Generator().manual_seed(0)
    ps, hkv, gq, d = 16, 2, 4, 32
    prefix = [0, 1, 2, 3, 4]
    tables = [prefix + [5, 6], prefix + [7, 8], prefix + [9]]
    lengths = [100, 110, 90]
    kc = torch.randn(10 * ps, hkv, d, generator=g)
    vc = torch.randn(10 * ps, hkv, d, generator=g)
    q = torch.randn(3, hkv * gq, d, generator=g)
    meta = attn.build_meta([(n - 1, 1, t) for n, t in zip(lengths, tables)], ps, torch.device("cpu"))
    assert meta.decode[0].shared_rows is not None
    want = attn.paged_attention(q, kc, vc, meta, window, d**-0.5)
    got = attn.paged_attention(q.bfloat16(), kc.bfloat16(), vc.bfloat16(), meta, window, d**-0.5)
    assert got.dtype == torch.bfloat16
    assert ((got.float() - want).abs().max() / want.abs().max()).item() < 2e-2


def test_grouped_plain_copies_match_one_move_at_a_time(tmp_path):
    """``apply_moves`` runs consecutive plain copies as one gather/scatter; chains where a move
    reads or overwrites what an earlier one wrote must still see the order."""
    import random

    from kvserve.model.kv_store import PagedKVStore

    cfg = load_gguf(write_random_gguf(str(tmp_path / "m.gguf"), SynthSpec(arch="llama", n_layer=2))).cfg
    rng = random.Random(3)
    for _ in range(30):
        kv = PagedKVStore(cfg, 12, 4, torch.float32, torch.device("cpu"))
        kv.k.normal_()
        kv.v.normal_()
        ref_k, ref_v = kv.k.clone(), kv.v.clone()
        moves = []
        for _ in range(rng.randrange(1, 6)):
            n = rng.randrange(1, 9)
            src = tuple(rng.sample(range(12), 3))
            dst = tuple(rng.sample(range(12), 3))
            moves.append(KVMove(src, rng.randrange(0, 4), dst, rng.randrange(0, 4), n))
        for mv in moves:  # the reference: each move alone, reads before writes
            s = torch.tensor(kv._host_rows(mv.src_pages, mv.src_start, mv.n_tokens))
            d = torch.tensor(kv._host_rows(mv.dst_pages, mv.dst_start, mv.n_tokens))
            if len(set(d.tolist())) < len(d):
                continue
            ref_k[:, d] = ref_k[:, s].clone()
            ref_v[:, d] = ref_v[:, s].clone()
        moves = [mv for mv in moves
                 if len(set(kv._host_rows(mv.dst_pages, mv.dst_start, mv.n_tokens))) == mv.n_tokens]
        kv.apply_moves(moves)
        assert torch.equal(kv.k, ref_k) and torch.equal(kv.v, ref_v)
