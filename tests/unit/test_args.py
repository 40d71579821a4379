"""The flag table and the llama.cpp-style parser (spec §1.1, §1.2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from kvserve import args as A
from kvserve.args import FLAGS, ArgType, ConfigError, ExitRequest, FlagSpec, parse_args

ROOT = Path(__file__).resolve().parents[2]


def parse(argv: list[str], env: dict[str, str] | None = None) -> tuple[A.ParsedArgs, list[str]]:
    warnings: list[str] = []
    return parse_args(argv, env or {}, warn=warnings.append), warnings


def error_of(argv: list[str], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as ei:
        parse(argv, env)
    return ei.value.message


# (cli/env text, expected value) x 2 for string flags whose value is checked or converted.
def _samples(tmp: Path) -> dict[str, tuple[str, Any, str, Any]]:
    (tmp / "keys.txt").write_text("# comment\nk3\n\nk4\n")
    (tmp / "keys2.txt").write_text("k5\n")
    (tmp / "t1.jinja").write_text("{{ messages }}")
    (tmp / "t2.jinja").write_text("{{ bos_token }}")
    (tmp / "ui1.json").write_text('{"a": 1}')
    (tmp / "ui2.json").write_text('{"b": 2}')
    (tmp / "slots1").mkdir(exist_ok=True)
    (tmp / "slots2").mkdir(exist_ok=True)
    sep = "/"
    return {
        "host": ("0.0.0.0", "0.0.0.0", "::1", "::1"),
        "flash_attn": ("on", "on", "false", "off"),
        "cache_type_k": ("bf16", "bf16", "f32", "f32"),
        "cache_type_v": ("bf16", "bf16", "f32", "f32"),
        "pooling": ("mean", "mean", "cls", "cls"),
        "dtype": ("bf16", "bf16", "f32", "f32"),
        "device": ("cpu", "cpu", "cuda", "cuda"),
        "reasoning_format": ("none", "none", "deepseek", "deepseek"),
        "reasoning": ("on", "on", "off", "off"),
        "rope_scaling": ("linear", "linear", "none", "none"),
        "fit": ("off", "off", "0", "off"),
        "log_colors": ("on", "on", "off", "off"),
        "spec_type": ("ngram-mod", "ngram-mod", "draft", "draft"),
        "samplers": ("top_k;temperature", ("top_k", "temperature"), "min-p;temp", ("min_p", "temperature")),
        "seed": ("42", 42, "-1", 0xFFFFFFFF),
        "logit_bias": ("15+1", ((15, 1.0),), "7-2.5", ((7, -2.5),)),
        "aliases": ("b, a", ("a", "b"), "c", ("c",)),
        "tags": ("x,y", ("x", "y"), "z", ("z",)),
        "api_keys": ("k1,k2", ("k1", "k2"), "k9", ("k9",)),
        "chat_template_kwargs": ('{"a": 1}', (("a", 1),), '{"b": "x"}', (("b", "x"),)),
        "reverse_prompt": ("STOP", ("STOP",), "END", ("END",)),
        "dry_sequence_breakers": ("x", ("x",), "none", ()),
        "lora": ("a.gguf", ("a.gguf",), "b.gguf", ("b.gguf",)),
        "lora_scaled": ("a.gguf:0.5", ("a.gguf:0.5",), "b.gguf:1", ("b.gguf:1",)),
        "slot_save_path": (str(tmp / "slots1"), str(tmp / "slots1") + sep,
                           str(tmp / "slots2"), str(tmp / "slots2") + sep),
    }


_FILE_SAMPLES = {  # flags whose value is a file: the dest gets the file's content
    "--api-key-file": ("keys.txt", ("k3", "k4"), "keys2.txt", ("k5",)),
    "--chat-template-file": ("t1.jinja", "{{ messages }}", "t2.jinja", "{{ bos_token }}"),
    "--webui-config-file": ("ui1.json", '{"a": 1}', "ui2.json", '{"b": 2}'),
}


def sample(spec: FlagSpec, tmp: Path, second: bool = False) -> tuple[list[str], str | None, Any]:
    """(CLI args, env text, expected value) for a non-default value of ``spec``."""
    samples = _samples(tmp)
    text: str
    expected: Any
    if spec.names[-1] == "--sampling-seq":
        text, expected = ("mp", ("min_p", "top_p")) if second else ("kt", ("top_k", "temperature"))
        return [spec.names[-1], text], text, expected
    if spec.names[-1] in _FILE_SAMPLES:
        f1, fe1, f2, fe2 = _FILE_SAMPLES[spec.names[-1]]
        text, expected = (str(tmp / f2), fe2) if second else (str(tmp / f1), fe1)
        return [spec.names[-1], text], text, expected
    if spec.type is ArgType.VOID:
        return [spec.names[-1]], "1", spec.const
    if spec.type is ArgType.BOOL:
        value = not spec.default if spec.default is not None else not second
        if second and spec.default is not None:
            value = not value
        cli = spec.names[-1] if value else spec.neg_names[-1]
        return [cli], "1" if value else "0", value
    if spec.dest in samples:
        t1, e1, t2, e2 = samples[spec.dest]
        text, expected = (t2, e2) if second else (t1, e1)
    elif spec.type is ArgType.INT:
        text, expected = ("9", 9) if second else ("7", 7)
    elif spec.type is ArgType.FLOAT:
        text, expected = ("3.5", 3.5) if second else ("2.5", 2.5)
    else:
        text, expected = ("other", "other") if second else ("value", "value")
    if spec.nargs > 1:
        return [spec.names[-1], *[text] * spec.nargs], " ".join([text] * spec.nargs), expected
    return [spec.names[-1], text], text, expected


PARSED_FLAGS = [s for s in FLAGS if s.action is None]
REMOVED = [s for s in PARSED_FLAGS if s.dest.endswith("_removed")]  # removed by llama.cpp itself
IMPL = [s for s in PARSED_FLAGS if s.status == A.IMPLEMENTED and s not in REMOVED]
REFUSED = [s for s in PARSED_FLAGS if s.status == A.REFUSED_STATUS]
WARNED = [s for s in PARSED_FLAGS if s.status == A.WARNED_STATUS]
ids = [s.names[-1] for s in FLAGS]


def _id(s: FlagSpec) -> str:
    return s.names[-1]


# --- the table ---------------------------------------------------------------------------------
def test_table_is_consistent() -> None:
    names = [n for s in FLAGS for n in s.all_names]
    assert len(names) == len(set(names))
    for s in FLAGS:
        assert s.status in (A.IMPLEMENTED, A.REFUSED_STATUS, A.WARNED_STATUS)
        assert s.status == A.IMPLEMENTED or s.reason
        assert s.dest.isidentifier() and s.dest == s.dest.lower()
        assert (s.type is ArgType.BOOL) == bool(s.neg_names)
        assert s.env is None or s.env.startswith(("LLAMA_ARG_", "LLAMA_API_KEY", "KVSERVE_ARG_", "MTMD_"))
        if s.kvserve_only:
            assert s.env is None or s.env.startswith("KVSERVE_ARG_")
    for dest in (*A.REFUSED, *A.WARNED, *A.WARNED_VALUES):
        assert A.flags_for_dest(dest), dest
    assert not set(A.REFUSED) & set(A.WARNED)
    for dest in A.REFUSED_VALUES:
        assert A.flags_for_dest(dest), dest


_SPEC_FLAGS_TEXT = """-m --model -mu --model-url -hf -hfr --hf-repo -hff --hf-file -dr --docker-repo --offline
-a --alias --tags --host --port --reuse-port --api-prefix --api-key --api-key-file --ssl-key-file
--ssl-cert-file -c --ctx-size --kv-unified-per-slot -n --predict --n-predict -b --batch-size -ub
--ubatch-size -np --parallel -cb --cont-batching -nocb --no-cont-batching -kvu --kv-unified -no-kvu
--no-kv-unified --cache-prompt --no-cache-prompt --cache-reuse -sps --slot-prompt-similarity -cram
--cache-ram --cache-idle-slots --no-cache-idle-slots -ctxcp --ctx-checkpoints --swa-checkpoints -cms
--checkpoint-min-step --context-shift --no-context-shift --swa-full --keep --slot-save-path --slots
--no-slots --metrics --props --jinja --no-jinja --chat-template --chat-template-file
--chat-template-kwargs --reasoning-format -rea --reasoning --reasoning-budget --reasoning-budget-message
--reasoning-effort --reasoning-preserve --no-reasoning-preserve --prefill-assistant
--no-prefill-assistant --skip-chat-parsing -t --threads -tb --threads-batch --threads-http -to
--timeout --sse-ping-interval --ui --webui --no-ui --no-webui --path --sleep-idle-seconds --warmup
--no-warmup -lv --verbosity --log-verbosity -v --verbose --log-verbose --log-disable --log-file
--log-jsonl --log-colors --log-prefix --log-timestamps --log-prompts-dir -fa --flash-attn -ctk
--cache-type-k -ctv --cache-type-v -ngl --n-gpu-layers -fit --fit -fitc --fit-ctx -fitt --embedding
--embeddings --rerank --reranking --pooling --embd-normalize --lora --lora-scaled
--lora-init-without-apply -sp --special -r --reverse-prompt --spm-infill -mm --mmproj -mmu --no-mmproj
--media-path --cors-origins --cors-methods --cors-headers --cors-credentials -md --model-draft
--spec-type --spec-draft-n-max --spec-draft-n-min --ui-mcp-proxy --tools -ag --agent --models-dir
--models-preset --models-max --models-autoload --temp --temperature --top-k --top-p --min-p
--top-nsigma --typical --xtc-probability --xtc-threshold --repeat-last-n --repeat-penalty
--presence-penalty --frequency-penalty --dry-multiplier --dry-base --dry-allowed-length
--dry-penalty-last-n --dry-sequence-breaker --mirostat --mirostat-lr --mirostat-ent --dynatemp-range
--dynatemp-exp --adaptive-target --adaptive-decay -s --seed --samplers --sampler-seq --ignore-eos -l
--logit-bias --grammar --grammar-file -j --json-schema -jf -bs --backend-sampling -h --help --usage
--version --dtype --device"""
SPEC_FLAGS = _SPEC_FLAGS_TEXT.split()


def test_every_spec_flag_is_in_the_table() -> None:
    table = {n for s in FLAGS for n in s.all_names}
    assert [f for f in SPEC_FLAGS if f not in table] == []


def test_spec_env_vars_and_defaults() -> None:
    f = A.find_flag
    assert f("--api-key").env == "LLAMA_API_KEY"
    assert f("-b").env == "LLAMA_ARG_BATCH" and f("-b").default == 2048
    assert f("-np").default == -1 and f("-cram").default == 8192 and f("-c").default == 0
    assert f("--no-cache-prompt").envs == ("LLAMA_ARG_CACHE_PROMPT", "LLAMA_ARG_NO_CACHE_PROMPT")
    assert f("-cms").env == "LLAMA_ARG_CHECKPOINT_MIN_SPACING_NT"
    assert f("--reasoning-format").env == "LLAMA_ARG_THINK"
    assert f("--path").env == "LLAMA_ARG_STATIC_PATH"
    assert f("--sampler-seq").dest == f("--samplers").dest == "samplers"
    assert f("--dtype").kvserve_only and f("--device").kvserve_only


# --- every flag from CLI and env ---------------------------------------------------------------
@pytest.mark.parametrize("spec", IMPL, ids=_id)
def test_implemented_flag_from_cli(spec: FlagSpec, tmp_path: Path) -> None:
    cli, _, expected = sample(spec, tmp_path)
    parsed, _ = parse(cli)
    assert parsed[spec.dest] == expected
    assert parsed.source(spec.dest) == cli[0]


@pytest.mark.parametrize("spec", [s for s in IMPL if s.env], ids=_id)
def test_implemented_flag_from_env(spec: FlagSpec, tmp_path: Path) -> None:
    _, text, expected = sample(spec, tmp_path)
    assert text is not None and spec.env is not None
    parsed, warnings = parse([], {spec.env: text})
    assert parsed[spec.dest] == expected
    assert parsed.source(spec.dest) == spec.env and warnings == []


@pytest.mark.parametrize("spec", [s for s in IMPL if s.env], ids=_id)
def test_cli_beats_env(spec: FlagSpec, tmp_path: Path) -> None:
    _, env_text, env_expected = sample(spec, tmp_path)
    cli, _, cli_expected = sample(spec, tmp_path, second=True)
    assert spec.env is not None and env_text is not None
    parsed, warnings = parse(cli, {spec.env: env_text})
    if spec.merge in (A._append, A._append_one, A._sorted_set):  # accumulating, as llama-server
        assert set(parsed[spec.dest]) == set(env_expected) | set(cli_expected)
    elif spec.merge is A._dict_update:
        assert parsed[spec.dest] == env_expected + cli_expected
    else:
        assert parsed[spec.dest] == cli_expected
    assert (f"warn: {spec.env} environment variable is set, but will be overwritten by command line "
            f"argument {cli[0]}") in warnings


@pytest.mark.parametrize("spec", [s for s in IMPL if s.neg_names and s.env], ids=_id)
def test_negative_env_form(spec: FlagSpec) -> None:
    assert spec.env is not None
    neg = spec.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_")
    parsed, _ = parse([], {neg: "anything", spec.env: "1"})
    assert parsed[spec.dest] is False
    parsed, warnings = parse([spec.names[0]], {neg: "1"})  # CLI still wins, with the warning
    assert parsed[spec.dest] is True and warnings


# --- refused flags -----------------------------------------------------------------------------
@pytest.mark.parametrize("spec", REFUSED, ids=_id)
def test_refused_flag_non_default(spec: FlagSpec, tmp_path: Path) -> None:
    cli, env_text, _ = sample(spec, tmp_path)
    msg = error_of(cli)
    assert msg == f"error: {cli[0]} is not supported by kvserve: {spec.reason}"
    if spec.env is not None and env_text is not None:
        assert error_of([], {spec.env: env_text}) == (
            f"error: {spec.env} is not supported by kvserve: {spec.reason}")


@pytest.mark.parametrize("spec", REFUSED, ids=_id)
def test_refused_flag_at_default_is_fine(spec: FlagSpec) -> None:
    if spec.type is ArgType.BOOL:
        if spec.default is None:
            pytest.skip("no default value to pass")
        parse([spec.names[-1] if spec.default else spec.neg_names[-1]])
    elif spec.type is ArgType.VOID:
        if spec.env:
            parse([], {spec.env: "0"})
    elif spec.default not in (None, (), ""):
        parse([spec.names[-1], str(spec.default)])
    parsed, _ = parse([])
    assert parsed[spec.dest] == spec.default


@pytest.mark.parametrize(("argv", "shown"), [
    (["--yarn-ext-factor", "1"], "--yarn-ext-factor"),
    (["--rope-scaling", "yarn"], "--rope-scaling yarn"),
    (["--lora", "x.gguf"], "--lora"),
    (["--control-vector-layer-range", "1", "4"], "--control-vector-layer-range"),
    (["--gpt-oss-20b-default"], "--gpt-oss-20b-default"),
])
def test_refusals_that_would_change_every_answer(argv: list[str], shown: str) -> None:
    assert error_of(argv).startswith(f"error: {shown} is not supported by kvserve: ")


# --- flags accepted with a warning ---------------------------------------------------------------
@pytest.mark.parametrize("spec", WARNED, ids=_id)
def test_warned_flag_starts_with_one_warning(spec: FlagSpec, tmp_path: Path) -> None:
    cli, env_text, expected = sample(spec, tmp_path)
    parsed, warnings = parse(cli)
    assert parsed[spec.dest] == expected
    assert warnings == [f"warn: {cli[0]} is accepted but has no effect in kvserve: {spec.reason}"]
    assert parsed.warnings == tuple(warnings)
    if spec.env is not None and env_text is not None:
        _, warnings = parse([], {spec.env: env_text})
        assert warnings == [f"warn: {spec.env} is accepted but has no effect in kvserve: {spec.reason}"]
    assert parse([])[1] == []  # at its default: silent


@pytest.mark.parametrize(("argv", "shown"), [
    (["-ctk", "q8_0"], "-ctk q8_0"),
    (["--cache-type-v", "q4_0"], "--cache-type-v q4_0"),
])
def test_warned_values_of_implemented_flags(argv: list[str], shown: str) -> None:
    _, warnings = parse(argv)
    assert len(warnings) == 1 and warnings[0].startswith(f"warn: {shown} is accepted but has no effect in kvserve: ")


def test_rank_pooling_is_silent() -> None:
    assert parse(["--pooling", "rank"])[1] == [] and parse(["--reranking"])[1] == []


def test_lora_without_apply_only_warns() -> None:
    _, warnings = parse(["--lora", "a.gguf", "--lora-init-without-apply"])
    assert [w.split(" is ")[0] for w in warnings] == ["warn: --lora a.gguf", "warn: --lora-init-without-apply"]


def test_flags_once_refused_now_start(tmp_path: Path) -> None:
    argv = ["--no-jinja", "--no-prefill-assistant", "--host", "127.0.0.1,::1", "--reuse-port", "--reasoning", "off",
            "--media-path", str(tmp_path), "--tools", "all", "--ui-mcp-proxy", "--backend_sampling", "--spec-type",
            "ngram-mod", "-ngl", "99", "--mmproj-auto", "--spec-synth-len", "3", "-kvo", "--numa", "distribute"]
    parsed, _ = parse(argv)
    assert parsed["jinja"] is False and parsed["prefill_assistant"] is False
    assert parsed["host"] == "127.0.0.1,::1" and parsed["reuse_port"] is True


@pytest.mark.parametrize("spec", REMOVED, ids=_id)
def test_removed_flags_fail_like_llama_server(spec: FlagSpec) -> None:
    assert "the argument has been removed. use " in error_of([spec.names[-1], "3"])


@pytest.mark.parametrize(("flag", "text"), [("--cache-list", "number of models in cache: 0"),
                                             ("--completion-bash", "complete -F"),
                                             ("--list-devices", "Available devices:")])
def test_action_flags_print_and_exit(flag: str, text: str) -> None:
    with pytest.raises(ExitRequest) as ei:
        parse([flag])
    assert text in ei.value.text and ei.value.code == 0


def test_warned_value_from_env_names_the_variable() -> None:
    _, warnings = parse([], {"LLAMA_ARG_CACHE_TYPE_K": "q8_0"})
    assert warnings[0].startswith("warn: LLAMA_ARG_CACHE_TYPE_K=q8_0 is accepted but has no effect in kvserve")
    assert parse([], {"LLAMA_ARG_JINJA": "off"})[0]["jinja"] is False


def test_all_refusals_reported_at_once() -> None:
    lines = error_of(["--hf-repo", "a/b", "--yarn-orig-ctx", "4096", "--lora", "x"]).splitlines()
    assert len(lines) == 3 and all("is not supported by kvserve" in line for line in lines)


def test_every_llama_server_flag_is_accepted() -> None:
    """Every option name in llama-server b10621's ``--help`` (tests/golden/llama-server-flags.txt)."""
    table = {n for s in FLAGS for n in s.all_names}
    names = (ROOT / "tests" / "golden" / "llama-server-flags.txt").read_text().split()
    assert len(names) > 300
    assert [n for n in names if n not in table] == []


