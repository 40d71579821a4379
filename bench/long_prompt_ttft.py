"""Time to first token of a long conversation's next turn, against a running server.

    python bench/long_prompt_ttft.py --url http://127.0.0.1:8080 [--turns 40] [--next 8] [--name NAME]

The conversation is chat-templated text (``<|im_start|>`` turns of pseudo-English, ~3,000
characters a turn) sent to ``POST /completion`` (streamed, ``n_predict`` 1, greedy,
``cache_prompt`` on): first its history alone (the server's prompt cache then holds it), then
``--next`` times the conversation with one more short user turn than the time before. Each
such request's prompt is mostly what the server has cached: its time to the first token is the
request's parsing, tokenization of the whole text and the prefill of the new turn's tokens.
Printed: the median and each TTFT (client clock), the prompt and cached token counts and the
server's own prompt time (``timings``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_text, print_table  # noqa: E402
from sse_client import stream_completion  # noqa: E402


def conversation(turns: int) -> str:
    return "".join(f"<|im_start|>user\n{make_text(50 + t, 150)}<|im_end|>\n<|im_start|>assistant\n"
                   f"{make_text(90 + t, 250)}<|im_end|>\n" for t in range(turns))


async def run(args: argparse.Namespace) -> int:
    url = args.url.rstrip("/")
    text = conversation(args.turns)
    body = {"n_predict": 1, "temperature": 0, "stream": True, "cache_prompt": True}
    first = await stream_completion(url, {**body, "prompt": text})
    if first.error:
        print(f"error: {first.error}")
        return 1
    rows = []
    ttfts = []
    for i in range(args.next):
        text += f"<|im_start|>user\n{make_text(1000 + i, 30)}<|im_end|>\n<|im_start|>assistant\n"
        r = await stream_completion(url, {**body, "prompt": text})
        if r.error or r.t_first is None:
            print(f"error: {r.error}")
            return 1
        ttft = (r.t_first - r.t_send) * 1e3
        ttfts.append(ttft)
        rows.append([args.name, i + 1, len(text), r.prompt_n, r.cache_n, ttft])
        text += make_text(2000 + i, 20) + "<|im_end|>\n"  # the answer, as the next turn sends it
    print(f"{args.name}: {len(text):,} characters; TTFT median {statistics.median(ttfts):.1f} ms\n")
    print_table(["server", "turn", "characters", "prompt_n", "cache_n", "TTFT ms"], rows)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True)
    p.add_argument("--turns", type=int, default=40)
    p.add_argument("--next", type=int, default=8)
    p.add_argument("--name", default="server")
    return asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
