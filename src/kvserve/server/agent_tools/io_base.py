"""What a tool needs from the machine it runs on (``ToolIO``), and the shared listing types.

Two implementations: ``io_local.LocalIO`` (this host) and ``io_isolate.IsolateIO`` (every operation
is a POSIX command run in a container or over ssh). Paths cross this interface as ``str`` with
``/`` separators; file contents as ``bytes``.
"""

from __future__ import annotations

import enum
from typing import NamedTuple, Protocol

from kvserve.server.agent_tools.subproc import ExecResult, OnChunk

GIT_LS_FILES_MAX_OUTPUT = 8 * 1024 * 1024
LIST_TIMEOUT_S = 15  # one listing call, git and walker together

# Listed but never descended into: they can be enormous.
JUNK_DIR_NAMES = (
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
)


class ListKind(enum.Enum):
    FILES = "file"
    DIRS = "dir"
    ALL = "all"


class ListEntry(NamedTuple):
    rel: str  # '/'-separated, relative to the listed base
    is_dir: bool


class ListResult(NamedTuple):
    entries: list[ListEntry]
    err: str = ""  # set when the base is not a directory
    truncated: bool = False  # the walk could not see everything (time budget, unreadable directory)


def entry_depth(rel: str) -> int:
    """``"a/b/c"`` is 3."""
    return 1 + rel.count("/")


class ToolIO(Protocol):
    def resolve(self, path: str) -> str:
        """``path`` against the working directory; absolute paths are returned unchanged."""
        ...

    def is_directory(self, path: str) -> bool: ...

    def is_regular_file(self, path: str) -> bool: ...

    def file_size(self, path: str) -> int | None: ...

    def read_file(self, path: str) -> bytes | None: ...

    def write_file(self, path: str, content: bytes) -> bool:
        """Creates the parent directories."""
        ...

    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult:
        """``base`` already resolved; ``max_depth`` 0 = unlimited, 1 = direct children only."""
        ...

    def run(
        self, args: list[str], max_output: int, timeout_s: int, on_chunk: OnChunk | None = None
    ) -> ExecResult: ...
