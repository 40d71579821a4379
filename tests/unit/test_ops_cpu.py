"""The native CPU layer ops (``model.ops_cpu``) against torch references of their arithmetic:
random shapes, one row or many, 1–3 threads bit-identical, every row independent of the others,
every instruction-set level of the SiLU loop the same bits; and a whole model on them against
the torch layer code."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvserve.model import ops_cpu
from kvserve.model.rope import RopeTables, apply_rope

from . import ggml_numpy as G

pytestmark = pytest.mark.skipif(ops_cpu._ops_cpu is None, reason="native ops not built")


def _threads(fn, *args, **kw):
    """fn's result with 1, 2 and 3 threads (asserted equal); restores the thread count."""
    n = torch.get_num_threads()
    outs = []
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(fn(*args, **kw))
    finally:
        torch.set_num_threads(n)
    for o in outs[1:]:
        pair = (outs[0], o) if isinstance(o, tuple) else ((outs[0],), (o,))
        for a, b in zip(*pair):
            assert torch.equal(a, b)
    return outs[0]


def _norm_ref(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """ggml's rms_norm·w: squares rounded to float32 summed in float64, mean and scale in float32."""
    sq = (h * h).double().sum(-1, keepdim=True)
    mean = (sq / h.shape[-1]).float()
    # sqrtf and the division correctly rounded (in float64, then rounded: exact for float32
    # operands; torch's vectorized float32 sqrt is not always correctly rounded)
    root = torch.sqrt((mean + torch.tensor(eps, dtype=torch.float32)).double()).float()
    scale = (1.0 / root.double()).float()
    return (h * scale) * w


@pytest.mark.parametrize("n,eps", [(576, 1e-5), (896, 1e-6), (64, 1e-6), (37, 1e-8), (640, 1e-6)])
def test_rms_norm_matches_the_float64_sum_reference(n, eps):
    g = torch.Generator().manual_seed(n)
    w = torch.rand(n, generator=g) + 0.5
    for t in (1, 5, 70):
        x, r = torch.randn(t, n, generator=g) * 3, torch.randn(t, n, generator=g)
        want_h = x + r
        want = _norm_ref(want_h, w, eps)

        def run():
            y, h = ops_cpu.rms_norm(x, w, eps, r)
            assert h is not r
            return y, h

        r0 = r.clone()
        y, h = _threads(run)
        assert torch.equal(h, want_h)  # the residual add is a plain float32 add
        assert torch.equal(r, r0)  # into a new tensor: the caller's residual is left as it was
        # the float64 sums' orders differ (torch's and the kernel's), which could move the float32
        # mean by its last bit in rare cases (not in these)
        assert torch.equal(y, want)
        # one row at a time: the same bits as all rows together
        for i in (0, t - 1):
            assert torch.equal(ops_cpu.rms_norm(want_h[i : i + 1], w, eps), y[i : i + 1])
        # no residual; a strided input (copied first) gives the same bits
        y2 = _threads(ops_cpu.rms_norm, want_h, w, eps)
        assert torch.equal(y2, y)
        wide = torch.cat([want_h, x], 1)[:, :n]
        assert torch.equal(ops_cpu.rms_norm(wide, w, eps), y)
    small = torch.randn(3, 4, n, generator=g) * 1e-4  # eps matters; 3-D input
    assert torch.equal(ops_cpu.rms_norm(small, w, eps), _norm_ref(small, w, eps))


def test_exp_is_ggml_v_expf_bit_for_bit():
    x = np.concatenate([np.linspace(-110, 95, 400_001), np.random.default_rng(0).standard_normal(50_000) * 10,
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 88.8, -104.5, 1e-30]]).astype(np.float32)
    y = ops_cpu.exp(torch.from_numpy(x)).numpy()
    assert np.array_equal(y.view(np.int32), G.v_expf(x).view(np.int32))
    assert y[-8] == 1 and y[-7] == 1 and np.isinf(y[-6]) and y[-5] == 0 and np.isnan(y[-4])
    ref = np.exp(x[:400_001].astype(np.float64))  # and it is an exp: within 2.5 ulp where normal
    normal = (ref > 1.1754944e-38) & (ref < 3.4e38)
    assert (np.abs(y[:400_001][normal] - ref[normal]) / np.spacing(ref[normal].astype(np.float32))).max() < 2.5


