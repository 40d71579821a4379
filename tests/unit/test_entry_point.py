"""What ``python -m kvserve`` sets up before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROBE = "import kvserve.__main__, os, torch; print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"


def _policies(*env_policies: str | None) -> list[str]:
    """OMP_WAIT_POLICY as ``kvserve.__main__`` leaves it, for each given value (None: unset); the
    probes run side by side."""
    procs = []
    for policy in env_policies:
        env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
        env["PYTHONPATH"] = SRC
        if policy is not None:
            env["OMP_WAIT_POLICY"] = policy
        procs.append(subprocess.Popen([sys.executable, "-c", PROBE], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        out.append(stdout.strip())
    return out


def test_openmp_wait_policy_is_the_users() -> None:
    # kvserve does not choose one (OpenMP's spinning default is the fast one on idle cores)
    assert _policies(None, "PASSIVE", "ACTIVE") == ["unset", "PASSIVE", "ACTIVE"]
