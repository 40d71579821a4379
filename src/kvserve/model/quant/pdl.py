"""Programmatic dependent launch (PDL, sm90+) of the int8 tiled GEMV and the kernels feeding it.

``KVSERVE_QUANT_GEMV_PDL`` (an A/B switch; default 2, 0 keeps ordinary launches):

- ``1``: every tiled GEMV is launched as a programmatic dependent launch. Each K slice issues the
  loads of its first tile of weights (nothing a kernel of the step writes), then waits for the
  kernel before (``gdc_wait``) and only then reads the activations: the first round trip to
  memory, and the programs' start, overlap the kernel before. The kernels that quantize the
  GEMVs' activations (``triton_q8``: norm + quantize, act·mul + quantize, quantize) let their
  dependents launch at their start (``gdc_launch_dependents``), so that the GEMV's programs start
  while they run.
- ``2`` (the default): also those quantizing kernels are dependent launches (their read-only
  weights before the wait, the activations after), and a GEMV lets its dependents launch once
  each of its programs has passed its wait.

On an H200 the 8B Q4_K_M batch-1 decode step takes 2.84 / 2.70 / 2.60 ms at 0 / 1 / 2 (n_vocab
49,152; 2.93 / 2.77 / 2.68 at 128,256): docs/benchmarks.md, "Programmatic dependent launch".

What may be read before ``gdc_wait`` is only what no kernel of the step writes (the weights):
under PDL the kernels before may still run, and more than one of them. Every program of a
dependent launch waits before it reads anything else or writes anything, so a kernel completes
only after the one before it did (the chain stays ordered, in the decode graphs too). The
arithmetic is the same with and without: the outputs are equal bit for bit (tests).
"""

from __future__ import annotations

import os

import torch
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..pdl_support import pdl_supported

__all__ = ["LEVEL", "gdc_launch_dependents", "gdc_wait", "level", "supported"]

LEVEL = int(os.environ.get("KVSERVE_QUANT_GEMV_PDL", "2") or 0)
if LEVEL not in (0, 1, 2):
    raise ValueError(f"KVSERVE_QUANT_GEMV_PDL={LEVEL}: 0, 1 or 2")


def supported(device: torch.device) -> bool:
    """Compiled CUDA kernels (not Triton's interpreter) on sm90 or later."""
    return pdl_supported(device)


def level(device: torch.device, asked: int | None = None) -> int:
    """The PDL level a launch on ``device`` runs at (``asked``, default ``KVSERVE_QUANT_GEMV_PDL``; 0
    where PDL is not supported)."""
    lv = LEVEL if asked is None else asked
    return lv if lv and supported(device) else 0
