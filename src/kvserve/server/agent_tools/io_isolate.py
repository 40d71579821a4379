"""Tool I/O inside an isolate (a running container, a host over ssh), and the runtime spec parser.

Every operation is a POSIX command (``sh cat wc mkdir dirname find timeout``) run through the
isolate's transport, whose argv ``build_argv`` produces; the isolate is created and torn down
elsewhere (``runtime.py`` for ``--tools-runtime docker:<image>``). Runtime specs:

  ``docker-container:<id>`` / ``podman-container:<id>``  ``<engine> exec [-i] <id> ...``
  ``ssh:<target>``                                       ``ssh -o BatchMode=yes ... [-n] <target> '<quoted>'``
  ``docker:<image>`` / ``podman:<image>``                only for ``--tools-runtime`` (owns a container)

Ids and targets come from a client header and land on the transport's command line, so one that
could be read as an option (starting with ``-``, or with characters outside ``[A-Za-z0-9._-]``, ``@``
too for ssh) is refused; an unknown scheme is refused rather than run on the host.
"""

from __future__ import annotations

import subprocess
from typing import NamedTuple

from kvserve.server.agent_tools import subproc
from kvserve.server.agent_tools.io_base import (
    GIT_LS_FILES_MAX_OUTPUT,
    JUNK_DIR_NAMES,
    ListEntry,
    ListKind,
    ListResult,
    ToolIO,
    entry_depth,
)
from kvserve.server.agent_tools.io_local import LocalIO
from kvserve.server.agent_tools.subproc import ExecResult, OnChunk

AUX_TIMEOUT_S = 15  # stat/mkdir/ls helper commands; exec_shell_command brings its own
READ_FILE_MAX = 64 * 1024 * 1024
ENGINES = ("docker", "podman")


class ToolRuntimeError(RuntimeError):
    """A runtime spec that cannot be used (HTTP 500, as in llama-server)."""


def shell_quote_join(argv: list[str]) -> str:
    """One string a POSIX shell re-parses into exactly ``argv``."""
    return " ".join("'" + a.replace("'", "'\\''") + "'" for a in argv)


def _split_lines(text: str, strip_dot_slash: bool) -> list[str]:
    out = []
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if not line:
            continue
        if strip_dot_slash and line.startswith("./"):
            line = line[2:]
        out.append(line.replace("\\", "/"))
    return out


