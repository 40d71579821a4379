"""What ``python -m kvserve`` sets up before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROBE = "import kvserve.__main__, os, torch; print(os.environ.get('OMP_WAIT_POLICY', 'unset'))"


def _policy(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = SRC
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_openmp_wait_policy_is_the_users() -> None:
    # kvserve does not choose one (OpenMP's spinning default is the fast one on idle cores)
    assert _policy(None) == "unset"
    assert _policy("PASSIVE") == "PASSIVE"
    assert _policy("ACTIVE") == "ACTIVE"
