"""Radix tree nodes and lookup results (see ``prefix_index`` for the rules they obey).

A node is one KV page, resident either in the device pool (``page >= 0``, ``host == -1``) or,
with a host tier, in a host slot (``page == -1``, ``host >= 0``). A node at depth ``d`` (children of the root have depth 0) covers the
positions ``[d * page_size, d * page_size + len(node.tokens))`` of every sequence whose tokens
follow the path root → node. A namespace root has no page (``page == -1``, no tokens).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from kvserve.cache.types import StopReason

Tokens = tuple[int, ...]


class Node:
    __slots__ = (
        "alive",
        "by_first",
        "children",
        "depth",
        "host",
        "last_used",
        "ns",
        "page",
        "parent",
        "tokens",
        "uid",
    )

    def __init__(self, tokens: Tokens, page: int, parent: Node | None, ns: Hashable, uid: int) -> None:
        self.tokens = tokens
        self.page = page  # device page; -1 for a namespace root and for a page on the host
        self.host = -1  # host-tier slot while the page lives there
        self.parent = parent
        self.depth: int = -1 if parent is None else parent.depth + 1
        self.ns = ns
        self.children: dict[Tokens, Node] = {}
        self.by_first: dict[int, list[Node]] = {}  # first token -> children starting with it
        self.last_used = 0
        self.alive = True
        self.uid = uid

    def key(self) -> Tokens:
        """All tokens from the root to the end of this node."""
        parts: list[Tokens] = []
        n: Node | None = self
        while n is not None and n.parent is not None:
            parts.append(n.tokens)
            n = n.parent
        return tuple(t for part in reversed(parts) for t in part)

    def __repr__(self) -> str:
        return f"Node(page={self.page}, host={self.host}, depth={self.depth}, n={len(self.tokens)})"


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class Match:
    """Result of a lookup.

    ``nodes[i]`` holds positions ``[i * page_size, ...)``; the first ``n_hit // page_size``
    nodes are fully matched, and when ``n_hit % page_size == k > 0`` the last node matched only
    its first ``k`` tokens (the caller copies those rows into a private page).
    """

    n_hit: int
    nodes: tuple[Node, ...]
    stop_reason: StopReason


class Inserted(NamedTuple):
    """``node`` now holds the tokens (None: a redundant partial page was not added);
    ``created``: the caller's page became that node (the index took its own reference)."""

    node: Node | None
    created: bool
