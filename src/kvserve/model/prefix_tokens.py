"""The token ids of long texts' beginnings, kept for the next text that begins the same way.

Prompts repeat their beginnings: a conversation is sent again with each turn, many requests share
a system prompt or a document, a client retries. A long text is cut into chunks at *hard cuts*,
and each chunk's ids are kept in a trie (a chunk's node under the chunks before it): a text whose
first chunks are in the trie takes their ids and encodes only the rest.

A hard cut of a text X is a position b with an (old, stable) letter at b − 1, a space U+0020 at
b, and no added token's text occurring across b. For the byte-level BPE vocabularies (``gpt2``
model, every pre-tokenizer of ``vocab.PRE_TOKENIZERS``) encoding is exact across it:
``encode(X) == encode(X[:b]) + encode(X[b:])``, because

* the added tokens are found leftmost-longest among their occurrences, and none lies across b;
* every pre-tokenizer regex (and each level of a sequence of them) has no look-behind and no
  anchor, takes a letter only in a run of letters (at most one non-letter before the run) or in
  a fixed contraction (``'s``, ``'re``…), and nothing that matches a letter also matches a
  space after it: the match holding the letter at b − 1 ends at b, every decision before b reads
  X[b] at most (a space and the end of the text fail there alike), and the scan restarts at b;
* the BPE model encodes each piece alone, and there is no normalizer.

Chunks end at the first hard cut at least ``chunk`` characters after the previous one, so texts
that agree on a beginning are cut alike through it. SentencePiece vocabularies (a space prefix
added to every stretch of text) are not cut. A tokenizer's tries keep at most ``BUDGET_TOKENS``
ids together: new chunks that would pass it drop the least recently used other tries first, then
their own trie's contents, and chunks larger than all of it are not kept.

As the prompt cache, a trie is not shared across tenants (API keys): a text whose beginning is
in the trie is encoded faster, and the time would tell one tenant of another's text. The server
sets ``TENANT`` for the requests it tokenizes; a text encoded without it (None) is encoded whole.
"""

from __future__ import annotations

import contextvars
import os
import threading
from collections.abc import Callable, Iterable, Sequence

# ``KVSERVE_PREFIX_TOKENS=0``: every text encoded whole
ENABLED = os.environ.get("KVSERVE_PREFIX_TOKENS", "1") != "0"
# a chunk's least length; texts shorter than two chunks are encoded whole. What a text repeated or
# continued encodes is the rest after its last chunk known (on average half a chunk and what is
# new): 256 characters, against 512, halves that (a 64-request burst's prompts sent again, on one
# thread: 8.5 → 4.9 ms, bench/tokenize_threads.py, docs/benchmarks.md)
CHUNK_CHARS = 256
# the tenant whose trie a text's encoding reads and adds to (None: no trie)
TENANT: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvserve_prefix_tenant", default=None)
TENANTS = 16  # tries a tokenizer keeps (a tenant's for each library object), the least recently used dropped
# ids a tokenizer's tries keep together (as the lists the library returns: ~36 bytes an id, beside
# the chunks' text): ~5 MiB
BUDGET_TOKENS = 1 << 17


def _stable_letter(c: str) -> bool:
    """A letter to every Unicode version the regex library and Python may disagree on: ASCII, and
    the Latin, Greek and Cyrillic blocks below U+0530."""
    return ("a" <= c <= "z") or ("A" <= c <= "Z") or ("\u00c0" <= c < "\u0530" and c.isalpha())


class _Node:
    __slots__ = ("children", "ids")

    def __init__(self, ids: list[int]) -> None:
        self.children: dict[str, _Node] = {}
        self.ids = ids


class Budget:
    """The ids that several tries (a tokenizer's, one a tenant) may hold together. ``evict(keep)``
    drops the least recently used trie other than ``keep`` (False: none is left)."""

    def __init__(self, limit: int = BUDGET_TOKENS, evict: Callable[[PrefixTokens], bool] | None = None) -> None:
        self.limit = limit
        self.held = 0
        self.lock = threading.Lock()
        self.evict = evict


