"""Fixed pool of KV pages: free list, ref counts, and the "retained" tally.

Every page id in ``[0, n_pages)`` is in exactly one of three states:

    state      ref   indexed   meaning
    free        0      no      on the free list, content is garbage
    in use     >=1    yes/no   held by at least one sequence (page table or move pin)
    retained    1      yes     held only by the prefix index (evictable once it is a leaf)

A holder is a sequence page-table entry, a sequence move pin, or a prefix-index node; each
holder owns exactly one reference. The pool counts ``retained`` pages (and the tokens their
index nodes cover) incrementally so the retention budget is O(1) to check.
"""

from __future__ import annotations


class OutOfPages(RuntimeError):
    """Not enough free pages, even after evicting every evictable retained page."""

    def __init__(self, wanted: int, available: int) -> None:
        super().__init__(f"need {wanted} KV pages, only {available} can be freed")
        self.wanted = wanted
        self.available = available


class PagePool:
    """Free list (LIFO: the most recently freed page is handed out first) plus ref counts."""

    def __init__(self, n_pages: int, page_size: int) -> None:
        if n_pages <= 0 or page_size <= 0:
            raise ValueError("n_pages and page_size must be positive")
        self.n_pages = n_pages
        self.page_size = page_size
        # pop() takes from the end: a fresh pool hands out 0, 1, 2, ...
        self._free: list[int] = list(range(n_pages - 1, -1, -1))
        self._ref: list[int] = [0] * n_pages
        # Tokens covered by the index node that holds the page; 0 = not indexed.
        self._indexed_tokens: list[int] = [0] * n_pages
        self.n_retained = 0
        self.n_retained_tokens = 0

    # -- queries ---------------------------------------------------------------------------
    @property
    def n_free(self) -> int:
        return len(self._free)

    def ref(self, page: int) -> int:
        return self._ref[page]

    def is_indexed(self, page: int) -> bool:
        return self._indexed_tokens[page] > 0

    def is_retained(self, page: int) -> bool:
        return self._indexed_tokens[page] > 0 and self._ref[page] == 1

    def is_private(self, page: int) -> bool:
        """True when exactly one holder exists and it is not the index: safe to write."""
        return self._ref[page] == 1 and self._indexed_tokens[page] == 0

    def free_pages(self) -> list[int]:
        return list(self._free)

    # -- mutations -------------------------------------------------------------------------
    def alloc(self, n: int) -> list[int]:
        """Take ``n`` free pages, each with ref 1 (held by the caller). All or nothing."""
        if n > len(self._free):
            raise OutOfPages(n, len(self._free))
        pages = [self._free.pop() for _ in range(n)]
        for p in pages:
            self._ref[p] = 1
        return pages

    def incref(self, page: int) -> None:
        r = self._ref[page]
        if r <= 0:
            raise ValueError(f"incref of free page {page}")
        if r == 1 and self._indexed_tokens[page]:
            self._retained_delta(page, -1)
        self._ref[page] = r + 1

    def incref_all(self, pages: list[int]) -> None:
        """``incref`` of each page in order (one call for the ~125 pages of a cached prefix)."""
        ref, indexed = self._ref, self._indexed_tokens
        for page in pages:
            r = ref[page]
            if r <= 0:
                raise ValueError(f"incref of free page {page}")
            if r == 1 and indexed[page]:
                self._retained_delta(page, -1)
            ref[page] = r + 1

    def decref(self, page: int) -> bool:
        """Drop one reference; returns True when the page went back to the free list."""
        r = self._ref[page]
        if r <= 0:
            raise ValueError(f"decref of free page {page}")
        if r == 1 and self._indexed_tokens[page]:
            raise ValueError(f"decref would drop the index's reference on page {page}")
        self._ref[page] = r - 1
        if r == 2 and self._indexed_tokens[page]:
            self._retained_delta(page, +1)
        elif r == 1:
            self._free.append(page)
            return True
        return False

    def decref_all(self, pages: list[int]) -> list[int]:
        """``decref`` of each page in order; returns the pages that became retained (held by
        the index alone), in order (one call for a finished sequence's ~125 pages)."""
        ref, indexed, free = self._ref, self._indexed_tokens, self._free
        retained: list[int] = []
        for page in pages:
            r = ref[page]
            if r <= 0:
                raise ValueError(f"decref of free page {page}")
            if r == 1:
                if indexed[page]:
                    raise ValueError(f"decref would drop the index's reference on page {page}")
                ref[page] = 0
                free.append(page)
                continue
            ref[page] = r - 1
            if r == 2 and indexed[page]:
                self._retained_delta(page, +1)
                retained.append(page)
        return retained

    def index_hold(self, page: int, n_tokens: int) -> None:
        """The prefix index takes a reference on ``page`` for a node covering ``n_tokens``."""
        if self._indexed_tokens[page]:
            raise ValueError(f"page {page} is already held by an index node")
        if not 0 < n_tokens <= self.page_size:
            raise ValueError(f"bad node length {n_tokens}")
        self.incref(page)
        self._indexed_tokens[page] = n_tokens  # ref >= 2 now: in use, not retained

    def index_release(self, page: int) -> bool:
        """The index drops its node's reference; returns True when the page became free."""
        if not self._indexed_tokens[page]:
            raise ValueError(f"page {page} is not held by the index")
        if self._ref[page] == 1:
            self._retained_delta(page, -1)
        self._indexed_tokens[page] = 0
        r = self._ref[page] - 1
        self._ref[page] = r
        if r == 0:
            self._free.append(page)
            return True
        return False

    def _retained_delta(self, page: int, sign: int) -> None:
        self.n_retained += sign
        self.n_retained_tokens += sign * self._indexed_tokens[page]
