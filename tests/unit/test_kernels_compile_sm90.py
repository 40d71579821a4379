"""Every Triton kernel of the CUDA path compiles for sm90 (Triton's compiler and the wheel's
ptxas, no GPU needed): ``tests/unit/sm90_compile.py`` in a process of its own (the interpreter, which the other kernel
tests run, does not check what the compiler checks: return types, layouts, shapes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[2]
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


@pytest.mark.slow
@pytest.mark.skipif(not PTXAS.exists(), reason="Triton's wheel without ptxas")
def test_cuda_kernels_compile_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "tests.unit.sm90_compile"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert r.stdout.count("ok ") >= 38 and "FAIL" not in r.stdout, r.stdout
