"""A small MCP server over stdio (newline-delimited JSON-RPC 2.0) for the MCP client's tests.

usage: fake_mcp_server.py [--no-tools] [--notify] [--burst] [--junk] [--grandchild] [--ping]
                          [--stderr-kib N]

Tools: ``echo`` (message), ``add`` (a, b), ``fail_once`` (an error reply the first time in
this process), ``bad`` (an ``isError`` result), ``sleep`` (seconds), ``crash`` (exits without
replying), ``where`` (the cwd and $FAKE_MCP_VAR). ``--notify`` writes a progress notification
before each call's reply, ``--burst`` writes notification and reply in one write(), ``--junk``
writes a line that is not JSON first, ``--grandchild`` leaves a child that inherits the stdio
pipes and sleeps, ``--ping`` asks the client for a ``ping`` before answering a call (and
answers with the ping's reply), ``--stderr-kib N`` writes N KiB to stderr before each reply.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

FLAGS = set(sys.argv[1:])
STDERR_KIB = int(sys.argv[sys.argv.index("--stderr-kib") + 1]) if "--stderr-kib" in sys.argv else 0
SCHEMA = {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
TOOLS = [{"name": n, "description": f"the {n} tool", "inputSchema": SCHEMA}
         for n in ("echo", "add", "fail_once", "bad", "sleep", "crash", "where")]
state = {"failed": False}


def send(*msgs: dict) -> None:
    os.write(1, b"".join(json.dumps(m).encode() + b"\n" for m in msgs))


def text(req_id: int, s: str, is_error: bool = False) -> dict:
    result: dict = {"content": [{"type": "text", "text": s}]}
    if is_error:
        result["isError"] = True
    return {"jsonrpc": "2.0", "id": req_id, "result": result}


def call(req_id: int, name: str, args: dict) -> dict | None:
    if name == "echo":
        return text(req_id, f"echo: {args.get('message', '')}")
    if name == "add":
        return text(req_id, str(args.get("a", 0) + args.get("b", 0)))
    if name == "fail_once" and not state["failed"]:
        state["failed"] = True
        return {"jsonrpc": "2.0", "id": req_id, "error": {"code": -32000, "message": "transient error"}}
    if name == "fail_once":
        return text(req_id, "ok")
    if name == "bad":
        return text(req_id, "it went wrong", is_error=True)
    if name == "sleep":
        time.sleep(float(args.get("seconds", 1)))
        return text(req_id, "slept")
    if name == "crash":
        os._exit(3)
    if name == "where":
        return text(req_id, f"{os.getcwd()}|{os.environ.get('FAKE_MCP_VAR', '')}")
    return {"jsonrpc": "2.0", "id": req_id, "error": {"code": -32602, "message": f"Unknown tool: {name}"}}


def main() -> None:
    if "--grandchild" in FLAGS:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    for line in sys.stdin:
        try:
            req = json.loads(line)
        except ValueError:
            continue
        method, req_id, params = req.get("method"), req.get("id"), req.get("params") or {}
        if req_id is None or method is None:
            continue  # a notification, or a reply to our ping (read where it is awaited)
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": req_id, "result": {
                "protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                "serverInfo": {"name": "fake", "version": "1"}}})
        elif method == "tools/list":
            tools = [] if "--no-tools" in FLAGS else TOOLS
            send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": tools}})
        elif method == "tools/call":
            reply = call(req_id, params.get("name", ""), params.get("arguments") or {})
            if "--ping" in FLAGS:
                send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
                pong = json.loads(sys.stdin.readline())
                reply = text(req_id, "pong " + json.dumps(pong, sort_keys=True))
            if STDERR_KIB:
                os.write(2, (b"e" * 1023 + b"\n") * STDERR_KIB)
            notif = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
            if "--junk" in FLAGS:
                os.write(1, b"THIS IS NOT JSON\n")
            if "--burst" in FLAGS:
                send(notif, reply)
            else:
                if "--notify" in FLAGS:
                    send(notif)
                send(reply)
        else:
            send({"jsonrpc": "2.0", "id": req_id, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
