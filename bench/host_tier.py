"""The host tier of the prompt cache: time to first token of a prompt whose KV the device pool
evicted, brought back from host memory (host tier on) or recomputed (off), beside the cold and
the device-resident hit, through the real engine (scheduler, cache, runner) on one thread.

Scenario per mode, one slot, a pool with room for one prompt and a little more: prompt A
(cold), prompt B (same length, no common prefix: A's pages are evicted — to the host with the
tier on), A again (the measured hit), A once more (now resident on the device). One token is
generated per request, so the time is the prefill step(s) plus one sample.

    python bench/host_tier.py --synth SHAPE --prompt 4096 [--device cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_conditions, print_table  # noqa: E402
from engine import synth_path  # noqa: E402

from kvserve.engine.engine import Engine, EngineOptions  # noqa: E402
from kvserve.engine.request import CacheIdentity, GenerationRequest, RequestParams, TokenEvent  # noqa: E402
from kvserve.engine.sampling_params import SamplingParams  # noqa: E402
from kvserve.model.chat_template import ChatTemplate  # noqa: E402
from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.tokenizer import Tokenizer  # noqa: E402


def ttft(eng: Engine, tokens: list[int]) -> tuple[float, int]:
    """Seconds from submit to the first token event, and the request's cache_n."""
    events: list = []
    rid = eng.new_request_id()
    req = GenerationRequest(rid, list(tokens), RequestParams(n_predict=1, sampling=SamplingParams(temperature=0.0)),
                            CacheIdentity())
    t0 = time.perf_counter()
    eng.submit(req, events.append)
    t_first = None
    while True:
        eng._drain(block=False)
        eng.step()
        if t_first is None and any(isinstance(e, TokenEvent) for e in events):
            t_first = time.perf_counter() - t0
        final = [e for e in events if hasattr(e, "n_cached")]
        if final:
            return (t_first if t_first is not None else time.perf_counter() - t0), final[0].n_cached


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--synth", default="tiny", help="random-weight model shape (bench/engine.py's SHAPES or a spec)")
    p.add_argument("--synth-dir", default=os.environ.get("KVSERVE_SYNTH_DIR", "/tmp/kvserve-synth"))
    p.add_argument("--prompt", type=int, default=4096, help="prompt tokens")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    dev = torch.device(args.device)
    path = synth_path(args.synth, "F16", args.synth_dir)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32  # the CLI's defaults
    loaded = load_gguf(path, dtype=dtype, device=dev)
    tok, tpl = Tokenizer.from_metadata(loaded.metadata), ChatTemplate.from_metadata(loaded.metadata)
    n_vocab = loaded.cfg.n_vocab
    print_conditions("prompt cache host tier: TTFT of a prompt evicted from the device pool", {
        "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "model": args.synth,
        "dtype (weights, KV)": str(dtype).replace("torch.", ""),
        "prompt": f"{args.prompt} tokens, one slot, pool of {args.prompt + 64} positions, --cache-ram 4096",
        "timing": f"wall time, submit to first token, median of {args.reps} rounds (each A, B, A, A)",
    })
    rows = []
    for mode in (True, False):
        eng = Engine(loaded, tok, tpl, EngineOptions(n_slots=1, n_ctx=args.prompt + 64, cache_ram_mib=4096,
                                                     host_tier=mode, n_batch=args.prompt, n_ubatch=512))
        times: dict[str, list[float]] = {"cold": [], "B": [], "hit after eviction": [], "device hit": []}
        cached = {}
        for r in range(args.reps + 1):  # round 0 warms up
            g = torch.Generator().manual_seed(100 + r)
            a = torch.randint(0, n_vocab, (args.prompt,), generator=g).tolist()
            b = torch.randint(0, n_vocab, (args.prompt,), generator=g).tolist()
            for name, toks in (("cold", a), ("B", b), ("hit after eviction", a), ("device hit", a)):
                t, n_cached = ttft(eng, toks)
                if r:
                    times[name].append(t)
                    cached[name] = n_cached
        st = eng.cache.stats()
        label = "host tier on" if eng.cache.host is not None else "host tier off"
        for name, ts in times.items():
            rows.append([label, name, cached[name], statistics.median(ts) * 1e3])
        mib = st.loaded_pages * eng.page_bytes / 2**20
        print(f"{label}: pages offloaded {st.offloaded_pages}, loaded {st.loaded_pages} ({mib:.0f} MiB), "
              f"host evictions {st.host_evictions}")
        del eng
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print_table(["mode", "request", "cache_n", "TTFT ms (median)"], rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
