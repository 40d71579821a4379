"""Frozen config and the derived startup values of spec §1.3."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from kvserve.args import LLAMA_DEFAULT_SEED, ConfigError
from kvserve.config import Config, load_config, pad_256
from kvserve.model.files import DEFAULT_MODEL_FILE


def cfg(*argv: str, env: dict[str, str] | None = None) -> tuple[Config, list[str]]:
    warnings: list[str] = []
    environ = {"HOME": "/nonexistent"} | (env or {})
    return load_config(list(argv), environ, warn=warnings.append), warnings


def test_defaults() -> None:
    c, warnings = cfg()
    assert warnings == []
    s, e = c.server, c.engine
    assert (s.host, s.port, s.api_prefix, s.api_keys) == ("127.0.0.1", 8080, "", ())
    assert (s.endpoint_slots, s.endpoint_metrics, s.endpoint_props, s.ui) == (True, False, False, True)
    assert s.static_path is None
    assert (s.timeout, s.sse_ping_interval, s.verbosity, s.embd_normalize) == (3600, 30, 3, 2)
    assert s.cors_methods == "GET, POST, DELETE, OPTIONS" and s.cors_credentials is True
    assert s.chat_template is None and dict(s.chat_template_kwargs) == {"preserve_reasoning": True}
    assert (e.n_batch, e.n_ubatch, e.cache_ram_mib, e.cache_idle_slots) == (2048, 512, 8192, True)
    assert (e.cache_prompt, e.cont_batching, e.context_shift, e.warmup) == (True, True, False, True)
    assert (e.cache_type_k, e.flash_attn, e.dtype, e.device) == ("f16", "auto", "auto", "auto")
    assert e.threads is None and e.threads_batch is None and e.model_path is None
    assert c.sampling.seed == LLAMA_DEFAULT_SEED and c.sampling.top_k == 40
    assert c.sampling.as_dict()["dry_sequence_breakers"] == ["\n", ":", '"', "*"]


def test_config_is_frozen() -> None:
    c, _ = cfg()
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.engine.n_ctx = 5  # type: ignore[misc]
    with pytest.raises(TypeError):
        c.server.chat_template_kwargs["x"] = "1"  # type: ignore[index]


# --- model name and aliases --------------------------------------------------------------------
def test_model_name_defaults() -> None:
    assert cfg()[0].server.model_name == DEFAULT_MODEL_FILE
    c, _ = cfg("-m", "./models/../m.gguf")
    assert c.server.model_name == "./models/../m.gguf" and c.engine.model_path == "./models/../m.gguf"
    assert c.server.aliases == ("./models/../m.gguf",)


def test_aliases_sorted_first_is_model_name() -> None:
    c, _ = cfg("-m", "m.gguf", "-a", "zeta, alpha,,beta", env={"LLAMA_ARG_ALIAS": "gamma"})
    assert c.server.aliases == ("alpha", "beta", "gamma", "zeta")
    assert c.server.model_name == "alpha"


def test_tags() -> None:
    assert cfg("--tags", "b,a")[0].server.tags == ("a", "b")


# --- parallel and context sizing ---------------------------------------------------------------
def test_auto_parallel_is_four_unified_slots() -> None:
    c, _ = cfg("-c", "1024")
    assert tuple(c.engine.resolve_parallel()) == (4, True)
    plan = c.engine.ctx_plan(n_ctx_train=8192)
    assert (plan.n_ctx, plan.n_ctx_seq, plan.n_ctx_slot) == (1024, 1024, 1024)


def test_auto_parallel_forces_unified_even_with_no_kvu() -> None:
    assert tuple(cfg("-no-kvu")[0].engine.resolve_parallel()) == (4, True)


def test_explicit_parallel_splits_the_pool() -> None:
    plan = cfg("-c", "512", "-np", "2")[0].engine.ctx_plan(n_ctx_train=8192)
    assert (plan.n_ctx, plan.n_ctx_seq, plan.n_ctx_slot, plan.kv_unified) == (512, 256, 256, False)


def test_explicit_parallel_with_unified_sees_full_pool() -> None:
    plan = cfg("-c", "512", "-np", "2", "-kvu")[0].engine.ctx_plan(n_ctx_train=8192)
    assert (plan.n_ctx, plan.n_ctx_seq, plan.n_ctx_slot) == (512, 512, 512)


def test_padding_to_256() -> None:
    assert [pad_256(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]
    plan = cfg("-c", "1000", "-np", "3")[0].engine.ctx_plan(n_ctx_train=100_000)
    assert (plan.n_ctx_seq, plan.n_ctx) == (512, 1536)  # pad256(1024 // 3) = 512, reset to 3 * 512


def test_ctx_zero_means_train_context_and_slot_caps_at_train() -> None:
    e = cfg("-np", "2")[0].engine
    assert e.ctx_plan(n_ctx_train=2048)[:3] == (2048, 1024, 1024)
    e = cfg("-c", "8192", "-kvu", "-np", "1")[0].engine
    assert e.n_ctx_slot(n_ctx_train=2048) == 2048  # pool 8192, slot capped at n_ctx_train


def test_kv_unified_per_slot() -> None:
    e = cfg("--kv-unified-per-slot", "300", "-np", "2", "-kvu")[0].engine
    plan = e.ctx_plan(n_ctx_train=8192)
    assert (plan.n_ctx, plan.n_ctx_slot) == (768, 300)  # pool = pad256(2 * 300), slot capped at 300
    e = cfg("--kv-unified-per-slot", "300", "-c", "0")[0].engine  # explicit -c 0: pool from the model
    plan = e.ctx_plan(n_ctx_train=4096)
    assert (plan.n_ctx, plan.n_ctx_slot) == (4096, 300)
    e = cfg("--kv-unified-per-slot", "1000", "-c", "1024")[0].engine  # auto -np, explicit -c
    assert e.ctx_plan(n_ctx_train=4096)[:3] == (1024, 1024, 1000)


def test_batch_capacity() -> None:
    assert cfg("-b", "2", "-np", "8")[0].engine.batch_capacity == 8
    assert cfg("-b", "2")[0].engine.batch_capacity == 4  # auto -np -> 4
    assert cfg()[0].engine.batch_capacity == 2048


def test_embedding_forces_batch_to_ubatch() -> None:
    c, warnings = cfg("--embedding", "-b", "4096", "-ub", "1024")
    assert (c.engine.n_batch, c.engine.n_ubatch, c.server.embedding) == (1024, 1024, True)
    assert any("n_batch = n_ubatch = 1024" in w for w in warnings)
    c, warnings = cfg("--embedding", "-b", "256", "-ub", "1024")
    assert c.engine.n_batch == 256 and warnings == []


def test_cache_idle_slots_needs_cache_ram() -> None:
    c, warnings = cfg("-cram", "0")
    assert c.engine.cache_idle_slots is False and any("--cache-idle-slots" in w for w in warnings)
    c, warnings = cfg("-cram", "0", "--no-cache-idle-slots")
    assert c.engine.cache_idle_slots is False and warnings == []
    assert cfg("--no-cache-idle-slots")[0].engine.cache_idle_slots is False


# --- api keys ----------------------------------------------------------------------------------
def test_api_keys_from_csv_env_and_file(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nfile-1\n\nfile-2\n#file-3\n")
    c, warnings = cfg("--api-key", 'a,"b,c",,d', "--api-key-file", str(keys), env={"LLAMA_API_KEY": "env-1"})
    assert c.server.api_keys == ("env-1", "a", "b,c", "d", "file-1", "file-2")
    assert any("LLAMA_API_KEY environment variable is set" in w for w in warnings)


def test_api_key_file_missing_is_fatal(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="failed to open file"):
        cfg("--api-key-file", str(tmp_path / "missing"))


# --- other server options ----------------------------------------------------------------------
def test_slot_save_path(tmp_path: Path) -> None:
    c, _ = cfg("--slot-save-path", str(tmp_path))
    assert c.server.slot_save_path == str(tmp_path) + os.sep
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        cfg("--slot-save-path", str(tmp_path / "file"))


def test_chat_template_sources(tmp_path: Path) -> None:
    t = tmp_path / "t.jinja"
    t.write_text("{{ x }}")
    assert cfg("--chat-template", "chatml")[0].server.chat_template == "chatml"
    both = cfg("--chat-template", "chatml", "--chat-template-file", str(t))[0]
    assert both.server.chat_template == "{{ x }}"  # last one wins, as in llama-server
    kwargs = cfg("--chat-template-kwargs", '{"enable_thinking": false, "preserve_reasoning": false}')
    assert dict(kwargs[0].server.chat_template_kwargs) == {"enable_thinking": False,
                                                           "preserve_reasoning": False}
    assert any("enable_thinking" in w for w in kwargs[1])


def test_escapes_in_stop_strings_and_breakers() -> None:
    c, _ = cfg("-r", "\\n\\nUser:", "--dry-sequence-breaker", "\\t")
    assert c.server.reverse_prompt == ("\n\nUser:",)
    assert c.sampling.dry_sequence_breakers == ("\t",)
    c, _ = cfg("--no-escape", "-r", "\\n")
    assert c.server.reverse_prompt == ("\\n",)


def test_threads() -> None:
    assert cfg("-t", "3")[0].engine.threads == 3
    assert cfg("-t", "3")[0].engine.threads_batch is None
    assert cfg("-t", "0")[0].engine.threads == (os.cpu_count() or 1)
    # One torch thread pool and one asyncio loop: these are accepted with a warning.
    for flag in ("-tb", "--threads-http"):
        assert any(f"warn: {flag} is accepted but has no effect" in w for w in cfg(flag, "2")[1])


def test_device_and_dtype_resolution() -> None:
    e = cfg()[0].engine
    assert e.resolve_device(cuda_available=False) == "cpu" and e.resolve_dtype("cpu") == "f32"
    assert e.resolve_device(cuda_available=True) == "cuda" and e.resolve_dtype("cuda") == "bf16"
    assert e.resolve_weights("cpu") == "quant" and e.resolve_weights("cuda") == "dense"
    assert cfg("--dtype", "f32")[0].engine.resolve_weights("cpu") == "dense"  # the reference path
    e = cfg("--device", "cuda", "--dtype", "f16")[0].engine
    assert e.resolve_dtype("cuda") == "f16"
    with pytest.raises(ConfigError, match="CUDA is not available"):
        e.resolve_device(cuda_available=False)


def test_sampling_defaults_by_request_field() -> None:
    c, _ = cfg("--temp", "0.2", "--top-k", "5", "--samplers", "top_k;temperature", "-s", "7",
               "-l", "15+1.5", "--ignore-eos", "--mirostat-lr", "0.3", env={"LLAMA_ARG_TOP_P": "0.5"})
    d = c.sampling.as_dict()
    assert (d["temperature"], d["top_k"], d["top_p"], d["seed"]) == (0.2, 5, 0.5, 7)
    assert d["samplers"] == ["top_k", "temperature"] and d["logit_bias"] == [[15, 1.5]]
    assert d["ignore_eos"] is True and d["mirostat_eta"] == 0.3


# --- help, version, refusals through load_config -----------------------------------------------
def test_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        cfg("--help")
    assert ei.value.code == 0 and "--ctx-size" in capsys.readouterr().out


def test_version_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        cfg("--version")
    assert ei.value.code == 0 and capsys.readouterr().err.startswith("version: kvserve ")


def test_refused_flag_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="^error: -hf is not supported by kvserve: kvserve never downloads"):
        cfg("-hf", "org/model")
    with pytest.raises(ConfigError, match="^error: invalid argument: --nope$"):
        cfg("--nope")


def test_config_files(tmp_path: Path) -> None:
    """llama.cpp's ~/.config/llama.cpp/config.ini (here under XDG_CONFIG_HOME), as llama-server
    b10621 applies it: [*] and the keys before any section, under the environment and the
    command line; unknown keys warn; a valueless flag is set whatever its value."""
    (tmp_path / "llama.cpp").mkdir()
    ini = tmp_path / "llama.cpp" / "config.ini"
    ini.write_text("temp = 0.25\nnope = 1\nmetrics = 0\nno-jinja = true\n[*]\ntop-k = 7\nc = 512\n"
                   "LLAMA_ARG_TOP_P = 0.5\n[llama-cli]\nmin-p = 0.2\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    c, warnings = cfg(env=env)
    assert warnings == [f"warn: ignoring option 'nope' from {ini}: not supported by this program"]
    assert (c.sampling.temperature, c.sampling.top_k, c.sampling.top_p, c.sampling.min_p) == (0.25, 7, 0.5, 0.05)
    assert c.engine.n_ctx == 512 and c.server.endpoint_metrics is True and c.server.jinja is False
    c, _ = cfg("--top-k", "9", env={**env, "LLAMA_ARG_CTX_SIZE": "1024"})
    assert (c.sampling.top_k, c.engine.n_ctx, c.sampling.temperature) == (9, 1024, 0.25)
    ini.write_text("[a\n")
    with pytest.raises(ConfigError, match=f"^error: failed to parse server config file: {ini}$"):
        cfg(env=env)
    ini.write_text("lora = x.gguf\n")
    with pytest.raises(ConfigError, match=r"config.ini: lora is not supported by kvserve: LoRA"):
        cfg(env=env)


def test_reasoning_flags_reach_the_server_config() -> None:
    s = cfg()[0].server
    assert (s.reasoning_format, s.reasoning, s.skip_chat_parsing) == ("deepseek", "auto", False)
    assert "enable_thinking" not in s.chat_template_kwargs
    s = cfg("--reasoning-format", "none", "-rea", "off", "--skip-chat-parsing")[0].server
    assert (s.reasoning_format, s.reasoning, s.skip_chat_parsing) == ("none", "off", True)
    assert s.chat_template_kwargs["enable_thinking"] is False
    s = cfg("-rea", "on", "--reasoning-effort", "high", "--no-reasoning-preserve")[0].server
    assert dict(s.chat_template_kwargs) == {"enable_thinking": True, "reasoning_effort": "high",
                                            "preserve_reasoning": False}
    s = cfg("--chat-template-kwargs", '{"reasoning_effort": "low"}', "--reasoning-effort", "default")[0].server
    assert "reasoning_effort" not in s.chat_template_kwargs


def test_rope_overrides() -> None:
    from kvserve.model.config import RopeOverride

    assert cfg()[0].engine.rope == RopeOverride()
    assert cfg("--rope-freq-base", "10000")[0].engine.rope == RopeOverride(freq_base=10000.0)
    # --rope-scale N is a frequency scale of 1/N; of it and --rope-freq-scale the later one wins
    assert cfg("--rope-scale", "4")[0].engine.rope.freq_scale == 0.25
    assert cfg("--rope-scale", "4", "--rope-freq-scale", "0.75")[0].engine.rope.freq_scale == 0.75
    assert cfg("--rope-freq-scale", "0.75", "--rope-scale", "4")[0].engine.rope.freq_scale == 0.25
    assert cfg("--rope-freq-scale", "0.3", env={"LLAMA_ARG_ROPE_SCALE": "2"})[0].engine.rope.freq_scale == \
        pytest.approx(0.3, rel=1e-7)  # the command line beats the environment (float32, as llama.cpp)
    assert cfg(env={"LLAMA_ARG_ROPE_SCALING_TYPE": "none"})[0].engine.rope.scaling == "none"
    with pytest.raises(ConfigError, match="--rope-scaling yarn is not supported by kvserve: YaRN"):
        cfg("--rope-scaling", "yarn")
    with pytest.raises(ConfigError, match='^error while handling argument "--rope-scaling": invalid value'):
        cfg("--rope-scaling", "lin")
    with pytest.raises(ConfigError, match="infinite frequency scale"):
        cfg("--rope-scale", "0")
    with pytest.raises(ConfigError, match="--yarn-ext-factor is not supported by kvserve"):
        cfg("--yarn-ext-factor", "1")


def test_rope_override_rules() -> None:
    """llama.cpp's cparams: 0 keeps the model's value, scaling type none never scales, and
    sliding-window layers keep their own RoPE."""
    from kvserve.model.config import RopeOverride, config_from_metadata

    meta = {"general.architecture": "gemma3", "gemma3.embedding_length": 64, "gemma3.attention.head_count": 4,
            "gemma3.block_count": 6, "gemma3.feed_forward_length": 128, "gemma3.rope.freq_base": 1e6,
            "gemma3.attention.sliding_window": 512, "gemma3.rope.scaling.factor": 8.0}
    c = config_from_metadata(meta, set())
    assert (c.rope_scaling, c.rope_factor, c.rope_scale) == ("linear", 8.0, 8.0)  # no type named: linear
    assert c.layer_rope(0) == (10000.0, 1.0) and c.layer_rope(5) == (1e6, 8.0)
    o = RopeOverride(freq_base=5e5).apply(c)
    assert o.layer_rope(5) == (5e5, 8.0) and o.layer_rope(0) == (10000.0, 1.0)
    assert RopeOverride(freq_scale=0.5).apply(c).layer_rope(5) == (1e6, 2.0)
    assert RopeOverride(scaling="none").apply(c).layer_rope(5) == (1e6, 1.0)
    assert RopeOverride(scaling="none", freq_scale=0.5).apply(c).layer_rope(5) == (1e6, 1.0)
    none = config_from_metadata({**meta, "gemma3.rope.scaling.type": "none"}, set())
    assert none.rope_scale == 1.0 and RopeOverride(freq_scale=0.5).apply(none).rope_scale == 1.0
    assert RopeOverride(scaling="linear").apply(none).rope_scale == 8.0  # the GGUF's factor
    assert RopeOverride().apply(c) is c
