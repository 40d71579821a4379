"""GGUF file → (frozen config, nn.Module), loaded once.

Two weight layouts: ``quant`` (the default on the CPU) repacks each weight into the layout of
the kernel that runs it (see ``quant/build.py``) and keeps token embeddings in their GGUF
encoding; ``dense`` dequantizes every tensor to one dtype (the float32 reference). Both fuse
Q/K/V and gate/up into one matrix each (``fuse``; ``KVSERVE_FUSE=0`` keeps dense ones apart).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from gguf import GGMLQuantizationType
from torch import nn

from . import dense_gemv
from .arch import ARCHITECTURES
from .config import ModelConfig, RopeOverride, UnsupportedModelError, config_from_metadata
from .fuse import fuse_dense
from .gguf_meta import GGUFContents, read_gguf
from .heap import release_free_memory, set_mmap_threshold
from .quant import dequantize
from .quant.build import RawTensor, WeightSummary, add_to_summary, cpu_kernels, dense_on, fuse_groups, linear
from .quant.embedding import PlaneEmbedding, QuantEmbedding
from .quant.groups import GGUFGroups
from .quant.linear import QuantLinear
from .quant.native import NativeLinear
from .rank_head import HEAD_ARCHS, HEAD_TENSORS, RankHead

# GGUF tensor-name suffix → module parameter path inside a block.
_BLOCK_NAMES = {
    "attn_norm": "attn_norm",
    "attn_q": "attn.q",
    "attn_k": "attn.k",
    "attn_v": "attn.v",
    "attn_output": "attn.o",
    "attn_q_norm": "attn.q_norm",
    "attn_k_norm": "attn.k_norm",
    "ffn_norm": "ffn_norm",
    "ffn_gate": "mlp.gate",
    "ffn_up": "mlp.up",
    "ffn_down": "mlp.down",
    "post_attention_norm": "post_attn_norm",
    "post_ffw_norm": "post_ffn_norm",
}
_TOP_NAMES = {"token_embd": "embed", "output_norm": "norm", "output": "lm_head"}

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class LoadedModel:
    path: str
    cfg: ModelConfig
    model: nn.Module
    metadata: dict[str, Any]
    dtype: torch.dtype
    device: torch.device
    load_s: float
    n_params: int
    file_size: int
    digest: str  # identifies the model file for cache identity
    weights: str = "dense"  # quant | dense
    weight_bytes: int = 0  # bytes of parameters and buffers the model holds
    summary: WeightSummary | None = None  # per-path tensors and bytes (quant layout)
    rank_head: RankHead | None = None  # rank pooling (--reranking); the file's classifier head if any


def param_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _BLOCK_NAMES:
        return f"layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"unsupported tensor '{gguf_name}' in GGUF file")


def file_digest(path: str) -> str:
    """Cheap stable identity: size, and sha256 of the first and last MiB plus the header."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(size - (1 << 20))
            h.update(f.read(1 << 20))
    return h.hexdigest()[:16]


def _progress(total: int):
    if sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc="loading tensors", unit="t", leave=False)
    return None


@contextlib.contextmanager
def _no_init() -> Iterator[None]:
    """Build modules without initialising their parameters (every one is loaded from the file).
    Random init of meta tensors runs torch's Python reference ops, whose first use imports
    torch._dynamo (and triton): ~140 MiB of resident memory for nothing."""
    saved = {c: c.reset_parameters for c in (nn.Linear, nn.Embedding)}
    try:
        for c in saved:
            c.reset_parameters = lambda self: None  # type: ignore[method-assign]
        yield
    finally:
        for c, f in saved.items():
            c.reset_parameters = f  # type: ignore[method-assign]


def _mmap_threshold(nbytes: int) -> None:
    """Allocations above ``nbytes`` get their own mapping, returned to the OS when freed. While
    repacking, multi-MiB temporaries between the kept buffers would otherwise stay in glibc's
    heap as holes (hundreds of MiB of resident memory for a 135M-parameter model)."""
    set_mmap_threshold(nbytes)


def _module_bytes(model: nn.Module) -> int:
    return sum(t.nbytes for t in model.parameters()) + sum(b.nbytes for b in model.buffers())