class IsolateIO:
    """Subclasses give ``build_argv``. Isolate paths are POSIX whatever the host."""

    def __init__(self, cwd: str = "") -> None:
        self.cwd = cwd

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        raise NotImplementedError

    def resolve(self, path: str) -> str:
        if not self.cwd or path.startswith("/"):
            return path
        return self.cwd + "/" + path

    def _exec(self, inner: list[str], max_output: int, combine_stderr: bool = True) -> ExecResult:
        return subproc.run(
            self.build_argv(inner, False), max_output, AUX_TIMEOUT_S, combine_stderr=combine_stderr
        )

    def _test(self, flag: str, path: str) -> bool:
        res = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", path], 4096)
        return res.exit_code == 0 and not res.timed_out

    def is_directory(self, path: str) -> bool:
        return self._test("-d", self.resolve(path))

    def is_regular_file(self, path: str) -> bool:
        return self._test("-f", self.resolve(path))

    def file_size(self, path: str) -> int | None:
        res = self._exec(["sh", "-c", 'wc -c < "$1"', "_", self.resolve(path)], 64)
        if res.exit_code != 0 or res.timed_out:
            return None
        try:
            return int(res.output.strip())
        except ValueError:
            return None

    def read_file(self, path: str) -> bytes | None:
        return _run_bytes(self.build_argv(["cat", "--", self.resolve(path)], False), READ_FILE_MAX)

    def write_file(self, path: str, content: bytes) -> bool:
        # the content travels on stdin: nothing for the far side to re-parse, no temp file on the host
        inner = ["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)]
        res = subproc.run(self.build_argv(inner, True), 4096, AUX_TIMEOUT_S, stdin_data=content)
        return res.exit_code == 0 and not res.timed_out

    def list_entries(self, base: str, max_depth: int, kind: ListKind) -> ListResult:
        abs_base = self.resolve(base)
        if not self.is_directory(base):
            return ListResult([], "path does not exist or is not a directory")
        if kind is ListKind.FILES:
            res = self._exec(
                ["sh", "-c", 'cd "$1" && git ls-files --cached --others --exclude-standard', "_", abs_base],
                GIT_LS_FILES_MAX_OUTPUT,
            )
            if res.exit_code == 0 and not res.timed_out:
                rels = _split_lines(res.output, False)
                return ListResult(
                    [ListEntry(r, False) for r in rels if not (max_depth > 0 and entry_depth(r) > max_depth)]
                )
        entries: list[ListEntry] = []
        truncated = False
        if kind is not ListKind.FILES:
            rels, t = self._find(abs_base, max_depth, dirs=True)
            entries += [ListEntry(r, True) for r in rels]
            truncated |= t
        if kind is not ListKind.DIRS:
            rels, t = self._find(abs_base, max_depth, dirs=False)
            entries += [ListEntry(r, False) for r in rels]
            truncated |= t
        return ListResult(entries, "", truncated)

    def _find(self, abs_base: str, max_depth: int, dirs: bool) -> tuple[list[str], bool]:
        """One ``find`` pass; junk directories are printed but pruned (busybox and GNU find alike)."""
        prune = " -o ".join(f"-name {n}" for n in JUNK_DIR_NAMES)
        cmd = 'cd "$1" && find . -mindepth 1'
        if max_depth > 0:
            cmd += f" -maxdepth {max_depth}"
        cmd += f" \\( {prune} \\) -prune"
        cmd += " -print -o -type d -print" if dirs else " -o -type f -print"
        res = self._exec(["sh", "-c", cmd, "_", abs_base], GIT_LS_FILES_MAX_OUTPUT)
        return _split_lines(res.output, True), res.timed_out

    def run(
        self, args: list[str], max_output: int, timeout_s: int, on_chunk: OnChunk | None = None
    ) -> ExecResult:
        # `timeout` inside the isolate: killing the host-side client does not stop what runs there;
        # the host deadline leaves it 5 s to exit cleanly
        inner = ["timeout", f"{timeout_s}s", *args]
        if self.cwd:  # 127: what a shell reports for a command it could not run
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return subproc.run(self.build_argv(inner, True), max_output, timeout_s + 5, on_chunk)


def _run_bytes(argv: list[str], max_output: int) -> bytes | None:
    """stdout only (stderr must not be spliced into file bytes), as bytes; None on failure."""
    try:
        proc = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            timeout=AUX_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout[:max_output] if proc.returncode == 0 else None


class ContainerIO(IsolateIO):
    """An already-running container, through ``<engine> exec`` (docker and podman take the same verbs)."""

    def __init__(self, engine: str, container_id: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.engine = engine
        self.container_id = container_id

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        return [self.engine, "exec", *(["-i"] if needs_stdin else []), self.container_id, *inner]


class SshIO(IsolateIO):
    """A remote POSIX host (remoting, not isolation: the tools can do what the account can).
    Key-based auth and a trusted host key only: there is no console to answer a prompt."""

    OPTIONS = (
        "-o",
        "BatchMode=yes",
        "-o",
        "PasswordAuthentication=no",
        "-o",
        "KbdInteractiveAuthentication=no",
        "-o",
        "StrictHostKeyChecking=yes",
    )

    def __init__(self, target: str, cwd: str = "") -> None:
        super().__init__(cwd)
        self.target = target

    def build_argv(self, inner: list[str], needs_stdin: bool) -> list[str]:
        # the remote shell re-parses the command line, so `inner` travels as one quoted word
        return ["ssh", *self.OPTIONS, *([] if needs_stdin else ["-n"]), self.target, shell_quote_join(inner)]


def _valid(s: str, extra: str) -> bool:
    return (
        bool(s)
        and s[0].isascii()
        and s[0].isalnum()
        and all((c.isascii() and c.isalnum()) or c in extra for c in s)
    )


def valid_ssh_target(target: str) -> bool:
    return (
        bool(target)
        and target[0] != "-"
        and all((c.isascii() and c.isalnum()) or c in ".-_@" for c in target)
    )


def valid_container_id(cid: str) -> bool:
    return _valid(cid, ".-_")


class ContainerSpec(NamedTuple):
    engine: str
    arg: str  # the image when spawning, the container id when attaching
    attach: bool


def parse_container_spec(spec: str) -> ContainerSpec | None:
    for engine in ENGINES:
        if spec.startswith(engine + "-container:"):
            return ContainerSpec(engine, spec[len(engine) + len("-container:") :], True)
        if spec.startswith(engine + ":"):
            return ContainerSpec(engine, spec[len(engine) + 1 :], False)
    return None


def make_io(cwd: str, runtime: str) -> ToolIO:
    """The I/O of one tool call: the host when ``runtime`` is empty, else the isolate it names."""
    if not runtime:
        return LocalIO(cwd)
    container = parse_container_spec(runtime)
    if container is not None:
        if not container.attach:  # spawning belongs to --tools-runtime, a call only attaches
            raise ToolRuntimeError(f"tool runtime must name a running container: {runtime}")
        if not valid_container_id(container.arg):
            raise ToolRuntimeError(f"invalid container id: {container.arg}")
        return ContainerIO(container.engine, container.arg, cwd)
    if runtime.startswith("ssh:"):
        target = runtime[len("ssh:") :]
        if not valid_ssh_target(target):
            raise ToolRuntimeError(f"invalid ssh target: {target}")
        return SshIO(target, cwd)
    raise ToolRuntimeError(f"unknown tool runtime: {runtime}")
