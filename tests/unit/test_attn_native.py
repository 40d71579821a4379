"""The native CPU attention kernel (``model/attn_native.py``, ``attn_cpu.c``) against a numpy
reference of the same arithmetic (llama.cpp's one-row flash attention; for head sizes >= 128 with a
float16 cache, the float16 accumulation of its AVX512-FP16 build), bit for bit: GQA ratios,
head sizes (the AVX-512 and the scalar functions), lengths across page boundaries, scattered pages,
sliding windows, float16 and float32 KV, several sequences in one call; the instruction sets and
1–3 threads give the same bits; a row's output is the same whatever batch it is computed in; the
kernel stays within float16 accumulation error of float64 SDPA; in the model, it is what the CPU
backend runs and its logits stay close to the torch path's."""

from __future__ import annotations

import ctypes
import ctypes.util

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kvserve.model import attn_native

pytestmark = pytest.mark.skipif(not attn_native.available(), reason="native attention kernel not built")

_libm = ctypes.CDLL(ctypes.util.find_library("m"))
_libm.expf.restype = ctypes.c_float
_libm.expf.argtypes = [ctypes.c_float]
f32 = np.float32


def _expf(x: np.float32) -> np.float32:
    return f32(_libm.expf(float(x)))  # the C library's expf, as the kernel (and llama.cpp) call it


def _fma(a, b, c):
    """float32 fma through float64 (the products of these operands are exact in float64)."""
    return (np.asarray(a, np.float64) * np.asarray(b, np.float64) + np.asarray(c, np.float64)).astype(f32)


def _dot(q: np.ndarray, k: np.ndarray) -> np.float32:
    """ggml_vec_dot_f16/f32 on AVX-512: 4 accumulators of 16 lanes over steps of 64, fused
    multiply-adds, (a0+a2)+(a1+a3), the lanes in _mm512_reduce_add_ps's tree; leftovers in double."""
    d = q.shape[0]
    np_ = d & ~63
    a = np.zeros((4, 16), f32)
    for i in range(0, np_, 64):
        a = _fma(q[i : i + 64].reshape(4, 16), k[i : i + 64].reshape(4, 16), a)
    x = (a[0] + a[2]) + (a[1] + a[3])
    t3 = x[8:] + x[:8]
    t6 = t3[4:] + t3[:4]
    r = (t6[0] + t6[2]) + (t6[1] + t6[3])
    if np_ < d:
        s = np.float64(r)
        for j in range(np_, d):
            s += np.float64(q[j] * k[j])
        r = f32(s)
    return f32(r)