def test_no_ui_and_no_mmproj_are_accepted() -> None:
    parsed, _ = parse(["--no-ui", "--no-webui", "--no-mmproj", "--offline", "--jinja"])
    assert parsed["ui"] is False and parsed["mmproj_auto"] is False


# --- parsing rules -----------------------------------------------------------------------------
def test_underscores_in_long_flags() -> None:
    parsed, _ = parse(["--ctx_size", "512", "--cache_reuse", "4", "--no_cache_prompt", "--api_key", "k"])
    assert parsed["n_ctx"] == 512 and parsed["cache_reuse"] == 4
    assert parsed["cache_prompt"] is False and parsed["api_keys"] == ("k",)
    assert parsed.source("n_ctx") == "--ctx-size"


def test_short_flags_are_not_rewritten() -> None:
    assert error_of(["-no_kvu"]) == "error: invalid argument: -no_kvu"


@pytest.mark.parametrize("argv", [["--bogus"], ["model.gguf"], ["--port=8080"], ["-c", "1", "--nope", "2"]])
def test_unknown_argument(argv: list[str]) -> None:
    bad = next(a for a in argv if a not in ("-c", "1"))
    assert error_of(argv) == f"error: invalid argument: {bad}"


@pytest.mark.parametrize(("word", "value"), [
    ("on", True), ("enabled", True), ("true", True), ("1", True),
    ("off", False), ("disabled", False), ("false", False), ("0", False),
])
def test_boolean_env_words(word: str, value: bool) -> None:
    parsed, _ = parse([], {"LLAMA_ARG_CONTEXT_SHIFT": word})
    assert parsed["context_shift"] is value


