"""Teacher-forced logit traces: the same token sequences under many execution conditions,
compared position by position with a cold, single-plan computation.

No sampling: every condition feeds the same fixed token ids and asks for logits "all" on the
positions it computes. Conditions:

    cold                  reference: the whole prompt in one plan, fresh pages
    prefix_hit_full       a cached entry is reused entirely: (a) the same prompt was cached
                          (hit n-1, only the last token runs), (b) the cache held a prefix ending
                          mid-page (copy-on-write of that page), (c) a running sequence published
                          its full pages and the new one shares them while it runs
    prefix_hit_partial    the cached entry continues with other tokens; the hit ends mid-page
                          inside it (copy-on-write of a page that also holds foreign rows)
    kv_shift_reuse        --cache-reuse: the cached entry had extra text before a chunk; the
                          chunk is moved left (rope-shifted) into place.  Approximate by design
                          (its KV attended to the removed text): reported, never gated
    batch_W               W sequences in every plan: the prompt's prefill, then its last tokens
                          one per step, mixed with other sequences prefilling and decoding
    chunk_C               the prompt in successive plans of C tokens
    ubatch_U              one plan split by the runner into micro-batches of U tokens, the
                          split falling inside the prompt
    quant_vs_f32          (--vs-f32) the model's weights as loaded (by default kept quantized)
                          against every weight dequantized to float32: cold against cold.
                          Different arithmetic by design: reported, never gated

For the positions a condition computes it reports max |Δlogit| against cold and the number of
disagreements at decided positions (cold's top-1 beats its top-2 by more than --threshold).
The cache hits go through ``KVCacheManager.begin``, so the runner executes the manager's own
moves. Exit status 1 when an exact condition (all but kv_shift_reuse) disagrees at a decided
position or did not set up what it claims (e.g. the expected cache hit).

    python bench/logit_traces.py                    # SmolLM2, full conditions
    python bench/logit_traces.py --fast             # short prompts, few conditions (< 60 s, CPU)
    python bench/logit_traces.py --model gemma3 --device cuda --dtype bf16
    python bench/logit_traces.py --fast --vs-f32   # also: quantized weights vs the f32 reference
    python bench/logit_traces.py --fast --max-abs 1e-4   # exact conditions also gate max |Δlogit|
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import make_text, print_conditions, print_table  # noqa: E402

from kvserve.cache.manager import KVCacheManager  # noqa: E402
from kvserve.plan import Plan, SeqChunk  # noqa: E402
from kvserve.model.loader import DTYPES, LoadedModel, load_gguf  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402
from kvserve.model.tokenizer import Tokenizer  # noqa: E402

PROSE = (
    "The history of the lighthouse is a history of fire, glass and patience. The earliest ones were "
    "simple towers with a wood fire burning on top, tended through the night by keepers who carried "
    "fuel up narrow stairs. Later came oil lamps with polished reflectors, and in 1822 Augustin "
    "Fresnel designed a lens built from concentric rings of glass prisms, which bent the scattered "
    "light of a single flame into one bright horizontal beam visible more than twenty miles away. "
    "Each station was given its own pattern of flashes so that sailors could tell one coast from "
    "another: two short flashes every ten seconds, a long steady beam, or a red sector warning of "
    "rocks. Keepers wrote the weather in logbooks every four hours, wound the clockwork that turned "
    "the lens, trimmed the wicks and cleaned soot from the glass before dawn. Many lived with their "
    "families on remote islands for months at a time, supplied by boats that could not land in "
    "winter storms. Electricity arrived in the twentieth century, then automatic timers, radio "
    "beacons and finally satellite navigation, and one by one the keepers left. Today most towers "
    "run unattended, their lamps replaced by small light-emitting diodes, and several have become "
    "museums where visitors climb the same worn steps to look out over the water."
)
CODE = (
    "import heapq\nfrom collections import defaultdict\n\n\n"
    "def shortest_paths(edges, source):\n"
    "    \"\"\"Dijkstra over a list of (u, v, weight) edges; returns a dict of distances.\"\"\"\n"
    "    graph = defaultdict(list)\n"
    "    for u, v, w in edges:\n"
    "        graph[u].append((v, w))\n"
    "        graph[v].append((u, w))\n"
    "    dist = {source: 0}\n"
    "    queue = [(0, source)]\n"
    "    while queue:\n"
    "        d, node = heapq.heappop(queue)\n"
    "        if d > dist.get(node, float('inf')):\n"
    "            continue\n"
    "        for nxt, w in graph[node]:\n"
    "            nd = d + w\n"
    "            if nd < dist.get(nxt, float('inf')):\n"
    "                dist[nxt] = nd\n"
    "                heapq.heappush(queue, (nd, nxt))\n"
    "    return dist\n\n\n"
    "class LRUCache:\n"
    "    def __init__(self, capacity):\n"
    "        self.capacity = capacity\n"
    "        self.items = {}\n\n"
    "    def get(self, key):\n"
    "        if key not in self.items:\n"
    "            return None\n"
    "        value = self.items.pop(key)\n"
    "        self.items[key] = value\n"
    "        return value\n\n"
    "    def put(self, key, value):\n"
    "        self.items.pop(key, None)\n"
    "        self.items[key] = value\n"
    "        if len(self.items) > self.capacity:\n"
    "            self.items.pop(next(iter(self.items)))\n"
)
DIALOGUE = (
    "Customer: Hello, I ordered a bicycle three weeks ago and it still has not arrived. "
    "Agent: I am sorry to hear that. Could you give me the order number, please? "
    "Customer: It is four five seven, two two nine. "
    "Agent: Thank you. I can see the parcel left our warehouse on Monday, but the courier marked it "
    "as delayed because of the floods in the north. The new delivery date is next Thursday. "
    "Customer: That is too late, I need it for a race on Sunday. Is there anything you can do? "
    "Agent: I can send a replacement by express from the southern warehouse. It would arrive on "
    "Friday, and when the first parcel comes you can refuse it at the door. "
)

EXACT = True
APPROX = False


@dataclass
class Cond:
    name: str
    exact: bool
    prompts: int = 0
    positions: int = 0
    decided: int = 0
    disagree: int = 0
    max_abs: float = 0.0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    max_allowed: float | None = None  # --max-abs: exact conditions also gate max |Δlogit|

    @property
    def too_far(self) -> bool:
        return self.exact and self.max_allowed is not None and self.max_abs > self.max_allowed

    @property
    def failed(self) -> bool:
        return self.exact and (self.disagree > 0 or bool(self.errors) or self.too_far)

    def status(self) -> str:
        if self.errors:
            return "FAIL (setup)" if self.exact else "not exercised"
        if not self.exact:
            return "report"
        if self.too_far:
            return f"FAIL (> {self.max_allowed:g})"
        return "FAIL" if self.disagree else "ok"


@dataclass(frozen=True)
class Settings:
    fast: bool
    threshold: float
    chunk_sizes: tuple[int, ...]
    batch_widths: tuple[int, ...]
    decode_tail: int  # batch_W: last tokens fed one per step
    ubatch: int
    reuse_min: int  # n_cache_reuse for kv_shift_reuse
    decoder_ctx: int  # batch_W: context of the first decoding neighbour (later ones +7 each)
    page_size: int = 16

    def condition_names(self) -> list[str]:
        names = ["cold", "prefix_hit_full", "prefix_hit_partial", "kv_shift_reuse"]
        names += [f"batch_{w}" for w in self.batch_widths]
        names += [f"chunk_{c}" for c in self.chunk_sizes]
        return names + [f"ubatch_{self.ubatch}"]


def settings_for(fast: bool, threshold: float) -> Settings:
    if fast:
        return Settings(True, threshold, (7, 20), (1, 4, 8), 3, 13, 4, 20)
    return Settings(False, threshold, (7, 64, 256), (1, 4, 8), 12, 100, 8, 150)


def condition_names(fast: bool) -> list[str]:
    """Every condition the report lists, for a mode (the fast test checks them all)."""
    return settings_for(fast, 0.5).condition_names()


# -- comparison ----------------------------------------------------------------------------------
def compare(cond: Cond, cold: torch.Tensor, got: torch.Tensor, threshold: float) -> None:
    """Fold ``got`` (logits of the same positions as ``cold``) into the condition's counters."""
    got = got.float().cpu()
    assert got.shape == cold.shape, (got.shape, cold.shape)
    cond.positions += cold.shape[0]
    cond.max_abs = max(cond.max_abs, (got - cold).abs().max().item())
    top2 = cold.topk(2, dim=-1).values
    decided = (top2[:, 0] - top2[:, 1]) > threshold
    differ = got.argmax(-1) != cold.argmax(-1)
    cond.decided += int(decided.sum())
    cond.disagree += int((decided & differ).sum())