def _gelu_table_ref(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """ggml's f16-table GELU-tanh · u: gelu of the f16-rounded input, rounded to f16."""
    x = g.half().float()  # ggml's gelu_f32 in float32 (its 1 + tanh cancels for x < -3: so does this)
    t = (0.5 * x * (1 + torch.tanh(0.7978845608028654 * x * (1 + 0.044715 * x * x)))).half().float()
    t = torch.where(g >= 10, g, t)
    return torch.where(g <= -10, torch.zeros_like(g), t * u)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n", [1536, 100, 7])
def test_act_mul_fused_and_separate(act, n):
    g = torch.Generator().manual_seed(n)
    for m in (1, 6, 33):
        gu = torch.randn(m, 2 * n, generator=g) * 4
        gu[0, :3] = torch.tensor([-12.0, 11.0, 0.0])[: min(3, n)]
        y = _threads(ops_cpu.act_mul, gu, n, act)
        assert y.shape == (m, n)
        if act == "silu":  # ggml_vec_swiglu_f32 bit for bit
            assert np.array_equal(y.numpy(), G.swiglu(gu[:, :n].numpy(), gu[:, n:].numpy()))
        else:  # torch's tanh and libm's tanhf may differ by an ulp: now and then an f16 step
            want = _gelu_table_ref(gu[:, :n], gu[:, n:])
            assert (y == want).float().mean() > 0.99
            torch.testing.assert_close(y, want, rtol=2e-3, atol=1e-6)
        g_, u_ = gu[:, :n].contiguous(), gu[:, n:].contiguous()
        assert torch.equal(ops_cpu.act_mul(g_, n, act, u_), y)  # separate gate and up outputs
        assert torch.equal(ops_cpu.act_mul(gu[m - 1 :], n, act), y[m - 1 :])  # rows independent


def test_silu_instruction_sets_are_bit_identical_and_ggml_s():
    g = torch.Generator().manual_seed(3)
    gu = torch.randn(9, 2 * 1000 + 6, generator=g) * 6
    best = ops_cpu.set_isa(-1)
    try:
        outs = []
        for level in range(best + 1):
            assert ops_cpu.set_isa(level) == level
            outs.append(ops_cpu.act_mul(gu, 1003, "silu"))
        assert all(torch.equal(outs[0], o) for o in outs[1:])
        assert np.array_equal(outs[0].numpy(), G.swiglu(gu[:, :1003].numpy(), gu[:, 1003:2006].numpy()))
    finally:
        ops_cpu.set_isa(-1)


def _rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
              style: str) -> torch.Tensor:
    """ggml's rotate_pairs (numpy model); the torch reference gives the same bits"""
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)
    rd = 2 * cos.shape[-1]
    out = torch.from_numpy(G.rope(x.numpy(), c.numpy(), s.numpy(), style == "neox"))
    torch_out = x.clone()
    torch_out[..., :rd] = apply_rope(x[..., :rd].contiguous(), c, s, style)
    assert torch.equal(torch_out, out)
    return out


@pytest.mark.parametrize("rd,base,scale", [(64, 10000.0, 1.0), (64, 100000.0, 1.0), (16, 1e6, 4.0), (128, 5e5, 1.0)])
def test_rope_tables_are_ggml_s_rope_cache(rd, base, scale):
    c, s = ops_cpu.rope_table(5000, rd, base, 1.0 / scale)
    pos = np.r_[0:40, 4990:5000, 1234, 777]
    wc, ws = G.rope_cache(pos, rd, base, np.float32(1.0 / scale))
    assert np.array_equal(c.numpy()[pos], wc) and np.array_equal(s.numpy()[pos], ws)
    t = RopeTables({(base, scale)}, rd, torch.device("cpu"), 5000)  # what a model's tables hold
    assert torch.equal(t.cos[(base, scale)], c) and torch.equal(t.sin[(base, scale)], s)


