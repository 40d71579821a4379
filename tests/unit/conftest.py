"""Fixtures shared by the unit tests: SmolLM2's tokenizer and a grammar compiler over it."""

from __future__ import annotations

from typing import Any

import pytest

from kvserve.grammar import GrammarCompiler
from kvserve.model.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tok(smollm_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(smollm_meta)


@pytest.fixture(scope="session")
def compiler(tok: Tokenizer) -> GrammarCompiler:
    return GrammarCompiler(tok)
