"""``read_file``, ``write_file`` and ``edit_file``.

Contents travel as bytes (``ToolIO``) and reach JSON as UTF-8 text with invalid bytes replaced;
``edit_file`` round-trips a file's bytes it does not touch (``surrogateescape``).
"""

from __future__ import annotations

import base64
from typing import Any

from kvserve.server.agent_tools.edit import Edit, EditError, apply_edits
from kvserve.server.agent_tools.params import optional, required
from kvserve.server.agent_tools.registry import Emit, ToolParamError
from kvserve.server.agent_tools.tool_base import BuiltinTool, schema
from kvserve.server.jsonio import json_type

READ_MAX = 16 * 1024  # bytes of text answered (and file size without an end_line)
READ_MAX_BASE64 = 32 * 1024 * 1024


def text_of(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def bytes_of(text: str) -> bytes:
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a lone surrogate that does not stand for a byte
        return text.encode("utf-8", "replace")


def lines_of(raw: bytes) -> list[bytes]:
    """``std::getline`` lines: split on ``\\n``; a final newline does not start another line."""
    lines = raw.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


class ReadFile(BuiltinTool):
    name = "read_file"
    display_name = "Read file"
    description = (
        "Read the contents of a file. Optionally specify a 1-based line range. If append_loc is true, "
        'each line is prefixed with its line number (e.g. "1\u2192...").'
    )

    def parameters(self) -> dict[str, Any]:
        return schema(
            {
                "path": ("string", "Path to the file"),
                "start_line": ("integer", "First line to read, 1-based (default: 1)"),
                "end_line": ("integer", "Last line to read, 1-based inclusive (default: end of file)"),
                "append_loc": ("boolean", "Prefix each line with its line number"),
            },
            ["path"],
        )

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        path = required(params, "path", str)
        start_line = optional(params, "start_line", int, 1)
        end_line = optional(params, "end_line", int, -1)  # -1: to the end
        append_loc = optional(params, "append_loc", bool, False)
        as_base64 = params.get("resp_type") == "base64"  # the x-resp-type header; the model cannot ask
        io = self.io(params)
        size = io.file_size(path)
        if size is None:
            return {"error": f"cannot stat file: {path}"}
        if as_base64:
            if size > READ_MAX_BASE64:
                return {"error": f"file too large ({size} bytes, max {READ_MAX_BASE64})"}
            raw = io.read_file(path)
            if raw is None:
                return {"error": f"failed to open file: {path}"}
            return {"base64": base64.b64encode(raw).decode("ascii"), "size_bytes": len(raw)}
        if size > READ_MAX and end_line == -1:
            return {
                "error": f"file too large ({size} bytes, max {READ_MAX}). Use start_line/end_line to read a "
                "portion."
            }
        raw = io.read_file(path)
        if raw is None:
            return {"error": f"failed to open file: {path}"}
        out = bytearray()
        for lineno, line in enumerate(lines_of(raw), 1):
            if lineno < start_line:
                continue
            if end_line != -1 and lineno > end_line:
                break
            piece = (str(lineno).encode() + "\u2192".encode() if append_loc else b"") + line + b"\n"
            if len(out) + len(piece) > READ_MAX:
                out += b"[output truncated]"
                break
            out += piece
        return {"plain_text_response": text_of(bytes(out))}


class WriteFile(BuiltinTool):
    name = "write_file"
    display_name = "Write file"
    permission_write = True
    description = (
        "Write content to a file, creating it (including parent directories) if it does not exist. "
        "May use with edit_file for more complex edits."
    )

    def parameters(self) -> dict[str, Any]:
        return schema(
            {"path": ("string", "Path of the file to write"), "content": ("string", "Content to write")},
            ["path", "content"],
        )

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        path = required(params, "path", str)
        content = bytes_of(required(params, "content", str))
        if not self.io(params).write_file(path, content):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file written successfully", "path": path, "bytes": len(content)}


class EditFile(BuiltinTool):
    name = "edit_file"
    display_name = "Edit file"
    permission_write = True
    description = (
        "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file and "
        "is matched against the original content, not incrementally. Merge nearby changes into one edit "
        "instead of overlapping edits. Use write_file to replace the whole file."
    )

    def parameters(self) -> dict[str, Any]:
        item = schema(
            {
                "old_text": (
                    "string",
                    "Exact text to find; must be unique in the file and must not overlap with other edits",
                ),
                "new_text": ("string", "Text to replace old_text with"),
            },
            ["old_text", "new_text"],
        )
        return {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "Path to the file to edit"},
                "edits": {
                    "type": "array",
                    "description": "One or more exact text replacements to apply",
                    "items": item,
                },
            },
            "required": ["path", "edits"],
        }

    def invoke(self, params: dict[str, Any], emit: Emit | None) -> Any:
        path = required(params, "path", str)
        if "edits" not in params:
            raise ToolParamError("[json.exception.out_of_range.403] key 'edits' not found")
        raw_edits = params["edits"]
        if not isinstance(raw_edits, list) or not raw_edits:
            return {"error": '"edits" must be a non-empty array'}
        edits: list[Edit] = []
        for e in raw_edits:
            if not isinstance(e, dict):
                raise ToolParamError(f"[json.exception.type_error.304] cannot use at() with {json_type(e)}")
            edit = Edit(required(e, "old_text", str), required(e, "new_text", str))
            if not edit.old_text:
                return {"error": f"edits[{len(edits)}].old_text must not be empty"}
            edits.append(edit)
        io = self.io(params)
        raw = io.read_file(path)
        if raw is None:
            return {"error": f"failed to open file: {path}"}
        try:
            new, n = apply_edits(raw.decode("utf-8", "surrogateescape"), edits, path)
        except EditError as err:
            return {"error": str(err)}
        if not io.write_file(path, bytes_of(new)):
            return {"error": f"failed to write file: {path}"}
        return {"result": "file edited successfully", "path": path, "edits_applied": n}
