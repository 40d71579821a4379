"""Tokenizer built from GGUF metadata, following llama.cpp's ``llama_vocab`` rules.

Two vocabulary kinds are supported (the vocabulary itself is read by ``vocab.py``):

* ``gpt2``: byte-level BPE. Vocabulary from ``tokenizer.ggml.tokens``, merges from
  ``tokenizer.ggml.merges`` and the pre-tokenizer regexes that ``tokenizer.ggml.pre`` names.
* ``llama``: SentencePiece-style BPE over scores. Spaces become ``▁``, characters without a token fall
  back to ``<0xXX>`` byte tokens, and merges are taken by descending score of the merged token.

The HuggingFace ``tokenizers`` library does the encoding: special tokens written in the text (its
added tokens), the SPM space prefix and ``▁`` (its normalizer), byte-level BPE and the merges.
BOS/EOS, the EOG set, pieces and detokenization are done here the way llama.cpp does them.
"""

from __future__ import annotations

import re
import struct
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from kvserve.model import prefix_tokens
from kvserve.model.prefix_tokens import PrefixTokens
from kvserve.model.stream_decode import StreamDecoder, utf8_complete_prefix
from kvserve.model.vocab import (
    _BYTE_TO_CHAR,
    _CONTROL,
    _HIDDEN_ATTRS,
    _SPACE_MARK,
    _SPECIAL_ATTRS,
    PRE_TOKENIZERS,
    VOCAB_TYPE_BPE,
    VOCAB_TYPE_SPM,
    PreTokenizer,
    TokenAttr,
    VocabInfo,
    _bytes_to_unicode,
    pre_tokenizer_for,
)

__all__ = [
    "PRE_TOKENIZERS", "VOCAB_TYPE_BPE", "VOCAB_TYPE_SPM", "PreTokenizer", "StreamDecoder", "TokenAttr",
    "Tokenizer", "VocabInfo", "build_hf_tokenizer", "pre_tokenizer_for", "utf8_complete_prefix",
    "_BYTE_TO_CHAR", "_bytes_to_unicode",
]

# --------------------------------------------------------------------------------------------------
# building the HF tokenizers object
# --------------------------------------------------------------------------------------------------


def _split_merge(merge: str) -> tuple[str, str] | None:
    pos = merge.find(" ", 1)
    if pos < 0:
        return None
    return merge[:pos], merge[pos + 1 :]


def _build_bpe(vocab: VocabInfo) -> HFTokenizer:
    spec = pre_tokenizer_for(vocab.pre)
    pairs: list[tuple[str, str]] = []
    for m in vocab.merges or ():
        pair = _split_merge(m)
        if pair is not None and pair[0] in vocab.token_to_id and pair[1] in vocab.token_to_id:
            if pair[0] + pair[1] in vocab.token_to_id:
                pairs.append(pair)
    return HFTokenizer(models.BPE(vocab=dict(vocab.token_to_id), merges=pairs, ignore_merges=spec.ignore_merges))


def _dress_bpe(hf: HFTokenizer, vocab: VocabInfo) -> None:
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre_tokenizer_for(vocab.pre).regexes]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _build_spm(vocab: VocabInfo) -> HFTokenizer:
    """BPE whose merge order is the score of the merged token, as llama.cpp's SPM tokenizer merges.

    Spaces become ``▁``; with ``add_space_prefix`` every stretch of text between special tokens
    gets one leading space first (llama.cpp prefixes each raw fragment that follows a special
    token or starts the text). The normalizer runs on exactly those stretches.
    """
    scores = vocab.scores or [0.0] * len(vocab.tokens)
    t2i = vocab.token_to_id
    ranked: list[tuple[float, int, int, str, str]] = []
    for tid, tok in enumerate(vocab.tokens):
        if len(tok) < 2:
            continue
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in t2i and right in t2i:
                ranked.append((-scores[tid], tid, k, left, right))
    ranked.sort()
    return HFTokenizer(models.BPE(
        vocab=dict(t2i), merges=[(r[3], r[4]) for r in ranked], byte_fallback=True, fuse_unk=False
    ))


def _dress_spm(hf: HFTokenizer, vocab: VocabInfo) -> None:
    steps = [normalizers.Prepend(_SPACE_MARK)] if vocab.add_space_prefix else []
    hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPACE_MARK)])


def _add_special_tokens(hf: HFTokenizer, vocab: VocabInfo) -> None:
    """Special tokens written in the text become their ids (``tokenizer_st_partition``): the library
    finds them, longest match first. Control and unknown tokens are "special" (matched only while
    ``encode_special_tokens`` is off, i.e. with parse_special); user-defined tokens always match.
    (The per-model lstrip/rstrip attributes llama.cpp sets for a few model names are not applied.)"""
    ids = [i for i, a in enumerate(vocab.attrs) if a & _SPECIAL_ATTRS]
    hf.add_tokens([
        AddedToken(vocab.tokens[i], special=bool(vocab.attrs[i] & _HIDDEN_ATTRS), normalized=False,
                   single_word=False, lstrip=False, rstrip=False)
        for i in ids
    ])


