"""Tokenizer built from GGUF metadata, following llama.cpp's ``llama_vocab`` rules.

Two vocabulary kinds are supported:

* ``gpt2``: byte-level BPE. Vocabulary from ``tokenizer.ggml.tokens``, merges from
  ``tokenizer.ggml.merges`` and the pre-tokenizer regexes that ``tokenizer.ggml.pre`` names.
* ``llama``: SentencePiece-style BPE over scores. Spaces become ``▁``, characters without a token fall
  back to ``<0xXX>`` byte tokens, and merges are taken by descending score of the merged token.

The merge loop itself runs in the HuggingFace ``tokenizers`` library; everything around it (special-token
partitioning, BOS/EOS, the EOG set, pieces and detokenization) is done here the way llama.cpp does it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

from tokenizers import Regex
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

# --------------------------------------------------------------------------------------------------
# token attributes (llama_token_attr) and GGUF token types (llama_token_type)
# --------------------------------------------------------------------------------------------------


class TokenAttr(IntFlag):
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5


# plain ints: per-token attribute lists are long (262k for Gemma) and IntFlag arithmetic is slow
_UNKNOWN = int(TokenAttr.UNKNOWN)
_UNUSED = int(TokenAttr.UNUSED)
_NORMAL = int(TokenAttr.NORMAL)
_CONTROL = int(TokenAttr.CONTROL)
_USER_DEFINED = int(TokenAttr.USER_DEFINED)
_BYTE = int(TokenAttr.BYTE)

# GGUF token type -> attribute
_TYPE_TO_ATTR: dict[int, int] = {
    0: 0, 1: _NORMAL, 2: _UNKNOWN, 3: _CONTROL, 4: _USER_DEFINED, 5: _UNUSED, 6: _BYTE
}

_SPECIAL_ATTRS = _CONTROL | _USER_DEFINED | _UNKNOWN
_HIDDEN_ATTRS = _CONTROL | _UNKNOWN  # rendered as "" unless special=True

VOCAB_TYPE_SPM = 1
VOCAB_TYPE_BPE = 2

# --------------------------------------------------------------------------------------------------
# pre-tokenizers (llm_tokenizer_bpe regex_exprs)
# --------------------------------------------------------------------------------------------------

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-splits text for one ``tokenizer.ggml.pre`` value."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # default for add_bos when the GGUF has no add_bos_token key


_DEFAULT_PRE = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_GPT2_PRE = PreTokenizer((_GPT2,))
_QWEN2_PRE = PreTokenizer((_QWEN2,))
_STARCODER_PRE = PreTokenizer((r"\p{N}", _GPT2))
_FALCON_PRE = PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": _DEFAULT_PRE,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
        _LLAMA3_PRE,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), PreTokenizer((_LLAMA3,))),
    **dict.fromkeys(
        ("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "mpt", "olmo"),
        _GPT2_PRE,
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), _QWEN2_PRE),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), _STARCODER_PRE
    ),
    "falcon": _FALCON_PRE,
}

# --------------------------------------------------------------------------------------------------
# special tokens recognised by their text (llama_vocab::impl::load)
# --------------------------------------------------------------------------------------------------

_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>",
)
_FIM_SUF_TEXTS = (
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
    "<|suffix|>",
)
_FIM_MID_TEXTS = (
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>",
)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>",
    "[e~[",
)
_ALWAYS_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# (metadata key, field) in llama.cpp's order; later keys overwrite earlier ones
_SPECIAL_ID_KEYS: tuple[tuple[str, str], ...] = (
    ("bos_token_id", "bos"), ("eos_token_id", "eos"), ("eot_token_id", "eot"), ("eom_token_id", "eom"),
    ("unknown_token_id", "unk"), ("seperator_token_id", "sep"), ("padding_token_id", "pad"),
    ("mask_token_id", "mask"), ("fim_pre_token_id", "fim_pre"), ("fim_suf_token_id", "fim_suf"),
    ("fim_mid_token_id", "fim_mid"), ("fim_pad_token_id", "fim_pad"), ("fim_rep_token_id", "fim_rep"),
    ("fim_sep_token_id", "fim_sep"), ("prefix_token_id", "fim_pre"), ("suffix_token_id", "fim_suf"),
    ("middle_token_id", "fim_mid"),
)

_SPACE_MARK = "\u2581"  # ▁


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_TO_CHAR = _bytes_to_unicode()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _byte_level_decode(text: str) -> bytes:
    """llama.cpp's ``llama_decode_text``: map byte-level characters back to raw bytes."""
    out = bytearray()
    for ch in text:
        b = _CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


