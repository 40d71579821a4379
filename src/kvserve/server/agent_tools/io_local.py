"""Tool I/O on this host: paths resolve against the call's working directory (``x-tool-cwd``) or the
server's, commands run there, file listings come from ``git ls-files`` when the base is inside a
work tree (so ``.gitignore`` applies) and from a walker otherwise."""

from __future__ import annotations

import os
import posixpath
import time

from kvserve.server.agent_tools import subproc
from kvserve.server.agent_tools.io_base import (
    GIT_LS_FILES_MAX_OUTPUT,
    JUNK_DIR_NAMES,
    LIST_TIMEOUT_S,
    ListEntry,
    ListKind,
    ListResult,
    entry_depth,
)
from kvserve.server.agent_tools.subproc import ExecResult, OnChunk


def expand_home(path: str) -> str:
    """A leading ``~`` (alone or before a separator) becomes ``$HOME``."""
    if not path.startswith("~") or (len(path) > 1 and path[1] not in "/\\"):
        return path
    home = os.environ.get("HOME", "")
    return home + path[1:] if home else path


class LocalIO:
    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def resolve(self, path: str) -> str:
        p = expand_home(path)
        if not posixpath.isabs(p):
            base = self.cwd
            if not base:
                try:
                    base = os.getcwd()
                except OSError:
                    return p
            p = posixpath.join(base, p)
        return posixpath.normpath(p)  # no "." or ".." reaches git or the client

    def is_directory(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def file_size(self, path: str) -> int | None:
        """Regular files only (a directory has no size here, as with std::filesystem)."""
        full = self.resolve(path)
        try:
            return os.path.getsize(full) if os.path.isfile(full) else None
        except OSError:
            return None

    def read_file(self, path: str) -> bytes | None:
        try:
            with open(self.resolve(path), "rb") as f:
                return f.read()
        except OSError:
            return None

    def write_file(self, path: str, content: bytes) -> bool:
        full = self.resolve(path)
        try:
            parent = posixpath.dirname(full)
            if parent:
                os.makedirs(parent, exist_ok=True)
            with open(full, "wb") as f:
                f.write(content)
        except OSError:
            return False
        return True

    def run(
        self, args: list[str], max_output: int, timeout_s: int, on_chunk: OnChunk | None = None
    ) -> ExecResult:
        return subproc.run(args, max_output, timeout_s, on_chunk, combine_stderr=True, cwd=self.cwd)

    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult:
        if not os.path.isdir(base):
            return ListResult([], "path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT_S
        if kind is ListKind.FILES:  # git cannot list directories
            res = self.run(
                ["git", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                GIT_LS_FILES_MAX_OUTPUT,
                LIST_TIMEOUT_S,
            )
            if res.exit_code == 0 and not res.timed_out:
                out = []
                for line in res.output.split("\n"):
                    line = line.removesuffix("\r").replace("\\", "/")
                    if not line or (max_depth > 0 and entry_depth(line) > max_depth):
                        continue
                    if os.path.isfile(posixpath.join(base, line)):
                        out.append(ListEntry(line, False))
                return ListResult(out)
        return self._walk(base, max_depth, kind, deadline)

    @staticmethod
    def _walk(base: str, max_depth: int, kind: ListKind, deadline: float) -> ListResult:
        """Depth-first; links are listed but never followed (one may point back to an ancestor)."""
        out: list[ListEntry] = []
        truncated = False
        stack: list[tuple[str, str, int]] = [(base, "", 0)]
        while stack:
            if time.monotonic() >= deadline:
                return ListResult(out, "", True)
            directory, rel_dir, depth = stack.pop()
            try:
                it = os.scandir(directory)
            except PermissionError:
                continue
            except OSError:
                truncated = True
                continue
            with it:
                for entry in it:
                    if time.monotonic() >= deadline:
                        return ListResult(out, "", True)
                    rel = posixpath.join(rel_dir, entry.name) if rel_dir else entry.name
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        continue
                    if is_dir:
                        if kind is not ListKind.FILES:
                            out.append(ListEntry(rel, True))
                        if entry.name in JUNK_DIR_NAMES:
                            continue
                        if not entry.is_symlink() and (max_depth == 0 or depth + 1 < max_depth):
                            stack.append((entry.path, rel, depth + 1))
                    elif entry.is_file() and kind is not ListKind.DIRS:
                        out.append(ListEntry(rel, False))
        return ListResult(out, "", truncated)
