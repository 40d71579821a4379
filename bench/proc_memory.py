"""Process and process-tree memory through /proc (Linux): RSS, the kernel's peak (VmHWM) and a
sampler of a process tree's RSS, for the memory benchmarks."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def rss_bytes(pid: int) -> int:
    return _status_kib(pid, "VmRSS") * 1024


def peak_rss_bytes(pid: int | str = "self") -> int:
    """VmHWM: the kernel's own peak resident set of one process."""
    return _status_kib(pid, "VmHWM") * 1024  # type: ignore[arg-type]


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM (Linux >= 4.0: write 5 to clear_refs). False if refused."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out += [int(x) for x in f.read().split()]
            except OSError:
                continue
    except OSError:
        return []
    return out


def _children_by_scan(pid: int) -> list[int]:
    """Fallback when /proc/PID/task/TID/children is missing (CONFIG_PROC_CHILDREN off)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        if ppid == pid:
            out.append(int(name))
    return out


_HAS_CHILDREN_FILE = os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants alive now."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        todo += _children(p) if _HAS_CHILDREN_FILE else _children_by_scan(p)
    return seen


def tree_rss_bytes(pid: int) -> int:
    """Sum of VmRSS over the process and its descendants (shared pages count once per process)."""
    return sum(rss_bytes(p) for p in process_tree(pid))


@dataclass
class MemorySampler:
    """Samples the RSS of a process tree every ``interval`` seconds on a background thread.

    ``extra`` (optional) is called at the same cadence and returns named readings (e.g. GPU
    bytes from a server's /metrics); their maxima are kept in ``extra_peak``.
    """

    pid: int
    interval: float = 0.1
    extra: Any = None
    samples: list[tuple[float, int]] = field(default_factory=list)
    extra_peak: dict[str, float] = field(default_factory=dict)
    extra_last: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> MemorySampler:
        self._thread = threading.Thread(target=self._run, name="mem-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> int:
        v = tree_rss_bytes(self.pid)
        self.samples.append((time.monotonic(), v))
        if self.extra is not None:
            try:
                got = self.extra() or {}
            except Exception:  # noqa: BLE001 - a failed scrape is a missing reading
                got = {}
            for k, x in got.items():
                self.extra_last[k] = x
                self.extra_peak[k] = max(self.extra_peak.get(k, x), x)
        return v

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    @property
    def peak(self) -> int:
        return max((v for _, v in self.samples), default=0)

    def peak_since(self, t0: float) -> int:
        return max((v for t, v in self.samples if t >= t0), default=0)
