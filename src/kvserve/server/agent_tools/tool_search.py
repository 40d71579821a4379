"""``file_glob_search`` and ``grep_search``: listings (``ToolIO.list_entries``) filtered by globs."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from kvserve.server.agent_tools.glob import path_glob_match
from kvserve.server.agent_tools.io_base import ListEntry, ListKind
from kvserve.server.agent_tools.params import optional, required
from kvserve.server.agent_tools.registry import Emit
from kvserve.server.agent_tools.tool_base import BuiltinTool, schema
from kvserve.server.agent_tools.tool_files import lines_of, text_of

GLOB_MAX_RESULTS = 100
GREP_MAX_RESULTS = 100
_LITERAL_SPECIALS = set("\\^$.|?*+()[]{}")


class FileGlobSearch(BuiltinTool):
    name = "file_glob_search"
    display_name = "File search"
    description = (
        "Recursively search for files matching a glob pattern under a directory. "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
        "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. "
        "A pattern containing '/' matches the full relative path; unless already anchored with "
        '"**/" or a leading \'/\', it is automatically prefixed with "**/". '
        'Use type="dir" or "all" to also list directories; directory entries are suffixed with \'/\' in the '
        "output. Note: directory listings do not apply .gitignore filtering."
    )

    def parameters(self) -> dict[str, Any]:
        return schema(
            {
                "path": ("string", "Base directory to search in"),
                "include": (
                    "string",
                    'Glob pattern for files to include (e.g. "*.cpp" or "src/**/*.cpp"). Default: **',
                ),
                "exclude": ("string", "Glob pattern for files to exclude"),
                "type": ("string", 'Entry type to return: "file" (default), "dir" or "all"'),
                "max_depth": (
                    "integer",
                    "Maximum depth to descend into subdirectories (default: 0 = unlimited; "
                    "1 = direct children only)",
                ),
                "limit": (
                    "integer",
                    f"Maximum number of results to return, capped at {GLOB_MAX_RESULTS} "
                    f"(default {GLOB_MAX_RESULTS})",
                ),
            },
            ["path"],
        )

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        io = self.io(params)
        path = required(params, "path", str)
        base = io.resolve(path)
        include = optional(params, "include", str, "**")
        exclude = optional(params, "exclude", str, "")
        type_ = optional(params, "type", str, "file")
        max_depth = max(0, optional(params, "max_depth", int, 0))
        limit_req = optional(params, "limit", int, GLOB_MAX_RESULTS)
        if limit_req < 1:
            return {"error": f"invalid limit: {limit_req} (expected 1 or more)"}
        limit = min(limit_req, GLOB_MAX_RESULTS)
        try:
            kind = ListKind(type_)
        except ValueError:
            return {"error": f'invalid type: {type_} (expected "file", "dir" or "all")'}
        listing = io.list_entries(base, max_depth, kind)
        if listing.err:
            return {"error": f"{listing.err}: {path}"}
        matches: list[ListEntry] = [
            e
            for e in listing.entries
            if path_glob_match(include, e.rel) and not (exclude and path_glob_match(exclude, e.rel))
        ]
        shown = matches[:limit]
        text = "".join(e.rel + ("/" if e.is_dir else "") + "\n" for e in shown)
        text += f"\n---\nTotal matches: {len(matches)}\n"
        if len(matches) > len(shown):
            text += (
                f"[{len(shown)} results limit reached ({len(matches)} total matches). "
                "Refine the glob pattern to narrow the search.]\n"
            )
        if listing.truncated:
            text += "[results truncated: time budget or unreadable directory]\n"
        # `base` is absolute, so a client (the web UI's picker) can join the relative entries
        return {
            "plain_text_response": text,
            "entries": [{"path": e.rel, "type": "dir" if e.is_dir else "file"} for e in shown],
            "base": base,
        }


class GrepSearch(BuiltinTool):
    name = "grep_search"
    display_name = "Grep search"
    description = (
        "Search for a pattern in files under a path. Returns matching lines with file paths "
        "(and, unless searching a single file, paths relative to the given directory). "
        "Automatically skips files ignored by .gitignore (when the directory is inside a git repo) "
        "and common junk directories (.git, node_modules, build, dist, etc.) otherwise. "
        "include/exclude: a pattern with no '/' matches the basename at any depth; a pattern "
        "containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored)."
    )

    def parameters(self) -> dict[str, Any]:
        return schema(
            {
                "path": ("string", "File or directory to search in"),
                "pattern": ("string", "Pattern to search for (regular expression unless literal is true)"),
                "include": ("string", "Glob pattern to filter files (default: **)"),
                "exclude": ("string", "Glob pattern to exclude files"),
                "return_line_numbers": ("boolean", "If true, include line numbers in results"),
                "literal": (
                    "boolean",
                    "Treat pattern as a literal string instead of a regular expression (default: false)",
                ),
                "ignore_case": ("boolean", "Case-insensitive search (default: false)"),
                "context_lines": (
                    "integer",
                    "Number of lines of context to show before and after each match (default: 0)",
                ),
            },
            ["path", "pattern"],
        )

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        path = required(params, "path", str)
        pattern_src = required(params, "pattern", str)
        include = optional(params, "include", str, "**")
        exclude = optional(params, "exclude", str, "")
        show_lineno = optional(params, "return_line_numbers", bool, False)
        literal = optional(params, "literal", bool, False)
        ignore_case = optional(params, "ignore_case", bool, False)
        ctx = max(0, optional(params, "context_lines", int, 0))
        if literal:
            pattern_src = "".join("\\" + c if c in _LITERAL_SPECIALS else c for c in pattern_src)
        try:
            pattern = re.compile(pattern_src, re.IGNORECASE if ignore_case else 0)
        except (re.error, OverflowError, RecursionError) as e:
            return {"error": f"invalid regex: {e}"}

        io = self.io(params)
        abs_path = io.resolve(path)
        files: list[tuple[str, str]] = []  # (absolute path, path shown)
        if io.is_regular_file(abs_path):
            files.append((abs_path, path))
        elif io.is_directory(abs_path):
            listing = io.list_entries(abs_path, 0, ListKind.FILES)
            if listing.err:
                return {"error": f"{listing.err}: {path}"}
            files += [
                (posixpath.join(abs_path, e.rel), e.rel)
                for e in listing.entries
                if path_glob_match(include, e.rel) and not (exclude and path_glob_match(exclude, e.rel))
            ]
        else:
            return {"error": f"path does not exist: {path}"}

        out: list[str] = []
        total = 0
        limit_reached = False
        show_num = show_lineno or ctx > 0
        for fpath, shown in files:
            if limit_reached:
                break
            raw = io.read_file(fpath)
            if raw is None:
                continue
            lines = [text_of(b) for b in lines_of(raw)]
            for i, line in enumerate(lines):
                if total >= GREP_MAX_RESULTS:
                    limit_reached = True
                    break
                if not pattern.search(line):
                    continue
                lo, hi = (max(0, i - ctx), min(len(lines) - 1, i + ctx)) if ctx > 0 else (i, i)
                for j in range(lo, hi + 1):
                    sep = ":" if j == i else "-"
                    out.append(shown + sep + (f"{j + 1}{sep}" if show_num else "") + lines[j] + "\n")
                if ctx > 0:
                    out.append("--\n")
                total += 1
        text = "".join(out) + f"\n---\nTotal matches: {total}\n"
        if limit_reached:
            text += (
                f"[{GREP_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
            )
        return {"plain_text_response": text}
