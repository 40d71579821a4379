"""Per-step profile of the model runner: host time vs GPU time and the top host costs.

Used by ``bench/engine.py --profile``. For each step kind (a prefill of L tokens, a decode step at
batch B) it reports, per step:

- wall: from the call to the end of the GPU work (the step is synchronized before and after);
- host: time until ``runner.run`` returns (on CUDA, work may still be running after it);
- GPU span: device time between events recorded before and after the step (idle gaps included);
- GPU busy: the sum of the step's kernel and copy times (torch.profiler's device events; kernels
  replayed from a CUDA graph included);
- host-bound share: 1 - busy / wall, the part of the step the GPU spends waiting;
- the top host operations by self CPU time (torch.profiler), and the runner's own phases
  (``kvserve.*`` ranges, inclusive time).

On the CPU there is no GPU column: every cost is host time.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


@dataclass
class StepProfile:
    label: str
    wall_ms: float
    host_ms: float
    gpu_span_ms: float | None
    gpu_busy_ms: float | None
    top_host: list[tuple[str, float, float]] = field(default_factory=list)  # (op, self ms/step, calls/step)
    top_gpu: list[tuple[str, float, float]] = field(default_factory=list)  # (kernel, ms/step, launches/step)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (range, inclusive ms/step)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _device_us(e: object) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        v = getattr(e, attr, None)
        if v is not None:
            return float(v)
    return 0.0


def profile_step(
    label: str, step: Callable[[], None], n_steps: int, device: torch.device, top: int = 12
) -> StepProfile:
    """Run ``step`` 2 × ``n_steps`` times (timed, then under the profiler); return per-step costs."""
    cuda = device.type == "cuda"
    host, wall, span = [], [], []
    for _ in range(n_steps):
        _sync(device)
        if cuda:
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        if cuda:
            e1.record()
        _sync(device)
        t2 = time.perf_counter()
        host.append(t1 - t0)
        wall.append(t2 - t0)
        if cuda:
            span.append(e0.elapsed_time(e1) / 1e3)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(n_steps):
            step()
        _sync(device)
    events = prof.key_averages()
    cpu_events = [e for e in events if getattr(e, "device_type", DeviceType.CPU) == DeviceType.CPU]
    # device-side copies of the runner's own ranges (kvserve.*) span kernels: not kernels themselves
    gpu_events = [e for e in events if getattr(e, "device_type", None) == DeviceType.CUDA
                  and not e.key.startswith("kvserve.")]
    # Kernels and copies are the events on the device; CPU ops also report their kernels' time.
    busy = sum(_device_us(e) for e in gpu_events) / 1e3 / n_steps if cuda else None
    top_gpu = [(e.key[:90], _device_us(e) / 1e3 / n_steps, e.count / n_steps)
               for e in sorted(gpu_events, key=_device_us, reverse=True)[:top]]
    ops = sorted(
        (e for e in cpu_events if not e.key.startswith("kvserve.") and e.key != "ProfilerStep*"),
        key=lambda e: e.self_cpu_time_total,
        reverse=True,
    )
    top_host = [(e.key, e.self_cpu_time_total / 1e3 / n_steps, e.count / n_steps) for e in ops[:top]]
    phases = sorted(
        ((e.key, e.cpu_time_total / 1e3 / n_steps) for e in cpu_events if e.key.startswith("kvserve.")),
        key=lambda t: -t[1],
    )
    return StepProfile(
        label=label,
        wall_ms=statistics.median(wall) * 1e3,
        host_ms=statistics.median(host) * 1e3,
        gpu_span_ms=statistics.median(span) * 1e3 if span else None,
        gpu_busy_ms=busy,
        top_host=top_host,
        top_gpu=top_gpu,
        phases=phases,
    )


def print_profiles(model: str, profiles: list[StepProfile], print_table: Callable[..., None]) -> None:
    print(f"## Step profile: {model}\n")
    head = ["step", "wall ms", "host ms", "GPU span ms", "GPU busy ms", "host-bound share"]
    rows = []
    for p in profiles:
        share = None if p.gpu_busy_ms is None else max(0.0, 1.0 - p.gpu_busy_ms / p.wall_ms)
        rows.append([p.label, p.wall_ms, p.host_ms, p.gpu_span_ms, p.gpu_busy_ms, share])
    print_table(head, rows, digits=2)
    for p in profiles:
        print(f"### {model}, {p.label}: top host costs per step (torch.profiler, self CPU time)\n")
        print_table(["op", "self CPU ms/step", "calls/step"], [list(t) for t in p.top_host], digits=3)
        if p.top_gpu:
            print(f"### {model}, {p.label}: top GPU kernels per step (device time)\n")
            print_table(["kernel", "ms/step", "launches/step"], [list(t) for t in p.top_gpu], digits=3)
        if p.phases:
            print(f"### {model}, {p.label}: runner phases per step (inclusive CPU time)\n")
            print_table(["phase", "ms/step"], [list(t) for t in p.phases], digits=3)