def _dress(hf: HFTokenizer, vocab: VocabInfo) -> HFTokenizer:
    """Everything of the ``tokenizers`` object around its model: normalizer or pre-tokenizer,
    and the special tokens."""
    (_dress_spm if vocab.model == "llama" else _dress_bpe)(hf, vocab)
    _add_special_tokens(hf, vocab)
    return hf


def build_hf_tokenizer(vocab: VocabInfo) -> HFTokenizer:
    """The ``tokenizers`` object that encodes text for ``vocab``."""
    return _dress(_build_spm(vocab) if vocab.model == "llama" else _build_bpe(vocab), vocab)


def sibling_hf_tokenizer(hf: HFTokenizer, vocab: VocabInfo) -> HFTokenizer:
    """A second ``tokenizers`` object for ``vocab`` built around ``hf``'s own BPE model (shared,
    not copied: a 151k-token vocabulary and its merges are ~30 MiB), configured as ``hf`` is."""
    return _dress(HFTokenizer(hf.model), vocab)


class _LibraryTokens(Sequence[str]):
    """``VocabInfo.tokens`` once the library object holds the vocabulary: each entry read from
    it (the same strings), instead of a second copy in Python (~13 MiB for 151k tokens)."""

    def __init__(self, hf: HFTokenizer, n: int) -> None:
        self._hf = hf
        self._n = n

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        text = self._hf.id_to_token(i)
        assert text is not None
        return text


class _LibraryIds(Mapping[str, int]):
    """``VocabInfo.token_to_id`` read from the library object (its own vocabulary map)."""

    def __init__(self, hf: HFTokenizer, n: int) -> None:
        self._hf = hf
        self._n = n

    def __getitem__(self, text: str) -> int:
        tid = self._hf.token_to_id(text) if isinstance(text, str) else None
        if tid is None or not 0 <= tid < self._n:
            raise KeyError(text)
        return tid

    def __iter__(self) -> Iterator[str]:
        return iter(self._hf.get_vocab(with_added_tokens=True))

    def __len__(self) -> int:
        return self._n


_SURROGATES = re.compile("[\ud800-\udfff]")
# Texts at least this long are encoded with the interpreter lock released (about 60 us of work
# here; below it the hand-off would cost more than it frees).
RELEASE_GIL_CHARS = 512


def _encode_many(hf: HFTokenizer) -> Callable[[list[str]], list[list[int]]]:
    """The library's batch encode of texts (without the interpreter lock), in the variant that
    skips the offsets where the library has it (``encode_batch_fast``: the same ids)."""
    many = getattr(hf, "encode_batch_fast", None) or hf.encode_batch
    return lambda texts: [e.ids for e in many(texts, add_special_tokens=False)]


# --------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------


