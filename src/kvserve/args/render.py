"""Text kvserve renders from the flag table: ``-h`` usage, ``--version`` and ``docs/compat.md``.

``main`` is the ``python -m kvserve.args --write-compat docs/compat.md`` entry point.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Sequence
from typing import Any

from kvserve import __version__

from .spec import COMPAT_BUILD, REFUSED_STATUS, WARNED_STATUS, ArgType, FlagSpec
from .status import REFUSED_VALUES, WARNED_VALUES
from .table import FLAGS

def format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "enabled" if value else "disabled"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, tuple):
        return ", ".join(format_value(v) for v in value) if value else "none"
    return str(value)


def shown_default(spec: FlagSpec) -> str:
    if spec.shown_default is not None:
        return spec.shown_default
    if spec.type is ArgType.VOID:
        return "off"
    if spec.default == "":
        return '""'
    return format_value(spec.default)


def version_text() -> str:
    return (f"version: kvserve {__version__} (compatible with llama-server {COMPAT_BUILD})\n"
            f"built with Python {platform.python_version()} for {sys.platform}-{platform.machine()}")


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for para in text.split("\n"):
        cur = ""
        for word in para.split(" "):
            if cur and len(cur) + 1 + len(word) > width:
                lines.append(cur)
                cur = word
            else:
                cur = f"{cur} {word}" if cur else word
        lines.append(cur)
    return lines


def usage_entry(spec: FlagSpec) -> str:
    """One option in llama.cpp's help layout: names at column 0, help from column 40."""
    names = list(spec.all_names)
    head = names[0] if len(names) == 1 else (names[0] + ", ").ljust(7) + ", ".join(names[1:])
    if spec.hint:
        head += " " + spec.hint
    parts = [spec.help]
    if spec.action is None:
        parts.append(f"(default: {shown_default(spec)})")
    if spec.envs:
        parts.append(f"(env: {', '.join(spec.envs)})")
    if spec.kvserve_only:
        parts.append("[kvserve only]")
    if spec.status == REFUSED_STATUS:
        parts.append(f"[not supported by kvserve: {spec.reason}]")
    elif spec.status == WARNED_STATUS:
        parts.append(f"[accepted, no effect in kvserve: {spec.reason}]")
    body = _wrap(" ".join(parts), 70)
    pad = " " * 40
    first = head + "\n" + pad if len(head) > 37 else head.ljust(40)
    return first + ("\n" + pad).join(body) + "\n"


def action_text(action: str) -> str:
    """What ``--cache-list``, ``--list-devices`` and ``--completion-bash`` print before exiting 0."""
    if action == "cache-list":
        return "number of models in cache: 0"  # kvserve never downloads, so it keeps no model cache
    if action == "list-devices":
        import torch

        lines = ["Available devices:", "  CPU: torch"]
        if torch.cuda.is_available():
            lines += [f"  CUDA{i}: {torch.cuda.get_device_name(i)}" for i in range(torch.cuda.device_count())]
        return "\n".join(lines)
    if action == "completion-bash":
        names = " ".join(n for s in FLAGS for n in s.all_names)
        reply = f'COMPREPLY=( $(compgen -W "{names}" -- "${{COMP_WORDS[COMP_CWORD]}}") )'
        return (f"_kvserve_completions() {{\n    {reply}\n}}\n"
                "complete -F _kvserve_completions kvserve llama-server\n")
    raise ValueError(action)


_SECTIONS = (("server", "server"), ("sampling", "sampling"), ("other llama.cpp", "other"),
             ("kvserve-only", "kvserve"))


def format_usage() -> str:
    sections = tuple((f"{title} params", group) for title, group in _SECTIONS)
    out = [f"usage: kvserve [options]   (llama-server {COMPAT_BUILD} compatible)\n"]
    for title, group in sections:
        out.append(f"\n----- {title} -----\n\n")
        out.extend(usage_entry(s) for s in FLAGS if s.group == group)
    return "".join(out)


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "\\n")


