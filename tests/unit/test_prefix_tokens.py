"""Long texts' beginnings seen before are not encoded again (``prefix_tokens``): the ids stay those
of the library's encode of the whole text, for every pre-tokenizer, with special tokens parsed or
not, across chunks, in threads, and after the trie is cleared."""

from __future__ import annotations

import contextvars
import random
from typing import Any

import pytest
from tokenizers import AddedToken

from kvserve.model import prefix_tokens
from kvserve.model.prefix_tokens import PrefixTokens
from kvserve.model.tokenizer import Tokenizer, _encode_many
from kvserve.model.vocab import PRE_TOKENIZERS
from tests.unit.test_tokenize_long import _in_threads

# every distinct pre-tokenizer of vocab.py, by one of its names (these where they are one)
_NAMES = ("default", "gpt-2", "llama3", "qwen2", "smollm", "falcon")
PRES = sorted({spec: name for name, spec in sorted(PRE_TOKENIZERS.items(), key=lambda kv: kv[0] in _NAMES)}.values())
PIECES = (
    "word", "Words", "the", "a", "I", "x", "don't", "we're", "IT'S", "they'LL", "'s", "'", "42", "1234567",
    "3.14", "é", "naïve", "Straße", "Жук", "λόγος", "中文", "日本語", "😀", "e\u0301", "\u0530x", "ǅ", "_",
    "x=1;", "(a)", "--", "...", "!?", "#", "$5", "<", ">", "|", "\\", "\t", "\n", "\n\n", "\r\n", " \n", "  ",
    "   ", " ", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start|>user", "\u3000", "\u00a0",
)


