"""``edit_file``'s text replacement (llama-server's rules), as a pure function over strings.

Every ``old_text`` is matched against the *original* content, must occur once, and no two matches
may overlap. When some ``old_text`` has no exact match, matching is fuzzy for the whole call: each
line of both sides is normalized (trailing blanks stripped, smart quotes, dashes and special spaces
made ASCII, line count kept) and lines that no edit touches are copied from the original verbatim.
Uniqueness is always counted on the normalized text, so a duplicate differing only in whitespace
counts. ``EditError`` carries the message the tool answers with.
"""

from __future__ import annotations

from typing import NamedTuple


class EditError(ValueError):
    pass


class Edit(NamedTuple):
    old_text: str
    new_text: str


class _Match(NamedTuple):
    edit_index: int
    index: int  # offset into the base content (original, or normalized when fuzzy)
    length: int
    new_text: str


_TRANSLATE = {
    **{c: "'" for c in (0x2018, 0x2019, 0x201A, 0x201B)},
    **{c: '"' for c in (0x201C, 0x201D, 0x201E, 0x201F)},
    **{c: "-" for c in range(0x2010, 0x2016)},
    0x2212: "-",
    0x00A0: " ",
    **{c: " " for c in range(0x2002, 0x200B)},
    0x202F: " ",
    0x205F: " ",
    0x3000: " ",
}


def normalize_line(line: str) -> str:
    # stripped before the translation: a trailing no-break space becomes a space that stays
    return line.rstrip(" \t\r").translate(_TRANSLATE)


def normalize(content: str) -> str:
    return "\n".join(normalize_line(line) for line in content.split("\n"))


def _split_nl(content: str) -> list[str]:
    """Only ``\\n`` ends a line (``str.splitlines`` would also split on ``\\r`` and others)."""
    out, start = [], 0
    while start < len(content):
        nl = content.find("\n", start)
        if nl < 0:
            out.append(content[start:])
            break
        out.append(content[start : nl + 1])
        start = nl + 1
    return out


def _count(content: str, needle: str) -> int:
    return content.count(needle) if needle else 0  # str.count is non-overlapping


def _apply(content: str, matches: list[_Match], offset: int) -> str:
    """``matches`` ascending and disjoint, offsets relative to ``offset``."""
    for m in reversed(matches):
        i = m.index - offset
        content = content[:i] + m.new_text + content[i + m.length :]
    return content


def _line_range(spans: list[tuple[int, int]], index: int, length: int) -> tuple[int, int] | None:
    """The lines ``[start, end)`` that the replacement at ``index`` touches."""
    start = next((i for i, (s, e) in enumerate(spans) if s <= index < e), None)
    if start is None:
        return None
    end = start
    while end < len(spans) and spans[end][1] < index + length:
        end += 1
    return None if end >= len(spans) else (start, end + 1)


def _apply_preserving(original: str, base: str, matches: list[_Match]) -> str:
    original_lines = _split_nl(original)
    spans, off = [], 0
    for line in _split_nl(base):
        spans.append((off, off + len(line)))
        off += len(line)
    groups: list[tuple[int, int, list[_Match]]] = []
    for m in matches:
        rng = _line_range(spans, m.index, m.length) or (0, len(spans))
        if groups and rng[0] < groups[-1][1]:
            s, e, reps = groups[-1]
            groups[-1] = (s, max(e, rng[1]), reps + [m])
        else:
            groups.append((rng[0], rng[1], [m]))
    out: list[str] = []
    i = 0
    for start, end, reps in groups:
        out += original_lines[i:start]
        if start < end:
            g0, g1 = spans[start][0], spans[end - 1][1]
        else:
            g0 = g1 = 0
        out.append(_apply(base[g0:g1], reps, g0))
        i = end
    out += original_lines[i:]
    return "".join(out)


def apply_edits(original: str, edits: list[Edit], path: str) -> tuple[str, int]:
    """The new content and the number of edits applied; ``EditError`` when the edits cannot apply."""
    norm_original = normalize(original)
    fuzzy = False
    for i, e in enumerate(edits):
        if e.old_text in original:
            continue
        if normalize(e.old_text) not in norm_original:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                "content exactly"
            )
        fuzzy = True
    base = norm_original if fuzzy else original
    matches: list[_Match] = []
    for i, e in enumerate(edits):
        needle = normalize(e.old_text) if fuzzy else e.old_text
        n = _count(norm_original, normalize(e.old_text))
        if n > 1:
            raise EditError(f"found {n} occurrences of edits[{i}].old_text in {path}, it must be unique")
        index = base.find(needle)
        if index < 0:
            raise EditError(
                f"could not find edits[{i}].old_text in {path}, it must match the file's current "
                "content exactly"
            )
        matches.append(_Match(i, index, len(needle), e.new_text))
    matches.sort(key=lambda m: m.index)
    for a, b in zip(matches, matches[1:], strict=False):
        if a.index + a.length > b.index:
            raise EditError(
                f"edits[{a.edit_index}] and edits[{b.edit_index}] overlap in {path}; merge them into "
                "one edit or target disjoint regions"
            )
    new = _apply_preserving(original, base, matches) if fuzzy else _apply(base, matches, 0)
    if new == original:
        raise EditError("no changes made: the replacement(s) produced identical content")
    return new, len(matches)
