"""Choose a layout per GGUF weight and build the modules that run it.

    native      CPU: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q5_K Q6_K kept as the file's blocks, run by the
                native kernels (``native``: llama.cpp's arithmetic) → NativeLinear
    int4        CPU without the native kernels: Q4_0 Q4_1 Q4_K (one plane), Q5_0 Q5_1 Q5_K Q8_0
                (two planes) → QuantLinear
    cuda-quant  CUDA: Q4_0 Q4_1 Q4_K (4-bit codes), Q5_* Q6_K Q8_0 (8-bit codes)  → CudaQuantLinear
    dense       every other type (CPU: also Q6_K; Q2_K, Q3_K, IQ*, F16, BF16 …) → DenseLinear, bf16
                (float32 where the file stores float32)
    rows        CPU token embeddings: the GGUF bytes, rows dequantized on gather → QuantEmbedding
                (tied: the native head's own bytes; on the int4 path the head's planes plus the
                file's group scales → PlaneEmbedding)

Tensors that share an input (Q/K/V, gate/up) are fused into one module when they all take the
same path, so that one kernel call serves them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from torch import nn

from . import int4, native
from .dequant import dequantize
from .groups import GROUP, GROUPED, GGUFGroups
from .linear import DenseLinear, QuantLinear

# parent module → (children fused, name of the fused module)
FUSED = {"attn": (("q", "k", "v"), "qkv"), "mlp": (("gate", "up"), "gate_up")}


class RawTensor(NamedTuple):
    data: np.ndarray  # as the GGUF reader maps it
    qtype: Q
    shape: tuple[int, int]  # (rows, cols) = (out_features, in_features)
    # drops the file pages of rows [i, j) once they are repacked (they fault back in if read again)
    release: Callable[[int, int], None] | None = None

    def release_all(self) -> None:
        if self.release is not None:
            self.release(0, self.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


def path_of(t: RawTensor, device: torch.device | None = None) -> str:
    if device is not None and device.type == "cuda":
        from . import cuda_pack  # the CUDA layout: imported only there

        return "cuda-quant" if cuda_pack.supported(t.qtype, t.shape[1]) else "dense"
    if native.supported(t.qtype, t.shape[1]):
        return "native"
    if t.shape[1] % GROUP:
        return "dense"
    return "int4" if t.qtype in GROUPED and int4.supported() else "dense"


def linear(
    weights: list[RawTensor], biases: list[torch.Tensor | None], device: torch.device | None = None
) -> nn.Module:
    """One module computing the outputs of ``weights`` side by side (all on the same path)."""
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b if b is not None else torch.zeros(w.shape[0]) for w, b in zip(weights, biases)])
    path = path_of(weights[0], device)
    if path == "native":
        return native.NativeLinear([(w.data, w.qtype, w.shape, w.release) for w in weights], bias)
    if path == "int4":
        return QuantLinear([GGUFGroups.of(w.data, w.qtype, w.shape, w.release) for w in weights], bias)
    if path == "cuda-quant":
        from . import cuda_pack
        from .cuda_linear import CudaQuantLinear, q6_planes  # imports triton: only on CUDA

        assert device is not None
        planes = q6_planes()
        packs = [cuda_pack.pack(_raw_on(w, device), w.qtype, w.shape[1], q6_planes=planes) for w in weights]
        return CudaQuantLinear(packs, bias, device)
    mats = [dequantize(w.data, w.qtype, w.shape) for w in weights]
    dtype = torch.float32 if all(w.qtype == Q.F32 for w in weights) else torch.bfloat16
    mod = DenseLinear(torch.cat(mats).to(dtype), bias)
    return mod if device is None else mod.to(device)


def _raw_on(t: RawTensor, device: torch.device) -> torch.Tensor:
    """The tensor's GGUF bytes as u8 [rows, bytes per row] on ``device`` (repacked there)."""
    raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(t.shape[0], -1)
    return torch.from_numpy(raw if raw.flags.writeable else raw.copy()).to(device)


def dense_on(t: RawTensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The dequantized matrix on ``device``: on CUDA computed there for the formats it packs."""
    if device.type == "cuda":
        from . import cuda_pack

        if cuda_pack.supported(t.qtype, t.shape[1]):
            return cuda_pack.dequantize(_raw_on(t, device), t.qtype, t.shape[1], dtype)
    return dequantize(t.data, t.qtype, t.shape).to(device=device, dtype=dtype)


def add_to_summary(summary: WeightSummary, mod: nn.Module, tensors: list[RawTensor]) -> None:
    """Record ``mod`` (built from ``tensors``) per path: a CUDA module may hold several."""
    parts = getattr(mod, "summary", None)
    if parts is None:
        summary.add(mod.path, tensors, mod.weight_bytes())  # type: ignore[arg-type]
        return
    for path, members, nbytes in parts():
        summary.add(path, [tensors[i] for i in members], nbytes)


class WeightSummary:
    """Tensors and bytes per path (one load log line; /props)."""

    def __init__(self) -> None:
        self.tensors: dict[str, int] = defaultdict(int)
        self.bytes: dict[str, int] = defaultdict(int)
        self.file_bytes: dict[str, int] = defaultdict(int)
        self.types: dict[str, set[str]] = defaultdict(set)
        self.kernels = ""  # which CPU kernels run the quantized weights (the load log says it)

    def add(self, path: str, tensors: list[RawTensor], module_bytes: int) -> None:
        self.tensors[path] += len(tensors)
        self.bytes[path] += module_bytes
        self.file_bytes[path] += sum(t.nbytes for t in tensors)
        self.types[path].update(t.qtype.name for t in tensors)

    def add_dense(self, nbytes: int, n: int) -> None:
        self.tensors["other"] += n
        self.bytes["other"] += nbytes

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())

    def as_dict(self) -> dict[str, dict[str, int | list[str]]]:
        return {
            p: {"tensors": self.tensors[p], "bytes": self.bytes[p], "types": sorted(self.types[p])}
            for p in sorted(self.tensors)
        }

    def line(self) -> str:
        parts = [
            f"{p} {self.tensors[p]} tensors {self.bytes[p] / 2**20:.1f} MiB"
            + (f" ({'/'.join(sorted(self.types[p]))})" if self.types[p] else "")
            for p in sorted(self.tensors)
        ]
        note = f"; {self.kernels}" if self.kernels else ""
        return "weights: " + ", ".join(parts) + f"; total {self.total_bytes / 2**20:.1f} MiB" + note


def cpu_kernels() -> str:
    """The load log's note on the CPU's quantized kernels."""
    if native.available():
        return f"native kernels ({native.isa_name(native.best_isa())})"
    return f"{native.unavailable_reason()}: torch int4 kernel"


def fuse_groups(
    linears: dict[str, RawTensor], device: torch.device | None = None
) -> list[tuple[str, list[str]]]:
    """[(module path, [weight module paths])]: fused where every member exists and shares a path."""
    done: set[str] = set()
    out: list[tuple[str, list[str]]] = []
    for mod in sorted(linears):
        parent, _, leaf = mod.rpartition(".")
        kind = parent.rpartition(".")[2]
        if kind in FUSED and leaf in FUSED[kind][0] and mod not in done:
            members = [f"{parent}.{c}" for c in FUSED[kind][0]]
            paths = {path_of(linears[m], device) for m in members if m in linears}
            if all(m in linears for m in members) and len(paths) == 1:
                out.append((f"{parent}.{FUSED[kind][1]}", members))
                done.update(members)
                continue
        if mod not in done:
            out.append((mod, [mod]))
            done.add(mod)
    return out
