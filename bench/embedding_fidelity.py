"""How far each kvserve weight path's embeddings are from the f32 reference, beside llama-server's.

One text, mean-pooled and normalized embeddings (``--embeddings --pooling mean -np 1 -c 1024``),
from the real llama-server and from kvserve with its weights fully dequantized (``--dtype f32``,
the reference), on the native block kernels (``KVSERVE_NATIVE=1``) and on torch's int4 layout
(``KVSERVE_NATIVE=0``), all on the same GGUF file. Prints each vector's relative L2 distance
from the f32 reference and from llama-server's: a path whose error against f32 is the size of
llama-server's own is as faithful as llama.cpp's arithmetic.

    python bench/embedding_fidelity.py --llama-server /path/to/llama-server [--model PATH ...]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import httpx  # noqa: E402
import torch  # noqa: E402
from common import ServerProcess, default_models, print_conditions, print_table  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog. Paris is the capital of France, and it is known "
        "for the Eiffel tower and many museums.")
FLAGS = "--embeddings --pooling mean -np 1 -c 1024"


def embed(cmd: str, env: dict[str, str] | None = None) -> torch.Tensor:
    with ServerProcess(cmd, env=env) as srv:
        srv.wait_ready()
        r = httpx.post(srv.url + "/v1/embeddings", json={"input": TEXT}, timeout=120)
        r.raise_for_status()
        return torch.tensor(r.json()["data"][0]["embedding"], dtype=torch.float64)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--model", action="append")
    args = ap.parse_args()
    models = args.model or default_models()
    print_conditions("embedding fidelity", {"models": models, "flags": FLAGS, "text chars": len(TEXT)})
    rows = []
    for model in models:
        ref = embed(f"{args.llama_server} -m {model} {FLAGS}")
        kv = f"python -m kvserve -m {model} {FLAGS}"
        f32 = embed(f"{kv} --dtype f32")
        paths = {"kvserve --dtype f32": f32, "llama-server": ref,
                 "kvserve native": embed(kv, {"KVSERVE_NATIVE": "1"}),
                 "kvserve int4": embed(kv, {"KVSERVE_NATIVE": "0"})}
        for name, v in paths.items():
            rows.append([os.path.basename(model), name, f"{100 * rel(v, f32):.2f}", f"{100 * rel(v, ref):.2f}"])
    print_table(["model", "server / weight path", "rel. L2 vs kvserve f32 %", "rel. L2 vs llama-server %"], rows)


if __name__ == "__main__":
    main()
