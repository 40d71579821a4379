"""Write random-weight GGUF files of a given architecture and shape.

Used by tests (architectures for which no small real model ships) and by benchmarks of larger
shapes. The vocabulary is a byte-level BPE of ``n_vocab`` tokens (256 byte tokens, then merged
pairs) so that the files also load in other GGUF readers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from .tokenizer import _bytes_to_unicode


@dataclass(frozen=True)
class SynthSpec:
    arch: str = "qwen2"  # llama | qwen2 | qwen3 | gemma3
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_ff: int = 128
    n_vocab: int = 512
    n_ctx: int = 2048
    rope_base: float = 10000.0
    sliding_window: int = 0
    tied: bool = True
    qtype: str = "F32"  # F32 | F16 | Q8_0 | Q4_0 | Q4_1 | Q4_K | Q6_K ... | Q4_K_M (Q6_K for V, down, output)
    seed: int = 0
    n_cls_out: int = 0  # > 0: a classifier head ``cls.output.weight`` [n_cls_out, n_embd] (rank pooling)


def _byte_vocab(n_vocab: int) -> tuple[list[str], list[str]]:
    """GPT-2 byte-level tokens: 256 byte symbols, then merges of pairs until n_vocab."""
    symbols = list(_bytes_to_unicode().values())
    tokens = list(symbols)
    merges: list[str] = []
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    known = set(tokens)
    heads = list(letters)  # merge every head with every letter, breadth first: unbounded vocab
    i = 0
    while len(tokens) < n_vocab - 1:
        a, b = heads[i // 26], letters[i % 26]
        i += 1
        if a + b in known:
            continue
        tokens.append(a + b)
        known.add(a + b)
        heads.append(a + b)
        merges.append(f"{a} {b}")
    tokens.append("<|endoftext|>")
    return tokens, merges


def random_kquant(rng: np.random.Generator, shape: tuple[int, int], qtype: GGMLQuantizationType,
                  scale: float) -> np.ndarray:
    """Raw blocks of a K-quant type (gguf has no quantizer for them): random codes and
    sub-scales, super-block scales chosen so that weights have about ``scale`` spread."""
    from gguf.constants import GGML_QUANT_SIZES

    bw, bb = GGML_QUANT_SIZES[qtype]
    n, k = shape
    raw = rng.integers(0, 256, (n, k // bw, bb), dtype=np.uint8)
    if qtype == GGMLQuantizationType.Q6_K:  # ..., int8 scales[16], f16 d at the end; values d·sc·(q − 32)
        raw[..., bb - 18 : bb - 2] = rng.integers(-32, 32, (n, k // bw, 16)).astype(np.int8).view(np.uint8)
        d = np.full((n, k // bw, 1), scale / (16 * 18), np.float16)
        raw[..., bb - 2 :] = d.view(np.uint8).reshape(n, k // bw, 2)
    else:  # Q4_K / Q5_K: f16 d, f16 dmin first; values d·sc·q − dmin·m with sc, m in [0, 64)
        top = 16 if qtype == GGMLQuantizationType.Q4_K else 32
        d = scale / (32 * top / 2)
        f = np.array([d, d * top / 2], np.float16)
        raw[..., :4] = np.broadcast_to(f.view(np.uint8), (n, k // bw, 4))
    return raw.reshape(n, -1)


_NO_QUANTIZER = {GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K, GGMLQuantizationType.Q6_K}


def write_random_gguf(path: str, spec: SynthSpec) -> str:
    rng = np.random.default_rng(spec.seed)
    mixed = spec.qtype == "Q4_K_M"
    qtype = GGMLQuantizationType.Q4_K if mixed else GGMLQuantizationType[spec.qtype]
    w = GGUFWriter(path, spec.arch)
    a = spec.arch
    w.add_name(f"random-{a}")
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_key_length(spec.head_dim)
    w.add_value_length(spec.head_dim)
    w.add_rope_dimension_count(spec.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(spec.rope_base)
    w.add_vocab_size(spec.n_vocab)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    tokens, merges = _byte_vocab(spec.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2" if a.startswith("qwen") else "default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(merges)
    w.add_bos_token_id(len(tokens) - 1)
    w.add_eos_token_id(len(tokens) - 1)
    w.add_add_bos_token(False)

    def add(name: str, shape: tuple[int, ...], scale: float = 0.05, ones: bool = False) -> None:
        q = qtype
        if mixed and any(t in name for t in ("attn_v", "ffn_down", "output.")):
            q = GGMLQuantizationType.Q6_K
        if len(shape) == 2 and q in _NO_QUANTIZER:
            w.add_tensor(name, random_kquant(rng, (shape[0], shape[1]), q, scale), raw_dtype=q)
            return
        arr = (np.ones(shape) if ones else rng.standard_normal(shape) * scale).astype(np.float32)
        if len(shape) == 2 and q not in (GGMLQuantizationType.F32,):
            w.add_tensor(name, quantize(arr, q), raw_dtype=q)
        else:
            w.add_tensor(name, arr)

    e, hd = spec.n_embd, spec.head_dim
    add("token_embd.weight", (spec.n_vocab, e), 0.5)
    add("output_norm.weight", (e,), ones=True)
    if not spec.tied:
        add("output.weight", (spec.n_vocab, e))
    if spec.n_cls_out:
        add("cls.output.weight", (spec.n_cls_out, e), 0.5)
    for i in range(spec.n_layer):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", (e,), ones=True)
        add(p + "attn_q.weight", (spec.n_head * hd, e))
        add(p + "attn_k.weight", (spec.n_head_kv * hd, e))
        add(p + "attn_v.weight", (spec.n_head_kv * hd, e))
        add(p + "attn_output.weight", (e, spec.n_head * hd))
        if a == "qwen2":
            add(p + "attn_q.bias", (spec.n_head * hd,), 0.1)
            add(p + "attn_k.bias", (spec.n_head_kv * hd,), 0.1)
            add(p + "attn_v.bias", (spec.n_head_kv * hd,), 0.1)
        if a in ("qwen3", "gemma3"):
            add(p + "attn_q_norm.weight", (hd,), ones=True)
            add(p + "attn_k_norm.weight", (hd,), ones=True)
        add(p + "ffn_norm.weight", (e,), ones=True)
        add(p + "ffn_gate.weight", (spec.n_ff, e))
        add(p + "ffn_up.weight", (spec.n_ff, e))
        add(p + "ffn_down.weight", (e, spec.n_ff))
        if a == "gemma3":
            add(p + "post_attention_norm.weight", (e,), ones=True)
            add(p + "post_ffw_norm.weight", (e,), ones=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
