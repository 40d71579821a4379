"""The router's model instances: one child ``python -m kvserve`` process per loaded model.

Status per model (llama-server's names): ``unloaded`` -> ``loading`` (child spawned, waiting
for its ``/health``) -> ``loaded`` -> ``unloaded`` again when the child exits (asked to, or
not: then ``failed`` with its exit code). ``--models-max N`` (0 = no limit) bounds the
children alive at once: loading one more first stops the least recently used model that
serves no request (none idle: "model limit reached, try again later").

A child gets its model's options (``--model PATH`` and, from ``--models-preset``, the preset's
flags, minus those the router's command line sets), the router's own command line minus what
only the router owns (``child_argv``), ``--alias NAME --host 127.0.0.1 --port P``, and
``LLAMA_SERVER_ROUTER_PORT`` in its environment; it exits when its stdin closes, so no child
outlives the router. Asked to stop, a child gets its ``stop-timeout`` (10 s) before it is killed.

Events for ``/models/sse`` (``notify``): ``model_status`` on spawning, ``status_change`` on
every status change, ``models_reload`` (model ``*``) after ``?reload=1``. Everything here runs on the router's event loop.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvserve.args.table import find_flag, flags_for_dest
from kvserve.router.catalog import ModelEntry
from kvserve.router.preset import Options, cli_options, keys_of_dests, to_args, to_ini, without

log = logging.getLogger("kvserve.router")

# What the router owns; never passed on to a child (flags and their environment variables).
RESERVED_DESTS = ("models_dir", "models_max", "models_preset", "models_autoload", "host", "port",
                  "api_keys", "ssl_key_file", "ssl_cert_file", "aliases", "model")


# What a preset may not set for its child: the router's own flags, and the name and address it gives.
PRESET_RESERVED = frozenset(keys_of_dests(d for d in RESERVED_DESTS if d != "model"))


def child_argv(argv: Sequence[str]) -> list[str]:
    """``argv`` without the reserved flags (and their values)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        try:
            spec = find_flag(arg)
        except KeyError:
            out.append(arg)
            i += 1
            continue
        n = spec.nargs if spec.takes_value else 0
        if spec.dest not in RESERVED_DESTS:
            out.extend(argv[i : i + 1 + n])
        i += 1 + n
    return out


