"""Model hyper-parameters read once from GGUF metadata into a frozen config."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Literal

RopeStyle = Literal["norm", "neox"]  # norm: adjacent pairs (llama.cpp LLAMA_ROPE_TYPE_NORM); neox: halves

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "gemma3")


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_style: RopeStyle
    rope_dim: int
    rope_base: float  # global (full-attention) layers
    rope_base_local: float  # sliding-window layers
    rope_scale: float  # linear position scaling factor of global layers (1.0 = none)
    sliding_window: int  # 0 = no sliding-window layers
    swa_layers: tuple[bool, ...]  # True where layer i uses the sliding window
    attn_scale: float
    embed_scale: float  # 1.0, or sqrt(n_embd) for Gemma
    qk_norm: bool
    qkv_bias: bool
    tied_embeddings: bool
    file_type: int = 0
    rope_scaling: str = "linear"  # the GGUF's scaling type (llama.cpp's default when it names none)
    rope_factor: float = 1.0  # the GGUF's scaling factor (1 / llama.cpp's rope_freq_scale_train)

    def layer_window(self, i: int) -> int:
        return self.sliding_window if self.swa_layers[i] else 0

    def layer_rope(self, i: int) -> tuple[float, float]:
        """(base, position scale) of layer i's rotary embedding."""
        if self.swa_layers[i]:
            return self.rope_base_local, 1.0
        return self.rope_base, self.rope_scale

    @property
    def has_swa(self) -> bool:
        return self.sliding_window > 0 and any(self.swa_layers)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.n_layer * self.n_head_kv * self.head_dim * dtype_bytes


def _get(meta: dict[str, Any], arch: str, key: str, default: Any = None) -> Any:
    v = meta.get(f"{arch}.{key}", default)
    if v is None:
        raise UnsupportedModelError(f"GGUF metadata is missing '{arch}.{key}'")
    return v


def config_from_metadata(meta: dict[str, Any], tensor_names: set[str]) -> ModelConfig:
    arch = meta.get("general.architecture", "")
    if arch not in SUPPORTED_ARCHS:
        raise UnsupportedModelError(
            f"unsupported model architecture '{arch}'; supported: {', '.join(SUPPORTED_ARCHS)}"
        )
    n_embd = int(_get(meta, arch, "embedding_length"))
    n_head = int(_get(meta, arch, "attention.head_count"))
    n_head_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head))
    head_dim = int(meta.get(f"{arch}.attention.key_length", n_embd // n_head))
    n_layer = int(_get(meta, arch, "block_count"))
    n_vocab = int(meta.get(f"{arch}.vocab_size", len(meta.get("tokenizer.ggml.tokens", []))))
    rope_base = float(meta.get(f"{arch}.rope.freq_base", 10000.0))
    rope_scaling = str(meta.get(f"{arch}.rope.scaling.type") or "linear")
    if rope_scaling not in ("none", "linear"):
        raise UnsupportedModelError(f"unsupported rope scaling '{rope_scaling}'; supported: none, linear")
    rope_factor = float(meta.get(f"{arch}.rope.scaling.factor") or meta.get(f"{arch}.rope.scale_linear") or 1.0)
    rope_scale = rope_factor if rope_scaling == "linear" else 1.0
    sliding_window = 0
    swa_layers = tuple(False for _ in range(n_layer))
    rope_base_local = rope_base
    embed_scale = 1.0
    qk_norm = arch in ("qwen3", "gemma3")
    rope_style: RopeStyle = "norm" if arch == "llama" else "neox"
    if arch == "gemma3":
        sliding_window = int(meta.get("gemma3.attention.sliding_window", 0) or 0)
        # Pattern 5 local : 1 global (layer i global when (i + 1) % 6 == 0) unless stated.
        pattern = int(meta.get("gemma3.attention.sliding_window_pattern", 6) or 6)
        swa_layers = tuple(sliding_window > 0 and (i + 1) % pattern != 0 for i in range(n_layer))
        rope_base_local = 10000.0
        embed_scale = math.sqrt(n_embd)
    return ModelConfig(
        arch=arch,
        name=str(meta.get("general.name", arch)),
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_ff=int(_get(meta, arch, "feed_forward_length")),
        n_vocab=n_vocab,
        n_ctx_train=int(meta.get(f"{arch}.context_length", 4096)),
        rms_eps=float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        rope_style=rope_style,
        rope_dim=int(meta.get(f"{arch}.rope.dimension_count", head_dim)),
        rope_base=rope_base,
        rope_base_local=rope_base_local,
        rope_scale=rope_scale,
        sliding_window=sliding_window,
        swa_layers=swa_layers,
        attn_scale=1.0 / math.sqrt(head_dim),
        embed_scale=embed_scale,
        qk_norm=qk_norm,
        qkv_bias="blk.0.attn_q.bias" in tensor_names,
        tied_embeddings="output.weight" not in tensor_names,
        file_type=int(meta.get("general.file_type", 0)),
        rope_scaling=rope_scaling,
        rope_factor=rope_factor,
    )


@dataclass(frozen=True)
class RopeOverride:
    """llama.cpp's context RoPE parameters (``--rope-freq-base``, ``--rope-freq-scale`` or
    ``--rope-scale``, ``--rope-scaling``); 0 / None keep the model's. As in llama.cpp they apply
    to the full-attention layers only (sliding-window layers keep their own RoPE), and scaling
    type ``none`` never scales."""

    freq_base: float = 0.0
    freq_scale: float = 0.0  # multiplies positions (1 / the context scale factor)
    scaling: str | None = None  # none | linear

    def apply(self, cfg: ModelConfig) -> ModelConfig:
        if self == RopeOverride():
            return cfg
        scaling = self.scaling or cfg.rope_scaling
        freq_scale = self.freq_scale if self.freq_scale != 0.0 else 1.0 / cfg.rope_factor
        if scaling == "none":
            freq_scale = 1.0
        base = self.freq_base if self.freq_base != 0.0 else cfg.rope_base
        return replace(cfg, rope_base=base, rope_scale=1.0 / freq_scale, rope_scaling=scaling)
