"""The tools' pure text rules: llama.cpp's glob dialect and edit_file's replacement."""

from __future__ import annotations

import pytest

from kvserve.server.agent_tools.edit import Edit, EditError, apply_edits, normalize
from kvserve.server.agent_tools.glob import glob_match, path_glob_match


@pytest.mark.parametrize(
    ("pattern", "s", "want"),
    [
        ("*.cpp", "main.cpp", True),
        ("*.cpp", "src/main.cpp", False),  # * stops at '/'
        ("**", "a/b/c", True),
        ("**/*.cpp", "a/b/c.cpp", True),
        ("**/*.cpp", "c.cpp", False),  # the '/' after ** is literal
        ("a/**/c", "a/c", False),
        ("a/**/c", "a/b/x/c", True),
        ("?.txt", "a.txt", True),
        ("?", "/", False),
        ("[abc]x", "bx", True),
        ("[!abc]x", "bx", False),
        ("[a-c]x", "cx", True),
        ("[]]x", "]x", True),
        ("[-a]", "-", True),
        ("[x", "[x", True),  # unclosed class: literal '['
        ("", "", True),
        ("", "a", False),
        ("*" * 30 + "b", "a" * 40, False),  # memoized: no exponential backtracking
    ],
)
def test_glob_match(pattern: str, s: str, want: bool) -> None:
    assert glob_match(pattern, s) is want


@pytest.mark.parametrize(
    ("pattern", "rel", "want"),
    [
        ("*.py", "a/b/c.py", True),  # no '/': the basename at any depth
        ("b/*.py", "a/b/c.py", True),  # auto-anchored with **/
        ("b/*.py", "b/c.py", False),  # ... which then needs a '/' before b
        ("**/b/*.py", "a/b/c.py", True),
        ("/b/*.py", "b/c.py", False),
        ("src/**", "src/util.cpp", False),  # llama.cpp's rule, kept
    ],
)
def test_path_glob_match(pattern: str, rel: str, want: bool) -> None:
    assert path_glob_match(pattern, rel) is want


def test_long_paths_do_not_recurse_deeply() -> None:
    assert glob_match("**x", "a/" * 3000 + "x")


def test_edits_match_the_original_not_incrementally() -> None:
    new, n = apply_edits("a b c", [Edit("a", "b"), Edit("b", "c")], "f")
    assert (new, n) == ("b c c", 2)


def test_fuzzy_edit_keeps_untouched_lines_verbatim() -> None:
    original = "keep \u201csmart\u201d  \nfix \u2013 this  \r\nlast\t\n"
    new, _ = apply_edits(original, [Edit("fix - this", "fixed")], "f")
    assert new == "keep \u201csmart\u201d  \nfixed\nlast\t\n"  # only the touched line is normalized


def test_uniqueness_counts_whitespace_only_duplicates() -> None:
    with pytest.raises(
        EditError, match="found 2 occurrences of edits\\[0\\].old_text in f, it must be unique"
    ):
        apply_edits("x  \nx\n", [Edit("x\n", "y\n")], "f")


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ([Edit("zz", "y")], "could not find edits[0].old_text in f"),
        ([Edit("ab", "1"), Edit("bc", "2")], "edits[0] and edits[1] overlap in f"),
        ([Edit("b", "b")], "no changes made"),
    ],
)
def test_edit_errors(edits: list[Edit], message: str) -> None:
    with pytest.raises(EditError) as e:
        apply_edits("abc", edits, "f")
    assert message in str(e.value)


def test_normalize_keeps_the_line_count() -> None:
    assert normalize("a \u00a0\n\u201cq\u201d\t\n") == 'a  \n"q"\n'
