"""The agent-tools section of docs/compat.md (rendered by ``kvserve.args.render``)."""

from __future__ import annotations

COMPAT_SECTION = """
## Agent tools (`--tools`, `GET/POST /tools`)

`--tools all` (or a comma list; `-ag` enables all) serves llama-server's built-in tools:
`read_file`, `file_glob_search`, `grep_search`, `exec_shell_command`, `write_file`, `edit_file`,
`get_info`. `GET /tools` lists them with llama-server's exact JSON (names, display names,
permissions, `uses_cwd`, the function schemas). `POST /tools` takes `{"tool", "params", "stream"}`
and answers the tool's JSON; a tool-level failure is `{"error": ...}` with 200, as in llama-server.
Without `--tools` (and no MCP servers) both answer 403 `feature_disabled`; with `--tools`, CORS
origins default to `localhost` unless `--cors-origins` is given. Do not enable them on an untrusted
network: `exec_shell_command` runs any command.

- Headers, not params, choose where a call runs: `x-tool-cwd` (relative paths and commands resolve
  there; a `cwd` param is dropped), `x-tool-runtime` (`docker-container:ID`, `podman-container:ID`,
  `ssh:TARGET`; else `--tools-runtime`), `x-resp-type: base64` (`read_file` answers
  `{"base64", "size_bytes"}`). An unknown runtime scheme, an id or ssh target that could be read as
  an option (leading `-`, characters outside `[A-Za-z0-9._-]`, `@` for ssh) or a `docker:IMAGE`
  header is a 500 with the reason; nothing then runs on the host.
- `--tools-runtime docker:IMAGE` / `podman:IMAGE` spawns `<engine> run --rm -i IMAGE sh` at start-up
  (respawned if it dies) and ends it at shutdown; other specs are validated at start-up. An unusable
  spec or an unknown tool name stops start-up with `tools setup failed: ...`.
- `exec_shell_command` with `"stream": true` sends `data: {"chunk": ...}` events, then
  `data: {"done": true}` (with `"error"` when the call failed); a client that disconnects stops the
  command at its next output. Timeouts (default 10 s, max 60) kill the command's whole process group.
- `edit_file`, `file_glob_search` (`type`, `max_depth`, `limit`, junk directories listed but not
  walked, `git ls-files` inside a work tree) and `grep_search` follow llama-server's rules and
  messages; `grep_search` patterns are Python regular expressions (llama-server: ECMAScript), which
  agree on the common syntax.
- Differences: a malformed body or parameter is a 400 with nlohmann's message, as in llama-server,
  but an optional parameter of the wrong type is a 400 too (llama-server logs a warning and uses the
  default); an unknown tool is a 404 naming it (llama-server: `File Not Found`).
"""
