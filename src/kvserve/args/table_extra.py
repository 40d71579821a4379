"""llama-server's backend, placement, speculative, multimodal and preset flags (group ``other``).

These tune how llama.cpp runs (threads, CPU masks, offloading, speculative drafts, media
encoding) or pick a model preset. kvserve accepts each one: most only warn (see
``status.WARNED``), those that would change every answer are refused (``status.REFUSED``), and
the ones llama.cpp itself removed fail with llama.cpp's message.
"""

from __future__ import annotations

from typing import Any

from .convert import _read_text
from .spec import ArgType, FlagSpec, Warn
from .status import PRESET_NAMES

I, FL, S, B, V = ArgType.INT, ArgType.FLOAT, ArgType.STR, ArgType.BOOL, ArgType.VOID  # noqa: E741
_OTHER = "other"


def _removed(hint: str):  # noqa: ANN202 - a converter
    def convert(text: str, warn: Warn) -> Any:
        raise ValueError(f"the argument has been removed. {hint}")

    return convert


def _rope_scaling(text: str, warn: Warn) -> str:
    if text not in ("none", "linear", "yarn"):
        raise ValueError("invalid value")
    return text


def _read_text_file(text: str, warn: Warn) -> str:
    return _read_text(text)


def R(names: str, dest: str, type_: ArgType, help: str, *, hint: str | None = None, env: str | None = None,
      neg: str = "", **kw: Any) -> FlagSpec:
    """A row whose default is "not given" (None / False)."""
    if hint is None and type_ in (I, FL, S):
        hint = "N" if type_ in (I, FL) else "VALUE"
    default: Any = False if type_ in (B, V) else None
    if type_ is B:
        default = kw.pop("default", True)
    return FlagSpec(tuple(names.split()), dest, type_, default, help, env=env, neg_names=tuple(neg.split()),
                    hint=hint, group=_OTHER, **kw)


