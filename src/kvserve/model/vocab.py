"""A GGUF vocabulary as llama.cpp reads it (``llama_vocab::impl::load``): tokens, attributes,
special ids, the end-of-generation set, pre-tokenizer regexes and the bytes each token renders to.

No tokenizing happens here; ``tokenizer.py`` builds the ``tokenizers`` object from a ``VocabInfo``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag
from typing import Any

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
    add_sep: bool = False  # tokenizer.ggml.add_sep_token (query/document separator of rerank prompts)

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
            add_sep=bool(meta.get("tokenizer.ggml.add_sep_token", False)),
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