class PrefixTokens:
    """Encodes texts with ``encode_many`` (a list of texts → their id lists, the library's batch
    call), reusing the ids of chunks seen before. ``added`` are the added tokens' texts; the ids
    kept count against ``budget`` (shared with other tries, or this trie's own of ``limit`` ids):
    new chunks that would pass it first drop the other tries, least recently used first, and
    where they still would, this trie is cleared instead."""

    def __init__(self, encode_many: Callable[[list[str]], Sequence[Sequence[int]]], added: Iterable[str],
                 chunk: int = CHUNK_CHARS, budget: Budget | None = None, limit: int = BUDGET_TOKENS) -> None:
        self._encode_many = encode_many
        self._chunk = chunk
        self._budget = budget or Budget(limit)
        self._retired = False
        # (text, offset of its letter-space pair) of the added tokens that could lie across a cut
        self._spanning = [
            (t, j) for t in set(added) for j in range(len(t) - 1) if t[j + 1] == " " and _stable_letter(t[j])
        ]
        self._root = _Node([])
        self._held = 0  # ids in the trie
        self._gen = 0  # counts the clears: a path found before one is not in the trie
        self._lock = threading.Lock()
        self.hits = 0  # chunks taken from the trie (for tests and benchmarks)

    def cut(self, text: str, start: int) -> int:
        """The first hard cut at or after ``start`` (−1: none)."""
        i = text.find(" ", max(start, 1))
        while i > 0:
            if _stable_letter(text[i - 1]) and not self._spanned(text, i):
                return i
            i = text.find(" ", i + 1)
        return -1

    def _spanned(self, text: str, b: int) -> bool:
        return any(text.startswith(t, b - 1 - j) for t, j in self._spanning if b - 1 - j >= 0)

    def _cuts(self, text: str, pos: int) -> list[int]:
        out = []
        while True:
            b = self.cut(text, pos + self._chunk)
            if b < 0:
                return out
            out.append(b)
            pos = b

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``, as ``encode_many([text])[0]``."""
        if len(text) < 2 * self._chunk:
            return list(self._encode_many([text])[0])
        out: list[int] = []
        pos = 0
        # the walk takes no lock (prepare threads would queue on it for the interpreter lock each
        # time its holder is switched out): a node's children only grow, its ids never change,
        # and a clear replaces the root (a walk begun before it reads the old trie, still right)
        gen, node = self._gen, self._root
        while True:
            b = self.cut(text, pos + self._chunk)
            if b < 0:
                break
            child = node.children.get(text[pos:b])
            if child is None:
                break
            out += child.ids
            node, pos = child, b
            self.hits += 1
        cuts = self._cuts(text, pos)
        ends = [*cuts, len(text)]
        starts = [pos, *cuts]
        parts = self._encode_many([text[a:e] for a, e in zip(starts, ends)])
        for ids in parts:
            out += ids
        if cuts:
            self._insert(gen, node, text, starts, cuts, parts)
        return out

    def _insert(self, gen: int, node: _Node, text: str, starts: list[int], cuts: list[int],
                parts: Sequence[Sequence[int]]) -> None:
        """The chunks ending at ``cuts`` (ids ``parts``) under ``node``."""
        need = sum(len(p) for p in parts[: len(cuts)])
        budget = self._budget
        if need > budget.limit:
            return  # more than all of it: nothing dropped for chunks that cannot be kept
        while True:
            with self._lock, budget.lock:
                if gen != self._gen or self._retired:
                    return  # the trie was cleared since the walk (its node is no longer in it), or dropped
                if budget.held + need <= budget.limit:
                    for a, b, ids in zip(starts, cuts, parts):
                        key = text[a:b]
                        child = node.children.get(key)
                        if child is None:
                            child = node.children[key] = _Node(list(ids))
                            self._held += len(ids)
                            budget.held += len(ids)
                        node = child
                    return
            # (no lock held: dropping a trie takes its own)
            if budget.evict is None or not budget.evict(self):
                break
        with self._lock, budget.lock:
            if gen == self._gen:
                self._clear()  # the next text fills it again

    def _clear(self) -> None:
        """Empties the trie, its ids given back to the budget (both locks held)."""
        self._budget.held -= self._held
        self._root = _Node([])
        self._held = 0
        self._gen += 1

    def retire(self) -> None:
        """The trie is dropped (its tenant's, least recently used): its ids go back to the budget,
        and an encode still walking it adds nothing more."""
        with self._lock, self._budget.lock:
            self._clear()
            self._retired = True