# -- the lab: one runner, pages from one cache manager ----------------------------------------------
class Lab:
    """Every sequence gets its pages from ``mgr``: private sequences with ``use_cache=False``,
    cache conditions through ``begin`` with a namespace of their own (no cross-condition hits)."""

    def __init__(self, loaded: LoadedModel, n_pages: int, page_size: int, n_ubatch: int = 512) -> None:
        self.loaded = loaded
        self.page_size = page_size
        self.runner = ModelRunner(loaded, n_pages, page_size, None, n_ubatch)
        self.mgr = KVCacheManager(n_pages, page_size, retain_limit_pages=None)
        self._ids = itertools.count(1)

    def poison(self) -> None:
        """Overwrite the whole KV pool with finite garbage. Called between conditions (when no
        sequence or cache entry holds a page), so a row that a move or a forward should have
        written but did not cannot pass by still holding the right numbers from an earlier
        condition (the page pool hands freed pages out again)."""
        assert self.mgr.stats().in_use_pages == 0 and self.mgr.stats().retained_pages == 0
        self.runner.kv.k.fill_(3.0)
        self.runner.kv.v.fill_(-2.0)

    def new_private(self, n_tokens: int) -> tuple[int, tuple[int, ...]]:
        sid = next(self._ids)
        self.mgr.begin(sid, ("private",), [], use_cache=False)
        self.mgr.reserve(sid, n_tokens)
        return sid, self.mgr.page_table(sid)

    def drop(self, sid: int) -> None:
        self.mgr.finish(sid, [], 0, donate=False)

    def run(self, plan: Plan) -> dict[int, torch.Tensor]:
        return self.runner.run(plan).logits  # type: ignore[return-value]

    def cold(self, ids: Sequence[int]) -> torch.Tensor:
        sid, table = self.new_private(len(ids))
        out = self.run(Plan((SeqChunk(sid, tuple(ids), 0, table, "all"),)))[sid].float().cpu()
        self.drop(sid)
        return out

    # A cached entry: a sequence computes ``tokens`` and donates them (finish) -- or, with
    # ``keep``, only publishes its full pages and stays running (the caller finishes it).
    def cache_entry(self, ns: Hashable, tokens: Sequence[int], keep: bool = False) -> int:
        sid = next(self._ids)
        adm = self.mgr.begin(sid, ns, tokens, use_cache=True)
        self.mgr.reserve(sid, len(tokens))
        table = self.mgr.page_table(sid)
        rest = tuple(tokens[adm.n_cached :])
        self.run(Plan((SeqChunk(sid, rest, adm.n_cached, table, "none"),), adm.moves))
        if keep:
            self.mgr.publish(sid, tokens, len(tokens))
        else:
            self.mgr.finish(sid, tokens, len(tokens), donate=True)
        return sid

    def admit_and_compute(
        self, ns: Hashable, ids: Sequence[int], n_cache_reuse: int = 0
    ) -> tuple[int, torch.Tensor, str]:
        """Admit ``ids`` through the cache, run the moves and the uncached rest (logits all).
        Returns (n_cached, logits of positions [n_cached, n), note)."""
        sid = next(self._ids)
        adm = self.mgr.begin(sid, ns, ids, use_cache=True, n_cache_reuse=n_cache_reuse)
        self.mgr.reserve(sid, len(ids))
        table = self.mgr.page_table(sid)
        nc = adm.n_cached
        out = self.run(Plan((SeqChunk(sid, tuple(ids[nc:]), nc, table, "all"),), adm.moves))[sid]
        self.mgr.finish(sid, ids, len(ids), donate=False)
        cow = sum(1 for m in adm.moves if m.delta == 0)
        shifted = sum(1 for m in adm.moves if m.delta != 0)
        note = (f"hit {nc}/{len(ids)} ({adm.stop_reason}; prefix {adm.n_reused_prefix}, "
                f"shift {adm.n_reused_shift}; {cow} copy + {shifted} shift moves)")
        return nc, out, note

    def forget(self, ns: Hashable) -> None:
        self.mgr.erase_namespace(ns)
        self.mgr.check_integrity()