@pytest.mark.parametrize("style", ["norm", "neox"])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_kv_matches_the_torch_reference(style, kv_dtype, qk_norm):
    g = torch.Generator().manual_seed(7)
    for h, hkv, d, rd in [(9, 3, 64, 64), (4, 4, 32, 16), (14, 2, 64, 64)]:
        cos, sin = ops_cpu.rope_table(300, rd, 10000.0, 1.0)
        pool = torch.randn(2, 80, hkv, d, generator=g).to(kv_dtype)
        qn, kn = torch.rand(d, generator=g) + 0.5, torch.rand(d, generator=g) + 0.5
        for t in (1, 4, 19):
            qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g) * 2
            pos = torch.randint(0, 300, (t,), generator=g)
            rows = torch.randperm(80, generator=g)[:t]
            x = qkv.view(t, h + 2 * hkv, d)
            q, k, v = x[:, :h], x[:, h : h + hkv], x[:, h + hkv :]
            if qk_norm:
                q, k = _norm_ref(q, qn, 1e-6), _norm_ref(k, kn, 1e-6)
            want_q, want_k = _rope_ref(q, cos, sin, pos, style), _rope_ref(k, cos, sin, pos, style)
            want_pool = pool.clone()
            want_pool[0, rows], want_pool[1, rows] = want_k.to(kv_dtype), v.to(kv_dtype)

            def run():
                p, buf = pool.clone(), qkv.clone()
                out = ops_cpu.rope_kv(buf, h, hkv, d, cos, sin, pos, rows, p, style == "neox",
                                      qn if qk_norm else None, kn if qk_norm else None, 1e-6)
                return out, p

            out, p = _threads(run)
            if qk_norm:  # the norm's float64 sum: a last-bit difference now and then, then rotated
                torch.testing.assert_close(out[:, :h], want_q, rtol=1e-6, atol=1e-6)
                rtol = 1e-6 if kv_dtype == torch.float32 else 1e-2
                torch.testing.assert_close(p.float(), want_pool.float(), rtol=rtol, atol=1e-6)
                # and bit for bit: the native norm, then the reference rotation
                nq = ops_cpu.rms_norm(x[:, :h].contiguous(), qn, 1e-6)
                assert torch.equal(out[:, :h], _rope_ref(nq, cos, sin, pos, style))
            else:
                assert torch.equal(out[:, :h], want_q)
                assert torch.equal(p, want_pool)  # k rotated and v, rounded as torch rounds; other rows kept
            assert torch.equal(out[:, h + hkv :], v)  # v stays in the buffer unchanged


def test_model_on_native_ops_is_close_to_the_torch_layers(tmp_path, monkeypatch):
    """A whole model's logits with the native ops against the torch layer code (quantized and
    dense weights, the archs' norms, RoPE styles, activations and QK-norm)."""
    from kvserve.model.loader import load_gguf
    from kvserve.model.runner import ModelRunner
    from kvserve.model.synth import SynthSpec, write_random_gguf
    from kvserve.plan import Plan, SeqChunk

    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        for qtype in ("F32", "Q8_0"):
            spec = SynthSpec(arch=arch, n_layer=2, head_dim=32, n_embd=128, n_head=4, n_head_kv=2,
                             sliding_window=16 if arch == "gemma3" else 0, n_vocab=300, qtype=qtype)
            path = write_random_gguf(str(tmp_path / f"{arch}-{qtype}.gguf"), spec)
            toks = tuple(torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(1)).tolist())
            outs = []
            for on in (True, False):
                monkeypatch.setattr(ops_cpu, "ENABLED", on)
                runner = ModelRunner(load_gguf(path, device=torch.device("cpu")), n_pages=4, page_size=16,
                                     kv_dtype=torch.float16)
                logits = [runner.run(Plan((SeqChunk(0, toks[:20], 0, (0, 1), "all"),))).logits[0]]
                for p in range(20, 24):  # decode steps after the prefill
                    logits.append(runner.run(Plan((SeqChunk(0, (toks[p],), p, (0, 1), "last"),))).logits[0])
                outs.append(torch.cat(logits))
            got, want = outs
            scale = want.abs().max().item()
            # GELU's f16 table (gemma3) against torch's exact GELU: a few f16 steps in the logits
            tol = (2e-2 if arch == "gemma3" else 1e-4) * scale
            err = (got - want).abs().max().item()
            assert err <= tol, (arch, qtype, err, scale)


def test_kvserve_native_0_keeps_the_torch_layers():
    import os
    import subprocess
    import sys

    code = "from kvserve.model import ops_cpu; print(ops_cpu.ENABLED, ops_cpu.describe())"
    env = dict(os.environ, KVSERVE_NATIVE="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "torch", "(KVSERVE_NATIVE=0)"]
    env["KVSERVE_NATIVE"] = "1"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split()[0] == "True"
