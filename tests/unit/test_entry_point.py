"""What ``python -m kvserve`` sets up before torch loads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[2] / "src")
PROBE = "import kvserve.__main__, os, torch; print(os.environ['OMP_WAIT_POLICY'])"


def _policy(env_policy: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = SRC
    if env_policy is not None:
        env["OMP_WAIT_POLICY"] = env_policy
    return subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_openmp_threads_wait_passively_unless_the_user_chose() -> None:
    assert _policy(None) == "PASSIVE"
    assert _policy("ACTIVE") == "ACTIVE"
