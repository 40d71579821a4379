"""Tokenizer tests against llama-server goldens (SmolLM2: byte-level BPE, Gemma 3: SPM with scores)."""

from __future__ import annotations

import functools

import heapq
import json
import random
import time
from typing import Any

import pytest


from ..conftest import GOLDEN_DIR
from kvserve.model.tokenizer import StreamDecoder, TokenAttr, Tokenizer, VocabInfo, utf8_complete_prefix

GOLDEN = GOLDEN_DIR
FIELDS = ("add_special", "no_special", "no_parse_special", "pieces", "detokenized")




@pytest.fixture(scope="session")
def smollm(smollm_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(smollm_meta)


@pytest.fixture(scope="session")
def gemma(gemma_meta: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_metadata(gemma_meta)


def _tok(request: pytest.FixtureRequest, model: str) -> Tokenizer:
    return request.getfixturevalue({"smollm2": "smollm", "gemma3": "gemma"}[model])


def _golden_cases(model: str) -> list[dict[str, Any]]:
    return json.loads((GOLDEN / f"tokenize-{model}.json").read_text())["cases"]


def _run(tok: Tokenizer, field: str, case: dict[str, Any]) -> Any:
    text = case["text"]
    if field == "add_special":
        return tok.encode(text, add_special=True, parse_special=True)
    if field == "no_special":
        return tok.encode(text, add_special=False, parse_special=True)
    if field == "no_parse_special":
        return tok.encode(text, add_special=False, parse_special=False)
    if field == "pieces":
        return [{"id": i, "piece": tok.piece(i)} for i in case["no_special"]]
    return tok.detokenize(case["no_special"])


# --------------------------------------------------------------------------------------------------
# goldens
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_matches_llama_server_golden(request: pytest.FixtureRequest, model: str, field: str) -> None:
    tok = _tok(request, model)
    cases = _golden_cases(model)
    assert len(cases) == 28
    mismatches = [
        (case["text"], got, case[field]) for case in cases if (got := _run(tok, field, case)) != case[field]
    ]
    assert not mismatches, "\n".join(f"{t!r}: got {g!r}, expected {e!r}" for t, g, e in mismatches)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_tokenize_and_detokenize_endpoint_goldens(request: pytest.FixtureRequest, model: str) -> None:
    tok = _tok(request, model)
    responses = json.loads((GOLDEN / f"responses-{model}.json").read_text())["responses"]
    status, body = responses["POST /tokenize (with_pieces)"]
    ids = tok.encode("Hello world! 日本", add_special=False, parse_special=True)
    assert [{"id": i, "piece": tok.piece(i)} for i in ids] == body["tokens"]
    status, body = responses["POST /detokenize"]
    ids = tok.encode("Hello world!", add_special=False, parse_special=True)
    assert tok.detokenize(ids) == body["content"]


def test_vocab_properties_smollm(smollm: Tokenizer) -> None:
    assert smollm.n_vocab == 49152
    assert smollm.vocab_type == 2
    assert (smollm.bos_id, smollm.bos_token) == (1, "<|im_start|>")
    assert (smollm.eos_id, smollm.eos_token) == (2, "<|im_end|>")
    assert smollm.add_bos is False and smollm.add_eos is False
    # <|endoftext|>, <|im_end|> (eos) and <reponame> (recognised as FIM repo token, which is EOG)
    assert smollm.eog_ids == frozenset({0, 2, 4})
    assert smollm.fim_rep == 4
    assert smollm.fim_pre is None and smollm.fim_suf is None and smollm.fim_mid is None
    assert smollm.linefeed_id == 198


def test_vocab_properties_gemma(gemma: Tokenizer) -> None:
    assert gemma.n_vocab == 262144
    assert gemma.vocab_type == 1
    assert (gemma.bos_id, gemma.bos_token) == (2, "<bos>")
    assert (gemma.eos_id, gemma.eos_token) == (1, "<eos>")
    assert gemma.add_bos is True and gemma.add_eos is False
    # <eos>, <end_of_turn> and </s> are end-of-generation
    assert gemma.eog_ids == frozenset({1, 106, 212})
    assert gemma.eot_id == 106
    assert gemma.is_eog(106) and not gemma.is_eog(105)
    assert gemma.fim_pre is None and gemma.fim_suf is None and gemma.fim_mid is None
    assert gemma.linefeed_id == 248 and gemma.token_text(248) == "<0x0A>"


# --------------------------------------------------------------------------------------------------
# special tokens and BOS
# --------------------------------------------------------------------------------------------------


def test_parse_special_controls_control_tokens(smollm: Tokenizer) -> None:
    text = "<|im_start|>user\nhi<|im_end|>"
    assert smollm.encode(text, add_special=False, parse_special=True)[0] == 1
    assert 1 not in smollm.encode(text, add_special=False, parse_special=False)


def test_user_defined_tokens_always_parsed(gemma: Tokenizer) -> None:
    # '<s>' is USER_DEFINED in Gemma 3 and is split out even with parse_special=False;
    # '</s>' is end-of-generation, hence control, and is not.
    ids = gemma.encode("<s>x</s>", add_special=False, parse_special=False)
    assert ids[0] == 203 and 212 not in ids
    assert gemma.encode("<s>x</s>", add_special=False, parse_special=True)[-1] == 212


def test_longest_special_token_wins(gemma: Tokenizer) -> None:
    # '\n\n\n' is one user-defined token, not three '\n'
    assert gemma.encode("a\n\n\nb", add_special=False, parse_special=True) == gemma.encode(
        "a", add_special=False, parse_special=True
    ) + [gemma.vocab.token_to_id["\n\n\n"]] + gemma.encode("b", add_special=False, parse_special=True)


def test_bos_added_only_when_model_asks(smollm: Tokenizer, gemma: Tokenizer) -> None:
    assert gemma.encode("", add_special=True, parse_special=True) == [2]
    assert gemma.encode("", add_special=False, parse_special=True) == []
    assert smollm.encode("hi", add_special=True, parse_special=True) == smollm.encode(
        "hi", add_special=False, parse_special=True
    )


def test_encode_mixed(gemma: Tokenizer) -> None:
    hello = gemma.encode("Hello", add_special=False, parse_special=True)
    world = gemma.encode(" world<end_of_turn>", add_special=False, parse_special=True)
    assert world[-1] == 106  # special parsing applies to every string piece
    assert gemma.encode_mixed(["Hello", 42, " world<end_of_turn>"], True, True) == [2, *hello, 42, *world]
    # BOS only when the first element is a string
    assert gemma.encode_mixed([42, "Hello"], True, True) == [42, *hello]
    assert gemma.encode_mixed(["Hello"], False, True) == hello
    with pytest.raises(TypeError):
        gemma.encode_mixed(["a", 1.5], True, True)  # type: ignore[list-item]


# --------------------------------------------------------------------------------------------------
# pieces, decoding, streaming
# --------------------------------------------------------------------------------------------------


def test_pieces_and_bytes(gemma: Tokenizer, smollm: Tokenizer) -> None:
    assert gemma.token_bytes(432) == b"\xc2"  # <0xC2> byte token
    assert gemma.piece(432) == [0xC2]
    assert gemma.piece(236743) == " "  # '▁'
    assert smollm.piece(216) == " "
    assert smollm.token_bytes(1) == b"<|im_start|>"
    assert smollm.token_bytes(1, special=False) == b""
    with pytest.raises(ValueError):
        smollm.token_bytes(smollm.n_vocab)
    with pytest.raises(ValueError):
        smollm.decode([-1])


def test_decode_hides_control_tokens_unless_special(smollm: Tokenizer, gemma: Tokenizer) -> None:
    ids = smollm.encode("<|im_start|>user\nhi<|im_end|>", add_special=False, parse_special=True)
    assert smollm.decode(ids) == "user\nhi"
    assert smollm.decode(ids, special=True) == "<|im_start|>user\nhi<|im_end|>"
    ids = gemma.encode("<start_of_turn>model\nok<end_of_turn>", add_special=True, parse_special=True)
    assert gemma.decode(ids) == "model\nok"
    assert gemma.detokenize(ids) == "<bos><start_of_turn>model\nok<end_of_turn>"


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_stream_decoder_never_emits_partial_utf8(request: pytest.FixtureRequest, model: str) -> None:
    tok = _tok(request, model)
    for case in _golden_cases(model):
        ids = case["add_special"]
        dec = tok.stream_decoder()
        chunks = [dec.feed(i) for i in ids]
        tail = dec.flush()
        assert "".join(chunks) + tail == tok.decode(ids)
        assert tail == ""
        assert all("\ufffd" not in c for c in chunks), case["text"]


def test_stream_decoder_holds_back_incomplete_sequences(smollm: Tokenizer) -> None:
    # 日 is split over two byte-level tokens in SmolLM2
    ids = smollm.encode("日", add_special=False, parse_special=True)
    assert len(ids) == 2
    dec = StreamDecoder(smollm)
    assert dec.feed(ids[0]) == ""
    assert dec.pending == "日".encode()[: len(smollm.token_bytes(ids[0]))]
    assert dec.feed(ids[1]) == "日"
    dec.feed(ids[0])
    assert dec.flush() == "\ufffd"
    # control tokens render as "" unless special
    assert StreamDecoder(smollm).feed(2) == ""
    assert StreamDecoder(smollm, special=True).feed(2) == "<|im_end|>"


def test_utf8_complete_prefix() -> None:
    assert utf8_complete_prefix(b"ab") == 2
    assert utf8_complete_prefix("é".encode()[:1]) == 0
    assert utf8_complete_prefix(b"a" + "日".encode()[:2]) == 1
    assert utf8_complete_prefix("😀".encode()) == 4
    assert utf8_complete_prefix(b"a" + "😀".encode()[:3]) == 1


# --------------------------------------------------------------------------------------------------
# metadata handling
# --------------------------------------------------------------------------------------------------


def test_unknown_pre_tokenizer_is_refused(smollm_meta: dict[str, Any]) -> None:
    meta = dict(smollm_meta, **{"tokenizer.ggml.pre": "no-such-pre"})
    with pytest.raises(ValueError, match="unknown pre-tokenizer type: 'no-such-pre'.*smollm"):
        Tokenizer.from_metadata(meta)


def test_unknown_model_is_refused(smollm_meta: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="unsupported tokenizer model"):
        VocabInfo.from_metadata(dict(smollm_meta, **{"tokenizer.ggml.model": "bert"}))


def _tiny_bpe_meta(pre: str | None) -> dict[str, Any]:
    from kvserve.model.tokenizer import _BYTE_TO_CHAR

    tokens = [_BYTE_TO_CHAR[b] for b in range(256)] + ["12", "123", "1234", "<s>"]
    meta: dict[str, Any] = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [1] * 259 + [3],
        "tokenizer.ggml.merges": ["1 2", "12 3", "123 4"],
        "tokenizer.ggml.bos_token_id": 259,
        "tokenizer.ggml.eos_token_id": 259,
    }
    if pre is not None:
        meta["tokenizer.ggml.pre"] = pre
    return meta


@pytest.mark.parametrize(
    ("pre", "expected", "add_bos"),
    [
        ("gpt-2", ["1234"], False),
        ("smollm", ["1", "2", "3", "4"], False),  # digits split one by one
        ("llama-bpe", ["123", "4"], True),  # up to three digits; BOS on by default
        ("qwen2", ["1", "2", "3", "4"], False),
        (None, ["123", "4"], False),  # no pre: llama.cpp's 'default' (\p{N}+ then [0-9]{3})
    ],
)
def test_pre_tokenizer_regexes(pre: str | None, expected: list[str], add_bos: bool) -> None:
    tok = Tokenizer.from_metadata(_tiny_bpe_meta(pre))
    assert [tok.token_text(i) for i in tok.encode("1234", add_special=False, parse_special=True)] == expected
    assert tok.add_bos is add_bos


def test_add_space_prefix_for_spm(gemma_meta: dict[str, Any], gemma: Tokenizer) -> None:
    tok = Tokenizer.from_metadata(dict(gemma_meta, **{"tokenizer.ggml.add_space_prefix": True}))
    plain = gemma.encode(" Hello", add_special=False, parse_special=True)
    assert tok.encode("Hello", add_special=False, parse_special=True) == plain
    # the prefix goes after every special token too
    assert tok.encode("<start_of_turn>Hello", add_special=False, parse_special=True) == [105, *plain]


# --------------------------------------------------------------------------------------------------
# SPM merge order: compare with a direct port of llama.cpp's llm_tokenizer_spm_session
# --------------------------------------------------------------------------------------------------


def _spm_reference(vocab: VocabInfo, text: str) -> list[int]:
    t2i = vocab.token_to_id
    scores = vocab.scores
    assert scores is not None
    sym = list(text)
    n = len(sym)
    if n == 0:
        return []
    prev = list(range(-1, n - 1))
    nxt = [*range(1, n), -1]
    heap: list[tuple[float, int, int, int]] = []

    def try_add(left: int, right: int) -> None:
        if left == -1 or right == -1:
            return
        tid = t2i.get(sym[left] + sym[right])
        if tid is not None:
            heapq.heappush(heap, (-scores[tid], left, right, len(sym[left]) + len(sym[right])))

    for i in range(1, n):
        try_add(i - 1, i)
    while heap:
        _, left, right, size = heapq.heappop(heap)
        if not sym[left] or not sym[right] or len(sym[left]) + len(sym[right]) != size:
            continue
        sym[left] += sym[right]
        sym[right] = ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        try_add(prev[left], left)
        try_add(left, nxt[left])
    out: list[int] = []
    i = 0
    while i != -1:
        tid = t2i.get(sym[i])
        if tid is not None:
            out.append(tid)
        else:
            out += [t2i[f"<0x{b:02X}>"] for b in sym[i].encode("utf-8")]
        i = nxt[i]
    return out


@functools.lru_cache(maxsize=4)
def _user_defined(tok: Tokenizer) -> tuple[int, ...]:
    """User-defined token ids, longest text first (llama.cpp's special-token order)."""
    flag = int(TokenAttr.USER_DEFINED)
    ids = [i for i, a in enumerate(tok.vocab.attrs) if a & flag]
    return tuple(sorted(ids, key=lambda i: (-len(tok.vocab.tokens[i].encode()), i)))


def _partition_reference(tok: Tokenizer, text: str) -> list[str | int]:
    """llama.cpp's ``tokenizer_st_partition`` with parse_special=False: user-defined tokens only,
    one at a time, longest first, over the fragments the previous ones left."""
    user = [i for i in _user_defined(tok) if tok.vocab.tokens[i] in text]
    frags: list[str | int] = [text]
    for tid in user:
        needle, out = tok.vocab.tokens[tid], []
        for frag in frags:
            if not isinstance(frag, str):
                out.append(frag)
                continue
            parts = frag.split(needle)
            for k, part in enumerate(parts):
                if k:
                    out.append(tid)
                if part:
                    out.append(part)
        frags = out
    return frags


def test_spm_matches_llama_cpp_merge_order(gemma: Tokenizer) -> None:
    rng = random.Random(20261130)
    alphabet = "".join(c["text"] for c in _golden_cases("gemma3"))
    alphabet += "xyzQZ\u0100\u4e00\U0001f600e\u0301\u3000\u0378"
    words = [t.replace("\u2581", " ") for t in gemma.vocab.tokens[1000:200000:89]]
    for _ in range(300):
        parts = [
            rng.choice(words) if rng.random() < 0.5 else "".join(rng.choices(alphabet, k=rng.randint(1, 9)))
            for _ in range(rng.randint(1, 14))
        ]
        text = "".join(parts)
        expected: list[int] = []
        for frag in _partition_reference(gemma, text):
            if isinstance(frag, str):
                expected += _spm_reference(gemma.vocab, frag.replace(" ", "\u2581"))
            else:
                expected.append(frag)
        assert gemma.encode(text, add_special=False, parse_special=False) == expected, text


# --------------------------------------------------------------------------------------------------
# speed
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_4k_token_prompt_is_fast(request: pytest.FixtureRequest, model: str) -> None:
    tok = _tok(request, model)
    base = "\n".join(c["text"] for c in _golden_cases(model))
    text = base
    while len(tok.encode(text, add_special=True, parse_special=True)) < 4096:
        text += "\n" + base
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        tok.encode(text, add_special=True, parse_special=True)
        best = min(best, time.perf_counter() - t0)
    assert best < 0.1, f"{best * 1000:.1f} ms"


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_long_texts_and_concurrent_encodes_match_short_ones(request: pytest.FixtureRequest, model: str) -> None:
    """Texts from RELEASE_GIL_CHARS on go through the library's lock-free batch call; they give the
    ids of encoding their pieces the ordinary way, also with special tokens in them and from
    several threads at once with both parse_special settings."""
    import threading

    from kvserve.model.tokenizer import RELEASE_GIL_CHARS

    tok = _tok(request, model)
    special = tok.token_text(tok.eos_id) if tok.eos_id is not None else ""
    piece = "Hello wörld, 12 tokens!\n" + special + "  tabs\tand more text "
    long_text = piece * (RELEASE_GIL_CHARS // len(piece) + 2)
    assert len(long_text) >= RELEASE_GIL_CHARS
    for parse_special in (True, False):
        hf = tok._hf if parse_special else tok._literal()
        want = hf.encode(long_text, add_special_tokens=False).ids
        assert tok.encode(long_text, False, parse_special) == want
        assert tok.encode(long_text[:100], False, parse_special) == hf.encode(long_text[:100], add_special_tokens=False).ids
    assert (tok.eos_id in tok.encode(long_text, False, True)) != (tok.eos_id in tok.encode(long_text, False, False))
    expect = {ps: tok.encode(long_text, True, ps) for ps in (True, False)}
    bad: list[str] = []

    def work(ps: bool) -> None:
        for _ in range(20):
            if tok.encode(long_text, True, ps) != expect[ps]:
                bad.append(f"parse_special={ps}")

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not bad


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_literal_tokenizer_shares_the_model(gemma_meta: dict[str, Any]) -> None:
    """The parse_special=False object is built around the first one's BPE model: the same
    configuration, special tokens encoded as text, and no second copy of the vocabulary and its
    merges (Gemma 3's 262k tokens: ~300 MiB when the object was rebuilt from its JSON)."""
    tok = Tokenizer.from_metadata(dict(gemma_meta))
    assert tok._hf_literal is None  # SPM: nothing needed it yet
    before = _rss_mib()
    lit = tok._literal()
    assert _rss_mib() - before < 16
    assert json.loads(lit.to_str()) == json.loads(tok._hf.to_str())
    eot = "<end_of_turn>"
    assert tok.encode(eot, False, True) == [tok.vocab.token_to_id[eot]]
    assert tok.encode(eot, False, False) == lit.encode(eot, add_special_tokens=False).ids
    assert tok.vocab.token_to_id[eot] not in tok.encode(eot, False, False)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_decode_of_lists_tuples_and_iterables_agree(request: pytest.FixtureRequest, model: str) -> None:
    """Lists and tuples of valid ids take a join over the pieces; any other iterable, and ids
    with hidden (control) tokens, the per-id loop: the same bytes either way."""
    tok = _tok(request, model)
    rng = random.Random(3)
    control = [t for t in range(tok.n_vocab) if tok.decode([t]) == "" and tok.decode([t], special=True)]
    assert control
    for _ in range(50):
        ids = [rng.randrange(tok.n_vocab) for _ in range(rng.randrange(1, 300))]
        if rng.random() < 0.5:
            ids.insert(rng.randrange(len(ids) + 1), rng.choice(control))
        for special in (False, True):
            want = b"".join(tok.token_bytes(t, special) for t in ids)
            assert tok.decode_bytes(ids, special) == want
            assert tok.decode_bytes(tuple(ids), special) == want
            assert tok.decode_bytes(iter(ids), special) == want
    with pytest.raises(ValueError):
        tok.decode_bytes([5, tok.n_vocab])
    with pytest.raises(ValueError):
        tok.decode_bytes([-1, 5])


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_decode_of_packed_ids_raises_as_the_loop_does(request: pytest.FixtureRequest, model: str) -> None:
    """The join after packing the ids (every one an int in [0, 2**32)) gives the loop's bytes, and
    for an id out of range (at n_vocab, above it, negative, beyond 32 bits) or not an int the loop's
    error, wherever in a long list it is."""
    tok = _tok(request, model)
    n = tok.n_vocab
    rng = random.Random(4)
    ids = [rng.randrange(n) for _ in range(2040)]
    assert tok.decode_bytes(ids, True) == b"".join(tok.token_bytes(t, True) for t in ids)
    assert tok.decode_bytes([True, 2], True) == tok.token_bytes(1) + tok.token_bytes(2)
    for bad, pos in ((n, 0), (n, 2039), (n + 7, 1000), (-1, 2039), (1 << 32, 5), (1 << 40, 2039)):
        wrong = ids[:pos] + [bad] + ids[pos + 1:]
        with pytest.raises(ValueError, match=f"invalid token id {bad} "):
            tok.decode_bytes(wrong, True)
        with pytest.raises(ValueError, match=f"invalid token id {bad} "):
            tok.decode_bytes(tuple(wrong), False)
    with pytest.raises(TypeError):
        tok.decode_bytes(ids[:10] + [2.0], True)


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_vocabulary_is_read_from_the_library(request: pytest.FixtureRequest, model: str) -> None:
    """Once built, the tokenizer's ``vocab.tokens`` and ``vocab.token_to_id`` read the library's
    vocabulary (no Python copies): the same entries as the metadata's."""
    tok = _tok(request, model)
    meta = request.getfixturevalue({"smollm2": "smollm_meta", "gemma3": "gemma_meta"}[model])
    ref = VocabInfo.from_metadata(dict(meta))
    assert not isinstance(tok.vocab.tokens, list) and len(tok.vocab.tokens) == len(ref.tokens)
    assert list(tok.vocab.tokens) == ref.tokens
    assert tok.vocab.tokens[-1] == ref.tokens[-1] and tok.vocab.tokens[5:40:7] == ref.tokens[5:40:7]
    for text in ref.tokens[:: max(1, len(ref.tokens) // 3000)]:
        assert tok.vocab.token_to_id[text] == ref.token_to_id[text]
        assert text in tok.vocab.token_to_id
    assert len(tok.vocab.token_to_id) == len(ref.token_to_id)
    assert tok.vocab.token_to_id.get("no such token \x00") is None
    with pytest.raises(IndexError):
        tok.vocab.tokens[len(ref.tokens)]
    assert tok.token_text(len(ref.tokens) - 1) == ref.tokens[-1]