@pytest.mark.parametrize("word", ["yes", "TRUE", "", "2"])
def test_bad_boolean_env_word(word: str) -> None:
    assert error_of([], {"LLAMA_ARG_KV_UNIFIED": word}) == (
        'error while handling environment variable "LLAMA_ARG_KV_UNIFIED": invalid boolean value')


@pytest.mark.parametrize(("word", "value"), [("1", True), ("true", True), ("0", False), ("off", False),
                                             ("yes", False), ("", False)])
def test_void_flag_from_env_only_when_truthy(word: str, value: bool) -> None:
    parsed, _ = parse([], {"LLAMA_ARG_ENDPOINT_METRICS": word})
    assert parsed["endpoint_metrics"] is value


def test_missing_value() -> None:
    msg = error_of(["--port"])
    assert msg.startswith('error while handling argument "--port": expected value for argument')
    assert "--port PORT" in msg and "run with -h" in msg


@pytest.mark.parametrize(("argv", "fragment"), [
    (["-c", "abc"], "invalid integer value: 'abc'"),
    (["--port", ""], "invalid integer value"),
    (["-c", "99999999999"], "out of range"),
    (["--temp", "warm"], "invalid number"),
    (["-np", "0"], "invalid value for n_parallel"),
    (["--repeat-last-n", "-2"], "invalid repeat-last-n = -2"),
    (["-fa", "maybe"], "unknown value for --flash-attn: 'maybe'"),
    (["-ctk", "f8"], "Unsupported cache type: f8"),
    (["--pooling", "max"], "unknown value for --pooling"),
    (["--device", "CUDA0"], "unknown value for --device"),
    (["-l", "15*2"], "invalid input format"),
    (["--chat-template-kwargs", "[1]"], "must be a JSON object"),
    (["--sleep-idle-seconds", "0"], "cannot be 0"),
    (["-cms", "-1"], "must be non-negative"),
])
def test_bad_values(argv: list[str], fragment: str) -> None:
    msg = error_of(argv)
    assert msg.startswith(f'error while handling argument "{argv[0]}": ') and fragment in msg