def child_env(environ: dict[str, str], router_port: int) -> dict[str, str]:
    drop = {e for d in RESERVED_DESTS for s in flags_for_dest(d) for e in s.envs}
    env = {k: v for k, v in environ.items() if k not in drop}
    env["LLAMA_SERVER_ROUTER_PORT"] = str(router_port)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RouterError(Exception):
    def __init__(self, message: str, code: int = 400, type: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.message, self.code, self.type = message, code, type


@dataclass
class Instance:
    entry: ModelEntry
    status: str = "unloaded"
    port: int = 0
    proc: asyncio.subprocess.Process | None = None
    last_used: float = 0.0
    in_flight: int = 0
    exit_code: int = 0
    failed: bool = False
    stopping: bool = False
    args: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def running(self) -> bool:
        return self.status in ("loading", "loaded")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class ModelPool:
    def __init__(self, entries: dict[str, ModelEntry], argv: Sequence[str], models_max: int,
                 router_port: int, load_timeout: float = 600.0, health_path: str = "/health") -> None:
        self.instances = {name: Instance(e) for name, e in entries.items()}
        self.base_args = child_argv(argv)
        self.cli_options: Options = cli_options(argv)  # the router's flags win over any preset
        self.models_max = models_max
        self.router_port = router_port
        self.load_timeout = load_timeout
        self.health_path = health_path  # the children have the router's --api-prefix
        self._lock = asyncio.Lock()  # loads and evictions, one at a time
        self._subscribers: list[asyncio.Queue[dict[str, Any]]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    # -- events -------------------------------------------------------------------------------
    def subscribe(self) -> asyncio.Queue[dict[str, Any]]:
        q: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._subscribers.append(q)
        return q

    def unsubscribe(self, q: asyncio.Queue[dict[str, Any]]) -> None:
        if q in self._subscribers:
            self._subscribers.remove(q)

    def notify(self, event: str, model: str, data: dict[str, Any] | None) -> None:
        ev: dict[str, Any] = {"event": event, "model": model}
        if data is not None:
            ev["data"] = data
        for q in self._subscribers:
            q.put_nowait(dict(ev))

    def _set(self, inst: Instance, status: str) -> None:
        inst.status = status
        data: dict[str, Any] = {"status": status}
        if status == "unloaded":
            data["exit_code"] = inst.exit_code
        self.notify("status_change", inst.name, data)
        inst.changed.set()
        inst.changed = asyncio.Event()

    # -- queries ------------------------------------------------------------------------------
    def get(self, name: str) -> Instance | None:
        """The model named ``name``, or the one with that alias."""
        inst = self.instances.get(name)
        if inst is None:
            inst = next((i for i in self.instances.values() if name in i.entry.aliases), None)
        return inst

    def child_options(self, entry: ModelEntry) -> Options:
        opts = dict(entry.options)
        if entry.path:
            opts.setdefault("model", entry.path)
        return without(opts, PRESET_RESERVED | set(self.cli_options))

    def preset_ini(self, entry: ModelEntry) -> str:
        """``status.preset`` of ``/models``: the model's options with the router's flags over them."""
        return to_ini(entry.name, without({**self.child_options(entry), **self.cli_options},
                                          PRESET_RESERVED | {"tags"}))

    def n_running(self) -> int:
        return sum(1 for i in self.instances.values() if i.running)

    # -- load / unload ------------------------------------------------------------------------
    async def load(self, name: str) -> None:
        """Spawn the model's child (returns at once; ``wait_loaded`` waits for it)."""
        async with self._lock:
            inst = self.instances[name]
            if inst.running:
                return
            if self.models_max > 0 and self.n_running() >= self.models_max:
                await self._evict_lru()
            self._spawn(inst)

    async def _evict_lru(self) -> None:
        idle = [i for i in self.instances.values() if i.status == "loaded" and i.in_flight == 0]
        if not idle:
            raise RouterError("model limit reached, try again later", 503, "unavailable_error")
        victim = min(idle, key=lambda i: i.last_used)
        log.info("models_max limit reached, removing LRU name=%s", victim.name)
        await self.unload(victim.name, wait=True)

    def _spawn(self, inst: Instance) -> None:
        inst.port = free_port()
        inst.failed, inst.exit_code, inst.stopping = False, 0, False
        inst.last_used = time.monotonic()
        inst.args = [sys.executable, "-m", "kvserve", *to_args(self.child_options(inst.entry)), *self.base_args,
                     "--alias", inst.name, "--host", "127.0.0.1", "--port", str(inst.port)]
        log.info("spawning server instance with name=%s on port %d", inst.name, inst.port)
        self._set(inst, "loading")
        self.notify("model_status", inst.name, {"status": "loading"})
        task = asyncio.ensure_future(self._run(inst))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, inst: Instance) -> None:
        try:
            inst.proc = await asyncio.create_subprocess_exec(
                *inst.args, stdin=asyncio.subprocess.PIPE, env=child_env(dict(os.environ), self.router_port))
        except OSError as e:
            log.error("failed to spawn server instance name=%s: %s", inst.name, e)
            inst.exit_code, inst.failed = -1, True
            self._set(inst, "unloaded")
            return
        proc = inst.proc
        health = asyncio.ensure_future(self._wait_healthy(inst))
        code = await proc.wait()
        health.cancel()
        inst.proc = None
        inst.exit_code = code
        inst.failed = code != 0 and not inst.stopping
        log.info("instance name=%s exited with status %d", inst.name, code)
        self._set(inst, "unloaded")

    async def _wait_healthy(self, inst: Instance) -> None:
        deadline = time.monotonic() + self.load_timeout
        async with httpx.AsyncClient(timeout=5.0) as client:
            while time.monotonic() < deadline and inst.status == "loading":
                try:
                    if (await client.get(inst.url + self.health_path)).status_code == 200:
                        self._set(inst, "loaded")
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        if inst.status == "loading" and inst.proc is not None:
            log.error("instance name=%s did not become healthy in %.0f s", inst.name, self.load_timeout)
            inst.proc.kill()

    async def wait_loaded(self, name: str) -> None:
        """Until the model serves; RouterError when its child exits instead."""
        inst = self.instances[name]
        while inst.status != "loaded":
            if inst.status == "unloaded":
                raise RouterError(f"model '{name}' failed to load (exit code {inst.exit_code})"
                                  if inst.failed else f"model '{name}' was unloaded", 503, "unavailable_error")
            await inst.changed.wait()

    async def unload(self, name: str, wait: bool = False) -> None:
        inst = self.instances[name]
        if inst.proc is None:
            return
        inst.stopping = True
        proc = inst.proc
        if proc.stdin is not None:
            proc.stdin.close()  # the child's stdin watcher ends it
        try:
            proc.terminate()
        except ProcessLookupError:
            pass
        stop = asyncio.ensure_future(self._kill_after(proc, inst.entry.stop_timeout))
        self._tasks.add(stop)
        stop.add_done_callback(self._tasks.discard)
        if wait:
            await stop
            while inst.status != "unloaded":
                await inst.changed.wait()

    @staticmethod
    async def _kill_after(proc: asyncio.subprocess.Process, seconds: float) -> None:
        try:
            await asyncio.wait_for(proc.wait(), seconds)
        except asyncio.TimeoutError:
            log.warning("instance pid=%s did not stop in %.0f s; killing it", proc.pid, seconds)
            try:
                proc.kill()
            except ProcessLookupError:
                pass
            await proc.wait()

    async def close(self) -> None:
        for inst in list(self.instances.values()):
            if inst.proc is not None:
                await self.unload(inst.name, wait=True)
