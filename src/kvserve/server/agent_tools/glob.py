"""llama.cpp's glob dialect (``common.cpp: glob_match``) and the tools' path rule on top of it.

``*`` matches any run of characters except ``/``, ``**`` any run including ``/``, ``?`` one
character except ``/``, ``[...]`` a class (``!`` negates, ``a-z`` ranges, a leading ``]`` or ``-`` is
literal, an unclosed ``[`` matches itself). ``path_glob_match``: a pattern without ``/`` matches the
basename at any depth; one with ``/`` matches the whole relative path, anchored with ``**/`` unless it
already starts with ``**`` or ``/``.
"""

from __future__ import annotations

import posixpath


def _class_match(c: str, pat: str, start: int, end: int) -> bool:
    """``pat[start:end]`` is the class body between ``[`` and ``]``."""
    negated = False
    i = start
    if i < end and pat[i] == "!":
        negated = True
        i += 1
    if i < end and pat[i] in "]-":
        if pat[i] == c:
            return not negated
        i += 1
    matched = False
    while i < end:
        if i + 2 < end and pat[i + 1] == "-" and pat[i + 2] != "]":
            if pat[i] <= c <= pat[i + 2]:
                matched = True
                break
            i += 3
        else:
            if pat[i] == c:
                matched = True
                break
            i += 1
    return not matched if negated else matched


def glob_match(pattern: str, s: str) -> bool:
    memo: dict[tuple[int, int], bool] = {}

    def m(p: int, i: int) -> bool:
        key = (p, i)
        if key in memo:
            return memo[key]
        memo[key] = r = step(p, i)
        return r

    def step(p: int, i: int) -> bool:
        if p == len(pattern):
            return i == len(s)
        ch = pattern[p]
        if pattern.startswith("**", p):
            return any(m(p + 2, j) for j in range(i, len(s) + 1))  # a loop: recursion depth stays O(pattern)
        if ch == "*":
            j = i
            while j < len(s) and s[j] != "/":
                if m(p + 1, j):
                    return True
                j += 1
            return m(p + 1, j)
        if ch == "?" and i < len(s) and s[i] != "/":
            return m(p + 1, i + 1)
        if ch == "[":
            end = p + 1
            if end < len(pattern) and pattern[end] in "]-":
                end += 1
            while end < len(pattern) and pattern[end] != "]":
                end += 1
            if end < len(pattern):
                if i == len(s):
                    return False
                return _class_match(s[i], pattern, p + 1, end) and m(end + 1, i + 1)
            return i < len(s) and s[i] == "[" and m(p + 1, i + 1)
        if i < len(s) and ch == s[i]:
            return m(p + 1, i + 1)
        return False

    return m(0, 0)


def path_glob_match(pattern: str, rel_path: str) -> bool:
    if "/" not in pattern:
        return glob_match(pattern, posixpath.basename(rel_path))
    if pattern == "**" or pattern.startswith("**/") or pattern.startswith("/"):
        return glob_match(pattern, rel_path)
    return glob_match("**/" + pattern, rel_path)