def load_gguf(
    path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", weights: str = "auto",
    rope: RopeOverride | None = None, contents: GGUFContents | None = None,
) -> LoadedModel:
    """``weights``: ``quant``, ``dense``, or ``auto`` = quant for float32 on the CPU, else dense.
    ``rope``: the command line's RoPE overrides. ``contents``: ``path``'s header as
    ``read_gguf`` parsed it already (not parsed again; its tensors are released as loaded)."""
    t0 = time.perf_counter()
    device = torch.device(device)
    if weights == "auto":
        weights = "quant" if device.type == "cpu" and dtype == torch.float32 else "dense"
    if weights == "quant" and device.type not in ("cpu", "cuda"):
        raise UnsupportedModelError(f"quantized weights run on the CPU or CUDA, not {device.type}")
    if weights == "quant":
        _mmap_threshold(1 << 20)
    reader = read_gguf(path) if contents is None else contents
    del contents
    meta = reader.metadata
    names = {t.name for t in reader.tensors}
    cfg = config_from_metadata(meta, names)
    if rope is not None:
        cfg = rope.apply(cfg)
    known = set(GGMLQuantizationType)
    with torch.device("meta"), _no_init():
        model = ARCHITECTURES[cfg.arch](cfg)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    raws: dict[str, RawTensor] = {}  # quant layout: 2-D weights, by module path
    linears = {n for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    bar = _progress(len(reader.tensors))
    head: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        if t.tensor_type not in known:
            raise UnsupportedModelError(f"unsupported tensor type {t.tensor_type} of '{t.name}'")
        if t.name in HEAD_TENSORS and cfg.arch in HEAD_ARCHS:
            shape = tuple(int(x) for x in reversed(t.shape))
            head[t.name] = dequantize(t.data, t.tensor_type, shape).to(device=device, dtype=torch.float32)
            reader.release(t)
            continue
        pname = param_name(t.name)
        if pname not in expected:
            raise UnsupportedModelError(f"tensor '{t.name}' does not belong to architecture '{cfg.arch}'")
        shape = tuple(int(x) for x in reversed(t.shape))
        if shape != tuple(expected[pname].shape):
            raise UnsupportedModelError(
                f"tensor '{t.name}' has shape {shape}, expected {tuple(expected[pname].shape)}"
            )
        mod = pname.rpartition(".")[0]
        if weights == "quant" and pname.endswith(".weight") and (mod in linears or mod == "embed"):
            raws[mod] = RawTensor(t.data, t.tensor_type, (shape[0], shape[1]), functools.partial(reader.release, t))
        elif len(shape) == 2:
            raw = RawTensor(t.data, t.tensor_type, (shape[0], shape[1]))
            state[pname] = dense_on(raw, device, dtype)
            reader.release(t)
        else:
            state[pname] = dequantize(t.data, t.tensor_type, shape).to(device=device, dtype=dtype)
            reader.release(t)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    missing = sorted(set(expected) - set(state) - {f"{m}.weight" for m in raws})
    if missing:
        raise UnsupportedModelError(f"GGUF file lacks tensors for: {', '.join(missing[:8])}")
    summary = _repack(model, cfg, raws, state, device, dtype) if weights == "quant" else None
    if weights == "dense" and os.environ.get("KVSERVE_FUSE", "1") != "0":
        fuse_dense(model, state)  # Q/K/V and gate/up: one GEMM each
    model.load_state_dict(state, assign=True, strict=True)
    del reader, raws  # unmaps the file: only repacked copies stay resident
    release_free_memory()
    if weights == "quant":
        _mmap_threshold(32 << 20)  # glibc's own upper bound: big per-step buffers reuse the heap
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
    if device.type == "cuda" and weights == "dense":
        dense_gemv.prepare(model)  # decode GEMVs: Triton or cuBLAS per shape, norms fused into them
    return LoadedModel(
        path=path,
        cfg=cfg,
        model=model,
        metadata=meta,
        dtype=dtype,
        device=device,
        load_s=time.perf_counter() - t0,
        n_params=sum(p.numel() for p in model.parameters()),
        file_size=os.path.getsize(path),
        digest=file_digest(path),
        weights=weights,
        weight_bytes=_module_bytes(model),
        summary=summary,
        rank_head=RankHead.from_tensors(cfg.arch, head),
    )


def _repack(
    model: nn.Module, cfg: ModelConfig, raws: dict[str, RawTensor], state: dict[str, torch.Tensor],
    device: torch.device, dtype: torch.dtype,
) -> WeightSummary:
    """Replace the model's nn.Linear/nn.Embedding modules by repacked ones; biases move into them.
    On CUDA the embedding stays a dense table on the device (a gather there, no host round trip)."""
    summary = WeightSummary()
    embed = raws.pop("embed")
    on = None if device.type == "cpu" else device
    if on is None:
        summary.kernels = cpu_kernels()
    for name, members in fuse_groups(raws, on):
        tensors = [raws[m] for m in members]
        biases = [None if (b := state.pop(f"{m}.bias", None)) is None else b.float().cpu() for m in members]
        mod = linear(tensors, biases, on)
        add_to_summary(summary, mod, tensors)
        for t in tensors:
            t.release_all()
        for m in members:
            parent, _, leaf = m.rpartition(".")
            delattr(model.get_submodule(parent), leaf)
        parent, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(parent), leaf, mod)
    if cfg.tied_embeddings:  # the output head multiplies by the embedding matrix: give it a fast layout
        head = linear([embed], [None], on)
        add_to_summary(summary, head, [embed])
        model.lm_head = head
    if on is None and cfg.tied_embeddings and isinstance(model.lm_head, NativeLinear):
        # the head holds the embedding's own bytes: gathered rows are dequantized from them
        model.embed = QuantEmbedding(model.lm_head.segments[0].raw, embed.qtype, *embed.shape)
        summary.add("rows", [embed], model.embed.weight_bytes())
    elif on is None and cfg.tied_embeddings and isinstance(model.lm_head, QuantLinear):
        # the head's planes hold the codes: keep only the file's group scales beside them
        model.embed = PlaneEmbedding(model.lm_head, GGUFGroups.of(embed.data, embed.qtype, embed.shape,
                                                                  embed.release))
        summary.add("rows", [embed], model.embed.weight_bytes())
    elif on is None:
        model.embed = QuantEmbedding(embed.data, embed.qtype, *embed.shape, embed.release)
        summary.add("rows", [embed], model.embed.weight_bytes())
    else:
        w = dense_on(embed, device, dtype)
        state["embed.weight"] = w
        summary.add("dense", [embed], w.nbytes)
    embed.release_all()
    return summary