def _compat_row(spec: FlagSpec) -> str:
    flag = ", ".join(spec.names) + (f" {spec.hint}" if spec.hint else "")
    if spec.neg_names:
        flag += " / " + ", ".join(spec.neg_names)
    env = ", ".join(f"`{e}`" for e in spec.envs) or "-"
    notes = [spec.reason] if spec.status in (REFUSED_STATUS, WARNED_STATUS) else []
    for rules in (REFUSED_VALUES, WARNED_VALUES):
        rule = rules.get(spec.dest)
        if rule is not None:
            notes.append(rule.doc)
    if spec.notes:
        notes.append(spec.notes)
    default = shown_default(spec).replace("\n", "\\n")
    return (f"| `{_md(flag)}` | {env} | {_md(default)} | {spec.status} | "
            f"{_md('; '.join(notes)) or '-'} |")


_COMPAT_HEADER = f"""# kvserve command-line compatibility

Generated from the flag table in `src/kvserve/args/table.py` by
`python -m kvserve.args --write-compat docs/compat.md`; do not edit by hand.

kvserve takes llama-server's ({COMPAT_BUILD}) flags, `LLAMA_ARG_*` environment variables and
defaults, parsed with llama.cpp's rules:

- Environment variables are read first; command-line arguments override them, with
  `warn: <ENV> environment variable is set, but will be overwritten by command line argument <arg>`.
  Accumulating flags (`--api-key`, `--api-key-file`, `-a`, `--tags`, `-r`, `-l`,
  `--chat-template-kwargs`) keep the values from both, as llama-server does.
- Boolean env values: `on|enabled|true|1` / `off|disabled|false|0`; anything else is an error.
  For a flag pair, a set `LLAMA_ARG_NO_<NAME>` means false. A valueless flag's env var
  triggers it only when truthy.
- `--flag_name` equals `--flag-name`; `--flag=value` is not accepted (as in llama-server).
- Integers and floats parse like C++ `std::stoi` / `std::stof` (a leading number; the rest is ignored).
- An unknown flag prints `error: invalid argument: <arg>` and exits 1; a repeated flag logs a
  `DEPRECATED` warning and the last value wins.
- Config files, as llama-server reads them: `/etc/llama.cpp/config.ini`, then
  `${{XDG_CONFIG_HOME:-~/.config}}/llama.cpp/config.ini` (INI, see "Model presets" below for the
  grammar): the `[*]` section and the keys before any section apply first, under the environment
  and the command line; other sections are ignored, unknown keys warn, a valueless flag is set
  whatever its value (`metrics = 0` enables it, as in llama.cpp).

Every flag llama-server accepts starts kvserve. Where kvserve lacks the feature a flag enables
or tunes, the flag **warns**: it is accepted with one start-up line
`warn: <flag> is accepted but has no effect in kvserve: <reason>`, and a request that would use
the feature gets a 400 naming it. `/cors-proxy` with `--ui-mcp-proxy` or `-ag` is the MCP CORS
proxy, which forwards only the headers named `x-llama-server-proxy-header-NAME`. `--tools` (or
`-ag`) serves llama-server's built-in agent tools at `GET/POST /tools` (see "Agent tools" below),
MCP servers add theirs. Only a value that would silently change every answer (another
model, YaRN RoPE scaling, adapters applied to every request, control vectors) is **refused**: it
stops kvserve with `error: <flag> is not supported by kvserve: <reason>` and exit status 1.
Values at the default are always accepted. Some implemented flags warn about particular values
(noted below).

RoPE overrides: `--rope-freq-base`, `--rope-freq-scale`, `--rope-scale N` (a frequency scale
of 1/N) and `--rope-scaling none|linear` change the rotary embedding as llama.cpp's context
parameters do: 0 keeps the model's value, the GGUF's scaling factor applies unless the type is
`none` (which never scales), and sliding-window layers (Gemma 3) keep their own RoPE. YaRN
(`--rope-scaling yarn`, `--yarn-*`) is refused.

HTTPS: with `--ssl-key-file` and `--ssl-cert-file` (PEM files) every listening address serves
TLS (a router too; its children stay on plain HTTP on 127.0.0.1). A key or certificate that
does not load stops start-up; one of the two flags alone serves plain HTTP, as llama-server
does, with a warning.

Reranking (`--reranking`, which is `--embedding --pooling rank`): `/rerank`, `/reranking`,
`/v1/rerank` and `/v1/reranking` score each document on its own prompt (the model's
`tokenizer.chat_template.rerank` with `{{query}}`/`{{document}}`, else `[BOS] query [EOS] [SEP]
document [EOS]` as the vocabulary asks) as llama.cpp's rank pooling does for a causal model: the
last token's final-normed hidden state, through the GGUF's classifier head `cls.output` (Qwen3
rerankers, then a softmax) when there is one; without one (a chat model) the score is that
state's first component, as llama-server answers. Jina (`documents`) and TEI (`texts`,
`return_text`) formats, `top_n`, `usage`. A negative or non-integer `top_n` is a 400 (llama-server:
a 500, or all documents).

Router mode (kvserve started without `-m`, as llama-server): one child `kvserve` process per
loaded model, started with its model's options, the router's own flags (minus `--host`,
`--port`, `--api-key`, `--ssl-*`, the `--models-*` flags) and `--alias NAME` on a local port; it
ends with the router. Models are the GGUF files of `--models-dir` (`NAME.gguf`, or a directory
`NAME/`), the embedded SmolLM2 (source `embedded`) and the sections of `--models-preset FILE`.
Requests name their model (or one of its preset aliases) in `model` (body) or `?model=` (GET)
and are proxied, streams included; `--no-models-autoload` (or `?autoload=false`) answers 400
for a model not loaded. `GET /props` (router form), `GET /models` (`?reload=1` rescans the
directory and re-reads the preset file, stopping running models that changed or went),
`POST /models/load`, `POST /models/unload`, `GET /models/sse` (status events). kvserve never
downloads: `POST /models` is a 501 and `DELETE /models` removes nothing (no model comes from a
download cache). The router serves no web UI. As in llama-server, the router answers
`GET/POST /tools` (its `--tools` and MCP servers, found before it listens) and `/cors-proxy`
itself.

Model presets (`--models-preset FILE`, llama-server's INI format and rules): each `[NAME]`
section is a model whose keys are flags without dashes (any alias, `c` or `ctx-size`) or their
`LLAMA_ARG_*` names, `model = PATH` naming its GGUF; `[*]` applies to every model (models-dir
ones too); a section named like a models-dir model adds to it. The router's command line wins
over a section, a section over `[*]`; what the router owns (host, port, API keys, TLS,
`--models-*`) is never passed on, and the child's `--alias` is the section name (a preset's
`alias` and `tags` are the router's names for it). Preset-only keys: `load-on-startup`,
`stop-timeout` (seconds before an unloading child is killed, 10), `dedup-cache-models` (no
effect: there is no download cache). An unknown key, a line that is not INI, a missing file or
a name used twice stops start-up with llama-server's message. A section without a model file is
listed; loading it fails (llama-server would start a nested router).

Idle sleeping (`--sleep-idle-seconds N`): once no request has been in flight and no slot busy
for N seconds, the engine stops and its weights, KV pool, prompt cache and grammars are freed.
`/health`, `/props` (`is_sleeping: true`, the body taken on entering sleep), `/models` and
`/metrics` answer without waking it; any other API request (token counting included) waits
while the model is loaded again. llama-server's counters continue across a sleep (the
throughput window is reported once); the prompt cache starts empty, and its `kvserve:*`
counters restart.

Context checkpoints (`--ctx-checkpoints`, `--checkpoint-min-step`): llama-server snapshots the
KV state of SWA and recurrent layers so a later request can resume from a checkpoint. kvserve's
shared paged cache keeps the full KV of every layer for every cached token, so any cached prefix
can be resumed directly and checkpoints are not needed.

MCP servers (`--mcp-servers-config FILE`, `--mcp-servers-json JSON`, both Cursor's
`{{"mcpServers": {{NAME: {{"command", "args", "env", "cwd", "timeout_ms"}}}}}}`): as in llama-server,
each server is a child process speaking JSON-RPC over stdio. At start-up, before the server
listens, each one is spawned, asked for its tools (at most 10 s) and stopped; `GET /tools` lists
them as `NAME_TOOL` (type `mcp`, the server's `inputSchema` as the function's `parameters`)
after the built-in tools, and `POST /tools` `{{"tool", "params"}}` calls one in a process that is
kept for later calls (respawned when it died, 5 s before retrying one that could not start),
answering 200 with `{{"plain_text_response": TEXT}}` or `{{"error": MESSAGE}}` (an error reply, an
`isError` result, `timeout_ms` passed). Calls may run concurrently (replies are matched by id).
Stopping the server ends calls in flight (`{{"error": "cancelled"}}`) and each server's whole
process group. Invalid JSON or a config file that cannot be read stops start-up (exit 1); a
server that cannot start only loses its tools.
"""


