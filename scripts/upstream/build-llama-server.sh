#!/usr/bin/env bash
# Builds the real llama-server (CPU) from the sources setup.sh unpacked, for the baseline run.
# usage: build-llama-server.sh [DIR]  -> DIR/llama-build/bin/llama-server (about 5 minutes on 2 cores)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
D=$("$ROOT/scripts/upstream/setup.sh" "${1:-$ROOT/build/upstream}")
B="$D/llama-build"
[[ -x "$B/bin/llama-server" ]] && { echo "$B/bin/llama-server"; exit 0; }
# Some CPUs advertise AMX but fault on tile instructions: -march=native must not enable them.
F="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$D/llama.cpp" -B "$B" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_C_FLAGS="$F" \
  -DCMAKE_CXX_FLAGS="$F" > "$B.configure.log"
cmake --build "$B" --target llama-server -j"$(nproc)" > "$B.build.log"
echo "$B/bin/llama-server"
