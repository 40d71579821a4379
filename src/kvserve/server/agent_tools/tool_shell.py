"""``exec_shell_command`` (streams its output with ``"stream": true``) and ``get_info``."""

from __future__ import annotations

import os
from typing import Any

from kvserve.server.agent_tools.params import optional, required
from kvserve.server.agent_tools.registry import Emit
from kvserve.server.agent_tools.tool_base import BuiltinTool, schema

EXEC_MAX_OUTPUT = 16 * 1024
EXEC_MAX_TIMEOUT_S = 60
INFO_MAX_OUTPUT = 4096
INFO_TIMEOUT_S = 5


class ExecShellCommand(BuiltinTool):
    name = "exec_shell_command"
    display_name = "Execute shell command"
    permission_write = True
    supports_stream = True
    description = "Execute a shell command and return its output (stdout and stderr combined)."

    def parameters(self) -> dict[str, Any]:
        return schema(
            {
                "command": ("string", "Shell command to execute"),
                "timeout": ("integer", f"Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT_S})"),
                "max_output_size": ("integer", f"Maximum output size in bytes (default {EXEC_MAX_OUTPUT})"),
            },
            ["command"],
        )

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        command = required(params, "command", str)
        timeout = min(optional(params, "timeout", int, 10), EXEC_MAX_TIMEOUT_S)
        max_output = optional(params, "max_output_size", int, EXEC_MAX_OUTPUT)
        # llama-server casts to size_t: a negative size wraps to a huge one, then the cap applies
        max_output = EXEC_MAX_OUTPUT if max_output < 0 else min(max_output, EXEC_MAX_OUTPUT)
        io = self.io(params)
        args = ["sh", "-c", command]
        if emit is not None:
            alive = [True]

            def on_chunk(chunk: str) -> bool:
                alive[0] = emit(chunk)
                return alive[0]

            res = io.run(args, max_output, timeout, on_chunk)
            if alive[0]:
                emit(
                    f"\n[exit code: {res.exit_code}]" + (" [exit due to timed out]" if res.timed_out else "")
                )
            return None
        res = io.run(args, max_output, timeout)
        text = (
            res.output
            + f"\n[exit code: {res.exit_code}]"
            + (" [exit due to timed out]" if res.timed_out else "")
        )
        return {"plain_text_response": text}


class GetInfo(BuiltinTool):
    name = "get_info"
    display_name = "Get Runtime Info"
    description = "Returns runtime info: the OS name/version and the current working directory"

    def parameters(self) -> dict[str, Any]:
        return schema({})

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        io = self.io(params)
        res = io.run(["uname", "-a"], INFO_MAX_OUTPUT, INFO_TIMEOUT_S)
        os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
        cwd = str(params.get("cwd") or "")
        if not cwd:
            if not params.get("runtime"):
                cwd = os.getcwd()
            else:
                pwd = io.run(["pwd"], INFO_MAX_OUTPUT, INFO_TIMEOUT_S)
                cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
        return {"os": os_info, "cwd": cwd}