def test_bad_int_from_env() -> None:
    assert error_of([], {"LLAMA_ARG_PORT": "http"}) == (
        "error while handling environment variable \"LLAMA_ARG_PORT\": invalid integer value: 'http'")


def test_stoi_stof_semantics() -> None:
    assert A.stoi(" 42abc") == 42 and A.stoi("-7") == -7 and A.stoi("+3") == 3
    assert A.stof("0.5x") == 0.5 and A.stof("1e3") == 1000.0 and A.stof(".5") == 0.5
    assert math.isinf(A.stof("-inf")) and A.stoul32("-1") == 0xFFFFFFFF and A.stoul32("7") == 7


def test_missing_files_are_fatal(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope")
    assert "failed to open file" in error_of(["--api-key-file", missing])
    assert "failed to open file" in error_of(["--chat-template-file", missing])
    assert "not a directory" in error_of(["--slot-save-path", missing])


def test_repeated_argument_warns_and_last_wins() -> None:
    parsed, warnings = parse(["-c", "256", "-c", "512", "--ctx-size", "1024"])
    assert parsed["n_ctx"] == 1024
    assert warnings == [("DEPRECATED: argument '-c' specified multiple times, use comma-separated values "
                         "instead (only last value will be used)")]


def test_accumulating_flags() -> None:
    parsed, _ = parse(["-r", "a", "-r", "b", "-a", "z,x", "-a", "y", "-l", "1+1", "-l", "2-inf"])
    assert parsed["reverse_prompt"] == ("a", "b")
    assert parsed["aliases"] == ("x", "y", "z")
    assert parsed["logit_bias"][0] == (1, 1.0) and parsed["logit_bias"][1][1] == -math.inf


def test_dry_breakers_and_base() -> None:
    parsed, _ = parse([])
    assert parsed["dry_sequence_breakers"] == ("\n", ":", '"', "*")
    parsed, _ = parse(["--dry-sequence-breaker", ".", "--dry-sequence-breaker", "/"])
    assert parsed["dry_sequence_breakers"] == (".", "/")
    parsed, _ = parse(["--dry-base", "2.0", "--dry-base", "0.5"])
    assert parsed["dry_base"] == 2.0


def test_verbose_and_verbosity_share_a_dest() -> None:
    assert parse(["-lv", "1", "-v"])[0]["verbosity"] == A.INT_MAX
    assert parse(["-v", "-lv", "1"])[0]["verbosity"] == 1


def test_samplers_and_sampler_seq() -> None:
    parsed, warnings = parse(["--samplers", "top_k;bogus;nucleus"])
    assert parsed["samplers"] == ("top_k", "top_p") and any("bogus" in w for w in warnings)
    assert parse(["--sampler-seq", "edskypmxt"])[0]["samplers"] == A.DEFAULT_SAMPLERS


def test_temperature_clamped_and_seed() -> None:
    assert parse(["--temp", "-1"])[0]["temperature"] == 0.0
    assert parse([])[0]["seed"] == A.LLAMA_DEFAULT_SEED


def test_process_escapes() -> None:
    assert A.process_escapes(r"a\nb\t\\\"\x41\q") == 'a\nb\t\\"A\\q'
    assert A.process_escapes("\\") == "\\"


def test_csv_row() -> None:
    assert A.parse_csv_row('a,"b,c","d""e",') == ["a", "b,c", 'd"e', ""]


# --- help, version -----------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["-h", "--help", "--usage"])
def test_help(flag: str) -> None:
    with pytest.raises(ExitRequest) as ei:
        parse(["--hf-repo", "x/y", flag])
    assert ei.value.code == 0 and ei.value.stream == "stdout"
    text = ei.value.text
    for s in FLAGS:
        assert s.names[0] in text
    assert "(env: LLAMA_ARG_CTX_SIZE)" in text.replace("\n" + " " * 40, " ")
    assert "not supported by kvserve" in text


def test_help_still_rejects_unknown_flags() -> None:
    assert error_of(["--help", "--bogus"]) == "error: invalid argument: --bogus"


def test_version() -> None:
    with pytest.raises(ExitRequest) as ei:
        parse(["--version", "--bogus"])
    assert ei.value.code == 0
    assert ei.value.text.startswith("version: kvserve ")
    assert "compatible with llama-server b10621" in ei.value.text


# --- compat.md ---------------------------------------------------------------------------------
def test_compat_md_is_up_to_date() -> None:
    committed = (ROOT / "docs" / "compat.md").read_text(encoding="utf-8")
    assert committed == A.render_compat(), "run: python -m kvserve.args --write-compat docs/compat.md"


def test_compat_md_lists_every_flag() -> None:
    text = A.render_compat()
    for s in FLAGS:
        assert f"`{s.names[0]}" in text
        if s.status == A.REFUSED_STATUS:
            assert s.reason in text


# --- Web UI ------------------------------------------------------------------------------------
def test_ui_default_on_and_switches(tmp_path: Path) -> None:
    from kvserve.config import build_config

    assert build_config(parse([])[0], warn=lambda m: None).server.ui is True
    assert parse([], env={"LLAMA_ARG_UI": "0"})[0]["ui"] is False
    for argv in (["--no-ui"], ["--no-webui"]):
        assert build_config(parse(argv)[0], warn=lambda m: None).server.ui is False
    cfg = build_config(parse(["--path", str(tmp_path), "--api-prefix", "/llm"])[0], warn=lambda m: None)
    assert cfg.server.static_path == str(tmp_path) and cfg.server.api_prefix == "/llm"
    with pytest.raises(ConfigError, match="static assets path not found"):
        build_config(parse(["--path", str(tmp_path / "missing")])[0], warn=lambda m: None)
    # with the UI off the path is never opened, as in llama-server
    build_config(parse(["--no-ui", "--path", str(tmp_path / "missing")])[0], warn=lambda m: None)


def test_ui_config_json_and_file(tmp_path: Path) -> None:
    from kvserve.config import build_config

    def ui_settings(argv: list[str], env: dict[str, str] | None = None) -> Any:
        return build_config(parse(argv, env)[0], warn=lambda m: None).server.ui_settings

    f = tmp_path / "ui.json"
    f.write_text('{"systemMessage": "from file", "temperature": 0.2}')
    assert ui_settings([]) is None
    assert ui_settings(["--ui-config", '{"systemMessage": "hi"}']) == {"systemMessage": "hi"}
    assert ui_settings(["--webui-config-file", str(f)]) == {"systemMessage": "from file", "temperature": 0.2}
    assert ui_settings([], {"LLAMA_ARG_UI_CONFIG_FILE": str(f)})["systemMessage"] == "from file"
    # both set the same setting: the later flag wins
    assert ui_settings(["--ui-config-file", str(f), "--ui-config", "{}"]) == {}
    assert ui_settings(["--ui-config", "{}", "--ui-config-file", str(f)])["temperature"] == 0.2
    with pytest.raises(ConfigError, match="failed to parse UI config"):
        ui_settings(["--ui-config", "{nope"])
    assert "failed to open file" in error_of(["--ui-config-file", str(tmp_path / "missing.json")])


def test_compat_md_header_states_the_start_up_policy() -> None:
    text = (ROOT / "docs" / "compat.md").read_text()
    header = text.split("## Server flags")[0].replace("\n", " ")
    assert "Every flag llama-server accepts starts kvserve" in header
    assert "is accepted but has no effect in kvserve" in header  # the warning line
    assert "would silently change every answer" in header and "is not supported by kvserve" in header
