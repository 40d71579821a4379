"""One child process run to completion: combined output, a size cap, a deadline, streaming.

``run(args, ...)`` mirrors llama-server's tool subprocess helper: the output is read as raw bytes
as soon as it is ready; past ``max_output`` bytes it is still drained (a full pipe would block the
child) but dropped, and ``"\\n[output truncated]"`` is appended; at the deadline the whole process
group is killed and ``timed_out`` is set. A child that could not start reports
``"failed to spawn process"`` with exit code -1; one killed by a signal reports 1.
"""

from __future__ import annotations

import codecs
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import NamedTuple

OnChunk = Callable[[str], bool]  # one chunk of output as read; returning False stops the child


class ExecResult(NamedTuple):
    output: str
    exit_code: int
    timed_out: bool


def _kill(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the child leads its own group: sh and what it started
    except OSError:
        try:
            proc.kill()
        except OSError:
            pass


def run(
    args: Sequence[str],
    max_output: int,
    timeout_s: float,
    on_chunk: OnChunk | None = None,
    *,
    combine_stderr: bool = True,
    cwd: str = "",
    stdin_data: bytes | None = None,
) -> ExecResult:
    try:
        proc = subprocess.Popen(
            list(args),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL,
            cwd=cwd or None,
            start_new_session=True,
        )
    except (OSError, ValueError):
        return ExecResult("failed to spawn process", -1, False)

    done = threading.Event()
    timed_out = threading.Event()

    def watchdog() -> None:
        if not done.wait(timeout_s):
            timed_out.set()
            _kill(proc)

    timer = threading.Thread(target=watchdog, daemon=True)
    timer.start()
    assert proc.stdin is not None and proc.stdout is not None
    try:  # the child drains stdin as it goes; stdin is always closed so a reader never waits forever
        if stdin_data:
            proc.stdin.write(stdin_data)
        proc.stdin.close()
    except OSError:
        pass

    out = bytearray()
    truncated = False
    fd = proc.stdout.fileno()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")  # a chunk may end inside a character
    while True:
        try:
            buf = os.read(fd, 4096)
        except InterruptedError:
            continue
        except OSError:
            break
        if not buf:
            break
        if truncated:
            continue
        if len(out) + len(buf) <= max_output:
            out += buf
            if on_chunk is not None and not on_chunk(decoder.decode(buf)):
                _kill(proc)
                break
        else:
            rest = buf[: max_output - len(out)]
            out += rest
            if on_chunk is not None and rest:
                on_chunk(decoder.decode(rest, final=True))
            truncated = True
    proc.stdout.close()
    code = proc.wait()
    done.set()
    timer.join()
    text = out.decode("utf-8", "replace")
    if truncated:
        text += "\n[output truncated]"
    return ExecResult(text, code if code >= 0 else 1, timed_out.is_set())
