"""GGUF file → (frozen config, nn.Module with dequantized weights), loaded once."""

from __future__ import annotations

import hashlib
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from gguf import GGMLQuantizationType, GGUFReader
from torch import nn

from .arch import ARCHITECTURES
from .config import ModelConfig, UnsupportedModelError, config_from_metadata
from .gguf_meta import read_metadata
from .quant import dequantize

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


def load_gguf(path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> LoadedModel:
    t0 = time.perf_counter()
    device = torch.device(device)
    reader = GGUFReader(path, "r")
    meta = read_metadata(reader)
    names = {t.name for t in reader.tensors}
    cfg = config_from_metadata(meta, names)
    known = set(GGMLQuantizationType)
    with torch.device("meta"):
        model = ARCHITECTURES[cfg.arch](cfg)
    expected = dict(model.named_parameters())
    state: dict[str, torch.Tensor] = {}
    bar = _progress(len(reader.tensors))
    for t in reader.tensors:
        if t.tensor_type not in known:
            raise UnsupportedModelError(f"unsupported tensor type {t.tensor_type} of '{t.name}'")
        pname = param_name(t.name)
        if pname not in expected:
            raise UnsupportedModelError(f"tensor '{t.name}' does not belong to architecture '{cfg.arch}'")
        shape = tuple(int(x) for x in reversed(t.shape))
        w = dequantize(t.data, t.tensor_type, shape)
        if tuple(w.shape) != tuple(expected[pname].shape):
            raise UnsupportedModelError(
                f"tensor '{t.name}' has shape {tuple(w.shape)}, expected {tuple(expected[pname].shape)}"
            )
        state[pname] = w.to(device=device, dtype=dtype)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    missing = sorted(set(expected) - set(state))
    if missing:
        raise UnsupportedModelError(f"GGUF file lacks tensors for: {', '.join(missing[:8])}")
    model.load_state_dict(state, assign=True, strict=True)
    for p in model.parameters():
        p.requires_grad_(False)
    model.eval()
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
    )