class Tokenizer:
    """llama.cpp-compatible tokenizer. Build it once with :meth:`from_metadata`."""

    def __init__(self, vocab: VocabInfo, hf: HFTokenizer) -> None:
        self.vocab = vocab
        # One library object per parse_special setting, each fixed at construction: a flag
        # switched per call would serialize concurrent encodes (and cannot change while another
        # thread is inside the library with the interpreter lock released).
        hf.encode_special_tokens = False
        self._hf = hf  # special tokens written in the text become their ids (parse_special)
        self._hf_literal: HFTokenizer | None = None  # the same, encoding them as text (built on first use)
        self._lock = threading.Lock()  # builds _hf_literal once; adds and drops tries (below)
        # long texts' chunk ids, one trie per library object and tenant (byte-level BPE only: see
        # prefix_tokens), the most recently used last
        self._prefix: OrderedDict[tuple[int, str], PrefixTokens] = OrderedDict()
        self._prefix_budget = prefix_tokens.Budget(evict=self._drop_lru_prefix)  # the ids all of them keep
        self._complete_text: dict[bool, dict[int, str]] = {False: {}, True: {}}  # see StreamDecoder
        self._spm = vocab.model == "llama"
        self._pieces: list[bytes] = [vocab.piece_bytes(i) for i in range(len(vocab.tokens))]
        self._hidden = frozenset(i for i, a in enumerate(vocab.attrs) if a & _HIDDEN_ATTRS)
        if self._spm:
            byte_nl = vocab.token_to_id.get("<0x0A>", vocab.token_to_id.get("\n"))
            self.linefeed_id: int | None = byte_nl if byte_nl is not None else vocab.special_ids["pad"]
        else:
            nl = self.encode("\n", add_special=False, parse_special=False)
            self.linefeed_id = nl[0] if nl else vocab.special_ids["pad"]

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        vocab = VocabInfo.from_metadata(meta)
        hf = build_hf_tokenizer(vocab)
        vocab.merges = None  # only the BPE model needs them, and it holds its own copy
        tok = cls(vocab, hf)
        # the library holds the vocabulary: the Python copies go (~20 MiB for 151k tokens)
        n = len(vocab.tokens)
        vocab.tokens, vocab.token_to_id = _LibraryTokens(hf, n), _LibraryIds(hf, n)  # type: ignore[assignment]
        return tok

    # ---- properties ------------------------------------------------------------------------------

    @property
    def n_vocab(self) -> int:
        return len(self.vocab.tokens)

    @property
    def vocab_type(self) -> int:
        """1 for SPM (``llama``), 2 for BPE (``gpt2``), as llama.cpp's ``llama_vocab_type``."""
        return self.vocab.vocab_type

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special_ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special_ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special_ids["eot"]

    @property
    def unk_id(self) -> int | None:
        return self.vocab.special_ids["unk"]

    @property
    def pad_id(self) -> int | None:
        return self.vocab.special_ids["pad"]

    @property
    def sep_id(self) -> int | None:
        return self.vocab.special_ids["sep"]

    @property
    def fim_pre(self) -> int | None:
        return self.vocab.special_ids["fim_pre"]

    @property
    def fim_suf(self) -> int | None:
        return self.vocab.special_ids["fim_suf"]

    @property
    def fim_mid(self) -> int | None:
        return self.vocab.special_ids["fim_mid"]

    @property
    def fim_pad(self) -> int | None:
        return self.vocab.special_ids["fim_pad"]

    @property
    def fim_rep(self) -> int | None:
        return self.vocab.special_ids["fim_rep"]

    @property
    def fim_sep(self) -> int | None:
        return self.vocab.special_ids["fim_sep"]

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    @property
    def add_bos(self) -> bool:
        return self.vocab.add_bos

    @property
    def add_eos(self) -> bool:
        return self.vocab.add_eos

    @property
    def add_sep(self) -> bool:
        return self.vocab.add_sep

    @property
    def bos_token(self) -> str:
        """BOS rendered with special tokens (what templates get as ``bos_token``); "" without BOS."""
        return self._special_text(self.bos_id)

    @property
    def eos_token(self) -> str:
        return self._special_text(self.eos_id)

    def _special_text(self, tid: int | None) -> str:
        return "" if tid is None else self._pieces[tid].decode("utf-8", errors="replace")

    def is_eog(self, tid: int) -> bool:
        return tid in self.vocab.eog_ids

    def is_control(self, tid: int) -> bool:
        return bool(self.vocab.attrs[tid] & _CONTROL)

    def token_text(self, tid: int) -> str:
        """The raw vocabulary entry of a token."""
        self._check(tid)
        return self.vocab.tokens[tid]

    # ---- encoding --------------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool, parse_special: bool) -> list[int]:
        """``llama_tokenize``: BOS/EOS when ``add_special`` (and the model asks for them), special
        tokens written in the text become their ids only when ``parse_special`` (user-defined tokens
        always do)."""
        if _SURROGATES.search(text):
            text = _SURROGATES.sub("\ufffd", text)
        out: list[int] = []
        if add_special and self.vocab.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        if text:
            hf = self._hf if parse_special else self._literal()
            if len(text) >= RELEASE_GIL_CHARS:
                # the library's batch encode runs without the interpreter lock (encode holds it):
                # a long prompt is tokenized while the engine thread and the event loop go on, and
                # prompts tokenized in several threads at once run in parallel; the variant without
                # offsets (the same ids) takes 8-10 % less time with eight or sixteen threads at once;
                # the chunks of its beginning that an earlier text had are not encoded again
                pt = self._prefix_tokens(hf)
                out += pt.encode(text) if pt is not None else _encode_many(hf)([text])[0]
            else:
                out += hf.encode(text, add_special_tokens=False).ids
        if add_special and self.vocab.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

    def _prefix_tokens(self, hf: HFTokenizer) -> PrefixTokens | None:
        """``hf``'s trie of chunk ids for the tenant of ``prefix_tokens.TENANT`` (made on first
        use); None without a tenant, for SentencePiece vocabularies (whose texts are not cut)
        and with ``KVSERVE_PREFIX_TOKENS=0``."""
        tenant = prefix_tokens.TENANT.get()
        if tenant is None or self._spm or not prefix_tokens.ENABLED:
            return None
        key = (id(hf), tenant)
        pt = self._prefix.get(key)  # no lock to find one (each dict call is atomic)
        if pt is not None:
            try:
                self._prefix.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile: this encode still uses it
                pass
            return pt
        with self._lock:
            pt = self._prefix.get(key)
            if pt is None:
                added = [t.content for t in hf.get_added_tokens_decoder().values()]
                pt = self._prefix[key] = PrefixTokens(_encode_many(hf), added, budget=self._prefix_budget)
                while len(self._prefix) > prefix_tokens.TENANTS:
                    self._prefix.popitem(last=False)[1].retire()
        return pt

    def _drop_lru_prefix(self, keep: PrefixTokens) -> bool:
        """Drops the least recently used trie but ``keep`` (the budget's ``evict``)."""
        with self._lock:
            # a copy (one C call): other threads move entries to the end without the lock
            for key, pt in list(self._prefix.items()):
                if pt is not keep and self._prefix.pop(key, None) is pt:
                    break
            else:
                return False
        pt.retire()
        return True

    def forget_prefixes(self) -> None:
        """Drops every trie of long texts' beginnings (their ids back to the budget)."""
        with self._lock:
            while self._prefix:
                self._prefix.popitem()[1].retire()

    def _literal(self) -> HFTokenizer:
        """The library object with special tokens left as text (parse_special false)."""
        hf = self._hf_literal
        if hf is None:
            with self._lock:
                if self._hf_literal is None:
                    lit = sibling_hf_tokenizer(self._hf, self.vocab)
                    lit.encode_special_tokens = True
                    self._hf_literal = lit
                hf = self._hf_literal
        return hf

    def encode_mixed(self, parts: Sequence[str | int], add_special: bool, parse_special: bool) -> list[int]:
        """llama-server's mixed prompt (``tokenize_mixed``): strings are tokenized, ints are kept.

        ``add_special`` only applies to the first element and only if it is a string; every string is
        tokenized with ``parse_special``.
        """
        out: list[int] = []
        first = True
        for p in parts:
            if isinstance(p, str):
                out += self.encode(p, add_special=add_special and first, parse_special=parse_special)
            elif isinstance(p, int) and not isinstance(p, bool):
                out.append(p)
            else:
                raise TypeError(f"prompt pieces must be strings or token ids, got {type(p).__name__}")
            first = False
        return out

    # ---- pieces and decoding ---------------------------------------------------------------------

    def _check(self, tid: int) -> None:
        if not (0 <= tid < len(self._pieces)):
            raise ValueError(f"invalid token id {tid} (n_vocab = {len(self._pieces)})")

    def token_bytes(self, tid: int, special: bool = True) -> bytes:
        """Raw bytes of a token's piece; control/unknown tokens give b"" unless ``special``."""
        self._check(tid)
        if not special and tid in self._hidden:
            return b""
        return self._pieces[tid]

    def piece(self, tid: int) -> str | list[int]:
        """The piece as ``/tokenize`` with ``with_pieces`` returns it: a string, or the byte list when
        the piece is not valid UTF-8."""
        raw = self.token_bytes(tid, special=True)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return list(raw)

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        pieces = self._pieces
        n = len(pieces)
        hidden = self._hidden
        if isinstance(ids, (list, tuple)) and ids and (special or not hidden) and _non_negative_ints(ids):
            # a prompt's ids (thousands): packing them checks that each is an int ≥ 0 in a third
            # of min's and max's time, and an id ≥ n stops the join (the loop below says which)
            try:
                return b"".join(map(pieces.__getitem__, ids))
            except IndexError:
                pass
        if isinstance(ids, (list, tuple)) and ids and 0 <= min(ids) and max(ids) < n \
                and (special or hidden.isdisjoint(ids)):
            # the common case in C loops (a prompt's text for a final response: thousands of ids)
            return b"".join(map(pieces.__getitem__, ids))
        out: list[bytes] = []
        for tid in ids:
            if not (0 <= tid < n):
                raise ValueError(f"invalid token id {tid} (n_vocab = {n})")
            if special or tid not in hidden:
                out.append(pieces[tid])
        return b"".join(out)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Concatenated pieces (invalid UTF-8 replaced by U+FFFD). With ``special=False`` control
        tokens render as "" (generated text); ``/detokenize`` uses ``special=True``."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def detokenize(self, ids: Iterable[int]) -> str:
        """Exactly llama-server's ``/detokenize``: every piece rendered with special tokens."""
        return self.decode(ids, special=True)

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)


def _non_negative_ints(ids: Sequence[int]) -> bool:
    """Whether every id is an integer in [0, 2**32) (``struct`` packs them as unsigned ints)."""
    try:
        struct.pack(f"{len(ids)}I", *ids)
    except struct.error:
        return False
    return True
