"""--models-preset: llama-server's INI grammar, key rules, rendering and precedence, without processes.

The expected child flags and ``status.preset`` texts below are what llama-server b10621 showed in
``GET /models`` for the same files (order aside: llama.cpp orders options by its own key)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.config import load_config
from kvserve.router.catalog import catalog
from kvserve.router.pool import ModelPool
from kvserve.router.preset import PresetError, canonical_tag, cli_options, load_presets, parse_ini, to_args, to_ini

M = "/models/smol.gguf"


def _write(tmp_path: Path, text: str, name: str = "p.ini") -> str:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return str(p)


def test_ini_lines() -> None:
    text = ("version = 1\n; a comment\n  # an indented comment\n\nc = 5\r\n[ small ]  ; after a header\n"
            "temp = 0.3   ; inline\nx=a;b\ny = path#1\nz = two  words  \nempty =\n[b]\rk=1\r[b]\nk2 = 2")
    assert parse_ini(text) == {
        "default": {"version": "1", "c": "5"},
        "small ": {"temp": "0.3", "x": "a", "y": "path", "z": "two  words", "empty": ""},  # spaces before ] stay
        "b": {"k2": "2"},  # a repeated section starts over
    }
    assert parse_ini("[a]\nk = 1\nk = 2\n") == {"a": {"k": "2"}}


@pytest.mark.parametrize("text", ["  c = 5\n", "[a]\nmodel\n", "[a] x\n", "[]\n", "[ ]\n", "1a = 2\n",
                                  "[a]\nk : v\n", "[a\n"])
def test_ini_errors(text: str) -> None:
    with pytest.raises(ValueError):
        parse_ini(text)


def test_keys_names_envs_and_negatives(tmp_path: Path) -> None:
    path = _write(tmp_path, "[*]\nc = 1024\ntemp = 0.3\n[small]\nmodel = /m.gguf\nLLAMA_ARG_CTX_SIZE = 512\n"
                  "alias = s1,s2\nno-jinja = true\n[big]\nctx-size = 2048\njinja = false\n"
                  "[a]\nLLAMA_ARG_NO_JINJA = 1\nno-cont-batching = maybe\nmetrics = 0\nkv-unified=off\n"
                  "load-on-startup = true\nstop-timeout = 3\n")
    glob, presets = load_presets(path)
    assert glob == {"ctx-size": "1024", "temperature": "0.3"}
    assert presets["small"] == {"model": "/m.gguf", "ctx-size": "512", "alias": "s1,s2", "jinja": "false"}
    assert presets["big"] == {"ctx-size": "2048", "jinja": "false"}
    # llama-server: a negative env name is taken as is, a negative flag name reverses any value
    assert presets["a"] == {"jinja": "1", "cont-batching": "true", "metrics": "0", "kv-unified": "off",
                            "load-on-startup": "true", "stop-timeout": "3"}
    assert sorted(to_args({**glob, **presets["big"]})) == sorted(
        ["--no-jinja", "--temperature", "0.3", "--ctx-size", "2048"])
    # a valueless flag set false is left out; preset-only keys are never flags
    assert sorted(to_args(presets["a"])) == sorted(["--jinja", "--cont-batching", "--no-kv-unified"])
    assert to_ini("big", {**glob, **presets["big"]}) == "[big]\nctx-size = 2048\njinja = false\ntemperature = 0.3\n\n"


def test_section_names_and_reserved_keys(tmp_path: Path) -> None:
    _, presets = load_presets(_write(tmp_path, "[org/m:q4_k_m]\nc=1\n[x:UD-q4_k_xl]\nc=1\n[default]\n[*]\n"))
    assert set(presets) == {"org/m:Q4_K_M", "x:Q4_K_XL"}  # an empty [default] is no model
    assert canonical_tag("q8_0") == "Q8_0" and canonical_tag("UD-IQ1_S") == "IQ1_S"
    _, presets = load_presets(_write(tmp_path, "c = 5\n[a]\nc=6\n", "d.ini"))
    assert presets == {"default": {"ctx-size": "5"}, "a": {"ctx-size": "6"}}


def test_file_errors(tmp_path: Path) -> None:
    with pytest.raises(PresetError, match="^preset file does not exist: .*missing.ini$"):
        load_presets(str(tmp_path / "missing.ini"))
    with pytest.raises(PresetError, match="^failed to parse server config file: "):
        load_presets(_write(tmp_path, "[a]\nmodel\n"))
    with pytest.raises(PresetError, match="^option 'nope' not recognized in preset 'a'$"):
        load_presets(_write(tmp_path, "[a]\nnope = 1\n"))
    with pytest.raises(PresetError, match="has two values, which is not supported yet"):
        to_args({"control-vector-layer-range": "1 2"})


def test_catalog_merges_dir_preset_and_global(tmp_path: Path) -> None:
    d = tmp_path / "models"
    d.mkdir()
    (d / "alpha.gguf").write_bytes(b"")
    path = _write(tmp_path, f"[*]\nc = 300\n[alpha]\ntemp = 0.5\n[custom]\nmodel = {M}\nalias = c1, c2 ,\n"
                  "tags = t\n[nomodel]\nc = 256\n")
    entries = catalog(str(d), path)
    assert entries["alpha"].source == "preset" and entries["alpha"].path == str(d / "alpha.gguf")
    assert entries["alpha"].options == {"ctx-size": "300", "model": str(d / "alpha.gguf"), "temperature": "0.5"}
    assert entries["custom"].aliases == ("c1", "c2") and entries["custom"].tags == ("t",)
    assert entries["nomodel"].path == ""
    emb = [e for e in entries.values() if e.source == "embedded"]
    assert len(emb) == 1 and emb[0].options["ctx-size"] == "300"  # [*] applies to every model


@pytest.mark.parametrize("text,message", [
    ("[a]\nc=1\n[b]\nalias = a\n", "alias 'a' for model 'b' conflicts with existing model name"),
    ("[a]\nalias = x\n[b]\nalias = x\n", "alias 'x' for model 'b' conflicts with alias of model 'a'"),
    ("[a]\nalias = b\n[b]\nc = 1\n", "model name 'b' conflicts with alias of model 'a'"),
])
def test_name_conflicts(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PresetError, match=f"^{message}$"):
        catalog(None, _write(tmp_path, text))


def test_child_args_precedence(tmp_path: Path) -> None:
    """Router command line > model section > [*]; the router's own flags never reach a child."""
    path = _write(tmp_path, f"[*]\nc = 1024\ntemp = 0.3\nn-predict = 7\n[m]\nmodel = {M}\nc = 512\n"
                  "alias = m1\nport = 1\nhost = 0.0.0.0\napi-key = k\nssl-key-file = /k\nmodels-max = 9\n"
                  "tags = x\nlogit-bias = 15+1\n")
    argv = ["--models-preset", path, "-np", "1", "--temp", "0", "-l", "1+1", "-l", "2+2", "--port", "9"]
    entries = catalog(None, path)
    pool = ModelPool(entries, argv, 4, 9)
    opts = pool.child_options(entries["m"])
    assert opts == {"model": M, "ctx-size": "512", "n-predict": "7", "tags": "x"}
    args = to_args(opts) + pool.base_args
    assert args == ["--model", M, "--tags", "x", "--ctx-size", "512", "--n-predict", "7",
                    "-np", "1", "--temp", "0", "-l", "1+1", "-l", "2+2"]
    assert cli_options(argv)["logit-bias"] == "2+2"  # as llama.cpp's map: the last value
    ini = pool.preset_ini(entries["m"])
    assert ini.startswith("[m]\nmodel = /models/smol.gguf\n") and "ctx-size = 512" in ini
    assert "parallel = 1" in ini and "temperature = 0" in ini and "port" not in ini and "tags" not in ini
    assert pool.get("m1") is pool.get("m") is not None and pool.get("nope") is None


def test_env_var_and_flag_reach_the_config(tmp_path: Path) -> None:
    env = {"HOME": "/nonexistent", "LLAMA_ARG_MODELS_PRESET": "/p.ini"}
    assert load_config([], env).server.models_preset == "/p.ini"
    assert load_config(["--models-preset", "/q.ini"], env).server.models_preset == "/q.ini"


def test_stop_timeout(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _write(tmp_path, f"[a]\nmodel = {M}\nstop-timeout = 3s\n[b]\nmodel = {M}\nstop-timeout = soon\n"
                  f"[c]\nmodel = {M}\n")
    entries = catalog(None, path)
    assert (entries["a"].stop_timeout, entries["b"].stop_timeout, entries["c"].stop_timeout) == (3, 10, 10)
    assert "invalid stop-timeout value 'soon' for model 'b', using default 10 seconds" in caplog.text
    assert "stop-timeout" not in " ".join(to_args(entries["a"].options))  # preset-only: never a flag
