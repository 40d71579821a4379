"""--grammar, --grammar-file, -j, -jf: the server-wide default grammar of requests that set none."""

from __future__ import annotations

import json

import pytest

from kvserve.args import ConfigError
from kvserve.config import load_config
from kvserve.grammar import GrammarSpec
from kvserve.server.settings import ServerSettings


def _spec(*argv: str) -> GrammarSpec | None:
    cfg = load_config(list(argv), {}, warn=lambda m: None)
    spec = ServerSettings.from_config(cfg).grammar
    assert spec == cfg.server.grammar_default
    return spec


def test_grammar_flags_set_the_default(tmp_path) -> None:
    assert _spec() is None
    assert _spec("--grammar", 'root ::= "x"') == GrammarSpec("gbnf", 'root ::= "x"')
    f = tmp_path / "g.gbnf"
    f.write_text('root ::= "y"\n')
    assert _spec("--grammar-file", str(f)) == GrammarSpec("gbnf", 'root ::= "y"\n')
    assert _spec("-j", '{"type": "integer"}') == GrammarSpec("json_schema", json.dumps({"type": "integer"}))
    assert _spec("--json-schema", "{}") == GrammarSpec("json_schema", json.dumps({"type": "object"}))
    s = tmp_path / "s.json"
    s.write_text('{"type": "boolean"}')
    assert _spec("-jf", str(s)) == GrammarSpec("json_schema", json.dumps({"type": "boolean"}))
    assert _spec("--grammar", 'root ::= "x"', "-j", "{}").kind == "json_schema"  # a schema wins


def test_grammar_flag_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="invalid JSON schema"):
        _spec("-j", "{not json")
    with pytest.raises(ConfigError, match="failed to open file"):
        _spec("-jf", str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="failed to open file"):
        _spec("--grammar-file", str(tmp_path / "missing.gbnf"))
