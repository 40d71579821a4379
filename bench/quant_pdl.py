"""Batch-1 decode of quantized GGUF files at each ``KVSERVE_QUANT_GEMV_PDL`` setting, alternated on one
loaded model (``bench/engine.py``'s runner and decode loop; a new runner, so new CUDA graphs,
per setting): an A/B of programmatic dependent launch of the int8 tiled GEMV in one process.

    python bench/quant_pdl.py --synth SHAPE --synth-qtype Q4_K_M --device cuda --weights quant \\
        --prefill 512 --batches 1 --ctx 2048 --steps 32 --reps 3 --settings 0,1,2,2+attn --rounds 2

``--settings``: ``KVSERVE_QUANT_GEMV_PDL`` levels (``kvserve.model.quant.pdl``), each with any of:

- ``+attn``: ``KVSERVE_DECODE_PDL=1`` (the one-launch decode attention as a dependent launch too);
- ``+notrig``: ``KVSERVE_DECODE_TRIGGER=0`` (that attention does not let the kernel after it start early);
- ``+pN``: every tiled GEMV at the 2+-row configuration with its K split set for N programs a
  multiprocessor (``TileConfig.programs``; the table's 8 otherwise);
- ``+v64``: batch 1 of an 8-bit tensor under 8 MiB (Q6_K V) at 64 columns and 2 warps a program,
  Q4_K Q/K's configuration (the pair's launch runs at the larger warps of its two anyway);
- ``+wide``: batch 1 at the 2+-row table (``triton_q8_tile.CONFIGS``) instead of ``ONE_ROW``;
- ``+tune``: each tensor at the configuration of ``--tuning FILE`` (as ``bench/quant_cuda.py
  --sweep --best FILE`` writes it; ``KVSERVE_GEMV_TILE_TUNING``'s format);
- ``+serial``: ``KVSERVE_GEMV_STREAMS=0`` (a module's second segment, Q6_K V beside Q4_K Q/K,
  after the first on one stream);
- ``+noqo``: ``KVSERVE_DECODE_QUANT_OUT=0`` (the output projection quantizes its input itself,
  not the attention's merge);
- ``+noact``: ``KVSERVE_GEMV_ACT_EPILOGUE=0`` (act(gate)·up quantized for down by a kernel of its
  own, not by the gate/up GEMV's programs);
- ``+nopair``: ``KVSERVE_GEMV_PAIR=0`` (a module's two segments, Q4_K Q/K and Q6_K V, as two
  launches on two streams, not one launch of both);
- ``+nosplit``: ``KVSERVE_GEMV_NORM_SPLIT=0`` (the RMSNorm after the output and down projections
  as a norm + quantize kernel of its own, not split between the GEMVs before and after it).

``--rounds``: the settings in turn that many times (each row a median over rounds). ``--kernels``:
the kernels of one step of each setting (first round); ``--kernels-for 0,2``: of those settings.
The table: tok/s per setting and the fraction of the roofline (weights + the context's KV at the copy bandwidth measured in the run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import print_table  # noqa: E402
from engine import DTYPES, Bench, copy_bandwidth, models_from_args, parse_args, print_kernels, weight_bytes  # noqa: E402

from kvserve.model.loader import load_gguf  # noqa: E402
from kvserve.model.backends.triton_kernels import fused_decode  # noqa: E402
from kvserve.model.quant import cuda_linear, pdl, triton_q8_tile  # noqa: E402


DEFAULT_CONFIGS = list(triton_q8_tile.CONFIGS)
DEFAULT_ONE_ROW = dict(triton_q8_tile.ONE_ROW)
TUNED: dict = {}  # --tuning FILE


def apply(setting: str) -> None:
    level, *extra = setting.split("+")
    pdl.LEVEL = int(level)
    os.environ["KVSERVE_DECODE_PDL"] = "1" if "attn" in extra else "0"
    os.environ["KVSERVE_DECODE_QUANT_OUT"] = "0" if "noqo" in extra else "1"
    cuda_linear.PARALLEL_SEGMENTS = "serial" not in extra
    cuda_linear.ACT_EPILOGUE = "noact" not in extra
    cuda_linear.PAIR_SEGMENTS = "nopair" not in extra
    cuda_linear.NORM_SPLIT = "nosplit" not in extra
    fused_decode.TRIGGER = "notrig" not in extra
    triton_q8_tile.CONFIGS[:] = DEFAULT_CONFIGS
    triton_q8_tile.ONE_ROW.clear()
    triton_q8_tile.ONE_ROW.update(DEFAULT_ONE_ROW)
    triton_q8_tile.TUNING.clear()
    if "tune" in extra:
        triton_q8_tile.TUNING.update(TUNED)
    for e in extra:
        if e.startswith("p"):  # every tensor's K split set for N programs a multiprocessor
            triton_q8_tile.CONFIGS[:] = [(None, DEFAULT_CONFIGS[-1][1]._replace(programs=int(e[1:])))]
            triton_q8_tile.ONE_ROW.clear()
        if e == "wide":  # one batch row at the multi-row table (one warp of 128 columns)
            triton_q8_tile.ONE_ROW.clear()
        if e == "v64":  # one batch row of an 8-bit tensor under 8 MiB (Q6_K V) at Q/K's configuration
            triton_q8_tile.ONE_ROW[8] = [(8 << 20, triton_q8_tile.TileConfig(64, 2, 8, 128))] + DEFAULT_ONE_ROW[8]


def main() -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--settings", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--kernels-for", default="", help="settings whose step kernels to list (first round)")
    ap.add_argument("--tuning", help="a tiled-GEMV tuning file for the +tune settings")
    own, rest = ap.parse_known_args()
    if own.tuning:
        with open(own.tuning) as f:
            TUNED.update({int(k): triton_q8_tile.TileConfig(*v) for k, v in json.load(f).items()})
    args = parse_args(rest)
    settings = own.settings.split(",")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    bw = copy_bandwidth(device) if cuda else float("nan")  # (a CPU run: a smoke test of the script)
    print(f"device {torch.cuda.get_device_name(0) if cuda else 'cpu'}, torch {torch.__version__}, "
          f"copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows = []
    for name, path in models_from_args(args):
        loaded = load_gguf(path, dtype=DTYPES[args.dtype], device=device, weights=args.weights)
        if loaded.summary is not None:
            print(f"{name}: {loaded.summary.line()}", flush=True)
        wb = weight_bytes(loaded)
        got: dict[str, list[float]] = {s: [] for s in settings}
        kv = 0
        for rnd in range(own.rounds):
            for s in settings:
                apply(s)
                b = Bench(loaded, args)
                kv = args.ctx * loaded.cfg.kv_bytes_per_token(b.runner.kv.k.element_size())
                tps = b.decode(1)
                got[s].append(tps)
                print(f"{name}: KVSERVE_QUANT_GEMV_PDL={s} round {rnd}: decode b1 {tps:.1f} tok/s", flush=True)
                if cuda and rnd == 0 and (args.kernels or s in own.kernels_for.split(",")):
                    print_kernels(f"{name} KVSERVE_QUANT_GEMV_PDL={s}", 1, b.decode_setup(1), 1e6 / tps, args.steps // 2)
                del b
                torch.cuda.empty_cache()
        roof = bw / (wb + kv)
        base = statistics.median(got[settings[0]])
        for s in settings:
            med = statistics.median(got[s])
            rows.append([name.split(",n_vocab=")[-1].split(",")[0], s, wb / 1e9, med,
                         " / ".join(f"{t:.1f}" for t in got[s]), 1e3 / med, med / roof, med / base])
        del loaded
        torch.cuda.empty_cache()
        table(rows, args, bw, settings)
    apply("0")
    return 0


def table(rows: list, args: argparse.Namespace, bw: float, settings: list[str]) -> None:
    print(f"\n## Batch-1 decode per KVSERVE_QUANT_GEMV_PDL setting (roofline: weights + {args.ctx} tokens of KV "
          f"at {bw / 1e9:.0f} GB/s)\n")
    print_table(["n_vocab", "setting", "weights GB", "tok/s (median)", "rounds", "ms / step", "fraction of roofline",
                 f"/ setting {settings[0]}"], rows, digits=3)


if __name__ == "__main__":
    sys.exit(main())
