"""Record llama-server's next-token probabilities under RoPE overrides into tests/golden/rope-overrides.json.

For each model and each override (``--rope-freq-base``, ``--rope-scale``, ``--rope-freq-scale``,
``--rope-scaling``), llama-server is started as ``llama-server -m MODEL -np 1 -c 1024 ARGS`` and
asked for ``/completion`` of one prompt with ``n_predict`` 4, temperature 0 and ``n_probs`` 10; the
file keeps each case's arguments, the generated token ids and each step's top-10 log-probabilities.

usage: python scripts/record_rope_overrides.py LLAMA_SERVER SMOLLM2.gguf GEMMA3.gguf [OUT.json]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from recording import post_json, serving

PROMPT = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg "
          "combined movable metal type, oil-based ink and a wooden screw press. Within fifty years "
          "printing shops had spread to more than two hundred cities across Europe, and the price of "
          "books fell sharply. Scholars could now compare identical copies of a text, which changed how")
CASES: dict[str, list[str]] = {
    "model": [],
    "freq-base-10000": ["--rope-freq-base", "10000"],
    "rope-scale-2": ["--rope-scale", "2"],
    "freq-scale-0.75-linear": ["--rope-scaling", "linear", "--rope-freq-scale", "0.75"],
    "none-never-scales": ["--rope-scaling", "none", "--rope-freq-scale", "0.5"],
}
GEMMA_CASES = ("model", "freq-base-10000", "rope-scale-2")


def record(server: str, model: str, args: list[str]) -> dict:
    with serving([server, "-m", model, "-np", "1", "-c", "1024", *args]) as url:
        assert url is not None, f"{server} refused {args}"
        body = post_json(f"{url}/completion", {
            "prompt": PROMPT, "n_predict": 4, "temperature": 0, "n_probs": 10, "cache_prompt": False},
            timeout=120)
    steps = [[[t["id"], t["logprob"]] for t in p["top_logprobs"]] for p in body["completion_probabilities"]]
    return {"args": args, "tokens": [p["id"] for p in body["completion_probabilities"]], "top_logprobs": steps}


def main() -> None:
    server, smollm, gemma = sys.argv[1:4]
    out = Path(sys.argv[4] if len(sys.argv) > 4 else "tests/golden/rope-overrides.json")
    data = {"prompt": PROMPT, "n_predict": 4, "n_probs": 10,
            "smollm2": {name: record(server, smollm, args) for name, args in CASES.items()},
            "gemma3": {name: record(server, gemma, CASES[name]) for name in GEMMA_CASES}}
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
