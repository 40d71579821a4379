"""Flag statuses, the one place to flip: ``REFUSED``, ``WARNED`` (whole flag) and ``REFUSED_VALUES``.

A flag listed in ``REFUSED`` is accepted only at its default value; one in ``WARNED`` is accepted
with one warning line when set (its feature is missing: requests using it get a 400, see
``FEATURES``); an implemented flag with a ``REFUSED_VALUES`` rule refuses the values its rule
names. Flipping a flag to implemented means deleting its line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# llama-server's model preset flags (each picks and downloads a model).
PRESET_NAMES = ("embd-gemma-default", "fim-qwen-1.5b-default", "fim-qwen-3b-default", "fim-qwen-7b-default",
                "fim-qwen-7b-spec", "fim-qwen-14b-spec", "fim-qwen-30b-default", "gpt-oss-20b-default",
                "gpt-oss-120b-default", "vision-gemma-4b-default", "vision-gemma-12b-default")
PRESETS = tuple(n.replace("-", "_").replace(".", "_") for n in PRESET_NAMES)

# Reasons shared by several flags. Both tables are keyed by dest.
_DOWNLOAD = "kvserve never downloads models; pass a local GGUF with -m"
_MULTIMODAL = "multimodal input (projectors, media files) is not supported"
_CHECKPOINTS = (
    "the shared paged cache keeps full KV for SWA layers, so checkpoints are not needed; see compat.md"
)
_SPECULATIVE = "speculative decoding is not supported"
_LORA = "LoRA adapters are not supported"
_FIT = "automatic memory fitting is not implemented; size the KV pool with -c"
_LOGFMT = "the log line format is fixed"
_LORA_APPLIED = ("LoRA adapters are not supported (llama-server would apply them to every request; "
                 "with --lora-init-without-apply they are only warned about)")
_YARN = ("YaRN RoPE scaling is not supported (--rope-freq-base, --rope-freq-scale, --rope-scale and "
         "--rope-scaling none or linear are)")
_CONTROL = "control vectors are not supported"
_SPECULATIVE = "speculative decoding is not supported (answers are the same without it)"
_PLACEMENT = ("llama.cpp backend placement/tuning; kvserve runs on torch "
              "(threads with -t, device with --device)")

# Refused: accepted only at the default, because any other value would silently change every
# answer (another model, another RoPE, an adapter or a grammar applied by llama-server).
REFUSED: dict[str, str] = {
    "model_url": _DOWNLOAD,
    "hf_repo": _DOWNLOAD,
    "hf_file": _DOWNLOAD,
    "docker_repo": _DOWNLOAD,
    "lora": _LORA_APPLIED,
    "lora_scaled": _LORA_APPLIED,
    **{dest: _YARN for dest in ("yarn_orig_ctx", "yarn_ext_factor", "yarn_attn_factor", "yarn_beta_slow",
                                "yarn_beta_fast")},
    "override_kv": "overriding model metadata is not supported",
    "control_vector": _CONTROL,
    "control_vector_scaled": _CONTROL,
    "control_vector_layer_range": _CONTROL,
    **{dest: _DOWNLOAD for dest in PRESETS},
}

# Refused flags that only warn when another flag is set: dest -> (that flag's dest, warning).
_LORA_UNAPPLIED = "LoRA adapters are not supported (requests that set a scale get a 400)"
REFUSED_UNLESS: dict[str, tuple[str, str]] = {
    "lora": ("lora_init_without_apply", _LORA_UNAPPLIED),
    "lora_scaled": ("lora_init_without_apply", _LORA_UNAPPLIED),
}

# Accepted with one warning line at start-up: the flag only enables or tunes something kvserve
# does not have; a request that would use the feature gets a 400 naming it.
WARNED: dict[str, str] = {
    "hf_token": _DOWNLOAD,
    "mmproj": _MULTIMODAL,
    "mmproj_url": _MULTIMODAL,
    "mmproj_auto": _MULTIMODAL,
    "media_path": _MULTIMODAL,
    "ctx_checkpoints": _CHECKPOINTS,
    "checkpoint_min_step": _CHECKPOINTS,
    "log_prompts_dir": "kvserve never writes prompts to disk",
    "log_jsonl": _LOGFMT,
    "log_colors": _LOGFMT,
    "log_prefix": _LOGFMT,
    "log_timestamps": _LOGFMT,
    "n_gpu_layers": "kvserve keeps the whole model on one device; choose it with --device (cpu or cuda)",
    "fit": _FIT,
    "fit_ctx": _FIT,
    "fit_target": _FIT,
    "lora_init_without_apply": _LORA,
    "backend_sampling": "sampling always runs in the engine; there is no separate backend sampler",
    "flash_attn": "the attention backend is chosen by the device (torch SDPA on CPU)",
    "threads_batch": "one torch thread pool serves prompt and generation; use -t",
    "threads_http": "HTTP is served by one asyncio event loop, not a thread pool",
    **{dest: _SPECULATIVE for dest in (
        "model_draft", "hf_repo_draft", "spec_type", "spec_draft_n_max", "spec_draft_n_min",
        "spec_draft_type_k", "spec_draft_type_v", "spec_draft_threads", "spec_draft_threads_batch",
        "spec_draft_cpu_mask", "spec_draft_cpu_range", "spec_draft_cpu_strict", "spec_draft_prio",
        "spec_draft_poll", "spec_draft_cpu_mask_batch", "spec_draft_cpu_strict_batch",
        "spec_draft_prio_batch", "spec_draft_poll_batch", "spec_draft_override_tensor",
        "spec_draft_cpu_moe", "spec_draft_n_cpu_moe", "spec_synth_len", "spec_synth_rates",
        "spec_draft_p_split", "spec_draft_p_min", "spec_draft_backend_sampling", "spec_draft_device",
        "spec_draft_ngl", "spec_ngram_mod_n_min", "spec_ngram_mod_n_max", "spec_ngram_mod_n_match",
        "spec_ngram_simple_size_n", "spec_ngram_simple_size_m", "spec_ngram_simple_min_hits",
        "spec_ngram_map_k_size_n", "spec_ngram_map_k_size_m", "spec_ngram_map_k_min_hits",
        "spec_ngram_map_k4v_size_n", "spec_ngram_map_k4v_size_m", "spec_ngram_map_k4v_min_hits",
        "lookup_cache_static", "lookup_cache_dynamic", "spec_default")},
    **{dest: _PLACEMENT for dest in (
        "cpu_mask", "cpu_range", "cpu_strict", "prio", "poll", "cpu_mask_batch", "cpu_range_batch",
        "cpu_strict_batch", "prio_batch", "poll_batch", "numa", "perf", "kv_offload", "repack", "no_host",
        "defrag_thold", "rpc", "load_mode", "lazy_mode", "override_tensor", "cpu_moe", "n_cpu_moe",
        "n_cpu_ffn", "split_mode", "tensor_split", "main_gpu", "check_tensors", "op_offload")},
    **{dest: _MULTIMODAL for dest in (
        "mmproj_offload", "mmproj_device", "image_min_tokens", "image_max_tokens", "mtmd_batch_max_tokens",
        "video_fps", "video_timestamp_interval", "video_ffmpeg_dir")},
    "llama_device": "kvserve chooses its device with --device (auto, cpu or cuda)",
}

# What a request that would use a warned flag's feature is told (400): feature -> (flags, why).
FEATURES: dict[str, tuple[tuple[str, ...], str]] = {}

KV_CACHE_TYPES_SUPPORTED = ("f32", "f16", "bf16")


@dataclass(frozen=True)
class ValueRule:
    """Some values of an implemented flag are refused: ``check(value)`` returns the reason."""

    check: Callable[[Any], str | None]
    doc: str


def _kv_type_rule(v: Any) -> str | None:
    if v in KV_CACHE_TYPES_SUPPORTED:
        return None
    return "quantized KV cache types are not supported; the KV cache is stored as f16"


REFUSED_VALUES: dict[str, ValueRule] = {
    "rope_scaling": ValueRule(lambda v: _YARN if v == "yarn" else None, "yarn is refused"),
    "rope_scale": ValueRule(lambda v: "a RoPE context scale of 0 is an infinite frequency scale"
                            if v == 0.0 else None, "0 is refused"),
}

# Values of implemented flags that are accepted with a warning (and replaced, see config.py).
WARNED_VALUES: dict[str, ValueRule] = {
    "cache_type_k": ValueRule(_kv_type_rule, "quantized types warn and store the KV cache as f16"),
    "cache_type_v": ValueRule(_kv_type_rule, "quantized types warn and store the KV cache as f16"),
}