# --------------------------------------------------------------------------------------------------
# vocabulary description
# --------------------------------------------------------------------------------------------------


@dataclass
class VocabInfo:
    """Everything llama.cpp derives from the ``tokenizer.*`` metadata, without building the tokenizer."""

    model: str
    pre: str
    tokens: list[str]
    scores: list[float] | None
    attrs: list[int]
    token_to_id: dict[str, int]
    special_ids: dict[str, int | None]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: frozenset[int]
    merges: list[str] | None

    @property
    def vocab_type(self) -> int:
        return VOCAB_TYPE_SPM if self.model == "llama" else VOCAB_TYPE_BPE

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> VocabInfo:
        model = meta.get("tokenizer.ggml.model")
        if model not in ("gpt2", "llama"):
            raise ValueError(
                f"unsupported tokenizer model {model!r}: supported are 'gpt2' (BPE) and 'llama' (SPM)"
            )
        tokens, token_to_id = _read_tokens(meta)
        n = len(tokens)
        types = _read_array(meta, "tokenizer.ggml.token_type", n)
        attrs = [_TYPE_TO_ATTR.get(t, 0) for t in types] if types is not None else [_NORMAL] * n
        scores = _read_array(meta, "tokenizer.ggml.scores", n)

        pre = meta.get("tokenizer.ggml.pre") or ""
        merges: list[str] | None = None
        ids: dict[str, int | None] = dict.fromkeys(_SPECIAL_FIELDS)
        if model == "llama":
            ids.update(bos=1, eos=2, unk=0)
            add_space_prefix, add_bos = True, True
        else:
            merges = meta.get("tokenizer.ggml.merges")
            if merges is None:
                raise ValueError("cannot find tokenizer merges in model metadata (tokenizer.ggml.merges)")
            ids.update(bos=11, eos=11)
            add_space_prefix, add_bos = False, pre_tokenizer_for(pre).add_bos
        add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", add_space_prefix))
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))

        _read_special_ids(meta, ids, n)
        for flag, field in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[field] is None:
                key = f"tokenizer.ggml.add_{field}_token"
                raise ValueError(f"{key} is true, but tokenizer.ggml.{field}_token_id is not set")
        eog = _detect_special_tokens(tokens, token_to_id, attrs, ids)
        return cls(
            model=model,
            pre=pre,
            tokens=tokens,
            scores=[float(s) for s in scores] if scores is not None else None,
            attrs=attrs,
            token_to_id=token_to_id,
            special_ids=ids,
            add_bos=add_bos,
            add_eos=add_eos,
            add_space_prefix=add_space_prefix,
            eog_ids=frozenset(eog),
            merges=merges,
        )

    def piece_bytes(self, tid: int) -> bytes:
        """``llama_token_to_piece(special=true)``: the bytes a token renders to."""
        attr = self.attrs[tid]
        text = self.tokens[tid]
        if attr & _SPECIAL_ATTRS:
            return text.encode("utf-8")
        if attr & _NORMAL:
            if self.model == "llama":
                return text.replace(_SPACE_MARK, " ").encode("utf-8")
            return _byte_level_decode(text)
        if attr & _BYTE:
            return bytes([int(text[3:5], 16)])
        return b""


_SPECIAL_FIELDS = (
    "bos", "eos", "eot", "eom", "unk", "sep", "pad", "mask",
    "fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep",
)


def _read_tokens(meta: dict[str, Any]) -> tuple[list[str], dict[str, int]]:
    raw = meta.get("tokenizer.ggml.tokens")
    if not raw:
        raise ValueError("cannot find tokenizer vocab in model metadata (tokenizer.ggml.tokens)")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(raw)]
    token_to_id: dict[str, int] = {}
    for i, t in enumerate(tokens):
        prev = token_to_id.setdefault(t, i)
        if prev != i:
            raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {prev} and {i}")
    return tokens, token_to_id


def _read_array(meta: dict[str, Any], key: str, n: int) -> list[Any] | None:
    values = meta.get(key)
    if values is None:
        return None
    if len(values) < n:
        raise ValueError(f"Index out of array bounds for {key} ({len(values)} < {n})")
    return list(values[:n])


def _read_special_ids(meta: dict[str, Any], ids: dict[str, int | None], n: int) -> None:
    """Special token ids from the metadata over the per-model defaults; out-of-range ids are ignored."""
    for key, field in _SPECIAL_ID_KEYS:
        cur = ids[field]
        if cur is not None and cur >= n:
            ids[field] = None
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and 0 <= int(value) < n:
            ids[field] = int(value)


