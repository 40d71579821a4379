"""One MCP server process: JSON-RPC 2.0 as newline-delimited JSON over its stdin/stdout (asyncio).

::

    request() --write--> stdin  (one JSON object per line)
    request() <--future-- _pending[id] <--_read_stdout-- stdout   (replies matched by id)
                                  stderr --_read_stderr--> debug log + a bounded tail

- Several requests may be in flight at once; each reply is matched to its request by id (ids
  count up from 1 per process). A reply whose request already timed out is dropped.
- Lines without an id or with a ``method`` come from the server: notifications are dropped,
  a request gets an answer (``ping`` an empty result, anything else "method not found").
  A line that is not JSON is skipped; one longer than ``MAX_LINE`` bytes is dropped.
- The child runs in a session (process group) of its own. ``close()`` never waits for EOF on
  the pipes (a grandchild that inherited them may hold them open): it ends stdin, gives the
  child a moment, then SIGTERM and SIGKILL to the whole group, and closes our pipe ends.
- ``alive`` is false once stdout reached EOF, the child exited or ``close()`` ran; a dead
  transport fails its pending and future requests with "transport closed".

The official MCP SDK's stdio client ties a session to one ``async with`` scope and waits
seconds for a child to exit on close; a server that keeps one long-lived process per MCP server
and must stop promptly needs neither, and this protocol subset (three methods) is small.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import time
from typing import Any

from kvserve.mcp.config import McpServerConfig

log = logging.getLogger("kvserve.mcp")

MAX_LINE = 8 * 1024 * 1024  # bytes in one JSON-RPC line
ERR_TAIL = 4096  # bytes of the child's stderr kept for diagnostics
EXIT_GRACE_S = 0.2  # after stdin is closed, before SIGTERM
TERM_GRACE_S = 0.3  # after SIGTERM, before SIGKILL


class RpcError(Exception):
    """A request that got no result: an error reply, a timeout or a closed transport."""

    def __init__(self, message: str, code: int = -32603) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class _PipeWriter(asyncio.BaseProtocol):
    """Flow control for the child's stdin: ``writable`` is set while the pipe takes data."""

    def __init__(self) -> None:
        self.writable = asyncio.Event()
        self.writable.set()
        self.lost = False

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.writable.set()


def _child_env(overrides: dict[str, str]) -> dict[str, str] | None:
    return {**os.environ, **overrides} if overrides else None


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", "unknown error"))
    if isinstance(error, str):
        return error
    return "unknown error"


