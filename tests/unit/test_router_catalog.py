"""Router pieces without processes: the models of --models-dir, and what a child is started with."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvserve.router.catalog import catalog, scan_models_dir
from kvserve.router.pool import child_argv, child_env


def test_models_dir_files_and_subdirectories(tmp_path: Path) -> None:
    for f in ("a.gguf", "mmproj-a.gguf", "mtp-a.gguf", "notes.txt"):
        (tmp_path / f).write_bytes(b"")
    (tmp_path / "split").mkdir()
    for f in ("m-00002-of-00002.gguf", "m-00001-of-00002.gguf", "mmproj-m.gguf"):
        (tmp_path / "split" / f).write_bytes(b"")
    (tmp_path / "single").mkdir()
    (tmp_path / "single" / "x.gguf").write_bytes(b"")
    (tmp_path / "empty").mkdir()
    got = {e.name: (Path(e.path).relative_to(tmp_path).as_posix(), e.source) for e in scan_models_dir(str(tmp_path))}
    assert got == {"a": ("a.gguf", "models_dir"), "split": ("split/m-00001-of-00002.gguf", "models_dir"),
                   "single": ("single/x.gguf", "models_dir")}
    with pytest.raises(ValueError, match="does not exist or is not a directory"):
        scan_models_dir(str(tmp_path / "nope"))


def test_catalog_offers_the_embedded_model(tmp_path: Path) -> None:
    (tmp_path / "b.gguf").write_bytes(b"")
    entries = catalog(str(tmp_path))
    assert entries["b"].source == "models_dir"
    emb = [e for e in entries.values() if e.source == "embedded"]
    assert len(emb) == 1 and emb[0].path.endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert set(catalog(None)) == {emb[0].name}


def test_child_gets_the_routers_flags_but_not_its_own() -> None:
    argv = ["--host", "0.0.0.0", "--port", "9000", "--models-dir", "/m", "--models-max", "2",
            "--no-models-autoload", "-c", "1024", "--api-key", "k", "-a", "x", "--no-jinja", "--temp", "0",
            "-m", "/other.gguf", "--sleep-idle-seconds", "5"]
    assert child_argv(argv) == ["-c", "1024", "--no-jinja", "--temp", "0", "--sleep-idle-seconds", "5"]
    env = child_env({"LLAMA_ARG_MODELS_DIR": "/m", "LLAMA_API_KEY": "k", "LLAMA_ARG_CTX_SIZE": "512",
                     "LLAMA_ARG_PORT": "1", "PATH": "/bin"}, 9000)
    assert env == {"LLAMA_ARG_CTX_SIZE": "512", "PATH": "/bin", "LLAMA_SERVER_ROUTER_PORT": "9000"}
