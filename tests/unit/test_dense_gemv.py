"""The dense decode GEMV (``dense_gemv``, Triton) under Triton's interpreter on the CPU (compiled on
a GPU): the plain GEMV, the RMSNorm prologue (with the residual sum it hands on) and the
act(gate)·up prologue against their torch definitions, for 1-5 batch rows, K split or not,
masked edges, bias; the split's counters reset between calls; ``GemvLinear`` equal to
``nn.Linear`` (and to the separate kernels) through every entry point."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are defined
pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("no GPU and the Triton interpreter is off", allow_module_level=True)

from kvserve.model import dense_gemv as D  # noqa: E402
from kvserve.model.layers import RMSNorm, norm_linear  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DT = torch.bfloat16 if DEV.type == "cuda" else torch.float32  # the interpreter's CPU bf16 is slow
# (config, rows): one K slice and several, column blocks past N, K chunks past K
RUNS = [(D.Config(16, 64, 4, 1), 1), (D.Config(8, 32, 2, 64), 2), (D.Config(32, 128, 4, 8), 3),
        (D.Config(16, 32, 1, 16), 4), (D.Config(16, 64, 4, 64), 5), (D.Config(16, 32, 4, 2, 2), 1)]
N, K = 40, 208  # not multiples of any block


def _close(y: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    return bool(((y.float() - ref.float()).abs() <= tol * ref.float().abs().max() + 1e-6).all())


def _tol() -> float:
    return 1e-2 if DT == torch.bfloat16 else 1e-5


@pytest.mark.parametrize("cfg,m", RUNS)
def test_plain_gemv_equals_linear(cfg, m):
    gen = torch.Generator().manual_seed(m)
    w = torch.randn(N, K, generator=gen).to(DEV, DT)
    b = torch.randn(N, generator=gen).to(DEV, DT)
    x = torch.randn(m, K, generator=gen).to(DEV, DT)
    splits, steps = D.split_of(N, K, cfg, DEV)
    for bias in (None, b):
        y, s = D.gemv(x, w, cfg, bias)
        assert s is None and y.shape == (m, N) and y.dtype == DT
        ref = x.double() @ w.double().T + (0 if bias is None else bias.double())
        assert _close(y, ref, _tol()), (cfg, m, splits)
    if DEV.type == "cpu":  # (4 multiprocessors assumed): the runs cover one slice, several, a looping one
        assert (splits > 1 or cfg.programs == 1) and (steps > 1 or cfg.stages == 1)


@pytest.mark.parametrize("cfg,m", RUNS)
def test_norm_prologue_equals_norm_then_linear(cfg, m):
    gen = torch.Generator().manual_seed(10 + m)
    w = torch.randn(N, K, generator=gen).to(DEV, DT)
    x = (torch.randn(m, K, generator=gen) * 3).to(DEV, DT)
    r = torch.randn(m, K, generator=gen).to(DEV, DT)
    nw = (torch.rand(K, generator=gen) + 0.5).to(DEV, DT)
    y, s = D.gemv(x, w, cfg, residual=r, norm_w=nw, eps=1e-5)
    assert s is not None and torch.equal(s, (x + r).to(DT))  # the residual stream, as torch adds it
    sf = s.double()
    h = sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-5) * nw.double()
    assert _close(y, h @ w.double().T, _tol()), (cfg, m)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("cfg,m", RUNS[1:3])
def test_act_prologue_equals_act_mul_then_linear(cfg, m, act):
    gen = torch.Generator().manual_seed(20 + m)
    w = torch.randn(N, K, generator=gen).to(DEV, DT)
    gu = torch.randn(m, 2 * K, generator=gen).to(DEV, DT)
    y, _ = D.gemv(gu, w, cfg, n_ff=K, act=act)
    g, u = gu[:, :K], gu[:, K:]
    a = (F.silu(g) if act == "silu" else F.gelu(g, approximate="tanh")).to(DT)  # rounded as act_mul does
    h = (a.float() * u.float()).to(DT)
    assert _close(y, h.double() @ w.double().T, 1e-5 if DT == torch.float32 else 1e-2), (cfg, m, act)


def test_split_gemv_resets_its_counters():
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(N, K, generator=gen).to(DEV, DT)
    x = torch.randn(2, K, generator=gen).to(DEV, DT)
    cfg = D.Config(8, 32, 2, 64)
    first = D.gemv(x, w, cfg)[0].clone()
    cnt = D._COUNTERS[(w.device, w.data_ptr())]
    assert int(cnt.abs().sum()) == 0  # each column block's last slice put its counter back
    assert torch.equal(D.gemv(x, w, cfg)[0], first)  # deterministic: slices summed in order


def _role_inputs(role: str, m: int, gen: torch.Generator) -> dict:
    if role == "act":
        return {"x": torch.randn(m, 2 * K, generator=gen).to(DEV, DT), "n_ff": K, "act": "silu"}
    x = torch.randn(m, K, generator=gen).to(DEV, DT)
    if role == "plain":
        return {"x": x}
    return {"x": x, "residual": torch.randn(m, K, generator=gen).to(DEV, DT),
            "norm_w": (torch.rand(K, generator=gen) + 0.5).to(DEV, DT), "eps": 1e-5}


@pytest.mark.parametrize("role", ["plain", "norm", "act"])
@pytest.mark.parametrize("cfg,m", RUNS)
def test_weight_prefetch_gives_the_same_bits(cfg, m, role):
    """The first one or two weight tiles loaded ahead of the input (and, on sm90+, the kernel as a
    programmatic dependent launch): the same output and residual sum, bit for bit, as the loads
    in the loop."""
    gen = torch.Generator().manual_seed(30 + m)
    w = torch.randn(N, K, generator=gen).to(DEV, DT)
    kw = _role_inputs(role, m, gen)
    x = kw.pop("x")
    y0, s0 = D.gemv(x, w, cfg, pdl=False, pre=0, **kw)
    variants = [(False, 1), (False, 2)] + ([(True, 1), (True, 2)] if D.pdl_supported(DEV) else [])
    for pdl, pre in variants:
        y, s = D.gemv(x, w, cfg, pdl=pdl, pre=pre, **kw)
        assert torch.equal(y, y0), (cfg, m, role, pdl, pre)
        assert (s is None and s0 is None) or torch.equal(s, s0)


@pytest.mark.skipif(not (DEV.type == "cuda" and D.pdl_supported(DEV)),
                    reason="PDL needs compiled kernels on sm90+")
@pytest.mark.parametrize("pre", [1, 2])
def test_pdl_chain_in_a_graph_equals_plain_launches(pre):
    """Layers of dependent GEMVs (norm → act → a torch kernel → plain, each reading what the one
    before wrote; K split and not) as programmatic dependent launches captured in a CUDA graph,
    replayed on fresh inputs: the same bits as plain launches of the loop-only kernel."""
    d, ff, layers = 2048, 4096, 3
    gen = torch.Generator().manual_seed(40 + pre)
    mk = lambda *shape: (torch.randn(*shape, generator=gen) * 0.05).to(DEV, DT)  # noqa: E731
    wgu = [mk(2 * ff, d) for _ in range(layers)]
    wd = [mk(d, ff) for _ in range(layers)]
    wo = [mk(d, d) for _ in range(layers)]
    nw = (torch.rand(d, generator=gen) + 0.5).to(DEV, DT)
    c_norm, c_act, c_plain = D.Config(16, 256, 4, 16), D.Config(16, 256, 4, 8), D.Config(32, 256, 4, 1)
    assert D.split_of(2 * ff, d, c_norm, DEV)[0] > 1 and D.split_of(d, ff, c_act, DEV)[0] > 1

    def step(x, r, pdl, p):
        h = x
        for li in range(layers):
            gu, r = D.gemv(h, wgu[li], c_norm, residual=r, norm_w=nw, eps=1e-6, pdl=pdl, pre=p)
            h = D.gemv(gu, wd[li], c_act, n_ff=ff, act="silu", pdl=pdl, pre=p)[0]
            h = torch.tanh(h)  # a kernel that never triggers its dependents
            h = D.gemv(h, wo[li], c_plain, pdl=pdl, pre=p)[0]
        return h, r

    inputs = [(torch.randn(1, d, generator=gen).to(DEV, DT), torch.randn(1, d, generator=gen).to(DEV, DT))
              for _ in range(3)]
    want = [step(x, r, False, 0) for x, r in inputs]
    sx, sr = inputs[0][0].clone(), inputs[0][1].clone()
    step(sx, sr, True, pre)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(sx, sr, True, pre)
    for (x, r), (h_ref, r_ref) in zip(inputs[::-1], want[::-1]):
        sx.copy_(x)
        sr.copy_(r)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out[0], h_ref) and torch.equal(out[1], r_ref)
    for w in wgu + wd + wo:  # each column block's last slice put its counter back
        c = D._COUNTERS.get((w.device, w.data_ptr()))
        assert c is None or int(c.abs().sum()) == 0


def _gemv_linear(lin: nn.Linear, cfg: D.Config | None) -> nn.Linear:
    lin.__class__ = D.GemvLinear
    lin.choice = {1: cfg, D.MAX_ROWS: cfg}
    return lin


def test_gemv_linear_entry_points_equal_the_separate_path():
    gen = torch.Generator().manual_seed(6)
    ref = nn.Linear(K, N, bias=True).to(DEV, DT)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(N, K, generator=gen))
        ref.bias.copy_(torch.randn(N, generator=gen))
    lin = _gemv_linear(nn.Linear(K, N, bias=True).to(DEV, DT), D.Config(16, 64, 4, 16))
    lin.load_state_dict(ref.state_dict())
    norm = RMSNorm(K, 1e-6).to(DEV, DT)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(K, generator=gen) + 0.5)
    x = torch.randn(3, K, generator=gen).to(DEV, DT)
    r = torch.randn(3, K, generator=gen).to(DEV, DT)
    assert _close(lin.forward(x), ref.forward(x), _tol())
    # (each call gets its own residual: the CPU's native norm adds into it in place)
    y, s = norm_linear(norm, lin, x, r.clone())
    h, s_ref = norm.forward(x, r.clone())
    h, s_ref = h.clone(), s_ref.clone()
    assert torch.equal(s, s_ref) and _close(y, ref.forward(h), _tol())
    down = _gemv_linear(nn.Linear(K, N, bias=False).to(DEV, DT), D.Config(8, 32, 2, 8))
    gu = torch.randn(2, 2 * K, generator=gen).to(DEV, DT)
    a = (F.silu(gu[:, :K]).to(DT).float() * gu[:, K:].float()).to(DT)
    assert _close(down.forward_act(gu, K, "silu"), F.linear(a, down.weight), _tol())
    # above MAX_ROWS rows, or without a Triton choice: nn.Linear's own path
    x8 = torch.randn(8, K, generator=gen).to(DEV, DT)
    assert torch.equal(lin.forward(x8), F.linear(x8, lin.weight, lin.bias))
    lin.choice = {1: None, D.MAX_ROWS: None}
    assert torch.equal(lin.forward(x), F.linear(x, lin.weight, lin.bias))
    y, s = lin.forward_normed(x, r.clone(), norm)
    assert torch.equal(s, s_ref) and torch.equal(y, F.linear(h, lin.weight, lin.bias))


def test_roles_of_decode_step_layers():
    assert D.role_of("layers.3.attn.qkv") == "norm" and D.role_of("layers.0.mlp.gate_up") == "norm"
    assert D.role_of("layers.0.mlp.down") == "act" and D.role_of("lm_head") == "plain"
    assert D.role_of("layers.1.attn.o") == "plain" and D.role_of("embed") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the loader's CUDA path needs a GPU")
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cuda_model_with_triton_gemvs_follows_cublas(tmp_path, arch):
    """A bf16 model whose decode GEMVs all run the Triton kernel (norms and act·mul in their
    prologues, decode steps in CUDA graphs) against the same file on cuBLAS and the separate
    kernels: prefill, then decode steps of one sequence."""
    from kvserve.model.loader import load_gguf
    from kvserve.model.runner import ModelRunner
    from kvserve.model.synth import SynthSpec, write_random_gguf
    from kvserve.plan import Plan, SeqChunk

    spec = SynthSpec(arch=arch, qtype="F16", n_embd=256, n_ff=512, head_dim=64, n_vocab=700, tied=False)
    path = write_random_gguf(str(tmp_path / "m.gguf"), spec)
    models = []
    for cfg in (D.Config(16, 256, 4, 8), None):
        m = load_gguf(path, dtype=torch.bfloat16, device="cuda", weights="dense")
        lins = [x for x in m.model.modules() if isinstance(x, D.GemvLinear)]
        assert len(lins) == 4 * spec.n_layer + 1  # qkv, o, gate_up, down per layer; the head
        for x in lins:
            x.choice = {1: cfg, D.MAX_ROWS: cfg}
        models.append(m)
    runners = [ModelRunner(m, n_pages=8, max_batch=4) for m in models]
    assert all(r.graphs is not None for r in runners)
    ids = tuple(range(5, 45))
    outs = [r.run(Plan((SeqChunk(0, ids, 0, (0, 1, 2, 3), "all"),))).logits[0].float() for r in runners]
    for pos in range(40, 46):
        plan = Plan((SeqChunk(0, (7 + pos,), pos, (0, 1, 2, 3), "last"),))
        outs = [torch.cat([o, r.run(plan).logits[0].float()]) for o, r in zip(outs, runners)]
    t, c = outs
    assert (t - c).abs().max().item() <= 0.03 * c.abs().max().item()
