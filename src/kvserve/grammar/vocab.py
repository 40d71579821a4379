"""The grammar library's view of a model vocabulary, built from kvserve's own tokenizer.

``llguidance`` needs every token's bytes, the end-of-generation ids and a tokenize function; all
three come from :class:`kvserve.model.tokenizer.Tokenizer` (the GGUF vocabulary), so nothing is
loaded from a hub. Control tokens (and user-defined tokens that look like ``<...>``) are marked
special the way llguidance's llama.cpp binding marks them (a ``0xff`` prefix): a grammar reaches
them only through token terminals (``<[id]>``, ``<name>``), never through text.
"""

from __future__ import annotations

from typing import Any

import llguidance

__all__ = ["build_ll_tokenizer"]

_SPECIAL_PREFIX = b"\xff"


class _Wrapped:
    """The duck type ``llguidance.TokenizerWrapper`` reads."""

    def __init__(self, tok: Any, n_vocab: int) -> None:
        eog = sorted(int(t) for t in tok.eog_ids)
        self.eos_token_id = eog[0] if eog else (tok.eos_id if tok.eos_id is not None else 0)
        self.bos_token_id = tok.bos_id
        tokens: list[bytes] = []
        special: list[int] = []
        n_tok = tok.n_vocab
        for tid in range(n_vocab):
            if tid >= n_tok:
                tokens.append(b"")
                continue
            raw = tok.token_bytes(tid, special=True)
            if _is_special(tok, tid, raw):
                tokens.append(_SPECIAL_PREFIX + raw)
                special.append(tid)
            else:
                tokens.append(raw)
        self.tokens = tokens
        self.special_token_ids = special
        self._tok = tok

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._tok.encode(text, add_special=False, parse_special=False))


def _is_special(tok: Any, tid: int, raw: bytes) -> bool:
    if tok.is_control(tid) or tid in tok.eog_ids:
        return True
    attrs = int(tok.vocab.attrs[tid])
    return bool(attrs & (1 << 4)) and raw.startswith(b"<") and raw.endswith(b">")


def build_ll_tokenizer(tok: Any, n_vocab: int | None = None) -> llguidance.LLTokenizer:
    """An ``LLTokenizer`` over ``n_vocab`` ids (default: the tokenizer's; a model whose logits are
    wider gets empty, never-allowed entries). Every end-of-generation id counts as EOS: a grammar
    that accepts allows each of them. Building it scans the vocabulary once (~0.1-1 s): keep one
    per model."""
    n = int(n_vocab if n_vocab is not None else tok.n_vocab)
    wrapped = _Wrapped(tok, n)
    eog = sorted(int(t) for t in tok.eog_ids) or [wrapped.eos_token_id]
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapped), n_vocab=n, eos_token=eog)