def long_name(spec: FlagSpec) -> str:
    """The first ``--`` name (the one llama.cpp documents), else the first name."""
    return next((n for n in spec.names if n.startswith("--")), spec.names[0])


def render_compat() -> str:
    out = [_COMPAT_HEADER]
    sections = (("Server flags", "server"),
                ("Sampling flags (server defaults for request fields)", "sampling"),
                ("Other llama.cpp flags (backend, placement, speculative decoding, media, presets)", "other"),
                ("kvserve-only flags", "kvserve"))
    for title, group in sections:
        out.append(f"\n## {title}\n\n| Flag | Env | Default | Status | Reason / notes |\n"
                   "|---|---|---|---|---|\n")
        out.extend(_compat_row(s) + "\n" for s in FLAGS if s.group == group)
    refused = sorted({long_name(s) for s in FLAGS if s.status == REFUSED_STATUS})
    out.append(f"\n## Refused flags ({len(refused)})\n\n" + ", ".join(f"`{n}`" for n in refused) + "\n")
    warned = sorted({long_name(s) for s in FLAGS if s.status == WARNED_STATUS})
    out.append(f"\n## Flags accepted with a warning ({len(warned)})\n\n"
               + ", ".join(f"`{n}`" for n in warned) + "\n")
    from kvserve.server.unsupported import REFUSED_FIELDS  # the HTTP layer owns the field rules

    out.append(
        "\n## Request fields refused with 400\n\nEvery other request field of llama-server is "
        "implemented (or ignored by llama-server itself). These are answered with a 400 "
        "`invalid_request_error` naming the field:\n\n| field | reason (when) |\n| --- | --- |\n"
    )
    out.extend(f"| `{name}` | {why} |\n" for name, why in REFUSED_FIELDS)
    from kvserve.grammar.compat import COMPAT_SECTION

    out.append(COMPAT_SECTION)
    from kvserve.server.chat_parsing.compat import COMPAT_SECTION as CHAT_SECTION

    out.append(CHAT_SECTION)
    from kvserve.server.compat_apis import COMPAT_SECTION as APIS_SECTION

    out.append(APIS_SECTION)
    from kvserve.server.agent_tools.compat import COMPAT_SECTION as TOOLS_SECTION

    out.append(TOOLS_SECTION)
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) == 2 and argv[0] == "--write-compat":
        with open(argv[1], "w", encoding="utf-8") as f:
            f.write(render_compat())
        return 0
    if argv == ["--print-compat"]:
        sys.stdout.write(render_compat())
        return 0
    print("usage: python -m kvserve.args --write-compat PATH | --print-compat", file=sys.stderr)
    return 2