def _detect_special_tokens(
    tokens: list[str], token_to_id: dict[str, int], attrs: list[int], ids: dict[str, int | None]
) -> set[int]:
    """llama.cpp's text-based detection of EOT/EOM/FIM tokens and the end-of-generation set.

    Updates ``ids`` and ``attrs`` in place (recognised tokens become control tokens) and returns the
    EOG ids. Where llama.cpp takes whichever match its hash map yields first, the lowest id is used.
    """

    def force_control(tid: int) -> None:
        attrs[tid] |= _CONTROL

    for field, texts in (
        ("eot", _EOT_TEXTS), ("eom", _EOM_TEXTS), ("fim_pre", _FIM_PRE_TEXTS), ("fim_suf", _FIM_SUF_TEXTS),
        ("fim_mid", _FIM_MID_TEXTS), ("fim_pad", _FIM_PAD_TEXTS), ("fim_rep", _FIM_REP_TEXTS),
        ("fim_sep", _FIM_SEP_TEXTS),
    ):
        if ids[field] is None:
            found = sorted(token_to_id[t] for t in texts if t in token_to_id)
            if found:
                ids[field] = found[0]
                force_control(found[0])

    for tid, attr in enumerate(attrs):
        if attr & _CONTROL and "unused" in tokens[tid]:
            attrs[tid] = attr | _UNUSED

    eog = {tid for f in ("fim_pad", "fim_rep", "fim_sep") if (tid := ids[f]) is not None}
    for text in _EOG_TEXTS:
        tid = token_to_id.get(text)
        if tid is not None:
            eog.add(tid)
            force_control(tid)
    for text in _ALWAYS_USER_DEFINED:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = _USER_DEFINED
    eog.update(tid for f in ("eos", "eot", "eom") if (tid := ids[f]) is not None)

    in_eog = {tokens[t]: t for t in eog}
    has_call = "<|call|>" in in_eog or "<|calls|>" in in_eog
    if "<|end|>" in in_eog and has_call and ("<|return|>" in in_eog or "<|flush|>" in in_eog):
        eog.discard(in_eog["<|end|>"])
        attrs[in_eog["<|end|>"]] = _USER_DEFINED
    if "<|tool_response>" in in_eog and "</s>" in in_eog:
        eog.discard(in_eog["</s>"])
        attrs[in_eog["</s>"]] = _NORMAL
    return eog


def pre_tokenizer_for(pre: str) -> PreTokenizer:
    """The pre-tokenizer llama.cpp uses for a ``tokenizer.ggml.pre`` value (empty means 'default')."""
    spec = PRE_TOKENIZERS.get(pre or "default")
    if spec is None:
        raise ValueError(
            f"unknown pre-tokenizer type: {pre!r}; supported: {', '.join(sorted(PRE_TOKENIZERS))}"
        )
    return spec


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
    model = models.BPE(vocab=dict(vocab.token_to_id), merges=pairs, ignore_merges=spec.ignore_merges)
    hf = HFTokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in spec.regexes]
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    return hf


def _build_spm(vocab: VocabInfo) -> HFTokenizer:
    """BPE whose merge order is the score of the merged token, as llama.cpp's SPM tokenizer merges."""
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
    model = models.BPE(
        vocab=dict(t2i), merges=[(r[3], r[4]) for r in ranked], byte_fallback=True, fuse_unk=False
    )
    return HFTokenizer(model)


# --------------------------------------------------------------------------------------------------
# special-token partitioning (tokenizer_st_partition)
# --------------------------------------------------------------------------------------------------


