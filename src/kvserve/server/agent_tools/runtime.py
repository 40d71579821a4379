"""``--tools-runtime``: the isolate every tool call runs in when it names none (``x-tool-runtime``).

``docker:<image>`` / ``podman:<image>`` spawn ``<engine> run --rm -i --cidfile F <image> sh`` at start-up
and own it: the shell (the container's pid 1) blocks on its open stdin, closing stdin at shutdown
ends it and ``--rm`` removes it; a container that died is respawned at the next call. Any other spec
names an existing target (``<engine>-container:<id>``, ``ssh:<target>``) and is only validated.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time

from kvserve.server.agent_tools.io_isolate import ToolRuntimeError, make_io, parse_container_spec

log = logging.getLogger("kvserve.tools")

SPAWN_WAIT_S = 10.0


class StaticRuntime:
    def __init__(self, spec: str) -> None:
        make_io("", spec)  # nothing to own: refuse a bad spec now
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        pass


class ContainerRuntime:
    def __init__(self, engine: str, image: str) -> None:
        if not image:
            raise ToolRuntimeError(f"--tools-runtime {engine}:<image> requires an image name")
        self.engine = engine
        self.image = image
        self.container_id = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self._spawn()

    def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="kvserve-tools-runtime-cid-", suffix=".tmp")
        os.close(fd)
        os.unlink(cidfile)  # the engine refuses a cidfile that exists
        try:
            self._proc = subprocess.Popen(
                [self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError as e:
            raise ToolRuntimeError(
                f"failed to spawn {self.engine} container for tools runtime (image: {self.image}): {e}"
            ) from None
        cid = ""
        deadline = time.monotonic() + SPAWN_WAIT_S
        while not cid and time.monotonic() < deadline and self._proc.poll() is None:
            try:
                with open(cidfile) as f:
                    cid = f.readline().strip()
            except OSError:
                pass
            if not cid:
                time.sleep(0.1)
        try:
            os.unlink(cidfile)
        except OSError:
            pass
        if not cid:
            self._proc.kill()
            self._proc.wait()
            raise ToolRuntimeError(
                f"timed out waiting for {self.engine} container to start (image: {self.image})"
            )
        self.container_id = cid

    def spec(self) -> str:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                log.warning(
                    '%s tools runtime container "%s" died, respawning', self.engine, self.container_id
                )
                self._spawn()
            return f"{self.engine}-container:{self.container_id}"

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=SPAWN_WAIT_S)
        except (OSError, subprocess.TimeoutExpired):
            proc.kill()
            proc.wait()


def make_runtime(spec: str) -> StaticRuntime | ContainerRuntime:
    parsed = parse_container_spec(spec)
    if parsed is not None and not parsed.attach:
        return ContainerRuntime(parsed.engine, parsed.arg)
    return StaticRuntime(spec)