class StdioTransport:
    def __init__(self, cfg: McpServerConfig) -> None:
        self.cfg = cfg
        self.name = cfg.name
        self._popen: subprocess.Popen[bytes] | None = None
        self._stdin: asyncio.WriteTransport | None = None
        self._stdin_proto: _PipeWriter | None = None
        self._pipes: list[asyncio.BaseTransport] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 1
        self._write_lock = asyncio.Lock()
        self._eof = False
        self._closed = False
        self._err_tail = b""

    # --- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn the child (raises ``OSError``, or ``ValueError`` for a NUL in an argument)."""
        loop = asyncio.get_running_loop()
        self._popen = subprocess.Popen(
            [self.cfg.command, *self.cfg.args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env=_child_env(dict(self.cfg.env)), cwd=self.cfg.cwd,
            start_new_session=True, close_fds=True,
        )
        assert self._popen.stdin and self._popen.stdout and self._popen.stderr
        out = asyncio.StreamReader(limit=MAX_LINE)
        err = asyncio.StreamReader(limit=MAX_LINE)
        t_out, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(out), self._popen.stdout)
        t_err, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(err), self._popen.stderr)
        self._stdin, self._stdin_proto = await loop.connect_write_pipe(_PipeWriter, self._popen.stdin)
        self._pipes = [self._stdin, t_out, t_err]
        self._tasks = [loop.create_task(self._read_stdout(out)), loop.create_task(self._read_stderr(err))]
        log.debug("MCP '%s': started pid %d", self.name, self._popen.pid)

    @property
    def alive(self) -> bool:
        return (self._popen is not None and not self._closed and not self._eof
                and self._popen.poll() is None)

    def diagnostics(self) -> str:
        parts = []
        if self._popen is not None and self._popen.returncode is not None:
            parts.append(f"exit status {self._popen.returncode}")
        if self._err_tail:
            parts.append("last stderr: " + self._err_tail.decode("utf-8", "replace").strip())
        return "; ".join(parts) or "no diagnostics"

    async def close(self, reason: str = "transport closed") -> None:
        """Fail pending requests with ``reason``, stop the child's process group, release the
        pipes. Idempotent; never waits on EOF."""
        if self._closed:
            return
        self._closed = True
        self._fail_pending(reason)
        popen = self._popen
        if self._stdin is not None:
            self._stdin.close()  # EOF on the child's stdin: a well-behaved server exits
        if popen is not None:
            if not await self._exited(popen, EXIT_GRACE_S):
                self._signal_group(popen, signal.SIGTERM)
                if not await self._exited(popen, TERM_GRACE_S):
                    self._signal_group(popen, signal.SIGKILL)
                    if not await self._exited(popen, 1.0):
                        log.warning("MCP '%s': pid %d did not exit", self.name, popen.pid)
            self._signal_group(popen, signal.SIGKILL)  # what it left behind, holding our pipes
        for pipe in self._pipes:
            pipe.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    @staticmethod
    async def _exited(popen: subprocess.Popen[bytes], within_s: float) -> bool:
        deadline = time.monotonic() + within_s
        while popen.poll() is None:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.01)
        return True

    @staticmethod
    def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(popen.pid, sig)  # the child leads its own session: pgid == pid
        except (ProcessLookupError, PermissionError):
            pass

    def _fail_pending(self, reason: str) -> None:
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(RpcError(reason))
        self._pending.clear()

    # --- requests ---------------------------------------------------------------------------

    async def request(self, method: str, params: Any, timeout_s: float) -> Any:
        """The ``result`` of one JSON-RPC request (raises ``RpcError``)."""
        if not self.alive:
            raise RpcError("transport closed")
        req_id = self._next_id
        self._next_id += 1
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[req_id] = fut
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": req_id, "method": method}
        if params is not None:
            msg["params"] = params
        try:
            async with asyncio.timeout(max(0.0, timeout_s)):
                await self._write(msg)
                reply = await fut
        except TimeoutError:
            raise RpcError("request timed out") from None
        finally:
            self._pending.pop(req_id, None)
        if "error" in reply:
            raise RpcError(_error_message(reply["error"]))
        if "result" not in reply:
            raise RpcError("invalid response from MCP server")
        return reply["result"]

    async def notify(self, method: str, params: Any = None) -> None:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            msg["params"] = params
        await self._write(msg)

    async def _write(self, msg: dict[str, Any]) -> None:
        data = json.dumps(msg, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._write_lock:
            if self._stdin is None or self._stdin_proto is None or self._stdin_proto.lost or not self.alive:
                raise RpcError("transport closed")
            self._stdin.write(data)
            await self._stdin_proto.writable.wait()  # back-pressure: the child reads slowly
            if self._stdin_proto.lost:
                raise RpcError("transport closed")

    # --- pumps ------------------------------------------------------------------------------

    async def _read_stdout(self, out: asyncio.StreamReader) -> None:
        try:
            while True:
                try:
                    line = await out.readline()
                except ValueError:  # over MAX_LINE: asyncio dropped it; its rest parses as junk
                    log.warning("MCP '%s': dropping a line over %d bytes", self.name, MAX_LINE)
                    continue
                if not line:
                    break
                await self._dispatch(line)
        finally:
            self._eof = True
            self._fail_pending("transport closed")

    async def _dispatch(self, line: bytes) -> None:
        line = line.strip()
        if not line:
            return
        try:
            msg = json.loads(line)
        except ValueError:
            log.debug("MCP '%s': skipping a line that is not JSON", self.name)
            return
        if not isinstance(msg, dict):
            return
        if "method" in msg:  # from the server: a notification, or a request for us
            if "id" in msg:
                await self._answer(msg)
            return
        req_id = msg.get("id")
        fut = self._pending.pop(req_id, None) if isinstance(req_id, int) else None
        if fut is None:
            log.debug("MCP '%s': dropping a reply with no waiting request (id %r)", self.name, req_id)
        elif not fut.done():
            fut.set_result(msg)

    async def _answer(self, msg: dict[str, Any]) -> None:
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": msg["id"]}
        if msg["method"] == "ping":
            reply["result"] = {}
        else:
            reply["error"] = {"code": -32601, "message": f"Method not found: {msg['method']}"}
        try:
            await self._write(reply)
        except RpcError:
            pass

    async def _read_stderr(self, err: asyncio.StreamReader) -> None:
        while True:
            chunk = await err.read(4096)
            if not chunk:
                return
            self._err_tail = (self._err_tail + chunk)[-ERR_TAIL:]
            if log.isEnabledFor(logging.DEBUG):
                for text in chunk.decode("utf-8", "replace").splitlines():
                    log.debug("MCP '%s' stderr: %s", self.name, text)
