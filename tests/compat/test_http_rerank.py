"""/rerank over HTTP (fake engine: a document's score is its prompt length): llama-server's Jina
and TEI shapes, top_n, return_text, usage, the four paths and the errors (tests/golden/rerank.json)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kvserve.config import load_config
from kvserve.server.settings import ServerSettings
from tests.conftest import GOLDEN_DIR

from .test_http_fake_engine import FakeEngine, client

DOCS = ["bb", "a", "dddd", "ccc"]  # scores 1 + 1 + len: 4, 3, 6, 5


def _c(**kw: Any) -> Any:
    return client(reranking=True, **kw)


@pytest.mark.parametrize("path", ["/rerank", "/reranking", "/v1/rerank", "/v1/reranking"])
def test_jina_format(path: str) -> None:
    c, eng = _c()
    r = c.post(path, json={"query": "q", "documents": DOCS})
    assert r.status_code == 200
    assert r.json() == {
        "model": "models/fake-model.gguf", "object": "list", "usage": {"prompt_tokens": 18, "total_tokens": 18},
        "results": [{"index": 2, "relevance_score": 6.0}, {"index": 3, "relevance_score": 5.0},
                    {"index": 0, "relevance_score": 4.0}, {"index": 1, "relevance_score": 3.0}],
    }
    # [BOS] query document (the fake vocabulary adds BOS, no EOS/SEP): one prompt per document
    assert eng.rank_calls == [[[1, ord("q") + 10] + [b + 10 for b in d.encode()] for d in DOCS]]


def test_tei_format_top_n_and_return_text() -> None:
    c, _ = _c()
    r = c.post("/rerank", json={"query": "q", "texts": DOCS, "top_n": 2, "return_text": True})
    assert r.json() == [{"index": 2, "score": 6.0, "text": "dddd"}, {"index": 3, "score": 5.0, "text": "ccc"}]
    r = c.post("/rerank", json={"query": "q", "texts": DOCS})
    assert r.json() == [{"index": i, "score": s} for i, s in ((2, 6.0), (3, 5.0), (0, 4.0), (1, 3.0))]
    # return_text is TEI only; "model" is echoed in the Jina format
    r = c.post("/rerank", json={"query": "q", "documents": DOCS, "top_n": 1, "return_text": True, "model": "x"})
    assert r.json()["results"] == [{"index": 2, "relevance_score": 6.0}] and r.json()["model"] == "x"


@pytest.mark.parametrize("top_n,n", [(None, 4), (0, 0), (2, 2), (4, 4), (99, 4)])
def test_top_n(top_n: int | None, n: int) -> None:
    c, _ = _c()
    body: dict[str, Any] = {"query": "q", "documents": DOCS}
    if top_n is not None:
        body["top_n"] = top_n
    assert len(c.post("/rerank", json=body).json()["results"]) == n


def test_rerank_template_fills_query_and_document() -> None:
    eng = FakeEngine()
    eng.rerank_template = "<|im_start|>{query}|{document}"
    c, _ = client(eng, reranking=True)
    assert c.post("/rerank", json={"query": "q", "documents": ["d"]}).status_code == 200
    assert eng.rank_calls == [[[9, ord("q") + 10, ord("|") + 10, ord("d") + 10]]]  # specials parsed, no BOS


@pytest.mark.parametrize("body,message", [
    ({"query": "q", "documents": []}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": None}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": 123}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": [1, 2, 3]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "documents": ["a", 1]}, '"documents" must be a non-empty string array'),
    ({"query": "q", "texts": "abc"}, '"documents" must be a non-empty string array'),
    ({"query": ["q"], "documents": ["a"]}, '"query" must be a string'),
    ({"documents": ["a"]}, '"query" must be provided'),
    ({"query": "q", "documents": ["a"], "top_n": -1}, '"top_n" must be a non-negative integer'),
    ({"query": "q", "documents": ["a"], "top_n": "2"}, '"top_n" must be a non-negative integer'),
])
def test_errors_are_400(body: dict[str, Any], message: str) -> None:
    c, eng = _c()
    r = c.post("/rerank", json=body)
    assert r.status_code == 400
    assert r.json() == {"error": {"code": 400, "message": message, "type": "invalid_request_error"}}
    assert eng.rank_calls == []


def test_error_messages_match_llama_server() -> None:
    """The 400 cases llama-server answered when recorded get the same body here."""
    golden = json.loads((GOLDEN_DIR / "rerank.json").read_text(encoding="utf-8"))
    c, _ = _c()
    n = 0
    for body, status, want in golden["smollm2"]:
        if status == 400:
            r = c.post("/rerank", json=body)
            assert (r.status_code, r.json()) == (400, want)
            n += 1
    assert n >= 4


def test_empty_prompt_is_400_not_a_crash() -> None:
    eng = FakeEngine()
    eng.tokenizer.add_bos = False  # type: ignore[misc]
    c, _ = client(eng, reranking=True)
    r = c.post("/rerank", json={"query": "", "documents": ["", "x"]})
    assert r.status_code == 400 and r.json()["error"]["message"] == "Input content cannot be empty"


def test_without_reranking_is_llama_servers_501() -> None:
    c, _ = client()
    r = c.post("/rerank", json={"query": "q", "documents": ["a"]})
    assert r.status_code == 501
    assert r.json()["error"]["message"] == "This server does not support reranking. Start it with `--reranking`"


def test_flags_enable_reranking() -> None:
    quiet = {"warn": lambda m: None}
    for argv, on in ((["--reranking"], True), (["--rerank"], True), (["--embedding", "--pooling", "rank"], True),
                     (["--pooling", "rank"], False), (["--embedding"], False), ([], False)):
        cfg = load_config(argv, {}, **quiet)
        assert ServerSettings.from_config(cfg).reranking is on, argv
    warnings: list[str] = []
    cfg = load_config(["--reranking", "-b", "2048", "-ub", "512"], {}, warn=warnings.append)
    assert cfg.server.embedding and cfg.server.pooling == "rank" and cfg.engine.n_batch == 512
    assert not any("rerank" in w for w in warnings)
    assert load_config([], {"LLAMA_ARG_RERANKING": "1"}, **quiet).server.pooling == "rank"