def reference(q, kv, seqs, page_size, window, scale):
    """q [T, H, D] float32, kv [2, rows, Hkv, D]; seqs [(start, n, table)] in batch order."""
    t_all, h_all, d = q.shape
    f16 = kv.dtype == torch.float16
    kn, vn = kv[0].float().numpy(), kv[1].float().numpy()
    qn = (q.half().float() if f16 else q).numpy()
    out = np.zeros((t_all, h_all, d), f32)
    g = h_all // kv.shape[2]
    r16 = (lambda x: x.astype(np.float16).astype(f32)) if f16 else (lambda x: x)
    n16 = d & ~127 if f16 and d >= 128 else 0  # llama.cpp's AVX512-FP16 build: float16 accumulation
    t = 0
    for start, n, table in seqs:
        for i in range(n):
            pos = start + i
            lo = max(0, pos + 1 - window) if window > 0 else 0
            for h in range(h_all):
                m, s_sum = f32(-np.inf), f32(0)
                acc = np.zeros(d, f32)
                for p in range(lo, pos + 1):
                    row = table[p // page_size] * page_size + p % page_size
                    s = f32(_dot(qn[t, h], kn[row, h // g]) * f32(scale))
                    ms, vs = f32(1), f32(1)
                    if s > m:
                        ms = _expf(f32(m - s))
                        m = s
                        acc = np.concatenate([r16(acc[:n16] * f32(np.float16(ms))), r16(acc[n16:] * ms)])
                    else:
                        vs = _expf(f32(s - m))
                    v = vn[row, h // g]
                    # float16 arithmetic for the first n16: v·f16(vs) + acc rounded once (float64 holds it exactly)
                    a16 = (v[:n16].astype(np.float64) * np.float64(np.float16(vs)) + acc[:n16]).astype(np.float16)
                    acc = np.concatenate([a16.astype(f32), r16(_fma(v[n16:], vs, acc[n16:]))])
                    s_sum = _fma(s_sum, ms, vs)
                inv = f32(0) if s_sum == 0 else f32(f32(1) / s_sum)
                out[t, h] = acc * inv
            t += 1
    return torch.from_numpy(out)


def _case(seed, h, hkv, d, seqs_shape, page_size, kv_dtype, scattered=True):
    g = torch.Generator().manual_seed(seed)
    n_pages = 2 + sum(-(-(s + n) // page_size) for s, n in seqs_shape)
    perm = torch.randperm(n_pages, generator=g).tolist() if scattered else list(range(n_pages))
    seqs, used = [], 0
    for s, n in seqs_shape:
        k = -(-(s + n) // page_size)
        seqs.append((s, n, perm[used : used + k]))
        used += k
    kv = torch.randn(2, n_pages * page_size, hkv, d, generator=g).to(kv_dtype)
    t = sum(n for _, n in seqs_shape)
    q = torch.randn(t, h, d, generator=g) * 1.5
    return q, kv, seqs


@pytest.mark.parametrize("kv_dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    "h,hkv,d,seqs_shape,window",
    [
        (6, 2, 64, [(0, 7)], 0),  # a prompt, GQA 3
        (4, 4, 64, [(13, 4), (20, 1), (3, 1)], 0),  # a cached prefix + chunk, two decodes, MHA
        (8, 2, 128, [(30, 3)], 0),  # two steps of 64 per dot; float16 accumulation arithmetic
        (4, 1, 256, [(0, 5), (40, 1)], 0),  # Gemma 3's head size
        (4, 1, 64, [(5, 6), (17, 1)], 7),  # sliding window
        (2, 1, 48, [(9, 3)], 0),  # not a multiple of 64: the scalar functions, leftovers in double
    ],
)
def test_matches_reference_bit_for_bit(kv_dtype, h, hkv, d, seqs_shape, window):
    ps = 8
    q, kv, seqs = _case(0, h, hkv, d, seqs_shape, ps, kv_dtype)
    scale = d**-0.5
    want = reference(q, kv, seqs, ps, window, scale)
    keys = attn_native.NativeKeys(seqs, ps)
    got = attn_native.attend(q, kv, keys, window, scale)
    assert torch.equal(got, want), (got - want).abs().max()


@pytest.mark.parametrize("h,hkv,d", [(9, 3, 64), (4, 1, 256)])
def test_isas_and_threads_give_the_same_bits(h, hkv, d):
    for kv_dtype in (torch.float16, torch.float32):
        q, kv, seqs = _case(1, h, hkv, d, [(0, 70), (200, 1), (37, 5)], 16, kv_dtype)  # enough work for threads
        keys = attn_native.NativeKeys(seqs, 16)
        outs = [attn_native.attend(q, kv, keys, 0, d**-0.5, threads=t, isa=i) for t in (1, 2, 3) for i in (2, 1, 0)]
        for o in outs[1:]:
            assert torch.equal(o, outs[0])
        outs = [attn_native.attend(q, kv, keys, 24, d**-0.5, threads=t) for t in (1, 3)]
        assert torch.equal(outs[0], outs[1])


def test_a_row_is_the_same_in_every_batch():
    """One sequence's rows 40..59 as one prefill chunk, as a chunk after a cached prefix, one at a
    time as decode rows beside other sequences: the same bits."""
    ps = 16
    q_all, kv, seqs = _case(2, 9, 3, 64, [(0, 60), (0, 90)], ps, torch.float16)
    table, other = seqs[0][2], seqs[1][2]
    scale = 0.125
    whole = attn_native.attend(q_all[:60], kv, attn_native.NativeKeys([(0, 60, table)], ps), 0, scale)
    part = attn_native.attend(q_all[40:60], kv, attn_native.NativeKeys([(40, 20, table)], ps), 0, scale)
    assert torch.equal(part, whole[40:60])
    for p in range(40, 60, 7):
        q = torch.cat([q_all[60:63], q_all[p : p + 1], q_all[63:64]])
        batch = [(80, 3, other), (p, 1, table), (10, 1, other)]
        o = attn_native.attend(q, kv, attn_native.NativeKeys(batch, ps), 0, scale)
        assert torch.equal(o[3], whole[p])
    for w in (5, 33):
        whole = attn_native.attend(q_all[:60], kv, attn_native.NativeKeys([(0, 60, table)], ps), w, scale)
        part = attn_native.attend(q_all[40:60], kv, attn_native.NativeKeys([(40, 20, table)], ps), w, scale)
        assert torch.equal(part, whole[40:60])


@pytest.mark.parametrize("kv_dtype,tol", [(torch.float16, 1e-2), (torch.float32, 2e-5)])
def test_close_to_float64_sdpa(kv_dtype, tol):
    ps = 16
    q, kv, seqs = _case(3, 8, 2, 64, [(100, 30)], ps, kv_dtype)
    start, n, table = seqs[0]
    got = attn_native.attend(q, kv, attn_native.NativeKeys(seqs, ps), 0, 0.125)
    rows = torch.tensor([table[p // ps] * ps + p % ps for p in range(start + n)])
    k = kv[0][rows].double().repeat_interleave(4, 1).transpose(0, 1)
    v = kv[1][rows].double().repeat_interleave(4, 1).transpose(0, 1)
    mask = torch.arange(start + n)[None, :] <= torch.arange(start, start + n)[:, None]
    want = F.scaled_dot_product_attention(q.double().transpose(0, 1), k, v, attn_mask=mask, scale=0.125)
    torch.testing.assert_close(got.double(), want.transpose(0, 1), rtol=0, atol=tol)


def test_model_runs_the_kernel_close_to_the_torch_path(tmp_path, monkeypatch):
    """A random Llama-shaped model: the CPU backend takes the kernel (one call per layer), its
    logits with float32 weights are close to the torch path's, and (quantized weights, whose native
    kernels are row-independent) a token decoded alone equals the same token in a batch of two
    sequences (the in-place one-token path and the generic one)."""
    from kvserve.model.loader import load_gguf
    from kvserve.model.runner import ModelRunner
    from kvserve.model.synth import SynthSpec, write_random_gguf
    from kvserve.plan import Plan, SeqChunk

    monkeypatch.setenv("KVSERVE_ATTN_BACKEND", "torch")
    models = {}
    for qtype in ("Q8_0", "F32"):  # the native linear kernels (row-independent too); dense float32
        spec = SynthSpec(arch="llama", n_layer=2, head_dim=64, n_embd=256, n_head=4, n_head_kv=2, n_vocab=300,
                         qtype=qtype)
        models[qtype] = load_gguf(write_random_gguf(str(tmp_path / f"{qtype}.gguf"), spec), device=torch.device("cpu"))
    calls = []
    orig = attn_native._attn.attend  # the kernel itself (cpu_forward calls it without the wrapper)
    monkeypatch.setattr(attn_native._attn, "attend", lambda *a, **k: calls.append(1) or orig(*a, **k))
    toks = torch.randint(0, spec.n_vocab, (20,), generator=torch.Generator().manual_seed(1)).tolist()
    table = (3, 0, 5)

    def run(native: bool, batch: bool, qtype: str = "Q8_0") -> list[torch.Tensor]:
        r = ModelRunner(models[qtype], n_pages=12, page_size=8, kv_dtype=torch.float16)
        r.backend.native = native
        out = [r.run(Plan((SeqChunk(0, tuple(toks[:12]), 0, table, "last"),))).logits[0]]
        if batch:
            r.run(Plan((SeqChunk(1, tuple(toks[:5]), 0, (7, 8), "last"),)))
        for p in range(12, 20):
            chunks = [SeqChunk(0, (toks[p],), p, table, "last")]
            if batch:
                chunks.append(SeqChunk(1, (toks[p - 7],), p - 7, (7, 8), "last"))
            out.append(r.run(Plan(tuple(chunks))).logits[0])
        return out

    alone = run(True, False)
    assert len(calls) == 9 * spec.n_layer
    batched = run(True, True)
    for a, b in zip(alone, batched):
        assert torch.equal(a, b)
    # float32 weights: the difference is attention's float16 accumulation alone
    for a, b in zip(run(True, False, "F32"), run(False, False, "F32")):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-3 * float(b.abs().max()))
