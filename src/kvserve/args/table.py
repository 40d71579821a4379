"""The flag table: one ``FlagSpec`` row per llama-server flag (plus kvserve's own), in help order.

``FLAGS`` is the table with statuses from ``status.REFUSED`` applied; ``find_flag`` and
``flags_for_dest`` look rows up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .convert import (
    DEFAULT_SAMPLERS,
    _api_key_file,
    _api_keys,
    _append,
    _append_one,
    _chat_template_file,
    _choice,
    _csv_names,
    _dict_update,
    _dry_base,
    _dry_breaker,
    _int_min,
    _kv_type,
    _logit_bias,
    _np,
    _onoff,
    _sampler_seq,
    _samplers,
    _seed,
    _sleep_idle,
    _slot_save_path,
    _sorted_set,
    _temp,
    _template_kwargs,
    _tristate,
)
from .spec import INT_MAX, LLAMA_DEFAULT_SEED, REFUSED_STATUS, WARNED_STATUS, ArgType, FlagSpec, parse_csv_row
from .status import REFUSED, WARNED
from .table_extra import OTHER_ROWS

I, FL, S, B, V = ArgType.INT, ArgType.FLOAT, ArgType.STR, ArgType.BOOL, ArgType.VOID  # noqa: E741 - short type names keep the table readable


def F(names: str, dest: str, type_: ArgType, default: Any, help: str, *, neg: str = "",
      **kw: Any) -> FlagSpec:
    hint = kw.pop("hint", None)
    if hint is None and type_ in (I, FL, S):
        hint = "N" if type_ in (I, FL) else "VALUE"
    return FlagSpec(tuple(names.split()), dest, type_, default, help, neg_names=tuple(neg.split()),
                    hint=hint, **kw)


_SRV, _SMP = "server", "sampling"

_ROWS: tuple[FlagSpec, ...] = (
    # --- meta ---------------------------------------------------------------------------------
    F("-h --help --usage", "help", V, False, "print usage and exit", action="help", shown_default="-"),
    F("--version", "version", V, False, "show version and build info, then exit", action="version",
      shown_default="-"),
    # --- model ----------------------------------------------------------------------------------
    F("-m --model", "model", S, None, "model path (GGUF) to load", env="LLAMA_ARG_MODEL", hint="FNAME",
      shown_default="none (router)",
      notes="without -m kvserve starts as llama-server's router (the embedded SmolLM2 is one of its models)"),
    F("-mu --model-url", "model_url", S, None, "model download url", env="LLAMA_ARG_MODEL_URL",
      hint="MODEL_URL"),
    F("-hf -hfr --hf-repo", "hf_repo", S, None, "Hugging Face model repository", env="LLAMA_ARG_HF_REPO",
      hint="<user>/<model>[:quant]"),
    F("-hff --hf-file", "hf_file", S, None, "Hugging Face model file", env="LLAMA_ARG_HF_FILE", hint="FILE"),
    F("-hft --hf-token", "hf_token", S, None, "Hugging Face access token", hint="TOKEN",
      notes="the HF_TOKEN env var is not read, so a token in the environment does not stop kvserve"),
    F("-dr --docker-repo", "docker_repo", S, None, "Docker Hub model repository",
      env="LLAMA_ARG_DOCKER_REPO", hint="[<repo>/]<model>[:quant]"),
    F("--offline", "offline", V, False, "offline mode: no network access", env="LLAMA_ARG_OFFLINE",
      notes="always true: kvserve never uses the network"),
    F("-a --alias", "aliases", S, (), "model name aliases, comma-separated (used by the API)",
      env="LLAMA_ARG_ALIAS", hint="STRING", convert=_csv_names, merge=_sorted_set,
      shown_default="(the -m path as given)",
      notes="stored sorted; the API model id is the first alias"),
    F("--tags", "tags", S, (), "model tags, comma-separated (informational, shown in /v1/models)",
      env="LLAMA_ARG_TAGS", hint="STRING", convert=_csv_names, merge=_sorted_set),
    # --- HTTP -----------------------------------------------------------------------------------
    F("--host", "host", S, "127.0.0.1", "IP address to listen on", env="LLAMA_ARG_HOST", hint="HOST"),
    F("--port", "port", I, 8080, "port to listen on (0 = any free port)", env="LLAMA_ARG_PORT",
      hint="PORT"),
    F("--reuse-port", "reuse_port", V, False, "allow several sockets to bind the same port",
      env="LLAMA_ARG_REUSE_PORT"),
    F("--api-prefix", "api_prefix", S, "", "prefix path the server serves from, no trailing slash",
      env="LLAMA_ARG_API_PREFIX", hint="PREFIX"),
    F("--api-key", "api_keys", S, (), "API keys, comma-separated", env="LLAMA_API_KEY", hint="KEY",
      convert=_api_keys, merge=_append,
      notes="appends: keys from the env var, --api-key and --api-key-file are all accepted"),
    F("--api-key-file", "api_keys", S, (), "file with one API key per line ('#' lines are comments)",
      env="LLAMA_ARG_API_KEY_FILE", hint="FNAME", convert=_api_key_file, merge=_append,
      notes="a missing file is fatal"),
    F("--ssl-key-file", "ssl_key_file", S, None, "PEM-encoded SSL private key",
      env="LLAMA_ARG_SSL_KEY_FILE", hint="FNAME"),
    F("--ssl-cert-file", "ssl_cert_file", S, None, "PEM-encoded SSL certificate",
      env="LLAMA_ARG_SSL_CERT_FILE", hint="FNAME"),
    F("--cors-origins", "cors_origins", S, "*", "allowed CORS origins, comma-separated, or 'localhost'",
      env="LLAMA_ARG_CORS_ORIGINS", hint="ORIGINS"),
    F("--cors-methods", "cors_methods", S, "GET, POST, DELETE, OPTIONS", "allowed CORS methods",
      env="LLAMA_ARG_CORS_METHODS", hint="METHODS"),
    F("--cors-headers", "cors_headers", S, "*", "allowed CORS headers", env="LLAMA_ARG_CORS_HEADERS",
      hint="HEADERS"),
    F("--cors-credentials", "cors_credentials", B, True, "allow credentials for CORS",
      neg="--no-cors-credentials", env="LLAMA_ARG_CORS_CREDENTIALS"),
    F("-to --timeout", "timeout", I, 3600, "HTTP read/write timeout in seconds", env="LLAMA_ARG_TIMEOUT",
      notes="a request that produces no result for this long is cancelled and answered 503"),
    F("--sse-ping-interval", "sse_ping_interval", I, 30, "SSE keep-alive interval in seconds (-1 = off)",
      env="LLAMA_ARG_SSE_PING_INTERVAL"),
    F("--threads-http", "threads_http", I, -1, "threads used to process HTTP requests (-1 = auto)",
      env="LLAMA_ARG_THREADS_HTTP"),
    F("--slots", "endpoint_slots", B, True, "expose GET /slots", neg="--no-slots",
      env="LLAMA_ARG_ENDPOINT_SLOTS"),
    F("--metrics", "endpoint_metrics", V, False, "enable the Prometheus /metrics endpoint",
      env="LLAMA_ARG_ENDPOINT_METRICS"),
    F("--props", "endpoint_props", V, False, "allow changing global properties via POST /props",
      env="LLAMA_ARG_ENDPOINT_PROPS"),
    F("--ui --webui", "ui", B, True, "serve the built-in Web UI at /", neg="--no-ui --no-webui",
      env="LLAMA_ARG_UI", notes="with --no-ui, / answers 404"),
    F("--path", "static_path", S, "", "serve static files from this path instead of the built-in UI",
      env="LLAMA_ARG_STATIC_PATH", hint="PATH", notes="a missing directory is fatal (unless --no-ui)"),
    F("--ui-mcp-proxy --webui-mcp-proxy", "ui_mcp_proxy", B, False, "enable the MCP CORS proxy",
      neg="--no-ui-mcp-proxy --no-webui-mcp-proxy", env="LLAMA_ARG_UI_MCP_PROXY"),
    F("--tools", "tools", S, None, "built-in agent tools, comma-separated", env="LLAMA_ARG_TOOLS",
      hint="TOOL1,TOOL2,...", notes="`all` or names of read_file, file_glob_search, grep_search, "
      "exec_shell_command, write_file, edit_file, get_info; an unknown name stops start-up"),
    F("-ag --agent", "agent", B, False, "enable the CORS proxy and all built-in tools",
      neg="-no-ag --no-agent", env="LLAMA_ARG_AGENT"),
    F("--sleep-idle-seconds", "sleep_idle_seconds", I, -1, "unload the model after N idle seconds",
      hint="SECONDS", convert=_sleep_idle,
      notes="frees weights, KV pool and prompt cache; /health, /props, /models, /metrics answer "
            "without waking; any other request reloads the model"),
    # --- router ---------------------------------------------------------------------------------
    F("--models-dir", "models_dir", S, None, "router: directory of models", env="LLAMA_ARG_MODELS_DIR",
      hint="PATH", notes="NAME.gguf and NAME/ (split or single GGUF) are the model NAME"),
    F("--models-preset", "models_preset", S, None, "router: INI file of model presets",
      env="LLAMA_ARG_MODELS_PRESET", hint="PATH"),
    F("--models-max", "models_max", I, 4, "router: models loaded at once", env="LLAMA_ARG_MODELS_MAX",
      notes="0 = no limit; loading one more stops the least recently used idle model"),
    F("--models-autoload", "models_autoload", B, True, "router: load models on demand",
      neg="--no-models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD"),
    # --- context, slots, cache ------------------------------------------------------------------
    F("-c --ctx-size", "n_ctx", I, 0, "total KV size for all slots (0 = from the model)",
      env="LLAMA_ARG_CTX_SIZE", notes="padded to a multiple of 256"),
    F("--kv-unified-per-slot", "kv_unified_per_slot", I, 0, "cap on per-slot context (0 = none)",
      env="LLAMA_ARG_KV_UNIFIED_PER_SLOT", notes="without -c the pool is sized to n_parallel * N"),
    F("-n --predict --n-predict", "n_predict", I, -1, "tokens to predict (-1 = unlimited)",
      env="LLAMA_ARG_N_PREDICT"),
    F("-b --batch-size", "n_batch", I, 2048, "logical maximum batch size", env="LLAMA_ARG_BATCH"),
    F("-ub --ubatch-size", "n_ubatch", I, 512, "physical maximum batch size", env="LLAMA_ARG_UBATCH",
      notes="on CUDA a prompt forward takes up to n_batch tokens (at most 2048; KVSERVE_FORWARD_TOKENS=0 keeps "
            "n_ubatch): launch-bound there; n_ubatch still bounds unsplittable inputs"),
    F("-np --parallel", "n_parallel", I, -1, "number of server slots (-1 = auto: 4 slots, unified KV)",
      env="LLAMA_ARG_N_PARALLEL", convert=_np, notes="auto (-1) = 4 slots sharing one unified KV pool"),
    F("-cb --cont-batching", "cont_batching", B, True, "continuous batching", neg="-nocb --no-cont-batching",
      env="LLAMA_ARG_CONT_BATCHING"),
    F("-kvu --kv-unified", "kv_unified", B, False, "one KV buffer shared by all sequences",
      neg="-no-kvu --no-kv-unified", env="LLAMA_ARG_KV_UNIFIED",
      notes="forced on when -np is auto. kvserve always keeps one page pool for all slots; this flag "
      "decides the per-slot context limit (unified: the whole -c; otherwise -c / -np, padded to 256)"),
    F("--cache-prompt", "cache_prompt", B, True, "prompt caching", neg="--no-cache-prompt",
      env="LLAMA_ARG_CACHE_PROMPT",
      notes="default of the per-request cache_prompt: lookup in, and donation to, the one prefix cache "
      "shared by all slots (token-granular, prompt and generated tokens)"),
    F("--cache-reuse", "cache_reuse", I, 0, "min chunk size for KV-shift reuse (0 = off)",
      env="LLAMA_ARG_CACHE_REUSE",
      notes="default of n_cache_reuse: cached chunks that moved are re-rotated into place (rope_shift) on "
      "private copies of shared pages; shifted KV is not donated back (it is approximate)"),
    F("-sps --slot-prompt-similarity", "slot_prompt_similarity", FL, 0.10,
      "prompt similarity needed to reuse a slot (0.0 = off)", hint="SIMILARITY"),
    F("-cram --cache-ram", "cache_ram_mib", I, 8192,
      "host-RAM prompt cache size in MiB (-1 = no limit, 0 = off)", env="LLAMA_ARG_CACHE_RAM",
      notes="strict byte budget for KV pages that no running request holds (LRU eviction); on CUDA "
      "with KVSERVE_HOST_TIER=1 it bounds a host tier instead: pages the GPU pool evicts move to "
      "pinned host memory and come back on a prefix hit; 0 turns prefix reuse off entirely, also "
      "within a slot; shown in /metrics and /props"),
    F("--cache-idle-slots", "cache_idle_slots", B, True, "save idle slots to the prompt cache",
      neg="--no-cache-idle-slots", env="LLAMA_ARG_CACHE_IDLE_SLOTS",
      notes="on: a finished request's KV goes to the prefix cache shared by every slot. off: it stays "
      "reusable only by the slot that computed it (llama-server's per-slot reuse). Disabled with a "
      "warning when --cache-ram is 0"),
    F("-ctxcp --ctx-checkpoints --swa-checkpoints", "ctx_checkpoints", I, 32,
      "max context checkpoints per slot", env="LLAMA_ARG_CTX_CHECKPOINTS"),
    F("-cms --checkpoint-min-step", "checkpoint_min_step", I, 8192, "min token spacing between checkpoints",
      env="LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT",
      convert=_int_min(0, "checkpoint-min-step must be non-negative")),
    F("--context-shift", "context_shift", B, False, "context shift on infinite generation",
      neg="--no-context-shift", env="LLAMA_ARG_CONTEXT_SHIFT"),
    F("--swa-full", "swa_full", V, False, "full-size SWA cache", env="LLAMA_ARG_SWA_FULL",
      notes="kvserve always keeps full-size KV for sliding-window layers (windows are applied as "
      "masks), so prefix reuse works at any length; the flag names that behaviour"),
    F("--keep", "n_keep", I, 0, "tokens to keep from the prompt on context shift (-1 = all)"),
    F("--slot-save-path", "slot_save_path", S, None, "directory for slot save/restore (enables POST /slots)",
      hint="PATH", convert=lambda t, w: _slot_save_path(t, w), notes="must be an existing directory"),
    F("-fa --flash-attn", "flash_attn", S, "auto", "flash attention: on, off or auto",
      env="LLAMA_ARG_FLASH_ATTN", hint="[on|off|auto]", convert=_tristate("--flash-attn"),
      notes="selects the attention backend"),
    F("-ctk --cache-type-k", "cache_type_k", S, "f16", "KV cache data type for K",
      env="LLAMA_ARG_CACHE_TYPE_K", hint="TYPE", convert=_kv_type),
    F("-ctv --cache-type-v", "cache_type_v", S, "f16", "KV cache data type for V",
      env="LLAMA_ARG_CACHE_TYPE_V", hint="TYPE", convert=_kv_type),
    F("--warmup", "warmup", B, True, "empty warmup run at load time", neg="--no-warmup"),
    F("-ngl --gpu-layers --n-gpu-layers", "n_gpu_layers", S, "auto", "layers to store in VRAM",
      env="LLAMA_ARG_N_GPU_LAYERS", hint="N"),
    F("-fit --fit", "fit", S, "on", "adjust unset arguments to fit in device memory",
      env="LLAMA_ARG_FIT", hint="[on|off]", convert=_onoff("--fit")),
    F("-fitc --fit-ctx", "fit_ctx", I, 4096, "minimum ctx size --fit may choose", env="LLAMA_ARG_FIT_CTX"),
    F("-fitt --fit-target", "fit_target", S, "1024", "--fit margin per device in MiB",
      env="LLAMA_ARG_FIT_TARGET", hint="MiB0,MiB1,..."),
    F("-t --threads", "threads", I, -1, "CPU threads for generation (torch intra-op threads)",
      env="LLAMA_ARG_THREADS", notes="<= 0 given explicitly means all cores"),
    F("-tb --threads-batch", "threads_batch", I, -1, "CPU threads for prompt processing (default: -t)"),
    # --- chat -----------------------------------------------------------------------------------
    F("--jinja", "jinja", B, True, "use Jinja chat templates", neg="--no-jinja", env="LLAMA_ARG_JINJA"),
    F("--chat-template", "chat_template", S, None, "chat template: a built-in name or inline Jinja",
      env="LLAMA_ARG_CHAT_TEMPLATE", hint="JINJA_TEMPLATE", shown_default="model metadata"),
    F("--chat-template-file", "chat_template", S, None, "file with a Jinja chat template",
      env="LLAMA_ARG_CHAT_TEMPLATE_FILE", hint="JINJA_TEMPLATE_FILE", convert=_chat_template_file,
      shown_default="model metadata", notes="read at startup; a missing file is fatal"),
    F("--chat-template-kwargs", "chat_template_kwargs", S, (), "extra template params as a JSON object",
      env="LLAMA_ARG_CHAT_TEMPLATE_KWARGS", hint="STRING", convert=_template_kwargs, merge=_dict_update,
      shown_default="{}", notes="preserve_reasoning defaults to true"),
    F("--reasoning-format", "reasoning_format", S, "auto", "thought extraction: none, auto, deepseek, "
      "deepseek-legacy", env="LLAMA_ARG_THINK", hint="FORMAT",
      convert=_choice("--reasoning-format", ("none", "auto", "deepseek", "deepseek-legacy"))),
    F("-rea --reasoning", "reasoning", S, "auto", "reasoning on, off or auto", env="LLAMA_ARG_REASONING",
      hint="[on|off|auto]", convert=_tristate("--reasoning")),
    F("--reasoning-budget", "reasoning_budget", I, -1, "thinking token budget (-1 = unlimited)",
      env="LLAMA_ARG_THINK_BUDGET", convert=_int_min(-1, "invalid value")),
    F("--reasoning-budget-message", "reasoning_budget_message", S, None,
      "text injected before the forced end of thinking", env="LLAMA_ARG_THINK_BUDGET_MESSAGE",
      hint="MESSAGE"),
    F("--reasoning-effort", "reasoning_effort", S, None, "template kwarg reasoning_effort",
      env="LLAMA_ARG_REASONING_EFFORT", hint="LEVEL"),
    F("--reasoning-preserve", "reasoning_preserve", B, None, "template kwarg preserve_reasoning",
      neg="--no-reasoning-preserve", env="LLAMA_ARG_REASONING_PRESERVE", shown_default="template default"),
    F("--prefill-assistant", "prefill_assistant", B, True, "prefill a trailing assistant message",
      neg="--no-prefill-assistant", env="LLAMA_ARG_PREFILL_ASSISTANT"),
    F("--skip-chat-parsing", "skip_chat_parsing", B, False, "force a pure content parser",
      neg="--no-skip-chat-parsing", env="LLAMA_ARG_SKIP_CHAT_PARSING"),
    # --- output ---------------------------------------------------------------------------------
    F("-sp --special", "special", V, False, "render special tokens in output text"),
    F("-r --reverse-prompt", "reverse_prompt", S, (), "extra stop string (repeatable)", hint="PROMPT",
      merge=_append_one, notes="escape sequences processed unless --no-escape"),
    F("-e --escape", "escape", B, True, "process escapes (\\n, \\r, \\t, \\', \\\", \\\\) in -r and "
      "--dry-sequence-breaker", neg="--no-escape"),
    F("--spm-infill", "spm_infill", V, False, "suffix/prefix/middle order for /infill"),
    # --- logging --------------------------------------------------------------------------------
    F("-lv --verbosity --log-verbosity", "verbosity", I, 3,
      "log verbosity threshold: 0 output, 1 error, 2 warn, 3 info, 4 trace, 5 debug",
      env="LLAMA_ARG_LOG_VERBOSITY"),
    F("-v --verbose --log-verbose", "verbosity", V, 3, "log everything (verbosity = INT_MAX)",
      const=INT_MAX, shown_default="off"),
    F("--log-disable", "log_disable", V, False, "disable logging"),
    F("--log-file", "log_file", S, None, "also log to this file", env="LLAMA_ARG_LOG_FILE", hint="FNAME"),
    F("--log-prompts-dir", "log_prompts_dir", S, None, "debug: write raw prompts to this directory",
      hint="PATH"),
    F("--log-jsonl", "log_jsonl", B, False, "JSON lines log format", neg="--no-log-jsonl",
      env="LLAMA_ARG_LOG_JSONL"),
    F("--log-colors", "log_colors", S, "auto", "colored logging: on, off or auto", env="LLAMA_ARG_LOG_COLORS",
      hint="[on|off|auto]", convert=_tristate("--log-colors")),
    F("--log-prefix", "log_prefix", B, None, "prefix in log messages", neg="--no-log-prefix",
      env="LLAMA_ARG_LOG_PREFIX", shown_default="unset"),
    F("--log-timestamps", "log_timestamps", B, None, "timestamps in log messages",
      neg="--no-log-timestamps", env="LLAMA_ARG_LOG_TIMESTAMPS", shown_default="unset"),
    # --- embeddings -----------------------------------------------------------------------------
    F("--embedding --embeddings", "embedding", V, False, "enable the embedding endpoints",
      env="LLAMA_ARG_EMBEDDINGS", notes="forces n_batch = n_ubatch when larger"),
    F("--rerank --reranking", "rerank", V, False, "enable /rerank", env="LLAMA_ARG_RERANKING"),
    F("--pooling", "pooling", S, None, "embedding pooling: none, mean, cls, last, rank",
      env="LLAMA_ARG_POOLING", hint="{none,mean,cls,last,rank}", shown_default="model default",
      convert=_choice("--pooling", ("none", "mean", "cls", "last", "rank"))),
    F("--embd-normalize", "embd_normalize", I, 2,
      "embedding normalization: -1 none, 0 max-abs int16, 1 taxicab, 2 L2, >2 p-norm"),
    # --- adapters, multimodal, speculative ------------------------------------------------------
    F("--lora", "lora", S, (), "LoRA adapter paths, comma-separated", hint="FNAME",
      convert=lambda t, w: tuple(parse_csv_row(t)), merge=_append),
    F("--lora-scaled", "lora_scaled", S, (), "LoRA adapters with scale, FNAME:SCALE,...",
      hint="FNAME:SCALE,...", convert=lambda t, w: tuple(parse_csv_row(t)), merge=_append),
    F("--lora-init-without-apply", "lora_init_without_apply", V, False, "load LoRA adapters unapplied"),
    F("-mm --mmproj", "mmproj", S, None, "multimodal projector file", env="LLAMA_ARG_MMPROJ", hint="FILE"),
    F("-mmu --mmproj-url", "mmproj_url", S, None, "multimodal projector URL", env="LLAMA_ARG_MMPROJ_URL",
      hint="URL"),
    F("--mmproj-auto", "mmproj_auto", B, False, "use a multimodal projector when available",
      neg="--no-mmproj --no-mmproj-auto", env="LLAMA_ARG_MMPROJ_AUTO", notes="llama-server default: enabled"),
    F("--media-path", "media_path", S, None, "directory for file:// media", hint="PATH"),
    F("--spec-draft-model -md --model-draft", "model_draft", S, None, "draft model for speculative decoding",
      env="LLAMA_ARG_SPEC_DRAFT_MODEL", hint="FNAME"),
    F("--spec-draft-hf -hfd -hfrd --hf-repo-draft", "hf_repo_draft", S, None, "draft model HF repository",
      env="LLAMA_ARG_SPEC_DRAFT_HF_REPO", hint="<user>/<model>[:quant]"),
    F("--spec-type", "spec_type", S, "none", "speculative decoding types, comma-separated",
      env="LLAMA_ARG_SPEC_TYPE", hint="TYPES"),
    F("--spec-draft-n-max", "spec_draft_n_max", I, 3, "tokens to draft", env="LLAMA_ARG_SPEC_DRAFT_N_MAX"),
    F("--spec-draft-n-min", "spec_draft_n_min", I, 0, "minimum draft tokens",
      env="LLAMA_ARG_SPEC_DRAFT_N_MIN"),
    # --- sampling (dest = the request field name) -----------------------------------------------
    F("--samplers", "samplers", S, DEFAULT_SAMPLERS, "samplers in order, ';'-separated",
      hint="SAMPLERS", convert=_samplers, group=_SMP, shown_default=";".join(DEFAULT_SAMPLERS)),
    F("--sampler-seq --sampling-seq", "samplers", S, DEFAULT_SAMPLERS, "sampler order as chars",
      hint="SEQUENCE", convert=_sampler_seq, group=_SMP, shown_default="edskypmxt"),
    F("-s --seed", "seed", S, LLAMA_DEFAULT_SEED, "RNG seed (-1 = random)", hint="SEED", convert=_seed,
      group=_SMP, shown_default="-1"),
    F("--ignore-eos", "ignore_eos", V, False, "ignore end of stream and keep generating", group=_SMP),
    F("--temp --temperature", "temperature", FL, 0.80, "temperature (negative = 0)",
      env="LLAMA_ARG_TEMPERATURE", convert=_temp, group=_SMP),
    F("--top-k", "top_k", I, 40, "top-k sampling (0 = off)", env="LLAMA_ARG_TOP_K", group=_SMP),
    F("--top-p", "top_p", FL, 0.95, "top-p sampling (1.0 = off)", env="LLAMA_ARG_TOP_P", group=_SMP),
    F("--min-p", "min_p", FL, 0.05, "min-p sampling (0.0 = off)", env="LLAMA_ARG_MIN_P", group=_SMP),
    F("--top-nsigma --top-n-sigma", "top_n_sigma", FL, -1.0, "top-n-sigma sampling (-1 = off)", group=_SMP),
    F("--xtc-probability", "xtc_probability", FL, 0.0, "XTC probability (0.0 = off)", group=_SMP),
    F("--xtc-threshold", "xtc_threshold", FL, 0.10, "XTC threshold (> 0.5 = off)", group=_SMP),
    F("--typical --typical-p", "typical_p", FL, 1.0, "locally typical sampling p (1.0 = off)", group=_SMP),
    F("--repeat-last-n", "repeat_last_n", I, 64, "tokens considered for penalties (0 = off, -1 = ctx)",
      convert=_int_min(-1, "error: invalid repeat-last-n = {value}"), group=_SMP),
    F("--repeat-penalty", "repeat_penalty", FL, 1.0, "repeat penalty (1.0 = off)",
      env="LLAMA_ARG_REPEAT_PENALTY", group=_SMP),
    F("--presence-penalty", "presence_penalty", FL, 0.0, "presence penalty (0.0 = off)",
      env="LLAMA_ARG_PRESENCE_PENALTY", group=_SMP),
    F("--frequency-penalty", "frequency_penalty", FL, 0.0, "frequency penalty (0.0 = off)",
      env="LLAMA_ARG_FREQUENCY_PENALTY", group=_SMP),
    F("--dry-multiplier", "dry_multiplier", FL, 0.0, "DRY multiplier (0.0 = off)", group=_SMP),
    F("--dry-base", "dry_base", FL, 1.75, "DRY base (values below 1 are ignored)", merge=_dry_base,
      group=_SMP),
    F("--dry-allowed-length", "dry_allowed_length", I, 2, "DRY allowed length", group=_SMP),
    F("--dry-penalty-last-n", "dry_penalty_last_n", I, 64, "DRY window (0 = off, -1 = ctx)",
      convert=_int_min(-1, "error: invalid dry-penalty-last-n = {value}"), group=_SMP),
    F("--dry-sequence-breaker", "dry_sequence_breakers", S, ("\n", ":", '"', "*"),
      "add a DRY sequence breaker, clearing the defaults ('none' = no breakers)", hint="STRING",
      merge=_dry_breaker, group=_SMP, shown_default="'\\n', ':', '\"', '*'"),
    F("--mirostat", "mirostat", I, 0, "Mirostat (0 = off, 1 = Mirostat, 2 = Mirostat 2.0)", group=_SMP),
    F("--mirostat-lr", "mirostat_eta", FL, 0.10, "Mirostat learning rate (eta)", group=_SMP),
    F("--mirostat-ent", "mirostat_tau", FL, 5.0, "Mirostat target entropy (tau)", group=_SMP),
    F("--dynatemp-range", "dynatemp_range", FL, 0.0, "dynamic temperature range (0.0 = off)", group=_SMP),
    F("--dynatemp-exp", "dynatemp_exponent", FL, 1.0, "dynamic temperature exponent", group=_SMP),
    F("--adaptive-target", "adaptive_target", FL, -1.0, "adaptive-p target probability (negative = off)",
      group=_SMP),
    F("--adaptive-decay", "adaptive_decay", FL, 0.90, "adaptive-p decay", group=_SMP),
    F("-l --logit-bias", "logit_bias", S, (), "logit bias TOKEN_ID(+/-)BIAS (repeatable)",
      hint="TOKEN_ID(+/-)BIAS", convert=_logit_bias, merge=_append, group=_SMP, shown_default="none"),
    F("--grammar", "grammar", S, None, "BNF-like grammar", hint="GRAMMAR", group=_SMP),
    F("--grammar-file", "grammar_file", S, None, "file to read a grammar from", hint="FNAME", group=_SMP),
    F("-j --json-schema", "json_schema", S, None, "JSON schema to constrain generations", hint="SCHEMA",
      group=_SMP),
    F("-jf --json-schema-file", "json_schema_file", S, None, "file with a JSON schema", hint="FILE",
      group=_SMP),
    F("-bs --backend-sampling", "backend_sampling", V, False, "backend sampling (experimental)",
      env="LLAMA_ARG_BACKEND_SAMPLING", group=_SMP),
    # --- kvserve only ---------------------------------------------------------------------------
    F("--dtype", "dtype", S, "auto", "weights and compute dtype: auto (on CPU: GGUF weights stay quantized, activations f32; on CUDA: bf16), "
      "f32 (every weight dequantized to f32: the reference), bf16, f16",
      env="KVSERVE_ARG_DTYPE", hint="{auto,f32,bf16,f16}",
      convert=_choice("--dtype", ("auto", "f32", "bf16", "f16")),
      group="kvserve", kvserve_only=True),
    F("--device", "device", S, "auto", "where the model runs: auto (CUDA when available), cpu, cuda",
      env="KVSERVE_ARG_DEVICE", hint="{auto,cpu,cuda}", convert=_choice("--device", ("auto", "cpu", "cuda")),
      group="kvserve", kvserve_only=True,
      notes="llama.cpp's -dev/--device takes backend device names; kvserve's takes auto/cpu/cuda"),
)


def _with_status(rows: Sequence[FlagSpec]) -> tuple[FlagSpec, ...]:
    out = []
    for spec in rows:
        if spec.dest in REFUSED:
            spec = replace(spec, status=REFUSED_STATUS, reason=REFUSED[spec.dest])
        elif spec.dest in WARNED:
            spec = replace(spec, status=WARNED_STATUS, reason=WARNED[spec.dest])
        out.append(spec)
    return tuple(out)


FLAGS: tuple[FlagSpec, ...] = _with_status(_ROWS + OTHER_ROWS)


def _build_lookup(flags: Sequence[FlagSpec]) -> dict[str, tuple[FlagSpec, bool]]:
    lookup: dict[str, tuple[FlagSpec, bool]] = {}
    for spec in flags:
        for name in spec.names:
            assert name not in lookup, f"duplicate flag {name}"
            lookup[name] = (spec, True)
        for name in spec.neg_names:
            assert name not in lookup, f"duplicate flag {name}"
            lookup[name] = (spec, False)
    return lookup


_LOOKUP = _build_lookup(FLAGS)


def find_flag(name: str) -> FlagSpec:
    """The row for ``name`` (any alias; ``--a_b`` == ``--a-b``)."""
    if name.startswith("--"):
        name = name.replace("_", "-")
    return _LOOKUP[name][0]


def flags_for_dest(dest: str) -> tuple[FlagSpec, ...]:
    return tuple(s for s in FLAGS if s.dest == dest)