def mid_page(n: int, page_size: int) -> int:
    """A length near ``n`` that ends inside a page (so a hit there copies a partial page)."""
    m = max(2, n)
    if m % page_size == 0:
        m -= page_size // 2
    return max(1, m)


def foreign(tokens: Sequence[int], avoid: int, n: int) -> list[int]:
    """``n`` tokens from ``tokens`` (cycled) whose first one differs from ``avoid``."""
    src = [t for t in tokens if t != avoid] or [avoid + 1]
    out = [src[0]]
    i = 1
    while len(out) < n:
        out.append(tokens[i % len(tokens)])
        i += 1
    return out[:n]


# -- conditions ---------------------------------------------------------------------------------------
def run_prefix_full(lab: Lab, k: int, ids: list[int], cold: torch.Tensor, cond: Cond, s: Settings) -> None:
    n, ps = len(ids), s.page_size
    # (a) the same prompt cached: hit n - 1
    ns = ("full-a", k)
    lab.cache_entry(ns, ids)
    nc, out, note = lab.admit_and_compute(ns, ids)
    cond.notes.append("a: " + note)
    if nc != n - 1:
        cond.errors.append(f"prompt {k} (a): expected hit {n - 1}, got {nc}")
    compare(cond, cold[nc:], out, s.threshold)
    lab.forget(ns)
    # (b) a cached prefix ending mid-page, reused whole
    m = mid_page(n * 3 // 5, ps)
    ns = ("full-b", k)
    lab.cache_entry(ns, ids[:m])
    nc, out, note = lab.admit_and_compute(ns, ids)
    cond.notes.append("b: " + note)
    if nc != m:
        cond.errors.append(f"prompt {k} (b): expected hit {m}, got {nc}")
    compare(cond, cold[nc:], out, s.threshold)
    lab.forget(ns)
    # (c) a running sequence published its full pages; the new one shares them meanwhile
    ns = ("full-c", k)
    runner_sid = lab.cache_entry(ns, ids[:m], keep=True)
    nc, out, note = lab.admit_and_compute(ns, ids)
    lab.mgr.finish(runner_sid, ids[:m], m, donate=False)
    cond.notes.append("c: " + note)
    if nc != (m // ps) * ps:
        cond.errors.append(f"prompt {k} (c): expected hit {(m // ps) * ps}, got {nc}")
    compare(cond, cold[nc:], out, s.threshold)
    lab.forget(ns)
    cond.prompts += 1


def run_prefix_partial(lab: Lab, k: int, ids: list[int], other: list[int], cold: torch.Tensor,
                       cond: Cond, s: Settings) -> None:
    n, ps = len(ids), s.page_size
    m = mid_page(n // 2, ps)
    ns = ("partial", k)
    lab.cache_entry(ns, ids[:m] + foreign(other, ids[m], ps + 5))
    nc, out, note = lab.admit_and_compute(ns, ids)
    cond.notes.append(note)
    if nc != m:
        cond.errors.append(f"prompt {k}: expected hit {m}, got {nc}")
    compare(cond, cold[nc:], out, s.threshold)
    lab.forget(ns)
    cond.prompts += 1


def run_kv_shift(lab: Lab, k: int, ids: list[int], other: list[int], cold: torch.Tensor,
                 cond: Cond, s: Settings) -> None:
    """Cached: ids[:h] + D + ids[h:e] + F.  New: ids.  The chunk ids[h:e] moves left by |D|."""
    n, ps = len(ids), s.page_size
    h = mid_page(n // 4, ps)
    e = max(h + s.reuse_min + 1, (n * 3) // 4)
    d = foreign(other, ids[h], max(5, n // 10) | 1)
    f = foreign(other[::-1], ids[e], ps + 3)
    ns = ("shift", k)
    lab.cache_entry(ns, ids[:h] + d + ids[h:e] + f)
    nc, out, note = lab.admit_and_compute(ns, ids, n_cache_reuse=s.reuse_min)
    cond.notes.append(f"{note}; removed {len(d)} tokens before the chunk")
    if nc <= h:
        cond.errors.append(f"prompt {k}: no chunk was shifted (hit {nc}, prefix {h})")
    compare(cond, cold[nc:], out, s.threshold)
    lab.forget(ns)
    cond.prompts += 1


def run_batch(lab: Lab, k: int, ids: list[int], fillers: list[list[int]], cold: torch.Tensor,
              cond: Cond, s: Settings, width: int) -> None:
    """Step 0: the prompt's first n - T tokens (T = decode_tail); steps 1..T: one token each.
    Every step also carries width - 1 other sequences: even ones decode (one token a step after
    a context computed beforehand), odd ones prefill 5 tokens a step. The prompt sits in the
    middle of the batch."""
    n, tail = len(ids), min(s.decode_tail, len(ids) - 1)
    steps = tail + 1
    others: list[tuple[int, tuple[int, ...], list[int], int, int]] = []  # sid, table, toks, pos, step
    setup: list[SeqChunk] = []
    for j in range(width - 1):
        toks = fillers[j % len(fillers)]
        if j % 2 == 0:  # decoder: context first
            ctx = max(3, min(len(toks) - steps, s.decoder_ctx + 7 * j))
            sid, table = lab.new_private(ctx + steps)
            setup.append(SeqChunk(sid, tuple(toks[:ctx]), 0, table, "none"))
            others.append((sid, table, toks, ctx, 1))
        else:  # prefiller: 5 tokens a step
            sid, table = lab.new_private(5 * steps)
            others.append((sid, table, toks, 0, 5))
    if setup:
        lab.run(Plan(tuple(setup)))
    me, table = lab.new_private(n)
    where = (width - 1) // 2
    parts: list[torch.Tensor] = []
    pos = 0
    for step in range(steps):
        mine = ids[: n - tail] if step == 0 else ids[pos : pos + 1]
        chunks = []
        for sid, t, toks, p, per in others:
            start = p + step * per
            chunks.append(SeqChunk(sid, tuple(toks[start : start + per]), start, t, "last"))
        chunks.insert(where, SeqChunk(me, tuple(mine), pos, table, "all"))
        out = lab.run(Plan(tuple(chunks)))
        if set(out) != {c.seq_id for c in chunks}:
            cond.errors.append(f"prompt {k} step {step}: logits for {sorted(out)}")
        parts.append(out[me])
        pos += len(mine)
    compare(cond, cold, torch.cat(parts), s.threshold)
    for sid, *_ in others:
        lab.drop(sid)
    lab.drop(me)
    cond.prompts += 1
    if k == 0:
        cond.notes.append(f"{width - 1} others ({(width) // 2} decoding, {(width - 1) // 2} prefilling); "
                          f"prompt = prefill n-{tail}, then {tail} single-token steps")


def run_chunks(lab: Lab, k: int, ids: list[int], cold: torch.Tensor, cond: Cond, s: Settings, size: int) -> None:
    sid, table = lab.new_private(len(ids))
    parts = []
    for start in range(0, len(ids), size):
        piece = tuple(ids[start : start + size])
        parts.append(lab.run(Plan((SeqChunk(sid, piece, start, table, "all"),)))[sid])
    compare(cond, cold, torch.cat(parts), s.threshold)
    lab.drop(sid)
    cond.prompts += 1
    if k == 0:
        cond.notes.append(f"{-(-len(ids) // size)} plans for prompt 0")


def run_ubatch(ulab: Lab, k: int, ids: list[int], filler: list[int], cold: torch.Tensor,
               cond: Cond, s: Settings) -> None:
    """One plan [other prefill of U//2 + 3 tokens, the prompt]: micro-batch borders fall inside
    the prompt, whose later pieces attend to KV written by earlier micro-batches."""
    lead = filler[: s.ubatch // 2 + 3]
    a, ta = ulab.new_private(len(lead))
    me, table = ulab.new_private(len(ids))
    out = ulab.run(Plan((SeqChunk(a, tuple(lead), 0, ta, "last"), SeqChunk(me, tuple(ids), 0, table, "all"))))
    compare(cond, cold, out[me], s.threshold)
    ulab.drop(a)
    ulab.drop(me)
    cond.prompts += 1
    if k == 0:
        cond.notes.append(f"{-(-(len(lead) + len(ids)) // s.ubatch)} micro-batches for prompt 0")


# -- driver -------------------------------------------------------------------------------------------
@dataclass
class Job:
    """Everything the conditions need for one prompt."""

    lab: Lab
    ulab: Lab
    s: Settings
    k: int  # prompt index
    ids: list[int]
    cold: torch.Tensor
    other: list[int]  # foreign tokens for cache entries
    filler: list[int]  # the sequence sharing the ubatch plan
    fillers: list[list[int]]  # neighbours in batch_W

    def run(self, name: str, cond: Cond) -> None:
        lab, s, k, ids, cold = self.lab, self.s, self.k, self.ids, self.cold
        kind, _, arg = name.rpartition("_")
        if name == "prefix_hit_full":
            run_prefix_full(lab, k, ids, cold, cond, s)
        elif name == "prefix_hit_partial":
            run_prefix_partial(lab, k, ids, self.other, cold, cond, s)
        elif name == "kv_shift_reuse":
            run_kv_shift(lab, k, ids, self.other, cold, cond, s)
        elif kind == "batch":
            run_batch(lab, k, ids, self.fillers, cold, cond, s, int(arg))
        elif kind == "chunk":
            run_chunks(lab, k, ids, cold, cond, s, int(arg))
        elif kind == "ubatch":
            run_ubatch(self.ulab, k, ids, self.filler, cold, cond, s)
        else:
            raise ValueError(f"unknown condition {name!r}")


def resolve_model(name: str) -> tuple[str, str]:
    from kvserve.model.files import default_model_path, gemma3_270m_path

    if name in ("smollm2", "smollm", "default"):
        return "SmolLM2-135M-Instruct Q4_1", default_model_path()
    if name in ("gemma3", "gemma"):
        d = os.environ.get("KVSERVE_TEST_MODEL_DIR", "/tmp/kvserve-models")
        return "gemma-3-270m Q4_K_M", gemma3_270m_path(d)
    return os.path.basename(name), name


def build_prompts(tok: Tokenizer, fast: bool, max_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """(traces, fillers): fixed texts; fast mode cuts the first two short."""
    enc = lambda t, bos=True: tok.encode(t, add_special=bos, parse_special=False)  # noqa: E731
    if fast:
        traces = [enc(PROSE)[:44], enc(CODE)[:37]]
    else:
        traces = [enc(PROSE), enc(CODE), enc(DIALOGUE + " " + PROSE + "\n\n" + CODE)]
    if max_tokens:
        traces = [t[:max_tokens] for t in traces]
    fillers = [enc(make_text(100 + i, 400), bos=False) for i in range(4)]
    return traces, fillers


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="smollm2 | gemma3 | PATH to a GGUF file")
    p.add_argument("--fast", action="store_true", help="short prompts, fewer variants (< 60 s on CPU)")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="a position is decided when cold's top-1 logit beats top-2 by more than this")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default f32 on CPU, bf16 on CUDA")
    p.add_argument("--max-tokens", type=int, default=0, help="cut every prompt to this many tokens")
    p.add_argument("--weights", default="auto", choices=["auto", "quant", "dense"],
                   help="weight layout (auto: kept quantized on CPU with f32, else dequantized)")
    p.add_argument("--vs-f32", action="store_true",
                   help="add quant_vs_f32: cold logits against a second copy with every weight in f32")
    p.add_argument("--max-abs", type=float, default=None,
                   help="also fail an exact condition whose max |Δlogit| against cold exceeds this")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads for this run (default: 1 with --fast, else unchanged). Small "
                        "forwards gain nothing from more, and on shared cores extra threads oversubscribe")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, loaded: LoadedModel | None = None) -> int:
    """Run the traces; returns the exit status. ``loaded`` skips loading (tests pass theirs)."""
    args = parse_args(argv)
    threads_before = torch.get_num_threads()
    threads = args.threads if args.threads is not None else (1 if args.fast else 0)
    if threads:
        torch.set_num_threads(threads)
    try:
        return _main(args, loaded)
    finally:
        torch.set_num_threads(threads_before)


def _main(args: argparse.Namespace, loaded: LoadedModel | None) -> int:
    t_start = time.perf_counter()
    dtype = args.dtype or ("bf16" if args.device == "cuda" else "f32")
    name, path = resolve_model(args.model)
    if loaded is None:
        loaded = load_gguf(path, dtype=DTYPES[dtype], device=args.device, weights=args.weights)
    else:
        dtype = str(loaded.dtype).replace("torch.", "")
    s = settings_for(args.fast, args.threshold)
    tok = Tokenizer.from_metadata(loaded.metadata)
    traces, fillers = build_prompts(tok, args.fast, args.max_tokens)
    n_max = max(len(t) for t in traces)
    cfg = loaded.cfg
    print_conditions(
        "kvserve teacher-forced logit traces",
        {
            "model": f"{name} ({cfg.arch}, {cfg.n_layer} layers, vocab {cfg.n_vocab}"
                     + (f", sliding window {cfg.sliding_window}" if cfg.sliding_window else "") + ")",
            "device": str(loaded.device) + (f" ({torch.get_num_threads()} threads)" if loaded.device.type == "cpu"
                                            else f" ({torch.cuda.get_device_name(loaded.device)})"),
            "dtype (activations and KV)": dtype,
            "weights": loaded.weights + (f" ({loaded.summary.line()})" if loaded.summary else ""),
            "torch": torch.__version__,
            "mode": "fast" if args.fast else "full",
            "prompts (tokens)": ", ".join(str(len(t)) for t in traces),
            "page size": s.page_size,
            "decided": f"cold top-1 minus top-2 > {s.threshold}",
            "reference": "cold: each prompt in one plan, logits all",
            "gate": "exit 1 on any decided disagreement or setup error in an exact condition"
                    + (f", or its max |Δlogit| above {args.max_abs:g}" if args.max_abs is not None else "")
                    + "; kv_shift_reuse is reported only",
        },
    )
    n_pages = -(-(8 * n_max + 6 * 5 * (s.decode_tail + 1) + 4 * 400) // s.page_size) + 64
    lab = Lab(loaded, n_pages, s.page_size)
    ulab = Lab(loaded, -(-(n_max + s.ubatch) // s.page_size) + 8, s.page_size, s.ubatch)
    conds = {c: Cond(c, c != "kv_shift_reuse", max_allowed=args.max_abs) for c in s.condition_names()}
    ref_lab = None
    if args.vs_f32:
        ref = load_gguf(loaded.path, dtype=torch.float32, device=loaded.device, weights="dense")
        ref_lab = Lab(ref, -(-n_max // s.page_size) + 8, s.page_size)
        conds["quant_vs_f32"] = Cond("quant_vs_f32", False)
    for k, ids in enumerate(traces):
        other = fillers[k % len(fillers)]
        t0 = time.perf_counter()
        lab.poison()
        cold = lab.cold(ids)
        conds["cold"].prompts += 1
        # Full mode re-runs the reference (run-to-run determinism); fast mode only counts it.
        compare(conds["cold"], cold, cold if s.fast else lab.cold(ids), s.threshold)
        conds["cold"].seconds += time.perf_counter() - t0
        if ref_lab is not None:
            t0 = time.perf_counter()
            ref_lab.poison()
            conds["quant_vs_f32"].prompts += 1
            compare(conds["quant_vs_f32"], ref_lab.cold(ids), cold, s.threshold)
            conds["quant_vs_f32"].seconds += time.perf_counter() - t0
        job = Job(lab, ulab, s, k, ids, cold, other, fillers[(k + 1) % len(fillers)], fillers)
        for cname in s.condition_names()[1:]:
            t0 = time.perf_counter()
            lab.poison()
            ulab.poison()
            job.run(cname, conds[cname])
            conds[cname].seconds += time.perf_counter() - t0
        lab.mgr.check_integrity()
        print(f"prompt {k} ({len(ids)} tokens) done at {time.perf_counter() - t_start:.1f} s",
              file=sys.stderr, flush=True)
    conds["cold"].notes.append("reference, not re-run" if s.fast else "reference run twice: run-to-run determinism")
    rows = []
    for c in conds.values():
        rows.append([c.name, "exact" if c.exact else "approx", c.prompts, c.positions, c.decided, c.disagree,
                     f"{c.max_abs:.3g}", c.status(), c.seconds, "; ".join(c.errors + c.notes[:3])])
    print_table(["condition", "kind", "prompts", "positions", "decided", "disagree", "max |Δlogit|", "status",
                 "s", "notes"], rows)
    failed = [c.name for c in conds.values() if c.failed]
    print(f"wall time: {time.perf_counter() - t_start:.1f} s")
    print("RESULT: " + ("FAIL (" + ", ".join(failed) + ")" if failed else "PASS"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