def _text(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        out.append(rng.choice(PIECES))
        out.append(rng.choice((" ", " ", " ", "", "\n", "  ")))
    return "".join(out)


def _tokenizer(meta: dict[str, Any], pre: str) -> Tokenizer:
    return Tokenizer.from_metadata({**meta, "tokenizer.ggml.pre": pre})


@pytest.fixture(scope="module")
def toks(smollm_meta: dict[str, Any]) -> dict[str, Tokenizer]:
    return {pre: _tokenizer(smollm_meta, pre) for pre in PRES}


def _added(hf: Any) -> list[str]:
    return [t.content for t in hf.get_added_tokens_decoder().values()]


@pytest.mark.parametrize("pre", PRES)
def test_every_hard_cut_splits_the_encoding_exactly(pre: str, toks: dict[str, Tokenizer]) -> None:
    """The invariant the trie rests on: encode(X) == encode(X[:b]) + encode(X[b:]) at each hard cut
    b, whatever the regexes, for both library objects (special tokens parsed and literal)."""
    tok = toks[pre]
    rng = random.Random(pre)
    cuts = 0
    for hf in (tok._hf, tok._literal()):
        pt = PrefixTokens(_encode_many(hf), _added(hf))
        for _ in range(25):
            x = _text(rng, 60)
            whole = hf.encode(x, add_special_tokens=False).ids
            b = pt.cut(x, 0)
            while b > 0:
                cuts += 1
                left = hf.encode(x[:b], add_special_tokens=False).ids
                right = hf.encode(x[b:], add_special_tokens=False).ids
                assert left + right == whole, (pre, x, b)
                b = pt.cut(x, b + 1)
    assert cuts > 500


def test_a_cut_is_a_letter_then_a_space(toks: dict[str, Tokenizer]) -> None:
    pt = PrefixTokens(_encode_many(toks["gpt-2"]._hf), [])
    assert pt.cut("ab cd", 0) == 2
    assert pt.cut("a. 1 c\u00a0d", 0) == -1  # after punctuation, a digit; a no-break space
    assert pt.cut("中文 x", 0) == -1 and pt.cut("\u0531 y", 0) == -1  # only letters of old, stable blocks
    assert pt.cut("Жук x", 0) == 3 and pt.cut("ab cd ef", 3) == 5


def test_an_added_token_across_a_cut_moves_it(smollm_meta: dict[str, Any]) -> None:
    """A user-defined token whose text holds a letter and a space ("lo wo") is matched across
    "hello world": the cut there is not taken, and the ids stay the library's."""
    tok = _tokenizer(smollm_meta, "smollm")
    hf = tok._hf
    hf.add_tokens([AddedToken("lo wo", special=False, normalized=False)])
    pt = PrefixTokens(_encode_many(hf), _added(hf), chunk=8)
    assert pt.cut("hello world and more", 0) == 11
    text = " ".join(["hello world"] * 40)
    want = hf.encode(text, add_special_tokens=False).ids
    assert hf.token_to_id("lo wo") in want
    assert pt.encode(text) == want and pt.encode(text + " again") == hf.encode(text + " again",
                                                                                add_special_tokens=False).ids
    assert pt.hits > 0


@pytest.mark.parametrize("pre", ["smollm", "qwen2", "llama3", "default"])
def test_texts_that_share_beginnings_get_the_library_ids(pre: str, toks: dict[str, Tokenizer]) -> None:
    """Texts built as a conversation is (each the last one and more), and texts that leave a
    shared beginning at every kind of place (on a cut, next to one, inside a chunk): small chunks,
    so that each text has dozens."""
    tok = toks[pre]
    rng = random.Random(7)
    for hf in (tok._hf, tok._literal()):
        pt = PrefixTokens(_encode_many(hf), _added(hf), chunk=12)
        convo = ""
        for _ in range(12):
            convo += _text(rng, rng.randrange(5, 40))
            assert pt.encode(convo) == hf.encode(convo, add_special_tokens=False).ids
        base = _text(rng, 200)
        for _ in range(60):
            at = rng.randrange(len(base))
            if rng.random() < 0.3:  # right at a cut or a character off it
                b = pt.cut(base, at)
                at = max(0, b + rng.choice((-1, 0, 1))) if b > 0 else at
            text = base[:at] + _text(rng, rng.randrange(0, 30))
            assert pt.encode(text) == hf.encode(text, add_special_tokens=False).ids, (pre, at)
        assert pt.hits > 100


def _as_tenant(tenant: str | None, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` with ``prefix_tokens.TENANT`` set as the server sets it for a request."""
    def run() -> Any:
        prefix_tokens.TENANT.set(tenant)
        return fn(*args)
    return contextvars.copy_context().run(run)


def test_the_tokenizer_reuses_a_long_prompt_s_beginning(smollm_meta: dict[str, Any]) -> None:
    """``Tokenizer.encode`` takes the trie of the request's tenant for long texts (BOS and EOS
    around it as before)."""
    tok = _tokenizer(smollm_meta, "smollm")
    rng = random.Random(3)
    doc = _text(rng, 1500)
    assert len(doc) > 4 * prefix_tokens.CHUNK_CHARS
    for parse_special in (True, False):
        hf = tok._hf if parse_special else tok._literal()
        for q in range(4):
            text = f"{doc}\n\nQuestion {q}: {_text(rng, 10)}"
            want = hf.encode(text, add_special_tokens=False).ids
            got = _as_tenant("", tok.encode, text, True, parse_special)
            assert got == [tok.bos_id] * tok.add_bos + want
    assert tok._prefix[(id(tok._hf), "")].hits >= 3 * (len(doc) // prefix_tokens.CHUNK_CHARS - 1)


def test_tenants_do_not_share_a_trie(smollm_meta: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """As the prompt cache, a tenant's texts do not make another's faster: each tenant (API key)
    has a trie of its own, a text encoded without a tenant has none, and the tries of the most
    recently seen ``TENANTS`` tenants are kept."""
    tok = _tokenizer(smollm_meta, "smollm")
    text = _text(random.Random(4), 1000)
    want = tok._hf.encode(text, add_special_tokens=False).ids
    assert tok.encode(text, False, True) == want and not tok._prefix  # no tenant: no trie
    assert _as_tenant("key-a", tok.encode, text, False, True) == want
    assert _as_tenant("key-b", tok.encode, text, False, True) == want
    a, b = tok._prefix[(id(tok._hf), "key-a")], tok._prefix[(id(tok._hf), "key-b")]
    assert a is not b and a.hits == b.hits == 0  # b did not take a's chunks
    assert _as_tenant("key-a", tok.encode, text, False, True) == want and a.hits > 0 and b.hits == 0
    monkeypatch.setattr(prefix_tokens, "TENANTS", 3)
    for t in ("key-c", "key-d", "key-a"):
        _as_tenant(t, tok.encode, text, False, True)
    assert [k[1] for k in tok._prefix] == ["key-c", "key-d", "key-a"]  # b, least recently used, dropped
    assert b._retired and b._held == 0
    assert tok._prefix_budget.held == sum(pt._held for pt in tok._prefix.values()) > 0
    tok.forget_prefixes()
    assert not tok._prefix and tok._prefix_budget.held == 0


def test_tenants_share_one_budget(smollm_meta: dict[str, Any]) -> None:
    """The ids of all of a tokenizer's tries count against one budget: tenants that each send
    more than a share of it never hold more than it together (the least recently used tenants'
    tries go first), and the ids stay the library's."""
    tok = _tokenizer(smollm_meta, "smollm")
    tok._prefix_budget.limit = 3000
    rng = random.Random(8)
    for _ in range(3):
        for t in range(5):
            text = _text(rng, 600)
            want = tok._hf.encode(text, add_special_tokens=False).ids
            assert _as_tenant(f"key-{t}", tok.encode, text, False, True) == want
            held = sum(pt._held for pt in tok._prefix.values())
            assert held == tok._prefix_budget.held <= 3000
            assert tok._prefix[(id(tok._hf), f"key-{t}")]._held > 0  # the tenant just seen keeps its own
    before = {k: pt._held for k, pt in tok._prefix.items()}
    text = _text(rng, 3000)  # more than the whole budget: not kept, and nothing else dropped for it
    assert _as_tenant("key-big", tok.encode, text, False, True) == tok._hf.encode(text, add_special_tokens=False).ids
    assert tok._prefix[(id(tok._hf), "key-big")]._held == 0
    assert {k: pt._held for k, pt in tok._prefix.items() if k[1] != "key-big"} == before


def test_threads_at_once_and_a_cleared_trie(toks: dict[str, Tokenizer]) -> None:
    """Prompts that share a document, encoded in 16 threads at once by a trie whose budget is
    smaller than what they would put in it (cleared while others walk it): the library's ids."""
    hf = toks["qwen2"]._hf
    rng = random.Random(11)
    doc = _text(rng, 400)
    texts = [doc[: rng.randrange(len(doc))] + _text(rng, 20) for _ in range(48)]
    want = [hf.encode(t, add_special_tokens=False).ids for t in texts]
    for budget in (1 << 18, 300):
        pt = PrefixTokens(_encode_many(hf), _added(hf), chunk=16, limit=budget)
        for _ in range(2):
            assert _in_threads(pt.encode, texts) == want
        assert pt._held <= budget


def test_sentencepiece_vocabularies_and_the_switch(gemma_meta: dict[str, Any], toks: dict[str, Tokenizer],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No trie for a SentencePiece vocabulary (a space prefix on every stretch of text: a cut
    would add one), nor with ``KVSERVE_PREFIX_TOKENS=0``."""
    text = _text(random.Random(5), 600)
    gemma = Tokenizer.from_metadata(gemma_meta)
    assert gemma._prefix_tokens(gemma._hf) is None
    assert gemma.encode(text, False, True) == gemma._hf.encode(text, add_special_tokens=False).ids
    monkeypatch.setattr(prefix_tokens, "ENABLED", False)
    fresh = Tokenizer(toks["smollm"].vocab, toks["smollm"]._hf)
    assert fresh._prefix_tokens(fresh._hf) is None
    assert fresh.encode(text, False, True) == fresh._hf.encode(text, add_special_tokens=False).ids
    assert not fresh._prefix


def test_tenants_in_threads_under_a_small_budget(smollm_meta: dict[str, Any], monkeypatch: pytest.MonkeyPatch
                                                 ) -> None:
    """Sixteen threads, six tenants, two kept, a budget a few texts fill: tries dropped and
    cleared under the threads that walk them give the library's ids, and the budget still counts
    exactly what the kept tries hold."""
    tok = _tokenizer(smollm_meta, "smollm")
    tok._prefix_budget.limit = 2000
    monkeypatch.setattr(prefix_tokens, "TENANTS", 2)
    rng = random.Random(9)
    docs = [_text(rng, 500) for _ in range(3)]
    texts = [docs[i % 3][: rng.randrange(1500, len(docs[i % 3]))] + _text(rng, 10) for i in range(48)]
    want = [tok._hf.encode(t, add_special_tokens=False).ids for t in texts]
    got = _in_threads(lambda it: _as_tenant(f"key-{it[0] % 6}", tok.encode, it[1], False, True),
                      list(enumerate(texts)))
    assert got == want
    assert len(tok._prefix) <= 2
    assert tok._prefix_budget.held == sum(pt._held for pt in tok._prefix.values()) <= 2000
