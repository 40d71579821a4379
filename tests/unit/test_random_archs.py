"""qwen2 / qwen3 / llama / gemma3 modules on tiny random-weight GGUF files against transformers."""

from __future__ import annotations

import pytest
import torch

from kvserve.plan import Plan, SeqChunk
from kvserve.model.config import UnsupportedModelError
from kvserve.model.loader import load_gguf
from kvserve.model.runner import ModelRunner
from kvserve.model.synth import SynthSpec, write_random_gguf


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "llama"])
def test_random_arch_matches_transformers(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    spec = SynthSpec(arch=arch)
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    extra = {"head_dim": spec.head_dim} if arch == "qwen3" else {}
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=f"{arch}.gguf", dtype=torch.float32, **extra)
    runner = ModelRunner(load_gguf(path), n_pages=32)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        ids = torch.randint(0, spec.n_vocab - 1, (210,), generator=gen).tolist()
        with torch.no_grad():
            ref = hf(torch.tensor([ids])).logits[0].float()
        ours = runner.run(Plan((SeqChunk(0, tuple(ids), 0, tuple(range(14)), "all"),))).logits[0]
        assert (ours - ref).abs().max().item() / ref.abs().max().item() <= 1e-3
        top2 = ref.topk(2, -1).values
        decided = (top2[:, 0] - top2[:, 1]) > 1e-2
        assert bool((ours.argmax(-1) == ref.argmax(-1))[decided].all())


def test_unknown_architecture_is_refused(tmp_path):
    path = write_random_gguf(str(tmp_path / "x.gguf"), SynthSpec(arch="mamba"))
    with pytest.raises(UnsupportedModelError, match="unsupported model architecture 'mamba'.*supported: llama"):
        load_gguf(path)


def test_quantized_weights_load(tmp_path):
    for q in ("Q8_0", "Q4_0", "Q4_1", "F16"):
        spec = SynthSpec(arch="llama", n_embd=64, n_ff=128, qtype=q)
        loaded = load_gguf(write_random_gguf(str(tmp_path / f"{q}.gguf"), spec), weights="dense")
        attn, mlp = loaded.model.layers[0].attn, loaded.model.layers[0].mlp
        assert attn.qkv.weight.dtype == torch.float32 and not hasattr(attn, "q")  # fused at load
        assert mlp.gate_up.weight.shape == (2 * spec.n_ff, spec.n_embd) and not hasattr(mlp, "up")
        assert torch.isfinite(loaded.model.layers[0].mlp.down.weight).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_runs_close_to_fp32(dtype, tmp_path):
    spec = SynthSpec(arch="gemma3", sliding_window=16, n_vocab=1200)
    path = write_random_gguf(str(tmp_path / "g.gguf"), spec)
    ids = tuple(range(5, 45))
    ref = ModelRunner(load_gguf(path), n_pages=8).run(Plan((SeqChunk(0, ids, 0, (0, 1, 2), "all"),))).logits[0]
    half = ModelRunner(load_gguf(path, dtype=dtype), n_pages=8)
    out = half.run(Plan((SeqChunk(0, ids, 0, (0, 1, 2), "all"),))).logits[0]
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out - ref).abs().max().item() / ref.abs().max().item() < 0.1


@pytest.mark.parametrize("arch,qtype", [("qwen2", "Q8_0"), ("llama", "Q4_0"), ("gemma3", "Q5_0"),
                                        ("qwen3", "Q4_1"),
                                        ("llama", "Q4_K_M")])
@pytest.mark.parametrize("kernels", ["native", "int4"])
def test_quantized_layout_follows_the_dense_reference(arch, qtype, kernels, tmp_path, monkeypatch):
    """Default (quantized, fused) weights against every tensor dequantized to f32, on prefill
    and on one-token decode steps: the native kernels, and the int4 layout that runs without
    them (dequantize + GEMM for prefill, the int4 kernel for decode)."""
    from kvserve.model.quant import native

    if kernels == "native" and not native.available():
        pytest.skip(native.unavailable_reason())
    if kernels == "int4":
        monkeypatch.setenv("KVSERVE_NATIVE", "0")
    k_quant = qtype.startswith("Q4_K")  # K-quants need rows of 256
    spec = SynthSpec(arch=arch, qtype=qtype, sliding_window=16 if arch == "gemma3" else 0, n_vocab=700,
                     **({"n_embd": 256, "n_ff": 512, "head_dim": 64} if k_quant else {}))
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), spec)
    quant, dense = load_gguf(path), load_gguf(path, weights="dense")
    assert quant.weights == "quant" and dense.weights == "dense"
    assert quant.weight_bytes < dense.weight_bytes / 2
    attn = quant.model.layers[0].attn
    if kernels == "native":  # every format in the file runs natively: Q, K, V fused (V Q6_K with Q4_K_M)
        assert attn.qkv is not None and attn.qkv.path == "native"
    elif qtype == "Q4_K_M":  # V is Q6_K (dense): Q, K, V take different paths and stay apart
        assert attn.qkv is None and attn.q.path == "int4" and attn.v.path == "dense"
    else:
        assert attn.qkv is not None and not hasattr(attn, "q")  # Q, K, V fused at load
    runners = [ModelRunner(m, n_pages=8) for m in (quant, dense)]
    ids = tuple(range(5, 45))
    outs = [r.run(Plan((SeqChunk(0, ids, 0, (0, 1, 2, 3), "all"),))).logits[0] for r in runners]
    for pos in range(40, 44):  # decode steps on both
        plan = Plan((SeqChunk(0, (7 + pos,), pos, (0, 1, 2, 3), "last"),))
        steps = [r.run(plan).logits[0] for r in runners]
        outs = [torch.cat([o, s]) for o, s in zip(outs, steps)]
    q, d = outs
    assert (q - d).abs().max().item() <= 0.05 * d.abs().max().item()
    top2 = d.topk(2, -1).values
    decided = (top2[:, 0] - top2[:, 1]) > 0.05 * d.abs().max().item()
    assert bool((q.argmax(-1) == d.argmax(-1))[decided].all())


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_fused_dense_projections_match_separate_ones(arch, tmp_path, monkeypatch):
    """Q/K/V and gate/up fused at load (one GEMM each, biases included) give the logits of the
    separate projections."""
    path = write_random_gguf(str(tmp_path / f"{arch}.gguf"), SynthSpec(arch=arch, sliding_window=8))
    fused = load_gguf(path, weights="dense")
    monkeypatch.setenv("KVSERVE_FUSE", "0")
    apart = load_gguf(path, weights="dense")
    assert fused.model.layers[0].attn.qkv is not None and not hasattr(fused.model.layers[0].mlp, "gate")
    assert apart.model.layers[0].attn.qkv is None and apart.model.layers[0].mlp.gate_up is None
    ids = tuple(range(5, 45))
    plan = Plan((SeqChunk(0, ids, 0, (0, 1, 2), "all"),))
    a, b = (ModelRunner(m, n_pages=8).run(plan).logits[0] for m in (fused, apart))
    assert torch.allclose(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item())