_ROWS: tuple[FlagSpec, ...] = (
    # --- actions ------------------------------------------------------------------------------
    R("-cl --cache-list", "cache_list", V, "show list of models in cache", action="cache-list"),
    R("--completion-bash", "completion_bash", V, "print source-able bash completion script",
      action="completion-bash"),
    R("--list-devices", "list_devices", V, "print list of available devices and exit", action="list-devices"),
    # --- CPU placement ------------------------------------------------------------------------
    R("-C --cpu-mask", "cpu_mask", S, "CPU affinity mask", hint="M"),
    R("-Cr --cpu-range", "cpu_range", S, "range of CPUs for affinity", hint="lo-hi"),
    R("--cpu-strict", "cpu_strict", S, "use strict CPU placement", hint="<0|1>"),
    R("--prio", "prio", S, "process/thread priority", hint="N"),
    R("--poll", "poll", S, "polling level to wait for work", hint="<0...100>"),
    R("-Cb --cpu-mask-batch", "cpu_mask_batch", S, "CPU affinity mask for batches", hint="M"),
    R("-Crb --cpu-range-batch", "cpu_range_batch", S, "ranges of CPUs for batches", hint="lo-hi"),
    R("--cpu-strict-batch", "cpu_strict_batch", S, "strict CPU placement for batches", hint="<0|1>"),
    R("--prio-batch", "prio_batch", S, "thread priority for batches", hint="N"),
    R("--poll-batch", "poll_batch", S, "polling for batches", hint="<0|1>"),
    R("--numa", "numa", S, "NUMA optimizations: distribute, isolate or numactl", hint="TYPE",
      env="LLAMA_ARG_NUMA"),
    R("--perf", "perf", B, "internal libllama performance timings", neg="--no-perf", env="LLAMA_ARG_PERF",
      default=False),
    # --- RoPE overrides (context parameters, as llama.cpp's cparams); YaRN ones are refused ------
    R("--rope-scaling", "rope_scaling", S, "RoPE frequency scaling method", hint="{none,linear,yarn}",
      env="LLAMA_ARG_ROPE_SCALING_TYPE", convert=_rope_scaling,
      notes="default: the model's (linear when the GGUF names none); `none` never scales; `yarn` is refused"),
    R("--rope-scale", "rope_scale", FL, "RoPE context scaling factor (frequency scale 1/N)", hint="N",
      env="LLAMA_ARG_ROPE_SCALE", notes="the later of --rope-scale and --rope-freq-scale wins"),
    R("--rope-freq-base", "rope_freq_base", FL, "RoPE base frequency (0 = the model's)",
      hint="N", env="LLAMA_ARG_ROPE_FREQ_BASE",
      notes="applies to full-attention layers; Gemma 3's sliding-window layers keep theirs, as in llama.cpp"),
    R("--rope-freq-scale", "rope_freq_scale", FL, "RoPE frequency scaling factor (0 = the model's)", hint="N",
      env="LLAMA_ARG_ROPE_FREQ_SCALE"),
    R("--yarn-orig-ctx", "yarn_orig_ctx", S, "YaRN: original context size",
      hint="N", env="LLAMA_ARG_YARN_ORIG_CTX"),
    R("--yarn-ext-factor", "yarn_ext_factor", S, "YaRN: extrapolation mix factor", hint="N",
      env="LLAMA_ARG_YARN_EXT_FACTOR"),
    R("--yarn-attn-factor", "yarn_attn_factor", S, "YaRN: attention magnitude", hint="N",
      env="LLAMA_ARG_YARN_ATTN_FACTOR"),
    R("--yarn-beta-slow", "yarn_beta_slow", S, "YaRN: high correction dim",
      hint="N", env="LLAMA_ARG_YARN_BETA_SLOW"),
    R("--yarn-beta-fast", "yarn_beta_fast", S, "YaRN: low correction dim",
      hint="N", env="LLAMA_ARG_YARN_BETA_FAST"),
    # --- memory and devices -------------------------------------------------------------------
    R("-kvo --kv-offload", "kv_offload", B, "KV cache offloading", neg="-nkvo --no-kv-offload",
      env="LLAMA_ARG_KV_OFFLOAD"),
    R("--repack", "repack", B, "weight repacking", neg="-nr --no-repack", env="LLAMA_ARG_REPACK"),
    R("--no-host", "no_host", V, "bypass the host buffer", env="LLAMA_ARG_NO_HOST"),
    R("-dt --defrag-thold", "defrag_thold", S, "KV cache defragmentation threshold (deprecated)", hint="N",
      env="LLAMA_ARG_DEFRAG_THOLD"),
    R("--rpc", "rpc", S, "RPC servers, comma-separated", hint="SERVERS", env="LLAMA_ARG_RPC"),
    R("-lm --load-mode", "load_mode", S, "model loading mode", hint="MODE", env="LLAMA_ARG_LOAD_MODE"),
    R("-lzm --lazy-mode", "lazy_mode", S, "on-demand reading of some tensors", hint="MODE",
      env="LLAMA_ARG_LAZY_MODE"),
    R("-ot --override-tensor", "override_tensor", S, "override tensor buffer types",
      hint="<tensor name pattern>=<buffer type>,...", env="LLAMA_ARG_OVERRIDE_TENSOR"),
    R("-cmoe --cpu-moe", "cpu_moe", V, "keep all MoE weights in the CPU", env="LLAMA_ARG_CPU_MOE"),
    R("-ncmoe --n-cpu-moe", "n_cpu_moe", S, "keep the MoE weights of the first N layers in the CPU",
      env="LLAMA_ARG_N_CPU_MOE"),
    R("-ncffn --n-cpu-ffn", "n_cpu_ffn", S, "keep the FFN weights of the first N layers in the CPU",
      env="LLAMA_ARG_N_CPU_FFN"),
    R("-sm --split-mode", "split_mode", S, "how to split the model across GPUs",
      hint="{none,layer,row,tensor}",
      env="LLAMA_ARG_SPLIT_MODE"),
    R("-ts --tensor-split", "tensor_split", S, "fraction of the model per GPU", hint="N0,N1,N2,...",
      env="LLAMA_ARG_TENSOR_SPLIT"),
    R("-mg --main-gpu", "main_gpu", S, "the GPU to use", hint="INDEX", env="LLAMA_ARG_MAIN_GPU"),
    R("-dev", "llama_device", S, "llama.cpp backend devices (kvserve: --device auto|cpu|cuda)",
      hint="<dev1,dev2,..>", env="LLAMA_ARG_DEVICE"),
    R("--check-tensors", "check_tensors", V, "check model tensor data for invalid values"),
    R("--op-offload", "op_offload", B, "offload host tensor operations to device", neg="--no-op-offload"),
    # --- model changes (refused) ---------------------------------------------------------------
    R("--override-kv", "override_kv", S, "override model metadata by key", hint="KEY=TYPE:VALUE,..."),
    R("--control-vector", "control_vector", S, "add a control vector", hint="FNAME"),
    R("--control-vector-scaled", "control_vector_scaled", S, "add a scaled control vector",
      hint="FNAME:SCALE,..."),
    R("--control-vector-layer-range", "control_vector_layer_range", S, "layers the control vectors apply to",
      hint="START END", nargs=2),
    # --- speculative decoding -----------------------------------------------------------------
    R("--spec-draft-type-k -ctkd --cache-type-k-draft", "spec_draft_type_k", S, "draft KV cache type for K",
      hint="TYPE", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_K"),
    R("--spec-draft-type-v -ctvd --cache-type-v-draft", "spec_draft_type_v", S, "draft KV cache type for V",
      hint="TYPE", env="LLAMA_ARG_SPEC_DRAFT_CACHE_TYPE_V"),
    R("--spec-draft-threads -td --threads-draft", "spec_draft_threads", S, "draft generation threads"),
    R("--spec-draft-threads-batch -tbd --threads-batch-draft", "spec_draft_threads_batch", S,
      "draft batch threads"),
    R("--spec-draft-cpu-mask -Cd --cpu-mask-draft", "spec_draft_cpu_mask", S, "draft CPU affinity mask",
      hint="M"),
    R("--spec-draft-cpu-range -Crd --cpu-range-draft", "spec_draft_cpu_range", S, "draft CPU range",
      hint="lo-hi"),
    R("--spec-draft-cpu-strict --cpu-strict-draft", "spec_draft_cpu_strict", S, "draft strict CPU placement",
      hint="<0|1>"),
    R("--spec-draft-prio --prio-draft", "spec_draft_prio", S, "draft thread priority"),
    R("--spec-draft-poll --poll-draft", "spec_draft_poll", S, "draft polling", hint="<0|1>"),
    R("--spec-draft-cpu-mask-batch -Cbd --cpu-mask-batch-draft", "spec_draft_cpu_mask_batch", S,
      "draft batch CPU affinity mask", hint="M"),
    R("--spec-draft-cpu-strict-batch --cpu-strict-batch-draft", "spec_draft_cpu_strict_batch", S,
      "draft batch strict CPU placement", hint="<0|1>"),
    R("--spec-draft-prio-batch --prio-batch-draft", "spec_draft_prio_batch", S,
      "draft batch thread priority"),
    R("--spec-draft-poll-batch --poll-batch-draft", "spec_draft_poll_batch", S, "draft batch polling",
      hint="<0|1>"),
    R("--spec-draft-override-tensor -otd --override-tensor-draft", "spec_draft_override_tensor", S,
      "draft tensor buffer types", hint="<tensor name pattern>=<buffer type>,..."),
    R("--spec-draft-cpu-moe -cmoed --cpu-moe-draft", "spec_draft_cpu_moe", V, "draft MoE weights in the CPU",
      env="LLAMA_ARG_SPEC_DRAFT_CPU_MOE"),
    R("--spec-draft-n-cpu-moe --spec-draft-ncmoe -ncmoed --n-cpu-moe-draft", "spec_draft_n_cpu_moe", S,
      "draft MoE weights of the first N layers in the CPU", env="LLAMA_ARG_SPEC_DRAFT_N_CPU_MOE"),
    R("--spec-synth-len", "spec_synth_len", S, "synthetic acceptance length (benchmarking)", hint="L",
      env="LLAMA_ARG_SPEC_SYNTH_LEN"),
    R("--spec-synth-rates", "spec_synth_rates", S, "synthetic acceptance probabilities (benchmarking)",
      hint="P0,P1,...", env="LLAMA_ARG_SPEC_SYNTH_RATES"),
    R("--spec-draft-p-split --draft-p-split", "spec_draft_p_split", S, "speculative split probability",
      hint="P", env="LLAMA_ARG_SPEC_DRAFT_P_SPLIT"),
    R("--spec-draft-p-min --draft-p-min", "spec_draft_p_min", S, "minimum speculative probability", hint="P",
      env="LLAMA_ARG_SPEC_DRAFT_P_MIN"),
    R("--spec-draft-backend-sampling", "spec_draft_backend_sampling", B, "draft sampling on the backend",
      neg="--no-spec-draft-backend-sampling", env="LLAMA_ARG_SPEC_DRAFT_BACKEND_SAMPLING", default=False),
    R("--spec-draft-device -devd --device-draft", "spec_draft_device", S, "draft model devices",
      hint="<dev1,dev2,..>"),
    R("--spec-draft-ngl -ngld --gpu-layers-draft --n-gpu-layers-draft", "spec_draft_ngl", S,
      "draft layers in VRAM", env="LLAMA_ARG_N_GPU_LAYERS_DRAFT"),
    R("--spec-ngram-mod-n-min", "spec_ngram_mod_n_min", S, "ngram-mod minimum tokens"),
    R("--spec-ngram-mod-n-max", "spec_ngram_mod_n_max", S, "ngram-mod maximum tokens"),
    R("--spec-ngram-mod-n-match", "spec_ngram_mod_n_match", S, "ngram-mod lookup length"),
    R("--spec-ngram-simple-size-n", "spec_ngram_simple_size_n", S, "ngram-simple lookup size"),
    R("--spec-ngram-simple-size-m", "spec_ngram_simple_size_m", S, "ngram-simple draft size"),
    R("--spec-ngram-simple-min-hits", "spec_ngram_simple_min_hits", S, "ngram-simple minimum hits"),
    R("--spec-ngram-map-k-size-n", "spec_ngram_map_k_size_n", S, "ngram-map-k lookup size"),
    R("--spec-ngram-map-k-size-m", "spec_ngram_map_k_size_m", S, "ngram-map-k draft size"),
    R("--spec-ngram-map-k-min-hits", "spec_ngram_map_k_min_hits", S, "ngram-map-k minimum hits"),
    R("--spec-ngram-map-k4v-size-n", "spec_ngram_map_k4v_size_n", S, "ngram-map-k4v lookup size"),
    R("--spec-ngram-map-k4v-size-m", "spec_ngram_map_k4v_size_m", S, "ngram-map-k4v draft size"),
    R("--spec-ngram-map-k4v-min-hits", "spec_ngram_map_k4v_min_hits", S, "ngram-map-k4v minimum hits"),
    R("-lcs --lookup-cache-static", "lookup_cache_static", S, "static lookup cache", hint="FNAME"),
    R("-lcd --lookup-cache-dynamic", "lookup_cache_dynamic", S, "dynamic lookup cache", hint="FNAME"),
    R("--spec-default", "spec_default", V, "enable the default speculative decoding config"),
    # removed by llama.cpp itself
    R("--draft --draft-n --draft-max", "draft_removed", S, "removed: use --spec-draft-n-max",
      env="LLAMA_ARG_DRAFT_MAX", convert=_removed("use --spec-draft-n-max or --spec-ngram-mod-n-max")),
    R("--draft-min --draft-n-min", "draft_min_removed", S, "removed: use --spec-draft-n-min",
      env="LLAMA_ARG_DRAFT_MIN", convert=_removed("use --spec-draft-n-min or --spec-ngram-mod-n-min")),
    R("--spec-ngram-size-n", "spec_ngram_size_n_removed", S, "removed",
      convert=_removed("use the respective --spec-ngram-*-size-n")),
    R("--spec-ngram-size-m", "spec_ngram_size_m_removed", S, "removed",
      convert=_removed("use the respective --spec-ngram-*-size-m")),
    R("--spec-ngram-min-hits", "spec_ngram_min_hits_removed", S, "removed",
      convert=_removed("use the respective --spec-ngram-*-min-hits")),
    # --- multimodal encoding ------------------------------------------------------------------
    R("--mmproj-offload", "mmproj_offload", B, "GPU offloading for the projector", neg="--no-mmproj-offload",
      env="LLAMA_ARG_MMPROJ_OFFLOAD"),
    R("-mmdev --mmproj-device", "mmproj_device", S, "projector device",
      hint="DEVICE", env="MTMD_BACKEND_DEVICE"),
    R("--image-min-tokens", "image_min_tokens", S, "minimum tokens per image",
      env="LLAMA_ARG_IMAGE_MIN_TOKENS"),
    R("--image-max-tokens", "image_max_tokens", S, "maximum tokens per image",
      env="LLAMA_ARG_IMAGE_MAX_TOKENS"),
    R("--mtmd-batch-max-tokens", "mtmd_batch_max_tokens", S, "image tokens per encoding batch",
      env="LLAMA_ARG_MTMD_BATCH_MAX_TOKENS"),
    R("--video-fps", "video_fps", S, "target video frame rate", env="LLAMA_ARG_VIDEO_FPS"),
    R("--video-timestamp-interval", "video_timestamp_interval", S, "ms between video timestamps",
      env="LLAMA_ARG_VIDEO_TIMESTAMP_INTERVAL"),
    R("--video-ffmpeg-dir", "video_ffmpeg_dir", S, "directory of ffmpeg and ffprobe", hint="DIR",
      env="LLAMA_ARG_VIDEO_FFMPEG_DIR"),
    # --- Web UI settings and agent tools ---------------------------------------------------------
    R("--ui-config --webui-config", "ui_config", S, "default Web UI settings (JSON), shown in /props",
      hint="JSON", env="LLAMA_ARG_UI_CONFIG", notes="invalid JSON is fatal"),
    R("--ui-config-file --webui-config-file", "ui_config", S, "file of default Web UI settings (JSON)",
      hint="PATH", env="LLAMA_ARG_UI_CONFIG_FILE", convert=_read_text_file,
      notes="the file is read at start; the later of the two flags wins"),
    R("--tools-runtime", "tools_runtime", S, "run tools in a separate runtime", hint="OPTION",
      env="LLAMA_ARG_TOOLS_RUNTIME", notes="docker:IMAGE / podman:IMAGE (a container spawned at start and "
      "removed at exit), docker-container:ID / podman-container:ID, ssh:TARGET"),
    R("--mcp-servers-config", "mcp_servers_config", S, "JSON file of MCP servers", hint="PATH",
      env="LLAMA_ARG_MCP_SERVERS_CONFIG",
      notes="stdio MCP servers whose tools /tools serves (see MCP servers above); a missing file is fatal"),
    R("--mcp-servers-json", "mcp_servers_json", S, "inline JSON of MCP servers", hint="JSON",
      env="LLAMA_ARG_MCP_SERVERS_JSON",
      notes="as --mcp-servers-config, after its servers (a repeated name is skipped); invalid JSON is fatal"),
    # --- model presets (download models: refused) ----------------------------------------------
    *(R(f"--{name}", name.replace("-", "_").replace(".", "_"), V, f"model preset {name}")
      for name in PRESET_NAMES),
)

OTHER_ROWS = _ROWS
