"""Record llama-server's built-in (non-Jinja) chat formats into tests/golden/chat-formats.json.

For every built-in name (``--no-jinja --chat-template NAME``) and every template file of llama.cpp's
``models/templates`` (``--no-jinja --chat-template-file F``: format detection), the prompts that
``/apply-template`` renders for two conversations, or ``null`` when llama-server refuses to start.

usage: python scripts/record_chat_formats.py LLAMA_SERVER MODEL.gguf LLAMA_CPP_SRC [OUT.json]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from recording import post_json, serving

CHATS = [
    [
        {"role": "system", "content": "You are a helpful assistant"},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "  Hi there  "},
        {"role": "user", "content": "Who are you"},
    ],
    [
        {"role": "user", "content": " Hello "},
        {"role": "assistant", "content": "Hi"},
        {"role": "tool", "content": "42"},
        {"role": "user", "content": "Again"},
    ],
]


def record(server: str, model: str, args: list[str]) -> list[str] | None:
    with serving([server, "-m", model, "-np", "1", "-c", "256", "--no-jinja", *args], wait_s=20) as url:
        if url is None:
            return None
        return [post_json(f"{url}/apply-template", {"messages": c}, timeout=30)["prompt"] for c in CHATS]


def main() -> None:
    server, model, src = sys.argv[1:4]
    out = Path(sys.argv[4] if len(sys.argv) > 4 else "tests/golden/chat-formats.json")
    help_text = subprocess.run([server, "--help"], capture_output=True, text=True).stdout
    lines = help_text.split("list of built-in templates:\n", 1)[1].splitlines()
    listed = lines[0].strip()
    for line in lines[1:]:
        if not listed.endswith(","):
            break
        listed += " " + line.strip()
    cases = [
        {"name": n, "prompts": record(server, model, ["--chat-template", n])}
        for n in (x.strip() for x in listed.split(","))
    ]
    for path in sorted((Path(src) / "models" / "templates").glob("*.jinja")):
        cases.append(
            {
                "file": path.name,
                "template": path.read_text(),
                "prompts": record(server, model, ["--chat-template-file", str(path)]),
            }
        )
    doc = {
        "recorded_with": "llama-server --no-jinja (see scripts/record_chat_formats.py)",
        "chats": CHATS,
        "cases": cases,
    }
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases -> {out}")


if __name__ == "__main__":
    main()