def _trie_regex(words: Iterable[str]) -> str:
    """A regex matching the longest of ``words`` at a position (a character trie as nested groups)."""
    root: dict[str, Any] = {}
    for w in words:
        node = root
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = True

    def build(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + build(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        if "" in node:
            return "(?:" + body + ")?"
        return body

    return build(root)


class _SpecialPartitioner:
    """Splits text around special tokens as llama.cpp's ``tokenizer_st_partition`` does: one special
    token at a time, longest first, over the text fragments left by the previous ones. Control and
    unknown tokens take part only with ``parse_special``; user-defined tokens always do. (The per-model
    lstrip/rstrip attributes llama.cpp sets for a few model names are not applied.)

    A trie regex finds which special tokens occur at all, so long texts are not scanned once per
    special token (Gemma has ~6400 of them).
    """

    def __init__(self, vocab: VocabInfo) -> None:
        ids = [i for i, a in enumerate(vocab.attrs) if a & _SPECIAL_ATTRS]
        # cache_special_tokens order: longest text (in bytes) first
        ids.sort(key=lambda i: (-len(vocab.tokens[i].encode("utf-8")), i))
        self._order = {tid: k for k, tid in enumerate(ids)}
        self._text = {tid: vocab.tokens[tid] for tid in ids}
        self._skippable = {tid for tid in ids if vocab.attrs[tid] & _HIDDEN_ATTRS}
        by_text = {vocab.tokens[tid]: tid for tid in ids}
        self._by_text = by_text
        # every special token that is a prefix of another one, per token
        self._prefixes: dict[str, tuple[int, ...]] = {}
        for text in by_text:
            pre = tuple(by_text[text[:k]] for k in range(1, len(text)) if text[:k] in by_text)
            if pre:
                self._prefixes[text] = pre
        self._finder = re.compile("(?=(" + _trie_regex(by_text) + "))") if by_text else None

    def split(self, text: str, parse_special: bool) -> list[str | int]:
        if not text:
            return []
        if self._finder is None:
            return [text]
        present: set[int] = set()
        for m in self._finder.finditer(text):
            longest = m.group(1)
            present.add(self._by_text[longest])
            present.update(self._prefixes.get(longest, ()))
        if not parse_special:
            present -= self._skippable
        if not present:
            return [text]
        frags: list[str | int] = [text]
        for tid in sorted(present, key=self._order.__getitem__):
            needle = self._text[tid]
            out: list[str | int] = []
            for frag in frags:
                if not isinstance(frag, str):
                    out.append(frag)
                    continue
                start = 0
                while True:
                    k = frag.find(needle, start)
                    if k < 0:
                        break
                    if k > start:
                        out.append(frag[start:k])
                    out.append(tid)
                    start = k + len(needle)
                if start < len(frag):
                    out.append(frag[start:])
            frags = out
        return frags


_SURROGATES = re.compile("[\ud800-\udfff]")

# --------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------


class Tokenizer:
    """llama.cpp-compatible tokenizer. Build it once with :meth:`from_metadata`."""

    def __init__(self, vocab: VocabInfo, hf: HFTokenizer) -> None:
        self.vocab = vocab
        self._hf = hf
        self._spm = vocab.model == "llama"
        self._partitioner = _SpecialPartitioner(vocab)
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
        hf = _build_spm(vocab) if vocab.model == "llama" else _build_bpe(vocab)
        return cls(vocab, hf)

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
        frags = self._partitioner.split(text, parse_special)
        out: list[int] = []
        if add_special and self.vocab.add_bos:
            out.append(self.bos_id)  # type: ignore[arg-type]
        if self._spm:
            prev_special = True
            for frag in frags:
                if isinstance(frag, str):
                    if self.vocab.add_space_prefix and prev_special:
                        frag = " " + frag
                    out += self._hf.encode(frag.replace(" ", _SPACE_MARK), add_special_tokens=False).ids
                    prev_special = False
                else:
                    out.append(frag)
                    prev_special = True
        else:
            for frag in frags:
                if isinstance(frag, str):
                    out += self._hf.encode(frag, add_special_tokens=False).ids
                else:
                    out.append(frag)
        if add_special and self.vocab.add_eos:
            out.append(self.eos_id)  # type: ignore[arg-type]
        return out

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


def utf8_complete_prefix(data: bytes) -> int:
    """Length of ``data`` without a trailing incomplete UTF-8 sequence (llama-server's ``validate_utf8``)."""
    n = len(data)
    for i in range(1, min(4, n) + 1):
        c = data[n - i]
        if (c & 0xE0) == 0xC0:
            if i < 2:
                return n - i
        elif (c & 0xF0) == 0xE0:
            if i < 3:
                return n - i
        elif (c & 0xF8) == 0xF0:
            if i < 4:
                return n - i
    return n


class StreamDecoder:
    """Incremental detokenizer: feed token ids one at a time, get back only newly completed text.

    Bytes of a UTF-8 sequence that is still incomplete are held back until the sequence completes
    (or :meth:`flush` is called).
    """

    def __init__(self, tokenizer: Tokenizer, special: bool = False) -> None:
        self._tok = tokenizer
        self._special = special
        self._pending = b""

    def feed(self, tid: int) -> str:
        data = self._pending + self._tok.token_bytes(tid, special=self._special)
        cut = utf8_complete_prefix(data)
        self._pending = data[cut:]
        return data[:cut].decode("utf-8", errors="replace")

    def feed_many(self, ids: Iterable[int]) -> str:
        return "".join(self.feed(t) for t in ids)

    @property
    def pending(self) -> bytes:
        return self._pending

    def flush(self) -> str:
        data, self._pending = self._pending, b""
        return data.decode("utf-8", errors="replace")
